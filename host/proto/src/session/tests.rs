//! Session behaviour over an in-memory pipe with a manual clock: handshake, ordered delivery,
//! cumulative acknowledgement, resend after reconnect, duplicates, peer restarts, keepalive
//! and refusal of bad peers.

use super::acks::{ACK_WAITING_BYTES_MAX, ACK_WAITING_MESSAGES_MAX};
use super::*;
use crate::frame::ChannelPosition;
use crate::wire::message_bytes;
use linkbus_plugin_api::{Content, Lifetime, Message, MessageId};
use proptest::prelude::*;

mod acks;
mod packets;
mod restarts;

/// The channel most tests use (priority level 0).
const C: u8 = 1;

fn config(local: &str, peer: &str, incarnation: u64) -> SessionConfig {
    SessionConfig {
        local: NodeName::new(local).unwrap(),
        peer: NodeName::new(peer).unwrap(),
        incarnation,
        run: incarnation,
        durable: false,
        frame_bytes_max: 1 << 20,
        message_bytes_max: 1 << 20,
        packet_bytes_max: 1 << 16,
        channel_weights: crate::channel::EQUAL_WEIGHTS,
        in_flight_messages_max: 8,
        in_flight_bytes_max: 1 << 20,
        reorder_messages_max: 16,
        reorder_bytes_max: 1 << 20,
        retransmit_timeout: Duration::from_secs(3),
        ping_interval: Duration::from_secs(1),
        pong_timeout: Duration::from_secs(2),
        handshake_timeout: Duration::from_secs(5),
        ack_delay: Duration::ZERO,
        recycler: Arc::new(crate::recycle::Recycler::new(0)),
    }
}

fn message(n: u64) -> Bytes {
    message_bytes(&Message {
        encoding: Default::default(),
        id: MessageId { source: NodeName::new("A").unwrap(), sequence: n, created_unix_ms: 0 },
        hop_count: 0,
        redelivered: false,
        backout_count: 0,
        content: Box::new(Content::buf("B:q".parse().unwrap(), n.to_string())),
    })
}

/// Everything `s` has to write: waiting messages, then the frames.
fn out(s: &mut Session, now: Instant) -> Option<Bytes> {
    s.write_pending(now, usize::MAX);
    s.poll_transmit()
}

/// Two sessions joined by an in-memory connection; `deliver` stores everything received.
struct Pair {
    a: Session,
    b: Session,
    now: Instant,
    received_by_b: Vec<u64>,
    closed: Vec<SessionError>,
}

