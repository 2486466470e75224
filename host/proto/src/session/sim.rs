//! Deterministic simulation of a link: two sessions joined by an in-memory wire that drops,
//! duplicates, delays (reorders), corrupts and partitions frames, breaks connections, and
//! whose hosts sometimes refuse a delivery (and drop the connection, as a node with a full
//! queue does), under a manual clock and a seeded random generator. Each seed is a reproducible run: a
//! phase with faults, then a quiet phase in which the link must deliver everything.
//!
//! Each side sends on three channels (system, a priority level, files), messages of up to
//! several packets, so packets of different channels interleave and large messages resume
//! after reconnects. The checker records, per direction and channel, the numbers of the
//! messages the receiving host stored: they must be 1, 2, 3, ... (nothing lost by the end,
//! nothing twice, nothing out of order). Every run is bounded in simulated steps, so a livelock fails instead of
//! hanging. A failing seed is printed; add it to `REGRESSIONS`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use linkbus_plugin_api::{Content, Message, MessageId, NodeName};

use super::{Session, SessionConfig, SessionEvent, SessionStats};
use crate::channel::{CHANNELS, EQUAL_WEIGHTS, FILE_CHANNEL, SYSTEM_CHANNEL};
use crate::wire::message_bytes;

/// The channels the simulation sends on.
const SIM_CHANNELS: [u8; 3] = [SYSTEM_CHANNEL, 3, FILE_CHANNEL];

/// Packet size in the simulation: small, so many messages take several packets.
const PACKET_BYTES: usize = 512;

/// Seeds that once failed, run first every time.
const REGRESSIONS: &[u64] = &[];

/// Seeds run by the test unless `LINKBUS_SIM_SEEDS` says otherwise.
const DEFAULT_SEEDS: u64 = 5000;

/// Messages each side sends.
const MESSAGES: u64 = 150;

/// Simulated milliseconds with faults, then without.
const FAULTY_MS: u64 = 1_500;
const QUIET_MS_MAX: u64 = 30_000;

