//! Node events: typed records of what happened (a link came up or went down, a message
//! expired or was dead-lettered, a queue was full, a message's result came back), put as event messages into the node's
//! `EVENT` queue and copied to the queues that subscribe to their kind (`events.subscriptions`
//! in YAML), on this node or another.
//!
//! An event message has kind `Event`, the system priority, its kind as its name and in the
//! `linkbus.event` header, one header per field, and a line of text as its payload. Events
//! never wait and never block the node: when the `EVENT` queue or a subscriber's way is full
//! the event is dropped there (and counted). No event is raised about an event message, so
//! subscriptions cannot feed each other in a loop.

use std::fmt;
use std::str::FromStr;

/// Header naming an event message's kind.
pub const EVENT_KIND_HEADER: &str = "linkbus.event";

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A link's handshake completed (a renegotiation of its sequence numbers).
    LinkUp,
    /// A link's connection ended.
    LinkDown,
    /// A link stopped until an operator resets it.
    LinkStopped,
    /// Messages' lifetime ran out before they were delivered.
    Expired,
    /// A message went to the dead-letter queue.
    DeadLetter,
    /// A put was refused because a queue or transmission queue stayed full.
    QueueFull,
    /// The final outcome of a message of this node for one recipient (see `results`).
    Result,
}

impl EventKind {
    /// Every kind, for `all` in subscriptions.
    pub const ALL: [EventKind; 7] = [
        Self::LinkUp,
        Self::LinkDown,
        Self::LinkStopped,
        Self::Expired,
        Self::DeadLetter,
        Self::QueueFull,
        Self::Result,
    ];

    /// The kind's name in configuration, headers and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LinkUp => "link_up",
            Self::LinkDown => "link_down",
            Self::LinkStopped => "link_stopped",
            Self::Expired => "expired",
            Self::DeadLetter => "dead_letter",
            Self::QueueFull => "queue_full",
            Self::Result => "result",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EventKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| {
            let known: Vec<&str> = Self::ALL.iter().map(|k| k.as_str()).collect();
            format!("unknown event kind '{s}'; expected all or one of {}", known.join(", "))
        })
    }
}

/// One event: its kind, named fields and a line of text for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// Details, each also a header of the event message.
    pub fields: Vec<(&'static str, String)>,
    /// A line for people.
    pub text: String,
}

impl Event {
    /// An event of `kind` with `text` and no fields yet.
    pub fn new(kind: EventKind, text: impl Into<String>) -> Self {
        Self { kind, fields: Vec::new(), text: text.into() }
    }

    /// Adds a field.
    #[must_use]
    pub fn with(mut self, key: &'static str, value: impl ToString) -> Self {
        self.fields.push((key, value.to_string()));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_read_back_and_unknown_ones_are_explained() {
        for kind in EventKind::ALL {
            assert_eq!(kind.as_str().parse::<EventKind>(), Ok(kind));
        }
        let err = "link_flap".parse::<EventKind>().unwrap_err();
        assert!(err.contains("expected all or one of link_up"), "{err}");
    }
}