impl Pair {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            a: Session::new(config("A", "B", 11), now),
            b: Session::new(config("B", "A", 22), now),
            now,
            received_by_b: Vec::new(),
            closed: Vec::new(),
        }
    }

    /// Sends `message` from A on channel `C`, then [`Pair::deliver_written`].
    fn carry(&mut self, message: &Message) -> Message {
        self.a.send(C, crate::wire::Encoded::of(message), None, self.now).unwrap();
        self.deliver_written()
    }

    /// Hands what A writes now to B, and returns the message B delivers.
    fn deliver_written(&mut self) -> Message {
        self.a.write_pending(self.now, usize::MAX);
        self.b.handle_bytes(&self.a.poll_transmit().unwrap(), self.now);
        let got = std::iter::from_fn(|| self.b.poll_event()).find_map(|e| match e {
            SessionEvent::Received { message, .. } => Some(message),
            _ => None,
        });
        got.expect("delivered whole")
    }

    fn connect(&mut self) {
        self.a.handle_connected(self.now);
        self.b.handle_connected(self.now);
        self.pump();
    }

    /// Moves bytes both ways until nothing moves (bounded).
    fn pump(&mut self) {
        for _ in 0..100 {
            let mut moved = false;
            self.a.write_pending(self.now, usize::MAX);
            self.b.write_pending(self.now, usize::MAX);
            if let Some(bytes) = self.a.poll_transmit() {
                self.b.handle_bytes(&bytes, self.now);
                moved = true;
            }
            if let Some(bytes) = self.b.poll_transmit() {
                self.a.handle_bytes(&bytes, self.now);
                moved = true;
            }
            self.drain();
            if !moved {
                return;
            }
        }
        panic!("pump did not settle");
    }

    fn drain(&mut self) {
        while let Some(e) = self.a.poll_event() {
            if let SessionEvent::Closed(e) = e {
                self.closed.push(e);
            }
        }
        while let Some(e) = self.b.poll_event() {
            match e {
                SessionEvent::Received { channel, sequence, message } => {
                    self.received_by_b.push(message.id.sequence);
                    self.b.handle_delivered(channel, sequence, self.now);
                }
                SessionEvent::Skipped { channel, sequence, .. } => {
                    self.b.handle_delivered(channel, sequence, self.now)
                }
                SessionEvent::Closed(e) => self.closed.push(e),
                _ => {}
            }
        }
    }

    /// A sends messages `numbers` on channel `C`.
    fn send(&mut self, numbers: std::ops::RangeInclusive<u64>) {
        for n in numbers {
            self.a.send(C, message(n), None, self.now).unwrap();
        }
    }

    /// Both ends connect and take each other's `Hello` (and whatever A wrote with its own),
    /// moving nothing more.
    fn exchange_hellos(&mut self) {
        self.a.handle_connected(self.now);
        self.b.handle_connected(self.now);
        self.a.handle_bytes(&self.b.poll_transmit().unwrap(), self.now);
        self.b.handle_bytes(&self.a.poll_transmit().unwrap(), self.now);
    }

    fn disconnect(&mut self) {
        self.a.handle_disconnected();
        self.b.handle_disconnected();
    }
}

#[test]
fn messages_flow_in_order_and_are_acknowledged() {
    let mut p = Pair::new();
    p.connect();
    assert!(p.a.is_established() && p.b.is_established());
    p.send(1..=5);
    p.pump();
    assert_eq!(p.received_by_b, [1, 2, 3, 4, 5]);
    assert_eq!(p.a.in_flight(), 0, "cumulative ACK completed everything");
    assert!(p.closed.is_empty());
}

#[test]
fn messages_sent_while_down_arrive_after_reconnect() {
    let mut p = Pair::new();
    p.a.send(C, message(1), None, p.now).unwrap();
    p.a.send(C, message(2), None, p.now).unwrap();
    p.connect();
    assert_eq!(p.received_by_b, [1, 2]);
}

#[test]
fn unacknowledged_messages_are_resent_exactly_once() {
    let mut p = Pair::new();
    p.connect();
    p.a.send(C, message(1), None, p.now).unwrap();
    p.pump();
    // Message 2 is written but the connection breaks before it arrives.
    p.a.send(C, message(2), None, p.now).unwrap();
    let _lost = out(&mut p.a, p.now);
    // Message 3 arrives at B, but B's ACK is lost.
    p.disconnect();
    p.connect();
    p.a.send(C, message(3), None, p.now).unwrap();
    let to_b = out(&mut p.a, p.now).unwrap();
    p.b.handle_bytes(&to_b, p.now);
    p.drain();
    let _lost_ack = p.b.poll_transmit();
    p.disconnect();
    p.connect();
    assert_eq!(p.received_by_b, [1, 2, 3], "no loss, no duplicate");
    assert_eq!(p.a.in_flight(), 0);
}

#[test]
fn a_peer_that_lost_its_state_gets_a_fresh_sequence_space() {
    let mut p = Pair::new();
    p.connect();
    p.send(1..=3);
    p.pump();
    p.disconnect();
    // B restarts with a new incarnation and nothing remembered.
    p.b = Session::new(config("B", "A", 33), p.now);
    p.a.send(C, message(4), None, p.now).unwrap();
    p.connect();
    assert_eq!(p.received_by_b, [1, 2, 3, 4]);
    assert!(p.closed.is_empty(), "{:?}", p.closed);
    // And A restarting is handled the same way by B.
    p.disconnect();
    p.a = Session::new(config("A", "B", 44), p.now);
    p.a.send(C, message(5), None, p.now).unwrap();
    p.connect();
    assert_eq!(p.received_by_b, [1, 2, 3, 4, 5]);
    assert!(p.closed.is_empty(), "{:?}", p.closed);
}

