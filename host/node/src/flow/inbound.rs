//! A message's way in from a link: the relay and delivery stages run over the batch, then
//! each run of messages that go the same way is placed once (local queues, links onwards,
//! dead letters) and queued, with the link's record of what it took in the same store
//! batch. Result messages for this node and probes are answered instead of queued.

use std::time::Instant;

use linkbus_plugin_api::{Batch, Message, Reliability};

use super::dead_letter::{self, DeadLetterCode};
use super::origin::{RUN_BYTES_MAX, RUN_MESSAGES_MAX};
use super::placement::{Came, Failed, Placement};
use super::refusal::{Refusal, RefusalCode};
use super::stages::{Site, StageContext, Stages};
use crate::link::LinkHandle;
use crate::node::NodeState;
use crate::queue::QueueError;
use crate::results::{Outcome, ResultTo};

/// A message that arrived on a link, with what the link records of it (written in the
/// same store batch as the message's last copy).
#[derive(Debug)]
pub(crate) struct Arrival {
    /// The message.
    pub(crate) message: Message,
    /// The link's record of taking it (empty for a volatile message).
    pub(crate) record: Batch,
}

/// Where one link's arrivals enter the node: its relay and delivery stages.
#[derive(Debug)]
pub(crate) struct Inbound {
    relay: Stages,
    delivery: Stages,
}

impl Inbound {
    /// The stages for the link to `peer`.
    pub(crate) fn new(node: &NodeState, peer: &linkbus_plugin_api::NodeName) -> Self {
        let build = |site| {
            let context = StageContext { node: node.name(), site, peer: Some(peer) };
            Stages::build(node.stage_factories(), &context)
        };
        Self { relay: build(Site::Relay), delivery: build(Site::Delivery) }
    }

    /// Takes `arrivals`, in order: into local queues, onto links towards their recipients,
    /// or, what cannot go there, into the dead-letter queue with the reason. Returns how
    /// many were taken: all, or those before the one that could not be, and why.
    ///
    /// A message with recipients here meets the delivery stages (and copies relayed from it
    /// carry what they made of it); one for other nodes only, the relay stages.
    pub(crate) fn take(
        &mut self,
        node: &NodeState,
        mut arrivals: Vec<Arrival>,
        now: Instant,
    ) -> (usize, Result<(), QueueError>) {
        let refused = self.run_stages(node, &mut arrivals, now);
        let mut taken = 0;
        let mut arrivals = arrivals.into_iter().enumerate().peekable();
        let free = |index: usize| !refused.iter().any(|(i, _)| *i == index);
        while let Some((index, first)) = arrivals.next() {
            // A run: the messages after `first` that may go with it (its records are empty).
            if free(index)
                && arrivals
                    .peek()
                    .is_some_and(|(i, next)| free(*i) && runs_with(&first.message, &next.message))
            {
                let mut bytes = first.message.content.payload.len();
                let mut run = vec![first.message];
                while run.len() < RUN_MESSAGES_MAX
                    && bytes < RUN_BYTES_MAX
                    && let Some((_, next)) =
                        arrivals.next_if(|(i, next)| free(*i) && runs_with(&run[0], &next.message))
                {
                    bytes += next.message.content.payload.len();
                    run.push(next.message);
                }
                let count = run.len();
                match take_run(node, run, now) {
                    None => taken += count,
                    // A run that does not go at once goes one message at a time.
                    Some(back) => {
                        for message in back {
                            if let Err(e) = take_one(node, Arrival { message, record: Batch::new() }, now) {
                                return (taken, Err(e));
                            }
                            taken += 1;
                        }
                    }
                }
                continue;
            }
            let outcome = match refused.iter().find(|(i, _)| *i == index) {
                Some((_, refusal)) => take_refused(node, first, refusal, now),
                None => take_one(node, first, now),
            };
            if let Err(e) = outcome {
                return (taken, Err(e));
            }
            taken += 1;
        }
        (taken, Ok(()))
    }

    /// Runs the stages over the batch (each chain once, over the messages of its site);
    /// returns the refused ones' places.
    fn run_stages(
        &mut self,
        node: &NodeState,
        arrivals: &mut [Arrival],
        now: Instant,
    ) -> Vec<(usize, Refusal)> {
        let mut refused = undecodable(node, arrivals, now);
        if self.relay.is_empty() && self.delivery.is_empty() {
            return refused;
        }
        let here = |m: &Message| m.content.recipients.iter().any(|to| &to.node == node.name());
        for (stages, for_here) in [(&mut self.delivery, true), (&mut self.relay, false)] {
            if stages.is_empty() {
                continue;
            }
            let mut at = Vec::new();
            let mut messages: Vec<&mut Message> = Vec::new();
            for (i, arrival) in arrivals.iter_mut().enumerate() {
                // Filters see messages, not the chunks of files.
                if here(&arrival.message) == for_here && !crate::files::is_frame(&arrival.message) {
                    at.push(i);
                    messages.push(&mut arrival.message);
                }
            }
            for (index, refusal) in stages.run(&mut messages) {
                if let Some(&i) = at.get(index)
                    && !refused.iter().any(|(r, _)| *r == i)
                {
                    refused.push((i, refusal));
                }
            }
        }
        refused
    }
}

