//! Codec properties: round trips, any split of the stream decodes the same, arbitrary bytes
//! never panic, and declared lengths are checked before any allocation.

use super::*;
use proptest::prelude::*;

const MAX: usize = 64 * 1024;

fn frame_strategy() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (
            any::<u64>(),
            proptest::collection::vec(any::<(u64, u64, u32)>(), 0..13),
            any::<u64>(),
            any::<u8>(),
            "[A-Za-z][A-Za-z0-9._]{0,19}",
            any::<(u32, u64, u32)>()
        )
            .prop_map(|(incarnation, channels, your_incarnation, flags, from, window)| Frame::Hello(
                Hello {
                    protocol_version: PROTOCOL_VERSION,
                    api_version: 1,
                    to: format!("{from}x"),
                    from,
                    incarnation,
                    your_incarnation,
                    run: incarnation.rotate_left(7),
                    frame_bytes_max: 1 << 20,
                    message_bytes_max: 1 << 30,
                    in_flight_messages_max: window.0,
                    in_flight_bytes_max: window.1,
                    retransmit_timeout_ms: window.2,
                    flags,
                    channels: channels
                        .into_iter()
                        .map(|(expected, held_bytes, held_crc)| ChannelPosition {
                            expected,
                            held_bytes,
                            held_crc
                        })
                        .collect(),
                }
            )),
        (any::<(u8, u64, u64, u64)>(), proptest::collection::vec(any::<u8>(), 0..2048)).prop_map(
            |((channel, sequence, offset, total), m)| Frame::Data {
                channel,
                sequence,
                offset,
                total,
                crc: crate::crc::crc32c(&m),
                bytes: Bytes::from(m)
            }
        ),
        any::<(u8, u64)>().prop_map(|(channel, sequence)| Frame::Ack { channel, sequence }),
        any::<(u8, u64)>().prop_map(|(channel, sequence)| Frame::Nak { channel, sequence }),
        any::<u64>().prop_map(|nonce| Frame::Ping { nonce }),
        any::<u64>().prop_map(|nonce| Frame::Pong { nonce }),
        (any::<u16>(), "[ -~]{0,64}").prop_map(|(code, reason)| Frame::Close { code, reason }),
    ]
}

fn decode_all(decoder: &mut FrameDecoder) -> Vec<Frame> {
    let mut out = Vec::new();
    while let Some(f) = decoder.decode().expect("valid stream") {
        out.push(f);
    }
    out
}

