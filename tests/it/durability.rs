//! Durability with the default `fjall` store, on real processes killed with SIGKILL:
//! persistent messages in a local queue survive in order and volatile ones do not; a lowered
//! queue limit refuses a restart with the numbers; receivers, senders and both at once killed
//! again and again (also while they recover) lose and duplicate no persistent message; and
//! volatile messages may be lost across a receiver crash but never come twice (their
//! numbers are not recorded: the sender sends them again as skips).

use crate::support;

use std::time::Duration;

use support::history::History;
use support::soak::{Soak, soak_payload_len};
use support::{NodeProcess, Scratch, free_port, stderr, stdout};

#[test]
fn persistent_messages_survive_kill_9_and_volatile_ones_do_not() {
    let s = Scratch::new();
    let config = s.write("a.yaml", "node: { name: A, listen: none }\nqueues: [ { name: q, order: fifo } ]\n");
    let config = config.to_str().unwrap();
    let mut a = s.start_node("A", &["-c", config]);
    let lines: String = (1..=500).map(|n| format!("p{n}\n")).collect();
    put_lines(&s, "A:q", &lines, "--persistent");
    let volatile: String = (1..=100).map(|n| format!("v{n}\n")).collect();
    put_lines(&s, "A:q", &volatile, "--volatile");
    a.kill();

    let mut a = s.start_node("A", &["-c", config]);
    let status = stdout(&s.run(&["status", "--node", "A"]));
    assert!(status.contains("store: fjall (durable: true)"), "{status}");
    let get = s.run(&["get", "--node", "A", "q", "--count", "1000", "--wait", "1s"]);
    assert_eq!(stdout(&get), lines, "every persistent message, in order, and no volatile one");

    // A limit lowered below what the queue holds: the node refuses to start and says why.
    put_lines(&s, "A:q", "x\ny\nz\n", "--persistent");
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

/// The same on the `log` store, with segments of 1 MiB so the messages span several, and
/// after a second kill with the queue half taken (some segments wholly taken and deleted).
#[test]
fn persistent_messages_survive_kill_9_on_the_log_store() {
    let s = Scratch::new();
    let config = s.write(
        "a.yaml",
        "node: { name: A, listen: none }\nqueues: [ { name: q, order: fifo } ]\n\
         plugins: { store: { kind: log, segment_mib: 1 } }\n",
    );
    let config = config.to_str().unwrap();
    let mut a = s.start_node("A", &["-c", config]);
    let lines: String = (1..=3000).map(|n| format!("p{n:04} {}\n", "x".repeat(1000))).collect();
    put_lines(&s, "A:q", &lines, "--persistent");
    put_lines(&s, "A:q", "v1\nv2\n", "--volatile");
    a.kill();

    let mut a = s.start_node("A", &["-c", config]);
    let status = stdout(&s.run(&["status", "--node", "A"]));
    assert!(status.contains("store: log (durable: true)"), "{status}");
    let first = stdout(&s.run(&["get", "--node", "A", "q", "--count", "1500", "--wait", "1s"]));
    let (taken, kept) = lines.split_at(lines.match_indices('\n').nth(1499).unwrap().0 + 1);
    assert_eq!(first, taken, "the persistent messages, in order, and no volatile one");
    a.kill();

    let segments = || {
        let dir = std::fs::read_dir(s.path().join("linkbus-data/A/log")).unwrap();
        dir.filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".log")).count()
    };
    let before = segments();
    let _a = s.start_node("A", &["-c", config]);
    let rest = stdout(&s.run(&["get", "--node", "A", "q", "--count", "3000", "--wait", "1s"]));
    assert_eq!(rest, kept, "what was taken stays taken; the rest survives a second kill");
    assert!(before >= 3, "the messages span several segments ({before})");
    assert!(segments() < before, "taken messages' segments are deleted ({before} → {})", segments());
}

/// Configuration files of a pair over Noise, so each node can be killed and started again
/// with the same ones: B listens on a fixed port with queue `q`; A dials B (at
/// `b_address`, B's own or a proxy's) and reconnects fast.
struct Pair {
    a: String,
    b: String,
}

impl Pair {
    fn new(s: &Scratch, a_links: &str) -> Self {
        Self::through(s, a_links, |b_listen| b_listen.to_owned())
    }

    /// Like [`Pair::new`], both nodes on the store plugin `store`.
    fn on(s: &Scratch, store: &str) -> Self {
        Self::through_on(s, "", |b_listen| b_listen.to_owned(), store)
    }

