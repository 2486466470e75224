//! Message groups in a queue: members of a group arrive one by one and are *held*, out of
//! the levels, until every member from the first not yet handed out to the last has come.
//! Then they move together, in index order, to the tail of their level, where any get takes
//! them ([`GroupMode::Complete`]) or a whole-group get takes them all at once
//! ([`GroupMode::Whole`]). A get that asks for members one by one ([`GroupMode::Members`])
//! also takes held members, in index order without a gap.
//!
//! A held group whose first member's lifetime runs out expires whole: every member leaves
//! the queue at once, and the node is told ([`GroupHook`]) to raise one event and report
//! each member that wants a result `failed` (`group_expired`). A group that completes is
//! reported `delivered` then, not member by member on arrival.
//!
//! What a restart must know is in the store: a member's record says whether it is free to
//! hand out (its group completed: it goes back to its level) or held (back into its group);
//! how far members were handed out one by one is a record in the `meta` space.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use linkbus_plugin_api::{Batch, Lifetime, Message, NodeName, QueueName, Store, StoreError};

use super::{
    Entry, Levels, LocalQueue, META_SPACE, PopLimits, Popped, RECORD_FREE_MEMBER, encode_record_as,
    push_entry,
};
use crate::config::QueueOrder;

/// How a get hands out groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupMode {
    /// Messages in queue order; members of a group only once the whole group has arrived.
    #[default]
    Complete,
    /// The first group in queue order, whole, and nothing else.
    Whole,
    /// As `Complete`, then members of groups not yet complete, in index order without a gap.
    Members,
}

/// A group, as a queue tells groups apart: the node that accepted it and its id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupKey {
    /// The node that accepted its messages.
    pub source: NodeName,
    /// The sender's id of the group.
    pub id: String,
}

impl GroupKey {
    /// The group `message` belongs to, if any.
    pub fn of(message: &Message) -> Option<Self> {
        let group = message.content.group.as_ref()?;
        Some(Self { source: message.id.source.clone(), id: group.id.clone() })
    }
}

impl fmt::Display for GroupKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "'{}' of {}", self.id, self.source)
    }
}

/// A group that completed (its members free to hand out) or expired (its members gone).
#[derive(Debug)]
pub struct GroupSettled {
    /// The group.
    pub group: GroupKey,
    /// How many members it held.
    pub count: usize,
    /// Its members that want results.
    pub reporting: Vec<Message>,
    /// Completed (else expired).
    pub complete: bool,
}

impl GroupSettled {
    /// Members of `group` handed out, none wanting a result yet.
    fn delivered(group: GroupKey) -> Self {
        Self { group, count: 0, reporting: Vec::new(), complete: true }
    }
}

/// Told, with no lock held, of the groups that completed or expired in a queue.
pub type GroupHook = Arc<dyn Fn(&QueueName, Vec<GroupSettled>, Instant) + Send + Sync>;

/// A group whose members have not all arrived.
#[derive(Default)]
pub(super) struct Assembly {
    /// Members held, by index.
    members: BTreeMap<u32, Entry>,
    /// The last member's index, once it came.
    last: Option<u32>,
    /// Members below this index were handed out one by one (those given back are held
    /// again in `members`).
    next: u32,
    /// When the first of its members' lifetimes runs out.
    deadline: Option<Instant>,
}

impl Assembly {
    fn complete(&self) -> bool {
        let Some(last) = self.last else { return false };
        last < self.next
            || self.members.range(self.next..=last).count() as u64 == u64::from(last - self.next) + 1
    }

    fn hold(&mut self, index: u32, entry: Entry) {
        let lifetime = entry.message.content.lifetime.unwrap_or(Lifetime::UNLIMITED);
        if !lifetime.is_unlimited() {
            let ends = entry.enqueued_at + Duration::from_millis(lifetime.as_ms());
            self.deadline = Some(self.deadline.map_or(ends, |d| d.min(ends)));
        }
        if entry.message.content.group.as_ref().is_some_and(|g| g.last) {
            self.last = Some(index);
        }
        self.members.insert(index, entry);
    }

    /// Whether a member with `index` is here already or was handed out.
    fn has(&self, index: u32) -> bool {
        self.members.contains_key(&index) || index < self.next
    }

    /// The key of its oldest member (for taking members one by one, oldest group first).
    fn first_key(&self) -> u64 {
        self.members.values().map(|e| e.key).min().unwrap_or(u64::MAX)
    }
}

