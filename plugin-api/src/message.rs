//! The message model: what a message is, its identity, and the limits every field obeys.
//!
//! A [`Content`] is what a sender writes; the node that accepts it stamps a [`MessageId`]
//! and a hop count, which makes it a [`Message`]. Every field travels on the wire, even those
//! whose behaviour arrives in later versions (groups, correlation), so a node never has to
//! drop what it does not yet understand.

use std::fmt;

use bytes::Bytes;

use crate::name::{Address, NodeName};

/// Longest user-chosen message name, in bytes.
pub const MESSAGE_NAME_BYTES_MAX: usize = 48 * 1024;
/// Most codecs applied to one payload (see [`Encoding`]).
pub const ENCODING_STEPS_MAX: usize = 8;
/// Longest record one codec keeps next to the payload it encoded (a dictionary id, a key id
/// and nonce, the payload key wrapped for each recipient), in bytes.
pub const STEP_PARAM_BYTES_MAX: usize = 16 * 1024;
/// Most recipients of one message (the fan-out limit of a single put).
pub const RECIPIENTS_MAX: usize = 64;
/// Most user headers on one message.
pub const HEADERS_MAX: usize = 64;
/// Longest header key, in bytes.
pub const HEADER_KEY_BYTES_MAX: usize = 128;
/// Longest header value, in bytes.
pub const HEADER_VALUE_BYTES_MAX: usize = 4096;
/// Longest group id, in bytes.
pub const GROUP_ID_BYTES_MAX: usize = 128;
/// Longest correlation id, in bytes.
pub const CORRELATION_ID_BYTES_MAX: usize = 128;
/// Highest user priority level; [`Priority::SYSTEM`] sits above it and is for the node only.
pub const PRIORITY_LEVEL_MAX: u8 = 9;

/// Globally unique identity of a message: the node that accepted it, that node's
/// per-source sequence number, and the wall-clock time of acceptance.
///
/// It is the key for de-duplication, receipts and tracing.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId {
    /// The node that accepted the message from a client.
    pub source: NodeName,
    /// Per-source sequence number; never reused by that source.
    pub sequence: u64,
    /// Acceptance time at the source, milliseconds since the Unix epoch (informational: no
    /// decision compares it with another node's clock).
    pub created_unix_ms: u64,
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.source, self.sequence)
    }
}

/// What a message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Kind {
    /// An opaque byte buffer.
    #[default]
    Buf,
    /// A file (name and bytes), expanded and assembled by the `file` handler.
    File,
    /// A typed node event (link up, result, expiry, ...).
    Event,
}

impl Kind {
    /// The wire code of this kind.
    pub fn code(self) -> u8 {
        match self {
            Self::Buf => 0,
            Self::File => 1,
            Self::Event => 2,
        }
    }

    /// The kind with wire code `code`, if there is one.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(Self::Buf),
            1 => Some(Self::File),
            2 => Some(Self::Event),
            _ => None,
        }
    }
}

/// Priority of a message: user levels `0..=9` (higher goes first) and the internal system
/// class above them, which carries results, events and control traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Priority(u8);

impl Priority {
    /// The system class: always scheduled first; clients cannot use it.
    pub const SYSTEM: Self = Self(PRIORITY_LEVEL_MAX + 1);
    /// The default user level.
    pub const DEFAULT: Self = Self(4);

    /// A user level.
    ///
    /// # Errors
    /// [`MessageError::Priority`] when `level` is above [`PRIORITY_LEVEL_MAX`].
    pub fn level(level: u8) -> Result<Self, MessageError> {
        if level > PRIORITY_LEVEL_MAX {
            return Err(MessageError::Priority(level));
        }
        Ok(Self(level))
    }

    /// The wire code: the level, or `10` for the system class.
    pub fn code(self) -> u8 {
        self.0
    }

    /// The priority with wire code `code` (`0..=10`), if valid.
    pub fn from_code(code: u8) -> Option<Self> {
        (code <= Self::SYSTEM.0).then_some(Self(code))
    }

    /// Whether this is the system class.
    pub fn is_system(self) -> bool {
        self == Self::SYSTEM
    }
}

