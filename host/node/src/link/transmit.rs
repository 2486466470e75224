//! The transmission queue of a link: one bounded FIFO per priority class (the system class,
//! levels 0..=9, and files, which travel on their own channel), so a full class never stalls
//! another, drained into the session system class first, then the levels and files in
//! turn. A class holds at most `links.queue_messages_max` messages and
//! `links.queue_bytes_max` bytes of them (encoded); an empty class takes any one put (a
//! message, or one transaction's messages), so a put larger than the byte bound still
//! goes, alone.
//!
//! Within a class, messages this node relays for other nodes wait apart from its own
//! (`hop_count > 0` marks a relayed copy), and when both wait they take turns so that the
//! relayed ones get the link's forward share (`links.forward_share`, in percent): a relay's
//! own traffic and the traffic it carries for others never starve each other. Order holds
//! per origin, since one origin's messages all wait on the same side.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use linkbus_plugin_api::Message;
use linkbus_plugin_api::message::{Kind, PRIORITY_LEVEL_MAX};

use crate::segmented::Segmented;

/// Classes: levels 0..=9, the system class (10) and files (11).
pub(crate) const CLASSES: usize = PRIORITY_LEVEL_MAX as usize + 3;
const SYSTEM: usize = PRIORITY_LEVEL_MAX as usize + 1;
const FILES: usize = SYSTEM + 1;
/// The classes that take turns: levels 9 down to 0, then files.
const TURNS: [usize; CLASSES - 1] = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, FILES];
/// Index of this node's own messages in a class, and of relayed ones.
const OWN: usize = 0;
const RELAYED: usize = 1;

/// A queued message: when it was queued (for its lifetime), and its store key when it is
/// recorded durably (a persistent message).
pub(crate) type Queued = (Message, Instant, Option<u64>);

/// One class: this node's own messages and relayed ones, each in order.
type Class = [Segmented<Waiting>; 2];

/// A queued message with its encoded size, counted once when it enters.
type Waiting = (Queued, u64);

/// See the module doc.
#[derive(Debug)]
pub(crate) struct TransmissionQueue {
    /// One pair of FIFOs per class, indexed by the priority's wire code.
    classes: Vec<Class>,
    /// Most messages one class holds.
    class_messages_max: u64,
    /// Most bytes (encoded messages) one class holds, unless it holds a single put.
    class_bytes_max: u64,
    /// Bytes waiting per class: this node's own messages, and relayed ones.
    bytes: [[u64; 2]; CLASSES],
    /// The index in [`TURNS`] served next, so classes take turns.
    turn: usize,
    len: usize,
    /// No message expires before this (`None`: none expires), so sweeps are cheap.
    next_expiry: Option<Instant>,
    /// Whether `next_expiry` is set, for the link task to read without the lock: it
    /// sweeps only while a message that can expire waits.
    expiring: Arc<AtomicBool>,
    /// Percent of the turns relayed messages get while both kinds wait.
    forward_share: i64,
    /// Per class, relayed messages sent beyond their share (negative: behind it), in
    /// percent points; only moves while both kinds of the class wait.
    balance: [i64; CLASSES],
    /// When the link last took a message.
    taken_at: Option<Instant>,
}

fn side(message: &Message) -> usize {
    if message.hop_count > 0 { RELAYED } else { OWN }
}

/// What `message` counts against its class's byte bound: its encoded size.
pub(crate) fn size_of(message: &Message) -> u64 {
    linkbus_proto::wire::encoded_len(message) as u64
}

/// How full one class is, for a put that found no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fill {
    /// The class.
    pub(crate) class: usize,
    /// Messages waiting in it, and its bound.
    pub(crate) messages: (u64, u64),
    /// Bytes waiting in it, and its bound.
    pub(crate) bytes: (u64, u64),
}

impl std::fmt::Display for Fill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (n, n_max) = self.messages;
        let (b, b_max) = self.bytes;
        match self.class {
            SYSTEM => f.write_str("system class")?,
            FILES => f.write_str("files")?,
            level => write!(f, "priority {level}")?,
        }
        write!(f, ": {n} of {n_max} messages, {b} of {b_max} bytes waiting")
    }
}

