//! What a producer hears when the node does not take everything: a put of many lines
//! refused part way says how many lines were put in all (across the requests it was cut
//! into), so a retry does not duplicate them; a message over the node's limit is refused
//! before it is sent, with the limit named, and a request over the client frame limit is
//! answered (not cut off with a broken pipe) and the connection stays usable.

use crate::support;

use std::time::Duration;

use bytes::BytesMut;
use linkbus::client::protocol::{ErrorCode, Request, Response, split_frame};
use linkbus::{Client, ClientError, Content};
use support::{Scratch, stderr, stdout};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn put_lines(s: &Scratch, to: &str, lines: &str) -> std::process::Output {
    s.run_with_input(
        &["put", "--node", "F", "--to", to, "--timeout", "2s", "-"],
        lines.as_bytes(),
        Duration::from_secs(60),
    )
}

#[test]
fn a_put_refused_part_way_says_how_many_lines_were_put() {
    let s = Scratch::new();
    let yaml = "node: { name: F, listen: none }\nqueues: [ { name: small, queue_messages_max: 5 }, \
                { name: wide, queue_messages_max: 15 } ]\n";
    let _f = s.start_node("F", &["-c", s.write("f.yaml", yaml).to_str().unwrap()]);
    let lines: String = (1..=10).map(|i| format!("{i}\n")).collect();
    let put = put_lines(&s, "F:small", &lines);
    assert!(!put.status.success());
    let err = stderr(&put);
    assert!(
        err.contains("lines 1-5 were put (5 messages); line 6 was refused: queue 'small' is full")
            && err.contains("it and the lines after it were not put"),
        "{err}"
    );
    let got = s.run(&["get", "--node", "F", "small", "--count", "10", "--wait", "1s"]);
    assert_eq!(stdout(&got), "1\n2\n3\n4\n5\n");

    // Lines of 100 KiB go in several requests of at most 1 MiB: the count covers them all.
    let lines: String = (1..=20).map(|i| format!("{i}{}\n", "0".repeat(100 << 10))).collect();
    let put = put_lines(&s, "F:wide", &lines);
    let err = stderr(&put);
    assert!(
        err.contains("lines 1-15 were put (15 messages); line 16 was refused: queue 'wide' is full"),
        "{err}"
    );
}

#[test]
fn a_line_over_the_node_limit_is_refused_before_it_is_sent() {
    let s = Scratch::new();
    let yaml = "node: { name: F, listen: none }\nqueues: [ { name: q } ]\n";
    let _f = s.start_node("F", &["-c", s.write("f.yaml", yaml).to_str().unwrap()]);
    // The 64 MiB line the issue names, after two ordinary ones.
    let mut input = b"one\ntwo\n".to_vec();
    input.extend(std::iter::repeat_n(b'x', 64 << 20));
    input.extend(b"\nafter\n");
    let put = s.run_with_input(&["put", "--node", "F", "--to", "F:q", "-"], &input, Duration::from_secs(60));
    assert!(!put.status.success());
    let err = stderr(&put);
    assert!(
        err.contains(
            "lines 1-2 were put (2 messages); line 3 was refused: it is over the node's \
             messages.message_bytes_max (4194304 bytes); it and the lines after it were not put"
        ),
        "{err}"
    );
    let got = s.run(&["get", "--node", "F", "q", "--count", "10", "--wait", "1s"]);
    assert_eq!(stdout(&got), "one\ntwo\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_refuses_a_message_over_the_limit_and_the_node_answers_an_oversized_request() {
    let s = Scratch::new();
    let yaml =
        "node: { name: F, listen: none }\nqueues: [ { name: q } ]\nmessages: { message_bytes_max: 1000 }\n";
    let f = s.start_node("F", &["-c", s.write("f.yaml", yaml).to_str().unwrap()]);
    let mut client = Client::connect(&f.socket).await.unwrap();
    let limits = client.limits().await.unwrap();
    assert_eq!(limits.message_bytes_max, 1000);
    let big = Content::buf("F:q".parse().unwrap(), vec![1u8; 64 << 20]);
    match client.put(big).await {
        Err(ClientError::Refused { code: ErrorCode::TooLarge, accepted: 0, message }) => {
            assert!(
                message.contains(
                    "payload of 67108864 bytes is over the node's messages.message_bytes_max 1000; not sent"
                ),
                "{message}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    client.put(Content::buf("F:q".parse().unwrap(), "small")).await.expect("the client goes on");

    // A request over the node's frame limit, written whole by a client that does not ask:
    // the node answers it and reads past it, and the connection goes on.
    let mut stream = tokio::net::UnixStream::connect(&f.socket).await.unwrap();
    let len = usize::try_from(limits.frame_bytes_max).unwrap() + 4096;
    let mut frame = (len as u32).to_be_bytes().to_vec();
    frame.resize(4 + len, 0);
    let mut status = BytesMut::new();
    Request::Status.encode(&mut status);
    frame.extend_from_slice(&status);
    stream.write_all(&frame).await.expect("the node reads it all: no broken pipe");
    let mut buf = BytesMut::new();
    let mut answers = Vec::new();
    while answers.len() < 2 {
        while let Some((kind, body)) = split_frame(&mut buf, 1 << 24).unwrap() {
            answers.push(Response::decode(kind, body).unwrap());
        }
        if answers.len() < 2 {
            let n = tokio::time::timeout(Duration::from_secs(20), stream.read_buf(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0, "the connection stays open: {answers:?}");
        }
    }
    match &answers[0] {
        Response::Error { code: ErrorCode::TooLarge, message, .. } => {
            assert!(message.contains("over this node's client limit"), "{message}");
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(matches!(&answers[1], Response::Status(text) if text.contains("node: F")), "{answers:?}");
}
