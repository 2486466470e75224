//! Restarts and resets: a peer that lost its state or its numbers, a machine crash, an operator's reset.

use super::*;

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

fn hello_from_b(your_incarnation: u64, expected: u64) -> BytesMut {
    let mut wire = BytesMut::new();
    let position = ChannelPosition { expected, ..ChannelPosition::default() };
    Frame::Hello(Hello {
        incarnation: 22,
        your_incarnation,
        channels: vec![position; CHANNELS],
        ..Hello::new("B", "A")
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
    Frame::Hello(Hello { incarnation: 5, message_bytes_max: 0, ..Hello::new("B", "A") }).encode(&mut wire);
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
