//! Local queues: order, limits, expiry, pending messages, write-through and recovery.
use super::record::RECORD_HEADER_BYTES;
use super::*;
use linkbus_plugin_api::{Content, MessageId, NodeName, Priority, Reliability};
use linkbus_store_memory::MemoryStore;
use std::ops::Bound;
use std::time::Duration;

fn queue(order: QueueOrder, max: u64, store: Arc<dyn Store>) -> LocalQueue {
    open(config(order, max, 1024), &store).unwrap()
}

fn message(n: u64, priority: u8, lifetime_ms: u64) -> Message {
    let content = Content::buf("A:q".parse().unwrap(), n.to_string())
        .with_priority(Priority::level(priority).unwrap())
        .with_lifetime(Lifetime::from_ms(lifetime_ms))
        .with_reliability(Reliability::Persistent);
    Message {
        encoding: Default::default(),
        id: MessageId { source: NodeName::new("A").unwrap(), sequence: n, created_unix_ms: 0 },
        hop_count: 0,
        redelivered: false,
        backout_count: 0,
        content: Box::new(content),
    }
}

fn sequences(p: &Popped) -> Vec<u64> {
    p.messages.iter().map(|m| m.id.sequence).collect()
}

#[test]
fn priority_order_and_fifo_within_a_level() {
    let q = queue(QueueOrder::Priority, 10, Arc::new(MemoryStore::new()));
    let now = Instant::now();
    for (n, p) in [(1, 1), (2, 9), (3, 1), (4, 9), (5, 4)] {
        q.push(message(n, p, 60_000), now).unwrap();
    }
    assert_eq!(sequences(&q.pop(PopLimits::auto(10), now)), [2, 4, 5, 1, 3]);
    let f = queue(QueueOrder::Fifo, 10, Arc::new(MemoryStore::new()));
    for (n, p) in [(1, 1), (2, 9), (3, 1)] {
        f.push(message(n, p, 60_000), now).unwrap();
    }
    assert_eq!(sequences(&f.pop(PopLimits::auto(10), now)), [1, 2, 3]);
}

/// A queue read as a log (`EVENT`) makes room by dropping its oldest volatile
/// messages; followers read what came after a key, in order, without taking it.
#[test]
fn a_log_drops_its_oldest_and_followers_read_after_a_key() {
    let q = queue(QueueOrder::Fifo, 3, Arc::new(MemoryStore::new()));
    let now = Instant::now();
    let volatile = |n| {
        let mut m = message(n, 4, 60_000);
        m.content.reliability = Reliability::Volatile;
        m
    };
    for n in 1..=5 {
        q.drop_oldest_for(1);
        q.push(volatile(n), now).unwrap();
    }
    let all = q.browse_after(0, 10, usize::MAX, now);
    let seen: Vec<u64> = all.iter().map(|(_, m)| m.id.sequence).collect();
    assert_eq!(seen, [3, 4, 5], "the oldest two made room");
    let after = all.first().map(|(key, _)| *key).unwrap();
    let newer: Vec<u64> =
        q.browse_after(after, 10, usize::MAX, now).iter().map(|(_, m)| m.id.sequence).collect();
    assert_eq!(newer, [4, 5]);
    assert_eq!(q.len(), 3, "reading took nothing");
    // A stored message is never dropped that way.
    let p = queue(QueueOrder::Fifo, 1, Arc::new(MemoryStore::new()));
    p.push(message(1, 4, 60_000), now).unwrap();
    assert_eq!(p.drop_oldest_for(1), 0);
}

#[test]
fn full_queue_refuses_and_expired_messages_are_dropped() {
    let q = queue(QueueOrder::Fifo, 2, Arc::new(MemoryStore::new()));
    let now = Instant::now();
    q.push(message(1, 4, 100), now).unwrap();
    q.push(message(2, 4, 60_000), now).unwrap();
    assert!(matches!(q.push(message(3, 4, 100), now), Err(QueueError::Full { max: 2, .. })));
    let popped = q.pop(PopLimits::auto(10), now + Duration::from_millis(500));
    assert_eq!((sequences(&popped), popped.expired), (vec![2], 1));
    assert_eq!(popped.messages[0].content.lifetime, Some(Lifetime::from_ms(59_500)));
    assert!(q.is_empty());
}