/// The group of `message` when it must be held until complete: a member of a group of more
/// than one (a group of one, index 0 and last, is free at once). A dead letter (in the
/// `DLQ`, or a poison message in its queue's backout queue) is never held: it is there to
/// be looked at, and the rest of its group may never come.
pub(crate) fn held_key(message: &Message) -> Option<GroupKey> {
    let group = message.content.group.as_ref()?;
    if (group.index == 0 && group.last)
        || message.content.header(crate::flow::dead_letter::DEAD_LETTER_CODE_HEADER).is_some()
    {
        return None;
    }
    GroupKey::of(message)
}

/// The `meta` key recording how far members of `group` were handed out one by one.
fn handed_out_key(queue: &QueueName, group: &GroupKey) -> Bytes {
    Bytes::from(format!("group.{queue}/{}/{}", group.source, group.id))
}

/// How far members of each group of `queue` were handed out one by one, from the store.
///
/// # Errors
/// [`StoreError`] when the store cannot be read.
pub(super) fn read_handed_out(
    store: &dyn Store,
    queue: &QueueName,
) -> Result<HashMap<GroupKey, u32>, StoreError> {
    let prefix = format!("group.{queue}/");
    let mut found = HashMap::new();
    for entry in linkbus_plugin_api::store::scan_pages(store, META_SPACE) {
        let (key, value) = entry?;
        let Some(rest) = key.strip_prefix(prefix.as_bytes()) else { continue };
        let rest = String::from_utf8_lossy(rest);
        let (Some((source, id)), Ok(value)) = (rest.split_once('/'), <[u8; 4]>::try_from(value.as_ref()))
        else {
            continue;
        };
        let Ok(source) = NodeName::new(source) else { continue };
        found.insert(GroupKey { source, id: id.to_owned() }, u32::from_be_bytes(value));
    }
    Ok(found)
}

/// Holds a member read back from the store in its group (a duplicate's record is dropped).
pub(super) fn recover(
    levels: &mut Levels,
    group: GroupKey,
    entry: Entry,
    handed_out: &HashMap<GroupKey, u32>,
    (space, fixes): (&str, &mut Batch),
) {
    let index = entry.message.content.group.as_ref().map_or(0, |g| g.index);
    let next = handed_out.get(&group).copied().unwrap_or(0);
    let assembly = levels.groups.entry(group).or_insert_with(|| Assembly { next, ..Assembly::default() });
    if assembly.members.contains_key(&index) {
        fixes.delete(space, Bytes::copy_from_slice(&entry.key.to_be_bytes()));
        return;
    }
    assembly.hold(index, entry);
    levels.held += 1;
}

/// After recovery: a group whose members were all taken one by one so far (none is in the
/// store) is known again from its `meta` record, to take its next member up.
pub(super) fn adopt_handed_out(levels: &mut Levels, handed_out: HashMap<GroupKey, u32>) {
    for (group, next) in handed_out {
        levels.groups.entry(group).or_insert_with(|| Assembly { next, ..Assembly::default() });
    }
}

/// After recovery: groups found complete (a crash between a member's write and its group's
/// release; not expected, as both are one batch) are released now, at the tail.
pub(super) fn release_recovered(
    levels: &mut Levels,
    order: QueueOrder,
    (queue, space, fixes): (&QueueName, &str, &mut Batch),
) {
    let complete: Vec<GroupKey> =
        levels.groups.iter().filter(|(_, a)| a.complete()).map(|(k, _)| k.clone()).collect();
    for group in complete {
        let Some(assembly) = levels.groups.remove(&group) else { continue };
        fixes.delete(META_SPACE, handed_out_key(queue, &group));
        for (_, mut entry) in assembly.members {
            fixes.delete(space, Bytes::copy_from_slice(&entry.key.to_be_bytes()));
            entry.key = levels.next_key;
            levels.next_key += 1;
            let record = encode_record_as(&entry.message, RECORD_FREE_MEMBER);
            fixes.put(space, Bytes::copy_from_slice(&entry.key.to_be_bytes()), record);
            levels.held -= 1;
            push_entry(levels, order, entry);
        }
    }
}

impl LocalQueue {
    /// Where groups that complete or expire are reported (once; later calls are ignored).
    pub fn set_group_hook(&self, hook: GroupHook) {
        let _ = self.group_hook.set(hook);
    }