#[test]
fn a_restarted_receiver_that_kept_its_numbers_gets_no_duplicates() {
    let mut p = Pair::new();
    p.connect();
    p.send(1..=3);
    p.pump();
    // Messages 4 and 5 reach B (which stores them and records 6 as next) but B's ACK is lost
    // when B crashes.
    p.a.send(C, message(4), None, p.now).unwrap();
    p.a.send(C, message(5), None, p.now).unwrap();
    let to_b = out(&mut p.a, p.now).unwrap();
    p.b.handle_bytes(&to_b, p.now);
    p.drain();
    let _lost_ack = p.b.poll_transmit();
    p.disconnect();
    // B comes back with a new incarnation for its own sending, but with what it recorded
    // about A's numbers.
    p.b = Session::new(config("B", "A", 33), p.now);
    let mut expected = vec![1; CHANNELS];
    expected[C as usize] = 6;
    p.b.restore_receiving(11, &expected);
    p.connect();
    assert_eq!(p.a.in_flight(), 0, "B's numbers completed 4 and 5 at A");
    p.a.send(C, message(6), None, p.now).unwrap();
    p.pump();
    assert_eq!(p.received_by_b, [1, 2, 3, 4, 5, 6], "nothing twice");
    assert!(p.closed.is_empty(), "{:?}", p.closed);
}

#[test]
fn window_bounds_messages_in_flight() {
    let mut p = Pair::new();
    p.send(1..=8);
    assert_eq!(p.a.send(C, message(9), None, p.now), Err(SendError::WindowFull(8)));
    p.connect();
    assert!(p.a.has_window(C));
}

#[test]
fn wrong_peer_and_wrong_version_are_refused() {
    let now = Instant::now();
    let mut a = Session::new(config("A", "B", 1), now);
    let mut c = Session::new(config("C", "A", 2), now);
    a.handle_connected(now);
    c.handle_connected(now);
    a.handle_bytes(&c.poll_transmit().unwrap(), now);
    assert!(matches!(a.poll_event(), Some(SessionEvent::Closed(SessionError::WrongPeer { .. }))));

    let mut a = Session::new(config("A", "B", 1), now);
    a.handle_connected(now);
    let mut wire = BytesMut::new();
    Frame::Hello(Hello { protocol_version: PROTOCOL_VERSION + 1, incarnation: 5, ..Hello::new("B", "A") })
        .encode(&mut wire);
    a.handle_bytes(&wire, now);
    assert!(matches!(a.poll_event(), Some(SessionEvent::Closed(SessionError::Version { .. }))));
    let close = a.poll_transmit().unwrap();
    assert!(close.windows(7).any(|w| w == b"version"), "the peer is told why");
}

#[test]
fn garbage_closes_the_connection_and_a_damaged_message_is_asked_again() {
    let mut p = Pair::new();
    p.connect();
    p.b.handle_bytes(b"\x00\x00\x00\x03\xff\xff\xff", p.now);
    assert!(matches!(p.b.poll_event(), Some(SessionEvent::Closed(SessionError::Frame(_)))));

    let mut p = Pair::new();
    p.connect();
    p.a.send(C, message(1), None, p.now).unwrap();
    let mut wire = BytesMut::from(&out(&mut p.a, p.now).unwrap()[..]);
    let last = wire.len() - 1;
    wire[last] ^= 0x40;
    p.b.handle_bytes(&wire, p.now);
    assert_eq!(p.b.poll_event(), None, "nothing delivered");
    assert_eq!(p.b.stats().naks_sent, 1);
    p.pump();
    assert_eq!(p.received_by_b, [1], "the NAK made A write it again");
    assert_eq!(p.a.stats().naks_received, 1);

    let mut p = Pair::new();
    p.connect();
    let mut wire = BytesMut::new();
    Frame::Ack { channel: C, sequence: 5 }.encode(&mut wire);
    p.a.handle_bytes(&wire, p.now);
    assert_eq!(p.a.poll_event(), None, "an ACK matching nothing awaiting is ignored");
    assert!(p.a.is_established());
}