#[test]
fn messages_are_written_through_and_recovered() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let now = Instant::now();
    let q = queue(QueueOrder::Fifo, 10, store.clone());
    for n in 1..=3 {
        q.push(message(n, 4, 60_000), now).unwrap();
    }
    assert_eq!(sequences(&q.pop(PopLimits::auto(1), now)), [1]);
    let reopened = queue(QueueOrder::Fifo, 10, store);
    assert_eq!(sequences(&reopened.pop(PopLimits::auto(10), now)), [2, 3]);
}

#[test]
fn a_stored_message_shares_its_payload_with_its_record_and_a_volatile_one_is_left_alone() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let now = Instant::now();
    let q = queue(QueueOrder::Fifo, 10, store.clone());
    // Payloads cut out of one larger buffer, as a client's request may give them.
    let buffer = Bytes::from(vec![5u8; 4096]);
    let (mut stored, mut volatile) = (message(1, 4, 60_000), message(2, 4, 60_000));
    stored.content.payload = buffer.slice(..100);
    volatile.content.payload = buffer.slice(100..200);
    volatile.content.reliability = Reliability::Volatile;
    q.push(stored, now).unwrap();
    q.push(volatile, now).unwrap();
    let records = store.scan("q.q", Bound::Unbounded, Bound::Unbounded, 10).unwrap();
    assert_eq!(records.len(), 1, "only the persistent message is written");
    let record = &records[0].1;
    let popped = q.pop(PopLimits::auto(10), now);
    let (stored, volatile) = (&popped.messages[0], &popped.messages[1]);
    assert_eq!(stored.content.payload, vec![5u8; 100]);
    let inside = |part: &Bytes, whole: &Bytes| {
        whole.as_ptr_range().contains(&part.as_ptr()) && part.as_ptr_range().end <= whole.as_ptr_range().end
    };
    assert!(inside(&stored.content.payload, record), "the payload is the record's last bytes");
    assert!(record.ends_with(&stored.content.payload));
    assert!(inside(&volatile.content.payload, &buffer), "a volatile payload stays where it was");
    assert_eq!(decode_record(record.clone()).unwrap().0, *stored);
    drop(popped);
    assert!(buffer.try_into_mut().is_ok(), "nothing holds the larger buffer any more");
}

#[test]
fn restored_messages_come_first_and_survive_reopening() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let now = Instant::now();
    let q = queue(QueueOrder::Fifo, 10, store.clone());
    for n in 1..=4 {
        q.push(message(n, 4, 60_000), now).unwrap();
    }
    let taken = q.pop(PopLimits::auto(2), now);
    assert!(q.has_room(8) && !q.has_room(9));
    q.restore(taken.messages, now);
    assert!(!q.has_room(7));
    let reopened = queue(QueueOrder::Fifo, 10, store);
    assert_eq!(sequences(&reopened.pop(PopLimits::auto(10), now)), [1, 2, 3, 4]);
}

#[test]
fn a_message_larger_than_the_caller_takes_stays_and_names_its_size() {
    let q = queue(QueueOrder::Fifo, 10, Arc::new(MemoryStore::new()));
    let now = Instant::now();
    q.push(message(10, 4, 60_000), now).unwrap();
    let size = linkbus_proto::wire::message_encoded_len(1, &message(10, 4, 60_000).content);
    let small = PopLimits { message_bytes_max: size - 1, ..PopLimits::auto(10) };
    let popped = q.pop(small, now);
    assert!(popped.messages.is_empty());
    assert_eq!(popped.too_large, Some(size));
    assert_eq!(q.len(), 1, "it stays queued");
    assert_eq!(sequences(&q.pop(PopLimits { message_bytes_max: size, ..small }, now)), [10]);
}

