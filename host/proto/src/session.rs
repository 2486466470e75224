//! The link session: one per neighbour, living as long as the node, across any number of
//! transport connections.
//!
//! It owns the link's sequence numbers, the messages awaiting acknowledgement and the
//! keepalive, and decides everything about the protocol; the host only pumps bytes, time and
//! events through it. Call order:
//!
//! 1. [`Session::handle_connected`] when a transport connection is up (it queues a `Hello`);
//! 2. [`Session::handle_bytes`] with every received chunk, [`Session::handle_timeout`] when
//!    [`Session::poll_timeout`] says, and [`Session::send`] to hand over a message;
//! 3. after any `handle_*`: drain [`Session::poll_event`] (for each `Received`, store the
//!    message, then call [`Session::handle_delivered`]) and write what
//!    [`Session::poll_transmit`] returns;
//! 4. on [`SessionEvent::Closed`] (or a transport error) write the last transmit, drop the
//!    connection and call [`Session::handle_disconnected`].
//!
//! Reliability: every message gets the next sequence number (starting at 1) and a CRC32C, and
//! stays in the awaiting-ACK queue until a cumulative `Ack` covers it. The receiver delivers in
//! order, drops and re-acknowledges duplicates, and advertises in its `Hello` the next
//! number it expects, so after a reconnect the sender resends exactly what was not delivered.
//! Each side also sends a random *incarnation* of its state: when a peer comes back with a
//! new incarnation (it lost its state, e.g. a memory store restarted) both directions start a
//! fresh sequence space, renumbering what is still waiting, instead of mistaking new
//! messages for duplicates.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use linkbus_plugin_api::{API_VERSION, Message, NodeName};

use crate::frame::{
    CloseCode, DATA_OVERHEAD_BYTES, Frame, FrameDecoder, FrameError, HELLO_FLAG_DURABLE, Hello, LENGTH_BYTES,
    PROTOCOL_VERSION,
};
use crate::wire::decode_message;

/// Settings of one session, from the node's configuration.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// This node.
    pub local: NodeName,
    /// The neighbour at the other end.
    pub peer: NodeName,
    /// Random id of this node's state; see the module doc.
    pub incarnation: u64,
    /// Whether this node's sequence numbers survive a restart.
    pub durable: bool,
    /// Longest frame accepted or sent.
    pub frame_bytes_max: usize,
    /// Most messages sent and not yet acknowledged; [`Session::send`] refuses more.
    pub in_flight_messages_max: usize,
    /// Silence after which a `Ping` is sent.
    pub ping_interval: Duration,
    /// Time a `Pong` (or any frame) may take after a `Ping` before the connection is dropped.
    pub pong_timeout: Duration,
    /// Time the peer's `Hello` may take after the connection opened.
    pub handshake_timeout: Duration,
}

/// What the session reports to the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// The handshake completed; data flows.
    Established {
        /// The peer lost its state since the last connection; sequence spaces restarted.
        peer_restarted: bool,
        /// Messages resent because the peer had not received them.
        resent: usize,
    },
    /// A message arrived in order; store it, then call [`Session::handle_delivered`].
    Received {
        /// Its link sequence number.
        sequence: u64,
        /// The message.
        message: Message,
    },
    /// The peer acknowledged messages up to `through`.
    Acked {
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
    /// A message whose CRC32C does not match.
    #[error("message {0} failed its CRC check")]
    BadCrc(u64),
    /// A message that passed its CRC but does not decode.
    #[error("message {sequence} is malformed: {reason}")]
    BadMessage {
        /// Its sequence number.
        sequence: u64,
        /// Why it does not decode.
        reason: String,
    },
    /// A message beyond the next expected one (the transport lost or reordered bytes).
    #[error("expected message {expected}, got {got}")]
    Gap {
        /// The next expected sequence number.
        expected: u64,
        /// The one that arrived.
        got: u64,
    },
    /// An acknowledgement of a message that was never sent.
    #[error("peer acknowledged {ack}, but only {last_sent} were sent")]
    AckBeyondSent {
        /// The acknowledged number.
        ack: u64,
        /// The last number sent.
        last_sent: u64,
    },
    /// The peer claims to have received more than was ever sent.
    #[error("peer expects message {expected}, but only {last_sent} were sent")]
    ClaimsMore {
        /// What the peer expects next.
        expected: u64,
        /// The last number sent.
        last_sent: u64,
    },
    /// The peer's receive state went backwards behind what it acknowledged.
    #[error("peer expects message {expected} though it acknowledged {acked}: its state went backwards")]
    WentBackwards {
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
    /// No answer to a `Ping` in time.
    #[error("no answer within the pong timeout")]
    PongTimeout,
    /// No `Hello` in time.
    #[error("no hello within the handshake timeout")]
    HandshakeTimeout,
}

impl SessionError {
    fn close_code(&self) -> CloseCode {
        match self {
            Self::Version { .. } => CloseCode::VersionMismatch,
            Self::WrongPeer { .. } => CloseCode::UnknownPeer,
            _ => CloseCode::ProtocolError,
        }
    }
}

/// [`Session::send`] refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} messages are awaiting acknowledgement, the window is full")]
pub struct WindowFull(pub usize);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Disconnected,
    Handshake { deadline: Instant },
    Established,
}

