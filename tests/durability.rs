//! Durability with the default `fjall` store, on real processes: persistent messages in a
//! local queue survive `kill -9` in order and volatile ones do not; a restart with a queue
//! limit lowered below what the queue holds is refused with the numbers.

mod support;

use std::time::Duration;

use support::{Scratch, stderr, stdout};

#[test]
fn persistent_messages_survive_kill_9_and_volatile_ones_do_not() {
    let s = Scratch::new();
    let config = s.write("a.yaml", "node: { name: A, listen: none }\nqueues: [ { name: q, order: fifo } ]\n");
    let config = config.to_str().unwrap();
    let mut a = s.start_node("A", &["-c", config]);
    let lines: String = (1..=500).map(|n| format!("p{n}\n")).collect();
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "A:q", "--persistent", "-"],
        lines.as_bytes(),
        Duration::from_secs(60),
    );
    assert!(put.status.success(), "{}", stderr(&put));
    let volatile: String = (1..=100).map(|n| format!("v{n}\n")).collect();
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "A:q", "--volatile", "-"],
        volatile.as_bytes(),
        Duration::from_secs(60),
    );
    assert!(put.status.success(), "{}", stderr(&put));
    a.kill();

    let mut a = s.start_node("A", &["-c", config]);
    let status = stdout(&s.run(&["status", "--node", "A"]));
    assert!(status.contains("store: fjall (durable: true)"), "{status}");
    let get = s.run(&["get", "--node", "A", "q", "--count", "1000", "--wait", "1s"]);
    assert_eq!(stdout(&get), lines, "every persistent message, in order, and no volatile one");

    // A limit lowered below what the queue holds: the node refuses to start and says why.
    let three = s.run_with_input(
        &["put", "--node", "A", "--to", "A:q", "--persistent", "-"],
        b"x\ny\nz\n",
        Duration::from_secs(10),
    );
    assert!(three.status.success(), "{}", stderr(&three));
    a.kill();
    let lowered = s.write(
        "a2.yaml",
        "node: { name: A, listen: none }\nqueues: [ { name: q, order: fifo, queue_messages_max: 2 } ]\n",
    );
    let refused = s.run(&["node", "run", "-c", lowered.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("queue 'q' holds 3 messages, more than its queue_messages_max 2"),
        "{}",
        stderr(&refused)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A streams persistent messages to B's queue while B is killed with SIGKILL and restarted,
/// again and again: B's store keeps each message with the link number after it, so A resends
/// exactly what B did not keep.
#[test]
fn a_receiver_killed_again_and_again_loses_and_duplicates_nothing() {
    let s = Scratch::new();
    let (a_key, b_key) = (s.keys("A"), s.keys("B"));
    let port = free_port();
    let b_yaml = format!(
        "node: {{ name: B, listen: '127.0.0.1:{port}' }}\npeers: [ {{ name: A, public_key: '{a_key}' }} ]\n\
         queues: [ {{ name: q, order: fifo }} ]\n{}\n",
        s.security_yaml("B")
    );
    let b_config = s.write("b.yaml", &b_yaml);
    let b_args = ["-c", b_config.to_str().unwrap()];
    let mut b = s.start_node("B", &b_args);
    let a_yaml = format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '127.0.0.1:{port}', public_key: '{b_key}' }} ]\n\
         links: {{ reconnect_backoff_min_ms: 20, reconnect_backoff_max_ms: 200 }}\n{}\n",
        s.security_yaml("A")
    );
    let a = s.start_node("A", &["-c", s.write("a.yaml", &a_yaml).to_str().unwrap()]);
    a.wait_for_log("Link up.", 1, Duration::from_secs(10));

    let lines: String = (0..3000).map(|i| format!("{i:05} {}\n", "p".repeat(100))).collect();
    let mut put = s
        .command(&["put", "--node", "A", "--to", "B:q", "--persistent", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = put.stdin.take().unwrap();
    let data = lines.clone();
    let feeder = std::thread::spawn(move || {
        use std::io::Write;
        for chunk in data.as_bytes().chunks(8 * 1024) {
            stdin.write_all(chunk).unwrap();
            std::thread::sleep(Duration::from_millis(15));
        }
    });
    let mut kills = 0;
    // Some kills come right after the restart, while B recovers and A resends.
    for pause in [150u64, 0, 330, 90, 0, 260, 410, 0, 200] {
        std::thread::sleep(Duration::from_millis(pause));
        b.kill();
        kills += 1;
        b = s.start_node("B", &b_args);
    }
    feeder.join().unwrap();
    let out = put.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut got = String::new();
    while got.lines().count() < 3000 && std::time::Instant::now() < deadline {
        let left = (3000 - got.lines().count()).to_string();
        got.push_str(&stdout(&s.run(&["get", "--node", "B", "q", "--count", &left, "--wait", "1s"])));
    }
    // Whatever is left over would be a duplicate.
    got.push_str(&stdout(&s.run(&["get", "--node", "B", "q", "--count", "100000", "--wait", "500ms"])));
    let sent: Vec<&str> = lines.lines().collect();
    let received: Vec<&str> = got.lines().collect();
    let history = support::history::History::check(&sent, &received);
    eprintln!("{kills} kills of B: {history:?}");
    assert!(history.is_clean(), "{kills} kills of B: {history:?}");
    assert!(b.log_text().contains("Link numbers restored"), "{}", b.log_text());
}

/// The same, made certain: B keeps what arrives but acknowledges nothing (a test-only switch),
/// so when it is killed A still waits on every message; restarted, B tells A where it stopped
/// and nothing comes twice.
#[test]
fn a_restarted_receiver_takes_up_its_numbers_so_nothing_it_kept_comes_twice() {
    let s = Scratch::new();
    let (a_key, b_key) = (s.keys("A"), s.keys("B"));
    let port = free_port();
    let b_yaml = format!(
        "node: {{ name: B, listen: '127.0.0.1:{port}' }}\npeers: [ {{ name: A, public_key: '{a_key}' }} ]\n\
         queues: [ {{ name: q, order: fifo }} ]\n{}\n",
        s.security_yaml("B")
    );
    let b_config = s.write("b.yaml", &b_yaml);
    let b_args = ["-c", b_config.to_str().unwrap()];
    let mut b = s.start_node_env("B", &b_args, &[("LINKBUS_TEST_HOLD_ACKS", "1")]);
    let a_yaml = format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '127.0.0.1:{port}', public_key: '{b_key}' }} ]\n\
         links: {{ reconnect_backoff_min_ms: 20, reconnect_backoff_max_ms: 200 }}\n{}\n",
        s.security_yaml("A")
    );
    let a = s.start_node("A", &["-c", s.write("a.yaml", &a_yaml).to_str().unwrap()]);
    a.wait_for_log("Link up.", 1, Duration::from_secs(10));
    let lines: String = (0..200).map(|i| format!("m{i:03}\n")).collect();
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "B:q", "--persistent", "-"],
        lines.as_bytes(),
        Duration::from_secs(30),
    );
    assert!(put.status.success(), "{}", stderr(&put));
    // All 200 are in B's queue, none acknowledged to A.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let depth = || {
        let text = stdout(&s.run(&["queue", "ls", "--node", "B"]));
        let line = text.lines().find(|l| l.starts_with("q ")).map(str::to_owned).unwrap_or_default();
        line.split_whitespace().nth(2).and_then(|d| d.parse::<u32>().ok()).unwrap_or(0)
    };
    while depth() < 200 {
        assert!(std::time::Instant::now() < deadline, "{}", stdout(&s.run(&["queue", "ls", "--node", "B"])));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(stdout(&s.run(&["status", "--node", "A"])).contains("acked 0"), "A still waits on them");
    b.kill();
    let _b = s.start_node("B", &b_args);
    a.wait_for_log("Link up.", 2, Duration::from_secs(10));
    let got = stdout(&s.run(&["get", "--node", "B", "q", "--count", "1000", "--wait", "2s"]));
    let sent: Vec<&str> = lines.lines().collect();
    let history = support::history::History::check(&sent, &got.lines().collect::<Vec<_>>());
    assert!(history.is_clean(), "each once, in order: {history:?}");
}

