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
//!    message, then call [`Session::handle_delivered`]), call [`Session::write_pending`]
//!    with the bytes the connection can take, and write what [`Session::poll_transmit`]
//!    returns;
//! 4. on [`SessionEvent::Closed`] (or a transport error) write the last transmit, drop the
//!    connection and call [`Session::handle_disconnected`].
//!
//! Reliability: every message gets the next sequence number (starting at 1; `Ack 0`
//! acknowledges nothing) and a CRC32C, and stays in the awaiting-ACK queue until a cumulative
//! `Ack` covers it. The receiver delivers in order, drops and re-acknowledges duplicates,
//! holds messages that arrive ahead of a gap in a bounded reorder buffer, refuses a message
//! whose CRC fails with a `Nak` (the sender writes it and the ones after it again: what the
//! receiver held is dropped as duplicate, what it could not hold arrives), and advertises
//! in its `Hello`
//! the next number it expects, so after a reconnect the sender resends exactly what was not
//! delivered. A message not acknowledged within the retransmit timeout is written again
//! (with everything after it). Each side also sends a random *incarnation* of its state:
//! when a peer comes back with a new incarnation (it lost its state, e.g. a memory store
//! restarted) both directions start a fresh sequence space, renumbering what is still
//! waiting, instead of mistaking new messages for duplicates.

mod event;
mod receive;
mod send;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use linkbus_plugin_api::{API_VERSION, NodeName};

pub use event::{DropReason, SendError, SessionError, SessionEvent, SessionStats};
use receive::{Arrival, Receiver};
use send::{NakOutcome, Sender, WriteLimits};

use crate::frame::{
    DATA_OVERHEAD_BYTES, FRAME_BYTES_MIN, Frame, FrameDecoder, HELLO_FLAG_DURABLE, Hello, LENGTH_BYTES,
    PROTOCOL_VERSION,
};

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
    /// Most encoded bytes sent and not yet acknowledged (one message is always allowed).
    pub in_flight_bytes_max: usize,
    /// Most messages held ahead of a gap; beyond it they are dropped and resent later.
    pub reorder_messages_max: usize,
    /// Most encoded bytes held ahead of a gap.
    pub reorder_bytes_max: usize,
    /// Time a written message may go unacknowledged before it is written again.
    pub retransmit_timeout: Duration,
    /// Silence after which a `Ping` is sent.
    pub ping_interval: Duration,
    /// Time a `Pong` (or any frame) may take after a `Ping` before the connection is dropped.
    pub pong_timeout: Duration,
    /// Time the peer's `Hello` may take after the connection opened.
    pub handshake_timeout: Duration,
    /// Test-only negative control: deliver duplicates instead of dropping them, so fault
    /// tests can prove their checker catches duplicates. Never set it in production.
    pub skip_dedup_for_tests: bool,
}

/// A peer gets at most one pong per this interval, however often it pings.
pub const PONG_INTERVAL_MIN: Duration = Duration::from_millis(100);

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
    /// Our messages to the peer.
    sender: Sender,
    /// The peer's messages to us.
    receiver: Receiver,
    /// The peer's incarnation from its last `Hello`.
    peer_incarnation: Option<u64>,
    /// The peer's `frame_bytes_max` from its last `Hello`.
    peer_frame_bytes_max: Option<usize>,
    /// Frames received but not yet decoded.
    decoder: FrameDecoder,
    /// Frames to write, collected until the host takes them (one write per batch).
    transmit: BytesMut,
    /// Events for the host.
    events: VecDeque<SessionEvent>,
    /// When the last frame arrived, for the keepalive.
    last_received: Instant,
    /// Nonce and send time of the unanswered `Ping`.
    ping: Option<(u64, Instant)>,
    /// Next `Ping` nonce.
    next_nonce: u64,
    /// When we last answered a ping, to throttle a peer that pings too often.
    last_pong: Option<Instant>,
    /// A ping that came too soon after the last pong, answered when the interval allows.
    pending_pong: Option<u64>,
    /// Counters for operators and tests.
    stats: SessionStats,
}

