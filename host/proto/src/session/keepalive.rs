//! The keepalive: pings sent after a silence, the peer's pings answered (throttled), and the
//! connection dropped when a pong is overdue.

use std::time::Instant;

use super::{PONG_INTERVAL_MIN, Session, SessionError};
use crate::frame::Frame;

impl Session {
    /// Answers a ping, unless other frames are about to go out anyway (any frame proves
    /// liveness) or the peer pings more often than every [`PONG_INTERVAL_MIN`] (throttled).
    pub(super) fn answer_ping(&mut self, nonce: u64, now: Instant) {
        if self.acks_due.is_some() {
            // The peer waits to hear from us, perhaps less long than the acknowledgements
            // would wait: they go now and answer it.
            self.write_acks();
            self.stats.pings_unanswered += 1;
            return;
        }
        if self.transmit_len() > 0 {
            self.stats.pings_unanswered += 1;
            return;
        }
        if self.last_pong.is_some_and(|at| now < at + PONG_INTERVAL_MIN) {
            // Answered later (see `handle_timeout`), so a fast-pinging peer still hears back.
            self.stats.pings_unanswered += u64::from(self.pending_pong.replace(nonce).is_some());
            return;
        }
        self.last_pong = Some(now);
        Frame::Pong { nonce }.encode(&mut self.control);
    }

    /// Sends a throttled pong once its time has come (unless other frames go out anyway).
    pub(super) fn pong_due(&mut self, now: Instant) {
        let due = self.last_pong.is_none_or(|at| now >= at + PONG_INTERVAL_MIN);
        if let Some(nonce) = self.pending_pong.filter(|_| due) {
            self.pending_pong = None;
            if self.transmit_len() == 0 {
                self.last_pong = Some(now);
                Frame::Pong { nonce }.encode(&mut self.control);
            }
        }
    }

    pub(super) fn keepalive(&mut self, now: Instant) {
        match self.ping {
            Some((_, sent)) if now >= sent + self.config.pong_timeout => {
                self.close(SessionError::PongTimeout)
            }
            Some(_) => {}
            None if now >= self.last_received + self.config.ping_interval => {
                let nonce = self.next_nonce;
                self.next_nonce += 1;
                self.ping = Some((nonce, now));
                Frame::Ping { nonce }.encode(&mut self.control);
            }
            None => {}
        }
    }
}
