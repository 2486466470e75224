//! Settling pending messages: acknowledged (they leave the queue and the store) or given
//! back (they return to the head of their level, marked redelivered, their backout count
//! raised), unless they reached the queue's `backout_threshold`: then they leave for the
//! poison hook the node sets ([`LocalQueue::set_poison_hook`]).

use std::sync::Arc;
use std::time::Instant;

use linkbus_plugin_api::{Batch, Lifetime, Message};

use super::{Entry, Levels, LocalQueue, SettleError, UnknownTags, unpop_entry};

/// Takes messages that reached their queue's backout threshold, in order, with the store
/// batch that deletes them from it (to write with wherever they go).
pub type PoisonHook = Arc<dyn Fn(Vec<Message>, Batch, Instant) + Send + Sync>;

/// Messages a requeue took out as poison, and the deletes of their records.
#[derive(Default)]
struct Poisoned {
    messages: Vec<Message>,
    batch: Batch,
}

impl LocalQueue {
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

    /// Where messages that reach the backout threshold go (once; later calls are ignored).
    pub fn set_poison_hook(&self, hook: PoisonHook) {
        let _ = self.poison.set(hook);
    }

    /// Hands messages taken out as poison to the hook (no lock held).
    fn hand_over(&self, poisoned: Poisoned, now: Instant) {
        match self.poison.get() {
            Some(hook) if !poisoned.messages.is_empty() => hook(poisoned.messages, poisoned.batch, now),
            _ => self.committer.write(poisoned.batch),
        }
    }

    /// Gives pending messages back: they return to the head of their level in their
    /// order, marked redelivered, their backout count raised. One whose count reaches the
    /// queue's `backout_threshold` leaves it instead, for the poison hook.
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
        let poisoned = self.requeue_locked(&mut levels, messages, now);
        drop(levels);
        self.hand_over(poisoned, now);
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
        let poisoned = self.requeue_locked(&mut levels, messages.into_iter().map(|m| (0, m)).collect(), now);
        drop(levels);
        self.hand_over(poisoned, now);
        self.notify.notify_waiters();
    }

    /// Puts `(old key, message)` pairs back at the head of their levels, in their order,
    /// marked redelivered with their backout count raised, under new keys (old ones deleted);
    /// returns those that reached the backout threshold instead (when a hook takes them).
    fn requeue_locked(&self, levels: &mut Levels, messages: Vec<(u64, Message)>, now: Instant) -> Poisoned {
        let mut batch = Batch::new();
        let mut entries = Vec::with_capacity(messages.len());
        let mut front_key = levels.front_key;
        let threshold = self.config.backout_threshold.filter(|_| self.poison.get().is_some());
        let mut poisoned = Poisoned::default();
        for (old, mut message) in messages.into_iter().rev() {
            // The consumer may have seen it before it went away.
            message.redelivered = true;
            message.backout_count = message.backout_count.saturating_add(1);
            if threshold.is_some_and(|t| message.backout_count >= t) {
                if old != 0 {
                    self.delete_op(&mut poisoned.batch, old, &message);
                }
                poisoned.messages.push(message);
                continue;
            }
            if old != 0 {
                self.delete_op(&mut batch, old, &message);
            }
            let key = front_key;
            front_key -= 1;
            // A member taken one by one from a group still held is held again.
            if let Err(mut entry) =
                self.hold_again(levels, Entry { key, message, enqueued_at: now }, &mut batch)
            {
                self.put_op(&mut batch, key, &mut entry.message);
                entries.push(entry);
            }
        }
        self.committer.write(batch);
        levels.front_key = front_key;
        for entry in entries {
            unpop_entry(levels, self.config.order, entry);
            levels.len += 1;
        }
        poisoned.messages.reverse();
        poisoned
    }
}

fn check_pending(levels: &Levels, tags: &[u64]) -> Result<(), UnknownTags> {
    // The first few are enough to say what is wrong.
    let unknown: Vec<u64> =
        tags.iter().copied().filter(|t| !levels.pending.contains_key(t)).take(10).collect();
    if unknown.is_empty() { Ok(()) } else { Err(UnknownTags(unknown)) }
}
