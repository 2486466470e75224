use super::*;

#[test]
fn chunks_count_their_bytes_and_keep_their_order() {
    let mut chunks = Chunks::default();
    let big = Bytes::from(vec![2u8; Chunks::SHARE_BYTES_MIN]);
    chunks.buf().put_slice(b"head");
    chunks.share(&big);
    chunks.share(&Bytes::from_static(b"small"));
    chunks.buf().put_slice(b"tail");
    assert_eq!(chunks.len(), 4 + big.len() + 5 + 4);
    let mut parts = Vec::new();
    chunks.take(&mut parts);
    assert!(chunks.is_empty());
    let joined: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    let want: Vec<u8> = [&b"head"[..], &big, b"small", b"tail"].concat();
    assert_eq!(joined, want);
    assert_eq!(parts.len(), 3, "head, the shared payload, then the small one copied with the tail");
}

/// Many small pieces (copied, not shared) fill buffers one after another, from 4 KiB
/// up to `BUFFER_BYTES`: bytes once written stay where they are (no buffer is grown by
/// copying it into a larger one), whether they are written through `buf` (headers),
/// `share` (short pieces), or both in turn.
#[test]
fn chunks_never_move_what_they_hold() {
    for (headers, pieces) in [(true, true), (false, true), (true, false)] {
        let mut chunks = Chunks::default();
        chunks.buf().put_slice(b"head");
        let first = chunks.buf().as_ptr();
        let len = if headers { Chunks::SHARE_BYTES_MIN / 5 } else { Chunks::SHARE_BYTES_MIN - 1 };
        let piece = Bytes::from(if pieces { vec![7u8; len] } else { Vec::new() });
        let header: &[u8] = if headers { b"frame header" } else { b"" };
        let count = 4 * Chunks::BUFFER_BYTES / (header.len() + piece.len());
        for _ in 0..count {
            if headers {
                chunks.buf().put_slice(header);
            }
            if pieces {
                chunks.share(&piece);
            }
        }
        let case = format!("headers {headers}, pieces {pieces}");
        assert_eq!(chunks.len(), 4 + count * (header.len() + piece.len()), "{case}");
        let mut parts = Vec::new();
        chunks.take(&mut parts);
        assert!(chunks.is_empty(), "{case}: take leaves nothing");
        assert_eq!(
            parts.first().map(|p| p.as_ptr()),
            Some(first),
            "{case}: the first buffer was never moved"
        );
        assert!((5..=12).contains(&parts.len()), "{case}: {} buffers", parts.len());
        assert!(parts.iter().all(|p| p.len() <= Chunks::BUFFER_BYTES), "{case}: each within its buffer");
        assert!(parts.first().is_some_and(|p| p.len() <= 4096), "{case}: the first buffer is small");
        let joined: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        let mut want = b"head".to_vec();
        (0..count).for_each(|_| want.extend([header, &piece].concat()));
        assert_eq!(joined, want, "{case}");
    }
}

#[test]
fn a_detaching_reader_copies_short_byte_fields_and_shares_long_ones() {
    let chunk = Bytes::from(vec![1u8; 4 * DETACH_BYTES_MAX]);
    let mut r = Reader::detaching(chunk.clone());
    r.bytes(10).unwrap();
    let short = r.bytes(64).unwrap();
    assert_ne!(short.as_ptr(), chunk.as_ptr().wrapping_add(10), "a short field has its own buffer");
    assert!(short.is_unique() && short[..] == chunk[10..74]);
    let long = r.bytes(DETACH_BYTES_MAX).unwrap();
    assert_eq!(long.as_ptr(), chunk.as_ptr().wrapping_add(74), "a long one stays shared");
    let mut shared = Reader::new(chunk.clone());
    assert_eq!(shared.bytes(64).unwrap().as_ptr(), chunk.as_ptr(), "a plain reader shares every field");
}
use proptest::prelude::*;