#[test]
fn keepalive_pings_and_drops_a_silent_peer() {
    let mut p = Pair::new();
    p.connect();
    p.now += Duration::from_millis(1500);
    p.a.handle_timeout(p.now);
    p.pump();
    assert!(p.closed.is_empty(), "a ping answered keeps the link");
    p.now += Duration::from_millis(1500);
    p.a.handle_timeout(p.now);
    let _unanswered = p.a.poll_transmit();
    assert_eq!(p.a.poll_timeout(), Some(p.now + Duration::from_secs(2)));
    p.now += Duration::from_secs(2);
    p.a.handle_timeout(p.now);
    assert_eq!(p.a.poll_event(), Some(SessionEvent::Closed(SessionError::PongTimeout)));
}

#[test]
fn handshake_times_out() {
    let now = Instant::now();
    let mut a = Session::new(config("A", "B", 1), now);
    a.handle_connected(now);
    a.handle_timeout(now + Duration::from_secs(5));
    assert_eq!(a.poll_event(), Some(SessionEvent::Closed(SessionError::HandshakeTimeout)));
}

#[test]
fn unconfirmed_deliveries_are_resent_after_a_reconnect() {
    let mut p = Pair::new();
    p.connect();
    p.send(1..=3);
    // B receives all three but the host stores only the first, then the link drops.
    let bytes = out(&mut p.a, p.now).unwrap();
    p.b.handle_bytes(&bytes, p.now);
    let mut got = Vec::new();
    while let Some(e) = p.b.poll_event() {
        if let SessionEvent::Received { sequence, .. } = e {
            got.push(sequence);
        }
    }
    assert_eq!(got, [1, 2, 3]);
    p.b.handle_delivered(C, 1, p.now);
    p.received_by_b.push(1);
    p.disconnect();
    p.connect();
    assert_eq!(p.received_by_b, [1, 2, 3], "2 and 3 come again, 1 does not");
    assert_eq!(p.a.in_flight(), 0);
}

#[test]
fn a_message_that_expired_while_waiting_is_skipped_not_sent() {
    let mut p = Pair::new();
    p.a.send(C, message(1), Some(p.now + Duration::from_millis(100)), p.now).unwrap();
    p.a.send(C, message(2), Some(p.now + Duration::from_secs(60)), p.now).unwrap();
    p.now += Duration::from_secs(1);
    p.a.handle_connected(p.now);
    p.b.handle_connected(p.now);
    let bytes = p.b.poll_transmit().unwrap();
    p.a.handle_bytes(&bytes, p.now);
    let bytes = out(&mut p.a, p.now).unwrap();
    let mut dropped = Vec::new();
    while let Some(e) = p.a.poll_event() {
        if let SessionEvent::Dropped { reason, .. } = e {
            dropped.push(reason);
        }
    }
    assert_eq!(dropped, [DropReason::Expired]);
    p.b.handle_bytes(&bytes, p.now);
    let mut b_events = Vec::new();
    while let Some(e) = p.b.poll_event() {
        match e {
            SessionEvent::Skipped { sequence, .. } => b_events.push((sequence, None)),
            SessionEvent::Received { sequence, message, .. } => {
                b_events.push((sequence, message.content.lifetime))
            }
            _ => {}
        }
    }
    assert_eq!(
        b_events,
        [(1, None), (2, Some(Lifetime::from_ms(59_000)))],
        "the resend carries the time left"
    );
}