/// The arrivals for this node whose payload does not decode here, and why: each encoded
/// one is decoded (in memory, bounded by the receiving queue's limit, then dropped) for each
/// of its recipients here, so what cannot be opened is dead-lettered now and its origin told,
/// not found out at a get; one that decodes is marked with its size as written (what a get
/// counts it as). A recipient that takes only sealed messages refuses one that is not.
/// (Queues keep the message as it came: see `flow::codecs`.)
///
/// A message that fails for some of its recipients only goes on for the others: a copy for
/// those it failed for is dead-lettered at once (a crash before the rest is stored makes the
/// peer send it again, and that copy is made again: a dead letter may repeat, nothing is
/// lost).
fn undecodable(node: &NodeState, arrivals: &mut [Arrival], now: Instant) -> Vec<(usize, Refusal)> {
    let mut refused = Vec::new();
    let codecs = node.codecs();
    let check_all = codecs.has_cipher();
    for (index, arrival) in arrivals.iter_mut().enumerate() {
        let message = &mut arrival.message;
        // (A transfer's frames are decoded where they are taken: `files`.)
        if !message.is_encoded() && !check_all || crate::files::is_frame(message) {
            continue;
        }
        let mut decoded = None;
        let mut failed: Vec<(linkbus_plugin_api::Address, Refusal)> = Vec::new();
        for to in message.content.recipients.iter().filter(|to| &to.node == node.name()) {
            // (A missing queue is placement's to dead-letter.)
            let Some(queue) = node.queue(to.queue.as_str()) else { continue };
            let checked = codecs.check_required(message, to).and_then(|()| {
                if !message.is_encoded() {
                    return Ok(None);
                }
                let bytes_max =
                    queue.config().message_bytes_max.min(node.config().messages.message_bytes_max);
                codecs
                    .decode(message, to, usize::try_from(bytes_max).unwrap_or(usize::MAX))
                    .map(|p| Some(p.len()))
            });
            match checked {
                Ok(len) => decoded = decoded.or(len),
                Err(refusal) => failed.push((to.clone(), refusal)),
            }
        }
        if let Some((_, refusal)) = failed.first()
            && (failed.len() == message.content.recipients.len()
                || !dead_letter_some(node, message, &failed, now))
        {
            refused.push((index, refusal.clone()));
            continue;
        }
        if let Some(len) = decoded {
            super::codecs::mark_payload_bytes(message, len);
        }
    }
    refused
}

/// Dead-letters a copy of `message` for the recipients in `failed` (with the first one's
/// reason) and takes them off it; `false`, changing nothing, when the dead-letter queue has
/// no room for it.
fn dead_letter_some(
    node: &NodeState,
    message: &mut Message,
    failed: &[(linkbus_plugin_api::Address, Refusal)],
    now: Instant,
) -> bool {
    let Some((_, refusal)) = failed.first() else { return true };
    if dead_letter::check_room(node, 1).is_err() {
        return false;
    }
    let recipients: Vec<_> = failed.iter().map(|(to, _)| to.clone()).collect();
    let mut copy = message.clone();
    copy.content.recipients = recipients.iter().cloned().collect();
    message.content.recipients.retain(|to| !recipients.contains(to));
    let why = dead_letter::DeadLetter {
        code: dead_letter_code(refusal.code),
        reason: &refusal.reason,
        failed: recipients,
    };
    dead_letter::put(node, copy, why, now, Batch::new());
    true
}

/// The dead-letter code of a refusal on arrival.
fn dead_letter_code(code: RefusalCode) -> DeadLetterCode {
    match code {
        RefusalCode::DecodeFailed => DeadLetterCode::DecodeFailed,
        RefusalCode::DecryptFailed => DeadLetterCode::DecryptFailed,
        RefusalCode::TooLarge => DeadLetterCode::TooLarge,
        RefusalCode::StageFailed => DeadLetterCode::StageFailed,
        _ => DeadLetterCode::FilterRejected,
    }
}

/// Whether a message that arrived may go in a run with others: volatile (nothing to record),
/// wanting no results, not one of the nodes' own system messages.
fn may_run(message: &Message) -> bool {
    message.content.reliability == Reliability::Volatile
        && !message.content.results
        && !message.content.priority.is_system()
        && !crate::files::is_frame(message)
}

