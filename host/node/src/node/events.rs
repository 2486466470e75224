//! The events glue: raising events into the `EVENT` queue and subscribed queues, counting
//! dropped copies, and client subscriptions (written by the store thread only).

use std::time::Instant;

use linkbus_plugin_api::{Address, Batch, Content, NodeName, QueueName, Reliability};
use tracing::warn;

use super::NodeState;
use crate::events::{EVENT_KIND_HEADER, Event, EventKind};
use crate::flow::{DeadLetterCode, Refusal, RefusalCode};
use crate::queue::EVENT_QUEUE;

impl NodeState {
    /// Raises an event: into the `EVENT` queue, and a copy to each queue subscribed to its
    /// kind. Never waits: a copy without room is dropped (counted in `events_dropped`).
    pub fn emit(&self, event: Event) {
        let now = Instant::now();
        let mut content = Content::buf(self.event_queue().clone(), event.text)
            .with_priority(linkbus_plugin_api::Priority::SYSTEM)
            .with_reliability(Reliability::Volatile);
        content.kind = linkbus_plugin_api::Kind::Event;
        content.name = event.kind.as_str().to_owned();
        content.headers.push((EVENT_KIND_HEADER.into(), event.kind.as_str().into()));
        for (key, value) in event.fields {
            content.headers.push((format!("linkbus.{key}"), value));
        }
        let subscribers = self.subscriptions.targets(event.kind);
        // One message per destination, so a full one never holds back the others.
        let targets: Vec<Address> = content.recipients.iter().cloned().chain(subscribers).collect();
        for to in targets {
            let mut copy = content.clone();
            copy.recipients = smallvec::smallvec![to.clone()];
            // The node's own message: system priority allowed, only its fields checked.
            if copy.validate().is_err() {
                self.events_dropped.count_one();
                continue;
            }
            let message = crate::flow::origin::stamp(self, copy, crate::clock::unix_ms());
            if &to == self.event_queue()
                && let Some(events) = self.queues.get(EVENT_QUEUE)
            {
                // A log: followers read it without taking, so the oldest make room.
                for _ in 0..events.drop_oldest_for(1) {
                    self.events_dropped.count_one();
                }
            }
            if let Err(refusal) = crate::flow::origin::queue_own(self, message, now) {
                self.events_dropped.count_one();
                let code = if refusal.code == RefusalCode::NoRoute { "no_route" } else { "not_sent" };
                self.events_dropped.count(self.name(), &to, code, &refusal.reason);
                tracing::debug!(kind = %event.kind, reason = refusal.reason, "Event copy dropped.");
            }
        }
    }

    /// Counts (per origin and queue, for `linkbus status`) and logs, aggregated, an event
    /// copy that could not be stored here or sent on: events never hold a link up, so it is
    /// dropped, but never silently.
    pub(crate) fn event_copy_dropped(
        &self,
        origin: &NodeName,
        failed: &[Address],
        code: DeadLetterCode,
        reason: &str,
    ) {
        self.events_dropped.count_one();
        for to in failed {
            self.events_dropped.count(origin, to, code.as_str(), reason);
        }
        if self.warnings.admit(crate::warnings::reason::EVENT_COPY_DROPPED) {
            warn!(from = %origin, code = code.as_str(), reason, "Event copy dropped.");
        }
    }

    /// Subscribes queue `to` to events of `kinds` for a client (replacing the kinds of its
    /// earlier subscription); kept in the store.
    ///
    /// # Errors
    /// When `to` is not a queue here or on a peer, is this node's `EVENT` queue, is
    /// subscribed by the configuration, or the store fails.
    pub async fn subscribe(&self, to: &Address, kinds: &[EventKind]) -> Result<(), Refusal> {
        if kinds.is_empty() {
            return Err(Refusal::new(RefusalCode::Invalid, "no event kinds given"));
        }
        subscription_target(
            self.name(),
            to,
            |q| self.queues.contains_key(q),
            |n| self.link_towards(n).is_ok(),
        )?;
        // Invariant: the store is written by its own thread only; the list's lock is not
        // held while the write is synced, so events never wait for it.
        let _one_at_a_time = self.subscriptions.changes().lock().await;
        let (batch, kinds) = self
            .subscriptions
            .plan_subscribe(to, kinds)
            .map_err(|e| Refusal::new(RefusalCode::Invalid, e))?;
        self.write_synced(batch).await?;
        self.subscriptions.apply_subscribe(to, kinds);
        Ok(())
    }

    /// Ends the client subscription of `to`; kept in the store.
    ///
    /// # Errors
    /// When there is none, the configuration declares it, or the store fails.
    pub async fn unsubscribe(&self, to: &Address) -> Result<(), Refusal> {
        let _one_at_a_time = self.subscriptions.changes().lock().await;
        let batch =
            self.subscriptions.plan_unsubscribe(to).map_err(|e| Refusal::new(RefusalCode::Invalid, e))?;
        self.write_synced(batch).await?;
        self.subscriptions.apply_unsubscribe(to);
        Ok(())
    }

    /// Hands `batch` to the store thread and waits for the sync that covers it.
    async fn write_synced(&self, batch: Batch) -> Result<(), Refusal> {
        self.committer.write(batch);
        self.committer.sync().await.map_err(|e| Refusal::new(RefusalCode::Store, format!("store: {e}")))
    }
}

/// Checks that `to` can take event copies from node `node`: a queue there (not `EVENT`),
/// or a peer's queue.
pub(super) fn subscription_target(
    node: &NodeName,
    to: &Address,
    queue_exists: impl Fn(&QueueName) -> bool,
    reachable: impl Fn(&NodeName) -> bool,
) -> Result<(), Refusal> {
    if &to.node == node {
        if to.queue.as_str() == EVENT_QUEUE {
            return Err(Refusal::new(RefusalCode::Invalid, format!("{to} already gets every event")));
        }
        if !queue_exists(&to.queue) {
            let reason = format!("queue '{}' does not exist on node {}", to.queue, to.node);
            return Err(Refusal::new(RefusalCode::UnknownQueue, reason));
        }
    } else if !reachable(&to.node) {
        let reason = format!("no route to node '{}' (not a peer, and no route matches)", to.node);
        return Err(Refusal::new(RefusalCode::NoRoute, reason));
    }
    Ok(())
}