impl Session {
    /// A disconnected session with fresh sequence numbers.
    pub fn new(config: SessionConfig, now: Instant) -> Self {
        let decoder = FrameDecoder::new(config.frame_bytes_max);
        let mut receiver = Receiver::new(config.reorder_messages_max, config.reorder_bytes_max);
        receiver.set_skip_dedup(config.skip_dedup_for_tests);
        Self {
            receiver,
            config,
            phase: Phase::Disconnected,
            sender: Sender::new(),
            peer_incarnation: None,
            peer_frame_bytes_max: None,
            decoder,
            transmit: BytesMut::new(),
            events: VecDeque::new(),
            last_received: now,
            ping: None,
            next_nonce: 1,
            last_pong: None,
            pending_pong: None,
            stats: SessionStats::default(),
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
        self.sender.in_flight()
    }

    /// Messages handed over but not yet written on the current connection.
    pub fn unwritten(&self) -> usize {
        self.sender.unwritten()
    }

    /// Messages held in the reorder buffer.
    pub fn held(&self) -> usize {
        self.receiver.held()
    }

    /// Counters since the session was made.
    pub fn stats(&self) -> &SessionStats {
        &self.stats
    }

    /// Whether [`Session::send`] would accept a message now.
    pub fn has_window(&self) -> bool {
        let messages = self.sender.in_flight();
        messages < self.config.in_flight_messages_max
            && (messages == 0 || self.sender.in_flight_bytes() < self.config.in_flight_bytes_max)
    }

    /// Largest encoded message the link carries: our frame limit, and the peer's once known.
    pub fn message_bytes_max(&self) -> usize {
        let frame = self.peer_frame_bytes_max.unwrap_or(usize::MAX).min(self.config.frame_bytes_max);
        frame.saturating_sub(DATA_OVERHEAD_BYTES - LENGTH_BYTES)
    }

    /// Whether a new connection should replace the current one. Both ends decide alike: the
    /// connection dialed by the node with the smaller name wins; between connections dialed
    /// by the same side the newer wins; and a peer that comes back with a new incarnation
    /// (it restarted, so the current connection is dead) always wins.
    pub fn should_replace(
        &self,
        current_dialed_by_us: bool,
        new_dialed_by_us: bool,
        new_incarnation: Option<u64>,
    ) -> bool {
        if new_incarnation.is_some_and(|i| self.peer_incarnation.is_some_and(|known| known != i)) {
            return true;
        }
        let preferred = |by_us: bool| by_us == (self.config.local < self.config.peer);
        !preferred(current_dialed_by_us) || preferred(new_dialed_by_us)
    }

    /// Forgets everything about the previous connection: bytes in and out, the keepalive,
    /// and received messages the host has not confirmed (the peer sends them again).
    fn reset_connection(&mut self) {
        self.decoder.clear();
        self.transmit.clear();
        self.ping = None;
        self.last_pong = None;
        self.pending_pong = None;
        self.receiver.reset_connection();
        self.events.retain(|e| !matches!(e, SessionEvent::Received { .. } | SessionEvent::Skipped { .. }));
    }

    /// A transport connection is up: resets per-connection state and queues our `Hello`.
    pub fn handle_connected(&mut self, now: Instant) {
        self.reset_connection();
        self.last_received = now;
        self.phase = Phase::Handshake { deadline: now + self.config.handshake_timeout };
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            api_version: API_VERSION,
            from: self.config.local.to_string(),
            to: self.config.peer.to_string(),
            incarnation: self.config.incarnation,
            expected: self.receiver.expected(),
            your_incarnation: self.peer_incarnation.unwrap_or(0),
            frame_bytes_max: u32::try_from(self.config.frame_bytes_max).unwrap_or(u32::MAX),
            flags: if self.config.durable { HELLO_FLAG_DURABLE } else { 0 },
        };
        Frame::Hello(hello).encode(&mut self.transmit);
    }