#[test]
fn pending_messages_leave_on_ack_and_come_back_on_backout() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let q = queue(QueueOrder::Priority, 4, store.clone());
    let now = Instant::now();
    for (n, p) in [(1, 4), (2, 4), (3, 9), (4, 4)] {
        q.push(message(n, p, 60_000), now).unwrap();
    }
    let pending = PopLimits { pending: true, ..PopLimits::auto(3) };
    let popped = q.pop(pending, now);
    assert_eq!(sequences(&popped), [3, 1, 2]);
    assert_eq!((q.len(), q.pending()), (1, 3));
    assert!(!q.has_room(1), "pending messages still take room");
    assert!(matches!(q.ack(&[popped.tags[0], 12345]), Err(SettleError::Unknown(_))), "nothing done");
    q.ack(&[popped.tags[0]]).unwrap();
    q.backout(&popped.tags[1..], now).unwrap();
    assert_eq!((q.len(), q.pending()), (3, 0));
    let again = q.pop(PopLimits::auto(10), now);
    assert_eq!(sequences(&again), [1, 2, 4], "backed-out messages return to the head, in order");
    assert!(again.messages[0].redelivered && again.messages[0].backout_count == 1);
    assert!(!again.messages[2].redelivered);
    // A pending message survives in the store (a restart hands it out again).
    for n in 5..=6 {
        q.push(message(n, 4, 60_000), now).unwrap();
    }
    let _ = q.pop(PopLimits { pending: true, ..PopLimits::auto(1) }, now);
    let reopened = queue(QueueOrder::Priority, 4, store);
    assert_eq!(sequences(&reopened.pop(PopLimits::auto(10), now)), [5, 6]);
}

#[test]
fn a_later_message_over_the_limit_ends_the_get_without_failing_it() {
    let q = queue(QueueOrder::Fifo, 10, Arc::new(MemoryStore::new()));
    let now = Instant::now();
    q.push(message(1, 4, 60_000), now).unwrap();
    let mut big = message(2, 4, 60_000);
    big.content.payload = bytes::Bytes::from(vec![0u8; 5_000]);
    q.push(big, now).unwrap();
    let limits = PopLimits { message_bytes_max: 1_000, ..PopLimits::auto(10) };
    let popped = q.pop(limits, now);
    assert_eq!((sequences(&popped), popped.too_large), (vec![1], None));
    assert_eq!(q.pop(limits, now).too_large.map(|s| s > 5_000), Some(true));
}

#[test]
fn time_out_pending_counts_against_the_lifetime() {
    let q = queue(QueueOrder::Fifo, 10, Arc::new(MemoryStore::new()));
    let now = Instant::now();
    q.push(message(1, 4, 1_000), now).unwrap();
    q.push(message(2, 4, 60_000), now).unwrap();
    let popped = q.pop(PopLimits { pending: true, ..PopLimits::auto(2) }, now);
    let later = now + Duration::from_secs(10);
    q.backout(&popped.tags, later).unwrap();
    let again = q.pop(PopLimits::auto(10), later);
    assert_eq!(sequences(&again), [2], "the 1 s message ran out while it was out");
    assert_eq!(again.messages[0].content.lifetime, Some(Lifetime::from_ms(50_000)));
}

#[test]
fn a_message_pending_when_the_node_stops_comes_back_marked() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let now = Instant::now();
    let q = queue(QueueOrder::Fifo, 10, store.clone());
    q.push(message(1, 4, 60_000), now).unwrap();
    let popped = q.pop(PopLimits { pending: true, ..PopLimits::auto(1) }, now);
    assert!(!popped.messages[0].redelivered, "first hand-out");
    let reopened = queue(QueueOrder::Fifo, 10, store);
    let again = reopened.pop(PopLimits::auto(1), now);
    assert!(again.messages[0].redelivered, "it may have been seen before the stop");
}

#[test]
fn pop_respects_the_byte_budget_but_always_takes_one() {
    let q = queue(QueueOrder::Fifo, 10, Arc::new(MemoryStore::new()));
    let now = Instant::now();
    for n in 10..13 {
        q.push(message(n, 4, 60_000), now).unwrap();
    }
    let one = linkbus_proto::wire::message_encoded_len(1, &message(10, 4, 60_000).content);
    let limits = |total| PopLimits { total_bytes_max: total, ..PopLimits::auto(10) };
    assert_eq!(sequences(&q.pop(limits(1), now)), [10]);
    assert_eq!(sequences(&q.pop(limits(2 * one), now)), [11, 12]);
}

