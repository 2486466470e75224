//! Static routes and relays on real processes: chains of three and five nodes, wildcard and
//! `?` routes, a diamond whose route is explained and changed by a reload, messages no route
//! reaches and messages caught in a loop by the hop limit — each with its result back at
//! the origin.

use crate::support;

use support::cluster::Cluster;
use support::soak::{Soak, soak_payload_len};
use support::{Scratch, stderr, stdout};

#[test]
fn a_chain_of_three_relays_messages_and_their_results() {
    let s = Scratch::new();
    let links = [("A", "B"), ("B", "C")];
    let (_cluster, _nodes) = Cluster::up(
        &s,
        &links,
        &[
            ("A", "routes: [ { to: C, via: B } ]\nqueues: [ { name: q } ]"),
            ("B", "queues: [ { name: q } ]"),
            ("C", "routes: [ { to: A, via: B } ]\nqueues: [ { name: q } ]"),
        ],
    );
    let put = s.run(&[
        "put",
        "--node",
        "A",
        "--to",
        "C:q",
        "--to",
        "B:q",
        "--to",
        "C:nope",
        "--wait-result",
        "20s",
        "hello",
    ]);
    let out = stdout(&put);
    let id = out.lines().next().unwrap_or_default().to_owned();
    assert!(out.contains(&format!("{id} C:q delivered")), "{out}\n{}", stderr(&put));
    assert!(out.contains(&format!("{id} B:q delivered")), "{out}");
    assert!(out.contains(&format!("{id} C:nope failed queue_missing")), "{out}");
    let got = stdout(&s.run(&["get", "--node", "C", "q", "--count", "10", "--wait", "2s"]));
    assert_eq!(got, "hello\n", "C got it once");
    let got = stdout(&s.run(&["get", "--node", "B", "q", "--count", "10", "--wait", "1s"]));
    assert_eq!(got, "hello\n", "B got its own copy once, and relayed C's");
}

/// A–B–C–D–E, routed by patterns: A sends everything through B (`*`), B sends single-letter
/// names through C (`?`), C sends names from D on (`D*`, `E`) through D; the way back to A
/// is routed the same way. 100 persistent messages arrive at E once, in order, with their
/// results back at A.
#[test]
fn a_chain_of_five_follows_wildcard_and_single_character_routes() {
    let s = Scratch::new();
    let links = [("A", "B"), ("B", "C"), ("C", "D"), ("D", "E")];
    let (_cluster, _nodes) = Cluster::up(
        &s,
        &links,
        &[
            ("A", "routes: [ { to: '*', via: B } ]"),
            ("B", "routes: [ { to: '?', via: C } ]"),
            ("C", "routes: [ { to: 'D*', via: D }, { to: E, via: D }, { to: '*', via: B } ]"),
            ("D", "routes: [ { to: '*', via: C } ]"),
            ("E", "routes: [ { to: '*', via: D } ]\nqueues: [ { name: q, order: fifo } ]"),
        ],
    );
    let lines: String = (0..100).map(|i| format!("m{i:03}\n")).collect();
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "E:q", "--persistent", "--wait-result", "30s", "-"],
        lines.as_bytes(),
        std::time::Duration::from_secs(60),
    );
    assert!(put.status.success(), "{}\n{}", stdout(&put), stderr(&put));
    assert_eq!(stdout(&put).lines().filter(|l| l.ends_with(" E:q delivered")).count(), 100);
    let got = stdout(&s.run(&["get", "--node", "E", "q", "--count", "1000", "--wait", "2s"]));
    assert_eq!(got, lines, "each once, in order");
    let explain = stdout(&s.run(&["route", "explain", "--node", "C", "E"]));
    assert!(explain.starts_with("E: next hop D, by route 2 'E' via D"), "{explain}");
    assert!(
        explain.contains("route 1 'D*' via D lost") || explain.contains("route 3 '*' via B lost"),
        "{explain}"
    );
}