    /// Tells the hook of groups that completed or expired (no lock held).
    pub(super) fn settled(&self, settled: impl IntoIterator<Item = GroupSettled>, now: Instant) {
        let settled: Vec<GroupSettled> = settled.into_iter().collect();
        if let (Some(hook), false) = (self.group_hook.get(), settled.is_empty()) {
            hook(&self.config.name, settled, now);
        }
    }

    /// Holds `message`, a member of `group`, writing it (with `with` after it); when it
    /// completes the group, every member moves to the tail of its level, in index order,
    /// under new keys (so store order is queue order), its records marked free.
    pub(super) fn hold_locked(
        &self,
        levels: &mut Levels,
        group: GroupKey,
        message: Message,
        now: Instant,
        with: Batch,
    ) -> Option<GroupSettled> {
        let index = message.content.group.as_ref().map_or(0, |g| g.index);
        let assembly = levels.groups.entry(group.clone()).or_default();
        if assembly.has(index) {
            // A member here already, or handed out: a duplicate (a sender that put it
            // again after a crash), not queued twice.
            tracing::debug!(queue = %self.config.name, %group, index, "Duplicate group member dropped.");
            self.committer.write(with);
            return None;
        }
        let key = levels.next_key;
        levels.next_key += 1;
        assembly.hold(index, Entry { key, message, enqueued_at: now });
        levels.held += 1;
        let mut batch = Batch::new();
        let settled = if assembly.complete() {
            Some(self.release_locked(levels, &group, &mut batch))
        } else {
            let entry = levels.groups.get_mut(&group).and_then(|a| a.members.get_mut(&index))?;
            self.put_op_as(&mut batch, key, &mut entry.message, false);
            None
        };
        batch.ops.extend(with.ops);
        self.committer.write(batch);
        settled.filter(|s| !s.reporting.is_empty())
    }

    /// Moves a complete group's members to their levels (see [`LocalQueue::hold_locked`]).
    fn release_locked(&self, levels: &mut Levels, group: &GroupKey, batch: &mut Batch) -> GroupSettled {
        let assembly = levels.groups.remove(group).unwrap_or_default();
        if assembly.next > 0 {
            batch.delete(META_SPACE, handed_out_key(&self.config.name, group));
        }
        let count = assembly.members.len();
        let mut reporting = Vec::new();
        for (_, mut entry) in assembly.members {
            // (The member that completed the group has no record yet: deleting it is harmless.)
            self.delete_op(batch, entry.key, &entry.message);
            entry.key = levels.next_key;
            levels.next_key += 1;
            self.put_op_as(batch, entry.key, &mut entry.message, true);
            if entry.message.content.results {
                reporting.push(entry.message.clone());
            }
            levels.held -= 1;
            push_entry(levels, self.config.order, entry);
        }
        // Members handed out one by one and still pending come back free too.
        if assembly.next > 0 {
            self.free_pending(levels, group, batch);
        }
        GroupSettled { group: group.clone(), count, reporting, complete: true }
    }

    /// Removes the held groups whose first member's lifetime ran out, every member at once.
    pub(super) fn expire_locked(&self, levels: &mut Levels, now: Instant) -> Vec<GroupSettled> {
        if levels.groups.is_empty() {
            return Vec::new();
        }
        let expired: Vec<GroupKey> = levels
            .groups
            .iter()
            .filter(|(_, a)| !a.members.is_empty() && a.deadline.is_some_and(|d| d <= now))
            .map(|(k, _)| k.clone())
            .collect();
        let mut batch = Batch::new();
        let mut settled = Vec::with_capacity(expired.len());
        for group in expired {
            let Some(assembly) = levels.groups.remove(&group) else { continue };
            if assembly.next > 0 {
                batch.delete(META_SPACE, handed_out_key(&self.config.name, &group));
            }
            let count = assembly.members.len();
            let mut reporting = Vec::new();
            for (_, entry) in assembly.members {
                self.delete_op(&mut batch, entry.key, &entry.message);
                if entry.message.content.results {
                    reporting.push(entry.message);
                }
            }
            levels.held -= count;
            // Members taken one by one and still pending expire with their group: given
            // back, they are dropped (their lifetime is spent); their records go now.
            if assembly.next > 0 {
                let Levels { pending, .. } = &mut *levels;
                for entry in
                    pending.values_mut().filter(|e| GroupKey::of(&e.message).as_ref() == Some(&group))
                {
                    self.delete_op(&mut batch, entry.key, &entry.message);
                    entry.message.content.lifetime = Some(Lifetime::from_ms(1));
                    entry.enqueued_at = now.checked_sub(Duration::from_secs(1)).unwrap_or(entry.enqueued_at);
                }
            }
            settled.push(GroupSettled { group, count, reporting, complete: false });
        }
        self.committer.write(batch);
        if !settled.is_empty() {
            self.room.notify_waiters();
        }
        settled
    }

