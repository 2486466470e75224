//! The link session: one per neighbour, living as long as the node, across any number of
//! transport connections.
//!
//! It owns the link's sequence numbers, the messages awaiting acknowledgement and the
//! keepalive, and decides everything about the protocol; the host only pumps bytes, time and
//! events through it. Call order:
//!
//! 1. [`Session::handle_connected`] when a transport connection is up (it queues a `Hello`);
//! 2. [`Session::handle_received`] (or [`Session::handle_bytes`], which copies) with every
//!    received chunk, [`Session::handle_timeout`] when
//!    [`Session::poll_timeout`] says, and [`Session::send`] to hand over a message;
//! 3. after any `handle_*`: drain [`Session::poll_event`] (for each `Received`, store the
//!    message, then call [`Session::handle_delivered`]), call [`Session::write_pending`]
//!    with the bytes the connection can take, and write what [`Session::take_transmit`]
//!    gives (headers and shared payload slices, for a vectored write; or
//!    [`Session::poll_transmit`], joined in one piece);
//! 4. on [`SessionEvent::Closed`] (or a transport error) write the last transmit, drop the
//!    connection and call [`Session::handle_disconnected`].
//!
//! Multiplexing: every message travels on one of the link's [`crate::channel`]s, cut into
//! packets of at most `packet_bytes_max` bytes (the last one of a message up to a sixteenth
//! more, so a message just over the size goes whole); [`Session::write_pending`] picks, packet by
//! packet, the system channel when it has anything, else the channel with the fewest bytes
//! recently written for its weight, so channels share the connection and a large message
//! never holds up a small one by more than about a packet. Acknowledgements, NAKs, pings and
//! pongs go out ahead of waiting packets.
//!
//! Reliability, per channel: every message gets the channel's next sequence number (starting
//! at 1; `Ack 0` acknowledges nothing) and a CRC32C, and stays in the awaiting-ACK queue until
//! a cumulative `Ack` covers it. The receiver delivers in order, drops and re-acknowledges duplicates,
//! holds messages that arrive ahead of a gap in a bounded reorder buffer, refuses a message
//! whose CRC fails with a `Nak` (the sender writes it and the ones after it again: what the
//! receiver held is dropped as duplicate, what it could not hold arrives), and advertises
//! in its `Hello`
//! the next number it expects, so after a reconnect the sender resends exactly what was not
//! delivered, continuing a partly received message from the byte the receiver holds. A
//! message not acknowledged within the retransmit timeout is written again
//! (with everything after it). Each side also sends a random *incarnation* of its state:
//! when a peer comes back with a new incarnation (it lost its state, e.g. a memory store
//! restarted) both directions start a fresh sequence space, renumbering what is still
//! waiting, instead of mistaking new messages for duplicates.
//!
//! Parts, each in a file of its own under `session/`:
//! - `event.rs`: what the session reports to the host.
//! - `send.rs` and `receive.rs`: the sending and receiving halves of one channel.
//! - `handshake.rs`: the peer's `Hello` checked and taken up, renumbering, durable state restored.
//! - `acks.rs`: the acknowledgement policy: when ours go, and what the peer's complete.
//! - `schedule.rs`: the scheduler, which picks the channel of the next packet.
//! - `keepalive.rs`: pings after a silence, pongs (throttled), the pong timeout.

mod acks;
mod event;
mod handshake;
mod keepalive;
mod receive;
mod schedule;
mod send;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use linkbus_plugin_api::{API_VERSION, NodeName};

use acks::AckBounds;
pub use event::{DropReason, SendError, SessionError, SessionEvent, SessionStats};
use receive::{Arrival, Delivery, HeldRoom, PacketIn, PacketOutcome, Receiver};
use send::{NakOutcome, Sender};

use crate::channel::CHANNELS;
use crate::frame::{
    DATA_OVERHEAD_BYTES, Frame, FrameDecoder, HELLO_FLAG_DURABLE, Hello, LENGTH_BYTES, PROTOCOL_VERSION,
};
use crate::recycle::Recycler;
use crate::wire::{Chunks, Encoded};

