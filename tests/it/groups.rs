//! Message groups and the transaction rules on real processes: a group crosses a relay and
//! its recipient's restart and is handed out whole, in index order, only once complete;
//! the put and acknowledgement rules name what was broken; groups roll back with their
//! transaction; a group left incomplete by a sender that went away expires whole, with one
//! result per member that asked; a commit with a manual get not acknowledged fails; a node
//! killed before, inside or after a commit keeps all of it or none; a dropped transaction
//! guard rolls back; two transactional consumers never commit one message twice.

use crate::support;

use std::time::Duration;

use linkbus::client::ClientError;
use linkbus::{Client, Content, Lifetime, Message};
use support::cluster::Cluster;
use support::{Scratch, stderr, stdout};

fn content(to: &str, payload: &str) -> Content {
    Content::buf(to.parse().unwrap(), payload.to_owned())
}

fn member(to: &str, payload: &str, group: &str, index: u32, last: bool) -> Content {
    content(to, payload).in_group(group, index, last)
}

fn payloads(messages: &[Message]) -> Vec<String> {
    messages.iter().map(|m| String::from_utf8_lossy(&m.content.payload).into_owned()).collect()
}

fn refusal(result: Result<impl std::fmt::Debug, ClientError>) -> String {
    result.expect_err("refused").to_string()
}

/// A–B–C: members put on A for C, the group's last member after C was killed and
/// restarted; C holds the members (an ordinary get passes them), then hands the group out
/// whole and in order. Whole groups put by the Rust client and by `linkbus put --group`
/// come out of `linkbus get --group` one by one.
#[test]
fn a_group_crosses_a_relay_and_a_restart_and_is_handed_out_whole_in_order() {
    let s = Scratch::new();
    let links = [("A", "B"), ("B", "C")];
    let (cluster, mut nodes) = Cluster::up(
        &s,
        &links,
        &[("A", "routes: [ { to: C, via: B } ]"), ("C", "queues: [ { name: q, order: fifo } ]")],
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut a = Client::connect(&nodes["A"].socket).await.unwrap();
        let persistent = |c: Content| c.with_reliability(linkbus::Reliability::Persistent);
        a.put(persistent(member("C:q", "g0", "g", 0, false))).await.unwrap();
        a.put(persistent(content("C:q", "plain"))).await.unwrap();
        a.put(persistent(member("C:q", "g1", "g", 1, false))).await.unwrap();
        let mut c = Client::connect(&nodes["C"].socket).await.unwrap();
        assert_eq!(payloads(&c.get("q", 10, Duration::from_secs(10)).await.unwrap()), ["plain"]);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            c.get("q", 10, Duration::ZERO).await.unwrap().is_empty(),
            "members of an incomplete group wait"
        );
        let detail = c.queues("q").await.unwrap();
        assert!(detail.contains("held (members of groups not complete): 2"), "{detail}");
    });
    nodes.get_mut("C").unwrap().kill();
    nodes.insert("C".into(), cluster.start(&s, "C"));
    runtime.block_on(async {
        let mut a = Client::connect(&nodes["A"].socket).await.unwrap();
        let mut c = Client::connect(&nodes["C"].socket).await.unwrap();
        assert!(c.get("q", 10, Duration::ZERO).await.unwrap().is_empty(), "still held after the restart");
        a.put(member("C:q", "g2", "g", 2, true).with_reliability(linkbus::Reliability::Persistent))
            .await
            .unwrap();
        let group = c.get_group("q", Duration::from_secs(10)).await.unwrap();
        assert_eq!(payloads(&group), ["g0", "g1", "g2"]);
        let ids = a.put_group("h", vec![content("C:q", "h0"), content("C:q", "h1")]).await.unwrap();
        assert_eq!(ids.len(), 2);
    });
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "C:q", "--group", "k", "--transaction", "-"],
        b"k0\nk1\nk2\n",
        Duration::from_secs(10),
    );
    assert!(put.status.success(), "{}", stderr(&put));
    let get = s.run(&["get", "--node", "C", "q", "--group", "--count", "2", "--wait", "10s"]);
    assert!(get.status.success(), "{}", stderr(&get));
    assert_eq!(stdout(&get), "h0\nh1\nk0\nk1\nk2\n");
    let empty = s.run(&["put", "--node", "A", "--to", "C:q", "--group", "e", "-"]);
    assert!(stderr(&empty).contains("standard input has no line to put in group 'e'"), "{}", stderr(&empty));
}