/// One link's protocol state; see the module doc for the call order.
#[derive(Debug)]
pub struct Session {
    config: SessionConfig,
    phase: Phase,
    /// Next sequence number to assign to an outgoing message.
    next_send: u64,
    /// Highest sequence number the peer acknowledged.
    acked: u64,
    /// Sent (or assigned) messages the peer has not acknowledged, in sequence order.
    unacked: VecDeque<(u64, Bytes)>,
    /// Next sequence number to deliver durably; advertised in `Hello`.
    expected: u64,
    /// Highest sequence number handed to the host (it may not be stored yet).
    received_through: u64,
    /// The peer's incarnation from its last `Hello`.
    peer_incarnation: Option<u64>,
    decoder: FrameDecoder,
    transmit: BytesMut,
    events: VecDeque<SessionEvent>,
    last_received: Instant,
    /// Nonce and send time of the unanswered `Ping`.
    ping: Option<(u64, Instant)>,
    next_nonce: u64,
}

impl Session {
    /// A disconnected session with fresh sequence numbers.
    pub fn new(config: SessionConfig, now: Instant) -> Self {
        let decoder = FrameDecoder::new(config.frame_bytes_max);
        Self {
            config,
            phase: Phase::Disconnected,
            next_send: 1,
            acked: 0,
            unacked: VecDeque::new(),
            expected: 1,
            received_through: 0,
            peer_incarnation: None,
            decoder,
            transmit: BytesMut::new(),
            events: VecDeque::new(),
            last_received: now,
            ping: None,
            next_nonce: 1,
        }
    }

    /// The neighbour this session is for.
    pub fn peer(&self) -> &NodeName {
        &self.config.peer
    }

    /// Whether the handshake completed on the current connection.
    pub fn is_established(&self) -> bool {
        self.phase == Phase::Established
    }

    /// Messages handed over and not yet acknowledged.
    pub fn in_flight(&self) -> usize {
        self.unacked.len()
    }

    /// Whether [`Session::send`] would accept a message now.
    pub fn has_window(&self) -> bool {
        self.unacked.len() < self.config.in_flight_messages_max
    }