fn sample() -> Message {
    let mut content = Content::buf("B:orders".parse().unwrap(), &b"hello"[..]);
    content.name = "n".repeat(MESSAGE_NAME_BYTES_MAX);
    content.headers.push(("k".into(), "v".into()));
    content.group = Some(Group { id: "g".into(), index: 3, last: true });
    content.correlation_id = Some(Bytes::from_static(b"corr"));
    content.lifetime = Some(Lifetime::from_secs(60));
    content.reliability = Reliability::Persistent;
    content.priority = Priority::SYSTEM;
    content.kind = Kind::Event;
    content.results = true;
    Message {
        id: MessageId { source: NodeName::new("A").unwrap(), sequence: 7, created_unix_ms: 99 },
        hop_count: 2,
        redelivered: true,
        backout_count: 3,
        content: Box::new(content),
        encoding: Encoding::new(),
    }
}

#[test]
fn every_field_round_trips() {
    let m = sample();
    let bytes = message_bytes(&m);
    assert_eq!(bytes.len(), message_encoded_len(1, &m.content), "the length formula matches");
    assert_eq!(decode_message(bytes).unwrap(), m);
}

#[test]
fn an_encoding_travels_after_the_payload_and_every_form_agrees() {
    let mut m = sample();
    m.content.payload = Bytes::from(vec![9u8; Chunks::LINK_SHARE_BYTES_MIN * 2]);
    m.encoding.push(Step { codec: 1, param: Bytes::from_static(b"dict") });
    m.encoding.push(Step { codec: 2, param: Bytes::from(vec![5u8; 300]) });
    let bytes = message_bytes(&m);
    assert_eq!(bytes.len(), encoded_len(&m), "the length formula counts the encoding");
    assert_eq!(decode_message(bytes.clone()).unwrap(), m);
    assert_eq!(Encoded::of(&m).to_bytes(), bytes, "a link's copy holds the same bytes");
    let mut chunks = Chunks::default();
    encode_message_chunks(&m, &mut chunks);
    let mut parts = Vec::new();
    chunks.take(&mut parts);
    assert_eq!(join(&parts), bytes, "a vectored write holds the same bytes");
    let patched = decode_message(with_lifetime(&bytes, 77).unwrap()).unwrap();
    assert_eq!((patched.content.lifetime, &patched.encoding), (Some(Lifetime::from_ms(77)), &m.encoding));
    // A flag without steps, an unknown flag, and a step record over its limit are refused.
    let mut bad = BytesMut::from(&message_bytes(&sample())[..]);
    bad[1 + 1 + 1 + 8 + 8 + 1] |= FLAG_ENCODED;
    assert!(decode_message(bad.clone().freeze()).is_err(), "flag set, nothing follows");
    bad.put_u8(0);
    assert!(decode_message(bad.freeze()).unwrap_err().to_string().contains("encoding steps"));
    let mut unknown = BytesMut::from(&message_bytes(&sample())[..]);
    unknown[1 + 1 + 1 + 8 + 8 + 1] |= 0x80;
    assert!(decode_message(unknown.freeze()).unwrap_err().to_string().contains("message flags"));
}

#[test]
fn associated_data_binds_what_stays_and_leaves_what_changes_on_the_way() {
    let ad = |m: &Message| {
        let mut out = Vec::new();
        associated_data(m, &[], 2, &mut out);
        out
    };
    let m = sample();
    let mut moved = m.clone();
    moved.hop_count += 1;
    moved.content.lifetime = Some(Lifetime::from_ms(5));
    moved.content.recipients = Recipients::from_iter(["C:other".parse().unwrap()]);
    moved.content.reliability = Reliability::Volatile;
    moved.redelivered = !moved.redelivered;
    moved.content.headers.push(("linkbus.dead_letter_code".into(), "x".into()));
    moved.content.headers.push(("linkbus.payload_bytes".into(), "9".into()));
    assert_eq!(ad(&moved), ad(&m), "what nodes change on the way is not bound");
    let changed: [fn(&mut Message); 7] = [
        |m| m.content.headers.push(("linkbus.other".into(), "x".into())),
        |m| m.id.sequence += 1,
        |m| m.content.name.push('x'),
        |m| m.content.headers[0].1.push('x'),
        |m| m.content.priority = Priority::DEFAULT,
        |m| m.content.correlation_id = None,
        |m| m.content.group = None,
    ];
    for change in changed {
        let mut other = m.clone();
        change(&mut other);
        assert_ne!(ad(&other), ad(&m), "a bound field changed");
    }
    let mut before = Vec::new();
    associated_data(&m, &[Step { codec: 1, param: Bytes::from_static(b"d") }], 2, &mut before);
    assert_ne!(before, ad(&m), "the steps before the cipher's are bound");
}

