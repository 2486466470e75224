use proptest::prelude::*;

use super::*;

#[test]
fn the_name_rules_as_a_table() {
    let long_component = "a".repeat(256);
    let long_name = ["b"; 600].join("/");
    let cases: &[(&str, Result<(), &str>)] = &[
        ("report.pdf", Ok(())),
        ("reports/q3 summary.pdf", Ok(())),
        ("a/b/c/d.txt", Ok(())),
        ("..hidden/x", Ok(())),
        (".dotfile", Ok(())),
        ("dé jà/vu ✓.txt", Ok(())),
        ("C:x", Ok(())),
        ("", Err("empty")),
        ("..", Err("'..' component")),
        ("../x", Err("'..' component")),
        ("a/../../b", Err("'..' component")),
        ("a/..", Err("'..' component")),
        ("/etc/passwd", Err("absolute")),
        ("//x", Err("absolute")),
        ("C:\\x", Err("backslash")),
        ("..\\x", Err("backslash")),
        ("a\0b", Err("NUL")),
        ("a\nb", Err("control character")),
        ("a\u{7f}b", Err("control character")),
        ("a//b", Err("empty or '.'")),
        ("./a", Err("empty or '.'")),
        ("a/", Err("empty or '.'")),
        (".", Err("empty or '.'")),
        (&long_component, Err("component of 256 bytes")),
        (&long_name, Err("at most 1024")),
        (".linkbus-partial/x", Err("holds files being received")),
        (".linkbus-partial", Err("holds files being received")),
    ];
    for (name, expected) in cases {
        match (FileName::new(name), expected) {
            (Ok(n), Ok(())) => assert_eq!(n.as_str(), *name),
            (Err(e), Err(rule)) => {
                assert!(e.to_string().contains(rule), "{name:?}: {e} does not name {rule:?}");
            }
            (got, want) => panic!("{name:?}: got {got:?}, expected {want:?}"),
        }
    }
    let at_limit = vec!["c".repeat(255); 4].join("/");
    assert!(at_limit.len() == 1023 && FileName::new(&at_limit).is_ok());
}

fn chunk(digest: Option<Digest>) -> Frame {
    Frame::Chunk(Chunk {
        attempt: 3,
        name: FileName::new("reports/q3 summary.pdf").expect("name"),
        size: 1 << 30,
        offset: 256 << 10,
        crc: 0xdead_beef,
        ack_every: 4 << 20,
        digest,
        data: Bytes::from_static(b"some bytes of the file"),
    })
}

#[test]
fn every_frame_round_trips() {
    let frames = [
        chunk(None),
        chunk(Some([7; 32])),
        Frame::Query { attempt: 9 },
        Frame::Cancel { reason: "the source changed".into() },
        Frame::Resume { transfer: 42, attempt: 2, from: 1 << 20, note: "partial damaged".into() },
        Frame::Progress { transfer: 42, verified: 123 },
        Frame::Done { transfer: 42, digest: [1; 32] },
        Frame::Refuse { transfer: 42, code: refused::EXISTS.into(), reason: "there".into() },
    ];
    for frame in frames {
        assert_eq!(Frame::decode(frame.encode()).expect("decodes"), frame);
    }
}

#[test]
fn bad_frames_are_named() {
    let mut bytes = chunk(None).encode().to_vec();
    bytes[0] = 2;
    assert!(Frame::decode(bytes.into()).unwrap_err().to_string().contains("version 2"));
    let frame = Frame::Chunk(Chunk {
        attempt: 0,
        name: FileName::new("x").expect("name"),
        size: 4,
        offset: 2,
        crc: 0,
        ack_every: 1,
        digest: None,
        data: Bytes::from_static(b"abc"),
    });
    assert!(Frame::decode(frame.encode()).unwrap_err().to_string().contains("runs past"));
    let mut query = Frame::Query { attempt: 1 }.encode().to_vec();
    query.push(0);
    assert!(Frame::decode(query.into()).unwrap_err().to_string().contains("after the frame"));
    // A name that breaks a rule is refused on reading as on writing.
    let mut named = BytesMut::new();
    named.put_u8(VERSION);
    named.put_u8(CHUNK);
    named.put_u32(0);
    put_text(&mut named, "../x");
    named.put_slice(&[0; 57]);
    assert!(Frame::decode(named.freeze()).unwrap_err().to_string().contains("'..'"));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = Frame::decode(Bytes::from(bytes));
    }

    #[test]
    fn a_name_that_passes_stays_below_its_root(
        parts in proptest::collection::vec("[a-z. /\\\\]{0,6}", 1..6),
    ) {
        let name = parts.join("/");
        if let Ok(name) = FileName::new(&name) {
            prop_assert!(!name.as_str().starts_with('/'));
            prop_assert!(name.components().all(|c| !c.is_empty() && c != "." && c != ".."));
        }
    }
}
