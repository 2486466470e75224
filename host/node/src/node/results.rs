//! The results glue: outcomes of this node's messages recorded here, and outcomes of other
//! nodes' messages sent to their origin as result messages.

use std::sync::atomic::Ordering;
use std::time::Instant;

use linkbus_plugin_api::{Address, Content, Lifetime, Message, MessageId};
use tracing::{debug, warn};

use super::NodeState;
use crate::events::{Event, EventKind};
use crate::results::{Outcome, RESULT_FOR_HEADER, RESULT_MESSAGE_NAME, ResultTo};

impl NodeState {
    /// Reports what became of a message at some of its recipients to its origin: recorded
    /// here when this node is the origin, else sent there as a result message (dropped and
    /// counted when its way has no room). Nothing happens for a message that wants no results.
    pub fn report(&self, to: Option<&ResultTo>, outcomes: Vec<(Address, Outcome)>) {
        let Some(to) = to else { return };
        if outcomes.is_empty() {
            return;
        }
        let payload = crate::results::encode_report(&outcomes);
        if &to.id.source == self.name() {
            for (recipient, outcome) in outcomes {
                self.record_result(&to.id, &recipient, outcome);
            }
            return;
        }
        let origin = Address::new(to.id.source.clone(), self.event_queue().queue.clone());
        let mut content = Content::buf(origin, payload)
            .with_priority(linkbus_plugin_api::Priority::SYSTEM)
            .with_reliability(to.reliability)
            .with_lifetime(Lifetime::from_ms(self.config.messages.result_wait_ms));
        content.kind = linkbus_plugin_api::Kind::Event;
        content.name = RESULT_MESSAGE_NAME.to_owned();
        content.headers.push((RESULT_FOR_HEADER.into(), to.id.to_string()));
        if let Err(e) = content.validate() {
            self.results_dropped.fetch_add(1, Ordering::Relaxed);
            if self.warnings.admit(crate::warnings::reason::BAD_RESULT) {
                warn!(id = %to.id, error = %e, "Result message not valid; dropped.");
            }
            return;
        }
        let message = crate::flow::origin::stamp(self, content, crate::clock::unix_ms());
        if let Err(refusal) = crate::flow::origin::queue_own(self, message, Instant::now()) {
            self.results_dropped.fetch_add(1, Ordering::Relaxed);
            debug!(id = %to.id, reason = refusal.reason, "Result message dropped.");
        }
    }

    /// Records what the sender of a message of this node can only guess for some of its
    /// recipients (it sent the message, which then expired there): final one result wait
    /// later unless their node reports first.
    pub fn report_provisional(&self, to: Option<&ResultTo>, outcomes: Vec<(Address, Outcome)>) {
        let Some(to) = to.filter(|to| &to.id.source == self.name()) else { return };
        let now = Instant::now();
        for (recipient, outcome) in outcomes {
            self.results.record_provisional(to.id.sequence, &recipient, outcome, now);
        }
    }

    /// Records one outcome of a message of this node and raises it as a `result` event.
    pub(crate) fn record_result(&self, id: &MessageId, recipient: &Address, outcome: Outcome) {
        if !self.results.record(id.sequence, recipient, outcome.clone()) {
            return;
        }
        self.emit(result_event(id, recipient, &outcome));
    }

    /// Reports every recipient whose result did not come back in time as timed out.
    pub fn time_out_results(&self, now: Instant) {
        for (id, recipient, outcome) in self.results.time_out(now) {
            self.emit(result_event(&id, &recipient, &outcome));
        }
    }

    /// Takes apart a result message that arrived for this node's `EVENT` queue.
    pub(crate) fn take_results(&self, message: &Message) {
        let about = message.content.header(RESULT_FOR_HEADER).map(crate::results::parse_id);
        let outcomes = crate::results::decode_report(&message.content.payload);
        match (about, outcomes) {
            (Some(Ok(id)), Ok(outcomes)) if &id.source == self.name() => {
                // Only a recipient's own node says it was delivered; a relay on the way may
                // say it failed or expired.
                for (recipient, outcome) in outcomes {
                    if recipient.node == message.id.source || outcome != Outcome::Delivered {
                        self.record_result(&id, &recipient, outcome);
                    } else {
                        if self.warnings.admit(crate::warnings::reason::BAD_RESULT) {
                            warn!(from = %message.id.source, %recipient, "Delivery reported by another node than the recipient's; ignored.");
                        }
                    }
                }
            }
            (about, outcomes) => {
                if self.warnings.admit(crate::warnings::reason::BAD_RESULT) {
                    warn!(from = %message.id.source, ?about, error = ?outcomes.err(), "Result message not for this node's messages or unreadable; dropped.");
                }
            }
        }
    }
}

/// The `result` event for one outcome of message `id`.
fn result_event(id: &MessageId, recipient: &Address, outcome: &Outcome) -> Event {
    let mut event = Event::new(EventKind::Result, format!("message {id} to {recipient}: {outcome}"))
        .with("id", id)
        .with("recipient", recipient)
        .with("result", outcome.as_str());
    if let Outcome::Failed { code, reason } = outcome {
        event = event.with("code", code).with("reason", reason);
    }
    event
}

/// Has every queue tell the node of the groups that complete or expire in it: a group that
/// completes reports its members that want results `delivered` (held members are not
/// reported on arrival); one that expires incomplete raises one `expired` event and reports
/// them `failed` (`group_expired`).
pub(crate) fn watch_groups(node: &std::sync::Arc<NodeState>) {
    for queue in node.queues() {
        let weak = std::sync::Arc::downgrade(node);
        queue.set_group_hook(std::sync::Arc::new(move |queue, settled, _now| {
            let Some(node) = weak.upgrade() else { return };
            let to = Address::new(node.name().clone(), queue.clone());
            for group in settled {
                let outcome = if group.complete {
                    Outcome::Delivered
                } else {
                    let reason = format!(
                        "group {} expired in queue '{queue}' with {} member(s) held, not complete",
                        group.group, group.count
                    );
                    node.emit(
                        Event::new(EventKind::Expired, reason.clone())
                            .with("queue", queue)
                            .with("count", group.count)
                            .with("group", &group.group.id)
                            .with("source", &group.group.source),
                    );
                    Outcome::failed(crate::results::GROUP_EXPIRED, reason)
                };
                for member in &group.reporting {
                    let result_to = crate::results::ResultTo::of(member);
                    node.report(result_to.as_ref(), vec![(to.clone(), outcome.clone())]);
                }
            }
        }));
    }
}
