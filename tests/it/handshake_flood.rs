//! A flood of connections cannot keep a configured peer out, nor fill the log: node B takes
//! 3,000 new connections a second (idle ones from one address, or idle ones and garbage
//! handshakes from 200 addresses) while peer A dials it through a relay adding a 200 ms round trip. A links
//! up within 5 s of starting (about 0.5 s without a flood), and B's log stays a few dozen
//! lines.

use crate::support;

use std::time::{Duration, Instant};

use support::flood::{DelayRelay, Flood, FloodKind};
use support::{NodeProcess, Scratch, stderr, stdout};

/// How long A may take to link up through the flood.
const LINK_UP_BOUND: Duration = Duration::from_secs(5);

fn start_b(s: &Scratch) -> NodeProcess {
    let a_key = s.keys("A");
    let _ = s.keys("B");
    let yaml = format!(
        "node: {{ name: B, listen: 127.0.0.1:0 }}\npeers: [ {{ name: A, public_key: '{a_key}' }} ]\n\
         queues: [ {{ name: orders }} ]\n{}\n",
        s.security_yaml("B")
    );
    s.start_node("B", &["-c", s.write("b.yaml", &yaml).to_str().unwrap()])
}

fn start_a(s: &Scratch, b_address: &str) -> NodeProcess {
    let b_key = std::fs::read_to_string(s.path().join("B.key")).unwrap();
    let private = linkbus::proto::secure::parse_key(&b_key).unwrap();
    let public = linkbus::proto::secure::Keypair::from_private(private).unwrap().public;
    let yaml = format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '{b_address}', public_key: '{}' }} ]\n{}\n",
        linkbus::proto::secure::hex(&public),
        s.security_yaml("A")
    );
    s.start_node("A", &["-c", s.write("a.yaml", &yaml).to_str().unwrap()])
}

/// Waits for A's link, returning how long it took from `since`.
fn link_up_time(a: &NodeProcess, since: Instant) -> Duration {
    let deadline = since + Duration::from_secs(30);
    while Instant::now() < deadline {
        if a.log_text().contains("Link up.") {
            return since.elapsed();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("A did not link up within 30 s:\n{}", a.log_text());
}

fn peer_links_up_through(kind: FloodKind, sources: Vec<String>) {
    let s = Scratch::new();
    let b = start_b(&s);
    let b_address = b.listen_address();
    let relay = DelayRelay::start(&b_address, "127.0.0.2", Duration::from_millis(100));
    let flood = Flood::start(&b_address, sources, 3_000, kind, Duration::from_secs(40));
    std::thread::sleep(Duration::from_secs(1));
    let started = Instant::now();
    let a = start_a(&s, &relay.address);
    let took = link_up_time(&a, started);
    let opened = flood.opened();
    assert!(opened >= 2_000, "the flood ran: {opened} connections");
    assert!(
        took <= LINK_UP_BOUND,
        "A linked up after {took:?} ({opened} flood connections):\n{}",
        a.log_text()
    );
    // The link carries messages while the flood goes on.
    let put = s.run(&["put", "--node", "A", "--to", "B:orders", "through"]);
    assert!(put.status.success(), "{}", stderr(&put));
    assert_eq!(stdout(&s.run(&["get", "--node", "B", "orders", "--wait", "10s"])), "through\n");
    let opened = flood.opened();
    drop(flood);
    // Repeated warnings are aggregated: a handful per reason and interval, not one per
    // connection.
    let log = b.log_text();
    let lines = log.lines().count();
    assert!(lines < 60, "{lines} log lines for {opened} flood connections:\n{log}");
    eprintln!("A linked up in {took:?}; the flood opened {opened} connections; B logged {lines} lines");
}

#[test]
fn a_peer_links_up_while_one_address_floods_idle_connections() {
    peer_links_up_through(FloodKind::Idle, vec!["127.0.0.3".into()]);
}

#[test]
fn a_peer_links_up_while_many_addresses_flood_idle_connections_and_garbage_handshakes() {
    let sources = (0..200).map(|i| format!("127.0.{}.{}", 10 + i / 250, 1 + i % 250)).collect();
    peer_links_up_through(FloodKind::Mixed, sources);
}
