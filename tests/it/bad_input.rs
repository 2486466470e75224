//! Bad input gets a clear error and loses nothing: garbage bytes and strangers on the link
//! port, a peer of another protocol version, puts to queues or nodes that do not exist, and
//! messages over the size limit.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use linkbus::proto::frame::{Frame, FrameDecoder, PROTOCOL_VERSION};
use support::{Scratch, stderr, stdout};

/// Node A has a local queue and a small message limit.
const A_EXTRA: &str = "queues: [ { name: local } ]\nmessages: { message_bytes_max: 1000 }";

/// Sends `bytes` to `address` and returns the reason of the `Close` frame the node answers
/// with (a configured peer gets the node's own hello first).
fn refusal(address: &str, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(bytes).unwrap();
    let mut decoder = FrameDecoder::new(1 << 20);
    let mut buf = [0u8; 4096];
    loop {
        while let Ok(Some(frame)) = decoder.decode() {
            if let Frame::Close { reason, .. } = frame {
                return reason;
            }
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => panic!("connection ended without a close frame"),
            Ok(n) => decoder.extend(&buf[..n]),
        }
    }
}

/// A plaintext preamble and a `Hello` from `from`.
fn hello(from: &str, version: u16) -> Vec<u8> {
    let mut out = b"LBUS\x01\x00".to_vec();
    out.extend_from_slice(&support::hello_frame(from, version));
    out
}

#[test]
fn strangers_garbage_and_other_versions_are_refused_and_the_node_stays_up() {
    let s = Scratch::new();
    let (a, b) = s.start_pair_with(A_EXTRA, "queues: [ { name: orders } ]", false);
    let address = b.listen_address();

    let reason = refusal(&address, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(reason.contains("not a linkbus connection"), "{reason}");
    let reason = refusal(&address, &hello("Z", PROTOCOL_VERSION));
    assert!(reason.contains("node 'Z' is not a configured peer of B"), "{reason}");
    let reason = refusal(&address, &hello("A", PROTOCOL_VERSION + 1));
    assert!(reason.contains(&format!("peer speaks protocol version {}", PROTOCOL_VERSION + 1)), "{reason}");
    assert!(b.log_text().contains("Refused connection"), "{}", b.log_text());

    // The real link recovers and still carries messages.
    a.wait_for_log("Link up.", 1, Duration::from_secs(10));
    assert!(s.run(&["put", "--node", "A", "--to", "B:orders", "still here"]).status.success());
    let get = s.run(&["get", "--node", "B", "orders", "--wait", "10s"]);
    assert_eq!(stdout(&get), "still here\n", "{}", stderr(&get));
}

#[test]
fn bad_puts_are_refused_with_the_reason() {
    let s = Scratch::new();
    let (_a, b) = s.start_pair(A_EXTRA, "queues: [ { name: orders } ]");
    let cases: [(&[&str], &str); 5] = [
        (&["--to", "A:nowhere", "x"], "queue 'nowhere' does not exist on node A"),
        (&["--to", "Z:orders", "x"], "no route to node 'Z'"),
        (&["--to", "B:orders", &"x".repeat(1001)], "over messages.message_bytes_max 1000"),
        (&["--to", "1B:orders", "x"], "must start with a letter"),
        (&["--to", "B:orders", "--priority", "10", "x"], "10 is not in 0..=9"),
    ];
    for (args, expected) in cases {
        let mut full = vec!["put", "--node", "A"];
        full.extend_from_slice(args);
        let out = s.run(&full);
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(stderr(&out).contains(expected), "{args:?}: expected '{expected}' in {}", stderr(&out));
    }
    // A queue B does not have: A cannot know, so B dead-letters it with the reason.
    assert!(s.run(&["put", "--node", "A", "--to", "B:missing", "lost?"]).status.success());
    let dlq = s.run(&["get", "--node", "B", "DLQ", "--wait", "10s"]);
    assert_eq!(stdout(&dlq), "lost?\n", "{}", stderr(&dlq));
    assert!(b.log_text().contains("queue 'missing' does not exist on node B"), "{}", b.log_text());
    let get = s.run(&["get", "--node", "B", "nowhere", "--wait", "1s"]);
    assert!(stderr(&get).contains("queue 'nowhere' does not exist on node B"), "{}", stderr(&get));
}

#[test]
fn a_full_destination_queue_dead_letters_instead_of_losing() {
    let s = Scratch::new();
    let (_a, _b) = s.start_pair("", "queues: [ { name: small, order: fifo, queue_messages_max: 3 } ]");
    let lines = "1\n2\n3\n4\n5\n";
    assert!(
        s.run_with_input(
            &["put", "--node", "A", "--to", "B:small", "-"],
            lines.as_bytes(),
            Duration::from_secs(10)
        )
        .status
        .success()
    );
    let got = s.run(&["get", "--node", "B", "small", "--count", "3", "--wait", "10s"]);
    assert_eq!(stdout(&got), "1\n2\n3\n");
    let dlq = s.run(&["get", "--node", "B", "DLQ", "--count", "2", "--wait", "10s"]);
    assert_eq!(stdout(&dlq), "4\n5\n", "{}", stderr(&dlq));
}