    /// Whether `group` is held here, its members not all come (or not all taken one by one).
    pub fn holds_group(&self, group: &GroupKey) -> bool {
        self.lock().groups.contains_key(group)
    }

    /// Expires held groups whose lifetime ran out (the node's timer calls this).
    pub fn expire_groups(&self, now: Instant) {
        let mut levels = self.lock();
        let settled = self.expire_locked(&mut levels, now);
        drop(levels);
        self.settled(settled, now);
    }

    /// Takes held members one by one (after a pop took what the levels give), oldest group
    /// first, each in index order without a gap; returns whether any left for good. Those
    /// that want results are reported delivered now (into `settled`).
    pub(super) fn take_members(
        &self,
        levels: &mut Levels,
        limits: PopLimits,
        (now, settled): (Instant, &mut Vec<GroupSettled>),
        popped: &mut Popped,
    ) -> bool {
        let mut order: Vec<(u64, GroupKey)> =
            levels.groups.iter().map(|(k, a)| (a.first_key(), k.clone())).collect();
        order.sort_unstable_by_key(|(first, _)| *first);
        let decoded = self.decoded_bytes_max();
        let mut bytes: usize =
            popped.messages.iter().map(|m| crate::flow::codecs::handed_out_len(m, decoded)).sum();
        let (mut batch, mut freed) = (Batch::new(), false);
        for (_, group) in order {
            let Levels { groups, pending, held, .. } = &mut *levels;
            let Some(assembly) = groups.get_mut(&group) else { continue };
            let before = assembly.next;
            let mut taken = GroupSettled::delivered(group.clone());
            while popped.messages.len() < limits.count_max {
                let Some((&index, front)) = assembly.members.first_key_value() else { break };
                if index > assembly.next {
                    break;
                }
                let size = crate::flow::codecs::handed_out_len(&front.message, decoded);
                if size > limits.message_bytes_max
                    || (!popped.messages.is_empty() && bytes + size > limits.total_bytes_max)
                {
                    if popped.messages.is_empty() {
                        popped.too_large = Some(size);
                    }
                    break;
                }
                let Some((_, entry)) = assembly.members.pop_first() else { break };
                bytes += size;
                assembly.next = assembly.next.max(index + 1);
                *held -= 1;
                taken.count += 1;
                if entry.message.content.results {
                    taken.reporting.push(entry.message.clone());
                }
                freed |= self.give_held(entry, (limits.pending, now), (pending, &mut batch), popped);
            }
            // (A member to come starts its lifetime's count afresh.)
            assembly.deadline = assembly.deadline.filter(|_| !assembly.members.is_empty());
            let next = assembly.next;
            if assembly.members.is_empty() && assembly.last.is_some_and(|l| l < next) {
                // Every member went: those still pending are free now, as in a completed group.
                levels.groups.remove(&group);
                batch.delete(META_SPACE, handed_out_key(&self.config.name, &group));
                self.free_pending(levels, &group, &mut batch);
            } else if next != before {
                batch.put(META_SPACE, handed_out_key(&self.config.name, &group), next.to_be_bytes().to_vec());
            }
            if !taken.reporting.is_empty() {
                settled.push(taken);
            }
            if popped.messages.len() >= limits.count_max || popped.too_large.is_some() {
                break;
            }
        }
        self.committer.write(batch);
        freed
    }

    /// Hands out a held member taken one by one: kept pending (its record still says held,
    /// see [`LocalQueue::hold_again`]), or gone (returns `true`).
    fn give_held(
        &self,
        mut entry: Entry,
        (hand_out, now): (bool, Instant),
        (pending, batch): (&mut std::collections::BTreeMap<u64, Entry>, &mut Batch),
        popped: &mut Popped,
    ) -> bool {
        let elapsed = now.saturating_duration_since(entry.enqueued_at).as_millis() as u64;
        let left = entry.message.content.lifetime.unwrap_or(Lifetime::UNLIMITED).after(elapsed);
        entry.message.content.lifetime = Some(left.unwrap_or(Lifetime::from_ms(1)));
        if hand_out {
            popped.messages.push(entry.message.clone());
            popped.tags.push(entry.key);
            entry.enqueued_at = now;
            let was = std::mem::replace(&mut entry.message.redelivered, true);
            self.put_op_as(batch, entry.key, &mut entry.message, false);
            entry.message.redelivered = was;
            pending.insert(entry.key, entry);
            return false;
        }
        self.delete_op(batch, entry.key, &entry.message);
        popped.messages.push(entry.message);
        true
    }

