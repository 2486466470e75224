//! The node's put, delivery, dead-letter, transaction and store-contract rules, in process.
use std::time::Instant;

use linkbus_plugin_api::{Address, Batch, Lifetime, Message, MessageId, Priority, StoreError};

use super::*;
use crate::config::{self, Overrides};
use crate::events::EventKind;
use crate::flow::dead_letter::{DEAD_LETTER_QUEUE, DEAD_LETTER_REASON_HEADER};
use crate::flow::inbound::{Arrival, Inbound};
use crate::flow::{Accepted, Origin, PutError, RefusalCode};
use crate::queue::{EVENT_QUEUE, QueueError};
use crate::results::{Outcome, RESULT_FOR_HEADER, RESULT_MESSAGE_NAME};

/// A client's put that waits for nothing (as a try-put), from outside the runtime.
fn put(n: &NodeState, contents: Vec<Content>) -> Result<Accepted, PutError> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(Origin::default().put(n, contents, std::time::Duration::ZERO))
}

/// `message` arriving on the link from B.
fn deliver(n: &NodeState, message: Message, now: Instant) -> Result<(), QueueError> {
    let mut inbound = Inbound::new(n, &NodeName::new("B").unwrap());
    inbound.take(n, vec![Arrival { message, record: Batch::new() }], now).1
}

fn node(extra: &str) -> Arc<NodeState> {
    testing::node_from(&format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B }} ]\nqueues: [ {{ name: q }} ]\n\
         security: {{ insecure_plaintext: true }}\nplugins: {{ store: {{ kind: memory }} }}\n{extra}"
    ))
}

use testing::routed_node;

#[test]
fn records_from_before_routing_keep_only_the_recipients_of_their_link() {
    let n = routed_node();
    let mut content = Content::buf("B:q".parse().unwrap(), "x");
    content.recipients.extend(["C:q".parse().unwrap(), "D1:q".parse().unwrap()]);
    let message = crate::flow::origin::stamp(&n, content, 0);
    let stored = || crate::link::state::Stored {
        number: 1,
        channel: 0,
        bytes: linkbus_proto::wire::message_bytes(&message),
        message: message.clone(),
        age: std::time::Duration::ZERO,
    };
    let mut for_b = stored();
    start::keep_recipients_routed_through(&mut for_b, &NodeName::new("B").unwrap(), &n.routing);
    let to: Vec<String> = for_b.message.content.recipients.iter().map(ToString::to_string).collect();
    assert_eq!(to, ["B:q", "D1:q"]);
    assert_eq!(linkbus_proto::wire::decode_message(for_b.bytes).unwrap(), for_b.message, "bytes follow");
    let mut for_z = stored();
    start::keep_recipients_routed_through(&mut for_z, &NodeName::new("Z").unwrap(), &n.routing);
    assert_eq!(for_z.message, message, "none routed there: kept whole");
}

fn refusal(node: &NodeState, content: Content) -> (RefusalCode, String) {
    let e = put(node, vec![Content::buf("A:q".parse().unwrap(), "ok"), content]).unwrap_err();
    assert_eq!(e.accepted, 1, "the content before the refused one stays accepted");
    (e.code, e.message)
}

#[test]
fn puts_are_checked_before_anything_is_queued() {
    let n = node(
        "messages: { message_bytes_max: 1000 }\nlinks: { frame_bytes_max: 2048, packet_bytes_max: 1024 }",
    );
    let to = |a: &str| a.parse().unwrap();
    assert_eq!(refusal(&n, Content::buf(to("A:none"), "x")).0, RefusalCode::UnknownQueue);
    assert_eq!(refusal(&n, Content::buf(to("Z:q"), "x")).0, RefusalCode::NoRoute);
    assert_eq!(refusal(&n, Content::buf(to("B:q"), vec![0u8; 1001])).0, RefusalCode::TooLarge);
    let system = Content::buf(to("B:q"), "x").with_priority(Priority::SYSTEM);
    assert_eq!(refusal(&n, system).0, RefusalCode::Invalid);
    assert_eq!(n.queues.get("q").unwrap().len(), 4, "one accepted per refused batch");
    // The largest envelope with the largest payload is accepted (and cut into packets).
    let mut largest = Content::buf(to("B:q"), vec![0u8; 1000]);
    largest.headers = (0..64).map(|i| (format!("{i:0>128}"), "v".repeat(4096))).collect();
    largest.name = "n".repeat(48 * 1024);
    largest.recipients = smallvec::smallvec![to("B:q"); 64];
    largest.group = Some(linkbus_plugin_api::Group { id: "g".repeat(128), index: 0, last: true });
    largest.correlation_id = Some(bytes::Bytes::from(vec![1u8; 128]));
    assert!(put(&n, vec![largest]).is_ok());
}