fn config(order: QueueOrder, max: u64, bytes_max: u64) -> QueueConfig {
    QueueConfig {
        name: QueueName::new("q").unwrap(),
        order,
        queue_messages_max: max,
        message_bytes_max: bytes_max,
        reliability: Reliability::Volatile,
        when_full: crate::config::WhenFull::Block,
        backout_threshold: None,
        backout_queue: None,
    }
}

fn open(config: QueueConfig, store: &Arc<dyn Store>) -> Result<LocalQueue, StoreError> {
    LocalQueue::open(
        config,
        store.as_ref(),
        Arc::new(Committer::direct(store.clone())),
        Arc::new(Notify::new()),
        Instant::now(),
    )
}

#[test]
fn volatile_messages_stay_out_of_the_store() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let q = queue(QueueOrder::Fifo, 10, store.clone());
    let mut volatile = message(1, 4, 60_000);
    volatile.content.reliability = Reliability::Volatile;
    q.push(volatile, Instant::now()).unwrap();
    q.push(message(2, 4, 60_000), Instant::now()).unwrap();
    let stored = store.scan("q.q", Bound::Unbounded, Bound::Unbounded, 10).unwrap();
    assert_eq!(stored.len(), 1, "only the persistent one");
    let popped = q.pop(PopLimits::auto(10), Instant::now());
    assert_eq!(popped.messages.len(), 2);
    assert!(store.scan("q.q", Bound::Unbounded, Bound::Unbounded, 10).unwrap().is_empty());
}

#[test]
fn recovery_reorganises_changed_orders_and_refuses_lowered_limits() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let fifo = open(config(QueueOrder::Fifo, 10, 1024), &store).unwrap();
    for (n, priority) in [(1, 2), (2, 9), (3, 5)] {
        fifo.push(message(n, priority, 60_000), Instant::now()).unwrap();
    }
    drop(fifo);
    // FIFO to priority: by priority, then arrival.
    let by_priority = open(config(QueueOrder::Priority, 10, 1024), &store).unwrap();
    assert_eq!(
        sequences(&by_priority.pop(PopLimits { pending: true, ..PopLimits::auto(10) }, Instant::now())),
        [2, 3, 1]
    );
    drop(by_priority);
    // Priority to FIFO: by arrival (the pending ones came back marked, in their order).
    let fifo = open(config(QueueOrder::Fifo, 10, 1024), &store).unwrap();
    assert_eq!(
        sequences(&fifo.pop(PopLimits { pending: true, ..PopLimits::auto(10) }, Instant::now())),
        [1, 2, 3]
    );
    drop(fifo);

    // Overfilled under an unchanged limit (as deliveries from links may): accepted.
    let full = open(config(QueueOrder::Fifo, 3, 1024), &store).unwrap();
    full.push_bounded(message(4, 4, 60_000), Instant::now(), u64::MAX).unwrap();
    drop(full);
    assert_eq!(open(config(QueueOrder::Fifo, 3, 1024), &store).unwrap().len(), 4);
    let fewer = open(config(QueueOrder::Fifo, 2, 1024), &store).unwrap_err().to_string();
    assert!(fewer.contains("queue 'q' holds 4 messages, more than its queue_messages_max 2"), "{fewer}");
    let smaller = open(config(QueueOrder::Fifo, 10, 0), &store).unwrap_err().to_string();
    assert!(smaller.contains("holds a message of 1 bytes, more than its message_bytes_max 0"), "{smaller}");
}

