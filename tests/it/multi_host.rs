//! Three hosts: when run as root, the test makes three network namespaces, joins A–B and
//! B–C with veth pairs on their own addresses (no IP forwarding, so A's packets cannot
//! reach C), and runs node A, B and C each in its own namespace. A reaches C only through
//! the relay B, by a static route: messages and their results cross both hops. The
//! namespaces are removed afterwards (also when the test fails); without root, or where
//! namespaces cannot be made, the test is skipped and says so.

use crate::support;

use std::process::Command;
use std::time::Duration;

use support::{Scratch, stderr, stdout};

/// Runs `ip ARGS`; whether it succeeded.
fn ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).status().is_ok_and(|s| s.success())
}

/// The namespaces (and with them their veth ends), removed when dropped.
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Makes namespaces `a`, `b`, `c` joined A–B on 10.201.1.0/24 and B–C on 10.201.2.0/24;
/// `None` when that is not possible here.
fn three_hosts(tag: &str) -> Option<Namespaces> {
    let names: Vec<String> = ["a", "b", "c"].iter().map(|n| format!("lb{tag}{n}")).collect();
    let mut made = Namespaces(Vec::new());
    for ns in &names {
        if !ip(&["netns", "add", ns]) {
            return None;
        }
        made.0.push(ns.clone());
        if !ip(&["-n", ns, "link", "set", "lo", "up"]) {
            return None;
        }
    }
    let (a, b, c) = (&names[0], &names[1], &names[2]);
    // Interface names stay under 16 characters.
    let pairs = [(a, "10.201.1.1", b, "10.201.1.2", "x"), (b, "10.201.2.2", c, "10.201.2.3", "y")];
    for (left, left_ip, right, right_ip, link) in pairs {
        let (l, r) = (format!("l{tag}{link}0"), format!("l{tag}{link}1"));
        let ok = ip(&["link", "add", &l, "netns", left, "type", "veth", "peer", "name", &r, "netns", right])
            && ip(&["-n", left, "addr", "add", &format!("{left_ip}/24"), "dev", &l])
            && ip(&["-n", right, "addr", "add", &format!("{right_ip}/24"), "dev", &r])
            && ip(&["-n", left, "link", "set", &l, "up"])
            && ip(&["-n", right, "link", "set", &r, "up"]);
        if !ok {
            return None;
        }
    }
    Some(made)
}

#[test]
fn three_hosts_in_network_namespaces_reach_each_other_through_a_relay() {
    let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if !is_root {
        eprintln!("SKIPPED: the multi-host test makes network namespaces and needs root");
        return;
    }
    let tag = format!("{}", std::process::id() % 100_000);
    let Some(hosts) = three_hosts(&tag) else {
        eprintln!("SKIPPED: cannot make network namespaces and veth pairs here");
        return;
    };
    let (ns_a, ns_b, ns_c) = (&hosts.0[0], &hosts.0[1], &hosts.0[2]);
    let s = Scratch::new();
    let (ka, kb, kc) = (s.keys("A"), s.keys("B"), s.keys("C"));
    let security = |n: &str| s.security_yaml(n);
    let write = |file: &str, yaml: String| s.write(file, &yaml).to_str().unwrap().to_owned();
    let a = write(
        "a.yaml",
        format!(
            "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '10.201.1.2:7402', public_key: '{kb}' }} ]\n\
             routes: [ {{ to: C, via: B }} ]\nqueues: [ {{ name: q }} ]\n{}\n",
            security("A")
        ),
    );
    let b = write(
        "b.yaml",
        format!(
            "node: {{ name: B, listen: '0.0.0.0:7402' }}\npeers: [ {{ name: A, public_key: '{ka}' }}, \
             {{ name: C, address: '10.201.2.3:7403', public_key: '{kc}' }} ]\n{}\n",
            security("B")
        ),
    );
    let c = write(
        "c.yaml",
        format!(
            "node: {{ name: C, listen: '10.201.2.3:7403' }}\npeers: [ {{ name: B, public_key: '{kb}' }} ]\n\
             routes: [ {{ to: A, via: B }} ]\nqueues: [ {{ name: q, order: fifo }} ]\n{}\n",
            security("C")
        ),
    );
    // A has no way to C's address at all: only B has.
    assert!(!ip(&["-n", ns_a, "route", "get", "10.201.2.3"]), "A must not reach C directly");
    assert!(ip(&["-n", ns_b, "route", "get", "10.201.2.3"]));

    let node_c = s.start_node_in(ns_c, "C", &["-c", &c]);
    let node_b = s.start_node_in(ns_b, "B", &["-c", &b]);
    let node_a = s.start_node_in(ns_a, "A", &["-c", &a]);
    node_b.wait_for_log("Link up.", 2, Duration::from_secs(20));
    node_a.wait_for_log("Link up.", 1, Duration::from_secs(20));

    let lines: String = (0..500).map(|i| format!("m{i:03}\n")).collect();
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "C:q", "--persistent", "--wait-result", "30s", "-"],
        lines.as_bytes(),
        Duration::from_secs(60),
    );
    assert!(put.status.success(), "{}\n{}", stdout(&put), stderr(&put));
    assert_eq!(stdout(&put).lines().filter(|l| l.ends_with(" C:q delivered")).count(), 500);
    let got = stdout(&s.run(&["get", "--node", "C", "q", "--count", "1000", "--wait", "2s"]));
    assert_eq!(got, lines, "each once, in order, through B");
    let status = stdout(&s.run(&["status", "--node", "B"]));
    assert!(status.contains("A: up") && status.contains("C: up"), "{status}");
    drop((node_a, node_b, node_c));
}
