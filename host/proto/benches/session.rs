//! Micro-benchmark of the link session state machine ([`linkbus_proto::Session`]): two
//! sessions joined back to back in memory, with the link's default settings, carry a batch
//! of messages from send through packets, receive and delivered events to the cumulative
//! acknowledgement that completes them at the sender.
//!
//! No socket, no Noise and no clock: what is measured is the session's own work per message
//! (window, packet scheduler, frame encode and decode, CRCs, reassembly, decoding the
//! message, acknowledgements), as the link task drives it.

use std::time::{Duration, Instant};

use bytes::Bytes;
use divan::Bencher;
use divan::counter::{BytesCount, ItemsCount};
use linkbus_plugin_api::{Content, Message, MessageId, NodeName};
use linkbus_proto::channel::{CHANNELS, EQUAL_WEIGHTS};
use linkbus_proto::wire::message_bytes;
use linkbus_proto::{Session, SessionConfig, SessionEvent};

/// Payload sizes measured.
const SIZES: [usize; 3] = [64, 1024, 64 * 1024];

/// Messages carried per iteration.
const BATCH: usize = 1_000;

/// The channel the messages travel on (priority level 0).
const CHANNEL: u8 = 1;

/// Bytes of packets the sender writes per round: the link's data backlog
/// (`DATA_BACKLOG_BYTES`), above which it writes no more packets until the writer drains.
const WRITE_BUDGET_BYTES: usize = 256 << 10;

/// Rounds one batch may take before the benchmark fails instead of spinning.
const ROUNDS_MAX: usize = 100_000;

fn main() {
    divan::main();
}

/// The link's default settings (`links:` defaults, 4 MiB messages).
fn config(local: &str, peer: &str, incarnation: u64) -> SessionConfig {
    SessionConfig {
        local: NodeName::new(local).expect("valid name"),
        peer: NodeName::new(peer).expect("valid name"),
        incarnation,
        run: incarnation,
        durable: false,
        frame_bytes_max: 1 << 20,
        message_bytes_max: (4 << 20) + 4096,
        packet_bytes_max: 64 << 10,
        channel_weights: EQUAL_WEIGHTS,
        in_flight_messages_max: 4096,
        in_flight_bytes_max: 64 << 20,
        reorder_messages_max: 1024,
        reorder_bytes_max: 16 << 20,
        retransmit_timeout: Duration::from_secs(10),
        ping_interval: Duration::from_secs(5),
        pong_timeout: Duration::from_secs(10),
        handshake_timeout: Duration::from_secs(5),
        ack_delay: Duration::ZERO,
        recycler: std::sync::Arc::new(linkbus_proto::recycle::Recycler::new(0)),
    }
}

/// An encoded message with a payload of `payload_bytes`.
fn message(payload_bytes: usize) -> Bytes {
    message_bytes(&Message {
        encoding: Default::default(),
        id: MessageId { source: NodeName::new("A").expect("valid name"), sequence: 1, created_unix_ms: 0 },
        hop_count: 0,
        redelivered: false,
        backout_count: 0,
        content: Box::new(Content::buf(
            "B:orders".parse().expect("valid address"),
            vec![0x5a; payload_bytes],
        )),
    })
}

/// Hands what `from` wrote to `to` in one received chunk, as a link's large socket read
/// mostly brings whole frames. Returns whether anything moved.
fn carry(from: &mut Session, to: &mut Session, now: Instant) -> bool {
    let Some(bytes) = from.poll_transmit() else { return false };
    to.handle_received(bytes, now);
    true
}

/// Sender `a` and receiver `b`, connected; `now` never moves (no timer is due in a batch).
struct Pair {
    a: Session,
    b: Session,
    now: Instant,
}

impl Pair {
    fn connected() -> Self {
        let now = Instant::now();
        let mut pair = Self {
            a: Session::new(config("A", "B", 11), now),
            b: Session::new(config("B", "A", 22), now),
            now,
        };
        pair.a.handle_connected(now);
        pair.b.handle_connected(now);
        for _ in 0..10 {
            let moved = carry(&mut pair.a, &mut pair.b, now) | carry(&mut pair.b, &mut pair.a, now);
            if !moved {
                break;
            }
        }
        assert!(pair.a.is_established() && pair.b.is_established(), "the handshake completed");
        while pair.a.poll_event().is_some() {}
        while pair.b.poll_event().is_some() {}
        pair
    }

    /// The receiving host: takes every delivered message, then confirms each channel's
    /// last one (one cumulative acknowledgement per channel and round, as the link does).
    fn deliver(&mut self) {
        let mut through = [None; CHANNELS];
        while let Some(event) = self.b.poll_event() {
            match event {
                SessionEvent::Received { channel, sequence, message } => {
                    divan::black_box(message);
                    through[channel as usize] = Some(sequence);
                }
                SessionEvent::Skipped { channel, sequence, .. } => through[channel as usize] = Some(sequence),
                other => panic!("unexpected event at the receiver: {other:?}"),
            }
        }
        for (channel, through) in through.into_iter().enumerate() {
            if let Some(through) = through {
                self.b.handle_delivered(channel as u8, through, self.now);
            }
        }
    }

    /// Messages the sender saw acknowledged since the last call.
    fn acked(&mut self) -> usize {
        let mut acked = 0;
        while let Some(event) = self.a.poll_event() {
            match event {
                SessionEvent::Acked { messages, .. } => acked += messages,
                other => panic!("unexpected event at the sender: {other:?}"),
            }
        }
        acked
    }

    /// Sends `count` copies of `message` (as far as the window allows, then more as
    /// acknowledgements free it) until all are acknowledged.
    fn transfer(&mut self, message: &Bytes, count: usize) {
        let (mut sent, mut acked) = (0, 0);
        for _ in 0..ROUNDS_MAX {
            while sent < count && self.a.has_window(CHANNEL) {
                self.a.send(CHANNEL, message.clone(), None, self.now).expect("the window has room");
                sent += 1;
            }
            self.a.write_pending(self.now, WRITE_BUDGET_BYTES);
            carry(&mut self.a, &mut self.b, self.now);
            self.deliver();
            carry(&mut self.b, &mut self.a, self.now);
            acked += self.acked();
            if acked == count {
                return;
            }
        }
        panic!("{acked} of {count} messages acknowledged after {ROUNDS_MAX} rounds");
    }
}

/// A batch of [`BATCH`] messages from `send` on one side to their acknowledgement back.
#[divan::bench(args = SIZES)]
fn send_deliver_acknowledge(bencher: Bencher, size: usize) {
    let mut pair = Pair::connected();
    let message = message(size);
    bencher
        .counter(ItemsCount::new(BATCH))
        .counter(BytesCount::new(BATCH * size))
        .bench_local(|| pair.transfer(&message, BATCH));
}