#[test]
fn lifetime_is_patched_in_place() {
    let m = sample();
    let patched = with_lifetime(&message_bytes(&m), 1234).unwrap();
    let decoded = decode_message(patched).unwrap();
    assert_eq!(decoded.content.lifetime, Some(Lifetime::from_ms(1234)));
    assert_eq!(decoded.content.payload, m.content.payload);
    assert_eq!(with_lifetime(&Bytes::from_static(b"\x01"), 5), None);
}

#[test]
fn heads_are_written_one_after_another_in_a_shared_buffer_until_it_is_full() {
    let mut heads = Heads::default();
    let mut m = sample();
    m.content.name = "n".into();
    m.content.payload = Bytes::from(vec![7u8; 1000]);
    let first = Encoded::of_in(&m, &mut heads);
    let second = Encoded::of_in(&m, &mut heads);
    assert_eq!(first.to_bytes(), message_bytes(&m));
    assert_eq!(second.to_bytes(), message_bytes(&m));
    let [a, b] = [first.parts()[0], second.parts()[0]];
    assert_eq!(b.as_ptr(), a.as_ptr().wrapping_add(a.len()), "the second head follows the first");
    // A head that no longer fits starts a new buffer; what came before stays intact.
    let per_buffer = Heads::BUFFER_BYTES / a.len();
    let more: Vec<Encoded> = (0..per_buffer).map(|_| Encoded::of_in(&m, &mut heads)).collect();
    let last = more.last().unwrap().parts()[0];
    let in_first = |p: *const u8| p >= a.as_ptr() && p < a.as_ptr().wrapping_add(Heads::BUFFER_BYTES);
    assert!(!in_first(last.as_ptr()), "a new buffer");
    assert!(more.iter().chain([&first, &second]).all(|e| e.to_bytes() == message_bytes(&m)));
    // A long head gets a buffer of its own, and the shared one goes on after it.
    let mut long = m.clone();
    long.content.name = "n".repeat(Heads::OWN_BYTES_MIN);
    let own = Encoded::of_in(&long, &mut heads);
    assert_eq!(own.to_bytes(), message_bytes(&long));
    let next = Encoded::of_in(&m, &mut heads);
    assert_eq!(next.to_bytes(), message_bytes(&m));
    assert_eq!(next.parts()[0].as_ptr(), last.as_ptr().wrapping_add(last.len()), "the shared one went on");
}

