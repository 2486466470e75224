//! Acknowledgements: their delay, their bounds from the peer, and what counts as unwritten.

use super::*;

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
