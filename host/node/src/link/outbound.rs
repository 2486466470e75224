//! The way out: from the transmission queue into the session's window, and the session's
//! packets onto the connection.

use super::*;

/// Perf (OPT-42, LEV-23): writes up to this size go straight to the socket while nothing
/// waits for the writer task (no wake-up on a quiet link); larger ones go through the
/// writer task, as writing them here delays urgent messages under load.
pub(super) const DIRECT_WRITE_BYTES_MAX: usize = 64 << 10;

/// Bytes of messages a channel holds in the session not yet written, at or above which it
/// takes no more from the transmission queue: the window bounds what travels unacknowledged,
/// not what waits to be written, which waits in the queue (its lifetime counted there, and
/// its payload not pulled out of the cache by tens of megabytes taken ahead of the writer).
pub(crate) const PULL_AHEAD_BYTES: usize = 1 << 20;

/// Whether `session` takes another message on `channel`: its window has room, and less
/// than [`PULL_AHEAD_BYTES`] of the channel's messages wait unwritten.
pub(super) fn takes_more(session: &Session, channel: u8) -> bool {
    session.has_window(channel) && session.unwritten_bytes(channel) < PULL_AHEAD_BYTES
}

impl Link {
    /// Writes what the session has to send: its control frames, then its packets — once the
    /// records of messages just sent are synced (a node must not have sent what it does not
    /// remember sending after a crash; one sync covers every message of the pump, and the
    /// other writers' waiting with it).
    pub(super) fn write_transmit(&mut self) {
        if std::mem::take(&mut self.unsynced)
            && let Err(e) = self.node.committer().sync_blocking()
        {
            self.node.fail(format!("store failed while recording messages for {}: {e}", self.peer()));
            return self.drop_connection("store failed");
        }
        let mut out = Vec::new();
        self.session.take_transmit(&mut out);
        if let Some(active) = &mut self.active {
            if let Err(e) = active.secure.send_chunks(&mut out) {
                if self.node.warnings().admit(reason::LINK_CLOSED) {
                    warn!(peer = self.handle.peer.name.as_str(), error = %e, "Secure channel failed.");
                }
                return self.drop_connection(&e.to_string());
            }
            active.secure.take_transmit(&mut out);
            if !out.is_empty()
                && let Err(e) = active.write(out)
            {
                self.drop_connection(&format!("write failed: {e}"));
            }
        }
    }

    /// Moves messages into the session, handles its events and writes its output, until
    /// nothing changes.
    pub(super) fn pump(&mut self) {
        for _ in 0..4 {
            self.fill_window();
            // Bounded, so a large resend after a reconnect never stops the reading that
            // brings the acknowledgements.
            let budget = DATA_BACKLOG_BYTES.saturating_sub(self.backlog() + self.session.transmit_len());
            self.session.write_pending(Instant::now(), budget);
            let progressed = self.handle_events();
            self.write_transmit();
            if !progressed {
                break;
            }
        }
        // What the socket took at once wakes no writer task, so nothing says it drained:
        // with more to write, go round again (each round writes at least one packet).
        if self.active.is_some()
            && self.session.is_established()
            && self.backlog() == 0
            && self.session.unwritten() > 0
        {
            self.drained.notify_one();
        }
        if let Ok(mut stats) = self.handle.stats.lock() {
            *stats = *self.session.stats();
        }
    }

    pub(super) fn fill_window(&mut self) {
        if !self.session.is_established() {
            return;
        }
        let now = Instant::now();
        let mut too_large = Vec::new();
        // Events are raised after the queue's lock is released (an event copy may go into
        // this very queue).
        let mut expired = Vec::new();
        {
            let mut queue = self.handle.lock();
            let before = queue.len();
            // Whether a message went to the session (not only expired or too large ones out).
            let mut took = false;
            loop {
                let session = &self.session;
                let Some((mut message, queued_at, key)) = queue.pop(|m| takes_more(session, channel_of(m)))
                else {
                    break;
                };
                let elapsed = now.saturating_duration_since(queued_at);
                let lifetime = message.content.lifetime.unwrap_or(Lifetime::UNLIMITED);
                let Some(left) = lifetime.after(elapsed.as_millis() as u64) else {
                    expired.push((message, key));
                    continue;
                };
                message.content.lifetime = Some(left);
                let expires_at = (!left.is_unlimited()).then(|| now + Duration::from_millis(left.as_ms()));
                let channel = channel_of(&message);
                // The payload of a large message is shared, not copied behind its head.
                let bytes = match self.heads.get_mut(usize::from(channel)) {
                    Some(heads) => Encoded::of_in(&message, heads),
                    None => Encoded::of(&message),
                };
                // A second handle on the bytes only for a message to record (a shared clone
                // costs an allocation).
                let recorded = self.handle.record.as_ref().zip(key).map(|(r, k)| (r, k, bytes.clone()));
                match self.session.send(channel, bytes, expires_at, now) {
                    Ok(sequence) => {
                        took = true;
                        // Recorded as sent under its number, in the queue's order.
                        if let Some((record, key, bytes)) = &recorded {
                            record.sent(*key, channel, sequence, bytes);
                            self.unsynced = true;
                            if let Some(sent) = self.sent.get_mut(channel as usize) {
                                sent.insert(sequence);
                            }
                        }
                    }
                    Err(SendError::TooLarge { max, .. }) => {
                        if let (Some(record), Some(key)) = (&self.handle.record, key) {
                            record.dropped(key);
                        }
                        too_large.push((message, max));
                    }
                    Err(_) => {
                        queue.unpop(message, queued_at, key);
                        break;
                    }
                }
            }
            let freed = queue.len() < before;
            if took {
                queue.mark_taken(now);
            }
            drop(queue);
            if freed {
                self.handle.room.notify_waiters();
            }
        }
        for (message, key) in &expired {
            self.expire_unsent(message, *key);
        }
        for (message, max) in too_large {
            let reason = format!("message is larger than peer {}'s message limit ({max} bytes)", self.peer());
            self.dead_letter_local(message, &reason, now);
        }
    }
}