#[test]
fn a_damaged_record_stops_recovery_and_lifetimes_count_while_down() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let q = open(config(QueueOrder::Fifo, 10, 1024), &store).unwrap();
    q.push(message(1, 4, 60_000), Instant::now()).unwrap();
    q.push(message(2, 4, 60_000), Instant::now()).unwrap();
    drop(q);
    let records = store.scan("q.q", Bound::Unbounded, Bound::Unbounded, 10).unwrap();

    // The first record written an hour ago: its minute ran out while the node was down.
    let (first, _) = decode_record(records[0].1.clone()).unwrap();
    let mut old = records[0].1.to_vec();
    let body_at = RECORD_HEADER_BYTES - 8;
    old[body_at..RECORD_HEADER_BYTES].copy_from_slice(&(crate::clock::unix_ms() - 3_600_000).to_be_bytes());
    let crc = linkbus_proto::crc::crc32c(&old[5..]);
    old[1..5].copy_from_slice(&crc.to_be_bytes());
    let mut batch = Batch::new();
    batch.put("q.q", records[0].0.clone(), old);
    store.write(batch, true).unwrap();
    let q = open(config(QueueOrder::Fifo, 10, 1024), &store).unwrap();
    let popped = q.pop(PopLimits::auto(10), Instant::now());
    assert_eq!((popped.expired, popped.messages.len()), (1, 1), "{} expired while down", first.id);
    drop(q);

    // A flipped byte: recovery stops and names the queue and key.
    q_push_and_damage(&store);
    let err = open(config(QueueOrder::Fifo, 10, 1024), &store).unwrap_err().to_string();
    assert!(err.contains("corrupt record in q.q at key") && err.contains("checksum mismatch"), "{err}");
}

fn q_push_and_damage(store: &Arc<dyn Store>) {
    let q = open(config(QueueOrder::Fifo, 10, 1024), store).unwrap();
    q.push(message(3, 4, 60_000), Instant::now()).unwrap();
    drop(q);
    let (key, value) = store.scan("q.q", Bound::Unbounded, Bound::Unbounded, 1).unwrap().remove(0);
    let mut damaged = value.to_vec();
    let last = damaged.len() - 1;
    damaged[last] ^= 0x40;
    let mut batch = Batch::new();
    batch.put("q.q", key, damaged);
    store.write(batch, true).unwrap();
}

fn member(n: u64, group: &str, index: u32, last: bool, lifetime_ms: u64) -> Message {
    let mut m = message(n, 4, lifetime_ms);
    m.content.group = Some(linkbus_plugin_api::Group { id: group.into(), index, last });
    m
}

fn whole(pending: bool) -> PopLimits {
    PopLimits { pending, groups: GroupMode::Whole, ..PopLimits::auto(100) }
}

/// Members are held until every one has come, then handed out in index order, whatever
/// order they came in; messages outside groups pass them.
#[test]
fn a_group_is_held_until_complete_then_handed_out_in_index_order() {
    let q = queue(QueueOrder::Priority, 10, Arc::new(MemoryStore::new()));
    let now = Instant::now();
    q.push(member(11, "g", 1, false, 60_000), now).unwrap();
    q.push(member(10, "g", 0, false, 60_000), now).unwrap();
    q.push(message(1, 4, 60_000), now).unwrap();
    assert_eq!(q.stats(now).held, 2);
    assert!(!q.has_room(8), "held members take room");
    assert_eq!(sequences(&q.pop(PopLimits::auto(10), now)), [1], "no member of an incomplete group");
    q.push(member(12, "g", 2, true, 60_000), now).unwrap();
    assert_eq!(q.stats(now).held, 0);
    assert_eq!(sequences(&q.pop(PopLimits::auto(10), now)), [10, 11, 12]);
    // A dead letter is never held: the rest of its group may never come.
    let mut dead = member(30, "d", 1, false, 60_000);
    dead.content.headers.push(("linkbus.dead_letter_code".into(), "queue_missing".into()));
    q.push(dead, now).unwrap();
    assert_eq!(sequences(&q.pop(PopLimits::auto(10), now)), [30]);
    // A member that came again (a sender that put it once more) is not queued twice.
    q.push(member(20, "h", 0, false, 60_000), now).unwrap();
    q.push(member(20, "h", 0, false, 60_000), now).unwrap();
    assert_eq!(q.stats(now).held, 1);
}