impl Default for Priority {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Whether a message must survive a node restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Reliability {
    /// LOG_ON: stored durably before it is acknowledged; survives crashes.
    Persistent,
    /// LOG_OFF: survives network faults but not a restart; faster.
    Volatile,
    /// Not chosen by the sender: the node that accepts the message makes it persistent when
    /// a queue of that node among its recipients is persistent by default, else volatile
    /// (IBM MQ's "as queue definition"). Accepted messages never carry it.
    #[default]
    AsQueue,
}

/// Remaining lifetime of a message, in milliseconds.
///
/// It is the *remaining* time that travels: every queue and hop subtracts its residence
/// time, so clocks of different nodes never need to agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lifetime(u64);

impl Lifetime {
    /// A message that never expires.
    pub const UNLIMITED: Self = Self(u64::MAX);

    /// A lifetime of `ms` milliseconds (`u64::MAX` means unlimited).
    pub fn from_ms(ms: u64) -> Self {
        Self(ms)
    }

    /// A lifetime of `secs` seconds.
    pub fn from_secs(secs: u64) -> Self {
        Self(secs.saturating_mul(1000))
    }

    /// Remaining milliseconds (`u64::MAX` when unlimited).
    pub fn as_ms(self) -> u64 {
        self.0
    }

    /// Whether the message never expires.
    pub fn is_unlimited(self) -> bool {
        self == Self::UNLIMITED
    }

    /// The lifetime left after `elapsed_ms` of residence, or `None` once it ran out.
    pub fn after(self, elapsed_ms: u64) -> Option<Self> {
        if self.is_unlimited() {
            return Some(self);
        }
        self.0.checked_sub(elapsed_ms).filter(|left| *left > 0).map(Self)
    }
}

/// Membership of a message in a group: messages of one group are delivered together.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Group {
    /// The group's id, chosen by the sender, at most [`GROUP_ID_BYTES_MAX`] bytes.
    pub id: String,
    /// Position of this message in the group, from 0.
    pub index: u32,
    /// Whether this is the group's last message.
    pub last: bool,
}

/// The recipients of a message: a list that holds one without an allocation of its own
/// (most messages have one). Build it with `Recipients::from_iter`, `.into()` from a
/// `Vec`, or [`smallvec::smallvec!`]; it reads as a slice.
pub type Recipients = smallvec::SmallVec<[Address; 1]>;

/// A message as its sender writes it: everything but the identity the node stamps.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Content {
    /// Buffer, file or event.
    pub kind: Kind,
    /// User label (a file name for file messages), at most [`MESSAGE_NAME_BYTES_MAX`] bytes.
    pub name: String,
    /// One or more `node:queue` destinations; each gets one copy.
    pub recipients: Recipients,
    /// Scheduling class.
    pub priority: Priority,
    /// Remaining lifetime; `None` takes the accepting node's configured default.
    pub lifetime: Option<Lifetime>,
    /// Persistent or volatile.
    pub reliability: Reliability,
    /// Whether the origin wants a result back for each recipient: delivered (stored in the
    /// recipient's queue), expired, or failed with a reason. The origin reports "result wait
    /// timed out" for a recipient whose result did not come back in time.
    pub results: bool,
    /// User key/value headers, bounded in count and size.
    pub headers: Vec<(String, String)>,
    /// Group membership, if any.
    pub group: Option<Group>,
    /// Id that ties a reply to its request, if any.
    pub correlation_id: Option<Bytes>,
    /// The user's bytes.
    pub payload: Bytes,
}

impl Content {
    /// A buffer message for one recipient, with every other field at its default.
    ///
    /// ```
    /// use linkbus_plugin_api::{Content, Priority};
    /// let c = Content::buf("B:orders".parse().unwrap(), "hello")
    ///     .with_priority(Priority::level(7).unwrap());
    /// assert!(c.validate().is_ok());
    /// ```
    pub fn buf(to: Address, payload: impl Into<Bytes>) -> Self {
        Self { recipients: smallvec::smallvec![to], payload: payload.into(), ..Self::default() }
    }

    /// Sets the priority.
    #[must_use]
    pub fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the reliability.
    #[must_use]
    pub fn with_reliability(mut self, reliability: Reliability) -> Self {
        self.reliability = reliability;
        self
    }

    /// As member `index` of group `id` (`last`: the group's last member).
    #[must_use]
    pub fn in_group(mut self, id: &str, index: u32, last: bool) -> Self {
        self.group = Some(Group { id: id.to_owned(), index, last });
        self
    }

    /// Asks for results (see [`Content::results`]).
    #[must_use]
    pub fn with_results(mut self) -> Self {
        self.results = true;
        self
    }

