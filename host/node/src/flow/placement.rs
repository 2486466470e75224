//! Where the copies of a message go from this node (local queues, links onwards, dead
//! letters), whether they have room, and putting them there: the only code that places
//! messages, for puts, commits, the node's own messages and arrivals alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use linkbus_plugin_api::{Address, Batch, Message, Reliability};
use linkbus_proto::wire::{address_encoded_len, encoded_len, encoded_len_without_recipients};
use smallvec::SmallVec;

use super::dead_letter::{DeadLetter, DeadLetterCode};
use super::refusal::{Refusal, RefusalCode};
use crate::config::WhenFull;
use crate::link::LinkHandle;
use crate::node::NodeState;
use crate::queue::LocalQueue;

/// The recipients a link's copy of a message names: their places among the message's
/// recipients (a message to one node needs no list of its own: inline up to four).
pub(crate) type Picked = SmallVec<[usize; 4]>;

/// Why some recipients of a message cannot be reached from here.
#[derive(Debug, Clone)]
pub(crate) struct Failed {
    /// The dead-letter code.
    pub(crate) code: DeadLetterCode,
    /// Why, for people.
    pub(crate) reason: String,
    /// The recipients concerned.
    pub(crate) recipients: Vec<Address>,
}

/// One place a copy of a message goes.
pub(crate) enum Place<'n> {
    /// A local queue (each once, however many recipients name it).
    Queue(&'n Arc<LocalQueue>),
    /// A link onwards, with the recipients routed through it.
    Link(&'n Arc<LinkHandle>, Picked),
    /// The dead-letter queue (or, for an event, nowhere: counted and dropped).
    Dead(Failed),
}

/// Where every copy of a message (or of a run of messages that go the same way) goes.
pub(crate) struct Placement<'n> {
    places: SmallVec<[Place<'n>; 2]>,
}

/// How a message came to this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Came {
    /// Put here (a client's message, or the node's own).
    Put,
    /// Over a link: it counts relays, and copies sent on count one more.
    Arrived,
}