/// Settings of one session, from the node's configuration.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// This node.
    pub local: NodeName,
    /// The neighbour at the other end.
    pub peer: NodeName,
    /// Random id of this node's state; see the module doc.
    pub incarnation: u64,
    /// Random id of this process run (new at every start, even when the incarnation is
    /// kept): tells the peer that an older connection from us is dead.
    pub run: u64,
    /// Whether this node's sequence numbers survive a restart.
    pub durable: bool,
    /// Longest frame accepted.
    pub frame_bytes_max: usize,
    /// Longest encoded message accepted (it arrives in packets and is assembled).
    pub message_bytes_max: usize,
    /// Most message bytes in one packet (also bounded by the peer's frame limit); the
    /// packet that ends a message may carry a sixteenth more.
    pub packet_bytes_max: usize,
    /// Share of the connection of each channel, relative to the others (the system channel
    /// always goes first whatever its weight).
    pub channel_weights: [u32; CHANNELS],
    /// Most messages of one channel sent and not yet acknowledged; [`Session::send`]
    /// refuses more.
    pub in_flight_messages_max: usize,
    /// Most encoded bytes of one channel sent and not yet acknowledged (one message is
    /// always allowed).
    pub in_flight_bytes_max: usize,
    /// Most messages held ahead of a gap, all channels together (and how far ahead of its
    /// channel's gap a message may be); beyond it they are dropped and resent later.
    pub reorder_messages_max: usize,
    /// Most encoded bytes held ahead of a gap, all channels together.
    pub reorder_bytes_max: usize,
    /// Time a written message may go unacknowledged before it is written again.
    pub retransmit_timeout: Duration,
    /// Silence after which a `Ping` is sent.
    pub ping_interval: Duration,
    /// Time a `Pong` (or any frame) may take after a `Ping` before the connection is dropped.
    pub pong_timeout: Duration,
    /// Time the peer's `Hello` may take after the connection opened.
    pub handshake_timeout: Duration,
    /// Time an acknowledgement may wait for a frame to travel with (zero: it is written at
    /// once); see [`Session::handle_delivered`].
    pub ack_delay: Duration,
    /// Where a message of several packets is gathered when it is large (see
    /// [`crate::recycle`]; one with a bound of 0 always gives a new buffer).
    pub recycler: Arc<Recycler>,
}

/// Smallest `message_bytes_max` a peer may advertise (every node accepts at least its
/// largest envelope, 512 KiB).
pub const MESSAGE_BYTES_MIN: u64 = 64 * 1024;

/// A peer gets at most one pong per this interval, however often it pings.
pub const PONG_INTERVAL_MIN: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Disconnected,
    Handshake { deadline: Instant },
    Established,
}

/// Both directions of one channel.
#[derive(Debug)]
struct Lane {
    /// Our messages to the peer.
    sender: Sender,
    /// The peer's messages to us.
    receiver: Receiver,
    /// Bytes written recently (halved every [`RECENT_HALF_LIFE`]), for the scheduler.
    recent: u64,
    /// Delivered through this number, not yet acknowledged (waiting for company).
    ack_waiting: Option<u64>,
    /// The last number acknowledged on this connection (0: none yet).
    ack_written: u64,
    /// Bytes of the messages arrived since the last acknowledgement.
    ack_waiting_bytes: usize,
}

impl Lane {
    /// An acknowledgement through `through` was written (0: a new connection, none yet):
    /// nothing waits any more.
    fn acked(&mut self, through: u64) {
        self.ack_waiting = None;
        self.ack_written = through;
        self.ack_waiting_bytes = 0;
    }
}

/// How fast the scheduler forgets what a channel wrote.
const RECENT_HALF_LIFE: Duration = Duration::from_millis(100);

/// A packet that ends its message may carry `packet_bytes_max / LAST_PACKET_SLACK_DIVISOR`
/// bytes more than the others.
const LAST_PACKET_SLACK_DIVISOR: usize = 16;

