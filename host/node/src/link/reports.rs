//! What the link reports: expiries, drops and dead letters of its messages, and the events it
//! raises.

use super::*;

/// How often expired messages are swept out of a transmission queue.
pub(super) const EXPIRY_SWEEP: Duration = Duration::from_millis(250);

impl Link {
    /// Takes expired messages out of the transmission queue and reports them (see
    /// [`Link::expired`]).
    pub(super) fn sweep_expired(&self) {
        let expired = self.handle.lock().take_expired(Instant::now());
        if expired.is_empty() {
            return;
        }
        self.handle.room.notify_waiters();
        for (message, key) in &expired {
            self.expire_unsent(message, *key);
        }
    }

    /// A message that expired in the transmission queue: its record goes, and it is
    /// reported (see [`Link::expired`]).
    pub(super) fn expire_unsent(&self, message: &linkbus_plugin_api::Message, key: Option<u64>) {
        if let (Some(record), Some(key)) = (&self.handle.record, key) {
            record.dropped(key);
        }
        if self.node.warnings().admit(reason::EXPIRED) {
            warn!(peer = self.peer(), id = %message.id, "Message expired before it was sent.");
        }
        self.expired(message, false);
    }

    /// The handshake completed: the records follow its numbers, and the link is up (logged,
    /// and raised as an event).
    pub(super) fn established(
        &mut self,
        peer_restarted: bool,
        resent: usize,
        resumed_bytes: u64,
        lost_by_peer: u64,
    ) {
        if peer_restarted {
            // Its numbers start again: those delivered under its old incarnation mean nothing.
            self.delivered_through = [None; CHANNELS];
        }
        // The records of a renumbering go to the store as one batch.
        let node = self.node.clone();
        let hold = node.committer().hold();
        self.recorded.established(&self.node, &self.session);
        self.rerecord_sent();
        self.record_acked();
        drop(hold);
        let security = self.active.as_ref().map(|a| a.secure.protection()).unwrap_or_default();
        info!(peer = self.peer(), security, peer_restarted, resent, resumed_bytes, "Link up.");
        if lost_by_peer > 0 {
            warn!(
                peer = self.peer(),
                lost_by_peer,
                "The peer lost the receive numbers of volatile messages it had acknowledged (it crashed, \
                 or its data was restored); they go again as skips."
            );
        }
        let renegotiations = self.session.stats().renegotiations;
        let text = format!(
            "link to {} up (renegotiation {renegotiations}: {resent} resent, {resumed_bytes} bytes resumed, \
             {lost_by_peer} volatile lost by the peer)",
            self.peer()
        );
        self.node.emit(
            Event::new(EventKind::LinkUp, text)
                .with("peer", self.peer())
                .with("renegotiations", renegotiations)
                .with("resent", resent)
                .with("resumed_bytes", resumed_bytes)
                .with("lost_by_peer", lost_by_peer)
                .with("peer_restarted", peer_restarted),
        );
        // A link counts as taking messages from the moment it is up (for
        // `links.queue_pace_bytes`).
        self.handle.lock().mark_taken(Instant::now());
        self.handle.up.store(true, Ordering::Relaxed);
        self.handle.note_up();
        self.handle.peer_message_bytes_max.store(self.session.message_bytes_max(), Ordering::Relaxed);
    }

    /// Raises the event for a message of ours that expired before it reached the peer, and
    /// reports it to the message's origin: for its recipients on the peer it failed (expired
    /// before it was sent from its origin) or expired (after it was `sent`, or on a relay).
    pub(super) fn expired(&self, message: &linkbus_plugin_api::Message, sent: bool) {
        // A transfer's frames: the transfer reports its own lifetime (`files`).
        if crate::files::is_frame(message) {
            return;
        }
        if message.content.kind == linkbus_plugin_api::Kind::Event {
            if message.content.name == RESULT_MESSAGE_NAME {
                self.node.count_result_dropped();
            }
            return;
        }
        let to = ResultTo::of(message);
        let with = |outcome: Outcome| self.recipients_here(message).map(|r| (r, outcome.clone())).collect();
        match (&message.id.source == self.node.name(), sent) {
            // Never sent from its origin: the send failed.
            (true, false) => {
                let reason = format!("expired before it was sent to {}", self.peer());
                self.node.report(to.as_ref(), with(Outcome::failed(EXPIRED_BEFORE_SENDING, reason)));
            }
            // Sent, but the peer may have it and not have acknowledged yet: a guess.
            (true, true) => self.node.report_provisional(to.as_ref(), with(Outcome::Expired)),
            // A relay that never sent it on knows it expired.
            (false, false) => self.node.report(to.as_ref(), with(Outcome::Expired)),
            // A relay that sent it on cannot know: the origin waits for the recipients' node.
            (false, true) => {}
        }
        self.node.emit(
            Event::new(
                EventKind::Expired,
                format!("message {} expired before it reached {}", message.id, self.peer()),
            )
            .with("id", &message.id)
            .with("peer", self.peer()),
        );
    }