    /// Rewrites the records of `group`'s members pending (taken one by one) as free, so a
    /// restart does not hold them again in a group that will not come back.
    fn free_pending(&self, levels: &mut Levels, group: &GroupKey, batch: &mut Batch) {
        let Levels { pending, .. } = levels;
        for entry in pending.values_mut().filter(|e| GroupKey::of(&e.message).as_ref() == Some(group)) {
            let was = std::mem::replace(&mut entry.message.redelivered, true);
            self.put_op_as(batch, entry.key, &mut entry.message, true);
            entry.message.redelivered = was;
        }
    }

    /// Takes the first group in queue order, whole (a whole-group get): its members leave
    /// every level, in index order. A member larger than the get's limit fails it
    /// ([`Popped::too_large`]), and a group of more members or bytes than the get takes
    /// ([`Popped::group_too_large`]); the group stays then.
    pub(super) fn pop_group(&self, limits: PopLimits, now: Instant) -> Popped {
        let mut levels = self.lock();
        let expired_groups = self.expire_locked(&mut levels, now);
        let mut popped = Popped::default();
        let found = levels
            .levels
            .iter()
            .rev()
            .flat_map(super::Segmented::iter)
            .find_map(|e| GroupKey::of(&e.message));
        let Some(group) = found else {
            drop(levels);
            self.settled(expired_groups, now);
            return popped;
        };
        let is_member = |e: &Entry| GroupKey::of(&e.message).as_ref() == Some(&group);
        let decoded = self.decoded_bytes_max();
        let sizes: Vec<usize> = (levels.levels.iter().flat_map(super::Segmented::iter))
            .filter(|e| is_member(e))
            .map(|e| crate::flow::codecs::handed_out_len(&e.message, decoded))
            .collect();
        let (largest, total) = (sizes.iter().copied().max().unwrap_or(0), sizes.iter().sum::<usize>());
        if largest > limits.message_bytes_max {
            popped.too_large = Some(largest);
        } else if sizes.len() > limits.count_max || total > limits.total_bytes_max {
            popped.group_too_large = Some((sizes.len(), total));
        }
        if popped.too_large.is_some() || popped.group_too_large.is_some() {
            drop(levels);
            self.settled(expired_groups, now);
            return popped;
        }
        let mut members: Vec<Entry> = levels.levels.iter_mut().flat_map(|l| l.extract(is_member)).collect();
        members.sort_by_key(|e| e.message.content.group.as_ref().map_or(0, |g| g.index));
        levels.len -= members.len();
        let mut batch = Batch::new();
        let mut freed = false;
        for entry in members {
            let elapsed = now.saturating_duration_since(entry.enqueued_at).as_millis() as u64;
            let left = entry.message.content.lifetime.unwrap_or(Lifetime::UNLIMITED).after(elapsed);
            match self.hand_out(entry, left, (limits.pending, now), &mut popped, &mut batch) {
                Some(entry) => {
                    levels.pending.insert(entry.key, entry);
                }
                None => freed = true,
            }
        }
        self.committer.write(batch);
        drop(levels);
        self.settled(expired_groups, now);
        if freed {
            self.room.notify_waiters();
        }
        popped
    }

    /// Puts a member of a group still held back into it (given back by a consumer that
    /// took it one by one): it is held again, to be handed out before the members after it.
    pub(super) fn hold_again(
        &self,
        levels: &mut Levels,
        mut entry: Entry,
        batch: &mut Batch,
    ) -> Result<(), Entry> {
        let Some(group) = held_key(&entry.message) else { return Err(entry) };
        let Some(assembly) = levels.groups.get_mut(&group) else { return Err(entry) };
        let index = entry.message.content.group.as_ref().map_or(0, |g| g.index);
        if assembly.members.contains_key(&index) {
            return Err(entry);
        }
        self.put_op_as(batch, entry.key, &mut entry.message, false);
        assembly.hold(index, entry);
        levels.held += 1;
        Ok(())
    }
}