/// The put rules, the acknowledgement rules, and rollbacks of groups.
#[test]
fn group_rules_name_what_was_broken_and_groups_roll_back() {
    let s = Scratch::new();
    let node = s.start_lone("A", &["q:fifo"]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut sender = Client::connect(&node.socket).await.unwrap();
        // Groups neither nest nor interleave; members come in index order, alike.
        sender.put(member("A:q", "g0", "g", 0, false)).await.unwrap();
        assert!(sender.get("q", 10, Duration::ZERO).await.unwrap().is_empty(), "held");
        let other = refusal(sender.put(member("A:q", "h0", "h", 0, false)).await);
        assert!(other.contains("groups neither nest nor interleave"), "{other}");
        let skipped = refusal(sender.put(member("A:q", "g2", "g", 2, true)).await);
        assert!(skipped.contains("members are put in index order, and 1 comes next"), "{skipped}");
        let urgent = member("A:q", "g1", "g", 1, true).with_priority(linkbus::Priority::level(9).unwrap());
        assert!(refusal(sender.put(urgent).await).contains("a group's members share them"));
        // The sender goes away; another connection (it restarted) takes the group up.
        drop(sender);
        let mut client = Client::connect(&node.socket).await.unwrap();
        client.put(member("A:q", "g1", "g", 1, true)).await.unwrap();

        // Inside a transaction too; a rollback drops a group put whole, and the next
        // transaction starts from where the connection was.
        client.begin().await.unwrap();
        client.put(member("A:q", "r0", "r", 0, false)).await.unwrap();
        let inside = refusal(client.put(member("A:q", "x0", "x", 0, true)).await);
        assert!(inside.contains("groups neither nest nor interleave"), "{inside}");
        client.put(member("A:q", "r1", "r", 1, true)).await.unwrap();
        assert_eq!(client.rollback().await.unwrap(), 2);
        client.put(member("A:q", "x0", "x", 0, true)).await.unwrap();

        // A group taken whole in a transaction that rolls back comes back whole, in order.
        client.begin().await.unwrap();
        assert_eq!(payloads(&client.get_group("q", Duration::ZERO).await.unwrap()), ["g0", "g1"]);
        client.rollback().await.unwrap();
        let back = client.get_group("q", Duration::ZERO).await.unwrap();
        assert_eq!(payloads(&back), ["g0", "g1"]);
        assert!(back.iter().all(|m| m.redelivered && m.backout_count == 1));
        assert_eq!(payloads(&client.get("q", 10, Duration::ZERO).await.unwrap()), ["x0"], "r never was");
        // A whole-group get finds no group among other messages: it waits, takes nothing.
        client.put(content("A:q", "plain")).await.unwrap();
        let started = std::time::Instant::now();
        assert!(client.get_group("q", Duration::from_millis(300)).await.unwrap().is_empty());
        assert!(started.elapsed() >= Duration::from_millis(250));
        assert_eq!(payloads(&client.get("q", 10, Duration::ZERO).await.unwrap()), ["plain"]);

        manual_acknowledgement_of_groups(&mut client).await;
    });
}

