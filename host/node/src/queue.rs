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

use std::ops::Bound;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use linkbus_plugin_api::message::PRIORITY_LEVEL_MAX;
use linkbus_plugin_api::{Batch, Lifetime, Message, QueueName, Reliability, Store, StoreError};
use linkbus_proto::wire::{Encoded, decode_message, encode_message};
use tokio::sync::Notify;

use crate::config::{QueueConfig, QueueOrder};
use crate::segmented::Segmented;
use crate::storage::Committer;

/// The dead-letter queue every node has: messages that could not be delivered, with the
/// reason in the `linkbus.dead_letter_reason` header.
pub const DEAD_LETTER_QUEUE: &str = "DLQ";
/// The node's event queue (see [`crate::events`]).
pub const EVENT_QUEUE: &str = "EVENT";
/// Header naming why a message was dead-lettered, for people.
pub const DEAD_LETTER_REASON_HEADER: &str = "linkbus.dead_letter_reason";
/// Header with the [`DeadLetterCode`] of a dead-lettered message, for programs.
pub const DEAD_LETTER_CODE_HEADER: &str = "linkbus.dead_letter_code";
/// Header listing (comma-separated) the recipients a dead-lettered message could not reach.
pub const DEAD_LETTER_RECIPIENTS_HEADER: &str = "linkbus.dead_letter_recipients";

/// Why a message went to the dead-letter queue: a stable code, in the
/// `linkbus.dead_letter_code` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterCode {
    /// No link or route reaches a recipient's node (or it arrived at the wrong node).
    NoRoute,
    /// It crossed more relays than allowed.
    HopLimit,
    /// The sender may not send there.
    NotAuthorised,
    /// A filter rejected it.
    FilterRejected,
    /// It is larger than a queue or a peer takes.
    TooLarge,
    /// A recipient queue does not exist.
    QueueMissing,
    /// A recipient queue was full.
    QueueFull,
}

impl DeadLetterCode {
    /// The code as written in the header.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoRoute => "no_route",
            Self::HopLimit => "hop_limit",
            Self::NotAuthorised => "not_authorised",
            Self::FilterRejected => "filter_rejected",
            Self::TooLarge => "too_large",
            Self::QueueMissing => "queue_missing",
            Self::QueueFull => "queue_full",
        }
    }
}

/// Whether `name` belongs to the node rather than to users' configuration.
pub fn is_reserved(name: &QueueName) -> bool {
    matches!(name.as_str(), DEAD_LETTER_QUEUE | EVENT_QUEUE)
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
}

