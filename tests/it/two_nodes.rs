//! Two `linkbus` processes configured by YAML files: a put on A to `B:orders` is printed by
//! a get on B, and the console producer/consumer move many lines in order. Two nodes
//! configured differently still acknowledge within what the sender needs.

use crate::support;

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

#[test]
fn a_sender_with_a_small_window_does_not_wait_for_a_peers_long_acknowledgement_delay() {
    // B would keep an acknowledgement a second for company unless 32 messages wait; A has
    // only 8 in flight. A's Hello tells B, which acknowledges every 2: 200 lines arrive at
    // once, where waiting for the delay would take 25 windows of a second.
    let s = Scratch::new();
    let b_extra = format!("{B_QUEUES}\nlinks: {{ ack_delay_ms: 1000 }}");
    let (_a, _b) = s.start_pair("links: { in_flight_messages_max: 8 }", &b_extra);
    let lines: String = (0..200).map(|i| format!("line {i}\n")).collect();
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "B:orders", "--volatile", "-"],
        lines.as_bytes(),
        Duration::from_secs(30),
    );
    assert!(put.status.success(), "{}", stderr(&put));
    let get = s.run(&["get", "--node", "B", "orders", "--count", "200", "--wait", "4s"]);
    assert!(get.status.success(), "{}", stderr(&get));
    assert_eq!(stdout(&get), lines, "all of them in less than 25 acknowledgement delays");
}

#[test]
fn an_acknowledgement_waits_less_than_the_senders_retransmit_timeout() {
    // B would keep an acknowledgement a second; A writes again what is unacknowledged after
    // 900 ms. A's Hello tells B, which waits at most a quarter of that: A never writes again.
    let s = Scratch::new();
    let b_extra = format!("{B_QUEUES}\nlinks: {{ ack_delay_ms: 1000 }}");
    let (_a, _b) = s.start_pair("links: { retransmit_timeout_ms: 900 }", &b_extra);
    for i in 0..3 {
        let put = s.run(&["put", "--node", "A", "--to", "B:orders", "--volatile", &format!("m{i}")]);
        assert!(put.status.success(), "{}", stderr(&put));
    }
    // A message can only be written again before its acknowledgement comes.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = stdout(&s.run(&["status", "--node", "A"]));
        if text.contains("acked 3,") || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(text.contains("acked 3,") && text.contains("retransmit timeouts 0,"), "{text}");
    let get = s.run(&["get", "--node", "B", "orders", "--count", "3", "--wait", "1s"]);
    assert_eq!(stdout(&get), "m0\nm1\nm2\n", "{}", stderr(&get));
}