/// A group is acknowledged after its last member; until a finished group is, the
/// connection gets nothing more.
async fn manual_acknowledgement_of_groups(client: &mut Client) {
    use linkbus::client::protocol::GetGroups;
    client
        .put_group("m", vec![content("A:q", "m0"), content("A:q", "m1"), content("A:q", "m2")])
        .await
        .unwrap();
    client.put(content("A:q", "after")).await.unwrap();
    // Handed out pending, a group goes to its last member, whatever the count.
    let group = client.get_pending("q", 1, Duration::ZERO, u64::MAX).await.unwrap();
    assert_eq!(group.len(), 3);
    let blocked = refusal(client.get("q", 1, Duration::ZERO).await);
    assert!(blocked.contains("is not acknowledged: acknowledge it"), "{blocked}");
    assert_eq!(client.ack("q", &[group[2].tag]).await.unwrap(), 3, "the last member's tag settles all three");
    assert_eq!(payloads(&client.get("q", 10, Duration::ZERO).await.unwrap()), ["after"]);

    // Taken one by one while the rest is still to come: not acknowledged before the last.
    client.put(member("A:q", "p0", "p", 0, false)).await.unwrap();
    let first = client.get_pending_with("q", 10, Duration::ZERO, u64::MAX, GetGroups::Members).await.unwrap();
    assert_eq!(first.len(), 1);
    let early = refusal(client.ack("q", &[first[0].tag]).await);
    assert!(early.contains("a group is acknowledged after its last member"), "{early}");
    client.put(member("A:q", "p1", "p", 1, true)).await.unwrap();
    let last = client.get_pending("q", 10, Duration::ZERO, u64::MAX).await.unwrap();
    assert_eq!(payloads(&[last[0].message.clone()]), ["p1"]);
    assert_eq!(client.ack("q", &[last[0].tag]).await.unwrap(), 2);

    // A whole group handed out pending: the same rule; backed out, it returns whole.
    client.put_group("n", vec![content("A:q", "n0"), content("A:q", "n1")]).await.unwrap();
    let group = client.get_group_pending("q", Duration::ZERO, u64::MAX).await.unwrap();
    assert!(refusal(client.get_group("q", Duration::ZERO).await).contains("is not acknowledged"));
    client.backout("q", &[group[1].tag]).await.unwrap();
    let again = client.get_group("q", Duration::ZERO).await.unwrap();
    assert_eq!(payloads(&again), ["n0", "n1"]);
}

/// A sender that put two members of three and went away: they are held, then expire
/// together when their lifetime ends; each member that asked for a result gets one,
/// `failed group_expired`, and the node raises one `expired` event for the group.
#[test]
fn an_incomplete_group_left_by_its_sender_expires_whole_with_one_result_each() {
    let s = Scratch::new();
    let node = s.start_lone("A", &["q:fifo"]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut sender = Client::connect(&node.socket).await.unwrap();
        let brief = |i| member("A:q", &format!("g{i}"), "g", i, false).with_lifetime(Lifetime::from_ms(1500));
        let ids = vec![
            sender.put(brief(0).with_results()).await.unwrap(),
            sender.put(brief(1).with_results()).await.unwrap(),
        ];
        drop(sender);
        let mut client = Client::connect(&node.socket).await.unwrap();
        assert!(client.get("q", 10, Duration::from_millis(500)).await.unwrap().is_empty());
        let results = client.results(&ids, Duration::from_secs(10)).await.unwrap();
        for result in results {
            let result = result.expect("tracked");
            let (_, outcome) = &result.recipients[0];
            let outcome = outcome.as_ref().expect("final").to_string();
            assert!(
                outcome.starts_with("failed group_expired: group 'g' of A expired in queue 'q'"),
                "{outcome}"
            );
        }
        assert_eq!(
            client.queues("q").await.unwrap().lines().find(|l| l.starts_with("held")),
            Some("held (members of groups not complete): 0")
        );
        let events = client.browse("EVENT", 1000).await.unwrap();
        let expired: Vec<String> =
            payloads(&events).into_iter().filter(|p| p.starts_with("group 'g' of A expired")).collect();
        assert_eq!(expired.len(), 1, "one event for the group: {expired:?}");
        assert!(expired[0].contains("with 2 member(s) held"), "{expired:?}");
    });
}