/// Whether `a` and `b` may go in one run (both may run): the same recipients, as many relays, the same
/// transmission class (a relayed run's room is checked in one class).
fn runs_with(a: &Message, b: &Message) -> bool {
    may_run(a)
        && may_run(b)
        && a.hop_count == b.hop_count
        && a.content.recipients == b.content.recipients
        && LinkHandle::same_class(a, b)
}

/// Queues a run of messages that go the same way at once when every place has room for all
/// of them; hands them back otherwise (to go one at a time).
fn take_run(node: &NodeState, messages: Vec<Message>, now: Instant) -> Option<Vec<Message>> {
    let first = messages.first()?;
    let placement = Placement::of(node, first, Came::Arrived);
    if !placement.has_room_for_run(&messages) {
        return Some(messages);
    }
    placement.apply_run(node, messages, now, Came::Arrived);
    None
}

/// Takes one message that arrived (with the link's record of it).
///
/// # Errors
/// When the dead-letter queue has no room for what must go there: nothing was queued or
/// written then, so the link may leave the message unacknowledged and take it again later
/// without a duplicate.
fn take_one(node: &NodeState, arrival: Arrival, now: Instant) -> Result<(), QueueError> {
    let Arrival { message, record } = arrival;
    if crate::files::is_frame(&message) && message.content.recipients.iter().any(|to| &to.node == node.name())
    {
        return crate::files::arrived(node, message, record, now);
    }
    if crate::results::is_result_message(&message)
        && message.content.recipients.iter().any(|to| &to.node == node.name())
    {
        node.take_results(&message);
        node.committer().write(record);
        return Ok(());
    }
    let placement = Placement::of(node, &message, Came::Arrived).or_dead_letter(node, &message);
    let here = message.content.recipients.iter().any(|to| &to.node == node.name());
    if here && crate::node::probe::is_probe(&message) {
        crate::node::probe::answer(node, &message, &placement);
        node.committer().write(record);
        return Ok(());
    }
    // An event message that cannot be stored is dropped: events never hold a link up.
    if message.content.kind != linkbus_plugin_api::Kind::Event {
        dead_letter::check_room(node, placement.dead_letter_count())?;
    }
    // (A message of this node that came back over a link reports nothing from here.)
    let result_to = ResultTo::of(&message).filter(|to| &to.id.source != node.name());
    // (A member of a group is reported by its queue, once its group is complete.)
    let delivered: Vec<_> = match &result_to {
        Some(_) if crate::queue::held_key(&message).is_none() => {
            placement.queues(node).into_iter().map(|to| (to, Outcome::Delivered)).collect()
        }
        _ => Vec::new(),
    };
    // Every copy (local queues, dead letters, relayed copies' records) and the link's record
    // reach the store as one batch: a crash keeps all or none of them. The record also goes
    // with the last write, so even a store that split the batch would make the peer resend
    // (a duplicate), never lose one. (Volatile messages write nothing here.)
    let hold = (message.content.reliability == Reliability::Persistent && node.store().durable())
        .then(|| node.committer().hold());
    placement.apply(node, message, now, Came::Arrived, record);
    node.report(result_to.as_ref(), delivered);
    drop(hold);
    Ok(())
}

/// Removes a message a filter dropped without a dead letter: its origin hears
/// `filter_dropped` for each recipient (when it asked for results).
fn drop_filtered(node: &NodeState, message: &Message, refusal: &Refusal) {
    let result_to = ResultTo::of(message).filter(|to| &to.id.source != node.name());
    let outcomes = message
        .content
        .recipients
        .iter()
        .map(|to| (to.clone(), Outcome::failed(crate::results::FILTER_DROPPED, &refusal.reason)))
        .collect();
    node.report(result_to.as_ref(), outcomes);
}

/// Dead-letters a message a stage refused (for all its recipients), or drops it
/// ([`RefusalCode::Dropped`]).
///
/// # Errors
/// As [`take_one`].
fn take_refused(
    node: &NodeState,
    arrival: Arrival,
    refusal: &Refusal,
    now: Instant,
) -> Result<(), QueueError> {
    let Arrival { message, record } = arrival;
    if refusal.code == RefusalCode::Dropped {
        drop_filtered(node, &message, refusal);
        node.committer().write(record);
        return Ok(());
    }
    let failed = Failed {
        code: dead_letter_code(refusal.code),
        reason: refusal.reason.clone(),
        recipients: message.content.recipients.to_vec(),
    };
    let placement = Placement::dead_letter(failed);
    if message.content.kind != linkbus_plugin_api::Kind::Event {
        dead_letter::check_room(node, 1)?;
    }
    placement.apply(node, message, now, Came::Arrived, record);
    Ok(())
}

#[cfg(test)]
mod tests;
