//! Gets with manual acknowledgement on a real node: messages handed out pending leave the
//! queue only when acknowledged; backed out, or when the consumer's connection ends first
//! (a killed consumer), they return to the head of the queue marked redelivered with a
//! backout count. A message larger than the consumer can take fails the get with its size
//! and stays. The `linkbus get` command acknowledges only what it wrote out.

use crate::support;

use std::time::Duration;

use linkbus::client::protocol::ErrorCode;
use linkbus::{Client, ClientError, Content};
use support::{NodeProcess, Scratch, stdout};

fn start(s: &Scratch) -> NodeProcess {
    s.start_lone("A", &["q:fifo"])
}

async fn put(client: &mut Client, texts: &[&str]) {
    for text in texts {
        client.put(Content::buf("A:q".parse().unwrap(), text.to_string())).await.unwrap();
    }
}

fn payloads(messages: impl IntoIterator<Item = linkbus::Message>) -> Vec<(String, bool, u16)> {
    messages
        .into_iter()
        .map(|m| (String::from_utf8(m.content.payload.to_vec()).unwrap(), m.redelivered, m.backout_count))
        .collect()
}

#[test]
fn pending_messages_come_back_unless_acknowledged() {
    let s = Scratch::new();
    let a = start(&s);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut producer = Client::connect(&a.socket).await.unwrap();
        put(&mut producer, &["one", "two", "three"]).await;

        // A consumer takes two and goes away without acknowledging (as if killed).
        let mut consumer = Client::connect(&a.socket).await.unwrap();
        let taken = consumer.get_pending("q", 2, Duration::ZERO, u64::MAX).await.unwrap();
        assert_eq!(taken.len(), 2);
        let mut other = Client::connect(&a.socket).await.unwrap();
        let refused = other.ack("q", &[taken[0].tag]).await.unwrap_err();
        assert!(refused.to_string().contains("not pending on this connection"), "{refused}");
        drop(consumer);
        tokio::time::sleep(Duration::from_millis(200)).await;

        // They are back at the head, in order, marked.
        let mut consumer = Client::connect(&a.socket).await.unwrap();
        let again = consumer.get_pending("q", 10, Duration::from_secs(5), u64::MAX).await.unwrap();
        let got = payloads(again.iter().map(|d| d.message.clone()));
        assert_eq!(
            got,
            [("one".into(), true, 1), ("two".into(), true, 1), ("three".into(), false, 0)],
            "returned messages first, redelivered once"
        );
        // Acknowledge one, back out the others explicitly.
        assert_eq!(consumer.ack("q", &[again[0].tag]).await.unwrap(), 1);
        assert_eq!(consumer.backout("q", &[again[1].tag, again[2].tag]).await.unwrap(), 2);
        let last = consumer.get("q", 10, Duration::ZERO).await.unwrap();
        assert_eq!(payloads(last), [("two".into(), true, 2), ("three".into(), true, 1)]);
        assert!(consumer.get("q", 10, Duration::ZERO).await.unwrap().is_empty(), "nothing left");
    });
}

#[test]
fn a_message_larger_than_the_consumer_takes_stays_and_the_error_gives_its_size() {
    let s = Scratch::new();
    let a = start(&s);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client = Client::connect(&a.socket).await.unwrap();
        client.put(Content::buf("A:q".parse().unwrap(), vec![7u8; 10_000])).await.unwrap();
        let err = client.get_pending("q", 1, Duration::ZERO, 5_000).await.unwrap_err();
        let ClientError::Refused { code, message, .. } = &err else { panic!("{err}") };
        assert_eq!(*code, ErrorCode::TooLarge);
        assert!(message.contains("has 100") && message.contains("stays in the queue"), "{message}");
        let got = client.get_pending("q", 1, Duration::ZERO, 20_000).await.unwrap();
        assert_eq!(got.len(), 1, "it stayed, and a larger limit takes it");
        assert_eq!(client.ack("q", &[got[0].tag]).await.unwrap(), 1);
    });
    // The command line: `--max-bytes` too small fails and names the size.
    let put = s.run(&["put", "--node", "A", "--to", "A:q", "0123456789"]);
    assert!(put.status.success());
    let small = s.run(&["get", "--node", "A", "q", "--max-bytes", "10"]);
    assert!(!small.status.success());
    assert!(support::stderr(&small).contains("over this get's limit of 10"), "{}", support::stderr(&small));
    let get = s.run(&["get", "--node", "A", "q"]);
    let text = stdout(&get);
    assert!(text == "0123456789\n", "still there, and `linkbus get` acknowledges it: {} bytes", text.len());
    let empty = s.run(&["get", "--node", "A", "q"]);
    assert!(!empty.status.success(), "acknowledged: gone");
}

#[test]
fn a_message_backed_out_to_its_queues_threshold_moves_to_the_backout_queue() {
    let s = Scratch::new();
    let yaml = "queues: [ { name: q, backout_threshold: 2, backout_queue: poison }, { name: poison }, \
                { name: d, backout_threshold: 1 } ]\n";
    let config = s.path().join("A.yaml");
    std::fs::write(&config, format!("node: {{ name: A }}\n{yaml}")).unwrap();
    let data = s.path().join("A-data");
    let a = s.start_node(
        "A",
        &["-c", config.to_str().unwrap(), "--listen", "none", "--data-dir", data.to_str().unwrap()],
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut c = Client::connect(&a.socket).await.unwrap();
        for text in ["bad", "good"] {
            c.put(Content::buf("A:q".parse().unwrap(), text)).await.unwrap();
        }
        // Backed out once: it comes back. Twice: it moves to `poison`, never seen in q again.
        for round in 0..2u16 {
            let taken = c.get_pending("q", 1, Duration::ZERO, u64::MAX).await.unwrap();
            assert_eq!(payloads([taken[0].message.clone()]), [("bad".into(), round > 0, round)]);
            assert_eq!(c.backout("q", &[taken[0].tag]).await.unwrap(), 1);
        }
        assert_eq!(payloads(c.get("q", 10, Duration::ZERO).await.unwrap()), [("good".into(), false, 0)]);
        let poison = c.get("poison", 1, Duration::from_secs(5)).await.unwrap();
        assert_eq!(payloads(poison.clone()), [("bad".into(), true, 2)]);
        assert_eq!(poison[0].content.header("linkbus.dead_letter_code"), Some("backout_threshold"));
        // A consumer that goes away holding it counts as a backout too: `d` sends to the DLQ.
        c.put(Content::buf("A:d".parse().unwrap(), "dies")).await.unwrap();
        let mut consumer = Client::connect(&a.socket).await.unwrap();
        assert_eq!(consumer.get_pending("d", 1, Duration::ZERO, u64::MAX).await.unwrap().len(), 1);
        drop(consumer);
        let dead = c.get("DLQ", 1, Duration::from_secs(5)).await.unwrap();
        assert_eq!(payloads(dead), [("dies".into(), true, 1)]);
        assert!(c.get("d", 10, Duration::ZERO).await.unwrap().is_empty(), "gone from d");
    });
    let events = stdout(&s.run(&["events", "--node", "A"]));
    assert!(events.contains("dead_letter") && events.contains("(backout_threshold) into poison"), "{events}");
}