    pub(super) fn stopped_event(&self, error: &SessionError) {
        self.node.emit(
            Event::new(
                EventKind::LinkStopped,
                format!("link to {} stopped: {error}; run `linkbus link reset {}`", self.peer(), self.peer()),
            )
            .with("peer", self.peer())
            .with("reason", error),
        );
    }

    /// The recipients of `message` this link takes it to: all of the copy's (a message
    /// leaves in one copy per next hop, naming the recipients routed through it).
    pub(super) fn recipients_here<'m>(
        &self,
        message: &'m linkbus_plugin_api::Message,
    ) -> impl Iterator<Item = linkbus_plugin_api::Address> + 'm {
        message.content.recipients.iter().cloned()
    }

    /// Dead-letters a message of ours too large for the peer (its recipients there failed).
    pub(super) fn dead_letter_local(&self, message: linkbus_plugin_api::Message, reason: &str, now: Instant) {
        let failed = self.recipients_here(&message).collect();
        let why = DeadLetter { code: DeadLetterCode::TooLarge, reason, failed };
        if let Err(e) = crate::flow::dead_letter::put_bounded(&self.node, message, why, now)
            && self.node.warnings().admit(reason::DEAD_LETTER)
        {
            warn!(peer = self.peer(), error = %e, "Dead-letter queue refused a message; it is lost.");
        }
    }

    pub(super) fn dropped(&self, message: Bytes, reason: DropReason, now: Instant) {
        // A dead letter can stay for long: copied out of a buffer it may share with other
        // messages' heads (an expired one is only reported).
        let message =
            if reason == DropReason::TooLargeForPeer { Bytes::copy_from_slice(&message) } else { message };
        let decoded = linkbus_proto::wire::decode_message(message);
        match (reason, decoded) {
            (DropReason::Expired, Ok(m)) => {
                if self.node.warnings().admit(reason::EXPIRED) {
                    warn!(peer = self.peer(), id = %m.id, "Message expired before it was resent.");
                }
                self.expired(&m, true);
            }
            (DropReason::TooLargeForPeer, Ok(m)) => {
                let reason = format!("message is larger than peer {}'s message limit", self.peer());
                self.dead_letter_local(m, &reason, now);
            }
            (_, Err(e)) => {
                if self.node.warnings().admit(reason::BAD_RESULT) {
                    warn!(peer = self.peer(), error = %e, "Dropped message does not decode.");
                }
            }
        }
    }

    pub(super) fn closed(&mut self, error: &SessionError) -> String {
        match error {
            SessionError::PeerClosed { code, reason } if *code == CloseCode::Busy as u16 => {
                // Its messages wait here; asking again at once would only be refused again.
                self.redial_not_before = Some(tokio::time::Instant::now() + BUSY_REDIAL);
                if self.node.warnings().admit(reason::STORE_SHORT) {
                    warn!(
                        peer = self.peer(),
                        reason, "The peer takes no persistent message now; they wait here."
                    );
                }
            }
            SessionError::PeerClosed { code, reason } if *code == CloseCode::Shutdown as u16 => {
                info!(peer = self.peer(), reason, "Peer closed the link.");
            }
            SessionError::PeerClosed { code, reason } if *code == CloseCode::Duplicate as u16 => {
                debug!(peer = self.peer(), reason, "Duplicate connection closed by the peer.");
            }
            SessionError::WentBackwards { .. } => {
                error!(
                    peer = self.peer(),
                    %error,
                    "Link STOPPED: the peer's sequence numbers went backwards (its data was wiped or restored \
                     from an old copy). Check its store, then run `linkbus link reset {}` on this node to take \
                     its numbers as they are (messages it acknowledged before are not sent again).",
                    self.peer()
                );
                self.handle.stop(error.to_string());
                self.stopped_event(error);
            }
            SessionError::ClaimsMore { .. } => {
                error!(
                    peer = self.peer(),
                    %error,
                    "Link STOPPED: the peer received more than this node remembers sending (this node's data \
                     was wiped or restored from an old copy). Check this node's store, then run `linkbus link \
                     reset {}` on this node to take the peer's numbers (messages waiting here on that channel \
                     count as delivered: the peer has them).",
                    self.peer()
                );
                self.handle.stop(error.to_string());
                self.stopped_event(error);
            }
            error => {
                if self.node.warnings().admit(reason::LINK_CLOSED) {
                    warn!(peer = self.peer(), %error, "Link closed.");
                }
            }
        }
        error.to_string()
    }
}