/// One link's protocol state; see the module doc for the call order.
#[derive(Debug)]
pub struct Session {
    config: SessionConfig,
    phase: Phase,
    /// One lane per channel, indexed by channel number.
    lanes: Vec<Lane>,
    /// When the scheduler's `recent` counters were last halved.
    recent_decayed_at: Instant,
    /// The peer's incarnation from its last `Hello`.
    peer_incarnation: Option<u64>,
    /// The peer's run from its last `Hello`.
    peer_run: Option<u64>,
    /// The peer's `frame_bytes_max` from its last `Hello`.
    peer_frame_bytes_max: Option<usize>,
    /// The peer's `message_bytes_max` from its last `Hello`.
    peer_message_bytes_max: Option<usize>,
    /// How long our acknowledgements may wait, for the peer of the last `Hello`.
    ack_bounds: AckBounds,
    /// Frames received but not yet decoded.
    decoder: FrameDecoder,
    /// Control frames (hello, acknowledgements, NAKs, keepalive, close) to write ahead of
    /// any packet.
    control: BytesMut,
    /// Packets to write, collected until the host takes them (one write per batch).
    transmit: Chunks,
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
    /// When the acknowledgements waiting in the lanes are written if nothing else goes first.
    acks_due: Option<Instant>,
    /// Counters for operators and tests.
    stats: SessionStats,
    /// The operator reset the link: the next `Hello` that knows us is taken as it is, our
    /// waiting messages renumbered from the numbers it expects.
    accept_peer_numbers: bool,
    /// Sending was restored from a durable record: the next handshake that knows us fills
    /// lost numbers with skips and follows a peer that is ahead.
    restored_sending: bool,
}

impl Session {
    /// A disconnected session with fresh sequence numbers.
    pub fn new(config: SessionConfig, now: Instant) -> Self {
        let decoder = FrameDecoder::new(config.frame_bytes_max);
        let lanes = (0..CHANNELS as u8)
            .map(|channel| {
                let receiver = Receiver::new(config.reorder_messages_max, config.recycler.clone());
                Lane {
                    sender: Sender::new(channel),
                    receiver,
                    recent: 0,
                    ack_waiting: None,
                    ack_written: 0,
                    ack_waiting_bytes: 0,
                }
            })
            .collect();
        Self {
            lanes,
            recent_decayed_at: now,
            config,
            phase: Phase::Disconnected,
            peer_incarnation: None,
            peer_run: None,
            peer_frame_bytes_max: None,
            peer_message_bytes_max: None,
            ack_bounds: AckBounds::AT_ONCE,
            decoder,
            control: BytesMut::new(),
            transmit: Chunks::sharing_from(Chunks::LINK_SHARE_BYTES_MIN),
            events: VecDeque::new(),
            last_received: now,
            ping: None,
            next_nonce: 1,
            last_pong: None,
            pending_pong: None,
            acks_due: None,
            stats: SessionStats::default(),
            accept_peer_numbers: false,
            restored_sending: false,
        }
    }

    /// Test-only negative control (the `fault-injection` feature): deliver duplicates
    /// instead of dropping them, so fault tests can prove their checker catches them.
    #[cfg(feature = "fault-injection")]
    pub fn skip_dedup_for_tests(&mut self) {
        for lane in &mut self.lanes {
            lane.receiver.set_skip_dedup(true);
        }
    }

    /// An operator's reset after the peer's numbers went backwards (its data was restored
    /// or wiped): the next handshake takes the peer's numbers as they are, renumbering the
    /// messages still waiting from them (messages it acknowledged before are not sent again:
    /// they were lost with the peer's data). Takes effect on the next connection.
    pub fn reset_numbers(&mut self) {
        self.accept_peer_numbers = true;
    }

    /// The neighbour this session is for.
    pub fn peer(&self) -> &NodeName {
        &self.config.peer
    }

    /// Whether the handshake completed on the current connection.
    pub fn is_established(&self) -> bool {
        self.phase == Phase::Established
    }

    /// Messages handed over and not yet acknowledged, all channels together.
    pub fn in_flight(&self) -> usize {
        self.lanes.iter().map(|l| l.sender.in_flight()).sum()
    }

    /// Messages handed over but not yet written on the current connection.
    pub fn unwritten(&self) -> usize {
        self.lanes.iter().map(|l| l.sender.unwritten()).sum()
    }

    /// Messages held in the reorder buffers.
    pub fn held(&self) -> usize {
        self.lanes.iter().map(|l| l.receiver.held()).sum()
    }

    /// Bytes held of messages being assembled from packets.
    pub fn assembling_bytes(&self) -> usize {
        self.lanes.iter().map(|l| l.receiver.assembling()).sum()
    }

    fn lane(&mut self, channel: u8) -> Option<&mut Lane> {
        self.lanes.get_mut(channel as usize)
    }

    /// Counters since the session was made.
    pub fn stats(&self) -> &SessionStats {
        &self.stats
    }