#[test]
fn an_encoded_message_shares_a_large_payload_and_reads_as_one_buffer() {
    let link = Chunks::LINK_SHARE_BYTES_MIN;
    for len in [0, 5, link - 1, link, Chunks::SHARE_BYTES_MIN, 70_000] {
        let mut m = sample();
        m.content.payload = Bytes::from((0..len).map(|i| i as u8).collect::<Vec<u8>>());
        let whole = message_bytes(&m);
        let encoded = Encoded::of(&m);
        assert_eq!(encoded.len(), whole.len(), "{len}");
        assert_eq!(encoded.to_bytes(), whole, "{len}");
        assert_eq!(encoded.crc(), crate::crc::crc32c(&whole), "{len}");
        let [head, payload] = encoded.parts();
        if len >= link {
            assert_eq!(payload.as_ptr(), m.content.payload.as_ptr(), "{len}: the payload is shared");
        } else {
            assert!(payload.is_empty() && head.len() == whole.len(), "{len}: one buffer");
        }
        // Every cut, also across the head's end, gives the same bytes as the one buffer.
        let cuts = [0, 1, head.len() - 1, head.len(), head.len() + 1, whole.len() - 1, whole.len()];
        for start in cuts {
            for end in cuts.into_iter().filter(|end| *end >= start && *end <= whole.len()) {
                let mut out = Chunks::sharing_from(link);
                encoded.append_to(start, end, &mut out);
                let mut parts = Vec::new();
                out.take(&mut parts);
                assert_eq!(join(&parts), &whole[start..end], "{len}: {start}..{end}");
                let shared = parts.iter().any(|p| p.as_ptr() == payload.as_ptr());
                let long_payload_piece = end.saturating_sub(start.max(head.len())) >= link;
                assert_eq!(shared, long_payload_piece && start <= head.len(), "{len}: {start}..{end}");
            }
        }
        let patched = encoded.with_lifetime(1234).unwrap();
        assert_eq!(patched.to_bytes(), with_lifetime(&whole, 1234).unwrap(), "{len}");
        assert_eq!(patched.parts()[1].as_ptr(), payload.as_ptr(), "{len}: still shared");
        assert_eq!(encoded.is_volatile(), is_volatile(&whole));
        assert!(encoded.is_persistent() && !encoded.is_volatile(), "the sample is persistent");
        assert_eq!(Encoded::from(whole.clone()).to_bytes(), whole);
    }
}

#[test]
fn trailing_and_truncated_bytes_are_refused() {
    let bytes = message_bytes(&sample());
    let mut longer = BytesMut::from(&bytes[..]);
    longer.put_u8(0);
    assert!(matches!(decode_message(longer.freeze()), Err(ReadError::Trailing(1))));
    for cut in [0, 1, 10, bytes.len() - 1] {
        assert!(decode_message(bytes.slice(..cut)).is_err());
    }
}

#[test]
fn names_like_the_last_ones_decode_as_their_own_bytes_say() {
    let with = |source: &str, to: &[&str]| {
        let mut m = sample();
        m.id.source = NodeName::new(source).unwrap();
        m.content.recipients = to.iter().map(|a| a.parse().unwrap()).collect();
        m
    };
    // Each decoded right after the one before on this thread, which keeps the last names.
    let runs = [
        with("A", &["B:orders"]),
        with("A", &["B:orders"]),
        with("C", &["B:ordert"]),
        with("A", &["B:orders", "C:orders"]),
        with("A", &["B:orders"]),
        with("Abc", &["Bcd:o"]),
        with("A", &["B:orders"]),
    ];
    for m in runs {
        assert_eq!(decode_message(message_bytes(&m)).unwrap(), m);
    }
    // A bad name right after a good one of the same length is still refused.
    let bytes = message_bytes(&with("A", &["B:orders"]));
    let queue_at = bytes.windows(6).position(|w| w == b"orders").unwrap();
    for at in [2, queue_at] {
        decode_message(bytes.clone()).unwrap();
        let mut bad = BytesMut::from(&bytes[..]);
        bad[at] = b'0';
        let e = decode_message(bad.freeze()).unwrap_err();
        assert!(e.to_string().contains("must start with a letter"), "{e}");
    }
    // What a refused read left behind is not taken for names.
    assert_eq!(decode_message(bytes).unwrap(), with("A", &["B:orders"]));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_message(Bytes::from(data));
    }

    #[test]
    fn single_byte_corruption_never_panics(index in 0usize..200, value in any::<u8>()) {
        let mut bytes = BytesMut::from(&message_bytes(&sample())[..]);
        if let Some(b) = bytes.get_mut(index % 60) { *b = value; }
        let _ = decode_message(bytes.freeze());
    }
}
