//! Node events on real processes: link, dead-letter and expiry events reach the node's
//! `EVENT` queue (`linkbus events`), and a subscription copies chosen kinds to a queue on
//! another node.

use crate::support;

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
        // On a peer: the peer is asked, and says so.
        (
            ["--kinds", "all", "--to", "B:nothing"],
            "queue 'nothing' does not exist on node B; B:nothing not subscribed",
        ),
    ] {
        let out = s.run(&[&["events", "subscribe", "--node", "A"][..], &args[..]].concat());
        assert!(!out.status.success() && stderr(&out).contains(error), "{args:?}: {}", stderr(&out));
    }
}

/// `linkbus events --follow` reads copies: two operators following both see every event,
/// and the events stay in the queue; `--take` takes them.
#[test]
fn followers_each_see_every_event_and_only_take_takes_them() {
    let s = Scratch::new();
    let (_a, _b) = s.start_pair("", "queues: [ { name: orders } ]");
    let follow = || {
        s.command(&["events", "--node", "B", "--follow"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let (one, two) = (follow(), follow());
    std::thread::sleep(Duration::from_millis(500));
    assert!(s.run(&["put", "--node", "A", "--to", "B:missing", "x"]).status.success());
    let _ = events_until(&s, "B", "dead_letter");
    std::thread::sleep(Duration::from_millis(500));
    let mut outputs = Vec::new();
    for mut child in [one, two] {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        outputs.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    for out in &outputs {
        assert!(
            out.contains("dead_letter") && out.contains("link_up"),
            "each follower saw every event:\n{out}"
        );
    }
    let kept = stdout(&s.run(&["events", "--node", "B"]));
    assert!(kept.contains("dead_letter"), "reading took nothing: {kept}");
    let taken = stdout(&s.run(&["events", "--node", "B", "--take"]));
    assert!(taken.contains("dead_letter"), "{taken}");
    assert_eq!(stdout(&s.run(&["events", "--node", "B"])), "", "taken");
}

/// A subscription of a queue on a peer made while the link is down cannot be checked: it is
/// accepted with a note, and the copies the peer cannot queue are counted there (by origin
/// and queue, in `linkbus status`) and logged, not silently lost.
#[test]
fn copies_for_a_missing_queue_on_a_peer_are_counted_there() {
    let s = Scratch::new();
    let (a_key, b_key) = (s.keys("A"), s.keys("B"));
    let port = support::free_port();
    let a_yaml = format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '127.0.0.1:{port}', public_key: '{b_key}' }} ]\n{}\n",
        s.security_yaml("A")
    );
    let _a = s.start_node("A", &["-c", s.write("a.yaml", &a_yaml).to_str().unwrap()]);
    // B is not up: the subscription is accepted unconfirmed.
    let sub =
        s.run(&["events", "subscribe", "--node", "A", "--kinds", "link_up,link_down", "--to", "B:ghost"]);
    assert!(sub.status.success(), "{}", stderr(&sub));
    assert!(
        stdout(&sub).contains("B:ghost subscribed (not confirmed: the link towards B is down"),
        "{}",
        stdout(&sub)
    );
    let b_yaml = format!(
        "node: {{ name: B, listen: '127.0.0.1:{port}' }}\npeers: [ {{ name: A, public_key: '{a_key}' }} ]\n{}\n",
        s.security_yaml("B")
    );
    let b = s.start_node("B", &["-c", s.write("b.yaml", &b_yaml).to_str().unwrap()]);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = stdout(&s.run(&["status", "--node", "B"]));
        if status.contains("from A to B:ghost:") {
            assert!(
                status.contains("last queue_missing (queue 'ghost' does not exist on node B)"),
                "{status}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no count of dropped copies on B:\n{status}");
        std::thread::sleep(Duration::from_millis(200));
    }
    b.wait_for_log("Event copy dropped.", 1, Duration::from_secs(5));
}
