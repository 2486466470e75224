//! Micro-benchmarks of the node's in-memory queues: a link's transmission queue (through
//! [`linkbus_host::link::LinkHandle`], the way puts fill it) and local queues
//! ([`linkbus_host::queue::LocalQueue`]) with a memory store.
//!
//! The transmission queue's `pop` (the link task draining it into the session) is
//! crate-private, so only the enqueue side is measured here.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use divan::Bencher;
use divan::counter::{BytesCount, ItemsCount};
use linkbus_host::config::{PeerConfig, QueueConfig, QueueOrder, WhenFull};
use linkbus_host::link::LinkHandle;
use linkbus_host::queue::{LocalQueue, PopLimits};
use linkbus_host::storage::Committer;
use linkbus_plugin_api::message::PRIORITY_LEVEL_MAX;
use linkbus_plugin_api::{Content, Message, MessageId, NodeName, Priority, QueueName, Reliability, Store};
use linkbus_store_memory::MemoryStore;
use tokio::sync::Notify;

/// Payload sizes measured where the payload is touched.
const SIZES: [usize; 3] = [64, 1024, 64 * 1024];

/// Messages pushed (and popped) per iteration.
const BATCH: usize = 1_000;

/// Messages one get takes from a local queue.
const GET_COUNT_MAX: usize = 100;

fn main() {
    divan::main();
}

/// Message `n` of a batch, at `priority`, sharing `payload` with the others.
fn message(n: usize, payload: &Bytes, priority: Priority, reliability: Reliability) -> Message {
    Message {
        encoding: Default::default(),
        id: MessageId {
            source: NodeName::new("A").expect("valid name"),
            sequence: n as u64 + 1,
            created_unix_ms: 0,
        },
        hop_count: 0,
        redelivered: false,
        backout_count: 0,
        content: Box::new(
            Content::buf("B:orders".parse().expect("valid address"), payload.clone())
                .with_priority(priority)
                .with_reliability(reliability),
        ),
    }
}

/// The priority of message `n` when a batch is spread over every level and the system
/// class.
fn spread(n: usize) -> Priority {
    let code = (n % (PRIORITY_LEVEL_MAX as usize + 2)) as u8;
    Priority::from_code(code).expect("a level or the system class")
}

/// A batch of messages with payloads of `size` bytes; `priority` picks each one's.
fn batch(size: usize, priority: impl Fn(usize) -> Priority, reliability: Reliability) -> Vec<Message> {
    let payload = Bytes::from(vec![0x5a; size]);
    (0..BATCH).map(|n| message(n, &payload, priority(n), reliability)).collect()
}

/// `LinkHandle::enqueue_checked`: a batch spread over every priority class queued for a
/// peer (volatile, so nothing is recorded), as puts routed to a link do.
#[divan::bench]
fn transmission_queue_enqueue(bencher: Bencher) {
    let peer = PeerConfig {
        name: NodeName::new("B").expect("valid name"),
        address: None,
        permanent: true,
        public_key: None,
    };
    let now = Instant::now();
    bencher
        .counter(ItemsCount::new(BATCH))
        .with_inputs(|| {
            let handle =
                LinkHandle::new(peer.clone(), (BATCH as u64, u64::MAX), 50, Arc::new(Notify::new()), None);
            (handle, batch(64, spread, Reliability::Volatile))
        })
        .bench_local_values(|(handle, messages)| {
            for message in messages {
                handle.enqueue_checked(message, now);
            }
            handle
        });
}

/// A local queue named `q` on a memory store, holding up to a batch.
fn local_queue(order: QueueOrder) -> LocalQueue {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let config = QueueConfig {
        name: QueueName::new("q").expect("valid name"),
        order,
        queue_messages_max: BATCH as u64,
        message_bytes_max: 1 << 20,
        reliability: Reliability::Volatile,
        when_full: WhenFull::Reject,
        backout_threshold: None,
        backout_queue: None,
    };
    let committer = Arc::new(Committer::direct(store.clone()));
    LocalQueue::open(config, store.as_ref(), committer, Arc::new(Notify::new()), Instant::now())
        .expect("a memory store opens")
}

/// Pushes `messages` into `queue`, then takes them all out in gets of
/// [`GET_COUNT_MAX`], acknowledged at once; returns what was taken.
fn push_then_get(queue: &LocalQueue, messages: Vec<Message>, now: Instant) -> Vec<Message> {
    for message in messages {
        queue.push(message, now).expect("the queue has room");
    }
    let mut taken = Vec::with_capacity(BATCH);
    while taken.len() < BATCH {
        let popped = queue.pop(PopLimits::auto(GET_COUNT_MAX), now);
        assert!(!popped.messages.is_empty(), "the queue holds the rest");
        taken.extend(popped.messages);
    }
    taken
}

/// Measures [`push_then_get`] for batches built by `priority` and `reliability`. Only a
/// persistent message's payload is touched (encoded into the store), so only then are
/// bytes counted.
fn bench_local_queue(
    bencher: Bencher,
    size: usize,
    order: QueueOrder,
    priority: fn(usize) -> Priority,
    reliability: Reliability,
) {
    let queue = local_queue(order);
    let now = Instant::now();
    let mut bencher = bencher.counter(ItemsCount::new(BATCH));
    if reliability == Reliability::Persistent {
        bencher = bencher.counter(BytesCount::new(BATCH * size));
    }
    bencher
        .with_inputs(|| batch(size, priority, reliability))
        .bench_local_values(|messages| push_then_get(&queue, messages, now));
}

/// `LocalQueue::push` and `pop` of a FIFO queue; volatile, so the store is not written
/// and the payload size does not matter.
#[divan::bench]
fn local_queue_fifo_volatile(bencher: Bencher) {
    bench_local_queue(bencher, 64, QueueOrder::Fifo, |_| Priority::DEFAULT, Reliability::Volatile);
}

/// `LocalQueue::push` and `pop` of a FIFO queue; persistent, so every message is encoded
/// and written through to the (memory) store, and deleted when taken.
#[divan::bench(args = SIZES)]
fn local_queue_fifo_persistent(bencher: Bencher, size: usize) {
    bench_local_queue(bencher, size, QueueOrder::Fifo, |_| Priority::DEFAULT, Reliability::Persistent);
}

/// `LocalQueue::push` and `pop` of a priority queue with the batch spread over every
/// level and the system class; volatile.
#[divan::bench]
fn local_queue_priority_volatile(bencher: Bencher) {
    bench_local_queue(bencher, 64, QueueOrder::Priority, spread, Reliability::Volatile);
}