impl<'n> Placement<'n> {
    /// Where the copies of `message` go from `node`: each distinct local queue among its
    /// recipients, each link with the recipients routed through it, and the recipients
    /// that cannot be reached (a missing queue, no route, too many relays).
    pub(crate) fn of(node: &'n NodeState, message: &Message, came: Came) -> Self {
        let mut places: SmallVec<[Place<'n>; 2]> = SmallVec::new();
        let hop_limit =
            came == Came::Arrived && u64::from(message.hop_count) >= node.config().messages.hop_count_max;
        for (index, to) in message.content.recipients.iter().enumerate() {
            if &to.node == node.name() {
                let Some(queue) = node.queue(to.queue.as_str()) else {
                    // A queue named twice among the recipients still gets one dead letter.
                    if !places.iter().any(|p| matches!(p, Place::Dead(f) if f.code == DeadLetterCode::QueueMissing && f.recipients.contains(to))) {
                        let reason = format!("queue '{}' does not exist on node {}", to.queue, to.node);
                        places.push(Place::Dead(Failed { code: DeadLetterCode::QueueMissing, reason, recipients: vec![to.clone()] }));
                    }
                    continue;
                };
                if !places.iter().any(|p| matches!(p, Place::Queue(q) if Arc::ptr_eq(q, queue))) {
                    places.push(Place::Queue(queue));
                }
                continue;
            }
            if hop_limit {
                let reason = format!(
                    "it passed {} relays, the most allowed (messages.hop_count_max on {}): a routing loop?",
                    message.hop_count,
                    node.name()
                );
                push_failed(&mut places, DeadLetterCode::HopLimit, reason, to);
                continue;
            }
            match node.link_towards(&to.node) {
                Ok(link) => {
                    match places.iter_mut().find(|p| matches!(p, Place::Link(l, _) if Arc::ptr_eq(l, link))) {
                        Some(Place::Link(_, picked)) => picked.push(index),
                        _ => places.push(Place::Link(link, smallvec::smallvec![index])),
                    }
                }
                Err(reason) => push_failed(&mut places, DeadLetterCode::NoRoute, reason, to),
            }
        }
        Self { places }
    }

    /// At the origin, a recipient that cannot be reached refuses the put.
    ///
    /// # Errors
    /// The first such recipient's refusal.
    pub(crate) fn reachable(self) -> Result<Self, Refusal> {
        match self.places.iter().find_map(|p| if let Place::Dead(f) = p { Some(f) } else { None }) {
            None => Ok(self),
            Some(f) => {
                let code = if f.code == DeadLetterCode::QueueMissing {
                    RefusalCode::UnknownQueue
                } else {
                    RefusalCode::NoRoute
                };
                Err(Refusal::new(code, f.reason.clone()))
            }
        }
    }

    /// Every copy of a message to the dead-letter queue, for `failed`.
    pub(crate) fn dead_letter(failed: Failed) -> Self {
        Self { places: smallvec::smallvec![Place::Dead(failed)] }
    }

    /// Copies that go to dead letters.
    pub(crate) fn dead_letter_count(&self) -> usize {
        self.places.iter().filter(|p| matches!(p, Place::Dead(_))).count()
    }

    /// The local queues a copy goes into, as addresses on `node`.
    pub(crate) fn queues(&self, node: &NodeState) -> Vec<Address> {
        let queues = self.places.iter().filter_map(|p| if let Place::Queue(q) = p { Some(q) } else { None });
        queues.map(|q| Address::new(node.name().clone(), q.config().name.clone())).collect()
    }

    /// The places, for a probe's answer.
    pub(crate) fn places(&self) -> &[Place<'n>] {
        &self.places
    }

    /// On arrival: a copy whose queue or link has no room now (or whose queue takes no
    /// message this large) goes to a dead letter instead.
    pub(crate) fn or_dead_letter(mut self, node: &NodeState, message: &Message) -> Self {
        let all = &message.content.recipients;
        for place in &mut self.places {
            let failed = match place {
                Place::Queue(q) => {
                    let to = Address::new(node.name().clone(), q.config().name.clone());
                    // (An encoded payload's size as written was checked as it was decoded.)
                    if !message.is_encoded()
                        && message.content.payload.len() as u64 > q.config().message_bytes_max
                    {
                        let reason = format!("payload is over queue {to}'s message_bytes_max");
                        Some(Failed { code: DeadLetterCode::TooLarge, reason, recipients: vec![to] })
                    } else if !q.has_room(1) {
                        Some(Failed {
                            code: DeadLetterCode::QueueFull,
                            reason: format!("queue {to} is full"),
                            recipients: vec![to],
                        })
                    } else {
                        None
                    }
                }
                Place::Link(link, picked) => {
                    // The copy for this link names only the recipients routed through it.
                    let bytes = encoded_len_without_recipients(message) + picked_encoded_len(all, picked);
                    (!link.has_room_for_many(message, 1, bytes as u64)).then(|| Failed {
                        code: DeadLetterCode::QueueFull,
                        reason: format!(
                            "the transmission queue to {} is full ({})",
                            link.peer.name,
                            link.fill(message)
                        ),
                        recipients: picked_from(all, picked).cloned().collect(),
                    })
                }
                Place::Dead(_) => None,
            };
            if let Some(failed) = failed {
                *place = Place::Dead(failed);
            }
        }
        self
    }

    /// On arrival: whether every place has room for all of `messages` (a run that goes
    /// this way), none being a dead letter, and each queue takes each message's size.
    pub(crate) fn has_room_for_run(&self, messages: &[Message]) -> bool {
        let Some(first) = messages.first() else { return true };
        self.places.iter().all(|place| match place {
            Place::Queue(q) => {
                let max = q.config().message_bytes_max;
                messages.iter().all(|m| m.is_encoded() || m.content.payload.len() as u64 <= max)
                    && q.has_room(messages.len())
            }
            Place::Link(link, picked) => {
                let all = picked.len() == first.content.recipients.len();
                let bytes: usize = if all {
                    messages.iter().map(encoded_len).sum()
                } else {
                    messages
                        .iter()
                        .map(|m| {
                            encoded_len_without_recipients(m)
                                + picked_encoded_len(&m.content.recipients, picked)
                        })
                        .sum()
                };
                link.has_room_for_many(first, messages.len(), bytes as u64)
            }
            Place::Dead(_) => false,
        })
    }

    /// Puts `message` in its places, with `with` (a link's record of it) in the store batch
    /// of the last; copies go to all but the last place, which gets the message itself.
    /// A copy sent on to another node counts one relay more when the message arrived here.
    pub(crate) fn apply(self, node: &NodeState, message: Message, now: Instant, came: Came, with: Batch) {
        // Invariant: room was checked for every place first (under the admission lock for
        // client puts and commits); the pushes here go past the bounds rather than queue a
        // message in some places and not in others.
        let mut places = self.places;
        let Some(last) = places.pop() else {
            node.committer().write(with);
            return;
        };
        for place in places {
            put_copy(node, place, message.clone(), now, came, Batch::new());
        }
        put_copy(node, last, message, now, came, with);
    }

    /// Puts a run of messages that go this way (room checked for all of them) in their
    /// places, in order, under one hold of each queue's lock.
    pub(crate) fn apply_run(self, node: &NodeState, messages: Vec<Message>, now: Instant, came: Came) {
        let mut places = self.places;
        let Some(last) = places.pop() else { return };
        for place in places {
            put_run(node, place, messages.clone(), now, came);
        }
        put_run(node, last, messages, now, came);
    }
}

/// Puts one copy in `place`.
fn put_copy(node: &NodeState, place: Place<'_>, message: Message, now: Instant, came: Came, with: Batch) {
    match place {
        Place::Queue(queue) => queue.push_past_bound(message, now, with),
        Place::Link(link, picked) => {
            let copy = onwards(message, &picked, came);
            if with.is_empty() {
                link.enqueue_checked(copy, now);
            } else if let Some(unused) = link.enqueue_with(copy, now, with) {
                node.committer().write(unused);
            }
        }
        Place::Dead(failed) if message.content.kind == linkbus_plugin_api::Kind::Event => {
            node.event_copy_dropped(&message.id.source, &failed.recipients, failed.code, &failed.reason);
            node.committer().write(with);
        }
        Place::Dead(failed) => {
            let why = DeadLetter { code: failed.code, reason: &failed.reason, failed: failed.recipients };
            super::dead_letter::put(node, message, why, now, with);
        }
    }
}

/// Puts a run of copies in `place`.
fn put_run(node: &NodeState, place: Place<'_>, messages: Vec<Message>, now: Instant, came: Came) {
    match place {
        Place::Queue(queue) => queue.push_run(messages, now),
        // A run's messages have the same recipients: a copy naming them all, put here, is
        // the message itself.
        Place::Link(link, picked)
            if came == Came::Put
                && messages.first().is_some_and(|m| picked.len() == m.content.recipients.len()) =>
        {
            link.enqueue_checked_run(messages, now);
        }
        Place::Link(link, picked) => {
            link.enqueue_checked_run(messages.into_iter().map(|m| onwards(m, &picked, came)), now);
        }
        Place::Dead(failed) => {
            for message in messages {
                put_copy(node, Place::Dead(failed.clone()), message, now, came, Batch::new());
            }
        }
    }
}

/// The copy of `message` for a link: naming only the recipients at `picked`, one relay
/// more when it arrived here.
fn onwards(message: Message, picked: &Picked, came: Came) -> Message {
    let mut copy = addressed_to_picked(message, picked);
    if came == Came::Arrived {
        copy.hop_count = copy.hop_count.saturating_add(1);
    }
    copy
}

/// Adds `to` to the dead letter for `code`, or starts one.
fn push_failed(places: &mut SmallVec<[Place<'_>; 2]>, code: DeadLetterCode, reason: String, to: &Address) {
    match places.iter_mut().find(|p| matches!(p, Place::Dead(f) if f.code == code)) {
        Some(Place::Dead(failed)) => failed.recipients.push(to.clone()),
        _ => places.push(Place::Dead(Failed { code, reason, recipients: vec![to.clone()] })),
    }
}

/// The recipients at `picked` among `all`, in order.
pub(crate) fn picked_from<'m>(all: &'m [Address], picked: &'m Picked) -> impl Iterator<Item = &'m Address> {
    picked.iter().filter_map(|&i| all.get(i))
}

/// Bytes the recipients at `picked` among `all` take in an encoded copy.
fn picked_encoded_len(all: &[Address], picked: &Picked) -> usize {
    picked_from(all, picked).map(address_encoded_len).sum()
}

/// `message` naming only the recipients at `picked` (in their order), or all of them.
fn addressed_to_picked(mut message: Message, picked: &Picked) -> Message {
    if picked.len() != message.content.recipients.len() {
        message.content.recipients = picked_from(&message.content.recipients, picked).cloned().collect();
    }
    message
}

/// What a batch of planned messages asks of one place's room.
struct Demand<'a> {
    /// A local queue and how many messages.
    local: SmallVec<[(&'a Arc<LocalQueue>, usize); 2]>,
    /// Per link and transmission class: a message of the class, how many, and their bytes.
    remote: SmallVec<[LinkDemand<'a>; 2]>,
}

/// What a batch asks of one transmission class of one link.
struct LinkDemand<'a> {
    link: &'a Arc<LinkHandle>,
    /// A message of the class.
    sample: &'a Message,
    count: usize,
    bytes: u64,
}

/// The room a batch needs at the origin: per local queue how many messages, per link and
/// transmission class how many and their bytes (each link's copy names only the recipients
/// routed through it).
///
/// # Errors
/// A message larger than a peer takes.
fn demand<'a>(planned: &[(&'a Message, &'a Placement<'_>)]) -> Result<Demand<'a>, Refusal> {
    let mut demand = Demand { local: SmallVec::new(), remote: SmallVec::new() };
    for (message, placement) in planned {
        let others = encoded_len_without_recipients(message);
        let all = &message.content.recipients;
        for place in &placement.places {
            match place {
                Place::Queue(queue) => match demand.local.iter_mut().find(|(q, _)| Arc::ptr_eq(q, queue)) {
                    Some((_, n)) => *n += 1,
                    None => demand.local.push((queue, 1)),
                },
                Place::Link(link, picked) => {
                    let encoded = others + picked_encoded_len(all, picked);
                    let max = link.peer_message_bytes_max.load(std::sync::atomic::Ordering::Relaxed);
                    if max != 0 && encoded > max {
                        let reason = format!(
                            "message of {encoded} bytes is larger than node {} accepts",
                            link.peer.name
                        );
                        return Err(Refusal::new(RefusalCode::TooLarge, reason));
                    }
                    match demand
                        .remote
                        .iter_mut()
                        .find(|d| Arc::ptr_eq(d.link, link) && LinkHandle::same_class(d.sample, message))
                    {
                        Some(d) => {
                            d.count += 1;
                            d.bytes += encoded as u64;
                        }
                        None => demand.remote.push(LinkDemand {
                            link,
                            sample: message,
                            count: 1,
                            bytes: encoded as u64,
                        }),
                    }
                }
                Place::Dead(_) => {}
            }
        }
    }
    Ok(demand)
}