/// A sender killed with persistent messages still waiting for its peer — some never handed
/// to the link (the peer was down), some sent into a black hole and never acknowledged —
/// delivers each exactly once after it restarts: its queue and what it had sent were
/// recorded, under the same incarnation and numbers.
#[test]
fn a_killed_sender_delivers_what_waited_for_its_peer_once_after_restart() {
    let s = Scratch::new();
    let (a_key, b_key) = (s.keys("A"), s.keys("B"));
    let b_port = free_port();
    let b_yaml = format!(
        "node: {{ name: B, listen: '127.0.0.1:{b_port}' }}\npeers: [ {{ name: A, public_key: '{a_key}' }} ]\n\
         queues: [ {{ name: q, order: fifo }} ]\n{}\n",
        s.security_yaml("B")
    );
    let b_config = s.write("b.yaml", &b_yaml);
    let proxy = support::proxy::FaultProxy::start(&format!("127.0.0.1:{b_port}"));
    let a_yaml = format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '{}', public_key: '{b_key}' }} ]\n\
         links: {{ reconnect_backoff_min_ms: 20, reconnect_backoff_max_ms: 200, ping_interval_ms: 300, pong_timeout_ms: 600 }}\n{}\n",
        proxy.address,
        s.security_yaml("A")
    );
    let a_config = s.write("a.yaml", &a_yaml);
    let a_args = ["-c", a_config.to_str().unwrap()];
    let put = |a_lines: &str| {
        let out = s.run_with_input(
            &["put", "--node", "A", "--to", "B:q", "--persistent", "-"],
            a_lines.as_bytes(),
            Duration::from_secs(30),
        );
        assert!(out.status.success(), "{}", stderr(&out));
    };

    // B is down: 300 persistent messages wait in A's transmission queue; A is killed.
    let mut a = s.start_node("A", &a_args);
    let first: String = (0..300).map(|i| format!("first{i:03}\n")).collect();
    put(&first);
    a.kill();
    let mut a = s.start_node("A", &a_args);
    let _b = s.start_node("B", &["-c", b_config.to_str().unwrap()]);
    a.wait_for_log("Link up.", 1, Duration::from_secs(10));

    // The link goes black: the next 100 are sent into it, never acknowledged; A is killed.
    proxy.set_blackhole(true);
    let second: String = (0..100).map(|i| format!("second{i:03}\n")).collect();
    put(&second);
    std::thread::sleep(Duration::from_millis(300));
    a.kill();
    let a = s.start_node("A", &a_args);
    assert!(a.log_text().contains("taken up"), "{}", a.log_text());
    proxy.set_blackhole(false);
    proxy.cut();

    let all = format!("{first}{second}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut got = String::new();
    while got.lines().count() < 400 && std::time::Instant::now() < deadline {
        let left = (400 - got.lines().count()).to_string();
        got.push_str(&stdout(&s.run(&["get", "--node", "B", "q", "--count", &left, "--wait", "1s"])));
    }
    got.push_str(&stdout(&s.run(&["get", "--node", "B", "q", "--count", "1000", "--wait", "500ms"])));
    let sent: Vec<&str> = all.lines().collect();
    let history = support::history::History::check(&sent, &got.lines().collect::<Vec<_>>());
    assert!(history.is_clean(), "{history:?}");
}

