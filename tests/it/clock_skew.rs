//! Nodes whose wall clocks differ by an hour (a debug-build test offset on A's clock):
//! lifetimes travel as time left, so messages neither expire early nor live longer, and
//! results come back; a handshake stamped further ahead than `security.clock_skew_max_s`
//! is refused with the difference in the log.

use crate::support;

use std::time::Duration;

use support::{NodeProcess, Scratch, stderr, stdout};

const HOUR_AHEAD: (&str, &str) = ("LINKBUS_TEST_CLOCK_OFFSET_MS", "3600000");

/// B (with `b_security` added to its security section) and A, whose clock is an hour
/// ahead, dialing B over Noise.
fn start_skewed(s: &Scratch, b_security: &str) -> (NodeProcess, NodeProcess) {
    let (a_key, b_key) = (s.keys("A"), s.keys("B"));
    let b_yaml = format!(
        "node: {{ name: B, listen: 127.0.0.1:0 }}\npeers: [ {{ name: A, public_key: '{a_key}' }} ]\n\
         queues: [ {{ name: q, order: fifo }} ]\n{}\n",
        s.security_yaml("B").replace("security: {", &format!("security: {{ {b_security}")),
    );
    let b = s.start_node("B", &["-c", s.write("b.yaml", &b_yaml).to_str().unwrap()]);
    let a_yaml = format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '{}', public_key: '{b_key}' }} ]\n\
         links: {{ reconnect_backoff_min_ms: 50, reconnect_backoff_max_ms: 200 }}\n{}\n",
        b.listen_address(),
        s.security_yaml("A")
    );
    let a = s.start_node_env("A", &["-c", s.write("a.yaml", &a_yaml).to_str().unwrap()], &[HOUR_AHEAD]);
    (a, b)
}

#[test]
fn lifetimes_count_time_spent_not_clocks() {
    let s = Scratch::new();
    let (a, _b) = start_skewed(&s, "clock_skew_max_s: 7200, ");
    a.wait_for_log("Link up.", 1, Duration::from_secs(10));

    // Three seconds to live, whatever the clocks say: it arrives.
    let put =
        s.run(&["put", "--node", "A", "--to", "B:q", "--lifetime", "3s", "--wait-result", "5s", "fresh"]);
    assert!(put.status.success(), "{}{}", stdout(&put), stderr(&put));
    assert!(stdout(&put).contains("B:q delivered"), "{}", stdout(&put));
    let get = s.run(&["get", "--node", "B", "q", "--wait", "5s"]);
    assert_eq!(stdout(&get), "fresh\n");

    // 400 ms to live: gone after a second in B's queue, although A's clock is an hour ahead.
    let put = s.run(&["put", "--node", "A", "--to", "B:q", "--lifetime", "400ms", "brief"]);
    assert!(put.status.success(), "{}", stderr(&put));
    std::thread::sleep(Duration::from_millis(1_000));
    let get = s.run(&["get", "--node", "B", "q"]);
    assert!(!get.status.success(), "expired by time spent: {}", stdout(&get));
}

#[test]
fn a_handshake_stamped_too_far_ahead_is_refused_with_the_difference() {
    let s = Scratch::new();
    let (_a, b) = start_skewed(&s, "");
    b.wait_for_log("more than security.clock_skew_max_s (600 s) allows", 1, Duration::from_secs(10));
    let log = b.log_text();
    assert!(log.contains("handshake from A is stamped 3600."), "{log}");
    assert!(!log.contains("Link up."), "{log}");
}