    /// Like [`Pair::new`], A dialing the address `via` makes of B's.
    fn through(s: &Scratch, a_links: &str, via: impl FnOnce(&str) -> String) -> Self {
        Self::through_on(s, a_links, via, "fjall")
    }

    fn through_on(s: &Scratch, a_links: &str, via: impl FnOnce(&str) -> String, store: &str) -> Self {
        let (a_key, b_key) = (s.keys("A"), s.keys("B"));
        let b_listen = format!("127.0.0.1:{}", free_port());
        let plugins = format!("plugins: {{ store: {{ kind: {store} }} }}");
        let b_yaml = format!(
            "node: {{ name: B, listen: '{b_listen}' }}\npeers: [ {{ name: A, public_key: '{a_key}' }} ]\n\
             queues: [ {{ name: q, order: fifo }} ]\n{plugins}\n{}\n",
            s.security_yaml("B")
        );
        let a_yaml = format!(
            "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '{}', public_key: '{b_key}' }} ]\n\
             links: {{ reconnect_backoff_min_ms: 20, reconnect_backoff_max_ms: 200{a_links} }}\n{plugins}\n{}\n",
            via(&b_listen),
            s.security_yaml("A")
        );
        let path = |name: &str, yaml: &str| s.write(name, yaml).to_str().unwrap().to_owned();
        Self { a: path("a.yaml", &a_yaml), b: path("b.yaml", &b_yaml) }
    }

    fn start_a(&self, s: &Scratch) -> NodeProcess {
        s.start_node("A", &["-c", &self.a])
    }

    fn start_b(&self, s: &Scratch) -> NodeProcess {
        s.start_node("B", &["-c", &self.b])
    }
}

/// Puts `lines` on A for `to`, with `reliability` (`--persistent` or `--volatile`).
pub(crate) fn put_lines(s: &Scratch, to: &str, lines: &str, reliability: &str) {
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", to, reliability, "-"],
        lines.as_bytes(),
        Duration::from_secs(30),
    );
    assert!(put.status.success(), "{}", stderr(&put));
}

/// Takes `count` messages from `B:q` (bounded in time), then whatever is left over — which
/// would be a duplicate.
fn take_from_b(s: &Scratch, count: usize) -> String {
    s.take_all("B", "q", count, Duration::from_secs(60))
}

fn history(sent: &str, got: &str) -> History {
    History::check(&sent.lines().collect::<Vec<_>>(), &got.lines().collect::<Vec<_>>())
}

/// A streams persistent messages to B's queue while B is killed with SIGKILL and restarted,
/// again and again: B's store keeps each message with the link number after it, so A resends
/// exactly what B did not keep.
#[test]
fn a_receiver_killed_again_and_again_loses_and_duplicates_nothing() {
    let s = Scratch::new();
    let pair = Pair::new(&s, "");
    let mut b = pair.start_b(&s);
    let a = pair.start_a(&s);
    a.wait_for_log("Link up.", 1, Duration::from_secs(10));

    let lines: String = (0..3000).map(|i| format!("{i:05} {}\n", "p".repeat(100))).collect();
    let put = s.put_streaming(
        &["put", "--node", "A", "--to", "B:q", "--persistent", "-"],
        &lines,
        8 * 1024,
        Duration::from_millis(15),
    );
    let mut kills = 0;
    // Some kills come right after the restart, while B recovers and A resends.
    for pause in [150u64, 0, 330, 90, 0, 260, 410, 0, 200] {
        std::thread::sleep(Duration::from_millis(pause));
        b.kill();
        kills += 1;
        b = pair.start_b(&s);
    }
    put.finish();

    let history = history(&lines, &take_from_b(&s, 3000));
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
    let pair = Pair::new(&s, "");
    let mut b = s.start_node_env("B", &["-c", &pair.b], &[("LINKBUS_TEST_HOLD_ACKS", "1")]);
    let a = pair.start_a(&s);
    a.wait_for_log("Link up.", 1, Duration::from_secs(10));
    let lines: String = (0..200).map(|i| format!("m{i:03}\n")).collect();
    put_lines(&s, "B:q", &lines, "--persistent");
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
    let _b = pair.start_b(&s);
    a.wait_for_log("Link up.", 2, Duration::from_secs(10));
    let got = stdout(&s.run(&["get", "--node", "B", "q", "--count", "1000", "--wait", "2s"]));
    let history = history(&lines, &got);
    assert!(history.is_clean(), "each once, in order: {history:?}");
}

