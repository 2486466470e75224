//! Two `linkbus` processes configured by YAML files: a put on A to `B:orders` is printed by
//! a get on B, and the console producer/consumer move many lines in order.

mod support;

use std::time::Duration;

use support::{Scratch, stderr, stdout};

const B_QUEUES: &str = "queues: [ { name: orders, order: fifo } ]";

#[test]
fn hello_goes_from_a_to_b() {
    let s = Scratch::new();
    let (_a, _b) = s.start_pair("", B_QUEUES);
    let put = s.run(&["put", "--node", "A", "--to", "B:orders", "hello"]);
    assert!(put.status.success(), "{}", stderr(&put));
    assert!(stdout(&put).starts_with("A/"), "put prints the message id: {}", stdout(&put));
    let get = s.run(&["get", "--node", "B", "orders", "--wait", "5s"]);
    assert!(get.status.success(), "{}", stderr(&get));
    assert_eq!(stdout(&get), "hello\n");
}

#[test]
fn console_producer_and_consumer_keep_order() {
    let s = Scratch::new();
    let (_a, _b) = s.start_pair("", B_QUEUES);
    let lines: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "B:orders", "-"],
        lines.as_bytes(),
        Duration::from_secs(60),
    );
    assert!(put.status.success(), "{}", stderr(&put));
    assert!(stderr(&put).contains("put 20000 messages"), "{}", stderr(&put));
    let get = s.run(&["get", "--node", "B", "orders", "--count", "20000", "--wait", "20s"]);
    assert!(get.status.success(), "{}", stderr(&get));
    assert_eq!(stdout(&get), lines, "every line once, in order");
    let empty = s.run(&["get", "--node", "B", "orders", "--wait", "100ms"]);
    assert!(!empty.status.success(), "nothing is left");
    assert!(stderr(&empty).contains("0 of 1 messages arrived"), "{}", stderr(&empty));
}

#[test]
fn status_shows_links_and_queues() {
    let s = Scratch::new();
    let (a, _b) = s.start_pair("", B_QUEUES);
    a.wait_for_log("Link up.", 1, Duration::from_secs(10));
    let status = s.run(&["status", "--node", "A"]);
    assert!(status.status.success(), "{}", stderr(&status));
    let text = stdout(&status);
    assert!(text.contains("B: up"), "{text}");
    assert!(text.contains("DLQ: 0 messages"), "{text}");
}