#[test]
fn results_are_recorded_from_here_and_from_peers_and_open_ones_time_out() {
    let n = node("messages: { result_wait_ms: 100 }");
    let mut content =
        Content::buf("B:q".parse().unwrap(), "x").with_results().with_lifetime(Lifetime::from_ms(100));
    content.recipients.extend(["B:r".parse().unwrap(), "A:q".parse().unwrap()]);
    let Accepted { sequences, created_unix_ms: created } = put(&n, vec![content]).unwrap();
    let id = MessageId { source: n.name().clone(), sequence: sequences[0], created_unix_ms: created };
    let outcomes = |n: &NodeState| -> Vec<Option<Outcome>> {
        n.results.get(&sequences)[0].clone().unwrap().recipients.into_iter().map(|(_, o)| o).collect()
    };
    assert_eq!(outcomes(&n), [None, None, Some(Outcome::Delivered)], "the local recipient at once");

    // B's result message for B:r; a look-alike from a client (not the system priority)
    // is an ordinary message.
    let report =
        crate::results::encode_report(&[("B:r".parse().unwrap(), Outcome::failed("queue_missing", "no r"))]);
    let mut result = Content::buf(format!("A:{EVENT_QUEUE}").parse().unwrap(), report)
        .with_priority(linkbus_plugin_api::Priority::SYSTEM);
    result.kind = linkbus_plugin_api::Kind::Event;
    result.name = RESULT_MESSAGE_NAME.into();
    result.headers.push((RESULT_FOR_HEADER.into(), id.to_string()));
    let from_b = |content: Content| Message {
        encoding: Default::default(),
        id: MessageId { source: NodeName::new("B").unwrap(), sequence: 1, created_unix_ms: 0 },
        hop_count: 0,
        redelivered: false,
        backout_count: 0,
        content: Box::new(content),
    };
    let mut forged = result.clone().with_priority(Priority::level(9).unwrap());
    forged.payload = crate::results::encode_report(&[("B:q".parse().unwrap(), Outcome::Delivered)]).into();
    deliver(&n, from_b(forged), Instant::now()).unwrap();
    deliver(&n, from_b(result), Instant::now()).unwrap();
    assert_eq!(outcomes(&n)[..2], [None, Some(Outcome::failed("queue_missing", "no r"))]);

    // Nothing came back for B:q within lifetime + result wait.
    // (Well before: the test may run slowly between the put and here.)
    n.time_out_results(Instant::now() + std::time::Duration::from_millis(120));
    assert_eq!(outcomes(&n)[0], None);
    n.time_out_results(Instant::now() + std::time::Duration::from_millis(300));
    assert_eq!(outcomes(&n)[0], Some(Outcome::TimedOut));
    assert_eq!(n.results.pending(), 0);

    let events = n.queues.get(EVENT_QUEUE).unwrap().pop(crate::queue::PopLimits::auto(10), Instant::now());
    let kinds: Vec<_> =
        events.messages.iter().map(|m| m.content.header("linkbus.result").unwrap_or("-")).collect();
    assert_eq!(
        kinds,
        ["delivered", "-", "failed", "result_wait_timed_out"],
        "the forged one is just a message"
    );
}