impl PopLimits {
    /// Up to `count_max` messages of any size, acknowledged at once.
    pub fn auto(count_max: usize) -> Self {
        Self { count_max, message_bytes_max: usize::MAX, total_bytes_max: usize::MAX, pending: false }
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
        let level_count = match config.order {
            QueueOrder::Fifo => 1,
            QueueOrder::Priority => PRIORITY_LEVEL_MAX as usize + 2,
        };
        let space = format!("q.{}", config.name);
        let mut levels = Levels {
            levels: (0..level_count).map(|_| Segmented::default()).collect(),
            len: 0,
            pending: std::collections::BTreeMap::new(),
            next_key: KEY_MIDDLE,
            front_key: KEY_MIDDLE - 1,
        };
        let stored = store.scan(&space, Bound::Unbounded, Bound::Unbounded, usize::MAX)?;
        let now_unix = crate::clock::unix_ms();
        let mut largest = 0u64;
        for (key, value) in stored {
            let key = key_number(&key).ok_or_else(|| corrupt(&space, &key, "bad key"))?;
            let (message, enqueued_unix_ms) =
                decode_record(value).map_err(|e| corrupt(&space, &key.to_be_bytes(), &e))?;
            largest = largest.max(message.content.payload.len() as u64);
            // Lifetimes kept counting while the node was down (by the wall clock: the only
            // time measure that spans a restart).
            let down = std::time::Duration::from_millis(now_unix.saturating_sub(enqueued_unix_ms));
            let enqueued_at = now.checked_sub(down).unwrap_or(now);
            levels.next_key = levels.next_key.max(key + 1);
            levels.front_key = levels.front_key.min(key.saturating_sub(1));
            push_entry(&mut levels, config.order, Entry { key, message, enqueued_at });
        }
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
        if !own && lowered_count && levels.len as u64 > config.queue_messages_max {
            return Err(recovery_refused(format!(
                "queue '{}' holds {} messages, more than its queue_messages_max {}: raise the limit (or \
                 empty the queue under the old one) before starting",
                config.name, levels.len, config.queue_messages_max
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
        let mut batch = Batch::new();
        batch.put(META_SPACE, limits_key, limits);
        store.write(batch, true)?;
        Ok(Self { config, space, committer, inner: Mutex::new(levels), notify: Notify::new(), room })
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
        copies(entries, count_max, bytes_max, now).into_iter().map(|(_, m)| m).collect()
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
        copies(newer, count_max, bytes_max, now)
    }

    /// Drops the oldest waiting messages that the store does not hold (of the lowest level
    /// first) until `count` more fit, for a queue read as a log (the node's `EVENT` queue,
    /// which followers read without taking). Returns how many were dropped.
    pub fn drop_oldest_for(&self, count: usize) -> usize {
        let mut levels = self.lock();
        let max = usize::try_from(self.config.queue_messages_max).unwrap_or(usize::MAX);
        let mut dropped = 0;
        while levels.len + levels.pending.len() + count > max {
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
        QueueStats { by_level, pending: levels.pending.len(), oldest }
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
        (levels.len + levels.pending.len() + count) as u64 <= self.config.queue_messages_max
    }

    /// Acknowledges pending messages: they leave the queue and the store.
    ///
    /// # Errors
    /// [`SettleError`] when a tag matches nothing pending or the store fails (nothing is
    /// acknowledged then).
    pub fn ack(&self, tags: &[u64]) -> Result<usize, SettleError> {
        let mut levels = self.lock();
        check_pending(&levels, tags)?;
        let mut tags = tags.to_vec();
        tags.sort_unstable();
        tags.dedup();
        let mut batch = Batch::new();
        for tag in &tags {
            if let Some(entry) = levels.pending.get(tag) {
                self.delete_op(&mut batch, entry.key, &entry.message);
            }
        }
        self.committer.write(batch);
        for tag in &tags {
            levels.pending.remove(tag);
        }
        drop(levels);
        self.room.notify_waiters();
        Ok(tags.len())
    }

    /// Gives pending messages back: they return to the head of their level in their
    /// order, marked redelivered, their backout count raised.
    ///
    /// # Errors
    /// As [`LocalQueue::ack`].
    pub fn backout(&self, tags: &[u64], now: Instant) -> Result<usize, SettleError> {
        let mut levels = self.lock();
        check_pending(&levels, tags)?;
        let mut sorted = tags.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let entries: Vec<Entry> = sorted.iter().filter_map(|t| levels.pending.remove(t)).collect();
        let count = entries.len();
        // The time they were out counts against their lifetime; those that ran out go.
        let mut messages: Vec<(u64, Message)> = Vec::with_capacity(count);
        let mut expired = Batch::new();
        for entry in entries {
            let elapsed = now.saturating_duration_since(entry.enqueued_at).as_millis() as u64;
            let lifetime = entry.message.content.lifetime.unwrap_or(Lifetime::UNLIMITED);
            match lifetime.after(elapsed) {
                Some(left) => {
                    let mut message = entry.message;
                    message.content.lifetime = Some(left);
                    messages.push((entry.key, message));
                }
                None => self.delete_op(&mut expired, entry.key, &entry.message),
            }
        }
        self.committer.write(expired);
        self.requeue_locked(&mut levels, messages, now);
        drop(levels);
        self.notify.notify_waiters();
        self.room.notify_waiters();
        Ok(count)
    }

    /// Tags of every pending message (for a consumer that goes away).
    pub fn pending_tags(&self) -> Vec<u64> {
        self.lock().pending.keys().copied().collect()
    }

    /// Puts messages taken by [`LocalQueue::pop`] back at the head, in their order (a get
    /// whose client went away before the answer was written).
    pub fn restore(&self, messages: Vec<Message>, now: Instant) {
        let mut levels = self.lock();
        // Their old keys are gone from the store already (0 is never a key: no delete).
        self.requeue_locked(&mut levels, messages.into_iter().map(|m| (0, m)).collect(), now);
        drop(levels);
        self.notify.notify_waiters();
    }

    /// Puts `(old key, message)` pairs back at the head of their levels, in their order,
    /// marked redelivered with their backout count raised, under new keys (old ones deleted).
    fn requeue_locked(&self, levels: &mut Levels, messages: Vec<(u64, Message)>, now: Instant) {
        let mut batch = Batch::new();
        let mut entries = Vec::with_capacity(messages.len());
        let mut front_key = levels.front_key;
        for (old, mut message) in messages.into_iter().rev() {
            // The consumer may have seen it before it went away.
            message.redelivered = true;
            message.backout_count = message.backout_count.saturating_add(1);
            if old != 0 {
                self.delete_op(&mut batch, old, &message);
            }
            let key = front_key;
            front_key -= 1;
            self.put_op(&mut batch, key, &mut message);
            entries.push(Entry { key, message, enqueued_at: now });
        }
        self.committer.write(batch);
        levels.front_key = front_key;
        for entry in entries {
            unpop_entry(levels, self.config.order, entry);
            levels.len += 1;
        }
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
        if (levels.len + levels.pending.len()) as u64 >= max {
            return Err(QueueError::Full { queue: self.config.name.clone(), max });
        }
        self.push_locked(&mut levels, message, now, with);
        drop(levels);
        self.notify.notify_waiters();
        Ok(())
    }

    /// Queues `messages` in order under one hold of the lock, past the queue's bound (a
    /// link's delivery run, whose room was checked for all of them), waking waiting
    /// consumers once.
    pub fn push_run(&self, messages: impl IntoIterator<Item = Message>, now: Instant) {
        let mut levels = self.lock();
        for message in messages {
            self.push_locked(&mut levels, message, now, Batch::new());
        }
        drop(levels);
        self.notify.notify_waiters();
    }

    /// Gives `message` the next key, writes it (with `with` after it) and queues it.
    fn push_locked(&self, levels: &mut Levels, mut message: Message, now: Instant, with: Batch) {
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
    }

    /// Takes messages within `limits`, dropping expired ones on the way: stops before the
    /// total encoded size would pass `total_bytes_max` (the first message is not held to
    /// it), and takes nothing when the first message is larger than `message_bytes_max`
    /// (reported in [`Popped::too_large`]; it stays queued). Pending pops keep the messages
    /// in the store until [`LocalQueue::ack`].
    ///
    /// Its store writes go to the store thread, in order; a store failure stops the node
    /// from there (see `storage.rs`).
    pub fn pop(&self, limits: PopLimits, now: Instant) -> Popped {
        let mut levels = self.lock();
        let mut popped = Popped::default();
        popped.messages.reserve(limits.count_max.min(levels.len));
        // Entries taken and still pending, and how many left the queue for good.
        let mut pending: Vec<Entry> = Vec::new();
        let mut gone = 0usize;
        let mut bytes = 0usize;
        let mut batch = Batch::new();
        while popped.messages.len() < limits.count_max {
            let Some(level) = levels.levels.iter_mut().rev().find(|l| !l.is_empty()) else { break };
            let Some(front) = level.front() else { break };
            let elapsed = now.saturating_duration_since(front.enqueued_at).as_millis() as u64;
            let left = front.message.content.lifetime.unwrap_or(Lifetime::UNLIMITED).after(elapsed);
            let size = linkbus_proto::wire::encoded_len(&front.message);
            if left.is_some() && size > limits.message_bytes_max {
                // The first fails the get; a later one just ends it.
                if popped.messages.is_empty() {
                    popped.too_large = Some(size);
                }
                break;
            }
            if left.is_some() && !popped.messages.is_empty() && bytes + size > limits.total_bytes_max {
                break;
            }
            let Some(mut entry) = level.pop_front() else { break };
            let Some(left) = left else {
                if entry.message.content.kind == linkbus_plugin_api::Kind::Event {
                    popped.expired_events += 1;
                } else {
                    popped.expired += 1;
                }
                self.delete_op(&mut batch, entry.key, &entry.message);
                gone += 1;
                continue;
            };
            bytes += size;
            entry.message.content.lifetime = Some(left);
            if limits.pending {
                popped.messages.push(entry.message.clone());
                popped.tags.push(entry.key);
                entry.enqueued_at = now;
                self.mark_seen(&mut entry, &mut batch);
                pending.push(entry);
            } else {
                self.delete_op(&mut batch, entry.key, &entry.message);
                popped.messages.push(entry.message);
                gone += 1;
            }
        }
        self.committer.write(batch);
        let freed = settle_taken(&mut levels, pending, gone);
        drop(levels);
        if freed {
            self.room.notify_waiters();
        }
        popped
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
        if self.stored(message) {
            batch.put(
                &self.space,
                Bytes::copy_from_slice(&key.to_be_bytes()),
                encode_record_sharing(message),
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
    count_max: usize,
    bytes_max: usize,
    now: Instant,
) -> Vec<(u64, Message)> {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for e in entries {
        let elapsed = now.saturating_duration_since(e.enqueued_at).as_millis() as u64;
        let Some(left) = e.message.content.lifetime.unwrap_or(Lifetime::UNLIMITED).after(elapsed) else {
            continue;
        };
        let size = linkbus_proto::wire::encoded_len(&e.message);
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

fn check_pending(levels: &Levels, tags: &[u64]) -> Result<(), UnknownTags> {
    // The first few are enough to say what is wrong.
    let unknown: Vec<u64> =
        tags.iter().copied().filter(|t| !levels.pending.contains_key(t)).take(10).collect();
    if unknown.is_empty() { Ok(()) } else { Err(UnknownTags(unknown)) }
}

fn key_number(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

/// Store space of the node's own bookkeeping (here: each queue's limits, to tell a lowered
/// limit from an overfilled queue at start).
const META_SPACE: &str = "meta";

/// Version of a stored queue record.
const RECORD_FORMAT: u8 = 1;
/// Bytes before the message in a stored record: format, CRC32C, enqueue time.
const RECORD_HEADER_BYTES: usize = 1 + 4 + 8;

/// A queue record: format u8, CRC32C (u32, of everything after it), the wall-clock time it
/// was (re)queued in milliseconds (u64), then the message (its remaining lifetime as of then).
pub(crate) fn encode_record(message: &Message) -> Bytes {
    record_with(linkbus_proto::wire::encoded_len(message), |out| encode_message(message, out))
}

/// [`encode_record`] of a message already encoded (`message`, its wire form).
pub(crate) fn encode_record_of(message: &Encoded) -> Bytes {
    record_with(message.len(), |out| message.parts().iter().for_each(|part| out.put_slice(part)))
}

/// A record whose message (`len` bytes) `write` appends, straight into the record.
fn record_with(len: usize, write: impl FnOnce(&mut BytesMut)) -> Bytes {
    let mut record = BytesMut::with_capacity(RECORD_HEADER_BYTES + len);
    record.put_u8(RECORD_FORMAT);
    record.put_u32(0);
    record.put_u64(crate::clock::unix_ms());
    write(&mut record);
    let crc = linkbus_proto::crc::crc32c(&record[5..]);
    record[1..5].copy_from_slice(&crc.to_be_bytes());
    record.freeze()
}

/// [`encode_record`] of a message that stays in memory too: its payload becomes the
/// record's last bytes (the payload is an encoded message's last field), so the queue and
/// the store's memory table hold one copy of it, not two, and a payload cut out of a
/// larger buffer no longer holds that buffer.
pub(crate) fn encode_record_sharing(message: &mut Message) -> Bytes {
    let record = encode_record(message);
    debug_assert!(
        record.ends_with(&message.content.payload),
        "the payload is an encoded message's last field"
    );
    message.content.payload = record.slice(record.len() - message.content.payload.len()..);
    record
}

/// The message and its enqueue time from a record written by [`encode_record`].
pub(crate) fn decode_record(record: Bytes) -> Result<(Message, u64), String> {
    if record.len() < RECORD_HEADER_BYTES {
        return Err(format!("record of {} bytes is shorter than its header", record.len()));
    }
    if record[0] != RECORD_FORMAT {
        return Err(format!("unknown record format {}", record[0]));
    }
    let crc = u32::from_be_bytes([record[1], record[2], record[3], record[4]]);
    if linkbus_proto::crc::crc32c(&record[5..]) != crc {
        return Err("checksum mismatch".into());
    }
    let mut at = [0u8; 8];
    at.copy_from_slice(&record[5..13]);
    let message = decode_message(record.slice(RECORD_HEADER_BYTES..)).map_err(|e| e.to_string())?;
    Ok((message, u64::from_be_bytes(at)))
}

fn recovery_refused(reason: String) -> StoreError {
    StoreError::Backend { op: "recover", reason }
}

fn corrupt(space: &str, key: &[u8], why: &str) -> StoreError {
    StoreError::Backend {
        op: "recover",
        reason: format!("corrupt record in {space} at key {key:02x?}: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use linkbus_plugin_api::{Content, MessageId, NodeName, Priority, Reliability};
    use linkbus_store_memory::MemoryStore;
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
            whole.as_ptr_range().contains(&part.as_ptr())
                && part.as_ptr_range().end <= whole.as_ptr_range().end
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
        assert!(
            smaller.contains("holds a message of 1 bytes, more than its message_bytes_max 0"),
            "{smaller}"
        );
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
        old[body_at..RECORD_HEADER_BYTES]
            .copy_from_slice(&(crate::clock::unix_ms() - 3_600_000).to_be_bytes());
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
}