#[test]
fn messages_too_large_for_the_peer_are_refused_or_dropped() {
    let now = Instant::now();
    let mut a = Session::new(config("A", "B", 1), now);
    let mut small = config("B", "A", 2);
    small.message_bytes_max = 70_000;
    let mut b = Session::new(small, now);
    let mut large = BytesMut::from(&message(1)[..]);
    large.extend_from_slice(&[0u8; 80_000]);
    a.send(C, large.freeze(), None, now).unwrap();
    a.handle_connected(now);
    b.handle_connected(now);
    a.handle_bytes(&b.poll_transmit().unwrap(), now);
    assert!(matches!(a.poll_event(), Some(SessionEvent::Established { resent: 1, .. })));
    a.write_pending(now, usize::MAX);
    let dropped = a.poll_event();
    assert!(matches!(dropped, Some(SessionEvent::Dropped { reason: DropReason::TooLargeForPeer, .. })));
    let mut large = BytesMut::from(&message(2)[..]);
    large.extend_from_slice(&[0u8; 80_000]);
    assert!(matches!(a.send(C, large.freeze(), None, now), Err(SendError::TooLarge { max: 70_000, .. })));
}

#[test]
fn the_tie_break_is_the_same_on_both_sides() {
    let now = Instant::now();
    let a = Session::new(config("A", "B", 1), now);
    let b = Session::new(config("B", "A", 2), now);
    // A's dial (current at A, dialed by A) against B's dial (new at A).
    assert!(!a.should_replace(true, false, None));
    // The same two connections seen from B: B's own dial is current, A's arrives.
    assert!(b.should_replace(true, false, None));
    // Same dialer: the newer wins.
    assert!(a.should_replace(false, false, None));
}

#[test]
fn a_restarted_peer_replaces_a_dead_preferred_connection() {
    let mut p = Pair::new();
    p.connect();
    assert!(
        !p.a.should_replace(true, false, Some((22, 22))),
        "same incarnation and run: the tie-break holds"
    );
    assert!(p.a.should_replace(true, false, Some((99, 22))), "new incarnation: the old connection is dead");
    assert!(p.a.should_replace(true, false, Some((22, 5))), "same kept incarnation, new run: dead too");
}

/// What the randomized link does next.
#[derive(Debug, Clone)]
enum Step {
    Send,
    /// Moves up to this many bytes from A to B.
    AtoB(usize),
    BtoA,
    /// B's host stores what it received, or refuses.
    Deliver(bool),
    Reconnect,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => Just(Step::Send),
        3 => (1usize..400).prop_map(Step::AtoB),
        2 => Just(Step::BtoA),
        2 => any::<bool>().prop_map(Step::Deliver),
        1 => Just(Step::Reconnect),
    ]
}