    /// Sets the lifetime.
    #[must_use]
    pub fn with_lifetime(mut self, lifetime: Lifetime) -> Self {
        self.lifetime = Some(lifetime);
        self
    }

    /// Checks every bounded field against its limit. The payload size is checked by the node
    /// against its configured `message_bytes_max`, not here.
    ///
    /// # Errors
    /// The first [`MessageError`] found.
    pub fn validate(&self) -> Result<(), MessageError> {
        check_len("name", self.name.len(), MESSAGE_NAME_BYTES_MAX)?;
        check_recipients(&self.recipients)?;
        check_headers(&self.headers)?;
        if let Some(group) = &self.group {
            check_len("group id", group.id.len(), GROUP_ID_BYTES_MAX)?;
            if group.id.is_empty() {
                return Err(MessageError::EmptyGroupId);
            }
        }
        if let Some(correlation) = &self.correlation_id {
            check_len("correlation id", correlation.len(), CORRELATION_ID_BYTES_MAX)?;
        }
        if self.lifetime.is_some_and(|l| l.as_ms() == 0) {
            return Err(MessageError::ZeroLifetime);
        }
        Ok(())
    }

    /// The value of header `key`, if present.
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// Checks a recipient list against its limits (part of [`Content::validate`]).
///
/// # Errors
/// [`MessageError`]: none, or more than [`RECIPIENTS_MAX`].
pub fn check_recipients(recipients: &[Address]) -> Result<(), MessageError> {
    if recipients.is_empty() {
        return Err(MessageError::NoRecipient);
    }
    check_len("recipient list", recipients.len(), RECIPIENTS_MAX)
}

/// Checks headers against their limits (part of [`Content::validate`]).
///
/// # Errors
/// The first [`MessageError`] found.
pub fn check_headers(headers: &[(String, String)]) -> Result<(), MessageError> {
    check_len("header list", headers.len(), HEADERS_MAX)?;
    for (key, value) in headers {
        if key.is_empty() {
            return Err(MessageError::EmptyHeaderKey);
        }
        check_len("header key", key.len(), HEADER_KEY_BYTES_MAX)?;
        check_len("header value", value.len(), HEADER_VALUE_BYTES_MAX)?;
    }
    Ok(())
}

fn check_len(field: &'static str, len: usize, max: usize) -> Result<(), MessageError> {
    if len > max {
        return Err(MessageError::TooLong { field, len, max });
    }
    Ok(())
}

/// A message accepted by a node: identity, hop count and content.
///
/// The content is boxed, so a message is cheap to move: it passes through many hands on
/// its way (decoder, queues, links, answers), and its fields read through the box
/// unchanged (`message.content.payload`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Stamped by the accepting node.
    pub id: MessageId,
    /// Number of relays crossed so far; bounded by the node's `hop_count_max`.
    pub hop_count: u8,
    /// Whether a consumer already received this message once and did not acknowledge it.
    pub redelivered: bool,
    /// How many times consumers received it and gave it back unacknowledged (backed out,
    /// or went away before acknowledging).
    pub backout_count: u16,
    /// What the sender wrote; `content.lifetime` is always set on an accepted message.
    /// Its payload is encoded as [`Message::encoding`] says.
    pub content: Box<Content>,
    /// The codecs applied to the payload on its way (empty: the payload as written).
    pub encoding: Encoding,
}

impl Message {
    /// The message `id` with `content`, fresh from its origin: no relay crossed, never
    /// delivered, its payload as written.
    pub fn new(id: MessageId, content: Content) -> Self {
        Self {
            id,
            hop_count: 0,
            redelivered: false,
            backout_count: 0,
            content: Box::new(content),
            encoding: Encoding::new(),
        }
    }

    /// Whether its payload is encoded (compressed, sealed) rather than as the sender wrote it.
    pub fn is_encoded(&self) -> bool {
        !self.encoding.is_empty()
    }
}

/// One codec applied to a payload on its way: which codec (its registered id), and what it
/// needs to undo it, in its own layout (a dictionary id; a key id, a nonce and wrapped keys).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Step {
    /// The codec's id ([`crate::Compressor::id`], [`crate::Cipher::id`]).
    pub codec: u8,
    /// The codec's record, at most [`STEP_PARAM_BYTES_MAX`] bytes.
    pub param: Bytes,
}

