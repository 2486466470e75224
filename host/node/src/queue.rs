//! Local queues: where delivered messages wait for a client `get`.
//!
//! A queue keeps its messages in memory in hand-out order (one FIFO, or one FIFO per
//! priority level) and writes each through to the store, keyed by an increasing number, so
//! a durable store recovers it on start. Expired messages are dropped when they reach the
//! head, never handed out.
//!
//! A get either acknowledges at once (the messages leave the queue and the store) or hands
//! messages out *pending*: they stay in the store, count against the queue's limit, and
//! leave only when acknowledged by their tag; backed out (or when the consumer goes away)
//! they return to the head of their level, marked redelivered, their backout count raised.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use linkbus_plugin_api::message::PRIORITY_LEVEL_MAX;
use linkbus_plugin_api::{Batch, Lifetime, Message, QueueName, Reliability, Store, StoreError};
use tokio::sync::Notify;

use record::{
    RECORD_FORMAT, RECORD_FREE_MEMBER, decode_queue_record, encode_record_as, encode_record_sharing_as,
};
pub(crate) use record::{decode_record, encode_record, encode_record_of, encode_record_sharing};

pub(crate) use groups::held_key;
pub use groups::{GroupHook, GroupKey, GroupMode, GroupSettled};
pub use settle::PoisonHook;

use crate::config::{QueueConfig, QueueOrder};
use crate::segmented::Segmented;
use crate::storage::Committer;

/// The node's event queue (see [`crate::events`]).
pub const EVENT_QUEUE: &str = "EVENT";
/// Whether `name` belongs to the node rather than to users' configuration.
pub fn is_reserved(name: &QueueName) -> bool {
    matches!(name.as_str(), crate::flow::dead_letter::DEAD_LETTER_QUEUE | EVENT_QUEUE)
}

/// Why a message was not queued.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The queue holds `queue_messages_max` messages.
    #[error("queue '{queue}' is full ({max} messages)")]
    Full {
        /// The queue.
        queue: QueueName,
        /// Its limit.
        max: u64,
    },
    /// The store failed; the message was not queued.
    #[error(transparent)]
    Store(#[from] StoreError),
}

struct Entry {
    key: u64,
    message: Message,
    /// When the message entered the queue, to count its residence against its lifetime.
    enqueued_at: Instant,
}

/// Keys of pushed messages grow from here; keys of restored ones shrink from just below, so
/// store order is queue order either way.
const KEY_MIDDLE: u64 = 1 << 63;

struct Levels {
    /// One FIFO per level; a `fifo` queue has a single level.
    levels: Vec<Segmented<Entry>>,
    len: usize,
    /// Messages handed out and not yet acknowledged, by tag (their store key).
    pending: std::collections::BTreeMap<u64, Entry>,
    /// Key of the next message pushed at the tail.
    next_key: u64,
    /// Key of the next message restored at the head.
    front_key: u64,
    /// Groups whose members have not all arrived: held, out of the levels (see `groups.rs`).
    groups: std::collections::HashMap<GroupKey, groups::Assembly>,
    /// Messages held in those groups.
    held: usize,
}

/// One local queue; see the module doc.
pub struct LocalQueue {
    config: QueueConfig,
    space: String,
    committer: Arc<Committer>,
    inner: Mutex<Levels>,
    /// Woken on every push, for waiting gets.
    notify: Notify,
    /// Notified when messages leave, for puts waiting for room (shared by the node).
    room: Arc<Notify>,
    /// Where messages backed out `backout_threshold` times go (set once the node runs).
    poison: std::sync::OnceLock<PoisonHook>,
    /// Told of each group that completed or expired here (set once the node runs).
    group_hook: std::sync::OnceLock<GroupHook>,
}

impl std::fmt::Debug for LocalQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalQueue").field("name", &self.config.name).field("len", &self.len()).finish()
    }
}