#[test]
fn a_whole_group_get_takes_the_first_group_only() {
    let q = queue(QueueOrder::Fifo, 20, Arc::new(MemoryStore::new()));
    let now = Instant::now();
    q.push(message(1, 4, 60_000), now).unwrap();
    for (n, i, last) in [(10, 0, false), (11, 1, false), (12, 2, true)] {
        q.push(member(n, "g", i, last, 60_000), now).unwrap();
    }
    q.push(member(20, "h", 0, false, 60_000), now).unwrap();
    q.push(message(2, 4, 60_000), now).unwrap();
    q.push(member(21, "h", 1, true, 60_000), now).unwrap();
    assert_eq!(sequences(&q.pop(whole(false), now)), [10, 11, 12]);
    // Taken pending and given back: the group returns whole, in order, at the head.
    let taken = q.pop(whole(true), now);
    assert_eq!(sequences(&taken), [20, 21]);
    q.backout(&taken.tags, now).unwrap();
    let again = q.pop(whole(false), now);
    assert_eq!(sequences(&again), [20, 21]);
    assert!(again.messages.iter().all(|m| m.redelivered && m.backout_count == 1));
    assert!(q.pop(whole(false), now).messages.is_empty(), "no group left");
    assert_eq!(sequences(&q.pop(PopLimits::auto(10), now)), [1, 2], "messages outside groups stayed");
}

#[test]
fn members_one_by_one_are_taken_in_index_order_without_a_gap() {
    let q = queue(QueueOrder::Fifo, 20, Arc::new(MemoryStore::new()));
    let now = Instant::now();
    let members = PopLimits { groups: GroupMode::Members, ..PopLimits::auto(10) };
    q.push(member(10, "g", 0, false, 60_000), now).unwrap();
    q.push(member(12, "g", 2, false, 60_000), now).unwrap();
    assert_eq!(sequences(&q.pop(members, now)), [10], "index 1 has not come: 2 waits");
    q.push(member(11, "g", 1, false, 60_000), now).unwrap();
    let pending = q.pop(PopLimits { pending: true, count_max: 1, ..members }, now);
    assert_eq!(sequences(&pending), [11]);
    q.backout(&pending.tags, now).unwrap();
    assert_eq!(q.stats(now).held, 2, "given back into its group");
    assert_eq!(sequences(&q.pop(members, now)), [11, 12]);
    q.push(member(13, "g", 3, true, 60_000), now).unwrap();
    assert_eq!(sequences(&q.pop(PopLimits::auto(10), now)), [13], "the rest of the group, complete");
    assert_eq!((q.len(), q.stats(now).held), (0, 0));
}

#[test]
fn an_incomplete_group_expires_whole_and_is_reported_once() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let q = queue(QueueOrder::Fifo, 20, store.clone());
    let seen: Arc<Mutex<Vec<(usize, bool)>>> = Arc::default();
    let s = seen.clone();
    q.set_group_hook(Arc::new(move |_, settled, _| {
        s.lock().unwrap().extend(settled.iter().map(|g| (g.count, g.complete)));
    }));
    let now = Instant::now();
    let mut wants = member(10, "g", 0, false, 100);
    wants.content.results = true;
    q.push(wants, now).unwrap();
    q.push(member(11, "g", 1, false, 60_000), now).unwrap();
    q.expire_groups(now + Duration::from_millis(50));
    assert_eq!(q.stats(now).held, 2, "not yet");
    q.expire_groups(now + Duration::from_millis(150));
    assert_eq!(*seen.lock().unwrap(), [(2, false)], "both members, at once, in one report");
    assert_eq!(q.stats(now).held, 0);
    assert!(store.scan("q.q", Bound::Unbounded, Bound::Unbounded, 10).unwrap().is_empty());
    // A late member starts a group of its own, which never completes (and expires).
    q.push(member(12, "g", 2, true, 60_000), now).unwrap();
    assert!(q.pop(PopLimits::auto(10), now).messages.is_empty());
}

/// A restart keeps held members held, free members free (in index order), and how far
/// members were taken one by one.
#[test]
fn groups_come_back_as_they_were_after_a_restart() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let now = Instant::now();
    let q = queue(QueueOrder::Fifo, 20, store.clone());
    q.push(member(11, "done", 1, true, 60_000), now).unwrap();
    q.push(member(10, "done", 0, false, 60_000), now).unwrap();
    q.push(member(20, "taken_from", 0, false, 60_000), now).unwrap();
    q.push(member(21, "taken_from", 1, false, 60_000), now).unwrap();
    q.push(member(30, "held", 0, false, 60_000), now).unwrap();
    let members = PopLimits { groups: GroupMode::Members, ..PopLimits::auto(1) };
    // (The free group goes first, then the oldest held group's first member, one by one.)
    assert_eq!(sequences(&q.pop(PopLimits { count_max: 3, ..members }, now)), [10, 11, 20]);
    drop(q);
    let q = queue(QueueOrder::Fifo, 20, store.clone());
    assert_eq!(q.stats(now).held, 2);
    assert!(q.pop(PopLimits::auto(10), now).messages.is_empty());
    q.push(member(22, "taken_from", 2, true, 60_000), now).unwrap();
    q.push(member(31, "held", 1, true, 60_000), now).unwrap();
    assert_eq!(sequences(&q.pop(PopLimits::auto(10), now)), [21, 22, 30, 31]);
    drop(q);
    let q = queue(QueueOrder::Fifo, 20, store);
    assert_eq!((q.len(), q.stats(now).held), (0, 0));
}