/// A sender killed with persistent messages still waiting for its peer — some never handed
/// to the link (the peer was down), some sent into a black hole and never acknowledged —
/// delivers each exactly once after it restarts: its queue and what it had sent were
/// recorded, under the same incarnation and numbers.
#[test]
fn a_killed_sender_delivers_what_waited_for_its_peer_once_after_restart() {
    let s = Scratch::new();
    let mut proxy = None;
    let pair = Pair::through(&s, ", ping_interval_ms: 300, pong_timeout_ms: 600", |b_listen| {
        let started = support::proxy::FaultProxy::start(b_listen);
        let address = started.address.clone();
        proxy = Some(started);
        address
    });
    let proxy = proxy.expect("started");

    // B is down: 300 persistent messages wait in A's transmission queue; A is killed.
    let mut a = pair.start_a(&s);
    let first: String = (0..300).map(|i| format!("first{i:03}\n")).collect();
    put_lines(&s, "B:q", &first, "--persistent");
    a.kill();
    let mut a = pair.start_a(&s);
    let _b = pair.start_b(&s);
    a.wait_for_log("Link up.", 1, Duration::from_secs(10));

    // The link goes black: the next 100 are sent into it, never acknowledged; A is killed.
    proxy.set_blackhole(true);
    let second: String = (0..100).map(|i| format!("second{i:03}\n")).collect();
    put_lines(&s, "B:q", &second, "--persistent");
    std::thread::sleep(Duration::from_millis(300));
    a.kill();
    let a = pair.start_a(&s);
    assert!(a.log_text().contains("taken up"), "{}", a.log_text());
    proxy.set_blackhole(false);
    proxy.cut();

    let history = history(&format!("{first}{second}"), &take_from_b(&s, 400));
    assert!(history.is_clean(), "{history:?}");
}

/// A killed again and again while it streams persistent messages to B (killed right after a
/// put returns, so messages are queued, in flight or just acknowledged): B gets each once, in
/// order.
#[test]
fn a_sender_killed_again_and_again_loses_and_duplicates_nothing() {
    let s = Scratch::new();
    let pair = Pair::new(&s, "");
    let _b = pair.start_b(&s);
    let mut a = pair.start_a(&s);
    let mut all = String::new();
    let mut kills = 0;
    for chunk in 0..20 {
        let lines: String = (0..100).map(|i| format!("c{chunk:02}m{i:03} {}\n", "x".repeat(200))).collect();
        put_lines(&s, "B:q", &lines, "--persistent");
        all.push_str(&lines);
        if chunk % 4 == 3 {
            a.kill();
            kills += 1;
            a = pair.start_a(&s);
        }
    }
    let history = history(&all, &take_from_b(&s, 2000));
    eprintln!("{kills} kills of A: {history:?}");
    assert!(history.is_clean(), "{kills} kills of A: {history:?}");
}

/// Both nodes killed at once while persistent messages flow, restarted in one order and then
/// in the other: each message arrives once, in order.
#[test]
fn both_nodes_killed_at_once_and_restarted_in_either_order_lose_nothing() {
    let s = Scratch::new();
    let pair = Pair::new(&s, "");
    let mut b = pair.start_b(&s);
    let mut a = pair.start_a(&s);
    let mut all = String::new();
    for chunk in 0..12 {
        let lines: String = (0..100).map(|i| format!("c{chunk:02}m{i:03}\n")).collect();
        put_lines(&s, "B:q", &lines, "--persistent");
        all.push_str(&lines);
        if chunk == 4 || chunk == 8 {
            a.kill();
            b.kill();
            if chunk == 4 {
                b = pair.start_b(&s);
                a = pair.start_a(&s);
            } else {
                a = pair.start_a(&s);
                b = pair.start_b(&s);
            }
        }
    }
    let history = history(&all, &take_from_b(&s, 1200));
    assert!(history.is_clean(), "{history:?}");
    drop((a, b));
}