    /// The transport connection is gone; messages awaiting acknowledgement are kept and
    /// resent after the next handshake, and received messages not yet confirmed by
    /// [`Session::handle_delivered`] are forgotten (the peer resends them).
    pub fn handle_disconnected(&mut self) {
        self.phase = Phase::Disconnected;
        self.reset_connection();
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
            (Phase::Established, Frame::Ack { sequence }) => self.complete_through(sequence),
            (Phase::Established, Frame::Nak { sequence }) => match self.sender.nak(sequence) {
                NakOutcome::Rewound => self.stats.naks_received += 1,
                NakOutcome::Ignored => {}
                NakOutcome::TooMany => self.close(SessionError::TooManyNaks(sequence)),
            },
            (Phase::Established, Frame::Ping { nonce }) => self.answer_ping(nonce, now),
            (Phase::Established, Frame::Pong { .. }) => {}
            (_, other) => self.close(SessionError::Unexpected(other.name())),
        }
    }

    /// Answers a ping, unless other frames are about to go out anyway (any frame proves
    /// liveness) or the peer pings more often than every [`PONG_INTERVAL_MIN`] (throttled).
    fn answer_ping(&mut self, nonce: u64, now: Instant) {
        if !self.transmit.is_empty() {
            self.stats.pings_unanswered += 1;
            return;
        }
        if self.last_pong.is_some_and(|at| now < at + PONG_INTERVAL_MIN) {
            // Answered later (see `handle_timeout`), so a fast-pinging peer still hears back.
            self.stats.pings_unanswered += u64::from(self.pending_pong.replace(nonce).is_some());
            return;
        }
        self.last_pong = Some(now);
        Frame::Pong { nonce }.encode(&mut self.transmit);
    }

    /// Sends a throttled pong once its time has come (unless other frames go out anyway).
    fn pong_due(&mut self, now: Instant) {
        let due = self.last_pong.is_none_or(|at| now >= at + PONG_INTERVAL_MIN);
        if let Some(nonce) = self.pending_pong.filter(|_| due) {
            self.pending_pong = None;
            if self.transmit.is_empty() {
                self.last_pong = Some(now);
                Frame::Pong { nonce }.encode(&mut self.transmit);
            }
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
        if hello.frame_bytes_max < FRAME_BYTES_MIN as u32 {
            return self.close(SessionError::FrameLimit(hello.frame_bytes_max));
        }
        let peer_restarted = self.peer_incarnation.is_some_and(|known| known != hello.incarnation);
        if peer_restarted {
            // The peer's old sequence space is gone with its state: start receiving afresh.
            self.receiver.restart();
        }
        self.peer_incarnation = Some(hello.incarnation);
        self.peer_frame_bytes_max = Some(hello.frame_bytes_max as usize);
        let resend_from = if hello.your_incarnation == self.config.incarnation {
            let (last_sent, acked) = (self.sender.last_sent(), self.sender.acked());
            if hello.expected > last_sent + 1 {
                return self.close(SessionError::ClaimsMore { expected: hello.expected, last_sent });
            }
            if hello.expected <= acked {
                return self.close(SessionError::WentBackwards { expected: hello.expected, acked });
            }
            // Received but the ACK was lost: adopt the peer's number.
            self.complete_through(hello.expected - 1);
            hello.expected
        } else {
            // The peer never saw this incarnation of ours: its numbers mean nothing to us,
            // and ours nothing to it. Renumber what still waits from 1.
            self.sender.renumber();
            1
        };
        self.phase = Phase::Established;
        self.stats.renegotiations += 1;
        let resent = self.sender.start_connection(resend_from);
        self.stats.resent += resent as u64;
        self.events.push_back(SessionEvent::Established { peer_restarted, resent });
    }

    /// Writes waiting messages in sequence order — first those to resend after a
    /// reconnect or a retransmit timeout, then new ones — until about `budget` bytes are
    /// written (at least one message when the budget is not zero). A message written after
    /// it waited carries the lifetime it has left; one that expired, or that is larger than
    /// the peer accepts, goes as an empty skip message and is reported as
    /// [`SessionEvent::Dropped`]. Returns how many messages were written.
    pub fn write_pending(&mut self, now: Instant, budget: usize) -> usize {
        if self.phase != Phase::Established {
            return 0;
        }
        let limits = WriteLimits { message_bytes_max: self.message_bytes_max(), budget };
        self.sender.write(now, &limits, &mut self.transmit, &mut self.events)
    }

    fn handle_data(&mut self, sequence: u64, crc: u32, message: Bytes) {
        if crc32c::crc32c(&message) != crc {
            // Damaged in transit (the header was checked): ask for it again, unless a good
            // copy is already here.
            if self.receiver.wants(sequence) {
                self.stats.naks_sent += 1;
                Frame::Nak { sequence }.encode(&mut self.transmit);
            }
            return;
        }
        match self.receiver.arrive(sequence, message) {
            Err(e) => self.close(SessionError::BadMessage { sequence, reason: e.to_string() }),
            Ok(Arrival::Duplicate) => {
                self.stats.duplicates += 1;
                let expected = self.receiver.expected();
                if expected > 1 {
                    Frame::Ack { sequence: expected - 1 }.encode(&mut self.transmit);
                }
            }
            Ok(Arrival::Held) => self.stats.held += 1,
            Ok(Arrival::Dropped) => self.stats.dropped_ahead += 1,
            Ok(Arrival::Delivered(messages)) => {
                for (sequence, message) in messages {
                    self.events.push_back(match message {
                        Some(message) => SessionEvent::Received { sequence, message },
                        None => SessionEvent::Skipped { sequence },
                    });
                }
            }
        }
    }

    /// An ACK (or the peer's `Hello`) says everything through `through` arrived; a number
    /// that matches nothing awaiting is ignored.
    fn complete_through(&mut self, through: u64) {
        if let Some(messages) = self.sender.complete_through(through) {
            self.events.push_back(SessionEvent::Acked { through, messages });
        }
    }

    /// The host stored every received message up to `through`: acknowledge them. Numbers
    /// from an earlier connection (already forgotten) are ignored.
    pub fn handle_delivered(&mut self, through: u64) {
        if self.receiver.delivered(through) && self.phase == Phase::Established {
            Frame::Ack { sequence: through }.encode(&mut self.transmit);
        }
    }

    /// Hands over one encoded message (see [`crate::wire`]) whose lifetime ends at
    /// `expires_at` (`None`: never); [`Session::write_pending`] writes it once the link is
    /// up and the messages before it are written. Returns its sequence number.
    ///
    /// # Errors
    /// [`SendError::WindowFull`] when `in_flight_messages_max` messages await
    /// acknowledgement; [`SendError::TooLarge`] when it does not fit in a frame of this node
    /// or (once known) of the peer.
    pub fn send(
        &mut self,
        message: Bytes,
        expires_at: Option<Instant>,
        now: Instant,
    ) -> Result<u64, SendError> {
        if !self.has_window() {
            return Err(SendError::WindowFull(self.sender.in_flight()));
        }
        let max = self.message_bytes_max();
        if message.len() > max || message.is_empty() {
            return Err(SendError::TooLarge { len: message.len(), max });
        }
        Ok(self.sender.push(message, expires_at, now))
    }

    /// Time has come: enforces the handshake timeout, the keepalive and the retransmit
    /// timeout.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.phase {
            Phase::Disconnected => {}
            Phase::Handshake { deadline } => {
                if now >= deadline {
                    self.close(SessionError::HandshakeTimeout);
                }
            }
            Phase::Established => {
                if self.sender.rewind_if_overdue(now, self.config.retransmit_timeout) {
                    self.stats.retransmit_timeouts += 1;
                }
                self.pong_due(now);
                self.keepalive(now);
            }
        }
    }

    fn keepalive(&mut self, now: Instant) {
        match self.ping {
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
        }
    }

    /// When [`Session::handle_timeout`] should be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Disconnected => None,
            Phase::Handshake { deadline } => Some(deadline),
            Phase::Established => {
                let keepalive = match self.ping {
                    Some((_, sent)) => sent + self.config.pong_timeout,
                    None => self.last_received + self.config.ping_interval,
                };
                let retransmit = self.sender.retransmit_at(self.config.retransmit_timeout);
                let pong = self.pending_pong.and(self.last_pong).map(|at| at + PONG_INTERVAL_MIN);
                Some([retransmit, pong].into_iter().flatten().fold(keepalive, Instant::min))
            }
        }
    }

    /// Bytes to write to the connection, all frames since the last call in one buffer.
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        (!self.transmit.is_empty()).then(|| self.transmit.split().freeze())
    }

    /// Bytes waiting for [`Session::poll_transmit`].
    pub fn transmit_len(&self) -> usize {
        self.transmit.len()
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
mod sim;
#[cfg(test)]
mod tests;
