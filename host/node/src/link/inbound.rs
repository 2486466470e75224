//! The way in: the session's events, arrivals handed to the node (`flow::inbound`), and what
//! the link refuses.

use super::*;

/// What one round of a session's events brought in.
#[derive(Default)]
pub(super) struct Arrivals {
    /// Messages that arrived and are not yet handed to the node, with the link's records.
    pub(super) messages: Vec<Arrival>,
    /// Each of those messages' channel and sequence number.
    pub(super) numbers: Vec<(u8, u64)>,
    /// Their payload bytes.
    pub(super) bytes: usize,
    /// Per channel, the last number delivered or skipped: what to acknowledge.
    pub(super) delivered: [Option<u64>; CHANNELS],
    /// Whether a message the sender counts as kept came: its number is synced before the
    /// acknowledgement.
    pub(super) persistent: bool,
}

impl Arrivals {
    pub(super) fn delivered(&mut self, channel: u8, sequence: u64) {
        if let Some(slot) = self.delivered.get_mut(usize::from(channel)) {
            *slot = Some(sequence);
        }
    }
}

impl Link {
    /// Takes a message that arrived into this round's arrivals, which the node takes
    /// together before any other event of the round, at its end, or once they reach a
    /// run's bounds.
    ///
    /// # Errors
    /// As [`Link::deliver`]; or the node takes no persistent message now (short of disk).
    pub(super) fn received(
        &mut self,
        arrivals: &mut Arrivals,
        (channel, sequence): (u8, u64),
        mut message: Message,
        now: Instant,
    ) -> Result<(), String> {
        // The sender counts what is not volatile on the wire as kept: its number is synced
        // before the acknowledgement, whatever the queue makes of it.
        let kept = message.content.reliability != linkbus_plugin_api::Reliability::Volatile;
        // Resolved once here (origins resolve it; one that did not gets it resolved here).
        message.content.reliability = self.node.reliability_of(&message.content);
        let stored = message.content.reliability == linkbus_plugin_api::Reliability::Persistent;
        if (kept || stored)
            && let Err(reason) = self.node.disk().admit(message.content.payload.len() as u64)
        {
            // What came before is delivered (and acknowledged); this one and those after
            // stay with the peer, which sends them again when it reconnects.
            self.deliver(arrivals, now)?;
            return Err(self.refuse_busy(&reason));
        }
        arrivals.persistent |= kept || stored;
        // A stored message and the number after it are written together.
        let record = if stored { self.recorded.delivered(channel, sequence) } else { Batch::new() };
        arrivals.bytes += message.content.payload.len();
        arrivals.messages.push(Arrival { message, record });
        arrivals.numbers.push((channel, sequence));
        if arrivals.messages.len() >= RUN_MESSAGES_MAX || arrivals.bytes >= RUN_BYTES_MAX {
            self.deliver(arrivals, now)?;
        }
        Ok(())
    }

    /// Notes that this node cannot take what the peer sends now: the connection is dropped
    /// after a `Close` with code `Busy` (written after the acknowledgements of what was
    /// taken). Returns the reason.
    pub(super) fn refuse_busy(&mut self, reason: &str) -> String {
        let reason = format!("{} takes no persistent message now: {reason}", self.node.name());
        if self.node.warnings().admit(reason::STORE_SHORT) {
            warn!(peer = self.peer(), reason, "Persistent delivery refused; the peer keeps it.");
        }
        self.busy = Some(reason.clone());
        reason
    }

    /// Hands the node what waits in `arrivals` (see `flow::inbound`); marks what it took
    /// for acknowledgement.
    ///
    /// # Errors
    /// Why a message could not be taken (the connection is dropped then; it and those after
    /// it are not acknowledged).
    pub(super) fn deliver(&mut self, arrivals: &mut Arrivals, now: Instant) -> Result<(), String> {
        if arrivals.messages.is_empty() {
            return Ok(());
        }
        arrivals.bytes = 0;
        let (taken, outcome) = self.inbound.take(&self.node, std::mem::take(&mut arrivals.messages), now);
        for (channel, sequence) in std::mem::take(&mut arrivals.numbers).into_iter().take(taken) {
            arrivals.delivered(channel, sequence);
        }
        self.handle.received_total.fetch_add(taken as u64, Ordering::Relaxed);
        outcome.map_err(|e| {
            if self.node.warnings().admit(reason::LINK_CLOSED) {
                warn!(peer = self.peer(), error = %e, "Cannot take delivery; dropping the connection.");
            }
            e.to_string()
        })
    }

    /// Returns whether anything happened that may let more work through.
    pub(super) fn handle_events(&mut self) -> bool {
        let mut progressed = false;
        let mut arrivals = Arrivals::default();
        let mut closed = None;
        let now = Instant::now();
        while let Some(event) = self.session.poll_event() {
            progressed = true;
            if let SessionEvent::Received { channel, sequence, message } = event {
                if let Err(e) = self.received(&mut arrivals, (channel, sequence), message, now) {
                    closed = Some(e);
                    break;
                }
                continue;
            }
            // Whatever else happens, after the messages that came before it. The event was
            // taken from the session, so it is handled even when they could not be taken
            // (the connection is dropped then, and nothing after them is acknowledged).
            let taken = match self.deliver(&mut arrivals, now) {
                Ok(()) => true,
                Err(e) => {
                    closed = Some(e);
                    false
                }
            };
            match event {
                SessionEvent::Established { peer_restarted, resent, resumed_bytes, lost_by_peer } => {
                    self.established(peer_restarted, resent, resumed_bytes, lost_by_peer);
                }
                SessionEvent::Received { .. } => {}
                SessionEvent::Skipped { .. } if !taken => {}
                SessionEvent::Skipped { channel, sequence, expired, durable } => {
                    arrivals.persistent |= durable;
                    if let Some(id) = expired {
                        if self.node.warnings().admit(reason::EXPIRED) {
                            warn!(peer = self.peer(), %id, "Message expired on its way here; dropped.");
                        }
                        let text = format!("message {id} expired on its way from {}", self.peer());
                        self.node.emit(
                            Event::new(EventKind::Expired, text).with("id", id).with("peer", self.peer()),
                        );
                    }
                    arrivals.delivered(channel, sequence);
                }
                SessionEvent::Dropped { message, reason } => self.dropped(message, reason, now),
                SessionEvent::Acked { channel, through, messages } => self.acked(channel, through, messages),
                SessionEvent::Closed(error) => {
                    closed = Some(self.closed(&error));
                    break;
                }
            }
            if !taken {
                break;
            }
        }
        if closed.is_none()
            && let Err(e) = self.deliver(&mut arrivals, now)
        {
            closed = Some(e);
        }
        if !self.acknowledge(arrivals.delivered, arrivals.persistent, now) {
            closed.get_or_insert_with(|| "store failed".to_owned());
        }
        if let Some(reason) = closed {
            self.write_transmit();
            if let Some(busy) = self.busy.take() {
                self.send_close(CloseCode::Busy, busy);
                self.redial_not_before = Some(tokio::time::Instant::now() + BUSY_REDIAL);
            }
            self.drop_connection(&reason);
        }
        progressed
    }
}
