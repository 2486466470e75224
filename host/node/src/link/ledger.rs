//! What the link records of what it sent and took: acknowledgements and their store records,
//! synced before they count.

use super::*;

impl Link {
    /// Acknowledges a batch of deliveries (`through` per channel), once they and the
    /// recorded numbers are durable — or the numbers could go backwards for the peer after a
    /// crash (and stop the link). Returns `false` when the store failed (nothing was
    /// acknowledged; the node is stopping).
    pub(super) fn acknowledge(
        &mut self,
        delivered: [Option<u64>; CHANNELS],
        persistent: bool,
        now: Instant,
    ) -> bool {
        // Only a batch with a message that is not volatile records its numbers (synced): a
        // receiver that restarts behind volatile numbers it acknowledged gets them again as
        // skips (its peer knows they were volatile), so they need no store at all.
        if persistent {
            self.recorded.batch_delivered(&self.node, &delivered);
        }
        if let Err(e) = self.make_durable(persistent) {
            self.node
                .fail(format!("store sync failed before acknowledging messages from {}: {e}", self.peer()));
            return false;
        }
        for (seen, through) in self.delivered_through.iter_mut().zip(delivered) {
            *seen = through.or(*seen);
        }
        for (channel, through) in delivered.into_iter().enumerate() {
            if let Some(through) = through.filter(|_| !crate::faults::hold_acks()) {
                self.session.handle_delivered(channel as u8, through, now);
                self.backoff.reset();
            }
        }
        true
    }

    /// The peer acknowledged `messages` of `channel`, through `through`.
    pub(super) fn acked(&mut self, channel: u8, through: u64, messages: usize) {
        // Records change (and go to the store as one batch) only when a persistent message
        // was among those acknowledged.
        let forgets =
            self.sent.get(channel as usize).and_then(|s| s.first()).is_some_and(|first| *first <= through);
        if forgets {
            let node = self.node.clone();
            let hold = node.committer().hold();
            self.forget_sent(channel, through);
            self.record_acked();
            drop(hold);
        }
        self.handle.acked_total.fetch_add(messages as u64, Ordering::Relaxed);
        if messages > 0 {
            self.backoff.reset();
        }
    }

    /// Messages of `channel` acknowledged through `through` are no longer recorded as sent.
    pub(super) fn forget_sent(&mut self, channel: u8, through: u64) {
        let (Some(record), Some(sent)) = (&self.handle.record, self.sent.get_mut(channel as usize)) else {
            return;
        };
        let rest = sent.split_off(&(through + 1));
        let done = std::mem::replace(sent, rest);
        if !done.is_empty() {
            record.forget(channel, done);
        }
    }

    /// Records, per channel, the highest number the peer acknowledged for a persistent
    /// message, when it changed (it also goes down: a renumbering after the handshake).
    pub(super) fn record_acked(&mut self) {
        let Some(record) = &self.handle.record else { return };
        for (channel, recorded) in self.acked_recorded.iter_mut().enumerate() {
            let now = self.session.durable_acked(channel as u8);
            if now != *recorded {
                record.acked(channel as u8, now);
                *recorded = now;
            }
        }
    }

    /// After a handshake that renumbered what waits (the peer lost track of our numbers, or
    /// an operator reset), the record follows the new numbers.
    pub(super) fn rerecord_sent(&mut self) {
        let Some(record) = &self.handle.record else { return };
        let now = Instant::now();
        for channel in 0..CHANNELS as u8 {
            let Some(sent) = self.sent.get_mut(channel as usize) else { continue };
            // The persistent messages waiting, read from their heads: only a renumbering
            // (their numbers are not the recorded ones) decodes them to record them again.
            let mut awaiting = self.session.awaiting(channel);
            awaiting.retain(|(_, bytes, _)| bytes.is_persistent());
            let numbers: std::collections::BTreeSet<u64> = awaiting.iter().map(|(s, _, _)| *s).collect();
            if &numbers == sent {
                continue;
            }
            let current: Vec<(u64, linkbus_plugin_api::Message)> = awaiting
                .into_iter()
                .filter_map(|(sequence, bytes, expires_at)| {
                    let mut message = linkbus_proto::wire::decode_message(bytes.to_bytes()).ok()?;
                    // Recorded with the lifetime it has left now.
                    if let Some(at) = expires_at {
                        let left = at.saturating_duration_since(now).as_millis().max(1) as u64;
                        message.content.lifetime = Some(Lifetime::from_ms(left));
                    }
                    Some((sequence, message))
                })
                .collect();
            record.rerecord(channel, std::mem::take(sent), &current);
            *sent = current.iter().map(|(s, _)| *s).collect();
            self.unsynced = true;
        }
    }

    /// What is acknowledged is durable first: one sync for a batch with a message that is
    /// not volatile (group commit); a node whose store failed acknowledges nothing more.
    // Invariant: the link task may wait here for an fsync (`sync_blocking` first hands the
    // runtime's other tasks to another worker); no lock is held across this call, and what
    // runs on the link task (its stages included) may be held up by that wait.
    pub(super) fn make_durable(&self, persistent: bool) -> Result<(), linkbus_plugin_api::StoreError> {
        if self.node.is_failing() {
            return Err(linkbus_plugin_api::StoreError::Poisoned("the node is stopping".into()));
        }
        if persistent { self.node.committer().sync_blocking() } else { Ok(()) }
    }
}