proptest! {
    /// Whatever the order of sends, partial transfers, refused deliveries and reconnects,
    /// B stores every message exactly once and in order, and after a final clean exchange
    /// everything sent was stored.
    #[test]
    fn no_loss_no_duplicate_no_reordering(steps in proptest::collection::vec(step(), 1..120)) {
        let now = Instant::now();
        let mut a = Session::new(config("A", "B", 1), now);
        let mut b = Session::new(config("B", "A", 2), now);
        let (mut sent, mut stored, mut pending_b) = (0u64, Vec::<u64>::new(), Vec::<(u64, u64)>::new());
        let mut in_transit: Vec<u8> = Vec::new();
        a.handle_connected(now);
        b.handle_connected(now);
        for s in steps.into_iter().chain([Step::Reconnect]) {
            match s {
                Step::Send => {
                    if a.send(C, message(sent + 1), None, now).is_ok() {
                        sent += 1;
                    }
                }
                Step::AtoB(n) => {
                    if let Some(bytes) = out(&mut a, now) { in_transit.extend_from_slice(&bytes); }
                    let n = n.min(in_transit.len());
                    let chunk: Vec<u8> = in_transit.drain(..n).collect();
                    b.handle_bytes(&chunk, now);
                }
                Step::BtoA => {
                    if let Some(bytes) = b.poll_transmit() { a.handle_bytes(&bytes, now); }
                }
                Step::Deliver(ok) => {
                    while let Some(e) = b.poll_event() {
                        if let SessionEvent::Received { sequence, message, .. } = e { pending_b.push((sequence, message.id.sequence)); }
                    }
                    if ok {
                        if let Some(&(last, _)) = pending_b.last() {
                            stored.extend(pending_b.drain(..).map(|(_, id)| id));
                            b.handle_delivered(C, last, now);
                        }
                    } else {
                        pending_b.clear();
                        a.handle_disconnected();
                        b.handle_disconnected();
                        in_transit.clear();
                        a.handle_connected(now);
                        b.handle_connected(now);
                    }
                }
                Step::Reconnect => {
                    pending_b.clear();
                    a.handle_disconnected();
                    b.handle_disconnected();
                    in_transit.clear();
                    a.handle_connected(now);
                    b.handle_connected(now);
                }
            }
            while a.poll_event().is_some() {}
            prop_assert!(stored.windows(2).all(|w| w[1] == w[0] + 1), "in order, no duplicate: {:?}", stored);
            prop_assert!(stored.first().is_none_or(|f| *f == 1));
        }
        // A final clean exchange delivers everything.
        for _ in 0..50 {
            if let Some(bytes) = out(&mut a, now) { b.handle_bytes(&bytes, now); }
            while let Some(e) = b.poll_event() {
                if let SessionEvent::Received { sequence, message, .. } = e {
                    stored.push(message.id.sequence);
                    b.handle_delivered(C, sequence, now);
                }
            }
            if let Some(bytes) = b.poll_transmit() { a.handle_bytes(&bytes, now); }
            while a.poll_event().is_some() {}
        }
        prop_assert_eq!(stored, (1..=sent).collect::<Vec<_>>());
        prop_assert_eq!(a.in_flight(), 0);
    }
}

#[test]
fn writes_respect_the_budget_and_keep_order() {
    let mut p = Pair::new();
    p.connect();
    p.send(1..=8);
    assert_eq!(p.a.unwritten(), 8);
    assert_eq!(p.a.write_pending(p.now, 1), 1, "a budget writes at least one message");
    assert_eq!(p.a.write_pending(p.now, 0), 0);
    assert_eq!(p.a.unwritten(), 7);
    p.pump();
    assert_eq!(p.received_by_b, (1..=8).collect::<Vec<_>>());
}

#[test]
fn a_peer_with_a_tiny_frame_limit_is_refused() {
    let now = Instant::now();
    let mut a = Session::new(config("A", "B", 1), now);
    let mut tiny = config("B", "A", 2);
    tiny.frame_bytes_max = 100;
    let mut b = Session::new(tiny, now);
    a.handle_connected(now);
    b.handle_connected(now);
    a.handle_bytes(&b.poll_transmit().unwrap(), now);
    assert_eq!(a.poll_event(), Some(SessionEvent::Closed(SessionError::FrameLimit(100))));
}

#[test]
fn pings_are_throttled_and_not_answered_when_data_flows() {
    let mut p = Pair::new();
    p.connect();
    let ping = |nonce| {
        let mut wire = BytesMut::new();
        Frame::Ping { nonce }.encode(&mut wire);
        wire
    };
    p.b.handle_bytes(&ping(1), p.now);
    assert!(p.b.poll_transmit().is_some(), "the first ping is answered");
    p.b.handle_bytes(&ping(2), p.now + Duration::from_millis(50));
    assert!(p.b.poll_transmit().is_none(), "a ping right after is not answered at once");
    assert_eq!(p.b.poll_timeout(), Some(p.now + Duration::from_millis(100)));
    p.b.handle_timeout(p.now + Duration::from_millis(100));
    assert!(p.b.poll_transmit().is_some(), "but once the interval allows");
    p.b.handle_bytes(&ping(3), p.now + Duration::from_millis(250));
    assert!(p.b.poll_transmit().is_some(), "later ones are answered at once again");
    p.b.send(C, message(1), None, p.now).unwrap();
    p.b.write_pending(p.now, usize::MAX);
    p.b.handle_bytes(&ping(4), p.now + Duration::from_millis(300));
    assert!(p.b.poll_transmit().is_some(), "the data goes out");
    assert_eq!(p.b.stats().pings_unanswered, 1, "and it answers the ping instead of a pong");
}