impl TransmissionQueue {
    /// A queue whose classes hold `class_messages_max` messages and `class_bytes_max` bytes
    /// each, giving relayed messages `forward_share` percent of the turns while both kinds
    /// wait.
    pub(crate) fn new(class_messages_max: u64, class_bytes_max: u64, forward_share: u8) -> Self {
        Self {
            classes: (0..CLASSES).map(|_| [Segmented::default(), Segmented::default()]).collect(),
            class_messages_max,
            class_bytes_max,
            bytes: [[0; 2]; CLASSES],
            turn: 0,
            len: 0,
            next_expiry: None,
            expiring: Arc::default(),
            forward_share: i64::from(forward_share.clamp(1, 99)),
            balance: [0; CLASSES],
            taken_at: None,
        }
    }

    pub(crate) fn class_of(message: &Message) -> usize {
        if message.content.kind == Kind::File && !message.content.priority.is_system() {
            return FILES;
        }
        (message.content.priority.code() as usize).min(SYSTEM)
    }

    /// When `message`, queued at `queued_at`, expires (`None`: never).
    fn expiry(message: &Message, queued_at: Instant) -> Option<Instant> {
        let lifetime = message.content.lifetime.filter(|l| !l.is_unlimited())?;
        queued_at.checked_add(std::time::Duration::from_millis(lifetime.as_ms()))
    }

    fn note_expiry(&mut self, message: &Message, queued_at: Instant) {
        if let Some(at) = Self::expiry(message, queued_at) {
            self.next_expiry = Some(self.next_expiry.map_or(at, |next| next.min(at)));
            self.expiring.store(true, Ordering::Relaxed);
        }
    }

    /// Set while a message that can expire may be waiting (read without the queue's lock).
    pub(crate) fn expiring(&self) -> Arc<AtomicBool> {
        self.expiring.clone()
    }

    /// Messages waiting, all classes together.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether one more message like `message` fits in its class.
    #[cfg(test)]
    pub(crate) fn has_room_for(&self, message: &Message) -> bool {
        self.has_room_for_many(message, 1, size_of(message))
    }

    /// Whether `count` more messages of `message`'s class, `bytes` in all, fit: within both
    /// bounds, or any number the count bound allows when the class is empty.
    pub(crate) fn has_room_for_many(&self, message: &Message, count: usize, bytes: u64) -> bool {
        let class = Self::class_of(message);
        let Some([own, relayed]) = self.classes.get(class) else { return false };
        let len = own.len() + relayed.len();
        (len + count) as u64 <= self.class_messages_max
            && (len == 0 || self.waiting(class).saturating_add(bytes) <= self.class_bytes_max)
    }

    /// The link took messages at `now`.
    pub(crate) fn mark_taken(&mut self, now: Instant) {
        self.taken_at = Some(now);
    }

    /// Whether `message`'s class holds at least `bytes` bytes of this node's own messages
    /// and the link took a message within `recently` (see `LinkHandle::room_and_pace`).
    pub(crate) fn is_ahead(&self, message: &Message, bytes: u64, recently: std::time::Duration) -> bool {
        self.own_bytes(message) >= bytes && self.taken_at.is_some_and(|at| at.elapsed() < recently)
    }

    /// Bytes (encoded messages) of this node's own messages waiting in `message`'s class
    /// (relayed ones wait apart, and take their own turns).
    pub(crate) fn own_bytes(&self, message: &Message) -> u64 {
        self.bytes.get(Self::class_of(message)).map_or(0, |sides| sides[OWN])
    }

    /// Bytes (encoded messages) waiting in `class`.
    fn waiting(&self, class: usize) -> u64 {
        self.bytes.get(class).map_or(0, |sides| sides.iter().sum())
    }

    /// How full `message`'s class is.
    pub(crate) fn fill(&self, message: &Message) -> Fill {
        let class = Self::class_of(message);
        let len = self.classes.get(class).map_or(0, |[own, relayed]| own.len() + relayed.len());
        Fill {
            class,
            messages: (len as u64, self.class_messages_max),
            bytes: (self.waiting(class), self.class_bytes_max),
        }
    }