    /// Whether [`Session::send`] would accept a message on `channel` now.
    pub fn has_window(&self, channel: u8) -> bool {
        self.lanes.get(channel as usize).is_some_and(|lane| {
            let messages = lane.sender.in_flight();
            messages < self.config.in_flight_messages_max
                && (messages == 0 || lane.sender.in_flight_bytes() < self.config.in_flight_bytes_max)
        })
    }

    /// Bytes of messages handed over on `channel` and not yet written on the current
    /// connection.
    pub fn unwritten_bytes(&self, channel: u8) -> usize {
        self.lanes.get(channel as usize).map_or(0, |lane| lane.sender.unwritten_bytes())
    }

    /// Largest encoded message the link carries: our limit, and the peer's once known.
    pub fn message_bytes_max(&self) -> usize {
        self.peer_message_bytes_max.unwrap_or(usize::MAX).min(self.config.message_bytes_max)
    }

    /// The most message bytes in one packet, and in a packet that ends its message (up to a
    /// sixteenth more, within the frame limit).
    fn packet_bytes_max(&self) -> (usize, usize) {
        let frame = self.peer_frame_bytes_max.unwrap_or(self.config.frame_bytes_max);
        let room = frame.saturating_sub(DATA_OVERHEAD_BYTES - LENGTH_BYTES).max(1);
        let packet = room.min(self.config.packet_bytes_max).max(1);
        (packet, room.min(packet + packet / LAST_PACKET_SLACK_DIVISOR))
    }

    /// Whether a new connection should replace the current one. Both ends decide alike: the
    /// connection dialed by the node with the smaller name wins; between connections dialed
    /// by the same side the newer wins; and a peer that comes back with a new incarnation or
    /// a new run (it restarted, so the current connection is dead) always wins.
    pub fn should_replace(
        &self,
        current_dialed_by_us: bool,
        new_dialed_by_us: bool,
        new_peer: Option<(u64, u64)>,
    ) -> bool {
        let restarted = new_peer.is_some_and(|(incarnation, run)| {
            self.peer_incarnation.is_some_and(|known| known != incarnation)
                || self.peer_run.is_some_and(|known| known != run)
        });
        if restarted {
            return true;
        }
        let preferred = |by_us: bool| by_us == (self.config.local < self.config.peer);
        !preferred(current_dialed_by_us) || preferred(new_dialed_by_us)
    }

