//! The client protocol's frames round-trip, and bad bytes are refused.
use super::*;

fn round_trip_request(r: Request) {
    let mut out = BytesMut::new();
    r.encode(&mut out);
    assert_eq!(joined(|c| r.encode_chunks(c)), out, "the chunks say the same: {r:?}");
    let (kind, body) = split_frame(&mut out, 1 << 20).unwrap().unwrap();
    assert_eq!(Request::decode(kind, body).unwrap(), r);
}

/// What an `encode_chunks` wrote, joined.
fn joined(encode: impl FnOnce(&mut Chunks)) -> BytesMut {
    let (mut chunks, mut parts) = (Chunks::default(), Vec::new());
    encode(&mut chunks);
    chunks.take(&mut parts);
    BytesMut::from(linkbus_proto::wire::join(&parts))
}

#[test]
fn large_payloads_are_shared_into_the_chunks_and_the_bytes_are_the_same() {
    let big = Bytes::from(vec![7u8; 3 * Chunks::SHARE_BYTES_MIN]);
    let contents = vec![
        Content::buf("B:q".parse().unwrap(), "small"),
        Content::buf("B:q".parse().unwrap(), big.clone()),
    ];
    round_trip_request(Request::Put { contents: contents.clone(), timeout_ms: 1, no_wait: false });
    let message = |content: Content| Message {
        encoding: Default::default(),
        id: linkbus_plugin_api::MessageId {
            source: NodeName::new("A").unwrap(),
            sequence: 4,
            created_unix_ms: 5,
        },
        hop_count: 1,
        redelivered: false,
        backout_count: 0,
        content: Box::new(content),
    };
    let response =
        Response::Messages { messages: contents.into_iter().map(message).collect(), tags: vec![1, 2] };
    let mut out = BytesMut::new();
    response.encode(&mut out);
    assert_eq!(joined(|c| response.encode_chunks(c)), out);
    let (mut chunks, mut parts) = (Chunks::default(), Vec::new());
    response.encode_chunks(&mut chunks);
    chunks.take(&mut parts);
    assert!(parts.iter().any(|p| p.as_ptr() == big.as_ptr()), "the large payload is shared, not copied");
    let (kind, body) = split_frame(&mut out, 1 << 20).unwrap().unwrap();
    assert_eq!(Response::decode(kind, body).unwrap(), response);
}

#[test]
fn requests_round_trip() {
    round_trip_request(Request::Put {
        contents: vec![Content::buf("B:q".parse().unwrap(), "x"); 3],
        timeout_ms: 7,
        no_wait: true,
    });
    round_trip_request(Request::Get {
        queue: "orders".into(),
        count_max: 7,
        wait_ms: 5000,
        bytes_max: 9,
        pending: true,
        groups: GetGroups::Members,
    });
    round_trip_request(Request::Consume { queue: "orders".into(), count_max: 100, bytes_max: u64::MAX });
    round_trip_request(Request::Status);
    round_trip_request(Request::LinkReset { peer: "B".into() });
    round_trip_request(Request::RouteExplain { destination: "C1".into() });
    round_trip_request(Request::Reload);
    round_trip_request(Request::Plugins);
    round_trip_request(Request::Ack { queue: "orders".into(), tags: vec![1, 2, u64::MAX] });
    round_trip_request(Request::Backout { queue: "orders".into(), tags: vec![] });
    round_trip_request(Request::Queues { name: String::new() });
    round_trip_request(Request::Browse { queue: "DLQ".into(), count_max: 10 });
    round_trip_request(Request::Follow { queue: "EVENT".into(), after: 7, count_max: 10, wait_ms: 60_000 });
    round_trip_request(Request::Subscribe {
        to: "B:ops".into(),
        kinds: vec!["result".into(), "link_up".into()],
    });
    round_trip_request(Request::Unsubscribe { to: "B:ops".into() });
    round_trip_request(Request::Subscriptions);
    round_trip_request(Request::Begin);
    round_trip_request(Request::Commit { timeout_ms: 12 });
    round_trip_request(Request::Rollback);
    round_trip_request(Request::Results { source: "A".into(), sequences: vec![1, u64::MAX], wait_ms: 3 });
    round_trip_request(Request::Limits);
}

#[test]
fn responses_round_trip() {
    let message = Message {
        encoding: Default::default(),
        id: linkbus_plugin_api::MessageId {
            source: NodeName::new("A").unwrap(),
            sequence: 4,
            created_unix_ms: 5,
        },
        hop_count: 0,
        redelivered: true,
        backout_count: 2,
        content: Box::new(Content::buf("B:q".parse().unwrap(), "x")),
    };
    for response in [
        Response::Error { code: ErrorCode::NoRoute, accepted: 2, message: "no route".into() },
        Response::Messages { messages: vec![message], tags: vec![77] },
        Response::Settled(3),
        Response::Limits { message_bytes_max: 4 << 20, frame_bytes_max: 5 << 20 },
        Response::Results(vec![
            None,
            Some(MessageResults {
                id: linkbus_plugin_api::MessageId {
                    source: NodeName::new("A").unwrap(),
                    sequence: 9,
                    created_unix_ms: 1,
                },
                recipients: vec![
                    ("B:q".parse().unwrap(), None),
                    ("B:r".parse().unwrap(), Some(Outcome::failed("queue_missing", "no queue r"))),
                    ("C:q".parse().unwrap(), Some(Outcome::TimedOut)),
                ],
            }),
        ]),
    ] {
        let mut out = BytesMut::new();
        response.encode(&mut out);
        let (kind, body) = split_frame(&mut out, 1 << 20).unwrap().unwrap();
        assert_eq!(Response::decode(kind, body).unwrap(), response);
    }
}

#[test]
fn garbage_requests_are_errors_not_panics() {
    for bytes in [&b""[..], b"\x00\x00\x00\x07", b"\xff\xff\xff\xff", b"\x00\x00\x00\x00"] {
        let mut buf = BytesMut::from(bytes);
        let _ = split_frame(&mut buf, 1 << 20);
    }
    assert!(Request::decode(PUT, Bytes::from_static(b"\xff\xff\xff\xff")).is_err());
    assert!(Request::decode(99, Bytes::new()).is_err());
}

#[test]
fn a_put_whose_item_lengths_do_not_match_their_contents_is_refused() {
    let to: linkbus_plugin_api::Address = "B:orders".parse().unwrap();
    let contents = vec![Content::buf(to.clone(), &b"first"[..]), Content::buf(to, &b"second"[..])];
    let put = Request::Put { contents: contents.clone(), timeout_ms: 5, no_wait: false };
    let mut frame = BytesMut::new();
    put.encode(&mut frame);
    // The body follows the frame's length and type; the first item's length follows the
    // timeout, the no-wait flag and the count.
    let body = frame.split_off(5);
    let Ok(Request::Put { contents: got, .. }) = Request::decode(PUT, body.clone().freeze()) else {
        panic!("the put as encoded is read back");
    };
    assert_eq!(got, contents);
    assert!(got.iter().all(|c| c.payload.is_unique()), "short payloads have buffers of their own");
    let declared = u32::from_be_bytes(body[13..17].try_into().unwrap());
    for wrong in [declared - 1, declared + 1, 0] {
        let mut body = body.clone();
        body[13..17].copy_from_slice(&wrong.to_be_bytes());
        assert!(Request::decode(PUT, body.freeze()).is_err(), "length {wrong} for {declared}");
    }
}