/// A message for a node the relay has no route to is dead-lettered there (`no_route`), and
/// one caught in a routing loop — which `linkbus config check` finds in the three
/// configurations — is dead-lettered by the hop limit (`hop_limit`); the origin gets a
/// failure result for each.
#[test]
fn messages_no_route_reaches_or_that_loop_are_dead_lettered_with_a_result() {
    let s = Scratch::new();
    let links = [("A", "B"), ("B", "C")];
    let (cluster, _nodes) = Cluster::up(
        &s,
        &links,
        &[
            ("A", "routes: [ { to: 'X*', via: B }, { to: 'L*', via: B } ]\nmessages: { hop_count_max: 5 }"),
            ("B", "routes: [ { to: 'L*', via: C } ]\nmessages: { hop_count_max: 5 }"),
            ("C", "routes: [ { to: 'L*', via: B }, { to: A, via: B } ]\nmessages: { hop_count_max: 5 }"),
        ],
    );
    // The loop shows when the three configurations are checked together.
    let files: Vec<&str> = cluster.configs.values().map(String::as_str).collect();
    let check = s.run(&[&["config", "check"][..], &files].concat());
    assert!(!check.status.success(), "{}", stdout(&check));
    let report = stdout(&check);
    assert!(
        report.contains("cluster: routing loop for destination L (also Lx, Lxx): A -> B -> C -> B"),
        "{report}"
    );
    assert_eq!(report.matches("routing loop").count(), 1, "one loop, reported once: {report}");
    let put = s.run(&["put", "--node", "A", "--to", "X1:q", "--wait-result", "20s", "lost"]);
    assert!(!put.status.success());
    let out = stdout(&put);
    assert!(out.contains("X1:q failed no_route: no route to node 'X1'"), "{out}");
    let dead = stdout(&s.run(&["dlq", "ls", "--node", "B"]));
    assert!(dead.contains("no_route"), "{dead}");

    let put = s.run(&["put", "--node", "A", "--to", "L1:q", "--wait-result", "20s", "loop"]);
    assert!(!put.status.success());
    let out = stdout(&put);
    assert!(out.contains("L1:q failed hop_limit: it passed 5 relays"), "{out}");
    // It arrived at B, C, B, C, B with hop counts 0..=4, and C refused the sixth relay.
    let in_dlq = |node: &str| stdout(&s.run(&["dlq", "ls", "--node", node])).matches("hop_limit").count();
    assert_eq!(in_dlq("B") + in_dlq("C"), 1, "one node dead-lettered it, once");
}

