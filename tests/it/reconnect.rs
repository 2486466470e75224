//! A permanent link survives its peer: B stops, A keeps accepting messages for it, and when
//! B starts again on the same address A reconnects by itself and delivers what waited —
//! except messages whose lifetime ran out meanwhile.

use crate::support;

use std::time::Duration;

use support::{Scratch, stderr, stdout};

#[test]
fn messages_put_while_the_peer_is_down_arrive_when_it_returns() {
    let s = Scratch::new();
    let (a, mut b) = s.start_pair(
        "links: { reconnect_backoff_min_ms: 50, reconnect_backoff_max_ms: 300 }",
        "queues: [ { name: orders, order: fifo } ]",
    );
    let b_address = b.listen_address();
    let b_config = s.path().join("b.yaml");

    assert!(s.run(&["put", "--node", "A", "--to", "B:orders", "before"]).status.success());
    let get = s.run(&["get", "--node", "B", "orders", "--wait", "5s"]);
    assert_eq!(stdout(&get), "before\n");

    assert!(b.stop(), "B stops cleanly on SIGTERM:\n{}", b.log_text());
    a.wait_for_log("Link down.", 1, Duration::from_secs(10));
    let short = s.run(&["put", "--node", "A", "--to", "B:orders", "--lifetime", "200ms", "expires"]);
    assert!(short.status.success(), "{}", stderr(&short));
    let lines: String = (0..500).map(|i| format!("while down {i}\n")).collect();
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "B:orders", "-"],
        lines.as_bytes(),
        Duration::from_secs(30),
    );
    assert!(put.status.success(), "A accepts while B is down: {}", stderr(&put));
    // Let the short lifetime run out and A's dialer fail a few times.
    std::thread::sleep(Duration::from_millis(600));

    let _b = s.start_node("B", &["-c", b_config.to_str().unwrap(), "--listen", &b_address]);
    a.wait_for_log("Link up.", 2, Duration::from_secs(10));
    let get = s.run(&["get", "--node", "B", "orders", "--count", "500", "--wait", "10s"]);
    assert!(get.status.success(), "{}", stderr(&get));
    assert_eq!(stdout(&get), lines, "everything within its lifetime, once, in order");
    let more = s.run(&["get", "--node", "B", "orders", "--wait", "300ms"]);
    assert_eq!(stdout(&more), "", "the expired message is never delivered");
    assert!(a.log_text().contains("Message expired before it was sent."), "{}", a.log_text());
}
