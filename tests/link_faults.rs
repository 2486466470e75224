//! The link protocol over a faulty network (a fault proxy between A and B): connections cut
//! again and again while messages stream lose nothing and duplicate nothing, and a long
//! black-out with large backlogs in both directions recovers once traffic flows again.

mod support;

use std::time::{Duration, Instant};

use support::proxy::FaultProxy;
use support::{NodeProcess, Scratch, stderr, stdout};

const FAST_LINKS: &str = "links: { reconnect_backoff_min_ms: 20, reconnect_backoff_max_ms: 200, \
     ping_interval_ms: 500, pong_timeout_ms: 1000 }";

/// B listens; A reaches it only through the proxy; both have queue `q`.
fn start_behind_proxy(s: &Scratch) -> (NodeProcess, NodeProcess, FaultProxy) {
    let b_yaml = format!(
        "node: {{ name: B, listen: 127.0.0.1:0 }}\npeers: [ {{ name: A }} ]\nqueues: [ {{ name: q, order: fifo }} ]\n{FAST_LINKS}\n"
    );
    let b = s.start_node("B", &["-c", s.write("b.yaml", &b_yaml).to_str().unwrap()]);
    let proxy = FaultProxy::start(&b.listen_address());
    let a_yaml = format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '{}' }} ]\nqueues: [ {{ name: q, order: fifo }} ]\n{FAST_LINKS}\n",
        proxy.address
    );
    let a = s.start_node("A", &["-c", s.write("a.yaml", &a_yaml).to_str().unwrap()]);
    a.wait_for_log("Link up.", 1, Duration::from_secs(10));
    (a, b, proxy)
}

fn get_all(s: &Scratch, node: &str, count: usize, within: Duration) -> String {
    let deadline = Instant::now() + within;
    let mut text = String::new();
    while text.lines().count() < count && Instant::now() < deadline {
        let left = (count - text.lines().count()).to_string();
        let out = s.run(&["get", "--node", node, "q", "--count", &left, "--wait", "1s"]);
        text.push_str(&stdout(&out));
    }
    text
}

#[test]
fn repeated_cuts_lose_nothing_and_duplicate_nothing() {
    let s = Scratch::new();
    let (a, _b, proxy) = start_behind_proxy(&s);
    let lines: String = (0..30_000).map(|i| format!("m{i}\n")).collect();
    let producer = {
        let mut child = s
            .command(&["put", "--node", "A", "--to", "B:q", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let data = lines.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            for chunk in data.as_bytes().chunks(16 * 1024) {
                stdin.write_all(chunk).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        child
    };
    for _ in 0..15 {
        std::thread::sleep(Duration::from_millis(60));
        proxy.cut();
    }
    let out = producer.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let got = get_all(&s, "B", 30_000, Duration::from_secs(60));
    assert_eq!(got.lines().count(), 30_000, "nothing lost");
    assert!(got == lines, "every message once, in order");
    assert!(a.log_text().matches("Link up.").count() > 3, "the link really was cut:\n{}", a.log_text());
}

#[test]
fn large_backlogs_both_ways_recover_after_a_blackout() {
    let s = Scratch::new();
    let (_a, _b, proxy) = start_behind_proxy(&s);
    proxy.set_blackhole(true);
    let payload = "x".repeat(30_000);
    let lines: String = (0..1300).map(|i| format!("{i:04}{payload}\n")).collect();
    for (node, to) in [("A", "B:q"), ("B", "A:q")] {
        let out = s.run_with_input(
            &["put", "--node", node, "--to", to, "-"],
            lines.as_bytes(),
            Duration::from_secs(60),
        );
        assert!(out.status.success(), "{}", stderr(&out));
    }
    std::thread::sleep(Duration::from_secs(2));
    proxy.set_blackhole(false);
    proxy.cut();
    for node in ["A", "B"] {
        let got = get_all(&s, node, 1300, Duration::from_secs(60));
        assert_eq!(got.lines().count(), 1300, "node {node} got everything");
        assert!(got == lines, "node {node}: once each, in order");
    }
}