#[test]
fn arrivals_for_missing_queues_or_other_nodes_are_dead_lettered() {
    let n = node("");
    let now = Instant::now();
    let message = |to: &str| Message {
        encoding: Default::default(),
        id: MessageId { source: NodeName::new("B").unwrap(), sequence: 1, created_unix_ms: 0 },
        hop_count: 0,
        redelivered: false,
        backout_count: 0,
        content: Box::new(Content::buf(to.parse().unwrap(), "x")),
    };
    let mut twice = message("A:q");
    twice.content.recipients.push("A:q".parse().unwrap());
    deliver(&n, twice, now).unwrap();
    deliver(&n, message("A:missing"), now).unwrap();
    deliver(&n, message("C:q"), now).unwrap();
    assert_eq!(n.queues.get("q").unwrap().len(), 1, "a queue named twice gets one copy");
    let dead = n.queues.get(DEAD_LETTER_QUEUE).unwrap().pop(crate::queue::PopLimits::auto(10), now);
    let reasons: Vec<_> =
        dead.messages.iter().map(|m| m.content.header(DEAD_LETTER_REASON_HEADER).unwrap()).collect();
    assert_eq!(reasons, ["queue 'missing' does not exist on node A", "no route to node 'C'"]);
}

/// A store that loses what was not synced when it "crashes", and records which thread
/// wrote or synced it.
#[derive(Default)]
struct CrashStore {
    live: linkbus_store_memory::MemoryStore,
    synced: linkbus_store_memory::MemoryStore,
    unsynced: std::sync::Mutex<Vec<Batch>>,
    writers: std::sync::Mutex<Vec<String>>,
}

impl CrashStore {
    fn note_writer(&self) {
        let name = std::thread::current().name().unwrap_or("unnamed").to_owned();
        self.writers.lock().unwrap().push(name);
    }

    fn flush(&self) {
        for batch in self.unsynced.lock().unwrap().drain(..) {
            self.synced.write(batch, true).unwrap();
        }
    }

    /// The store as a restart after a crash finds it: synced writes only.
    fn after_crash(&self) -> linkbus_store_memory::MemoryStore {
        let after = linkbus_store_memory::MemoryStore::new();
        for space in self.synced.spaces().unwrap() {
            let mut batch = Batch::new();
            for (k, v) in self
                .synced
                .scan(&space, std::ops::Bound::Unbounded, std::ops::Bound::Unbounded, usize::MAX)
                .unwrap()
            {
                batch.put(&space, k, v);
            }
            after.write(batch, true).unwrap();
        }
        after
    }
}

impl Store for CrashStore {
    fn durable(&self) -> bool {
        true
    }
    fn write(&self, batch: Batch, sync: bool) -> Result<(), StoreError> {
        self.note_writer();
        self.live.write(batch.clone(), false)?;
        self.unsynced.lock().unwrap().push(batch);
        if sync {
            self.flush();
        }
        Ok(())
    }
    fn get(&self, space: &str, key: &[u8]) -> Result<Option<bytes::Bytes>, StoreError> {
        self.live.get(space, key)
    }
    fn scan(
        &self,
        space: &str,
        from: std::ops::Bound<&[u8]>,
        to: std::ops::Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(bytes::Bytes, bytes::Bytes)>, StoreError> {
        self.live.scan(space, from, to, limit)
    }
    fn spaces(&self) -> Result<Vec<String>, StoreError> {
        self.live.spaces()
    }
    fn sync(&self) -> Result<(), StoreError> {
        self.note_writer();
        self.flush();
        Ok(())
    }
}

/// Node A (no peers, `queues` YAML) on a [`CrashStore`].
fn crash_store_node(queues: &str) -> (Arc<NodeState>, Arc<CrashStore>) {
    let text = format!(
        "node: {{ name: A, listen: none }}\n{queues}\nsecurity: {{ insecure_plaintext: true }}\n\
         plugins: {{ store: {{ kind: memory }} }}"
    );
    let mut tree = config::parse_yaml(&text).unwrap();
    config::apply_overrides(&mut tree, &Overrides::default());
    let mut config = config::from_value(&tree).unwrap();
    let transport = start::build_plugins(&mut config).unwrap().0;
    let store = Arc::new(CrashStore::default());
    (NodeState::with_plugins(config, transport, store.clone()).unwrap(), store)
}

/// Client subscriptions are written (and synced) by the store thread, never by the
/// request that makes them, and are in force once that returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_are_written_by_the_store_thread_only() {
    let (n, store) = crash_store_node("queues: [ { name: q }, { name: ops } ]");
    store.writers.lock().unwrap().clear();
    let ops: Address = "A:ops".parse().unwrap();
    n.subscribe(&ops, &[EventKind::Expired]).await.unwrap();
    assert_eq!(n.subscriptions.targets(EventKind::Expired), std::slice::from_ref(&ops));
    assert!(
        store.after_crash().get(crate::events::SUBSCRIPTIONS_SPACE, b"A:ops").unwrap().is_some(),
        "synced"
    );
    n.unsubscribe(&ops).await.unwrap();
    assert!(n.subscriptions.targets(EventKind::Expired).is_empty());
    assert!(
        store.after_crash().get(crate::events::SUBSCRIPTIONS_SPACE, b"A:ops").unwrap().is_none(),
        "synced"
    );
    let writers = store.writers.lock().unwrap().clone();
    assert!(!writers.is_empty() && writers.iter().all(|w| w == "linkbus-store"), "{writers:?}");
}