    /// Forgets everything about the previous connection: bytes in and out, the keepalive,
    /// and received messages the host has not confirmed (the peer sends them again).
    fn reset_connection(&mut self) {
        self.decoder.clear();
        self.control.clear();
        self.transmit.clear();
        self.ping = None;
        self.last_pong = None;
        self.pending_pong = None;
        self.acks_due = None;
        for lane in &mut self.lanes {
            lane.receiver.reset_connection();
            // The next `Hello` tells the peer where each channel stands.
            lane.acked(0);
        }
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
            your_incarnation: self.peer_incarnation.unwrap_or(0),
            run: self.config.run,
            frame_bytes_max: u32::try_from(self.config.frame_bytes_max).unwrap_or(u32::MAX),
            message_bytes_max: self.config.message_bytes_max as u64,
            in_flight_messages_max: u32::try_from(self.config.in_flight_messages_max).unwrap_or(u32::MAX),
            in_flight_bytes_max: self.config.in_flight_bytes_max as u64,
            retransmit_timeout_ms: u32::try_from(self.config.retransmit_timeout.as_millis())
                .unwrap_or(u32::MAX),
            flags: if self.config.durable { HELLO_FLAG_DURABLE } else { 0 },
            channels: self.lanes.iter().map(|l| l.receiver.position()).collect(),
        };
        Frame::Hello(hello).encode(&mut self.control);
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
        self.decode_frames(now);
    }

    /// Like [`Session::handle_bytes`], without copying the frames that arrive whole in
    /// `bytes` (their packets are slices of it, but for short whole messages, which the
    /// frame decoder copies into buffers of their own).
    pub fn handle_received(&mut self, bytes: Bytes, now: Instant) {
        if self.phase == Phase::Disconnected {
            return;
        }
        self.decoder.extend_bytes(bytes);
        self.decode_frames(now);
    }

    fn decode_frames(&mut self, now: Instant) {
        while self.phase != Phase::Disconnected {
            match self.decoder.decode() {
                Ok(Some(frame)) => self.handle_frame(frame, now),
                Ok(None) => break,
                Err(e) => self.close(e.into()),
            }
        }
    }

    /// Processes one decoded frame (used directly by hosts that decode the `Hello` of an
    /// incoming connection themselves, to find out which session it belongs to). A short
    /// message's `Data` packet is kept as it is: from a [`FrameDecoder`] it has a buffer of
    /// its own.
    pub fn handle_frame(&mut self, frame: Frame, now: Instant) {
        self.last_received = now;
        self.ping = None;
        match (self.phase, frame) {
            (Phase::Disconnected, _) => {}
            (Phase::Handshake { .. }, Frame::Hello(hello)) => self.handle_hello(&hello, now),
            (_, Frame::Close { code, reason }) => {
                self.phase = Phase::Disconnected;
                self.events.push_back(SessionEvent::Closed(SessionError::PeerClosed { code, reason }));
            }
            (Phase::Established, Frame::Data { channel, sequence, offset, total, crc, bytes }) => {
                self.handle_data(channel, PacketIn { sequence, offset, total, crc, bytes }, now);
            }
            (Phase::Established, Frame::Ack { channel, sequence }) => {
                self.complete_through(channel, sequence)
            }
            (Phase::Established, Frame::Nak { channel, sequence }) => {
                match self.lane(channel).map(|l| l.sender.nak(sequence)) {
                    None => self.close(SessionError::UnknownChannel(channel)),
                    Some(NakOutcome::Rewound) => self.stats.naks_received += 1,
                    Some(NakOutcome::Ignored) => {}
                    Some(NakOutcome::TooMany) => self.close(SessionError::TooManyNaks { channel, sequence }),
                }
            }
            (Phase::Established, Frame::Ping { nonce }) => self.answer_ping(nonce, now),
            (Phase::Established, Frame::Pong { .. }) => {}
            (_, other) => self.close(SessionError::Unexpected(other.name())),
        }
    }

    fn handle_data(&mut self, channel: u8, packet: PacketIn, now: Instant) {
        let (sequence, crc) = (packet.sequence, packet.crc);
        if packet.total > self.config.message_bytes_max as u64 {
            let max = self.config.message_bytes_max;
            return self.close(SessionError::MessageTooLarge { channel, sequence, len: packet.total, max });
        }
        let Some(lane) = self.lanes.get_mut(channel as usize) else {
            return self.close(SessionError::UnknownChannel(channel));
        };
        let (message, computed, first) = match lane.receiver.packet(packet, now) {
            PacketOutcome::Partial => return,
            PacketOutcome::Complete { message, crc, first } => (message, crc, first),
            PacketOutcome::Duplicate { last } => {
                if last {
                    self.stats.duplicates += 1;
                    self.ack_again(channel);
                }
                return;
            }
            PacketOutcome::Dropped { last } => {
                self.stats.dropped_ahead += u64::from(last);
                return;
            }
        };
        if computed.unwrap_or_else(|| crate::crc::crc32c(&message)) != crc {
            // Damaged in transit (the header was checked): ask for it again, unless a good
            // copy is already here.
            if lane.receiver.wants(sequence) {
                self.stats.naks_sent += 1;
                Frame::Nak { channel, sequence }.encode(&mut self.control);
            }
            return;
        }
        let room = self.held_room();
        let Some(lane) = self.lanes.get_mut(channel as usize) else { return };
        let size = message.len();
        let arrival = lane.receiver.arrive(sequence, message, first, now, room);
        if matches!(arrival, Ok(Arrival::Held | Arrival::Delivered(..))) {
            lane.ack_waiting_bytes = lane.ack_waiting_bytes.saturating_add(size);
        }
        match arrival {
            Err(e) => self.close(SessionError::BadMessage { channel, sequence, reason: e.to_string() }),
            Ok(Arrival::Duplicate) => {
                self.stats.duplicates += 1;
                self.ack_again(channel);
            }
            Ok(Arrival::Held) => self.stats.held += 1,
            Ok(Arrival::Dropped) => self.stats.dropped_ahead += 1,
            Ok(Arrival::Delivered(sequence, delivery)) => {
                self.hand_over(channel, sequence, delivery);
                while let Some((sequence, delivery)) =
                    self.lanes.get_mut(channel as usize).and_then(|lane| lane.receiver.next_unblocked(now))
                {
                    self.hand_over(channel, sequence, delivery);
                }
            }
        }
    }

    /// Queues the event for a message handed over in order.
    fn hand_over(&mut self, channel: u8, sequence: u64, delivery: Delivery) {
        self.events.push_back(match delivery {
            Delivery::Message(message) => SessionEvent::Received { channel, sequence, message },
            Delivery::Skip { durable } => SessionEvent::Skipped { channel, sequence, expired: None, durable },
            Delivery::Expired { id, durable } => {
                self.stats.expired_on_the_way += 1;
                SessionEvent::Skipped { channel, sequence, expired: Some(id), durable }
            }
        });
    }

    /// Room left in the reorder buffers, one budget for all channels of the link.
    fn held_room(&self) -> HeldRoom {
        let messages: usize = self.lanes.iter().map(|l| l.receiver.held()).sum();
        let bytes: usize = self.lanes.iter().map(|l| l.receiver.held_bytes()).sum();
        HeldRoom {
            messages: self.config.reorder_messages_max.saturating_sub(messages),
            bytes: self.config.reorder_bytes_max.saturating_sub(bytes),
        }
    }

    /// Hands over one encoded message (see [`crate::wire`]; one buffer or an
    /// [`Encoded`] whose payload is shared) for `channel` whose lifetime
    /// ends at `expires_at` (`None`: never); [`Session::write_pending`] writes it once the
    /// link is up and the messages before it on its channel are written. Returns its
    /// sequence number on the channel.
    ///
    /// # Errors
    /// [`SendError::WindowFull`] when the channel's window is full;
    /// [`SendError::TooLarge`] when it is longer than this node or (once known) the peer
    /// accepts; [`SendError::UnknownChannel`] for a channel number out of range.
    pub fn send(
        &mut self,
        channel: u8,
        message: impl Into<Encoded>,
        expires_at: Option<Instant>,
        now: Instant,
    ) -> Result<u64, SendError> {
        let message = message.into();
        if channel as usize >= CHANNELS {
            return Err(SendError::UnknownChannel(channel));
        }
        if !self.has_window(channel) {
            return Err(SendError::WindowFull(
                self.lanes.get(channel as usize).map_or(0, |l| l.sender.in_flight()),
            ));
        }
        let max = self.message_bytes_max();
        if message.len() > max || message.is_empty() {
            return Err(SendError::TooLarge { len: message.len(), max });
        }
        let lane = self.lanes.get_mut(channel as usize).ok_or(SendError::UnknownChannel(channel))?;
        Ok(lane.sender.push(message, expires_at, now))
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
                let timeout = self.config.retransmit_timeout;
                for lane in &mut self.lanes {
                    if lane.sender.rewind_if_overdue(now, timeout) {
                        self.stats.retransmit_timeouts += 1;
                    }
                }
                self.pong_due(now);
                self.keepalive(now);
                if self.acks_due.is_some_and(|due| now >= due) {
                    self.write_acks();
                }
            }
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
                let timeout = self.config.retransmit_timeout;
                let retransmit = self.lanes.iter().filter_map(|l| l.sender.retransmit_at(timeout));
                let pong = self.pending_pong.and(self.last_pong).map(|at| at + PONG_INTERVAL_MIN);
                Some(retransmit.chain(pong).chain(self.acks_due).fold(keepalive, Instant::min))
            }
        }
    }

    /// Bytes to write to the connection, all frames since the last call in one buffer:
    /// control frames first, then packets. (Hosts that write several buffers at once use
    /// [`Session::take_transmit`], which copies nothing.)
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        let mut chunks = Vec::new();
        self.take_transmit(&mut chunks);
        match chunks.len() {
            0 => None,
            1 => chunks.pop(),
            _ => Some(crate::wire::join(&chunks)),
        }
    }

    /// What [`Session::poll_transmit`] returns, as chunks to write in order (control frames,
    /// then packets): packet headers, and the packets' bytes shared with the messages.
    pub fn take_transmit(&mut self, out: &mut Vec<Bytes>) {
        if self.acks_due.is_some() && !(self.control.is_empty() && self.transmit.is_empty()) {
            // Something is written anyway: the waiting acknowledgements go with it.
            self.write_acks();
        }
        if !self.control.is_empty() {
            out.push(self.control.split().freeze());
        }
        self.transmit.take(out);
    }

    /// Bytes waiting for [`Session::poll_transmit`].
    pub fn transmit_len(&self) -> usize {
        self.control.len() + self.transmit.len()
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
        Frame::Close { code, reason: error.to_string() }.encode(&mut self.control);
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