proptest! {
    #[test]
    fn frames_round_trip_under_any_split(
        frames in proptest::collection::vec(frame_strategy(), 1..8),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
        shared in proptest::collection::vec(any::<bool>(), 17),
    ) {
        let mut wire = BytesMut::new();
        for f in &frames {
            f.encode(&mut wire);
        }
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (wire.len() + 1)).collect();
        cuts.push(wire.len());
        cuts.sort_unstable();
        let mut decoder = FrameDecoder::new(MAX);
        let mut got = Vec::new();
        let mut at = 0;
        for (i, cut) in cuts.into_iter().enumerate() {
            // Copied in, or handed over whole (cut without copies where frames are whole).
            if shared.get(i).copied().unwrap_or(false) {
                decoder.extend_bytes(bytes::Bytes::copy_from_slice(&wire[at..cut]));
            } else {
                decoder.extend(&wire[at..cut]);
            }
            at = cut;
            got.extend(decode_all(&mut decoder));
        }
        prop_assert_eq!(got, frames);
        prop_assert_eq!(decoder.buffered(), 0);
    }

    #[test]
    fn frames_read_in_place_decode_as_cut_out_ones(frame in frame_strategy(), whole: bool, bit in any::<usize>()) {
        let frame = match frame {
            Frame::Data { channel, sequence, crc, bytes, .. } if whole => {
                Frame::Data { channel, sequence, offset: 0, total: bytes.len() as u64, crc, bytes }
            }
            other => other,
        };
        let mut wire = BytesMut::new();
        frame.encode(&mut wire);
        // Intact, and with one bit of the header flipped.
        let mut damaged = wire.clone();
        let at = bit % DATA_HEADER_BYTES.min(damaged.len());
        damaged[at] ^= 1 << (bit % 8);
        for bytes in [wire.freeze(), damaged.freeze()] {
            if let Some(in_place) = short_data(&bytes) {
                prop_assert_eq!(in_place, decode_frame(bytes.clone()));
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..4096), shared: bool) {
        let mut decoder = FrameDecoder::new(MAX);
        if shared {
            decoder.extend_bytes(bytes::Bytes::copy_from_slice(&data));
        } else {
            decoder.extend(&data);
        }
        for _ in 0..data.len() + 1 {
            match decoder.decode() {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        prop_assert!(decoder.buf.capacity() <= MAX + LENGTH_BYTES + data.len());
    }
}

#[test]
fn oversized_length_is_refused_before_any_allocation() {
    let mut decoder = FrameDecoder::new(MAX);
    decoder.extend(&u32::MAX.to_be_bytes());
    assert_eq!(decoder.decode(), Err(FrameError::BadLength { len: u32::MAX as usize, max: MAX }));
    assert!(decoder.buf.capacity() < 1024, "nothing reserved for the declared length");
    let mut zero = FrameDecoder::new(MAX);
    zero.extend(&[0, 0, 0, 0]);
    assert!(matches!(zero.decode(), Err(FrameError::BadLength { len: 0, .. })));
}

#[test]
fn encode_data_matches_the_generic_encoder() {
    let mut a = BytesMut::new();
    let crc = crate::crc::crc32c(b"the payload");
    let packet = Packet { channel: 3, sequence: 9, offset: 4, total: 11, crc, bytes: b"payload" };
    Frame::encode_data(&packet, &mut a);
    let mut b = BytesMut::new();
    let bytes = Bytes::from_static(b"payload");
    Frame::Data { channel: 3, sequence: 9, offset: 4, total: 11, crc, bytes }.encode(&mut b);
    assert_eq!(a, b);
}

#[test]
fn garbage_is_a_clear_error() {
    let mut decoder = FrameDecoder::new(MAX);
    decoder.extend(b"\x00\x00\x00\x09\x01\x00\x00\x00\x00HTTP");
    assert_eq!(decoder.decode(), Err(FrameError::BadMagic));
    let mut decoder = FrameDecoder::new(MAX);
    decoder.extend(b"\x00\x00\x00\x05\x63\x00\x00\x00\x00");
    assert_eq!(decoder.decode(), Err(FrameError::UnknownType(0x63)));
}

proptest! {
    /// Any single bit flipped in a frame's header (length prefix included) or in a control
    /// frame's body never yields a frame: the decoder fails or waits; a flip in a data
    /// frame's message is left to the message CRC.
    #[test]
    fn header_bit_flips_are_caught(frame in frame_strategy(), bit in any::<usize>()) {
        let mut wire = BytesMut::new();
        frame.encode(&mut wire);
        let covered = match frame { Frame::Data { .. } => DATA_HEADER_BYTES, _ => wire.len() };
        let bit = bit % (covered * 8);
        wire[bit / 8] ^= 1 << (bit % 8);
        let mut decoder = FrameDecoder::new(MAX);
        decoder.extend(&wire);
        prop_assert!(!matches!(decoder.decode(), Ok(Some(_))));
    }
}

#[test]
fn a_damaged_data_length_is_caught_before_waiting() {
    let mut wire = BytesMut::new();
    let bytes = [7u8; 1000];
    let packet = Packet { channel: 1, sequence: 3, offset: 0, total: 1000, crc: 0, bytes: &bytes };
    Frame::encode_data(&packet, &mut wire);
    wire[2] ^= 0x01; // the length grows by 256 bytes
    let mut decoder = FrameDecoder::new(MAX);
    decoder.extend(&wire);
    assert_eq!(decoder.decode(), Err(FrameError::BadHeaderCrc));
}

/// Five data frames of `packet` bytes each, encoded one after the other, and the length of
/// one: whole messages, or the last packets of longer ones.
fn five_data_frames(packet: usize, whole: bool) -> (Bytes, usize) {
    let bytes = Bytes::from(vec![0x5a; packet]);
    let crc = crate::crc::crc32c(&bytes);
    let offset = if whole { 0 } else { 4 };
    let mut wire = BytesMut::new();
    for sequence in 1..=5 {
        let total = packet as u64 + offset;
        Frame::Data { channel: 3, sequence, offset, total, crc, bytes: bytes.clone() }.encode(&mut wire);
    }
    let frame_len = wire.len() / 5;
    (wire.freeze(), frame_len)
}

/// Whether `bytes` lie inside `chunk`.
fn within(chunk: &Bytes, bytes: &Bytes) -> bool {
    let range = chunk.as_ptr() as usize..chunk.as_ptr() as usize + chunk.len();
    range.contains(&(bytes.as_ptr() as usize))
}

#[test]
fn long_packets_whole_in_a_chunk_are_cut_out_of_it_and_only_a_split_one_is_gathered() {
    let (wire, frame_len) = five_data_frames(DETACH_BYTES_MAX, true);
    // The first chunk ends inside frame 3; the second holds its rest and frames 4 and 5.
    let cut = 2 * frame_len + 5;
    let (first, second) = (wire.slice(..cut), wire.slice(cut..));
    let mut decoder = FrameDecoder::new(MAX);
    decoder.extend_bytes(first.clone());
    for sequence in 1..=2 {
        let Some(Frame::Data { bytes, sequence: got, .. }) = decoder.decode().unwrap() else {
            panic!("a data frame")
        };
        assert_eq!(got, sequence);
        assert!(within(&first, &bytes), "frame {sequence} is a slice of the first chunk, not a copy");
    }
    assert_eq!(decoder.decode(), Ok(None), "the third is split");
    decoder.extend_bytes(second.clone());
    let Some(Frame::Data { bytes, sequence: 3, .. }) = decoder.decode().unwrap() else { panic!("frame 3") };
    assert!(!within(&first, &bytes) && !within(&second, &bytes), "the split frame was gathered");
    assert_eq!(bytes.len(), DETACH_BYTES_MAX);
    for sequence in 4..=5 {
        let Some(Frame::Data { bytes, sequence: got, .. }) = decoder.decode().unwrap() else {
            panic!("a data frame")
        };
        assert_eq!(got, sequence);
        assert!(
            within(&second, &bytes),
            "frame {sequence}, after the split one, is a slice of the second chunk"
        );
    }
    assert_eq!(decoder.buffered(), 0);
}

#[test]
fn short_whole_messages_are_copied_into_buffers_of_their_own_whole_or_gathered() {
    let (wire, frame_len) = five_data_frames(DETACH_BYTES_MAX - 1, true);
    let cut = 2 * frame_len + 5;
    let (first, second) = (wire.slice(..cut), wire.slice(cut..));
    let mut decoder = FrameDecoder::new(MAX);
    decoder.extend_bytes(first.clone());
    let mut got = decode_all(&mut decoder);
    decoder.extend_bytes(second.clone());
    got.extend(decode_all(&mut decoder));
    assert_eq!(got.len(), 5);
    for (frame, sequence) in got.into_iter().zip(1..) {
        let Frame::Data { bytes, sequence: got, crc, .. } = frame else { panic!("a data frame") };
        assert_eq!((got, crc), (sequence, crate::crc::crc32c(&bytes)));
        // Not a slice of a chunk the decoder (or anybody) still holds.
        assert!(bytes.is_unique(), "frame {sequence}'s packet is in a buffer of its own");
        assert!(!within(&first, &bytes) && !within(&second, &bytes));
    }
    assert_eq!(decoder.buffered(), 0);
    // A chunk whose frames were all taken is let go by the decoder.
    let chunk = Bytes::copy_from_slice(&wire);
    decoder.extend_bytes(chunk.clone());
    assert_eq!(decode_all(&mut decoder).len(), 5);
    assert!(chunk.is_unique(), "the decoder holds nothing of the chunk");
}

#[test]
fn short_parts_of_longer_messages_are_cut_out_not_copied() {
    // Gathered into their message's buffer later: a copy here would be a second one.
    let (wire, _) = five_data_frames(100, false);
    let mut decoder = FrameDecoder::new(MAX);
    decoder.extend_bytes(wire.clone());
    let got = decode_all(&mut decoder);
    assert_eq!(got.len(), 5);
    for frame in got {
        let Frame::Data { bytes, offset: 4, .. } = frame else { panic!("a data frame") };
        assert!(within(&wire, &bytes));
    }
}

#[test]
fn the_longest_hello_fits_the_smallest_frame_limit() {
    let longest = "N".repeat(255);
    let hello = Frame::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        api_version: u32::MAX,
        from: longest.clone(),
        to: longest,
        incarnation: u64::MAX,
        your_incarnation: u64::MAX,
        run: u64::MAX,
        frame_bytes_max: u32::MAX,
        message_bytes_max: u64::MAX,
        in_flight_messages_max: u32::MAX,
        in_flight_bytes_max: u64::MAX,
        retransmit_timeout_ms: u32::MAX,
        flags: u8::MAX,
        channels: vec![ChannelPosition::default(); crate::channel::CHANNELS],
    });
    let mut wire = BytesMut::new();
    hello.encode(&mut wire);
    assert!(wire.len() - LENGTH_BYTES <= FRAME_BYTES_MIN, "{} bytes", wire.len());
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MIN);
    decoder.extend(&wire);
    assert_eq!(decoder.decode().unwrap(), Some(hello));
}