#[test]
fn the_byte_window_bounds_memory_but_always_lets_one_message_through() {
    let now = Instant::now();
    let mut cfg = config("A", "B", 1);
    cfg.in_flight_bytes_max = 100;
    let mut a = Session::new(cfg, now);
    let mut big = BytesMut::from(&message(1)[..]);
    big.extend_from_slice(&[0u8; 500]);
    assert!(a.has_window(C), "an empty window takes any message");
    a.send(C, big.freeze(), None, now).unwrap();
    assert!(!a.has_window(C), "500 bytes in flight is over the 100-byte window");
    assert!(matches!(a.send(C, message(2), None, now), Err(SendError::WindowFull(1))));
}

/// A pair whose acknowledgements wait up to `delay` for company, with room for `window`
/// messages in flight; connected.
fn pair_with_ack_delay(delay: Duration, window: usize) -> Pair {
    pair_with_ack_delay_and_bytes(delay, window, 1 << 20)
}

fn big_message(n: u64, size: usize) -> Bytes {
    message_bytes(&Message {
        encoding: Default::default(),
        id: MessageId { source: NodeName::new("A").unwrap(), sequence: n, created_unix_ms: 0 },
        hop_count: 0,
        redelivered: false,
        backout_count: 0,
        content: Box::new(Content::buf("B:q".parse().unwrap(), vec![(n % 251) as u8; size])),
    })
}

/// The `Data` frames in `bytes` as (channel, sequence, packet bytes), in order.
fn packets(bytes: &[u8]) -> Vec<(u8, u64, Bytes)> {
    let mut decoder = FrameDecoder::new(1 << 20);
    decoder.extend(bytes);
    std::iter::from_fn(|| decoder.decode().unwrap())
        .filter_map(|f| match f {
            Frame::Data { channel, sequence, bytes, .. } => Some((channel, sequence, bytes)),
            _ => None,
        })
        .collect()
}

fn packet_pair(packet_bytes_max: usize) -> Pair {
    let now = Instant::now();
    let mut a = config("A", "B", 11);
    a.packet_bytes_max = packet_bytes_max;
    let b = config("B", "A", 22);
    Pair {
        a: Session::new(a, now),
        b: Session::new(b, now),
        now,
        received_by_b: Vec::new(),
        closed: Vec::new(),
    }
}

/// [`pair_with_ack_delay`] with a byte window of `window_bytes`.
fn pair_with_ack_delay_and_bytes(delay: Duration, window: usize, window_bytes: usize) -> Pair {
    let alike = |c: &mut SessionConfig| {
        c.ack_delay = delay;
        c.in_flight_messages_max = window;
        c.in_flight_bytes_max = window_bytes;
    };
    pair_configured(alike, alike)
}

/// A connected pair A–B whose configurations `edit_a` and `edit_b` change first.
fn pair_configured(edit_a: impl FnOnce(&mut SessionConfig), edit_b: impl FnOnce(&mut SessionConfig)) -> Pair {
    let mut p = Pair::new();
    let (mut a, mut b) = (config("A", "B", 11), config("B", "A", 22));
    edit_a(&mut a);
    edit_b(&mut b);
    p.a = Session::new(a, p.now);
    p.b = Session::new(b, p.now);
    p.connect();
    p
}