/// A get with manual acknowledgement inside a transaction: the commit fails, naming why,
/// and rolls back, until each is acknowledged; a guard dropped without commit rolls back.
#[test]
fn a_commit_needs_its_manual_gets_acknowledged_and_a_dropped_guard_rolls_back() {
    let s = Scratch::new();
    let node = s.start_lone("A", &["q:fifo", "out:fifo"]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client = Client::connect(&node.socket).await.unwrap();
        client.put(content("A:q", "one")).await.unwrap();
        client.begin().await.unwrap();
        let got = client.get_pending("q", 1, Duration::ZERO, u64::MAX).await.unwrap();
        client.put(content("A:out", "made")).await.unwrap();
        let failed = refusal(client.commit().await);
        assert!(
            failed.contains("transaction rolled back: 1 message(s) taken with manual acknowledgement"),
            "{failed}"
        );
        assert!(failed.contains(&format!("tags [{}]", got[0].tag)), "{failed}");
        assert!(client.get("out", 1, Duration::ZERO).await.unwrap().is_empty(), "rolled back");

        client.begin().await.unwrap();
        let got = client.get_pending("q", 1, Duration::ZERO, u64::MAX).await.unwrap();
        assert!(got[0].message.redelivered);
        assert_eq!(client.ack("q", &[got[0].tag]).await.unwrap(), 1);
        let mut other = Client::connect(&node.socket).await.unwrap();
        assert!(other.get("q", 1, Duration::ZERO).await.unwrap().is_empty(), "acknowledged, not yet gone");
        assert_eq!(client.commit().await.unwrap(), 1);
        assert!(other.get("q", 1, Duration::ZERO).await.unwrap().is_empty());

        // A rollback gives back what it took in the queue's order, however it was taken.
        other.put_batch(vec![content("A:q", "o1"), content("A:q", "o2")]).await.unwrap();
        client.begin().await.unwrap();
        assert_eq!(payloads(&client.get("q", 1, Duration::ZERO).await.unwrap()), ["o1"]);
        let manual = client.get_pending("q", 1, Duration::ZERO, u64::MAX).await.unwrap();
        client.ack("q", &[manual[0].tag]).await.unwrap();
        client.rollback().await.unwrap();
        assert_eq!(payloads(&other.get("q", 2, Duration::ZERO).await.unwrap()), ["o1", "o2"]);

        // The guard: dropped (here by an early return) without commit, it rolls back.
        other.put(content("A:q", "two")).await.unwrap();
        let attempt: Result<(), ClientError> = async {
            let mut tx = client.transaction().await?;
            tx.get("q", 1, Duration::ZERO).await?;
            tx.put(content("A:out", "never")).await?;
            Err(ClientError::Protocol("the application gave up".into()))
        }
        .await;
        assert!(attempt.is_err());
        assert_eq!(payloads(&client.get("q", 1, Duration::ZERO).await.unwrap()), ["two"], "given back");
        assert!(client.get("out", 1, Duration::ZERO).await.unwrap().is_empty());
        let tx = client.transaction().await.unwrap();
        assert_eq!(tx.commit().await.unwrap(), 0);
    });
}

/// A node killed with a transaction open, or at each failpoint of its commit, comes back
/// with all of the transaction (after it was durable) or none of it.
#[test]
fn a_node_killed_before_inside_or_after_a_commit_keeps_all_or_nothing() {
    let s = Scratch::new();
    let data = s.path().join("A-data");
    let data = data.to_str().unwrap().to_owned();
    let args =
        ["--name", "A", "--listen", "none", "--data-dir", &data, "--queue", "in:fifo", "--queue", "out:fifo"];
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut node = s.start_node("A", &args);
    runtime.block_on(async {
        let mut client = Client::connect(&node.socket).await.unwrap();
        let persistent = |p: &str| content("A:in", p).with_reliability(linkbus::Reliability::Persistent);
        client.put_batch(vec![persistent("m0"), persistent("m1"), persistent("m2")]).await.unwrap();
    });
    let transact = |node: &support::NodeProcess, commit: bool| {
        runtime.block_on(async {
            let mut client = Client::connect(&node.socket).await.unwrap();
            client.begin().await.unwrap();
            let got = client.get("in", 1, Duration::ZERO).await.unwrap();
            let out = |n| {
                content("A:out", &format!("{} {n}", payloads(&got)[0]))
                    .with_reliability(linkbus::Reliability::Persistent)
            };
            client.put_batch(vec![out(1), out(2)]).await.unwrap();
            if commit { client.commit().await.map(|_| ()) } else { Ok(()) }
        })
    };
    let contents = |node: &support::NodeProcess| {
        runtime.block_on(async {
            let mut client = Client::connect(&node.socket).await.unwrap();
            let inq = payloads(&client.browse("in", 100).await.unwrap());
            let out = payloads(&client.browse("out", 100).await.unwrap());
            (inq, out)
        })
    };
    // Open, not committed, when killed: nothing of it.
    transact(&node, false).unwrap();
    node.kill();
    node = s.start_node("A", &args);
    assert_eq!(contents(&node), (vec!["m0".into(), "m1".into(), "m2".into()], vec![]));
    for (point, kept) in [("before", false), ("inside", false), ("after", true)] {
        node.stop();
        node = s.start_node_env("A", &args, &[("LINKBUS_TEST_CRASH_IN_COMMIT", point)]);
        assert!(transact(&node, true).is_err(), "{point}: the node stopped inside the commit");
        assert!(node.wait_exit(Duration::from_secs(10)).is_some(), "{point}");
        node = s.start_node("A", &args);
        let (inq, out) = contents(&node);
        if kept {
            assert_eq!(
                (inq, out),
                (vec!["m1".into(), "m2".into()], vec!["m0 1".into(), "m0 2".into()]),
                "{point}"
            );
        } else {
            assert_eq!((inq, out), (vec!["m0".into(), "m1".into(), "m2".into()], vec![]), "{point}");
        }
    }
}