/// A put's messages to one link go in runs, each checked and queued at once when it
/// fits; a run without room goes one message at a time, so as many as fit are accepted
/// and the refusal counts them; other messages break a run, and order holds throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_of_a_put_are_queued_together_and_one_at_a_time_when_they_do_not_fit() {
    let n = node("links: { queue_messages_max: 700, queue_pace_bytes: 0 }");
    let link = n.links.get(&NodeName::new("B").unwrap()).unwrap().clone();
    let to = |address: &str, i: usize| Content::buf(address.parse().unwrap(), format!("m{i}"));
    let wait = std::time::Duration::from_secs(1);
    // 600 to B: runs of 256, 256 and 88, all fitting.
    let Accepted { sequences, .. } =
        Origin::default().put(&n, (0..600).map(|i| to("B:q", i)).collect(), wait).await.unwrap();
    assert_eq!(sequences.len(), 600);
    assert!(sequences.windows(2).all(|w| w[1] == w[0] + 1), "one id each, in order");
    assert_eq!(link.queued(), 600);
    // Local messages and a message wanting results end runs; each goes where it should.
    let mut mixed: Vec<Content> = (0..5).map(|i| to("B:q", i)).collect();
    mixed.extend((0..3).map(|i| to("A:q", i)));
    mixed.push(to("B:q", 99).with_results());
    mixed.extend((0..4).map(|i| to("B:q", i)));
    let Accepted { sequences, .. } = Origin::default().put(&n, mixed, wait).await.unwrap();
    assert!(sequences.windows(2).all(|w| w[1] > w[0]), "in the order given");
    assert_eq!((link.queued(), n.queues.get("q").unwrap().len()), (610, 3));
    // 200 more with room for 90: the run does not fit, so they go one at a time.
    let e =
        Origin::default().put(&n, (0..200).map(|i| to("B:q", i)).collect(), std::time::Duration::ZERO).await;
    let e = e.unwrap_err();
    assert_eq!((e.code, e.accepted), (RefusalCode::Full, 90), "{}", e.message);
    assert!(e.message.starts_with("message 91:"), "{}", e.message);
    assert_eq!(link.queued(), 700);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_persistent_puts_survive_a_crash_and_the_negative_control_loses_them() {
    for ack_before_sync in [false, true] {
        let (n, store) = crash_store_node("queues: [ { name: q } ]");
        n.ack_before_sync.store(ack_before_sync, Ordering::Relaxed);
        for i in 0..50 {
            let content = Content::buf("A:q".parse().unwrap(), format!("m{i}"))
                .with_reliability(linkbus_plugin_api::Reliability::Persistent);
            Origin::default().put(&n, vec![content], std::time::Duration::from_secs(1)).await.unwrap();
        }
        // A crash now: what a restart finds.
        let after: Arc<dyn Store> = Arc::new(store.after_crash());
        let q = LocalQueue::open(
            n.config.queues[0].clone(),
            after.as_ref(),
            Arc::new(crate::storage::Committer::direct(after.clone())),
            Arc::new(tokio::sync::Notify::new()),
            Instant::now(),
        )
        .unwrap();
        if ack_before_sync {
            assert!(q.len() < 50, "the negative control must lose acknowledged messages ({} kept)", q.len());
        } else {
            assert_eq!(q.len(), 50, "every acknowledged persistent put survives");
        }
    }
}
