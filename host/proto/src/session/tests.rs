//! Session behaviour over an in-memory pipe with a manual clock: handshake, ordered delivery,
//! cumulative acknowledgement, resend after reconnect, duplicates, peer restarts, keepalive
//! and refusal of bad peers.

use super::acks::{ACK_WAITING_BYTES_MAX, ACK_WAITING_MESSAGES_MAX};
use super::*;
use crate::frame::ChannelPosition;
use crate::wire::message_bytes;
use linkbus_plugin_api::{Content, Lifetime, Message, MessageId};
use proptest::prelude::*;

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

fn message_of(n: u64, reliability: linkbus_plugin_api::Reliability) -> Bytes {
    let mut decoded = crate::wire::decode_message(message(n)).unwrap();
    decoded.content.reliability = reliability;
    message_bytes(&decoded)
}

/// A sends persistent message 1 and volatile 2..=4; B delivers and acknowledges them all,
/// then its machine crashes: it comes back (same incarnation for A's numbers) expecting
/// `expected`, as far as its disk got.
fn machine_crash_of_b(expected_after_crash: u64) -> Pair {
    use linkbus_plugin_api::Reliability::{Persistent, Volatile};
    let mut p = Pair::new();
    p.connect();
    p.a.send(C, message_of(1, Persistent), None, p.now).unwrap();
    for n in 2..=4 {
        p.a.send(C, message_of(n, Volatile), None, p.now).unwrap();
    }
    p.pump();
    assert_eq!((p.received_by_b.as_slice(), p.a.in_flight()), (&[1, 2, 3, 4][..], 0));
    p.disconnect();
    p.b = Session::new(config("B", "A", 22), p.now);
    let mut expected = vec![1; CHANNELS];
    expected[C as usize] = expected_after_crash;
    p.b.restore_receiving(11, &expected);
    p.connect();
    p
}

#[test]
fn a_restarted_sender_refuses_a_peer_expecting_a_persistent_message_it_acknowledged() {
    // A recorded nothing waiting and that B acknowledged persistent message 3; B answers
    // expecting `expected`.
    let restarted_a = |expected: u64| {
        let mut a = Session::new(config("A", "B", 11), Instant::now());
        for channel in 0..CHANNELS as u8 {
            a.restore_sending(channel, Vec::new(), Instant::now());
        }
        a.restore_acknowledged(C, 3);
        a.handle_connected(Instant::now());
        let mut hello = hello_from_b(11, 1);
        let mut decoder = FrameDecoder::new(1 << 20);
        decoder.extend(&hello);
        let Some(Frame::Hello(mut frame)) = decoder.decode().unwrap() else { panic!("a hello") };
        frame.channels[C as usize].expected = expected;
        hello.clear();
        Frame::Hello(frame).encode(&mut hello);
        a.handle_bytes(&hello, Instant::now());
        let closed = std::iter::from_fn(|| a.poll_event()).find_map(|e| match e {
            SessionEvent::Closed(e) => Some(e),
            _ => None,
        });
        (a, closed)
    };
    let (_, closed) = restarted_a(3);
    assert_eq!(closed, Some(SessionError::WentBackwards { channel: C, expected: 3, acked: 3 }));
    let (a, closed) = restarted_a(4);
    assert_eq!(closed, None, "B has everything through 3");
    assert!(a.is_established());
    let (a, closed) = restarted_a(9);
    assert_eq!(closed, None, "B got volatile messages after 3: followed");
    assert!(a.is_established());
}

#[test]
fn a_peer_that_lost_the_numbers_of_volatile_messages_gets_them_as_skips() {
    // B synced its number through the persistent message (2 next), not the volatile ones.
    let mut p = machine_crash_of_b(2);
    assert!(p.closed.is_empty(), "{:?}", p.closed);
    assert!(p.a.is_established() && p.b.is_established());
    assert_eq!(p.a.stats().lost_by_peer, 3);
    assert_eq!(p.a.in_flight(), 0, "B took 2..=4 as skips and acknowledged them");
    p.a.send(C, message(5), None, p.now).unwrap();
    p.pump();
    assert_eq!(p.received_by_b, [1, 2, 3, 4, 5], "the volatile ones are not delivered again");
}

#[test]
fn a_peer_that_lost_the_number_of_a_persistent_message_it_acknowledged_is_refused() {
    // B acknowledged persistent message 1 but expects it again: its store went back.
    let p = machine_crash_of_b(1);
    assert_eq!(p.closed.first(), Some(&SessionError::WentBackwards { channel: C, expected: 1, acked: 4 }));
    assert!(!p.a.is_established());
}

