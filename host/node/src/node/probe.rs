//! Probes: asking the node of a queue on another node whether it has the queue, before a
//! subscription copies events there. A probe is an empty event message named
//! [`PROBE_NAME`] that wants results; it travels like any message, and the queue's node
//! answers it with a result (delivered when the queue could take a message, failed with
//! the reason when not) without queueing anything.

use linkbus_plugin_api::{Address, Content, Lifetime, Message, Reliability};

use super::NodeState;
use crate::flow::DeadLetterCode;
use crate::flow::placement::{Place, Placement};
use crate::results::{Outcome, ResultTo};

/// The name of a probe message: an event asking a queue's node whether it has the queue.
pub const PROBE_NAME: &str = "linkbus.probe";

/// What a probe of a queue on another node found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// The queue's node has it.
    Exists,
    /// The queue's node does not have it; its reason.
    Missing(String),
    /// No clear answer (the node did not answer in time, or the probe could not go).
    Unknown(String),
}

/// Whether `message` is a probe ([`NodeState::probe_queue`]).
pub(crate) fn is_probe(message: &Message) -> bool {
    message.content.kind == linkbus_plugin_api::Kind::Event
        && message.content.name == PROBE_NAME
        && message.content.results
        && message.content.payload.is_empty()
}

/// Answers a probe (see [`NodeState::probe_queue`]) for its recipients here: each as
/// delivered when its queue could take a message, or failed with why; nothing is queued.
pub(crate) fn answer(node: &NodeState, message: &Message, placement: &Placement<'_>) {
    let mut outcomes = Vec::new();
    for place in placement.places() {
        match place {
            Place::Queue(queue) => outcomes
                .push((Address::new(node.name().clone(), queue.config().name.clone()), Outcome::Delivered)),
            Place::Dead(failed) => outcomes.extend(
                failed
                    .recipients
                    .iter()
                    .map(|to| (to.clone(), Outcome::failed(failed.code.as_str(), &failed.reason))),
            ),
            Place::Link(..) => {}
        }
    }
    let result_to = ResultTo::of(message).filter(|to| &to.id.source != node.name());
    node.report(result_to.as_ref(), outcomes);
}

impl NodeState {
    /// Asks the node of queue `to` (another node) whether it has the queue: a probe message
    /// goes there like any message and is answered by a result, without queueing anything.
    /// Waits up to `wait` for the answer.
    pub async fn probe_queue(&self, to: &Address, wait: std::time::Duration) -> Probe {
        let mut content = Content::buf(to.clone(), bytes::Bytes::new())
            .with_results()
            .with_reliability(Reliability::Volatile)
            .with_lifetime(Lifetime::from_ms(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1)));
        content.kind = linkbus_plugin_api::Kind::Event;
        content.name = PROBE_NAME.to_owned();
        let put = crate::flow::Origin::default().put(self, vec![content], std::time::Duration::ZERO).await;
        let sequences = match put {
            Ok(accepted) => accepted.sequences,
            Err(e) => return Probe::Unknown(e.message),
        };
        let deadline = tokio::time::Instant::now() + wait;
        let results = self.results.wait(&sequences, deadline).await;
        let outcome =
            results.into_iter().flatten().flat_map(|r| r.recipients).find_map(|(_, outcome)| outcome);
        match outcome {
            Some(Outcome::Delivered) => Probe::Exists,
            Some(Outcome::Failed { code, reason }) if code == DeadLetterCode::QueueMissing.as_str() => {
                Probe::Missing(reason)
            }
            Some(other) => Probe::Unknown(format!("{to}: {other}")),
            None => Probe::Unknown(format!("node {} did not answer within {} s", to.node, wait.as_secs())),
        }
    }
}