    /// Queues `item` in `class` at the back (or at the front, for one put back).
    fn insert(&mut self, class: usize, item: Queued, front: bool) {
        let (Some(c), Some(bytes)) = (self.classes.get_mut(class), self.bytes.get_mut(class)) else {
            return;
        };
        let size = size_of(&item.0);
        let side = side(&item.0);
        bytes[side] += size;
        let fifo = &mut c[side];
        if front {
            fifo.push_front((item, size))
        } else {
            fifo.push_back((item, size))
        }
        self.len += 1;
    }

    /// Queues a message at the back of its class; `false` when the class is full.
    #[cfg(test)]
    pub(crate) fn push(&mut self, message: Message, now: Instant) -> bool {
        if !self.has_room_for(&message) {
            return false;
        }
        self.push_checked(message, now, None);
        true
    }

    /// Queues a message whose room was checked before, even if a concurrent put took that
    /// room since (a class may then hold a message more than its limit; a message is never
    /// queued in one place and refused in another).
    pub(crate) fn push_checked(&mut self, message: Message, now: Instant, key: Option<u64>) {
        self.note_expiry(&message, now);
        self.insert(Self::class_of(&message), (message, now, key), false);
    }

    /// Puts back a message taken by [`TransmissionQueue::pop`] (the window was full).
    pub(crate) fn unpop(&mut self, message: Message, queued_at: Instant, key: Option<u64>) {
        self.note_expiry(&message, queued_at);
        self.insert(Self::class_of(&message), (message, queued_at, key), true);
    }

    /// Takes out every message whose lifetime ran out since it was queued (by `now`).
    pub(crate) fn take_expired(&mut self, now: Instant) -> Vec<(Message, Option<u64>)> {
        let mut expired = Vec::new();
        if self.next_expiry.is_none_or(|next| next > now) {
            return expired;
        }
        let mut next: Option<Instant> = None;
        let mut gone = 0;
        for (class, sides) in self.classes.iter_mut().zip(self.bytes.iter_mut()) {
            for (queue, bytes) in class.iter_mut().zip(sides.iter_mut()) {
                let before = queue.len();
                queue.retain_mut(|((message, queued_at, key), size)| {
                    let elapsed = now.saturating_duration_since(*queued_at).as_millis() as u64;
                    let lifetime =
                        message.content.lifetime.unwrap_or(linkbus_plugin_api::Lifetime::UNLIMITED);
                    if lifetime.after(elapsed).is_some() {
                        if let Some(at) = Self::expiry(message, *queued_at) {
                            next = Some(next.map_or(at, |n| n.min(at)));
                        }
                        return true;
                    }
                    *bytes -= *size;
                    expired.push((message.clone(), *key));
                    false
                });
                gone += before - queue.len();
            }
        }
        self.len -= gone;
        self.next_expiry = next;
        self.expiring.store(next.is_some(), Ordering::Relaxed);
        expired
    }

    /// Takes the next message of class `class` if `ready` takes it: its own or a relayed
    /// one, by the forward share when both wait.
    fn take(&mut self, class: usize, ready: &impl Fn(&Message) -> bool) -> Option<Queued> {
        let bytes = self.bytes.get_mut(class)?;
        // Every waiting message counts its encoded size (never 0): no bytes, no message. Most
        // classes are empty most of the time, and their queues are not looked at.
        if *bytes == [0, 0] {
            return None;
        }
        let (c, balance) = (self.classes.get_mut(class)?, self.balance.get_mut(class)?);
        let waiting = |q: &Segmented<Waiting>| q.front().is_some_and(|((m, _, _), _)| ready(m));
        let side = match (waiting(&c[OWN]), waiting(&c[RELAYED])) {
            (false, false) => return None,
            (true, false) => OWN,
            (false, true) => RELAYED,
            (true, true) => {
                let side = if *balance <= 0 { RELAYED } else { OWN };
                *balance += if side == RELAYED { 100 - self.forward_share } else { -self.forward_share };
                side
            }
        };
        let (item, size) = c[side].pop_front()?;
        bytes[side] -= size;
        self.len -= 1;
        Some(item)
    }