/// A killed again and again while it streams persistent messages to B (killed right after a
/// put returns, so messages are queued, in flight or just acknowledged): B gets each once, in
/// order.
#[test]
fn a_sender_killed_again_and_again_loses_and_duplicates_nothing() {
    let s = Scratch::new();
    let (a_key, b_key) = (s.keys("A"), s.keys("B"));
    let b_port = free_port();
    let b_yaml = format!(
        "node: {{ name: B, listen: '127.0.0.1:{b_port}' }}\npeers: [ {{ name: A, public_key: '{a_key}' }} ]\n\
         queues: [ {{ name: q, order: fifo }} ]\n{}\n",
        s.security_yaml("B")
    );
    let _b = s.start_node("B", &["-c", s.write("b.yaml", &b_yaml).to_str().unwrap()]);
    let a_yaml = format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '127.0.0.1:{b_port}', public_key: '{b_key}' }} ]\n\
         links: {{ reconnect_backoff_min_ms: 20, reconnect_backoff_max_ms: 200 }}\n{}\n",
        s.security_yaml("A")
    );
    let a_config = s.write("a.yaml", &a_yaml);
    let a_args = ["-c", a_config.to_str().unwrap()];
    let mut a = s.start_node("A", &a_args);
    let mut all = String::new();
    let mut kills = 0;
    for chunk in 0..20 {
        let lines: String = (0..100).map(|i| format!("c{chunk:02}m{i:03} {}\n", "x".repeat(200))).collect();
        let put = s.run_with_input(
            &["put", "--node", "A", "--to", "B:q", "--persistent", "-"],
            lines.as_bytes(),
            Duration::from_secs(30),
        );
        assert!(put.status.success(), "chunk {chunk}: {}", stderr(&put));
        all.push_str(&lines);
        if chunk % 4 == 3 {
            a.kill();
            kills += 1;
            a = s.start_node("A", &a_args);
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut got = String::new();
    while got.lines().count() < 2000 && std::time::Instant::now() < deadline {
        let left = (2000 - got.lines().count()).to_string();
        got.push_str(&stdout(&s.run(&["get", "--node", "B", "q", "--count", &left, "--wait", "1s"])));
    }
    got.push_str(&stdout(&s.run(&["get", "--node", "B", "q", "--count", "100000", "--wait", "500ms"])));
    let sent: Vec<&str> = all.lines().collect();
    let history = support::history::History::check(&sent, &got.lines().collect::<Vec<_>>());
    eprintln!("{kills} kills of A: {history:?}");
    assert!(history.is_clean(), "{kills} kills of A: {history:?}");
}

/// Both nodes killed at once while persistent messages flow, restarted in one order and then
/// in the other: each message arrives once, in order.
#[test]
fn both_nodes_killed_at_once_and_restarted_in_either_order_lose_nothing() {
    let s = Scratch::new();
    let (a_key, b_key) = (s.keys("A"), s.keys("B"));
    let b_port = free_port();
    let b_yaml = format!(
        "node: {{ name: B, listen: '127.0.0.1:{b_port}' }}\npeers: [ {{ name: A, public_key: '{a_key}' }} ]\n\
         queues: [ {{ name: q, order: fifo }} ]\n{}\n",
        s.security_yaml("B")
    );
    let b_config = s.write("b.yaml", &b_yaml);
    let b_args = ["-c", b_config.to_str().unwrap()];
    let a_yaml = format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '127.0.0.1:{b_port}', public_key: '{b_key}' }} ]\n\
         links: {{ reconnect_backoff_min_ms: 20, reconnect_backoff_max_ms: 200 }}\n{}\n",
        s.security_yaml("A")
    );
    let a_config = s.write("a.yaml", &a_yaml);
    let a_args = ["-c", a_config.to_str().unwrap()];
    let mut b = s.start_node("B", &b_args);
    let mut a = s.start_node("A", &a_args);
    let mut all = String::new();
    for chunk in 0..12 {
        let lines: String = (0..100).map(|i| format!("c{chunk:02}m{i:03}\n")).collect();
        let put = s.run_with_input(
            &["put", "--node", "A", "--to", "B:q", "--persistent", "-"],
            lines.as_bytes(),
            Duration::from_secs(30),
        );
        assert!(put.status.success(), "chunk {chunk}: {}", stderr(&put));
        all.push_str(&lines);
        if chunk == 4 || chunk == 8 {
            a.kill();
            b.kill();
            if chunk == 4 {
                b = s.start_node("B", &b_args);
                a = s.start_node("A", &a_args);
            } else {
                a = s.start_node("A", &a_args);
                b = s.start_node("B", &b_args);
            }
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut got = String::new();
    while got.lines().count() < 1200 && std::time::Instant::now() < deadline {
        let left = (1200 - got.lines().count()).to_string();
        got.push_str(&stdout(&s.run(&["get", "--node", "B", "q", "--count", &left, "--wait", "1s"])));
    }
    got.push_str(&stdout(&s.run(&["get", "--node", "B", "q", "--count", "100000", "--wait", "500ms"])));
    let sent: Vec<&str> = all.lines().collect();
    let history = support::history::History::check(&sent, &got.lines().collect::<Vec<_>>());
    assert!(history.is_clean(), "{history:?}");
    drop((a, b));
}

/// Volatile messages across receiver crashes: some may be lost (they live in memory), but
/// none comes twice and the order holds.
#[test]
fn volatile_messages_across_receiver_crashes_may_be_lost_but_never_duplicated() {
    let s = Scratch::new();
    let (a_key, b_key) = (s.keys("A"), s.keys("B"));
    let port = free_port();
    let b_yaml = format!(
        "node: {{ name: B, listen: '127.0.0.1:{port}' }}\npeers: [ {{ name: A, public_key: '{a_key}' }} ]\n\
         queues: [ {{ name: q, order: fifo }} ]\n{}\n",
        s.security_yaml("B")
    );
    let b_config = s.write("b.yaml", &b_yaml);
    let b_args = ["-c", b_config.to_str().unwrap()];
    let mut b = s.start_node("B", &b_args);
    let a_yaml = format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '127.0.0.1:{port}', public_key: '{b_key}' }} ]\n\
         links: {{ reconnect_backoff_min_ms: 20, reconnect_backoff_max_ms: 200 }}\n{}\n",
        s.security_yaml("A")
    );
    let _a = s.start_node("A", &["-c", s.write("a.yaml", &a_yaml).to_str().unwrap()]);
    let mut all = String::new();
    let mut got = String::new();
    for chunk in 0..10 {
        let lines: String = (0..200).map(|i| format!("c{chunk:02}m{i:03}\n")).collect();
        let put = s.run_with_input(
            &["put", "--node", "A", "--to", "B:q", "--volatile", "-"],
            lines.as_bytes(),
            Duration::from_secs(30),
        );
        assert!(put.status.success(), "chunk {chunk}: {}", stderr(&put));
        all.push_str(&lines);
        // Take some now (a consumer that got them before the crash must not see them again).
        got.push_str(&stdout(&s.run(&["get", "--node", "B", "q", "--count", "150", "--wait", "300ms"])));
        if chunk % 3 == 1 {
            b.kill();
            b = s.start_node("B", &b_args);
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    got.push_str(&stdout(&s.run(&["get", "--node", "B", "q", "--count", "100000", "--wait", "1s"])));
    let sent: Vec<&str> = all.lines().collect();
    let history = support::history::History::check(&sent, &got.lines().collect::<Vec<_>>());
    eprintln!("volatile across 3 receiver crashes: {history:?}");
    assert_eq!((history.duplicated, history.reordered, history.corrupted), (0, 0, 0), "{history:?}");
}