/// The codecs applied to a message's payload at its origin, in the order they were applied
/// (compression before encryption); the destination undoes them in reverse. Empty for a
/// payload as the sender wrote it. It reads as a slice of [`Step`]s.
///
/// One pointer wide, and allocating nothing when empty: every message carries one, and a
/// message moves through many hands on its way (see [`Message`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[expect(clippy::box_collection, reason = "one pointer in every message, rather than a Vec's three")]
pub struct Encoding(Option<Box<Vec<Step>>>);

impl Encoding {
    /// No codec applied.
    pub const fn new() -> Self {
        Self(None)
    }

    /// Records `step`, applied after those recorded.
    pub fn push(&mut self, step: Step) {
        self.0.get_or_insert_default().push(step);
    }

    /// Forgets every step (the payload is as written again).
    pub fn clear(&mut self) {
        self.0 = None;
    }
}

impl std::ops::Deref for Encoding {
    type Target = [Step];

    fn deref(&self) -> &[Step] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }
}

impl<'a> IntoIterator for &'a Encoding {
    type Item = &'a Step;
    type IntoIter = std::slice::Iter<'a, Step>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl FromIterator<Step> for Encoding {
    fn from_iter<I: IntoIterator<Item = Step>>(steps: I) -> Self {
        let steps: Vec<Step> = steps.into_iter().collect();
        Self((!steps.is_empty()).then(|| Box::new(steps)))
    }
}

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    /// A field is over its limit.
    #[error("{field} is {len} long, at most {max} is allowed")]
    TooLong {
        /// Which field.
        field: &'static str,
        /// Its length (bytes, or entries for lists).
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The message names no recipient.
    #[error("message has no recipient")]
    NoRecipient,
    /// A header with an empty key.
    #[error("header key is empty")]
    EmptyHeaderKey,
    /// A priority level above [`PRIORITY_LEVEL_MAX`].
    #[error("priority {0} is out of range 0..=9")]
    Priority(u8),
    /// A lifetime of zero: the message would be expired before it is accepted.
    #[error("lifetime is zero")]
    ZeroLifetime,
    /// A group whose id is empty.
    #[error("group id is empty")]
    EmptyGroupId,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to() -> Address {
        "B:q".parse().unwrap()
    }

    #[test]
    fn a_message_stays_small_to_move() {
        assert_eq!(std::mem::size_of::<Encoding>(), 8);
        assert!(std::mem::size_of::<Message>() <= 64, "{}", std::mem::size_of::<Message>());
        let mut e = Encoding::new();
        assert!(e.is_empty());
        e.push(Step { codec: 1, param: Bytes::new() });
        assert_eq!((e.len(), e[0].codec), (1, 1));
        e.clear();
        assert_eq!(e, Encoding::default());
        assert!(std::iter::empty::<Step>().collect::<Encoding>().is_empty());
    }

    #[test]
    fn limits_are_enforced() {
        let mut c = Content::buf(to(), "x");
        assert!(c.validate().is_ok());
        c.name = "n".repeat(MESSAGE_NAME_BYTES_MAX);
        assert!(c.validate().is_ok());
        c.name.push('n');
        assert!(matches!(c.validate(), Err(MessageError::TooLong { field: "name", .. })));
        c.name.clear();
        c.recipients = smallvec::smallvec![to(); RECIPIENTS_MAX + 1];
        assert!(matches!(c.validate(), Err(MessageError::TooLong { .. })));
        c.recipients.clear();
        assert_eq!(c.validate(), Err(MessageError::NoRecipient));
        c.recipients.push(to());
        c.headers.push((String::new(), "v".into()));
        assert_eq!(c.validate(), Err(MessageError::EmptyHeaderKey));
        c.headers.clear();
        c.lifetime = Some(Lifetime::from_ms(0));
        assert_eq!(c.validate(), Err(MessageError::ZeroLifetime));
        assert_eq!(Priority::level(10), Err(MessageError::Priority(10)));
    }

    #[test]
    fn lifetime_counts_down_and_unlimited_does_not() {
        let l = Lifetime::from_secs(2);
        assert_eq!(l.after(500), Some(Lifetime::from_ms(1500)));
        assert_eq!(l.after(2000), None);
        assert_eq!(Lifetime::UNLIMITED.after(u64::MAX - 1), Some(Lifetime::UNLIMITED));
    }
}
