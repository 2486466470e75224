//! What a client learns of its messages' results: each recipient's outcome.

use std::fmt;

use linkbus_plugin_api::{Address, MessageId};

/// The final outcome for one recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Stored in the recipient's queue.
    Delivered,
    /// Its lifetime ran out after it was sent.
    Expired,
    /// It cannot arrive.
    Failed {
        /// A dead-letter code, or `expired` for a message that expired before it was sent.
        code: String,
        /// Why, for people.
        reason: String,
    },
    /// No result came back in time (not a failure of the recipient).
    TimedOut,
}

impl Outcome {
    /// The outcome's name in events and output.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Expired => "expired",
            Self::Failed { .. } => "failed",
            Self::TimedOut => "result_wait_timed_out",
        }
    }

    /// A failure with `code` and `reason`.
    pub fn failed(code: &str, reason: impl Into<String>) -> Self {
        Self::Failed { code: code.to_owned(), reason: reason.into() }
    }

    /// The outcome named `name` (with `code` and `reason` for failures).
    pub fn from_parts(name: &str, code: &str, reason: &str) -> Option<Self> {
        Some(match name {
            "delivered" => Self::Delivered,
            "expired" => Self::Expired,
            "failed" => Self::failed(code, reason),
            "result_wait_timed_out" => Self::TimedOut,
            _ => return None,
        })
    }

    /// The failure code, empty unless failed.
    pub fn code(&self) -> &str {
        match self {
            Self::Failed { code, .. } => code,
            _ => "",
        }
    }

    /// The failure reason, empty unless failed.
    pub fn reason(&self) -> &str {
        match self {
            Self::Failed { reason, .. } => reason,
            _ => "",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed { code, reason } => write!(f, "failed {code}: {reason}"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// What is known of one message's results at its origin: each recipient with its final
/// outcome, or `None` while it is open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageResults {
    /// The message.
    pub id: MessageId,
    /// Each distinct recipient and its outcome so far.
    pub recipients: Vec<(Address, Option<Outcome>)>,
}

impl MessageResults {
    /// Whether every recipient has its final outcome.
    pub fn is_final(&self) -> bool {
        self.recipients.iter().all(|(_, o)| o.is_some())
    }
}
