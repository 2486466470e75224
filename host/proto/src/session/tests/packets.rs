//! Packets: large messages cut into packets, damaged and broken ones resumed, urgent ones overtaking.

use super::*;

/// The channels of the `Data` frames in `bytes`, in order.
fn packet_channels(bytes: &[u8]) -> Vec<u8> {
    packets(bytes).into_iter().map(|(channel, _, _)| channel).collect()
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
        encoding: Default::default(),
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
        encoding: Default::default(),
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