/// Two transactional consumers of one queue, their operations interleaved at random
/// (gets, commits, rollbacks, disconnects): no message is committed by both, none is lost.
#[test]
fn two_transactional_consumers_never_commit_the_same_message() {
    use proptest::prelude::*;
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let node = runtime.block_on(in_process_node(dir.path()));
    let config = ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() };
    let ops = proptest::collection::vec((0usize..2, 0u8..5), 1..60);
    let (round, committed) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0usize));
    proptest!(config, |(ops in ops)| {
        round.set(round.get() + 1);
        committed.set(committed.get() + runtime.block_on(interleave(&node, round.get(), &ops)));
    });
    eprintln!("{} interleavings, {} messages committed", round.get(), committed.get());
    assert!(committed.get() > 0, "the interleavings committed something");
}

async fn in_process_node(dir: &std::path::Path) -> linkbus::Node {
    use linkbus::config::{self, Overrides};
    let mut tree =
        config::parse_yaml("node: { listen: none }\nqueues: [ { name: q, order: fifo } ]").unwrap();
    let overrides = Overrides {
        name: Some("A".into()),
        data_dir: Some(dir.join("A")),
        client_socket: Some(dir.join("A.sock")),
        insecure_plaintext: true,
        ..Overrides::default()
    };
    config::apply_overrides(&mut tree, &overrides);
    linkbus::Node::start(config::from_value(&tree).unwrap()).await.unwrap()
}

/// One interleaving: `ops` of (consumer, operation) over 6 fresh messages; returns how
/// many were committed.
async fn interleave(node: &linkbus::Node, round: u32, ops: &[(usize, u8)]) -> usize {
    let mut producer = node.client();
    let sent: Vec<String> = (0..6).map(|i| format!("r{round}m{i}")).collect();
    producer.put_batch(sent.iter().map(|p| content("A:q", p)).collect()).await.unwrap();
    let mut consumers = [node.client(), node.client()];
    let mut open = [false, false];
    let mut taken: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    let mut committed: Vec<String> = Vec::new();
    for &(who, op) in ops {
        let c = &mut consumers[who];
        match op {
            0 if !open[who] => {
                c.begin().await.unwrap();
                open[who] = true;
            }
            0 | 1 if open[who] => taken[who].extend(payloads(&c.get("q", 2, Duration::ZERO).await.unwrap())),
            2 if open[who] => {
                c.commit().await.unwrap();
                committed.append(&mut taken[who]);
                open[who] = false;
            }
            3 if open[who] => {
                c.rollback().await.unwrap();
                taken[who].clear();
                open[who] = false;
            }
            4 => {
                // The connection ends: an open transaction is rolled back.
                consumers[who] = node.client();
                taken[who].clear();
                open[who] = false;
            }
            _ => {}
        }
    }
    drop(consumers);
    let mut rest = node.client();
    let left = payloads(&rest.get("q", 100, Duration::from_millis(100)).await.unwrap());
    let mut all: Vec<String> = committed.iter().chain(&left).cloned().collect();
    all.sort();
    let mut want = sent.clone();
    want.sort();
    assert_eq!(
        all, want,
        "each message committed once or still queued; committed {committed:?}, left {left:?}"
    );
    committed.len()
}
