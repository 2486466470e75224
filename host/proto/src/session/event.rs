//! What a [`super::Session`] reports: events for the host, and why connections end or
//! messages are refused.

use bytes::Bytes;
use linkbus_plugin_api::Message;

use crate::channel::CHANNELS;
use crate::frame::{CloseCode, FrameError};

/// What the session reports to the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// The handshake completed; data flows.
    Established {
        /// The peer lost its state since the last connection; sequence spaces restarted.
        peer_restarted: bool,
        /// Messages to resend because the peer had not received them.
        resent: usize,
        /// Bytes of a partly received message the peer holds, not sent again.
        resumed_bytes: u64,
        /// Numbers the peer had acknowledged and lost (volatile messages, after its machine
        /// crashed before it wrote their receive numbers to disk), sent again as skips.
        lost_by_peer: u64,
    },
    /// A message arrived in order; store it, then call [`super::Session::handle_delivered`].
    Received {
        /// Its channel.
        channel: u8,
        /// Its sequence number on the channel.
        sequence: u64,
        /// The message.
        message: Message,
    },
    /// A sequence number arrived in order without a message to hand over: the sender
    /// dropped the message in transit (an empty skip message), or its lifetime ran out on the
    /// way (`expired` names it). Call [`super::Session::handle_delivered`] for it like for
    /// any other.
    Skipped {
        /// Its channel.
        channel: u8,
        /// Its sequence number on the channel.
        sequence: u64,
        /// The message whose lifetime ran out on the way, if that is why.
        expired: Option<linkbus_plugin_api::MessageId>,
        /// A message that was not volatile stood behind the number (it expired on the
        /// way): the sender counts it as kept, so the number must be synced before it is
        /// acknowledged, like a persistent delivery's.
        durable: bool,
    },
    /// A message handed over earlier was not sent after a reconnect: its lifetime ran out,
    /// or it is larger than the peer accepts. Its number travelled as an empty skip message.
    Dropped {
        /// The encoded message.
        message: Bytes,
        /// Why.
        reason: DropReason,
    },
    /// The peer acknowledged messages of `channel` up to `through`.
    Acked {
        /// The channel.
        channel: u8,
        /// Highest acknowledged sequence number.
        through: u64,
        /// How many messages this acknowledgement completed.
        messages: usize,
    },
    /// The connection must be dropped (after writing the last transmit).
    Closed(SessionError),
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// Bytes that are not a valid frame.
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    /// The peer speaks another protocol version.
    #[error("peer speaks protocol version {theirs}, this node speaks {ours}")]
    Version {
        /// Ours.
        ours: u16,
        /// Theirs.
        theirs: u16,
    },
    /// The peer is not the node this link is for, or thinks it talks to another node.
    #[error("peer introduced itself as '{from}' to '{to}', expected '{expected}' to '{local}'")]
    WrongPeer {
        /// The name the peer gave.
        from: String,
        /// The name the peer thinks we have.
        to: String,
        /// The name configured for this link.
        expected: String,
        /// Our name.
        local: String,
    },
    /// A frame that is not allowed in the current phase.
    #[error("unexpected {0} frame")]
    Unexpected(&'static str),
    /// A message that passed its CRC but does not decode.
    #[error("message {sequence} on channel {channel} is malformed: {reason}")]
    BadMessage {
        /// Its channel.
        channel: u8,
        /// Its sequence number.
        sequence: u64,
        /// Why it does not decode.
        reason: String,
    },
    /// The peer claims to have received more than was ever sent.
    #[error("peer expects message {expected} on channel {channel}, but only {last_sent} were sent")]
    ClaimsMore {
        /// The channel.
        channel: u8,
        /// What the peer expects next.
        expected: u64,
        /// The last number sent.
        last_sent: u64,
    },
    /// The peer's receive state went backwards behind what it acknowledged.
    #[error(
        "peer expects message {expected} on channel {channel} though it acknowledged {acked}: its state went backwards"
    )]
    WentBackwards {
        /// The channel.
        channel: u8,
        /// What the peer expects next.
        expected: u64,
        /// What it had acknowledged.
        acked: u64,
    },
    /// The peer closed the connection.
    #[error("peer closed the link ({code}): {reason}")]
    PeerClosed {
        /// The peer's close code.
        code: u16,
        /// The peer's reason.
        reason: String,
    },
    /// A message was refused with a NAK too many times.
    #[error("message {sequence} on channel {channel} arrived damaged too many times")]
    TooManyNaks {
        /// The channel.
        channel: u8,
        /// The message's sequence number.
        sequence: u64,
    },
    /// The peer names a sequence number no link can reach.
    #[error("peer expects message {expected} on channel {channel}, which no link reaches")]
    BadPosition {
        /// The channel.
        channel: u8,
        /// The number named.
        expected: u64,
    },
    /// The peer accepts too small messages.
    #[error("peer accepts messages of only {0} bytes")]
    MessageLimit(u64),
    /// A frame names a channel that does not exist.
    #[error("no channel {0} on a link")]
    UnknownChannel(u8),
    /// The peer's `Hello` lists another number of channels.
    #[error("peer has {0} channels, this node has {CHANNELS}")]
    ChannelCount(usize),
    /// The peer sends a message longer than this node accepts.
    #[error("message {sequence} on channel {channel} has {len} bytes, over this node's limit of {max}")]
    MessageTooLarge {
        /// The channel.
        channel: u8,
        /// The message's sequence number.
        sequence: u64,
        /// Its declared length.
        len: u64,
        /// Our limit.
        max: usize,
    },
    /// The peer advertises a frame limit below the protocol's minimum.
    #[error("peer accepts frames of only {0} bytes")]
    FrameLimit(u32),
    /// No answer to a `Ping` in time.
    #[error("no answer within the pong timeout")]
    PongTimeout,
    /// No `Hello` in time.
    #[error("no hello within the handshake timeout")]
    HandshakeTimeout,
}