/// How many messages `node`'s link to `peer` had acknowledged, from `linkbus status`.
fn acked(s: &Scratch, node: &str, peer: &str) -> u64 {
    let status = stdout(&s.run(&["status", "--node", node]));
    let line = status.lines().find(|l| l.trim_start().starts_with(&format!("{peer}: "))).unwrap_or_default();
    line.split(", ").find_map(|part| part.strip_prefix("acked ")).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// Waits (at most 10 s) until B1 and B2 have relayed `expected` messages to D.
fn assert_relayed(s: &Scratch, expected: (u64, u64), why: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut seen = (0, 0);
    while std::time::Instant::now() < deadline {
        seen = (acked(s, "B1", "D"), acked(s, "B2", "D"));
        if seen == expected {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("{why}: B1 and B2 relayed {seen:?}, expected {expected:?}");
}

/// A diamond: A reaches D through B1 or B2. The exact route wins over the wildcard one,
/// `linkbus route explain` says so, and a reload (then SIGHUP) with the routes changed
/// sends the next message the other way; a bad file is refused and the routes stay.
#[test]
fn a_diamond_routes_by_the_most_specific_route_and_a_reload_changes_it() {
    let s = Scratch::new();
    let links = [("A", "B1"), ("A", "B2"), ("B1", "D"), ("B2", "D")];
    let first = "routes: [ { to: D, via: B1 }, { to: 'D*', via: B2 } ]";
    let (cluster, nodes) = Cluster::up(&s, &links, &[("A", first), ("D", "queues: [ { name: q } ]")]);
    let explain = stdout(&s.run(&["route", "explain", "--node", "A", "D", "B2", "Q"]));
    assert_eq!(
        explain,
        "D: next hop B1, by route 1 'D' via B1\n  route 2 'D*' via B2 lost: more wildcards (1 against 0)\n\
         B2: next hop B2 (a direct neighbour)\n\
         Q: no route: no route matches 'Q' (2 routes)\n"
    );
    let put = |text: &str| assert!(s.run(&["put", "--node", "A", "--to", "D:q", text]).status.success());
    let arrived = |count: usize| {
        let got = stdout(&s.run(&["get", "--node", "D", "q", "--count", "1", "--wait", "10s"]));
        assert_eq!(got.lines().count(), 1, "message {count} arrived");
    };
    put("one");
    arrived(1);
    assert_relayed(&s, (1, 0), "through B1");

    // The wildcard route first and the exact one gone: D goes through B2 now.
    std::fs::write(
        &cluster.configs["A"],
        std::fs::read_to_string(&cluster.configs["A"])
            .unwrap()
            .replace(first, "routes: [ { to: 'D*', via: B2 } ]"),
    )
    .unwrap();
    let reload = s.run(&["reload", "--node", "A"]);
    assert!(reload.status.success(), "{}", stderr(&reload));
    assert_eq!(stdout(&reload), "routes reloaded: 1 route(s), router 'static'\n");
    put("two");
    arrived(2);
    assert_relayed(&s, (1, 1), "through B2");

    // A bad file is refused, naming the problem; the routes stay.
    let good = std::fs::read_to_string(&cluster.configs["A"]).unwrap();
    std::fs::write(&cluster.configs["A"], good.replace("via: B2", "via: Z9")).unwrap();
    let refused = s.run(&["reload", "--node", "A"]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("routes[0].via: 'Z9' is not a peer of this node"),
        "{}",
        stderr(&refused)
    );
    put("three");
    arrived(3);
    assert_relayed(&s, (1, 2), "still through B2");

    // SIGHUP reads the file again: back to B1.
    std::fs::write(&cluster.configs["A"], good.replace("'D*', via: B2", "'D*', via: B1")).unwrap();
    let pid = nodes["A"].pid().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    nodes["A"].wait_for_log("Configuration reloaded (SIGHUP).", 1, std::time::Duration::from_secs(10));
    put("four");
    arrived(4);
    assert_relayed(&s, (2, 2), "through B1 again");
}

/// The relay of A–B–C killed with SIGKILL again and again while 3,000 persistent messages
/// stream from A to C (some kills right after B's restart, while it recovers): C gets each
/// exactly once, in order — B keeps each message it relays in the same store batch as the
/// number it acknowledges A.
#[test]
fn a_relay_killed_again_and_again_loses_and_duplicates_nothing() {
    let s = Scratch::new();
    let links = [("A", "B"), ("B", "C")];
    let (cluster, mut nodes) = Cluster::up(
        &s,
        &links,
        &[("A", "routes: [ { to: C, via: B } ]"), ("C", "queues: [ { name: q, order: fifo } ]")],
    );
    let lines: String = (0..3000).map(|i| format!("{i:05} {}\n", "r".repeat(100))).collect();
    let put = s.put_streaming(
        &["put", "--node", "A", "--to", "C:q", "--persistent", "-"],
        &lines,
        8 * 1024,
        std::time::Duration::from_millis(15),
    );
    let mut kills = 0;
    for pause in [120u64, 0, 300, 60, 0, 250, 180] {
        std::thread::sleep(std::time::Duration::from_millis(pause));
        nodes.get_mut("B").unwrap().kill();
        kills += 1;
        nodes.insert("B".into(), cluster.start(&s, "B"));
    }
    put.finish();
    let got = s.take_all("C", "q", 3000, std::time::Duration::from_secs(60));
    let history = support::history::History::check(
        &lines.lines().collect::<Vec<_>>(),
        &got.lines().collect::<Vec<_>>(),
    );
    eprintln!("{kills} kills of the relay B: {history:?}");
    assert!(history.is_clean(), "{kills} kills of the relay B: {history:?}");
}

/// A relay's own messages and those it relays share its link by `links.forward_share`:
/// with 400 of each waiting at B for C (C down), the first 100 to arrive at C once it is up
/// are 25 relayed and 75 of B's own, each side in order.
#[test]
fn a_relay_gives_relayed_messages_the_forward_share_of_its_link() {
    let s = Scratch::new();
    let links = [("A", "B"), ("B", "C")];
    let cluster = Cluster::write(
        &s,
        &links,
        &[
            ("A", "routes: [ { to: C, via: B } ]"),
            (
                "B",
                "links: { forward_share: 25, reconnect_backoff_min_ms: 20, reconnect_backoff_max_ms: 100 }",
            ),
            ("C", "queues: [ { name: q, order: fifo } ]"),
        ],
    );
    let (_a, b) = (cluster.start(&s, "A"), cluster.start(&s, "B"));
    let put = |node: &str, prefix: &str| {
        let lines: String = (0..400).map(|i| format!("{prefix}{i:03}\n")).collect();
        let out = s.run_with_input(
            &["put", "--node", node, "--to", "C:q", "-"],
            lines.as_bytes(),
            std::time::Duration::from_secs(30),
        );
        assert!(out.status.success(), "{}", stderr(&out));
    };
    put("A", "a");
    put("B", "b");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !stdout(&s.run(&["status", "--node", "B"])).contains("C: down, queued 800") {
        assert!(std::time::Instant::now() < deadline, "{}", stdout(&s.run(&["status", "--node", "B"])));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _c = cluster.start(&s, "C");
    b.wait_for_log("Link up.", 2, std::time::Duration::from_secs(20));
    let got = s.take_all("C", "q", 800, std::time::Duration::from_secs(40));
    let arrivals: Vec<&str> = got.lines().collect();
    assert_eq!(arrivals.len(), 800);
    let relayed = arrivals[..100].iter().filter(|l| l.starts_with('a')).count();
    assert_eq!(relayed, 25, "relayed among the first 100: {:?}", &arrivals[..100]);
    for prefix in ["a", "b"] {
        let side: Vec<&&str> = arrivals.iter().filter(|l| l.starts_with(prefix)).collect();
        assert!(side.windows(2).all(|w| w[0] < w[1]), "{prefix}: in order");
    }
}

/// Lifetimes count down across relays whatever the relays' clocks say: with the relay B an
/// hour ahead, a 3 s message reaches C and is reported delivered; one that waits at B while
/// C is down expires there, and B (which never sent it on) reports it expired to A.
#[test]
fn lifetimes_and_results_cross_a_relay_whose_clock_is_an_hour_ahead() {
    let s = Scratch::new();
    let links = [("A", "B"), ("B", "C")];
    let cluster = Cluster::write(
        &s,
        &links,
        &[
            ("A", "routes: [ { to: C, via: B } ]"),
            ("C", "routes: [ { to: A, via: B } ]\nqueues: [ { name: q } ]"),
        ],
    );
    // B's handshakes are stamped an hour ahead: C accepts up to two hours.
    let c_config = std::fs::read_to_string(&cluster.configs["C"]).unwrap();
    let c_config = c_config.replace("psk_file:", "clock_skew_max_s: 7200, psk_file:");
    std::fs::write(&cluster.configs["C"], c_config).unwrap();
    let hour = [("LINKBUS_TEST_CLOCK_OFFSET_MS", "3600000")];
    let (_a, b, mut c) = (cluster.start(&s, "A"), cluster.start_env(&s, "B", &hour), cluster.start(&s, "C"));
    b.wait_for_log("Link up.", 2, std::time::Duration::from_secs(20));
    let put =
        s.run(&["put", "--node", "A", "--to", "C:q", "--lifetime", "3s", "--wait-result", "20s", "in time"]);
    assert!(stdout(&put).contains(" C:q delivered"), "{}\n{}", stdout(&put), stderr(&put));
    assert_eq!(stdout(&s.run(&["get", "--node", "C", "q", "--wait", "2s"])), "in time\n");

    c.kill();
    let put =
        s.run(&["put", "--node", "A", "--to", "C:q", "--lifetime", "1s", "--wait-result", "20s", "too late"]);
    assert!(!put.status.success());
    assert!(stdout(&put).contains(" C:q expired"), "{}\n{}", stdout(&put), stderr(&put));
    let _c = cluster.start(&s, "C");
    b.wait_for_log("Link up.", 3, std::time::Duration::from_secs(20));
    assert_eq!(stdout(&s.run(&["get", "--node", "C", "q", "--wait", "1s"])), "", "it was never delivered");
}

/// Random kills in a chain, briefly: 8 cycles of [`random_kills_in_a_chain`] in every run.
#[test]
fn random_kills_in_a_chain_lose_and_duplicate_nothing() {
    random_kills_in_a_chain(&mut Soak::new(8), "fjall");
}

/// The same with every node on the `log` store.
#[test]
fn random_kills_in_a_chain_on_the_log_store_lose_and_duplicate_nothing() {
    random_kills_in_a_chain(&mut Soak::new(8), "log");
}

/// The same as a soak, for the record (`cargo test --test routing soak -- --ignored
/// --nocapture`; `LINKBUS_SOAK_CYCLES`, default 250, `LINKBUS_SOAK_SEED`, and
/// `LINKBUS_SOAK_STORE`, `fjall` unless `log`): minutes long, so not in every run.
#[test]
#[ignore = "minutes long; the 8-cycle version runs every time"]
fn soak_random_kills_in_a_chain_lose_and_duplicate_nothing() {
    let store = if std::env::var("LINKBUS_SOAK_STORE").is_ok_and(|s| s == "log") { "log" } else { "fjall" };
    random_kills_in_a_chain(&mut Soak::from_env(250), store);
}

/// A–B–C: each cycle puts a chunk of persistent messages of random size on A for C, then
/// kills A, the relay B or C — or two of them, or all three — at a random moment 0–80 ms
/// later and restarts them in random order; a consumer takes from C now and then, and the
/// history of everything put is checked at the end.
fn random_kills_in_a_chain(soak: &mut Soak, store: &str) {
    let s = Scratch::new();
    let links = [("A", "B"), ("B", "C")];
    let plugins = format!("plugins: {{ store: {{ kind: {store} }} }}");
    let (a, c) = (
        format!("routes: [ {{ to: C, via: B }} ]\n{plugins}"),
        format!("queues: [ {{ name: q, order: fifo }} ]\n{plugins}"),
    );
    let (cluster, mut nodes) = Cluster::up(&s, &links, &[("A", &a), ("B", &plugins), ("C", &c)]);
    let (mut all, mut got) = (String::new(), String::new());
    let mut kills: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for cycle in 0..soak.cycles {
        if cycle % 25 == 24 {
            got.push_str(&stdout(&s.run(&["get", "--node", "C", "q", "--count", "100000"])));
        }
        let count = 50 + soak.below(400);
        let lines: String =
            (0..count).map(|i| format!("c{cycle:04}m{i:03} {}\n", "p".repeat(soak_payload_len(i)))).collect();
        let put = s.run_with_input(
            &["put", "--node", "A", "--to", "C:q", "--persistent", "-"],
            lines.as_bytes(),
            std::time::Duration::from_secs(30),
        );
        assert!(put.status.success(), "{}", stderr(&put));
        all.push_str(&lines);
        std::thread::sleep(std::time::Duration::from_millis(soak.below(80)));
        // A non-empty set of the three nodes, killed together.
        let victims: Vec<&str> = ["A", "B", "C"].into_iter().filter(|_| soak.below(2) == 0).collect();
        let victims =
            if victims.is_empty() { vec![["A", "B", "C"][soak.below(3) as usize]] } else { victims };
        for name in &victims {
            nodes.get_mut(*name).unwrap().kill();
            *kills.entry(name).or_default() += 1;
        }
        let mut order = victims.clone();
        if soak.below(2) == 0 {
            order.reverse();
        }
        for name in order {
            nodes.insert(name.to_owned(), cluster.start(&s, name));
        }
    }
    let left = all.lines().count() - got.lines().count();
    got.push_str(&s.take_all("C", "q", left, std::time::Duration::from_secs(120)));
    let history =
        support::history::History::check(&all.lines().collect::<Vec<_>>(), &got.lines().collect::<Vec<_>>());
    eprintln!("chain: {} cycles on {store}, kills {kills:?}: {history:?}", soak.cycles);
    assert!(history.is_clean(), "{history:?}");
}