/// splitmix64: small, fast and good enough to drive faults.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with probability `permille` / 1000.
    fn chance(&mut self, permille: u64) -> bool {
        self.next() % 1000 < permille
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// How often each fault strikes, per frame (or per millisecond for connection faults).
#[derive(Debug, Clone, Copy)]
struct Faults {
    drop: u64,
    duplicate: u64,
    delay: u64,
    corrupt: u64,
    disconnect: u64,
    partition: u64,
    /// The host cannot take a message (a full queue): it stores nothing more and drops the
    /// connection, as the node does.
    refuse: u64,
}

impl Faults {
    fn random(rng: &mut Rng) -> Self {
        Self {
            drop: rng.below(80),
            duplicate: rng.below(80),
            delay: rng.below(200),
            corrupt: rng.below(30),
            disconnect: rng.below(4),
            partition: rng.below(3),
            refuse: rng.below(20),
        }
    }
}

/// A frame on the wire, to be handed to side `to` at `at_ms` if its connection still lives.
struct InFlight {
    at_ms: u64,
    to: usize,
    connection: u64,
    bytes: Vec<u8>,
}

/// One side's host: what it sent and what it stored, per channel.
#[derive(Default)]
struct Host {
    sent: u64,
    sent_on: [u64; CHANNELS],
    stored: [Vec<u64>; CHANNELS],
}

impl Host {
    fn stored(&self) -> usize {
        self.stored.iter().map(Vec::len).sum()
    }
}

struct Sim {
    rng: Rng,
    faults: Faults,
    start: Instant,
    ms: u64,
    sessions: [Session; 2],
    hosts: [Host; 2],
    wire: Vec<InFlight>,
    /// Current connection number; frames of older ones are discarded.
    connection: u64,
    connected: bool,
    reconnect_at_ms: u64,
    partitioned_until_ms: u64,
}

fn config(local: &str, peer: &str, incarnation: u64) -> SessionConfig {
    SessionConfig {
        local: NodeName::new(local).expect("valid"),
        peer: NodeName::new(peer).expect("valid"),
        incarnation,
        run: incarnation,
        durable: false,
        frame_bytes_max: 64 * 1024,
        message_bytes_max: 64 * 1024,
        packet_bytes_max: PACKET_BYTES,
        channel_weights: EQUAL_WEIGHTS,
        in_flight_messages_max: 16,
        in_flight_bytes_max: 1 << 20,
        reorder_messages_max: 8,
        reorder_bytes_max: 4096,
        retransmit_timeout: Duration::from_millis(60),
        ping_interval: Duration::from_millis(40),
        pong_timeout: Duration::from_millis(80),
        handshake_timeout: Duration::from_millis(100),
        ack_delay: Duration::from_millis(5),
        recycler: std::sync::Arc::new(crate::recycle::Recycler::new(0)),
    }
}

/// A message; every other one has a lifetime (longer than any run, so none expires: the
/// lifetime arithmetic on resends, resumes and held messages runs without changing what
/// must arrive).
fn message(from: &str, n: u64, padding: usize) -> Bytes {
    let mut content =
        Content::buf("X:q".parse().expect("valid"), format!("message {n} {}", "x".repeat(padding)));
    if n.is_multiple_of(2) {
        content.lifetime = Some(linkbus_plugin_api::Lifetime::from_ms(3_600_000));
    }
    message_bytes(&Message {
        encoding: Default::default(),
        id: MessageId { source: NodeName::new(from).expect("valid"), sequence: n, created_unix_ms: 0 },
        hop_count: 0,
        redelivered: false,
        backout_count: 0,
        content: Box::new(content),
    })
}

/// Splits a transmit buffer into frames by their length prefixes (a corrupted prefix is the
/// receiver's problem, as on a real wire).
fn frames(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 4 {
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let end = (4 + len).min(rest.len());
        out.push(rest[..end].to_vec());
        rest = &rest[end..];
    }
    out
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let faults = Faults::random(&mut rng);
        let start = Instant::now();
        let sessions = [Session::new(config("A", "B", 1), start), Session::new(config("B", "A", 2), start)];
        Self {
            rng,
            faults,
            start,
            ms: 0,
            sessions,
            hosts: [Host::default(), Host::default()],
            wire: Vec::new(),
            connection: 0,
            connected: false,
            reconnect_at_ms: 0,
            partitioned_until_ms: 0,
        }
    }

    fn now(&self) -> Instant {
        self.start + Duration::from_millis(self.ms)
    }

    fn faulty(&self) -> bool {
        self.ms < FAULTY_MS
    }

    fn disconnect(&mut self) {
        if !self.connected {
            return;
        }
        self.connected = false;
        self.connection += 1;
        for s in &mut self.sessions {
            s.handle_disconnected();
        }
        self.reconnect_at_ms = self.ms + 1 + self.rng.below(50);
    }

    fn connect(&mut self) {
        self.connected = true;
        let now = self.now();
        for s in &mut self.sessions {
            s.handle_connected(now);
        }
    }

    /// One simulated millisecond.
    fn step(&mut self) -> Result<(), String> {
        self.ms += 1;
        let now = self.now();
        if !self.connected && self.ms >= self.reconnect_at_ms {
            self.connect();
        }
        if self.faulty() && self.rng.chance(self.faults.disconnect) {
            self.disconnect();
        }
        if self.faulty() && self.rng.chance(self.faults.partition) {
            self.partitioned_until_ms = self.ms + self.rng.below(300);
        }
        for side in 0..2 {
            let from = if side == 0 { "A" } else { "B" };
            for _ in 0..4 {
                let channel = SIM_CHANNELS[self.rng.below(3) as usize];
                let host = &self.hosts[side];
                if host.sent >= MESSAGES || !self.sessions[side].has_window(channel) || !self.rng.chance(300)
                {
                    break;
                }
                let n = host.sent_on[channel as usize] + 1;
                // One in five takes several packets.
                let padding = if self.rng.chance(200) { self.rng.below(3_000) } else { self.rng.below(100) };
                let message = message(from, n, padding as usize);
                let expires_at = n.is_multiple_of(2).then(|| now + Duration::from_secs(3_600));
                self.sessions[side].send(channel, message, expires_at, now).map_err(|e| e.to_string())?;
                self.hosts[side].sent += 1;
                self.hosts[side].sent_on[channel as usize] = n;
            }
            if self.sessions[side].poll_timeout().is_some_and(|t| t <= now) {
                self.sessions[side].handle_timeout(now);
            }
            self.sessions[side].write_pending(now, 4096);
            self.transmit(side);
        }
        self.deliver(now);
        self.events()
    }

    fn transmit(&mut self, side: usize) {
        let Some(bytes) = self.sessions[side].poll_transmit() else { return };
        if !self.connected {
            return;
        }
        for mut frame in frames(&bytes) {
            let faulty = self.faulty();
            if faulty && (self.rng.chance(self.faults.drop) || self.ms < self.partitioned_until_ms) {
                continue;
            }
            if faulty && self.rng.chance(self.faults.corrupt) && !frame.is_empty() {
                let bit = self.rng.below(frame.len() as u64 * 8) as usize;
                frame[bit / 8] ^= 1 << (bit % 8);
            }
            let copies = if faulty && self.rng.chance(self.faults.duplicate) { 2 } else { 1 };
            for _ in 0..copies {
                let delay = if faulty && self.rng.chance(self.faults.delay) { self.rng.below(30) } else { 0 };
                let item = InFlight {
                    at_ms: self.ms + 1 + delay,
                    to: 1 - side,
                    connection: self.connection,
                    bytes: frame.clone(),
                };
                self.wire.push(item);
            }
        }
    }

    fn deliver(&mut self, now: Instant) {
        let (due, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.wire).into_iter().partition(|f| f.at_ms <= self.ms);
        self.wire = later;
        for frame in due {
            if frame.connection == self.connection && self.connected {
                self.sessions[frame.to].handle_bytes(&frame.bytes, now);
            }
        }
    }

    /// Handles both sides' events; a closed connection closes for both ends.
    fn events(&mut self) -> Result<(), String> {
        let mut closed = false;
        for side in 0..2 {
            let mut delivered = [None; CHANNELS];
            while let Some(event) = self.sessions[side].poll_event() {
                match event {
                    SessionEvent::Received { .. } if self.faulty() && self.rng.chance(self.faults.refuse) => {
                        closed = true;
                        break;
                    }
                    SessionEvent::Received { channel, sequence, message } => {
                        let stored = &mut self.hosts[side].stored[channel as usize];
                        let expected = stored.len() as u64 + 1;
                        if message.id.sequence != expected {
                            return Err(format!(
                                "side {side} stored message {} on channel {channel} where {expected} was due (ms {})",
                                message.id.sequence, self.ms
                            ));
                        }
                        stored.push(message.id.sequence);
                        delivered[channel as usize] = Some(sequence);
                    }
                    SessionEvent::Skipped { channel, sequence, .. } => {
                        delivered[channel as usize] = Some(sequence)
                    }
                    SessionEvent::Closed(_) => closed = true,
                    SessionEvent::Dropped { .. } => return Err("a message was dropped".into()),
                    SessionEvent::Established { .. } | SessionEvent::Acked { .. } => {}
                }
            }
            for (channel, through) in delivered.into_iter().enumerate() {
                if let Some(through) = through {
                    self.sessions[side].handle_delivered(channel as u8, through, self.now());
                }
            }
        }
        if closed {
            self.disconnect();
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.hosts.iter().all(|h| h.sent == MESSAGES && h.stored() as u64 == MESSAGES)
            && self.sessions.iter().all(|s| s.in_flight() == 0)
    }

    /// Runs the seed: the faulty phase, then the quiet phase until everything arrived.
    fn run(mut self) -> Result<[SessionStats; 2], String> {
        while self.ms < FAULTY_MS {
            self.step()?;
        }
        while !self.done() {
            if self.ms > FAULTY_MS + QUIET_MS_MAX {
                let stored: Vec<usize> = self.hosts.iter().map(Host::stored).collect();
                return Err(format!(
                    "no progress: stored {stored:?} of {MESSAGES} each, faults {:?}",
                    self.faults
                ));
            }
            self.step()?;
        }
        Ok([*self.sessions[0].stats(), *self.sessions[1].stats()])
    }
}

#[test]
fn every_seed_delivers_exactly_once_in_order_and_recovers() {
    let count = std::env::var("LINKBUS_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(DEFAULT_SEEDS);
    let started = std::time::Instant::now();
    let mut totals = SessionStats::default();
    let mut failures = Vec::new();
    for seed in REGRESSIONS.iter().copied().chain(0..count) {
        match Sim::new(seed).run() {
            Ok(stats) => {
                for s in stats {
                    totals.renegotiations += s.renegotiations;
                    totals.resent += s.resent;
                    totals.retransmit_timeouts += s.retransmit_timeouts;
                    totals.naks_sent += s.naks_sent;
                    totals.naks_received += s.naks_received;
                    totals.duplicates += s.duplicates;
                    totals.held += s.held;
                    totals.dropped_ahead += s.dropped_ahead;
                    totals.resumed_bytes += s.resumed_bytes;
                }
            }
            Err(e) => failures.push(format!("seed {seed}: {e}")),
        }
    }
    println!("{count} seeds in {:?}; totals over all sessions: {totals:?}", started.elapsed());
    assert!(
        failures.is_empty(),
        "{} failing seeds (add them to REGRESSIONS):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        totals.naks_sent > 0
            && totals.retransmit_timeouts > 0
            && totals.duplicates > 0
            && totals.held > 0
            && totals.resumed_bytes > 0,
        "every mechanism was exercised: {totals:?}"
    );
}