    /// A transport connection is up: resets per-connection state and queues our `Hello`.
    pub fn handle_connected(&mut self, now: Instant) {
        self.decoder.clear();
        self.transmit.clear();
        self.ping = None;
        self.last_received = now;
        self.phase = Phase::Handshake { deadline: now + self.config.handshake_timeout };
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            api_version: API_VERSION,
            from: self.config.local.to_string(),
            to: self.config.peer.to_string(),
            incarnation: self.config.incarnation,
            expected: self.expected,
            your_incarnation: self.peer_incarnation.unwrap_or(0),
            flags: if self.config.durable { HELLO_FLAG_DURABLE } else { 0 },
        };
        Frame::Hello(hello).encode(&mut self.transmit);
    }

    /// The transport connection is gone; messages awaiting acknowledgement are kept and
    /// resent after the next handshake.
    pub fn handle_disconnected(&mut self) {
        self.phase = Phase::Disconnected;
        self.decoder.clear();
        self.transmit.clear();
        self.ping = None;
    }

    /// Feeds received bytes.
    pub fn handle_bytes(&mut self, bytes: &[u8], now: Instant) {
        if self.phase == Phase::Disconnected {
            return;
        }
        self.decoder.extend(bytes);
        while self.phase != Phase::Disconnected {
            match self.decoder.decode() {
                Ok(Some(frame)) => self.handle_frame(frame, now),
                Ok(None) => break,
                Err(e) => self.close(e.into()),
            }
        }
    }

    /// Processes one decoded frame (used directly by hosts that decode the `Hello` of an
    /// incoming connection themselves, to find out which session it belongs to).
    pub fn handle_frame(&mut self, frame: Frame, now: Instant) {
        self.last_received = now;
        self.ping = None;
        match (self.phase, frame) {
            (Phase::Disconnected, _) => {}
            (Phase::Handshake { .. }, Frame::Hello(hello)) => self.handle_hello(&hello),
            (_, Frame::Close { code, reason }) => {
                self.phase = Phase::Disconnected;
                self.events.push_back(SessionEvent::Closed(SessionError::PeerClosed { code, reason }));
            }
            (Phase::Established, Frame::Data { sequence, crc, message }) => {
                self.handle_data(sequence, crc, message);
            }
            (Phase::Established, Frame::Ack { sequence }) => self.handle_ack(sequence),
            (Phase::Established, Frame::Ping { nonce }) => Frame::Pong { nonce }.encode(&mut self.transmit),
            (Phase::Established, Frame::Pong { .. }) => {}
            (_, other) => self.close(SessionError::Unexpected(other.name())),
        }
    }

    fn handle_hello(&mut self, hello: &Hello) {
        if hello.protocol_version != PROTOCOL_VERSION {
            let theirs = hello.protocol_version;
            return self.close(SessionError::Version { ours: PROTOCOL_VERSION, theirs });
        }
        if hello.from != self.config.peer.as_str() || hello.to != self.config.local.as_str() {
            return self.close(SessionError::WrongPeer {
                from: hello.from.clone(),
                to: hello.to.clone(),
                expected: self.config.peer.to_string(),
                local: self.config.local.to_string(),
            });
        }
        let peer_restarted = self.peer_incarnation.is_some_and(|known| known != hello.incarnation);
        if peer_restarted {
            // The peer's old sequence space is gone with its state: start receiving afresh.
            self.expected = 1;
            self.received_through = 0;
        }
        self.peer_incarnation = Some(hello.incarnation);
        let resend_from = if hello.your_incarnation == self.config.incarnation {
            let last_sent = self.next_send - 1;
            if hello.expected > self.next_send {
                return self.close(SessionError::ClaimsMore { expected: hello.expected, last_sent });
            }
            if hello.expected <= self.acked {
                return self
                    .close(SessionError::WentBackwards { expected: hello.expected, acked: self.acked });
            }
            self.complete_through(hello.expected - 1);
            hello.expected
        } else {
            // The peer never saw this incarnation of ours: its numbers mean nothing to us,
            // and ours nothing to it. Renumber what still waits from 1.
            self.renumber();
            1
        };
        self.phase = Phase::Established;
        let mut resent = 0;
        for (sequence, message) in &self.unacked {
            if *sequence >= resend_from {
                Frame::encode_data(*sequence, message, &mut self.transmit);
                resent += 1;
            }
        }
        self.events.push_back(SessionEvent::Established { peer_restarted, resent });
    }

    fn renumber(&mut self) {
        for (index, entry) in self.unacked.iter_mut().enumerate() {
            entry.0 = index as u64 + 1;
        }
        self.next_send = self.unacked.len() as u64 + 1;
        self.acked = 0;
    }

    fn handle_data(&mut self, sequence: u64, crc: u32, message: Bytes) {
        if crc32c::crc32c(&message) != crc {
            return self.close(SessionError::BadCrc(sequence));
        }
        if sequence <= self.received_through {
            // Already delivered (its ACK was lost): acknowledge again, drop the copy.
            if self.expected > 1 {
                Frame::Ack { sequence: self.expected - 1 }.encode(&mut self.transmit);
            }
            return;
        }
        if sequence != self.received_through + 1 {
            return self.close(SessionError::Gap { expected: self.received_through + 1, got: sequence });
        }
        match decode_message(message) {
            Ok(message) => {
                self.received_through = sequence;
                self.events.push_back(SessionEvent::Received { sequence, message });
            }
            Err(e) => self.close(SessionError::BadMessage { sequence, reason: e.to_string() }),
        }
    }

    fn handle_ack(&mut self, sequence: u64) {
        if sequence >= self.next_send {
            let last_sent = self.next_send - 1;
            return self.close(SessionError::AckBeyondSent { ack: sequence, last_sent });
        }
        self.complete_through(sequence);
    }

    fn complete_through(&mut self, through: u64) {
        if through <= self.acked {
            return;
        }
        let mut messages = 0;
        while self.unacked.front().is_some_and(|(seq, _)| *seq <= through) {
            self.unacked.pop_front();
            messages += 1;
        }
        self.acked = through;
        self.events.push_back(SessionEvent::Acked { through, messages });
    }

    /// The host stored every received message up to `through`: acknowledge them.
    ///
    /// # Panics
    /// When `through` was never handed to the host.
    pub fn handle_delivered(&mut self, through: u64) {
        assert!(
            through <= self.received_through,
            "delivered {through} beyond received {}",
            self.received_through
        );
        if through < self.expected {
            return;
        }
        self.expected = through + 1;
        if self.phase == Phase::Established {
            Frame::Ack { sequence: through }.encode(&mut self.transmit);
        }
    }

    /// Hands over one encoded message (see [`crate::wire`]); it is written now if the link is
    /// up, else after the next handshake. Returns its sequence number.
    ///
    /// # Errors
    /// [`WindowFull`] when `in_flight_messages_max` messages await acknowledgement.
    ///
    /// # Panics
    /// When the message does not fit in a frame (the host checks `message_bytes_max`, which
    /// configuration keeps below `frame_bytes_max`).
    pub fn send(&mut self, message: Bytes) -> Result<u64, WindowFull> {
        if !self.has_window() {
            return Err(WindowFull(self.unacked.len()));
        }
        assert!(
            message.len() + DATA_OVERHEAD_BYTES - LENGTH_BYTES <= self.config.frame_bytes_max,
            "message larger than a frame"
        );
        let sequence = self.next_send;
        self.next_send += 1;
        if self.phase == Phase::Established {
            Frame::encode_data(sequence, &message, &mut self.transmit);
        }
        self.unacked.push_back((sequence, message));
        Ok(sequence)
    }

    /// Time has come: enforces the handshake timeout and the keepalive.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.phase {
            Phase::Disconnected => {}
            Phase::Handshake { deadline } => {
                if now >= deadline {
                    self.close(SessionError::HandshakeTimeout);
                }
            }
            Phase::Established => match self.ping {
                Some((_, sent)) if now >= sent + self.config.pong_timeout => {
                    self.close(SessionError::PongTimeout)
                }
                Some(_) => {}
                None if now >= self.last_received + self.config.ping_interval => {
                    let nonce = self.next_nonce;
                    self.next_nonce += 1;
                    self.ping = Some((nonce, now));
                    Frame::Ping { nonce }.encode(&mut self.transmit);
                }
                None => {}
            },
        }
    }

    /// When [`Session::handle_timeout`] should be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Disconnected => None,
            Phase::Handshake { deadline } => Some(deadline),
            Phase::Established => Some(match self.ping {
                Some((_, sent)) => sent + self.config.pong_timeout,
                None => self.last_received + self.config.ping_interval,
            }),
        }
    }

    /// Bytes to write to the connection, all frames since the last call in one buffer.
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        (!self.transmit.is_empty()).then(|| self.transmit.split().freeze())
    }

    /// The next event for the host.
    pub fn poll_event(&mut self) -> Option<SessionEvent> {
        self.events.pop_front()
    }

    fn close(&mut self, error: SessionError) {
        if self.phase == Phase::Disconnected {
            return;
        }
        let code = error.close_code() as u16;
        Frame::Close { code, reason: error.to_string() }.encode(&mut self.transmit);
        self.phase = Phase::Disconnected;
        self.events.push_back(SessionEvent::Closed(error));
    }
}

/// Reads the opening `Hello` of an incoming connection, so the host can pick the session it
/// belongs to before handing the connection over: `Ok(None)` when more bytes are needed.
///
/// # Errors
/// [`SessionError`] when the bytes are not a `Hello` (garbage, another protocol).
pub fn peek_hello(decoder: &mut FrameDecoder) -> Result<Option<Hello>, SessionError> {
    match decoder.decode()? {
        None => Ok(None),
        Some(Frame::Hello(hello)) => Ok(Some(hello)),
        Some(other) => Err(SessionError::Unexpected(other.name())),
    }
}

#[cfg(test)]
mod tests;