    /// The next message to send among those `ready` takes (it is asked about the heads of
    /// each class; the session's window is per channel): the system class first, then the
    /// levels in turn, highest first in each round.
    pub(crate) fn pop(&mut self, ready: impl Fn(&Message) -> bool) -> Option<Queued> {
        if let Some(item) = self.take(SYSTEM, &ready) {
            return Some(item);
        }
        for step in 0..TURNS.len() {
            let at = (self.turn + step) % TURNS.len();
            let class = TURNS.get(at).copied().unwrap_or(FILES);
            if let Some(item) = self.take(class, &ready) {
                self.turn = (at + 1) % TURNS.len();
                return Some(item);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use linkbus_plugin_api::{Content, MessageId, NodeName, Priority};

    fn message(n: u64, priority: Priority) -> Message {
        Message {
            encoding: Default::default(),
            id: MessageId { source: NodeName::new("A").unwrap(), sequence: n, created_unix_ms: 0 },
            hop_count: 0,
            redelivered: false,
            backout_count: 0,
            content: Box::new(Content::buf("B:q".parse().unwrap(), "x").with_priority(priority)),
        }
    }

    #[test]
    fn a_full_class_does_not_stall_another_and_classes_take_turns() {
        let now = Instant::now();
        let mut q = TransmissionQueue::new(2, u64::MAX, 50);
        let low = Priority::level(1).unwrap();
        let high = Priority::level(8).unwrap();
        assert!(q.push(message(1, low), now) && q.push(message(2, low), now));
        assert!(!q.push(message(3, low), now), "the low class is full");
        assert!(q.push(message(4, high), now), "the high class still takes messages");
        assert!(q.push(message(5, high), now));
        assert!(q.push(message(6, Priority::SYSTEM), now));
        let order: Vec<u64> = std::iter::from_fn(|| q.pop(|_| true)).map(|(m, _, _)| m.id.sequence).collect();
        assert_eq!(order, [6, 4, 1, 5, 2], "system first, then the levels take turns, highest first");
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn a_class_holds_its_bytes_and_an_empty_one_takes_any_put() {
        let now = Instant::now();
        let level = Priority::level(3).unwrap();
        let sized = |n: u64, len: usize| {
            let mut m = message(n, level);
            m.content.payload = vec![7u8; len].into();
            m
        };
        let unit = size_of(&sized(0, 1000));
        let mut q = TransmissionQueue::new(100, 2 * unit, 50);
        assert!(q.push(sized(1, 1000), now) && q.push(sized(2, 1000), now));
        assert!(!q.has_room_for(&sized(3, 1)), "the class holds its bytes");
        assert!(!q.has_room_for_many(&sized(3, 1), 1, 1));
        assert!(q.has_room_for(&message(4, Priority::level(4).unwrap())), "another class has room");
        assert_eq!(q.fill(&sized(3, 1)), Fill { class: 3, messages: (2, 100), bytes: (2 * unit, 2 * unit) });
        let (first, at, key) = q.pop(|_| true).unwrap();
        assert_eq!(q.fill(&first).bytes.0, unit, "what leaves frees its bytes");
        assert!(q.has_room_for(&sized(3, 1000)));
        q.unpop(first, at, key);
        assert!(!q.has_room_for(&sized(3, 1)), "what is put back counts again");
        assert_eq!(std::iter::from_fn(|| q.pop(|_| true)).count(), 2);
        assert_eq!(q.fill(&sized(3, 1)).bytes.0, 0);
        assert!(q.has_room_for_many(&sized(5, 10_000), 3, 3 * 10_000), "an empty class takes any one put");
        assert!(q.push(sized(5, 10_000), now));
        assert!(!q.has_room_for(&sized(6, 1)));
        let mut brief = sized(6, 1000);
        brief.content.lifetime = Some(linkbus_plugin_api::Lifetime::from_ms(10));
        q.push_checked(brief, now, None);
        assert_eq!(q.take_expired(now + std::time::Duration::from_millis(10)).len(), 1);
        assert_eq!(q.fill(&sized(3, 1)).bytes.0, size_of(&sized(5, 10_000)), "expired ones free theirs");
    }

    #[test]
    fn expired_messages_are_taken_out_of_every_class() {
        let now = Instant::now();
        let mut q = TransmissionQueue::new(10, u64::MAX, 50);
        let expiring = q.expiring();
        let brief = |n, p| {
            let mut m = message(n, p);
            m.content.lifetime = Some(linkbus_plugin_api::Lifetime::from_ms(100));
            m
        };
        assert!(q.push(message(2, Priority::level(1).unwrap()), now));
        assert!(!expiring.load(Ordering::Relaxed), "nothing that can expire: no sweeps");
        assert!(q.push(brief(1, Priority::level(1).unwrap()), now));
        assert!(q.push(brief(3, Priority::SYSTEM), now));
        assert!(expiring.load(Ordering::Relaxed));
        assert!(q.take_expired(now + std::time::Duration::from_millis(99)).is_empty());
        let gone: Vec<u64> = q
            .take_expired(now + std::time::Duration::from_millis(100))
            .iter()
            .map(|(m, _)| m.id.sequence)
            .collect();
        assert_eq!(gone, [1, 3]);
        assert!(!expiring.load(Ordering::Relaxed), "the last one that could expire is gone");
        assert_eq!(q.len(), 1);
        assert_eq!(q.pop(|_| true).map(|(m, _, _)| m.id.sequence), Some(2));
    }

    #[test]
    fn files_have_their_own_class_and_a_blocked_one_does_not_stall_the_others() {
        let now = Instant::now();
        let mut q = TransmissionQueue::new(10, u64::MAX, 50);
        let level = Priority::level(4).unwrap();
        let mut file = message(1, level);
        file.content.kind = Kind::File;
        assert!(q.push(file, now) && q.push(message(2, level), now));
        let first = q.pop(|m| m.content.kind != Kind::File).map(|(m, _, _)| m.id.sequence);
        assert_eq!(first, Some(2), "the file's channel has no room; the buffer behind it goes");
        assert_eq!(q.pop(|m| m.content.kind != Kind::File).map(|(m, _, _)| m.id.sequence), None);
        assert_eq!(q.pop(|_| true).map(|(m, _, _)| m.id.sequence), Some(1));
    }

    #[test]
    fn relayed_messages_get_the_forward_share_while_both_kinds_wait() {
        let now = Instant::now();
        let level = Priority::level(4).unwrap();
        for share in [25u8, 50, 80] {
            let mut q = TransmissionQueue::new(1000, u64::MAX, share);
            for n in 0..200 {
                let mut relayed = message(1000 + n, level);
                relayed.hop_count = 1;
                assert!(q.push(message(n, level), now) && q.push(relayed, now));
            }
            let first: Vec<u64> =
                (0..100).filter_map(|_| q.pop(|_| true)).map(|(m, _, _)| m.id.sequence).collect();
            let relayed = first.iter().filter(|n| **n >= 1000).count();
            assert_eq!(relayed, usize::from(share), "share {share}: relayed among the first 100");
            let own: Vec<u64> = first.iter().copied().filter(|n| *n < 1000).collect();
            assert!(own.windows(2).all(|w| w[0] < w[1]), "each side keeps its order");
        }
        // Each class keeps its own balance: two busy classes both get the share.
        let mut q = TransmissionQueue::new(1000, u64::MAX, 50);
        for level in [Priority::level(9).unwrap(), level] {
            for n in 0..10 {
                let mut relayed = message(1000 + n, level);
                relayed.hop_count = 1;
                assert!(q.push(message(n, level), now) && q.push(relayed, now));
            }
        }
        let first: Vec<(u8, bool)> = (0..8)
            .filter_map(|_| q.pop(|_| true))
            .map(|(m, _, _)| (m.content.priority.code(), m.hop_count > 0))
            .collect();
        assert_eq!(
            first,
            [(9, true), (4, true), (9, false), (4, false), (9, true), (4, true), (9, false), (4, false)]
        );
        // Alone, either kind takes every turn (and no debt is run up meanwhile).
        let mut q = TransmissionQueue::new(1000, u64::MAX, 10);
        for n in 0..50 {
            assert!(q.push(message(n, level), now));
        }
        assert_eq!(std::iter::from_fn(|| q.pop(|_| true)).count(), 50);
    }
}