/// Why a message handed to the session was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Its lifetime ran out while it waited for a connection.
    Expired,
    /// It is larger than the peer's `message_bytes_max`.
    TooLargeForPeer,
}

impl SessionError {
    pub(crate) fn close_code(&self) -> CloseCode {
        match self {
            Self::Version { .. } => CloseCode::VersionMismatch,
            Self::WrongPeer { .. } => CloseCode::UnknownPeer,
            _ => CloseCode::ProtocolError,
        }
    }
}

/// [`super::Session::send`] refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// `in_flight_messages_max` messages await acknowledgement.
    #[error("{0} messages are awaiting acknowledgement, the window is full")]
    WindowFull(usize),
    /// No such channel.
    #[error("no channel {0} on a link")]
    UnknownChannel(u8),
    /// The message is longer than this node or the peer accepts.
    #[error("message of {len} bytes is over the link's limit of {max} bytes")]
    TooLarge {
        /// The encoded message length.
        len: usize,
        /// The largest message the link carries.
        max: usize,
    },
}

/// Counters of a session, for operators and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Handshakes completed (each one renegotiates the sequence numbers).
    pub renegotiations: u64,
    /// Messages written again after a reconnect.
    pub resent: u64,
    /// Bytes of partly received messages not written again after a reconnect (the peer
    /// held them).
    pub resumed_bytes: u64,
    /// Numbers the peer acknowledged and then lost (volatile messages in a machine crash),
    /// sent again as skips.
    pub lost_by_peer: u64,
    /// Messages whose lifetime ran out after their first packet arrived (while the rest
    /// came, or while they waited behind a gap): not handed over.
    pub expired_on_the_way: u64,
    /// Times the oldest unacknowledged message timed out and writing went back to it.
    pub retransmit_timeouts: u64,
    /// NAKs sent for messages that failed their CRC.
    pub naks_sent: u64,
    /// NAKs received (each made us write a message again).
    pub naks_received: u64,
    /// Messages that arrived again after they were delivered (dropped, re-acknowledged).
    pub duplicates: u64,
    /// Messages held in the reorder buffer until a gap filled.
    pub held: u64,
    /// Messages dropped because they arrived too far ahead of a gap.
    pub dropped_ahead: u64,
    /// Pings not answered with a pong: other frames were going out anyway, or the peer
    /// pinged too often.
    pub pings_unanswered: u64,
}
