//! Message results on real processes: each recipient's outcome comes back to the origin
//! (`linkbus put --wait-result`, `linkbus result ID`, `result` events) — delivered, failed
//! with the dead-letter code, failed because the message expired before it was sent, and
//! expired after it was sent.

use crate::support;

use std::time::{Duration, Instant};

use support::proxy::FaultProxy;
use support::{Scratch, stderr, stdout};

#[test]
fn each_recipient_gets_its_result_back_at_the_origin() {
    let s = Scratch::new();
    let (_a, _b) = s.start_pair("queues: [ { name: local } ]", "queues: [ { name: orders } ]");
    let put = s.run(&[
        "put",
        "--node",
        "A",
        "--to",
        "B:orders",
        "--to",
        "B:missing",
        "--to",
        "A:local",
        "--wait-result",
        "10s",
        "hello",
    ]);
    assert!(!put.status.success(), "one recipient failed, so the put reports failure");
    let out = stdout(&put);
    let lines: Vec<&str> = out.lines().collect();
    let id = lines[0];
    assert!(id.starts_with("A/"), "{out}");
    assert_eq!(
        &lines[1..],
        [
            format!("{id} B:orders delivered"),
            format!("{id} B:missing failed queue_missing: queue 'missing' does not exist on node B"),
            format!("{id} A:local delivered"),
        ],
        "{out}"
    );
    assert!(stderr(&put).contains("1 of 3 recipients did not get their message"), "{}", stderr(&put));

    // Asked again later, by id: the same answer, at once.
    let again = s.run(&["result", "--node", "A", id]);
    assert_eq!(stdout(&again).lines().collect::<Vec<_>>(), &lines[1..]);
    // Only the origin keeps results.
    let elsewhere = s.run(&["result", "--node", "B", id]);
    assert!(stderr(&elsewhere).contains("kept by node A, not by B"), "{}", stderr(&elsewhere));
    let unknown = s.run(&["result", "--node", "A", "A/1"]);
    assert!(stdout(&unknown).contains("A/1 unknown"), "{}", stdout(&unknown));

    // A message that reaches every recipient: success, and result events on A.
    let ok = s.run(&["put", "--node", "A", "--to", "B:orders", "--wait-result", "10s", "fine"]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert!(stdout(&ok).lines().nth(1).is_some_and(|l| l.ends_with("B:orders delivered")), "{}", stdout(&ok));
    let events = stdout(&s.run(&["events", "--node", "A"]));
    let results: Vec<&str> = events.lines().filter(|l| l.contains(" result message ")).collect();
    assert_eq!(results.len(), 4, "one event per recipient result:\n{events}");
    assert!(results.iter().any(|l| l.contains("B:missing: failed queue_missing")), "{events}");
    // The results did not reach anyone's queue on B.
    let b_events = stdout(&s.run(&["events", "--node", "B"]));
    assert!(!b_events.contains(" result "), "{b_events}");
}

#[test]
fn expiry_before_sending_fails_and_after_sending_is_reported_expired() {
    let s = Scratch::new();
    let b_yaml = "node: { name: B, listen: 127.0.0.1:0 }\npeers: [ { name: A } ]\nqueues: [ { name: orders } ]\n\
                  security: { insecure_plaintext: true }\n";
    let b = s.start_node("B", &["-c", s.write("b.yaml", b_yaml).to_str().unwrap()]);
    let proxy = FaultProxy::start(&b.listen_address());
    let a_yaml = format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '{}' }} ]\n\
         security: {{ insecure_plaintext: true }}\nmessages: {{ result_wait_ms: 3000 }}\n\
         links: {{ reconnect_backoff_min_ms: 20, reconnect_backoff_max_ms: 200, ping_interval_ms: 300, pong_timeout_ms: 600 }}\n",
        proxy.address
    );
    let a = s.start_node("A", &["-c", s.write("a.yaml", &a_yaml).to_str().unwrap()]);
    a.wait_for_log("Link up.", 1, Duration::from_secs(10));

    // The link is black: the message waits in A's transmission queue and expires there,
    // so it was never sent: failed.
    proxy.set_blackhole(true);
    proxy.cut();
    let started = Instant::now();
    let put =
        s.run(&["put", "--node", "A", "--to", "B:orders", "--lifetime", "300ms", "--wait-result", "5s", "x"]);
    let out = stdout(&put);
    assert!(
        out.contains("B:orders failed expired_before_sending: expired before it was sent to B"),
        "{out}{}",
        stderr(&put)
    );
    assert!(started.elapsed() < Duration::from_secs(3), "reported when it expired, not at the deadline");

    // The proxy swallows what crosses it: the message is sent (into the black hole) and
    // expires before it is acknowledged; after the connection is cut it would be resent, but
    // it expired: expired. (A learns it only once it has dialed again, which must happen
    // within `result_wait_ms` of the expiry: 500 ms left too little for a loaded machine.)
    proxy.set_blackhole(false);
    a.wait_for_log("Link up.", 2, Duration::from_secs(10));
    proxy.set_blackhole(true);
    let put = s.run(&["put", "--node", "A", "--to", "B:orders", "--lifetime", "400ms", "--results", "y"]);
    assert!(put.status.success(), "{}", stderr(&put));
    let id = stdout(&put).trim().to_owned();
    std::thread::sleep(Duration::from_millis(800));
    proxy.set_blackhole(false);
    proxy.cut();
    let result = s.run(&["result", "--node", "A", "--wait", "10s", &id]);
    assert_eq!(stdout(&result).trim(), format!("{id} B:orders expired"), "{}", stderr(&result));
    let get = s.run(&["get", "--node", "B", "orders"]);
    assert!(!get.status.success(), "the expired message never arrived: {}", stdout(&get));
}
