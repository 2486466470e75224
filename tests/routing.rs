//! Static routes and relays on real processes: chains of three and five nodes, wildcard and
//! `?` routes, a diamond whose route is explained and changed by a reload, messages no route
//! reaches and messages caught in a loop by the hop limit — each with its result back at
//! the origin.

mod support;

use support::cluster::Cluster;
use support::{Scratch, stderr, stdout};

#[test]
fn a_chain_of_three_relays_messages_and_their_results() {
    let s = Scratch::new();
    let links = [("A", "B"), ("B", "C")];
    let cluster = Cluster::write(
        &s,
        &links,
        &[
            ("A", "routes: [ { to: C, via: B } ]\nqueues: [ { name: q } ]"),
            ("B", "queues: [ { name: q } ]"),
            ("C", "routes: [ { to: A, via: B } ]\nqueues: [ { name: q } ]"),
        ],
    );
    let _nodes = cluster.start_all(&s, &links);
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