/// Handed out pending, a group goes to its last member whatever the count asked, so one
/// consumer holds it whole (it is acknowledged after its last member).
#[test]
fn a_pending_get_takes_a_group_to_its_last_member() {
    let q = queue(QueueOrder::Fifo, 20, Arc::new(MemoryStore::new()));
    let now = Instant::now();
    for (n, i, last) in [(10, 0, false), (11, 1, false), (12, 2, true)] {
        q.push(member(n, "g", i, last, 60_000), now).unwrap();
    }
    q.push(message(1, 4, 60_000), now).unwrap();
    let pending = PopLimits { pending: true, ..PopLimits::auto(1) };
    assert_eq!(sequences(&q.pop(pending, now)), [10, 11, 12]);
    assert_eq!(sequences(&q.pop(pending, now)), [1]);
    // A whole-group get takes no more members than it may: the group stays.
    for (n, i, last) in [(20, 0, false), (21, 1, false), (22, 2, true)] {
        q.push(member(n, "h", i, last, 60_000), now).unwrap();
    }
    let small = PopLimits { count_max: 2, ..whole(false) };
    assert_eq!(q.pop(small, now).group_too_large.map(|(count, _)| count), Some(3));
    assert_eq!(sequences(&q.pop(whole(false), now)), [20, 21, 22]);
}

/// Members all taken one by one before a restart: the group is known again from its
/// record, so its last member, coming after the restart, ends it (not held for ever).
#[test]
fn a_group_taken_one_by_one_is_taken_up_again_after_a_restart() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let now = Instant::now();
    let members = PopLimits { groups: GroupMode::Members, ..PopLimits::auto(10) };
    let q = queue(QueueOrder::Fifo, 20, store.clone());
    q.push(member(10, "g", 0, false, 60_000), now).unwrap();
    q.push(member(11, "g", 1, false, 60_000), now).unwrap();
    assert_eq!(sequences(&q.pop(members, now)), [10, 11]);
    drop(q);
    let q = queue(QueueOrder::Fifo, 20, store.clone());
    q.push(member(12, "g", 2, true, 60_000), now).unwrap();
    assert_eq!(sequences(&q.pop(PopLimits::auto(10), now)), [12], "the rest of the group is free");
    assert!(
        store
            .scan("meta", Bound::Unbounded, Bound::Unbounded, 100)
            .unwrap()
            .iter()
            .all(|(k, _)| !k.starts_with(b"group."))
    );
}

/// A group that expires takes its members pending one by one with it: given back, they
/// are dropped, not handed out as free messages.
#[test]
fn members_pending_one_by_one_expire_with_their_group() {
    let q = queue(QueueOrder::Fifo, 20, Arc::new(MemoryStore::new()));
    let now = Instant::now();
    let members = PopLimits { groups: GroupMode::Members, pending: true, ..PopLimits::auto(1) };
    q.push(member(10, "g", 0, false, 100), now).unwrap();
    q.push(member(11, "g", 1, false, 100), now).unwrap();
    let taken = q.pop(members, now);
    assert_eq!(sequences(&taken), [10]);
    q.expire_groups(now + Duration::from_millis(200));
    q.backout(&taken.tags, now + Duration::from_millis(200)).unwrap();
    let after = now + Duration::from_millis(200);
    assert!(
        q.pop(PopLimits { groups: GroupMode::Members, ..PopLimits::auto(10) }, after).messages.is_empty()
    );
    assert_eq!((q.len(), q.stats(after).held, q.pending()), (0, 0, 0));
}