/// Room asked at the origin: `pace` (bytes, recently) asks whether a link is ahead.
pub(crate) struct RoomAsk<'a> {
    /// Room that the same step frees in local queues (a transaction's own gets).
    pub(crate) credit: &'a [(&'a Arc<LocalQueue>, usize)],
    /// With (bytes, recently): whether a link the batch goes to is ahead (see
    /// [`LinkHandle::room_and_pace`]; its queue's lock is taken once for both).
    pub(crate) pace: Option<(u64, Duration)>,
}

/// Checks that every place has room for all the `planned` messages together, and that each
/// fits the peers it goes to; returns whether a link they go to is ahead (when asked).
///
/// # Errors
/// [`RefusalCode::Full`] (room may come), or a refusal waiting cannot lift.
pub(crate) fn check_room(planned: &[(&Message, &Placement<'_>)], ask: &RoomAsk<'_>) -> Result<bool, Refusal> {
    let Demand { local, remote } = demand(planned)?;
    // More than a queue ever holds can never fit: refused at once, not waited for.
    if let Some((q, n)) = local.iter().find(|(q, n)| *n as u64 > q.config().queue_messages_max) {
        let (name, max) = (&q.config().name, q.config().queue_messages_max);
        return Err(Refusal::new(
            RefusalCode::TooLarge,
            format!("{n} messages for queue '{name}', which holds at most {max}"),
        ));
    }
    if let Some(d) = remote.iter().find(|d| d.count as u64 > d.link.class_messages_max()) {
        let (name, max, n) = (&d.link.peer.name, d.link.class_messages_max(), d.count);
        let reason = format!(
            "{n} messages of one priority for node {name}, whose transmission queue holds {max} of each"
        );
        return Err(Refusal::new(RefusalCode::TooLarge, reason));
    }
    let credit_of = |q: &Arc<LocalQueue>| -> usize {
        ask.credit.iter().filter(|(c, _)| Arc::ptr_eq(c, q)).map(|(_, n)| *n).sum()
    };
    let lacking: SmallVec<[&Arc<LocalQueue>; 2]> =
        local.iter().filter(|(q, n)| !q.has_room(n.saturating_sub(credit_of(q)))).map(|(q, _)| *q).collect();
    // A queue that rejects when full decides, wherever it stands among the recipients.
    if let Some(full) = lacking.iter().find(|q| q.config().when_full == WhenFull::Reject) {
        let (name, max) = (&full.config().name, full.config().queue_messages_max);
        let reason = format!("queue '{name}' is full ({max} messages) and rejects puts then");
        return Err(Refusal::new(RefusalCode::Rejected, reason));
    }
    if let Some(full) = lacking.first() {
        let (name, max) = (&full.config().name, full.config().queue_messages_max);
        return Err(Refusal::new(RefusalCode::Full, format!("queue '{name}' is full ({max} messages)")));
    }
    let mut ahead = false;
    for d in &remote {
        let (room, link_ahead) = d.link.room_and_pace(d.sample, (d.count, d.bytes), ask.pace);
        if !room {
            let (name, fill) = (&d.link.peer.name, d.link.fill(d.sample));
            return Err(Refusal::new(
                RefusalCode::Full,
                format!("transmission queue to node {name} is full ({fill})"),
            ));
        }
        ahead |= link_ahead;
    }
    Ok(ahead)
}

/// Whether `message` is stored (its copies too).
pub(crate) fn is_persistent(message: &Message) -> bool {
    message.content.reliability == Reliability::Persistent
}

#[cfg(test)]
mod tests;