/// What a pop found.
#[derive(Debug, Default)]
pub struct Popped {
    /// Messages handed out, with their remaining lifetime updated.
    pub messages: Vec<Message>,
    /// Their tags, for acknowledging them (pending pops only; empty otherwise).
    pub tags: Vec<u64>,
    /// Messages dropped because their lifetime ran out (event messages not counted).
    pub expired: usize,
    /// Event messages dropped because their lifetime ran out.
    pub expired_events: usize,
    /// The encoded size of the message at the head when it is larger than the caller can
    /// take (nothing was handed out then; it stays queued).
    pub too_large: Option<usize>,
    /// The members and encoded bytes of the group at the head of a whole-group get when
    /// that is more than the get takes (nothing was handed out then; it stays queued).
    pub group_too_large: Option<(usize, usize)>,
}

/// What [`LocalQueue::stats`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStats {
    /// Messages waiting per level: one entry for a `fifo` queue; for a `priority` queue,
    /// levels 0..=9 then the system class.
    pub by_level: Vec<usize>,
    /// Messages handed out and not yet acknowledged.
    pub pending: usize,
    /// How long the oldest waiting message has been in the queue (`None`: empty).
    pub oldest: Option<std::time::Duration>,
    /// Messages held in groups whose members have not all arrived.
    pub held: usize,
}

/// How much one pop may hand out.
#[derive(Debug, Clone, Copy)]
pub struct PopLimits {
    /// Most messages.
    pub count_max: usize,
    /// Largest encoded message the caller can take: a larger one at the head fails the pop.
    pub message_bytes_max: usize,
    /// Most encoded bytes all together (the first message is not held to it).
    pub total_bytes_max: usize,
    /// Hand the messages out pending, to be acknowledged by tag.
    pub pending: bool,
    /// How groups are handed out.
    pub groups: GroupMode,
}

impl PopLimits {
    /// Up to `count_max` messages of any size, acknowledged at once.
    pub fn auto(count_max: usize) -> Self {
        Self {
            count_max,
            message_bytes_max: usize::MAX,
            total_bytes_max: usize::MAX,
            pending: false,
            groups: GroupMode::Complete,
        }
    }
}

/// Tags that match nothing pending.
#[derive(Debug, thiserror::Error)]
#[error("no message pending with tag(s) {0:?} in this queue")]
pub struct UnknownTags(pub Vec<u64>);

