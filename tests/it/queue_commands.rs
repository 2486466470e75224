//! `linkbus queue ls` and `linkbus queue stat NAME` on a real node: depth, pending
//! (handed out, not acknowledged) and depth per priority.

use crate::support;

use std::time::Duration;

use linkbus::Client;
use support::{Scratch, stderr, stdout};

#[test]
fn queue_ls_and_stat_show_depth_pending_and_priorities() {
    let s = Scratch::new();
    let a = s.start_lone("A", &["p:priority", "f:fifo"]);
    for (priority, text) in [("1", "low"), ("7", "high"), ("7", "high again")] {
        let put = s.run(&["put", "--node", "A", "--to", "A:p", "--priority", priority, text]);
        assert!(put.status.success(), "{}", stderr(&put));
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // A consumer holds one message pending while we look.
    let mut consumer = runtime.block_on(Client::connect(&a.socket)).unwrap();
    let held = runtime.block_on(consumer.get_pending("p", 1, Duration::ZERO, u64::MAX)).unwrap();
    assert_eq!(&held[0].message.content.payload[..], b"high", "priority order");

    let ls = s.run(&["queue", "ls", "--node", "A"]);
    assert!(ls.status.success(), "{}", stderr(&ls));
    let text = stdout(&ls);
    let line = |name: &str| text.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_owned();
    let p: Vec<String> = line("p ").split_whitespace().map(str::to_owned).collect();
    assert_eq!(p[..4], ["p", "priority", "2", "1"], "depth 2, 1 pending:\n{text}");
    assert!(line("f ").contains(" 0 "), "{text}");
    assert!(line("DLQ").starts_with("DLQ"), "{text}");

    let stat = s.run(&["queue", "stat", "--node", "A", "p"]);
    let text = stdout(&stat);
    assert!(
        text.contains("depth: 2") && text.contains("pending (handed out, not acknowledged): 1"),
        "{text}"
    );
    assert!(text.contains("     7: 1") && text.contains("     1: 1"), "depth by priority:\n{text}");
    let missing = s.run(&["queue", "stat", "--node", "A", "nope"]);
    assert!(!missing.status.success() && stderr(&missing).contains("queue 'nope' does not exist"));
    drop(consumer);
}