/// Volatile messages across receiver crashes: some may be lost (they live in memory), but
/// none comes twice and the order holds.
#[test]
fn volatile_messages_across_receiver_crashes_may_be_lost_but_never_duplicated() {
    let s = Scratch::new();
    let pair = Pair::new(&s, "");
    let mut b = pair.start_b(&s);
    let _a = pair.start_a(&s);
    let mut all = String::new();
    let mut got = String::new();
    for chunk in 0..10 {
        let lines: String = (0..200).map(|i| format!("c{chunk:02}m{i:03}\n")).collect();
        put_lines(&s, "B:q", &lines, "--volatile");
        all.push_str(&lines);
        // Take some now (a consumer that got them before the crash must not see them again).
        got.push_str(&stdout(&s.run(&["get", "--node", "B", "q", "--count", "150", "--wait", "300ms"])));
        if chunk % 3 == 1 {
            b.kill();
            b = pair.start_b(&s);
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    got.push_str(&stdout(&s.run(&["get", "--node", "B", "q", "--count", "100000", "--wait", "1s"])));
    let history = history(&all, &got);
    eprintln!("volatile across 3 receiver crashes: {history:?}");
    assert_eq!((history.duplicated, history.reordered, history.corrupted), (0, 0, 0), "{history:?}");
}

/// A puts one persistent message and 50 volatile ones to B:q, B's client takes them, and
/// B's acknowledgement of all 51 reaches A (else A would still hold the volatile ones and
/// send them again as they are, not as skips).
fn one_persistent_then_fifty_volatile_acknowledged(s: &Scratch) {
    put_lines(s, "B:q", "p1\n", "--persistent");
    let volatile: String = (1..=50).map(|n| format!("v{n}\n")).collect();
    put_lines(s, "B:q", &volatile, "--volatile");
    assert_eq!(take_from_b(s, 51), format!("p1\n{volatile}"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !stdout(&s.run(&["status", "--node", "A"])).contains("acked 51,") {
        assert!(std::time::Instant::now() < deadline, "A never heard B acknowledge all 51");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A receiver does not record the numbers of volatile messages (only those of persistent
/// ones, synced), so when it restarts it expects numbers it had acknowledged: its sender,
/// which knows they were volatile, sends them again as skips — nothing delivered twice, no
/// link stopped (a receiver that lost a persistent message's number has gone backwards and
/// is refused: `tests/it/link_reset.rs`).
#[test]
fn a_receiver_restarted_behind_volatile_numbers_gets_them_as_skips() {
    let s = Scratch::new();
    let pair = Pair::new(&s, "");
    let mut b = pair.start_b(&s);
    let a = pair.start_a(&s);
    one_persistent_then_fifty_volatile_acknowledged(&s);
    b.kill();

    let mut b = pair.start_b(&s);
    a.wait_for_log("they go again as skips", 1, Duration::from_secs(20));
    assert!(a.log_text().contains("lost_by_peer=50"), "{}", a.log_text());
    put_lines(&s, "B:q", "p2\n", "--persistent");
    assert_eq!(take_from_b(&s, 1), "p2\n", "the link goes on, nothing comes twice");
    b.kill();
    drop(a);
}

/// The origin keeps the results of persistent messages in its store: killed while its
/// messages wait for a peer that is down, it still reports them after the restart — one
/// delivered once the peer is back, one failed because its lifetime ran out while the
/// origin was down — and still knows them after another restart.
#[test]
fn results_of_persistent_messages_survive_the_origins_restarts() {
    let s = Scratch::new();
    let pair = Pair::new(&s, "");
    let mut a = pair.start_a(&s);
    let put = |lifetime: &str, text: &str| {
        let out = s.run(&[
            "put",
            "--node",
            "A",
            "--to",
            "B:q",
            "--persistent",
            "--results",
            "--lifetime",
            lifetime,
            text,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).trim().to_owned()
    };
    let (kept, short) = (put("1h", "kept"), put("2s", "short"));
    a.kill();
    std::thread::sleep(Duration::from_millis(2500));
    let b = pair.start_b(&s);
    let mut a = pair.start_a(&s);
    let results = stdout(&s.run(&["result", "--node", "A", "--wait", "20s", &kept, &short]));
    let lines: Vec<&str> = results.lines().collect();
    assert_eq!(lines.len(), 2, "{results}");
    assert_eq!(lines[0], format!("{kept} B:q delivered"), "{results}");
    assert!(lines[1].starts_with(&format!("{short} B:q failed expired_before_sending")), "{results}");
    assert_eq!(take_from_b(&s, 1), "kept\n");
    let events = stdout(&s.run(&["events", "--node", "A"]));
    assert_eq!(events.lines().filter(|l| l.contains(" result message ")).count(), 2, "{events}");

    a.kill();
    let _a = pair.start_a(&s);
    let again = stdout(&s.run(&["result", "--node", "A", &kept, &short]));
    assert_eq!(again, results, "finished results are kept too");
    drop(b);
}

/// Random kills, briefly: 8 cycles of [`random_kills_of_either_node`] in every test run.
#[test]
fn random_kills_of_either_node_lose_and_duplicate_nothing() {
    random_kills_of_either_node(&mut Soak::new(8), "fjall");
}

/// The same on the `log` store.
#[test]
fn random_kills_of_either_node_on_the_log_store_lose_and_duplicate_nothing() {
    random_kills_of_either_node(&mut Soak::new(8), "log");
}

/// The same as a soak, for the record (`cargo test --test durability soak -- --ignored
/// --nocapture`; `LINKBUS_SOAK_CYCLES`, default 300, `LINKBUS_SOAK_SEED`, and
/// `LINKBUS_SOAK_STORE`, `fjall` unless `log`): minutes long, so not in every run.
#[test]
#[ignore = "minutes long; the 8-cycle version runs every time"]
fn soak_random_kills_of_either_node_lose_and_duplicate_nothing() {
    let store = if std::env::var("LINKBUS_SOAK_STORE").is_ok_and(|s| s == "log") { "log" } else { "fjall" };
    random_kills_of_either_node(&mut Soak::from_env(300), store);
}

/// Each cycle puts a chunk of persistent messages of random size on A for B, then kills A,
/// B or both at a random moment 0–80 ms later (messages queued, in flight, or just
/// acknowledged) and restarts them in random order; a consumer takes from B now and then
/// (its queue holds 100,000 at most); the history of everything put is checked at the end.
/// `store` is what follows `kind:` in `plugins.store` (a name, or a name and a library).
pub(crate) fn random_kills_of_either_node(soak: &mut Soak, store: &str) {
    let s = Scratch::new();
    let pair = Pair::on(&s, store);
    let mut b = pair.start_b(&s);
    let mut a = pair.start_a(&s);
    let (mut all, mut got, mut kills_a, mut kills_b) = (String::new(), String::new(), 0, 0);
    for cycle in 0..soak.cycles {
        if cycle % 25 == 24 {
            got.push_str(&stdout(&s.run(&["get", "--node", "B", "q", "--count", "100000"])));
        }
        let count = 50 + soak.below(400);
        let lines: String =
            (0..count).map(|i| format!("c{cycle:04}m{i:03} {}\n", "p".repeat(soak_payload_len(i)))).collect();
        put_lines(&s, "B:q", &lines, "--persistent");
        all.push_str(&lines);
        std::thread::sleep(Duration::from_millis(soak.below(80)));
        let (kill_a, kill_b) = match soak.below(3) {
            0 => (true, false),
            1 => (false, true),
            _ => (true, true),
        };
        if kill_a {
            a.kill();
            kills_a += 1;
        }
        if kill_b {
            b.kill();
            kills_b += 1;
        }
        if soak.below(2) == 0 {
            b = if kill_b { pair.start_b(&s) } else { b };
            a = if kill_a { pair.start_a(&s) } else { a };
        } else {
            a = if kill_a { pair.start_a(&s) } else { a };
            b = if kill_b { pair.start_b(&s) } else { b };
        }
    }
    let left = all.lines().count() - got.lines().count();
    got.push_str(&take_from_b(&s, left));
    let history = history(&all, &got);
    eprintln!("{} cycles on {store}, {kills_a} kills of A, {kills_b} kills of B: {history:?}", soak.cycles);
    assert!(history.is_clean(), "{history:?}");
    drop((a, b));
}

/// A receiver stopped cleanly records the numbers of the volatile messages it delivered
/// too: after a restart it expects exactly the next ones, its sender logs no loss (only a
/// crash forgets them, as above), and nothing comes twice.
#[test]
fn a_receiver_stopped_cleanly_restarts_where_it_was() {
    let s = Scratch::new();
    let pair = Pair::new(&s, "");
    let mut b = pair.start_b(&s);
    let a = pair.start_a(&s);
    one_persistent_then_fifty_volatile_acknowledged(&s);
    assert!(b.stop(), "B stops cleanly");

    let mut b = pair.start_b(&s);
    a.wait_for_log("Link up.", 2, Duration::from_secs(20));
    put_lines(&s, "B:q", "p2\n", "--persistent");
    assert_eq!(take_from_b(&s, 1), "p2\n", "the link goes on, nothing comes twice");
    assert!(!a.log_text().contains("lost the receive numbers"), "{}", a.log_text());
    assert!(
        a.log_text().contains("lost_by_peer=0") || !a.log_text().contains("lost_by_peer="),
        "{}",
        a.log_text()
    );
    b.kill();
    drop(a);
}
