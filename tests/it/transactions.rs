//! Transactions on real processes, through the Rust client: gets and puts over several
//! queues (one on another node) are committed together or not at all; a rollback, a
//! disconnect and a commit without room give the gets back (redelivered, backout count
//! raised) and put nothing; a put's lifetime counts from the commit.

use crate::support;

use std::time::Duration;

use linkbus::{Client, Content, Lifetime};
use support::{Scratch, stderr, stdout};

fn content(to: &str, payload: &str) -> Content {
    Content::buf(to.parse().unwrap(), payload.to_owned())
}

fn payloads(messages: &[linkbus::Message]) -> Vec<String> {
    messages.iter().map(|m| String::from_utf8_lossy(&m.content.payload).into_owned()).collect()
}

#[test]
fn gets_and_puts_over_several_queues_commit_together_or_not_at_all() {
    let s = Scratch::new();
    let (a, b) = s.start_pair(
        "queues: [ { name: inbox, order: fifo }, { name: audit, order: fifo, queue_messages_max: 2 }, \
         { name: one, queue_messages_max: 1 } ]",
        "queues: [ { name: orders, order: fifo } ]",
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client = Client::connect(&a.socket).await.unwrap();
        let mut b_client = Client::connect(&b.socket).await.unwrap();
        for n in 1..=4 {
            client.put(content("A:inbox", &format!("in{n}"))).await.unwrap();
        }

        // Commit: two taken from inbox, two put to B, one to audit; nothing shows before.
        client.begin().await.unwrap();
        let got = client.get("inbox", 2, Duration::ZERO).await.unwrap();
        assert_eq!(payloads(&got), ["in1", "in2"]);
        client.put(content("B:orders", "out1")).await.unwrap();
        client.put_batch(vec![content("B:orders", "out2"), content("A:audit", "audit1")]).await.unwrap();
        assert!(b_client.get("orders", 10, Duration::from_millis(300)).await.unwrap().is_empty());
        let mut other = Client::connect(&a.socket).await.unwrap();
        assert!(other.get("audit", 10, Duration::ZERO).await.unwrap().is_empty());
        assert_eq!(client.commit().await.unwrap(), 5);
        let orders = b_client.get("orders", 10, Duration::from_secs(5)).await.unwrap();
        assert_eq!(payloads(&orders), ["out1", "out2"]);
        assert_eq!(payloads(&other.get("audit", 10, Duration::ZERO).await.unwrap()), ["audit1"]);

        // Rollback: the get goes back (redelivered, backout 1), the put never happens.
        client.begin().await.unwrap();
        let got = client.get("inbox", 1, Duration::ZERO).await.unwrap();
        assert_eq!(payloads(&got), ["in3"]);
        client.put(content("B:orders", "never")).await.unwrap();
        assert_eq!(client.rollback().await.unwrap(), 2);

        // A connection that ends inside a transaction rolls it back.
        let mut leaving = Client::connect(&a.socket).await.unwrap();
        leaving.begin().await.unwrap();
        assert_eq!(payloads(&leaving.get("inbox", 1, Duration::ZERO).await.unwrap()), ["in3"]);
        leaving.put(content("B:orders", "never either")).await.unwrap();
        drop(leaving);
        tokio::time::sleep(Duration::from_millis(200)).await;

        // No room for all the puts together: rolled back, nothing put, the get given back.
        client.put(content("A:audit", "audit2")).await.unwrap();
        client.set_put_timeout(Duration::from_millis(200));
        client.begin().await.unwrap();
        assert_eq!(payloads(&client.get("inbox", 1, Duration::ZERO).await.unwrap()), ["in3"]);
        client.put_batch(vec![content("A:audit", "a"), content("A:audit", "b")]).await.unwrap();
        let err = client.commit().await.unwrap_err().to_string();
        assert!(err.contains("transaction rolled back: queue 'audit' is full"), "{err}");
        assert_eq!(
            payloads(&other.get("audit", 10, Duration::ZERO).await.unwrap()),
            ["audit2"],
            "nothing put"
        );
        let back = other.get("inbox", 1, Duration::ZERO).await.unwrap();
        assert_eq!(payloads(&back), ["in3"]);
        assert!(back[0].redelivered);
        assert_eq!(back[0].backout_count, 3, "rollback, disconnect, failed commit");
        assert!(b_client.get("orders", 10, Duration::from_millis(300)).await.unwrap().is_empty());

        limits_rules_and_lifetimes(&mut client, &mut other, &mut b_client).await;
    });
}

/// The rest of the scenario: limits, rules, and lifetimes counted from the commit.
async fn limits_rules_and_lifetimes(client: &mut Client, other: &mut Client, b_client: &mut Client) {
    // More puts for a queue than it ever holds: refused at once.
    client.set_put_timeout(Duration::from_secs(30));
    client.begin().await.unwrap();
    client
        .put_batch(vec![content("A:audit", "a"), content("A:audit", "b"), content("A:audit", "c")])
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let err = client.commit().await.unwrap_err().to_string();
    assert!(err.contains("3 messages for queue 'audit', which holds at most 2"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "not waited for");

    // The rules: one transaction at a time, no no-wait puts, nothing to commit or roll
    // back outside one. (Gets with manual acknowledgement: `groups.rs`.)
    let refused = |e: linkbus::ClientError| e.to_string();
    assert_eq!(client.commit().await.unwrap(), 0, "nothing open: nothing to do");
    assert_eq!(client.rollback().await.unwrap(), 0);
    client.begin().await.unwrap();
    assert!(refused(client.begin().await.unwrap_err()).contains("already open"));
    client.set_no_wait(true);
    let no_wait = client.put(content("A:audit", "x")).await.unwrap_err();
    assert!(refused(no_wait).contains("no-wait put cannot be part of a transaction"));
    client.set_no_wait(false);

    // A put's lifetime counts from the commit, not from the put.
    client.put(content("B:orders", "brief").with_lifetime(Lifetime::from_ms(500))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(client.commit().await.unwrap(), 1);
    let orders = b_client.get("orders", 10, Duration::from_secs(5)).await.unwrap();
    assert_eq!(payloads(&orders), ["brief"]);

    // A message taken from a full queue and put back to it in one transaction: its own
    // get makes the room.
    client.put(content("A:one", "again")).await.unwrap();
    client.begin().await.unwrap();
    let got = client.get("one", 1, Duration::ZERO).await.unwrap();
    client.put(content("A:one", &format!("{} more", payloads(&got)[0]))).await.unwrap();
    assert_eq!(client.commit().await.unwrap(), 2);
    assert_eq!(payloads(&other.get("one", 10, Duration::ZERO).await.unwrap()), ["again more"]);
}

#[test]
fn the_command_line_puts_standard_input_as_one_transaction() {
    let s = Scratch::new();
    let _a = s.start_lone("A", &["q:fifo"]);
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "A:q", "--transaction", "-"],
        b"one\ntwo\nthree\n",
        Duration::from_secs(10),
    );
    assert!(put.status.success(), "{}", stderr(&put));
    assert!(stderr(&put).contains("put 3 messages (committed)"), "{}", stderr(&put));
    let get = s.run(&["get", "--node", "A", "q", "--count", "3"]);
    assert_eq!(stdout(&get), "one\ntwo\nthree\n");
}