#[test]
fn a_restarted_sender_resends_what_it_recorded_skips_what_it_lost_and_follows_a_peer_ahead() {
    let restarted_a = |p: &mut Pair, recorded: &[u64]| {
        p.disconnect();
        p.a = Session::new(config("A", "B", 11), p.now);
        for channel in (0..CHANNELS as u8).filter(|c| *c != C) {
            p.a.restore_sending(channel, Vec::new(), p.now);
        }
        p.a.restore_sending(C, recorded.iter().map(|n| (*n, message(*n), None)).collect(), p.now);
        p.connect();
    };
    // B has 1..=3; A recorded 4, 5 and 7 (6 was volatile, lost with A's crash).
    let mut p = Pair::new();
    p.connect();
    p.send(1..=3);
    p.pump();
    restarted_a(&mut p, &[4, 5, 7]);
    assert_eq!(p.received_by_b, [1, 2, 3, 4, 5, 7], "6 went as a skip");
    assert_eq!(p.a.in_flight(), 0);
    p.a.send(C, message(8), None, p.now).unwrap();
    p.pump();
    assert_eq!(p.received_by_b.last(), Some(&8));

    // B expects 2 but A's first record is 4: 2 and 3 were volatile, lost.
    let mut p = Pair::new();
    p.connect();
    p.a.send(C, message(1), None, p.now).unwrap();
    p.pump();
    restarted_a(&mut p, &[4]);
    assert_eq!(p.received_by_b, [1, 4]);

    // B got volatile messages after A's last record: A follows B's number.
    let mut p = Pair::new();
    p.connect();
    p.send(1..=6);
    p.pump();
    restarted_a(&mut p, &[2]);
    assert!(p.closed.is_empty(), "{:?}", p.closed);
    assert_eq!(p.a.durable_acked(C), 2, "only what A recorded is known to be kept, not 3..=6");
    p.a.send(C, message(7), None, p.now).unwrap();
    p.pump();
    assert_eq!(p.received_by_b, [1, 2, 3, 4, 5, 6, 7], "nothing twice, numbering goes on from B's");
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
    Frame::Hello(Hello {
        protocol_version: PROTOCOL_VERSION + 1,
        api_version: 1,
        from: "B".into(),
        to: "A".into(),
        incarnation: 5,
        your_incarnation: 0,
        run: 1,
        frame_bytes_max: 1 << 20,
        message_bytes_max: 1 << 20,
        in_flight_messages_max: 4096,
        in_flight_bytes_max: 64 << 20,
        retransmit_timeout_ms: 10_000,
        flags: 0,
        channels: vec![ChannelPosition::default(); CHANNELS],
    })
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

fn big_message(n: u64, size: usize) -> Bytes {
    message_bytes(&Message {
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

/// The channels of the `Data` frames in `bytes`, in order.
fn packet_channels(bytes: &[u8]) -> Vec<u8> {
    packets(bytes).into_iter().map(|(channel, _, _)| channel).collect()
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

/// A message up to a sixteenth over the packet size goes in one packet; one larger is cut
/// into full packets and a tail, and both arrive whole.
#[test]
fn a_message_just_over_the_packet_size_goes_whole() {
    let mut p = packet_pair(1024);
    p.connect();
    let just_over = big_message(1, 1024);
    let too_far = big_message(2, 1024 + 1024 / 16 + 1);
    assert!(just_over.len() > 1024 && just_over.len() <= 1024 + 64, "{}", just_over.len());
    assert!(too_far.len() > 1024 + 64);
    p.a.send(1, just_over.clone(), None, p.now).unwrap();
    p.a.send(1, too_far.clone(), None, p.now).unwrap();
    p.a.write_pending(p.now, usize::MAX);
    let wire = p.a.poll_transmit().unwrap();
    let sizes: Vec<(u64, usize)> =
        packets(&wire).into_iter().map(|(_, seq, bytes)| (seq, bytes.len())).collect();
    assert_eq!(sizes, [(1, just_over.len()), (2, 1024), (2, too_far.len() - 1024)]);
    p.b.handle_bytes(&wire, p.now);
    p.drain();
    assert_eq!(p.received_by_b, [1, 2]);
}

/// A message assembled from several packets is checked by the CRC its packets' bytes
/// added up to: a byte damaged in a middle packet has it asked again, and what is
/// delivered is what was sent.
#[test]
fn a_damaged_packet_of_a_long_message_has_it_asked_again() {
    let mut p = packet_pair(1024);
    p.connect();
    p.a.send(1, big_message(1, 5000), None, p.now).unwrap();
    p.a.write_pending(p.now, usize::MAX);
    let mut wire = BytesMut::from(&p.a.poll_transmit().unwrap()[..]);
    let sent = packets(&wire);
    assert!(sent.len() > 2, "several packets");
    // A payload byte of the second packet: past the first frame and the second's header.
    let header = DATA_OVERHEAD_BYTES;
    wire[header + sent[0].2.len() + header + 10] ^= 0x01;
    p.b.handle_bytes(&wire, p.now);
    assert_eq!(p.b.poll_event(), None, "nothing delivered");
    assert_eq!(p.b.stats().naks_sent, 1);
    // The NAK to A, and what A writes again to B.
    p.a.handle_bytes(&p.b.poll_transmit().unwrap(), p.now);
    p.a.write_pending(p.now, usize::MAX);
    p.b.handle_bytes(&p.a.poll_transmit().unwrap(), p.now);
    let got = std::iter::from_fn(|| p.b.poll_event())
        .find_map(|e| match e {
            SessionEvent::Received { message, .. } => Some(message),
            _ => None,
        })
        .expect("delivered once written again");
    assert_eq!(got.id.sequence, 1);
    assert!(got.content.payload == vec![1u8; 5000], "the bytes sent");
}

#[test]
fn an_urgent_message_overtakes_a_large_one_after_at_most_a_packet() {
    use crate::channel::{FILE_CHANNEL, SYSTEM_CHANNEL};
    let mut p = packet_pair(1024);
    p.connect();
    p.a.send(FILE_CHANNEL, big_message(1, 50_000), None, p.now).unwrap();
    assert_eq!(p.a.write_pending(p.now, 1), 1, "one packet of the large message");
    assert_eq!(p.a.write_pending(p.now, 1), 1, "and another");
    p.a.send(SYSTEM_CHANNEL, message(2), None, p.now).unwrap();
    assert_eq!(p.a.write_pending(p.now, 1), 1);
    let wire = p.a.poll_transmit().unwrap();
    assert_eq!(
        packet_channels(&wire),
        [FILE_CHANNEL, FILE_CHANNEL, SYSTEM_CHANNEL],
        "the next packet is the urgent one"
    );
    p.b.handle_bytes(&wire, p.now);
    p.drain();
    assert_eq!(
        p.received_by_b,
        [2],
        "the urgent message is delivered while the large one is still on its way"
    );
    p.pump();
    assert_eq!(p.received_by_b, [2, 1]);
    assert_eq!(p.a.in_flight(), 0);
}

#[test]
fn busy_channels_share_the_connection_by_weight() {
    let now = Instant::now();
    let mut cfg = config("A", "B", 11);
    cfg.packet_bytes_max = 1024;
    cfg.channel_weights[2] = 3; // channel 2 gets three packets for each of channel 5's
    let mut p = packet_pair(1024);
    p.a = Session::new(cfg, now);
    p.connect();
    p.a.send(2, big_message(1, 100_000), None, p.now).unwrap();
    p.a.send(5, big_message(2, 100_000), None, p.now).unwrap();
    for _ in 0..40 {
        p.a.write_pending(p.now, 1);
    }
    let channels = packet_channels(&p.a.poll_transmit().unwrap());
    let on_2 = channels.iter().filter(|&&c| c == 2).count();
    assert_eq!(channels.len(), 40);
    assert!((29..=31).contains(&on_2), "about 3:1 for weights 3:1, got {on_2} of 40: {channels:?}");
}

/// A large message of several packets is gathered in a buffer of the session's recycler,
/// which takes it back when the delivered message is dropped and gives it to the next one.
#[test]
fn a_large_message_is_gathered_in_a_buffer_used_again() {
    let now = Instant::now();
    let recycler = Arc::new(crate::recycle::Recycler::new(16 << 20));
    let mut a = config("A", "B", 11);
    a.packet_bytes_max = 64 * 1024;
    let mut b = config("B", "A", 22);
    b.recycler = recycler.clone();
    let mut p = Pair {
        a: Session::new(a, now),
        b: Session::new(b, now),
        now,
        received_by_b: Vec::new(),
        closed: Vec::new(),
    };
    p.connect();
    let sized = |n: u64| Message {
        id: MessageId { source: NodeName::new("A").unwrap(), sequence: n, created_unix_ms: 0 },
        hop_count: 0,
        redelivered: false,
        backout_count: 0,
        content: Box::new(Content::buf("B:q".parse().unwrap(), vec![n as u8; 600_000])),
    };
    let mut gathered_at = Vec::new();
    for n in 1..=2 {
        let got = p.carry(&sized(n));
        assert_eq!(got.content.payload, sized(n).content.payload);
        assert_eq!(recycler.kept_bytes(), 0, "{n}: the buffer is in use while the message lives");
        gathered_at.push(got.content.payload.as_ptr());
        drop(got);
        assert!(recycler.kept_bytes() >= 600_000, "{n}: back once the message is dropped");
    }
    assert_eq!(gathered_at[0], gathered_at[1], "the second message was gathered in the first one's buffer");
}

/// A message handed over as its head and its shared payload goes out as the same bytes as
/// one buffer would, cut anywhere, also across the head's end, and arrives whole; after a
/// wait its lifetime is patched in the head while the payload stays shared.
#[test]
fn a_message_in_two_parts_goes_as_the_same_bytes() {
    let mut p = packet_pair(1024);
    p.connect();
    let sized = |n: u64, size: usize| Message {
        id: MessageId { source: NodeName::new("A").unwrap(), sequence: n, created_unix_ms: 0 },
        hop_count: 0,
        redelivered: false,
        backout_count: 0,
        content: Box::new(
            Content::buf("B:q".parse().unwrap(), vec![(n % 251) as u8; size])
                .with_lifetime(linkbus_plugin_api::Lifetime::from_secs(60)),
        ),
    };
    let (big, small) = (sized(1, 10_000), sized(2, 100));
    let encoded = crate::wire::Encoded::of(&big);
    assert!(!encoded.parts()[1].is_empty(), "the payload is a part of its own");
    p.a.send(C, encoded, None, p.now).unwrap();
    p.a.send(C, crate::wire::Encoded::of(&small), None, p.now).unwrap();
    p.a.write_pending(p.now, usize::MAX);
    let wire = p.a.poll_transmit().unwrap();
    let mut first: Vec<u8> = Vec::new();
    for (_, sequence, bytes) in packets(&wire) {
        if sequence == 1 {
            first.extend_from_slice(&bytes);
        }
    }
    assert_eq!(first, message_bytes(&big), "the packets carry the one-buffer form");
    p.b.handle_bytes(&wire, p.now);
    p.drain();
    assert_eq!(p.received_by_b, [1, 2]);

    // Written again after a wait (a reconnect): the lifetime left is patched in.
    let mut p = packet_pair(1024);
    let expires_at = p.now + Duration::from_secs(60);
    p.a.send(C, crate::wire::Encoded::of(&big), Some(expires_at), p.now).unwrap();
    p.now += Duration::from_secs(10);
    p.exchange_hellos();
    let got = p.deliver_written();
    assert_eq!(got.content.payload, big.content.payload);
    assert_eq!(got.content.lifetime, Some(linkbus_plugin_api::Lifetime::from_secs(50)), "10 s of 60 went");
}

#[test]
fn a_broken_large_message_resumes_from_the_byte_the_receiver_holds() {
    for two_parts in [false, true] {
        resume_a_broken_message(two_parts);
    }
}

fn resume_a_broken_message(two_parts: bool) {
    let mut p = packet_pair(1024);
    p.connect();
    let big = big_message(1, 10_000);
    let handed = if two_parts {
        let encoded = crate::wire::Encoded::of(&crate::wire::decode_message(big.clone()).unwrap());
        assert!(!encoded.parts()[1].is_empty());
        encoded
    } else {
        big.clone().into()
    };
    p.a.send(C, handed, None, p.now).unwrap();
    for _ in 0..4 {
        p.a.write_pending(p.now, 1);
    }
    let wire = p.a.poll_transmit().unwrap();
    p.b.handle_bytes(&wire, p.now);
    p.drain();
    assert_eq!(p.b.assembling_bytes(), 4096, "four packets held");
    p.disconnect();
    p.a.handle_connected(p.now);
    p.b.handle_connected(p.now);
    p.a.handle_bytes(&p.b.poll_transmit().unwrap(), p.now);
    let resumed = std::iter::from_fn(|| p.a.poll_event()).find_map(|e| match e {
        SessionEvent::Established { resumed_bytes, resent, .. } => Some((resumed_bytes, resent)),
        _ => None,
    });
    assert_eq!(resumed, Some((4096, 1)), "A continues after the 4096 bytes B holds");
    assert_eq!(p.a.unwritten_bytes(C), big.len() - 4096, "the rest of the message waits to be written");
    p.b.handle_bytes(&p.a.poll_transmit().unwrap(), p.now);
    p.a.write_pending(p.now, usize::MAX);
    let rest = p.a.poll_transmit().unwrap();
    assert!(rest.len() < big.len() - 4096 + 7 * 64, "only the rest of the message is written again");
    p.b.handle_bytes(&rest, p.now);
    p.drain();
    assert_eq!(p.received_by_b, [1], "assembled intact across the two connections");
    assert_eq!(p.a.stats().resumed_bytes, 4096);
}

#[test]
fn a_receiver_holding_other_bytes_of_a_message_starts_it_over() {
    // A message whose write starts again from its first byte after it waited carries its
    // new remaining lifetime, so its bytes (and CRC) change: the receiver drops what it
    // held of the old version and assembles the new one.
    let mut p = packet_pair(1024);
    p.connect();
    let big = big_message(1, 5_000);
    p.a.send(C, big.clone(), Some(p.now + Duration::from_secs(60)), p.now).unwrap();
    p.a.write_pending(p.now, usize::MAX);
    let wire = p.a.poll_transmit().unwrap();
    let last_packet_starts = wire.len() - (DATA_OVERHEAD_BYTES + big.len() - 4096);
    p.b.handle_bytes(&wire[..last_packet_starts], p.now); // the last packet is lost
    p.drain();
    assert_eq!(p.b.assembling_bytes(), 4096);
    p.now += Duration::from_secs(4); // past the 3 s retransmit timeout
    p.a.handle_timeout(p.now);
    assert_eq!(p.a.stats().retransmit_timeouts, 1);
    p.a.write_pending(p.now, usize::MAX);
    p.b.handle_bytes(&p.a.poll_transmit().unwrap(), p.now);
    let received: Vec<Message> = std::iter::from_fn(|| p.b.poll_event())
        .filter_map(|e| match e {
            SessionEvent::Received { message, .. } => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(received.len(), 1, "delivered once, whole");
    let left = received[0].content.lifetime.unwrap().as_ms();
    assert!((55_000..=56_000).contains(&left), "the new version with 56 s left arrived: {left}");
}

#[test]
fn frames_for_unknown_channels_and_oversized_messages_close_the_connection() {
    let mut p = Pair::new();
    p.connect();
    let mut wire = BytesMut::new();
    Frame::Ack { channel: 200, sequence: 1 }.encode(&mut wire);
    p.a.handle_bytes(&wire, p.now);
    assert_eq!(p.a.poll_event(), Some(SessionEvent::Closed(SessionError::UnknownChannel(200))));

    let mut p = Pair::new();
    p.connect();
    let mut wire = BytesMut::new();
    let packet =
        crate::frame::Packet { channel: C, sequence: 1, offset: 0, total: 1 << 30, crc: 0, bytes: b"x" };
    Frame::encode_data(&packet, &mut wire);
    p.b.handle_bytes(&wire, p.now);
    assert!(matches!(p.b.poll_event(), Some(SessionEvent::Closed(SessionError::MessageTooLarge { .. }))));
}

fn hello_from_b(your_incarnation: u64, expected: u64) -> BytesMut {
    let mut wire = BytesMut::new();
    let position = ChannelPosition { expected, ..ChannelPosition::default() };
    Frame::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        api_version: 1,
        from: "B".into(),
        to: "A".into(),
        incarnation: 22,
        your_incarnation,
        run: 1,
        frame_bytes_max: 1 << 20,
        message_bytes_max: 1 << 20,
        in_flight_messages_max: 4096,
        in_flight_bytes_max: 64 << 20,
        retransmit_timeout_ms: 10_000,
        flags: 0,
        channels: vec![position; CHANNELS],
    })
    .encode(&mut wire);
    wire
}

#[test]
fn a_peer_whose_numbers_went_backwards_is_refused_until_an_operator_resets() {
    let mut p = Pair::new();
    p.connect();
    p.send(1..=3);
    p.pump();
    assert_eq!(p.received_by_b, [1, 2, 3]);
    p.disconnect();
    p.a.send(C, message(4), None, p.now).unwrap();
    // B comes back knowing A's incarnation but expecting message 1 again: its data was
    // restored from an old copy.
    p.a.handle_connected(p.now);
    p.a.handle_bytes(&hello_from_b(11, 1), p.now);
    let closed = std::iter::from_fn(|| p.a.poll_event()).find(|e| matches!(e, SessionEvent::Closed(_)));
    assert_eq!(
        closed,
        Some(SessionEvent::Closed(SessionError::WentBackwards { channel: C, expected: 1, acked: 3 }))
    );
    p.a.handle_disconnected();
    p.a.reset_numbers();
    p.a.handle_connected(p.now);
    p.a.handle_bytes(&hello_from_b(11, 1), p.now);
    assert!(p.a.is_established(), "after the reset the peer's numbers are taken as they are");
    p.a.write_pending(p.now, usize::MAX);
    let data: Vec<(u64, u64)> = packets(&p.a.poll_transmit().unwrap())
        .into_iter()
        .map(|(_, sequence, bytes)| (sequence, crate::wire::decode_message(bytes).unwrap().id.sequence))
        .collect();
    assert_eq!(data, [(1, 4)], "the waiting message goes as the number B expects");
}

/// A sends messages 1..=n on channel C and B stores them, but B's acknowledgements are lost.
fn stored_but_unacknowledged(p: &mut Pair, n: u64) {
    for i in 1..=n {
        p.a.send(C, message(i), None, p.now).unwrap();
    }
    p.a.write_pending(p.now, usize::MAX);
    p.b.handle_bytes(&p.a.poll_transmit().unwrap(), p.now);
    p.drain();
    let _lost_acks = p.b.poll_transmit();
}

#[test]
fn a_reset_leaves_channels_whose_numbers_fit_alone() {
    let mut p = Pair::new();
    p.connect();
    stored_but_unacknowledged(&mut p, 3);
    assert_eq!(p.received_by_b, [1, 2, 3]);
    p.disconnect();
    p.a.reset_numbers();
    p.connect();
    p.pump();
    assert_eq!(
        p.received_by_b,
        [1, 2, 3],
        "B's numbers were fine: the lost ACKs are adopted, nothing comes twice"
    );
    assert_eq!(p.a.in_flight(), 0);
    assert!(p.closed.is_empty(), "{:?}", p.closed);
}

#[test]
fn a_reset_applies_to_the_next_handshake_only() {
    let mut p = Pair::new();
    p.a.reset_numbers(); // before first contact: that handshake takes it
    p.connect();
    stored_but_unacknowledged(&mut p, 3);
    p.disconnect();
    p.connect();
    p.pump();
    assert_eq!(p.received_by_b, [1, 2, 3], "no stale reset renumbers later");
    assert!(p.closed.is_empty(), "{:?}", p.closed);
}

#[test]
fn impossible_numbers_are_refused_even_after_a_reset() {
    let mut p = Pair::new();
    p.connect();
    p.disconnect();
    p.a.reset_numbers();
    p.a.handle_connected(p.now);
    p.a.handle_bytes(&hello_from_b(11, u64::MAX), p.now);
    let closed = std::iter::from_fn(|| p.a.poll_event()).find(|e| matches!(e, SessionEvent::Closed(_)));
    assert!(matches!(closed, Some(SessionEvent::Closed(SessionError::BadPosition { .. }))), "{closed:?}");

    let mut a = Session::new(config("A", "B", 1), p.now);
    a.handle_connected(p.now);
    let mut wire = BytesMut::new();
    Frame::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        api_version: 1,
        from: "B".into(),
        to: "A".into(),
        incarnation: 5,
        your_incarnation: 0,
        run: 1,
        frame_bytes_max: 1 << 20,
        message_bytes_max: 0,
        in_flight_messages_max: 4096,
        in_flight_bytes_max: 64 << 20,
        retransmit_timeout_ms: 10_000,
        flags: 0,
        channels: vec![ChannelPosition::default(); CHANNELS],
    })
    .encode(&mut wire);
    a.handle_bytes(&wire, p.now);
    assert_eq!(a.poll_event(), Some(SessionEvent::Closed(SessionError::MessageLimit(0))));
}

#[test]
fn a_message_that_expired_during_an_outage_is_not_resumed() {
    let mut p = packet_pair(1024);
    p.connect();
    p.a.send(C, big_message(1, 10_000), Some(p.now + Duration::from_secs(5)), p.now).unwrap();
    for _ in 0..4 {
        p.a.write_pending(p.now, 1);
    }
    p.b.handle_bytes(&p.a.poll_transmit().unwrap(), p.now);
    p.disconnect();
    p.now += Duration::from_secs(30);
    p.exchange_hellos();
    p.a.write_pending(p.now, usize::MAX);
    let events: Vec<SessionEvent> = std::iter::from_fn(|| p.a.poll_event()).collect();
    assert!(
        events.iter().any(|e| matches!(e, SessionEvent::Dropped { reason: DropReason::Expired, .. })),
        "{events:?}"
    );
    assert_eq!(p.a.stats().resumed_bytes, 0);
    p.b.handle_bytes(&p.a.poll_transmit().unwrap(), p.now);
    p.drain();
    assert!(p.received_by_b.is_empty(), "the expired message is not delivered");
}

#[test]
fn a_message_in_packets_loses_the_time_it_took_to_arrive_from_its_lifetime() {
    let mut p = packet_pair(1024);
    p.connect();
    let mut m = crate::wire::decode_message(big_message(1, 5_000)).unwrap();
    m.content.lifetime = Some(Lifetime::from_ms(60_000));
    p.a.send(C, message_bytes(&m), Some(p.now + Duration::from_secs(60)), p.now).unwrap();
    p.a.write_pending(p.now, 1);
    p.b.handle_bytes(&p.a.poll_transmit().unwrap(), p.now);
    p.now += Duration::from_secs(20); // the rest arrives 20 s later (a resumed transfer)
    p.a.write_pending(p.now, usize::MAX);
    p.b.handle_bytes(&p.a.poll_transmit().unwrap(), p.now);
    let received = std::iter::from_fn(|| p.b.poll_event()).find_map(|e| match e {
        SessionEvent::Received { message, .. } => Some(message),
        _ => None,
    });
    let left = received.expect("delivered").content.lifetime.unwrap().as_ms();
    assert_eq!(left, 40_000, "60 s minus the 20 s since its first packet");
}

#[test]
fn after_a_reset_a_peer_ahead_of_us_has_what_we_still_hold() {
    // Our data was restored from an old copy: messages 1..=3 wait here again, but B stored
    // 1..=5 before. B's hello expects 6, more than we remember sending.
    let mut p = Pair::new();
    p.connect();
    p.disconnect();
    p.send(1..=3);
    p.a.handle_connected(p.now);
    p.a.handle_bytes(&hello_from_b(11, 6), p.now);
    let closed = std::iter::from_fn(|| p.a.poll_event()).find(|e| matches!(e, SessionEvent::Closed(_)));
    assert!(
        matches!(closed, Some(SessionEvent::Closed(SessionError::ClaimsMore { expected: 6, .. }))),
        "{closed:?}"
    );
    p.a.handle_disconnected();
    p.a.reset_numbers();
    p.a.handle_connected(p.now);
    p.a.handle_bytes(&hello_from_b(11, 6), p.now);
    assert!(p.a.is_established());
    let acked =
        std::iter::from_fn(|| p.a.poll_event()).find(|e| matches!(e, SessionEvent::Acked { channel: C, .. }));
    assert_eq!(acked, Some(SessionEvent::Acked { channel: C, through: 5, messages: 3 }), "B has them");
    assert_eq!(p.a.in_flight(), 0, "nothing is sent twice");
    p.a.send(C, message(4), None, p.now).unwrap();
    p.a.write_pending(p.now, usize::MAX);
    let sequences: Vec<u64> =
        packets(&p.a.poll_transmit().unwrap()).into_iter().map(|(_, sequence, _)| sequence).collect();
    assert_eq!(sequences, [6], "numbering goes on from what B expects");
}

#[test]
fn a_message_held_behind_a_gap_ages_while_it_waits() {
    let mut p = Pair::new();
    p.connect();
    let mut m = crate::wire::decode_message(message(1)).unwrap();
    m.content.lifetime = Some(Lifetime::from_ms(60_000));
    p.a.send(C, message_bytes(&m), Some(p.now + Duration::from_secs(60)), p.now).unwrap();
    m.id.sequence = 2;
    m.content.lifetime = Some(Lifetime::from_ms(5_000));
    p.a.send(C, message_bytes(&m), Some(p.now + Duration::from_secs(5)), p.now).unwrap();
    p.a.write_pending(p.now, usize::MAX);
    let wire = p.a.poll_transmit().unwrap();
    let mut damaged = BytesMut::from(&wire[..]);
    let first_len = u32::from_be_bytes([wire[0], wire[1], wire[2], wire[3]]) as usize + 4;
    damaged[first_len - 1] ^= 1; // message 1 arrives damaged; message 2 is held behind it
    p.b.handle_bytes(&damaged, p.now);
    assert_eq!(p.b.held(), 1);
    p.now += Duration::from_secs(10); // the resend comes after message 2's lifetime ran out
    let _nak = p.b.poll_transmit();
    p.a.handle_timeout(p.now);
    p.a.write_pending(p.now, usize::MAX);
    p.b.handle_bytes(&p.a.poll_transmit().unwrap(), p.now);
    let events: Vec<SessionEvent> = std::iter::from_fn(|| p.b.poll_event()).collect();
    assert!(matches!(events.first(), Some(SessionEvent::Received { sequence: 1, .. })), "{events:?}");
    assert!(
        matches!(
            events.get(1),
            Some(SessionEvent::Skipped { sequence: 2, expired: Some(_), durable: true, .. })
        ),
        "message 2 expired while it waited behind the gap: {events:?}"
    );
    assert_eq!(p.b.stats().expired_on_the_way, 1);
}

/// A pair whose acknowledgements wait up to `delay` for company, with room for `window`
/// messages in flight; connected.
fn pair_with_ack_delay(delay: Duration, window: usize) -> Pair {
    pair_with_ack_delay_and_bytes(delay, window, 1 << 20)
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

/// The frames in `bytes`.
fn frames_in(bytes: &[u8]) -> Vec<Frame> {
    let mut decoder = FrameDecoder::new(1 << 20);
    decoder.extend(bytes);
    std::iter::from_fn(|| decoder.decode().unwrap()).collect()
}

/// B's next write, which must be exactly `Ack through` on channel `C` (`why` it is
/// written), handed to A.
fn ack_goes_to_a(p: &mut Pair, through: u64, why: &str) {
    let ack = p.b.poll_transmit().unwrap_or_else(|| panic!("no acknowledgement written: {why}"));
    assert_eq!(frames_in(&ack), [Frame::Ack { channel: C, sequence: through }], "{why}");
    p.a.handle_bytes(&ack, p.now);
}

/// Carries messages `numbers` from A to B and has B take them (not acknowledged yet).
fn carry_to_b(p: &mut Pair, numbers: std::ops::RangeInclusive<u64>) {
    p.send(numbers.clone());
    let bytes = out(&mut p.a, p.now).unwrap();
    p.b.handle_bytes(&bytes, p.now);
    let received = std::iter::from_fn(|| p.b.poll_event())
        .filter(|e| matches!(e, SessionEvent::Received { .. }))
        .count();
    assert_eq!(received, numbers.count());
}

#[test]
fn an_acknowledgement_waits_for_the_answer_and_goes_in_its_write() {
    let delay = Duration::from_millis(10);
    let mut p = pair_with_ack_delay(delay, 8);
    carry_to_b(&mut p, 1..=1);
    p.b.handle_delivered(C, 1, p.now);
    assert!(p.b.poll_transmit().is_none(), "nothing is written for the acknowledgement alone");
    assert_eq!(p.b.poll_timeout(), Some(p.now + delay), "it is due after the delay");
    // B answers: the acknowledgement goes first in the same write.
    p.b.send(C, message(1), None, p.now).unwrap();
    let answer = out(&mut p.b, p.now).unwrap();
    let frames = frames_in(&answer);
    assert!(matches!(frames[..], [Frame::Ack { channel: C, sequence: 1 }, Frame::Data { .. }]), "{frames:?}");
    p.a.handle_bytes(&answer, p.now);
    assert_eq!(p.a.in_flight(), 0, "the answer's write acknowledged A's message");
    assert_eq!(
        p.b.poll_timeout(),
        Some(p.now + Duration::from_secs(1)),
        "nothing left due but the keepalive"
    );
}

#[test]
fn a_waiting_acknowledgement_is_written_when_its_delay_is_up() {
    let delay = Duration::from_millis(10);
    let mut p = pair_with_ack_delay(delay, 64);
    carry_to_b(&mut p, 1..=3);
    p.b.handle_delivered(C, 2, p.now);
    p.b.handle_delivered(C, 3, p.now + Duration::from_millis(5));
    assert_eq!(p.b.poll_timeout(), Some(p.now + delay), "the first delivery set the time");
    p.b.handle_timeout(p.now + Duration::from_millis(9));
    assert!(p.b.poll_transmit().is_none(), "not yet");
    p.b.handle_timeout(p.now + delay);
    ack_goes_to_a(&mut p, 3, "written once due: one, through the last delivered");
    assert_eq!(p.a.in_flight(), 0);
}

#[test]
fn a_busy_channel_is_acknowledged_without_waiting() {
    // A window of 128: a quarter of it is more than the bound. (The delay is shorter than
    // the keepalive's second, so the timer below writes the acknowledgement, not a ping.)
    let delay = Duration::from_millis(500);
    let mut p = pair_with_ack_delay(delay, 128);
    carry_to_b(&mut p, 1..=40);
    p.b.handle_delivered(C, ACK_WAITING_MESSAGES_MAX - 1, p.now);
    assert!(p.b.poll_transmit().is_none());
    p.b.handle_delivered(C, ACK_WAITING_MESSAGES_MAX, p.now);
    ack_goes_to_a(&mut p, ACK_WAITING_MESSAGES_MAX, "written at once");
    assert_eq!(p.a.in_flight(), 40 - ACK_WAITING_MESSAGES_MAX as usize);
    // The rest is fewer than the bound: it waits again.
    p.b.handle_delivered(C, 40, p.now);
    assert!(p.b.poll_transmit().is_none());
    p.b.handle_timeout(p.now + delay);
    ack_goes_to_a(&mut p, 40, "written once due");
    assert_eq!(p.a.in_flight(), 0);
}

#[test]
fn waiting_acknowledgements_are_forgotten_with_the_connection_and_the_hello_tells_instead() {
    let mut p = pair_with_ack_delay(Duration::from_millis(10), 64);
    carry_to_b(&mut p, 1..=2);
    p.b.handle_delivered(C, 2, p.now);
    p.disconnect();
    p.b.handle_connected(p.now);
    let hello = p.b.poll_transmit().unwrap();
    let frames = frames_in(&hello);
    assert!(matches!(frames[..], [Frame::Hello(_)]), "the old acknowledgement is not written: {frames:?}");
    p.a.handle_connected(p.now);
    p.a.handle_bytes(&hello, p.now);
    p.b.handle_bytes(&p.a.poll_transmit().unwrap(), p.now);
    p.pump();
    assert_eq!(p.a.in_flight(), 0, "B's hello said where channel C stands");
    assert_eq!(p.received_by_b, Vec::<u64>::new(), "nothing came again");
}

#[test]
fn a_small_window_is_acknowledged_after_a_quarter_of_it() {
    let mut p = pair_with_ack_delay(Duration::from_secs(1), 8);
    carry_to_b(&mut p, 1..=2);
    p.b.handle_delivered(C, 1, p.now);
    assert!(p.b.poll_transmit().is_none(), "one of a window of 8 waits");
    p.b.handle_delivered(C, 2, p.now);
    ack_goes_to_a(&mut p, 2, "two of eight go at once");
}

/// B's configuration in the tests of a peer's bounds: acknowledgements wait `delay`, and its
/// own windows are large (its own quarter would be over the bounds).
fn b_waits(delay: Duration) -> impl FnOnce(&mut SessionConfig) {
    move |b| {
        b.ack_delay = delay;
        b.in_flight_messages_max = 4096;
        b.in_flight_bytes_max = 64 << 20;
    }
}

#[test]
fn a_peer_with_a_smaller_window_is_acknowledged_after_a_quarter_of_its_window() {
    // B would wait for 32 messages or a second; A has only 8 in flight and says so.
    let mut p = pair_configured(|a| a.in_flight_messages_max = 8, b_waits(Duration::from_secs(1)));
    carry_to_b(&mut p, 1..=2);
    p.b.handle_delivered(C, 1, p.now);
    assert!(p.b.poll_transmit().is_none(), "one of A's window of 8 waits");
    p.b.handle_delivered(C, 2, p.now);
    ack_goes_to_a(&mut p, 2, "two of A's eight go at once, whatever B's own window");
}

#[test]
fn a_peer_with_a_smaller_byte_window_is_acknowledged_after_a_quarter_of_it() {
    let len = message(1).len();
    let mut p = pair_configured(
        |a| {
            a.in_flight_messages_max = 4096;
            a.in_flight_bytes_max = 4 * 2 * len;
        },
        b_waits(Duration::from_secs(1)),
    );
    carry_to_b(&mut p, 1..=1);
    p.b.handle_delivered(C, 1, p.now);
    assert!(p.b.poll_transmit().is_none(), "one message's bytes wait");
    carry_to_b(&mut p, 2..=2);
    p.b.handle_delivered(C, 2, p.now);
    ack_goes_to_a(&mut p, 2, "a quarter of A's byte window goes at once");
}

#[test]
fn an_acknowledgement_waits_at_most_a_quarter_of_the_peers_retransmit_timeout() {
    // B would wait half a second; A writes again what is unacknowledged after 40 ms.
    let retransmit = Duration::from_millis(40);
    let mut p = pair_configured(|a| a.retransmit_timeout = retransmit, b_waits(Duration::from_millis(500)));
    carry_to_b(&mut p, 1..=1);
    p.b.handle_delivered(C, 1, p.now);
    assert!(p.b.poll_transmit().is_none(), "it waits");
    assert_eq!(p.b.poll_timeout(), Some(p.now + retransmit / 4), "for a quarter of A's timeout");
    p.b.handle_timeout(p.now + retransmit / 4);
    ack_goes_to_a(&mut p, 1, "written once due");
    assert_eq!(p.a.in_flight(), 0);
    p.a.handle_timeout(p.now + retransmit);
    assert_eq!(p.a.stats().retransmit_timeouts, 0, "A never wrote the message again");
}

#[test]
fn a_ping_is_answered_by_the_waiting_acknowledgements_at_once() {
    // The peer's pong timeout may be shorter than the delay: it hears from us now.
    let mut p = pair_with_ack_delay(Duration::from_millis(500), 64);
    carry_to_b(&mut p, 1..=1);
    p.b.handle_delivered(C, 1, p.now);
    assert!(p.b.poll_transmit().is_none());
    let mut ping = BytesMut::new();
    Frame::Ping { nonce: 7 }.encode(&mut ping);
    p.b.handle_bytes(&ping, p.now + Duration::from_millis(10));
    ack_goes_to_a(&mut p, 1, "the ping brings the acknowledgement out");
    assert_eq!(p.b.stats().pings_unanswered, 1, "in place of a pong");
}

#[test]
fn odd_peer_bounds_acknowledge_sooner_never_later() {
    let delay = Duration::from_millis(2);
    let second = Duration::from_secs(1);
    let nothing = AckBounds::new(delay, (0, 0), Duration::ZERO);
    assert_eq!(nothing, AckBounds { messages: 1, bytes: 0, delay: Duration::ZERO }, "each at once");
    let huge = AckBounds::new(delay, (u64::MAX, u64::MAX), Duration::from_millis(u64::from(u32::MAX)));
    assert_eq!(
        huge,
        AckBounds { messages: ACK_WAITING_MESSAGES_MAX, bytes: ACK_WAITING_BYTES_MAX, delay },
        "our own bounds, no more"
    );
    assert_eq!(AckBounds::new(second, (64, 1 << 20), Duration::from_millis(100)).delay, second / 40);
}

#[test]
fn many_bytes_waiting_are_acknowledged_without_waiting() {
    // A byte window of four times three messages: three messages' bytes go at once.
    let len = message(1).len();
    let mut p = pair_with_ack_delay_and_bytes(Duration::from_secs(1), 64, 4 * 3 * len);
    carry_to_b(&mut p, 1..=2);
    p.b.handle_delivered(C, 2, p.now);
    assert!(p.b.poll_transmit().is_none(), "two messages' bytes wait");
    carry_to_b(&mut p, 3..=3);
    p.b.handle_delivered(C, 3, p.now);
    ack_goes_to_a(&mut p, 3, "three messages' bytes go at once");
    assert_eq!(p.a.in_flight(), 0);
}

#[test]
fn waiting_acknowledgements_are_written_when_the_host_flushes_them() {
    let mut p = pair_with_ack_delay(Duration::from_millis(500), 64);
    carry_to_b(&mut p, 1..=3);
    p.b.handle_delivered(C, 3, p.now);
    assert!(p.b.poll_transmit().is_none());
    p.b.flush_acks();
    ack_goes_to_a(&mut p, 3, "written before the host closes the connection");
    assert_eq!(p.a.in_flight(), 0);
    assert_eq!(p.b.poll_timeout(), Some(p.now + Duration::from_secs(1)), "nothing waits any more");
}

#[test]
fn unwritten_bytes_count_what_waits_for_the_connection() {
    let mut p = Pair::new();
    let len = message(1).len();
    p.send(1..=3);
    assert_eq!(p.a.unwritten_bytes(C), 3 * len, "handed over while down: all unwritten");
    assert_eq!(p.a.unwritten_bytes(C + 1), 0, "another channel holds none");
    p.connect();
    assert_eq!(p.received_by_b, [1, 2, 3]);
    assert_eq!(p.a.unwritten_bytes(C), 0, "written and acknowledged");
    // Written but not acknowledged, then the connection breaks: all of it waits again.
    p.send(4..=5);
    let _lost = out(&mut p.a, p.now);
    assert_eq!(p.a.unwritten_bytes(C), 0, "written");
    p.disconnect();
    p.a.handle_connected(p.now);
    p.b.handle_connected(p.now);
    p.a.handle_bytes(&p.b.poll_transmit().unwrap(), p.now);
    assert_eq!(p.a.unwritten_bytes(C), 2 * len, "B expects 4 again: 4 and 5 wait to be written");
    p.b.handle_bytes(&p.a.poll_transmit().unwrap(), p.now);
    p.pump();
    assert_eq!(p.received_by_b, [1, 2, 3, 4, 5]);
    assert_eq!(p.a.unwritten_bytes(C), 0);
}

#[test]
fn a_message_written_in_part_counts_its_rest_as_unwritten() {
    let mut p = Pair::new();
    p.connect();
    let big = Bytes::from(vec![7u8; 300_000]);
    p.a.send(C, big, None, p.now).unwrap();
    // One packet (64 KiB here) leaves; the rest of the message waits.
    assert_eq!(p.a.write_pending(p.now, 1), 1);
    assert_eq!(p.a.unwritten_bytes(C), 300_000 - (1 << 16), "the rest waits");
    p.a.write_pending(p.now, usize::MAX);
    assert_eq!(p.a.unwritten_bytes(C), 0);
}
