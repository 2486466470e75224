//! Delivery under pressure loses nothing: when the destination cannot take messages (its
//! queue and dead-letter queue are full) they wait at the sender and arrive once there is
//! room; and a consumer that vanishes while its `get` waits does not take messages with it
//! (its get stops before taking anything).

use crate::support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use support::{Scratch, stderr, stdout};

#[test]
fn a_full_destination_holds_messages_back_instead_of_losing_them() {
    let s = Scratch::new();
    let (_a, b) = s.start_pair(
        "links: { reconnect_backoff_min_ms: 20, reconnect_backoff_max_ms: 200 }",
        "queues: [ { name: orders, order: fifo, queue_messages_max: 2 } ]\nmessages: { dead_letter_messages_max: 1 }",
    );
    let lines: String = (1..=8).map(|i| format!("{i}\n")).collect();
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "B:orders", "-"],
        lines.as_bytes(),
        Duration::from_secs(10),
    );
    assert!(put.status.success(), "{}", stderr(&put));

    let mut got: Vec<u32> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(40);
    while got.len() < 8 && Instant::now() < deadline {
        for queue in ["orders", "DLQ"] {
            let out = s.run(&["get", "--node", "B", queue, "--count", "8", "--wait", "200ms"]);
            got.extend(stdout(&out).lines().map(|l| l.parse::<u32>().unwrap()));
        }
    }
    got.sort_unstable();
    assert_eq!(got, (1..=8).collect::<Vec<_>>(), "each message exactly once, in one queue or the other");
    assert!(b.log_text().contains("Cannot take delivery"), "B had to hold back:\n{}", b.log_text());
}

#[test]
fn messages_taken_by_a_vanished_consumer_go_back_to_the_queue() {
    let s = Scratch::new();
    let b = s.start_node("B", &["--name", "B", "--listen", "none", "--queue", "orders"]);
    let mut consumer = s
        .command(&["get", "--node", "B", "orders", "--wait", "30s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    consumer.kill().unwrap();
    consumer.wait().unwrap();
    let put = s.run(&["put", "--node", "B", "--to", "B:orders", "m1"]);
    assert!(put.status.success(), "{}", stderr(&put));
    let get = s.run(&["get", "--node", "B", "orders", "--wait", "5s"]);
    assert_eq!(stdout(&get), "m1\n", "{}", stderr(&get));
    assert!(
        b.log_text().contains("Client left while its request waited."),
        "the vanished get stopped:\n{}",
        b.log_text()
    );
}
