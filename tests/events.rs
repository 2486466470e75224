//! Node events on real processes: link, dead-letter and expiry events reach the node's
//! `EVENT` queue (`linkbus events`), and a subscription copies chosen kinds to a queue on
//! another node.

mod support;

use std::time::{Duration, Instant};

use support::{Scratch, stderr, stdout};

/// `linkbus events` output from `node` until it holds `needle` (bounded).
fn events_until(s: &Scratch, node: &str, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut all = String::new();
    while Instant::now() < deadline {
        let out = s.run(&["events", "--node", node]);
        assert!(out.status.success(), "{}", stderr(&out));
        all.push_str(&stdout(&out));
        if all.contains(needle) {
            return all;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("no '{needle}' among the events of {node}:\n{all}");
}

#[test]
fn events_reach_the_event_queue_and_subscribers() {
    let s = Scratch::new();
    let (_a, _b) = s.start_pair(
        "events: { subscriptions: [ { kinds: [link_up, dead_letter], to: 'B:ops' } ] }",
        "queues: [ { name: ops, order: fifo }, { name: orders, order: fifo } ]",
    );
    let a_events = events_until(&s, "A", "link_up");
    assert!(a_events.contains("link_up link to B up (renegotiation 1"), "{a_events}");

    // The subscription put a copy on B.
    let ops = s.run(&["get", "--node", "B", "ops", "--wait", "5s"]);
    assert!(stdout(&ops).starts_with("link to B up"), "{}", stdout(&ops));

    // A message for a missing queue is dead-lettered on B: an event there.
    assert!(s.run(&["put", "--node", "A", "--to", "B:missing", "x"]).status.success());
    let b_events = events_until(&s, "B", "dead_letter");
    assert!(b_events.contains("queue_missing"), "{b_events}");

    // A message that expires in a queue: an event when a get finds it.
    let put = s.run(&["put", "--node", "A", "--to", "B:orders", "--lifetime", "300ms", "brief"]);
    assert!(put.status.success(), "{}", stderr(&put));
    std::thread::sleep(Duration::from_millis(1_000));
    let get = s.run(&["get", "--node", "B", "orders"]);
    assert!(!get.status.success(), "expired, never delivered");
    let b_events = events_until(&s, "B", "expired");
    assert!(b_events.contains("1 message(s) expired in queue 'orders'"), "{b_events}");
}

#[test]
fn a_client_subscription_copies_results_to_a_queue_on_another_node_until_it_ends() {
    let s = Scratch::new();
    let (_a, _b) = s.start_pair("", "queues: [ { name: ops, order: fifo }, { name: orders } ]");
    let sub = s.run(&["events", "subscribe", "--node", "A", "--kinds", "result,link_down", "--to", "B:ops"]);
    assert_eq!(stdout(&sub), "B:ops subscribed\n", "{}", stderr(&sub));
    let ls = s.run(&["events", "ls", "--node", "A"]);
    assert_eq!(stdout(&ls), "B:ops  link_down,result  (client)\n", "{}", stderr(&ls));

    let put = s.run(&["put", "--node", "A", "--to", "B:orders", "--wait-result", "10s", "first"]);
    assert!(put.status.success(), "{}", stderr(&put));
    let id = stdout(&put).lines().next().unwrap_or_default().to_owned();
    let ops = s.run(&["get", "--node", "B", "ops", "--wait", "5s"]);
    assert_eq!(stdout(&ops), format!("message {id} to B:orders: delivered\n"));

    let unsub = s.run(&["events", "unsubscribe", "--node", "A", "--to", "B:ops"]);
    assert_eq!(stdout(&unsub), "B:ops unsubscribed\n", "{}", stderr(&unsub));
    let put = s.run(&["put", "--node", "A", "--to", "B:orders", "--wait-result", "10s", "second"]);
    assert!(put.status.success(), "{}", stderr(&put));
    let ops = s.run(&["get", "--node", "B", "ops", "--wait", "1s"]);
    assert!(!ops.status.success(), "no copy after unsubscribing: {}", stdout(&ops));

    for (args, error) in [
        (["--kinds", "bogus", "--to", "B:ops"], "unknown event kind 'bogus'"),
        (["--kinds", "all", "--to", "C:ops"], "no route to node 'C'"),
        (["--kinds", "all", "--to", "A:EVENT"], "already gets every event"),
        (["--kinds", "all", "--to", "A:nothing"], "queue 'nothing' does not exist on node A"),
    ] {
        let out = s.run(&[&["events", "subscribe", "--node", "A"][..], &args[..]].concat());
        assert!(!out.status.success() && stderr(&out).contains(error), "{args:?}: {}", stderr(&out));
    }
}