/// Why tags could not be settled.
#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    /// Some tags match nothing pending; nothing was done.
    #[error(transparent)]
    Unknown(#[from] UnknownTags),
    /// The store failed; nothing was done.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl LocalQueue {
    /// Opens the queue, recovering what `store` holds for it.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot be read; a stored record that does not decode
    /// is reported as a backend error naming the queue and key (never silently skipped).
    pub fn open(
        config: QueueConfig,
        store: &dyn Store,
        committer: Arc<Committer>,
        room: Arc<Notify>,
        now: Instant,
    ) -> Result<Self, StoreError> {
        let space = format!("q.{}", config.name);
        let (levels, largest, released) = read_back(store, &config, &space, now)?;
        // A limit lowered below what the queue holds is not guessed at. (Holding more than
        // an unchanged limit is possible — deliveries from links may overfill a queue a
        // little — and the node's own queues take what the node accepts.)
        let limits_key = format!("limits.{}", config.name).into_bytes();
        let previous = store.get(META_SPACE, &limits_key)?.and_then(|v| {
            let v: [u8; 16] = v.as_ref().try_into().ok()?;
            let (m, b) = v.split_at(8);
            Some((u64::from_be_bytes(m.try_into().ok()?), u64::from_be_bytes(b.try_into().ok()?)))
        });
        let own = is_reserved(&config.name);
        let lowered_count = previous.is_some_and(|(m, _)| config.queue_messages_max < m);
        let lowered_bytes = previous.is_some_and(|(_, b)| config.message_bytes_max < b);
        if !own && lowered_count && (levels.len + levels.held) as u64 > config.queue_messages_max {
            return Err(recovery_refused(format!(
                "queue '{}' holds {} messages, more than its queue_messages_max {}: raise the limit (or \
                 empty the queue under the old one) before starting",
                config.name,
                levels.len + levels.held,
                config.queue_messages_max
            )));
        }
        if !own && lowered_bytes && largest > config.message_bytes_max {
            return Err(recovery_refused(format!(
                "queue '{}' holds a message of {largest} bytes, more than its message_bytes_max {}: raise \
                 the limit before starting",
                config.name, config.message_bytes_max
            )));
        }
        let mut limits = Vec::with_capacity(16);
        limits.extend_from_slice(&config.queue_messages_max.to_be_bytes());
        limits.extend_from_slice(&config.message_bytes_max.to_be_bytes());
        let mut batch = released;
        batch.put(META_SPACE, limits_key, limits);
        store.write(batch, true)?;
        Ok(Self {
            config,
            space,
            committer,
            inner: Mutex::new(levels),
            notify: Notify::new(),
            room,
            poison: std::sync::OnceLock::new(),
            group_hook: std::sync::OnceLock::new(),
        })
    }

    /// The queue's configuration.
    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// Messages waiting (not counting those handed out pending).
    pub fn len(&self) -> usize {
        self.lock().len
    }

    /// Messages handed out and not yet acknowledged.
    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// Copies of up to `count_max` waiting messages in hand-out order, without taking them
    /// (expired ones are skipped; lifetimes are what is left now).
    pub fn browse(&self, count_max: usize, bytes_max: usize, now: Instant) -> Vec<Message> {
        let levels = self.lock();
        let entries = levels.levels.iter().rev().flatten();
        copies(entries, (count_max, bytes_max, self.decoded_bytes_max()), now)
            .into_iter()
            .map(|(_, m)| m)
            .collect()
    }

    /// Like [`LocalQueue::browse`], but only messages that came in after the one with
    /// queue key `after` (0: from the first), oldest first, each with its key: a cursor
    /// for following a queue without taking from it.
    pub fn browse_after(
        &self,
        after: u64,
        count_max: usize,
        bytes_max: usize,
        now: Instant,
    ) -> Vec<(u64, Message)> {
        let levels = self.lock();
        let mut newer: Vec<&Entry> = levels.levels.iter().flatten().filter(|e| e.key > after).collect();
        // One level (a `fifo` queue, as `EVENT` is) is in key order already.
        if levels.levels.iter().filter(|l| !l.is_empty()).count() > 1 {
            newer.sort_unstable_by_key(|e| e.key);
        }
        copies(newer, (count_max, bytes_max, self.decoded_bytes_max()), now)
    }

    /// Drops the oldest waiting messages that the store does not hold (of the lowest level
    /// first) until `count` more fit, for a queue read as a log (the node's `EVENT` queue,
    /// which followers read without taking). Returns how many were dropped.
    pub fn drop_oldest_for(&self, count: usize) -> usize {
        let mut levels = self.lock();
        let max = usize::try_from(self.config.queue_messages_max).unwrap_or(usize::MAX);
        let mut dropped = 0;
        while levels.len + levels.held + levels.pending.len() + count > max {
            let Some(level) =
                levels.levels.iter_mut().find(|l| l.front().is_some_and(|e| !self.stored(&e.message)))
            else {
                break;
            };
            if level.pop_front().is_none() {
                break;
            }
            levels.len -= 1;
            dropped += 1;
        }
        dropped
    }

    /// A wakeup for the next push; enable it before looking, so none is missed between.
    pub fn pushed(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Depth per level, pending count and the age of the oldest waiting message.
    pub fn stats(&self, now: Instant) -> QueueStats {
        let levels = self.lock();
        let by_level: Vec<usize> = levels.levels.iter().map(Segmented::len).collect();
        let oldest =
            levels.levels.iter().flatten().map(|e| now.saturating_duration_since(e.enqueued_at)).max();
        QueueStats { by_level, pending: levels.pending.len(), oldest, held: levels.held }
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Levels> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `count` more messages fit now (pending ones still take room).
    pub fn has_room(&self, count: usize) -> bool {
        let levels = self.lock();
        (levels.len + levels.held + levels.pending.len() + count) as u64 <= self.config.queue_messages_max
    }

    /// Queues `message`, stored before it becomes visible.
    ///
    /// # Errors
    /// [`QueueError::Full`] at `queue_messages_max`; [`QueueError::Store`] when the store fails.
    pub fn push(&self, message: Message, now: Instant) -> Result<(), QueueError> {
        self.push_bounded(message, now, self.config.queue_messages_max)
    }

    /// Like [`LocalQueue::push`] with an explicit limit (the dead-letter queue's).
    ///
    /// # Errors
    /// As [`LocalQueue::push`].
    pub fn push_bounded(&self, message: Message, now: Instant, max: u64) -> Result<(), QueueError> {
        self.push_bounded_with(message, now, max, Batch::new())
    }

    /// Like [`LocalQueue::push_bounded`], writing `with` in the same store batch (after the
    /// message): a link records the sequence number it delivered atomically with the message.
    ///
    /// # Errors
    /// As [`LocalQueue::push`].
    pub fn push_bounded_with(
        &self,
        message: Message,
        now: Instant,
        max: u64,
        with: Batch,
    ) -> Result<(), QueueError> {
        let mut levels = self.lock();
        if (levels.len + levels.held + levels.pending.len()) as u64 >= max {
            return Err(QueueError::Full { queue: self.config.name.clone(), max });
        }
        let settled = self.push_locked(&mut levels, message, now, with);
        drop(levels);
        self.settled(settled, now);
        self.notify.notify_waiters();
        Ok(())
    }

    /// Queues `message` past the queue's bound (its room was checked before), writing
    /// `with` in the same store batch (after the message).
    pub(crate) fn push_past_bound(&self, message: Message, now: Instant, with: Batch) {
        let mut levels = self.lock();
        let settled = self.push_locked(&mut levels, message, now, with);
        drop(levels);
        self.settled(settled, now);
        self.notify.notify_waiters();
    }

    /// Queues `messages` in order under one hold of the lock, past the queue's bound (a
    /// link's delivery run, whose room was checked for all of them), waking waiting
    /// consumers once.
    pub fn push_run(&self, messages: impl IntoIterator<Item = Message>, now: Instant) {
        let mut levels = self.lock();
        let mut settled = Vec::new();
        for message in messages {
            settled.extend(self.push_locked(&mut levels, message, now, Batch::new()));
        }
        drop(levels);
        self.settled(settled, now);
        self.notify.notify_waiters();
    }

    /// Gives `message` the next key, writes it (with `with` after it) and queues it; a
    /// member of a group not yet complete is held instead (returns the group it completed).
    fn push_locked(
        &self,
        levels: &mut Levels,
        mut message: Message,
        now: Instant,
        with: Batch,
    ) -> Option<GroupSettled> {
        if let Some(group) = groups::held_key(&message) {
            return self.hold_locked(levels, group, message, now, with);
        }
        let key = levels.next_key;
        let mut batch = Batch::new();
        // Under the lock, so the store's order of puts and deletes matches the queue's; a
        // volatile message is never written. The write is not synced here: whoever needs a
        // persistent message durable (a put's answer, a link's acknowledgement) waits for a
        // sync after it (group commit, `storage.rs`).
        self.put_op(&mut batch, key, &mut message);
        batch.ops.extend(with.ops);
        self.committer.write(batch);
        levels.next_key += 1;
        push_entry(levels, self.config.order, Entry { key, message, enqueued_at: now });
        None
    }

    /// The largest payload a message of this queue opens into (its `message_bytes_max`).
    fn decoded_bytes_max(&self) -> usize {
        usize::try_from(self.config.message_bytes_max).unwrap_or(usize::MAX)
    }

    /// Takes messages within `limits`, dropping expired ones on the way: stops before the
    /// total size (an encoded message counted as it opens) would pass `total_bytes_max` (the first message is not held to
    /// it), and takes nothing when the first message is larger than `message_bytes_max`
    /// (reported in [`Popped::too_large`]; it stays queued). Pending pops keep the messages
    /// in the store until [`LocalQueue::ack`].
    ///
    /// Its store writes go to the store thread, in order; a store failure stops the node
    /// from there (see `storage.rs`).
    ///
    /// Members of groups not yet complete are held out of the levels: only
    /// [`GroupMode::Members`] takes them (after the levels), and [`GroupMode::Whole`] takes
    /// one whole group instead (see `groups.rs`).
    pub fn pop(&self, limits: PopLimits, now: Instant) -> Popped {
        if limits.groups == GroupMode::Whole {
            return self.pop_group(limits, now);
        }
        let mut levels = self.lock();
        let mut settled = self.expire_locked(&mut levels, now);
        let mut popped = Popped::default();
        popped.messages.reserve(limits.count_max.min(levels.len));
        // Entries taken and still pending, and how many left the queue for good.
        let mut pending: Vec<Entry> = Vec::new();
        let mut gone = 0usize;
        let mut bytes = 0usize;
        let mut batch = Batch::new();
        // Handed out pending, a group goes to its last member (it is acknowledged after it).
        let mut open_group: Option<GroupKey> = None;
        while let Some(level) = levels.levels.iter_mut().rev().find(|l| !l.is_empty()) {
            let Some(front) = level.front() else { break };
            let in_open_group = open_group.is_some() && GroupKey::of(&front.message) == open_group;
            if popped.messages.len() >= limits.count_max && !in_open_group {
                break;
            }
            let elapsed = now.saturating_duration_since(front.enqueued_at).as_millis() as u64;
            let left = front.message.content.lifetime.unwrap_or(Lifetime::UNLIMITED).after(elapsed);
            let size = crate::flow::codecs::handed_out_len(&front.message, self.decoded_bytes_max());
            if left.is_some() && size > limits.message_bytes_max {
                // The first fails the get; a later one just ends it.
                if popped.messages.is_empty() {
                    popped.too_large = Some(size);
                }
                break;
            }
            if left.is_some()
                && !popped.messages.is_empty()
                && bytes + size > limits.total_bytes_max
                && !in_open_group
            {
                break;
            }
            let Some(entry) = level.pop_front() else { break };
            if left.is_some() {
                bytes += size;
            }
            match self.hand_out(entry, left, (limits.pending, now), &mut popped, &mut batch) {
                Some(entry) => {
                    open_group = entry
                        .message
                        .content
                        .group
                        .as_ref()
                        .filter(|g| !g.last)
                        .and(GroupKey::of(&entry.message));
                    pending.push(entry);
                }
                None => gone += 1,
            }
        }
        self.committer.write(batch);
        let mut freed = settle_taken(&mut levels, pending, gone);
        if limits.groups == GroupMode::Members && popped.too_large.is_none() {
            freed |= self.take_members(&mut levels, limits, (now, &mut settled), &mut popped);
        }
        drop(levels);
        self.settled(settled, now);
        if freed {
            self.room.notify_waiters();
        }
        popped
    }

    /// Hands out `entry`, taken from its level with `left` of its lifetime (`None`: it
    /// expired, and is dropped): into `popped`, and returned to be kept pending (`pending`),
    /// or deleted from the store.
    fn hand_out(
        &self,
        mut entry: Entry,
        left: Option<Lifetime>,
        (pending, now): (bool, Instant),
        popped: &mut Popped,
        batch: &mut Batch,
    ) -> Option<Entry> {
        let Some(left) = left else {
            if entry.message.content.kind == linkbus_plugin_api::Kind::Event {
                popped.expired_events += 1;
            } else {
                popped.expired += 1;
            }
            self.delete_op(batch, entry.key, &entry.message);
            return None;
        };
        entry.message.content.lifetime = Some(left);
        if pending {
            popped.messages.push(entry.message.clone());
            popped.tags.push(entry.key);
            entry.enqueued_at = now;
            self.mark_seen(&mut entry, batch);
            Some(entry)
        } else {
            self.delete_op(batch, entry.key, &entry.message);
            popped.messages.push(entry.message);
            None
        }
    }

    /// A message handed out pending is stored marked redelivered, so should the node stop
    /// before it is acknowledged, it comes back as possibly seen.
    fn mark_seen(&self, entry: &mut Entry, batch: &mut Batch) {
        // A volatile message is not stored: nothing to mark.
        if !self.stored(&entry.message) {
            return;
        }
        // Stored again in any case (its lifetime and enqueue time changed), marked, with no
        // copy of the message made: the entry in memory keeps its flag (a backout marks it).
        let was = std::mem::replace(&mut entry.message.redelivered, true);
        self.put_op(batch, entry.key, &mut entry.message);
        entry.message.redelivered = was;
    }

    /// Whether `message` is kept in the store: persistent messages are, volatile ones live
    /// in memory only.
    fn stored(&self, message: &Message) -> bool {
        match message.content.reliability {
            Reliability::Persistent => true,
            Reliability::Volatile => false,
            Reliability::AsQueue => self.config.reliability == Reliability::Persistent,
        }
    }

    /// Adds the store write of `message` under `key` (enqueued now), if it is kept there; the
    /// message then shares its payload with the record (see [`encode_record_sharing`]).
    fn put_op(&self, batch: &mut Batch, key: u64, message: &mut Message) {
        self.put_op_as(batch, key, message, true);
    }

    /// [`LocalQueue::put_op`] of a message that is (`free`) or is not (held in its group)
    /// free to hand out: a group member's record says which, for recovery.
    fn put_op_as(&self, batch: &mut Batch, key: u64, message: &mut Message, free: bool) {
        if self.stored(message) {
            let format =
                if free && groups::held_key(message).is_some() { RECORD_FREE_MEMBER } else { RECORD_FORMAT };
            batch.put(
                &self.space,
                Bytes::copy_from_slice(&key.to_be_bytes()),
                encode_record_sharing_as(message, format),
            );
        }
    }

    /// Adds the store delete of `message` under `key`, if it is kept there.
    fn delete_op(&self, batch: &mut Batch, key: u64, message: &Message) {
        if self.stored(message) {
            batch.delete(&self.space, Bytes::copy_from_slice(&key.to_be_bytes()));
        }
    }

    /// Waits until a push happens (or `deadline` passes); callers re-check with `pop`.
    pub async fn wait(&self, deadline: tokio::time::Instant) {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !self.is_empty() {
            return;
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}

/// Copies of up to `count_max` of `entries` (and of `bytes_max` encoded bytes, at least
/// one), with their keys, skipping expired ones; lifetimes are what is left at `now`.
fn copies<'a>(
    entries: impl IntoIterator<Item = &'a Entry>,
    (count_max, bytes_max, decoded_bytes_max): (usize, usize, usize),
    now: Instant,
) -> Vec<(u64, Message)> {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for e in entries {
        let elapsed = now.saturating_duration_since(e.enqueued_at).as_millis() as u64;
        let Some(left) = e.message.content.lifetime.unwrap_or(Lifetime::UNLIMITED).after(elapsed) else {
            continue;
        };
        let size = crate::flow::codecs::handed_out_len(&e.message, decoded_bytes_max);
        if out.len() >= count_max || (!out.is_empty() && bytes + size > bytes_max) {
            break;
        }
        bytes += size;
        let mut message = e.message.clone();
        message.content.lifetime = Some(left);
        out.push((e.key, message));
    }
    out
}

fn level_of(order: QueueOrder, message: &Message) -> usize {
    match order {
        QueueOrder::Fifo => 0,
        QueueOrder::Priority => message.content.priority.code() as usize,
    }
}

fn push_entry(levels: &mut Levels, order: QueueOrder, entry: Entry) {
    let level = level_of(order, &entry.message);
    if let Some(l) = levels.levels.get_mut(level) {
        l.push_back(entry);
        levels.len += 1;
    }
}

fn unpop_entry(levels: &mut Levels, order: QueueOrder, entry: Entry) {
    let level = level_of(order, &entry.message);
    if let Some(l) = levels.levels.get_mut(level) {
        l.push_front(entry);
    }
}

/// After a pop was stored: taken entries leave the levels, pending ones are kept by tag.
/// Returns whether any left the queue for good (room was freed).
fn settle_taken(levels: &mut Levels, pending: Vec<Entry>, gone: usize) -> bool {
    levels.len -= pending.len() + gone;
    for entry in pending {
        levels.pending.insert(entry.key, entry);
    }
    gone > 0
}

/// What the store holds of a queue: its levels, its largest payload, and the store writes
/// recovery calls for (see `groups.rs`).
fn read_back(
    store: &dyn Store,
    config: &QueueConfig,
    space: &str,
    now: Instant,
) -> Result<(Levels, u64, Batch), StoreError> {
    let level_count = match config.order {
        QueueOrder::Fifo => 1,
        QueueOrder::Priority => PRIORITY_LEVEL_MAX as usize + 2,
    };
    let mut levels = Levels {
        levels: (0..level_count).map(|_| Segmented::default()).collect(),
        len: 0,
        pending: std::collections::BTreeMap::new(),
        next_key: KEY_MIDDLE,
        front_key: KEY_MIDDLE - 1,
        groups: std::collections::HashMap::new(),
        held: 0,
    };
    let handed_out = groups::read_handed_out(store, &config.name)?;
    let mut released = Batch::new();
    let now_unix = crate::clock::unix_ms();
    let mut largest = 0u64;
    for entry in linkbus_plugin_api::store::scan_pages(store, space) {
        let (key, value) = entry?;
        let key = key_number(&key).ok_or_else(|| corrupt(space, &key, "bad key"))?;
        let (message, enqueued_unix_ms, free) =
            decode_queue_record(value).map_err(|e| corrupt(space, &key.to_be_bytes(), &e))?;
        largest = largest.max(message.content.payload.len() as u64);
        // Lifetimes kept counting while the node was down (by the wall clock: the only
        // time measure that spans a restart).
        let down = std::time::Duration::from_millis(now_unix.saturating_sub(enqueued_unix_ms));
        let enqueued_at = now.checked_sub(down).unwrap_or(now);
        levels.next_key = levels.next_key.max(key + 1);
        levels.front_key = levels.front_key.min(key.saturating_sub(1));
        let entry = Entry { key, message, enqueued_at };
        match groups::held_key(&entry.message).filter(|_| !free) {
            Some(group) => groups::recover(&mut levels, group, entry, &handed_out, (space, &mut released)),
            None => push_entry(&mut levels, config.order, entry),
        }
    }
    groups::adopt_handed_out(&mut levels, handed_out);
    groups::release_recovered(&mut levels, config.order, (&config.name, space, &mut released));
    Ok((levels, largest, released))
}

fn key_number(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

/// Store space of the node's own bookkeeping (here: each queue's limits, to tell a lowered
/// limit from an overfilled queue at start).
const META_SPACE: &str = "meta";

fn recovery_refused(reason: String) -> StoreError {
    StoreError::Backend { op: "recover", reason }
}

fn corrupt(space: &str, key: &[u8], why: &str) -> StoreError {
    StoreError::Backend {
        op: "recover",
        reason: format!("corrupt record in {space} at key {key:02x?}: {why}"),
    }
}

mod groups;
mod record;
mod settle;
#[cfg(test)]
mod tests;
