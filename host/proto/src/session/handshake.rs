//! The handshake and renumbering: the peer's `Hello` checked and taken up, channels renumbered
//! when its numbers do not fit ours, and the durable state a restarted node takes up again.

use std::time::Instant;

use bytes::Bytes;

use super::acks::AckBounds;
use super::{MESSAGE_BYTES_MIN, Phase, Session, SessionError, SessionEvent};
use crate::channel::CHANNELS;
use crate::frame::{ChannelPosition, FRAME_BYTES_MIN, Hello, PROTOCOL_VERSION};
use crate::wire::Encoded;

/// Highest sequence number a peer may name: far beyond any real count, low enough that
/// numbering from it never overflows.
const SEQUENCE_MAX: u64 = 1 << 62;

/// How one channel's numbers are off when an operator's reset takes the peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rebase {
    /// The peer expects less than it acknowledged: its data went back.
    Backwards,
    /// The peer expects more than we sent: our data went back.
    Ahead,
    /// The peer expects less than it acknowledged, but only numbers of volatile messages
    /// (and skips), whose receive numbers it need not sync: its machine crashed. They are
    /// lost like any volatile message in a crash; they go again as skips.
    Lagged,
}

impl Session {
    /// Why a peer's `Hello` is refused outright, if it is.
    fn refusal(&self, hello: &Hello) -> Option<SessionError> {
        if hello.protocol_version != PROTOCOL_VERSION {
            let theirs = hello.protocol_version;
            return Some(SessionError::Version { ours: PROTOCOL_VERSION, theirs });
        }
        if hello.from != self.config.peer.as_str() || hello.to != self.config.local.as_str() {
            return Some(SessionError::WrongPeer {
                from: hello.from.clone(),
                to: hello.to.clone(),
                expected: self.config.peer.to_string(),
                local: self.config.local.to_string(),
            });
        }
        if hello.frame_bytes_max < FRAME_BYTES_MIN as u32 {
            return Some(SessionError::FrameLimit(hello.frame_bytes_max));
        }
        if hello.channels.len() != CHANNELS {
            return Some(SessionError::ChannelCount(hello.channels.len()));
        }
        None
    }

    pub(super) fn handle_hello(&mut self, hello: &Hello, now: Instant) {
        if let Some(error) = self.refusal(hello) {
            return self.close(error);
        }
        let peer_restarted = self.peer_incarnation.is_some_and(|known| known != hello.incarnation);
        if peer_restarted {
            // The peer's old sequence spaces are gone with its state: start receiving afresh.
            for lane in &mut self.lanes {
                lane.receiver.restart();
            }
        }
        self.peer_incarnation = Some(hello.incarnation);
        self.peer_run = Some(hello.run);
        self.peer_frame_bytes_max = Some(hello.frame_bytes_max as usize);
        self.peer_message_bytes_max = Some(usize::try_from(hello.message_bytes_max).unwrap_or(usize::MAX));
        if hello.message_bytes_max < MESSAGE_BYTES_MIN {
            return self.close(SessionError::MessageLimit(hello.message_bytes_max));
        }
        self.ack_bounds = AckBounds::of_peer(&self.config, hello);
        let knows_us = hello.your_incarnation == self.config.incarnation;
        let reset = std::mem::take(&mut self.accept_peer_numbers);
        let restored = std::mem::take(&mut self.restored_sending);
        if restored && knows_us {
            for (lane, position) in self.lanes.iter_mut().zip(&hello.channels) {
                lane.sender.skip_from(position.expected, now);
            }
        }
        let rebased = match self.channels_to_rebase(hello, knows_us, reset, restored) {
            Ok(rebased) => rebased,
            Err(error) => return self.close(error),
        };
        let (mut resent, mut resumed_bytes, mut lost_by_peer) = (0, 0, 0);
        for (channel, position) in hello.channels.iter().enumerate() {
            let Some(lane) = self.lanes.get_mut(channel) else { continue };
            let rebase = rebased.get(channel).copied().flatten();
            let (from, held_bytes) = if let Some(Rebase::Lagged) = rebase {
                lost_by_peer += lane.sender.acked() + 1 - position.expected;
                lane.sender.skip_from(position.expected, now);
                (position.expected, 0)
            } else if let Some(Rebase::Backwards) = rebase {
                // The peer lost what it had: what still waits goes under its numbers.
                lane.sender.rebase(position.expected);
                (position.expected, 0)
            } else if let Some(Rebase::Ahead) = rebase {
                // The peer has everything we still hold: complete it, go on from its number.
                let messages = lane.sender.jump(position.expected);
                let through = position.expected - 1;
                self.events.push_back(SessionEvent::Acked { channel: channel as u8, through, messages });
                (position.expected, 0)
            } else if knows_us {
                // Received but the ACK was lost: adopt the peer's number.
                if let Some(messages) = lane.sender.complete_through(position.expected - 1) {
                    let through = position.expected - 1;
                    self.events.push_back(SessionEvent::Acked { channel: channel as u8, through, messages });
                }
                (position.expected, position.held_bytes)
            } else {
                // The peer never saw this incarnation of ours: its numbers mean nothing to us,
                // and ours nothing to it. Renumber what still waits from 1.
                lane.sender.renumber();
                (1, 0)
            };
            let (messages, resumed) = lane.sender.start_connection(from, held_bytes, position.held_crc, now);
            resent += messages;
            resumed_bytes += resumed;
        }
        self.phase = Phase::Established;
        self.stats.renegotiations += 1;
        self.stats.resent += resent as u64;
        self.stats.resumed_bytes += resumed_bytes;
        self.stats.lost_by_peer += lost_by_peer;
        self.events.push_back(SessionEvent::Established {
            peer_restarted,
            resent,
            resumed_bytes,
            lost_by_peer,
        });
    }

    /// Takes up what this node recorded durably before it restarted: the peer's incarnation
    /// its receive numbers refer to, and per channel the next number it expects from it.
    /// The next `Hello` then tells the peer where to resend from, so nothing delivered before
    /// the restart comes again. Call it before the first connection.
    pub fn restore_receiving(&mut self, peer_incarnation: u64, expected: &[u64]) {
        self.peer_incarnation = Some(peer_incarnation);
        for (lane, expected) in self.lanes.iter_mut().zip(expected) {
            lane.receiver.restore(*expected);
        }
    }

    /// Takes up, for `channel`, the messages this node recorded durably as sent and not yet
    /// acknowledged before it restarted, with their numbers (`(sequence, bytes, expiry)`,
    /// sorted), under the same incarnation as before. On the next handshake the peer's
    /// numbers decide: what it has is complete; numbers it lacks that were not recorded
    /// (volatile messages lost with the restart) go as skips; and a peer that is ahead of
    /// everything recorded (it got volatile messages sent after the last record) is
    /// followed. Call it for every channel before the first connection.
    pub fn restore_sending(
        &mut self,
        channel: u8,
        entries: Vec<(u64, Bytes, Option<Instant>)>,
        now: Instant,
    ) {
        if let Some(lane) = self.lanes.get_mut(channel as usize) {
            lane.sender.restore(entries, now);
        }
        self.restored_sending = true;
    }

    /// Takes up, for `channel`, the highest number the peer acknowledged for a message that
    /// was not volatile, as recorded before a restart (after [`Session::restore_sending`]):
    /// a peer that comes back expecting it or less went backwards, and the link stops
    /// rather than skip what it lost.
    pub fn restore_acknowledged(&mut self, channel: u8, through: u64) {
        if let Some(lane) = self.lanes.get_mut(channel as usize) {
            lane.sender.restore_acked(through);
        }
    }

    /// The highest number of `channel` the peer acknowledged for a message that was not
    /// volatile (for a host that records it).
    pub fn durable_acked(&self, channel: u8) -> u64 {
        self.lanes.get(channel as usize).map_or(0, |l| l.sender.durable_acked())
    }

    /// The messages of `channel` waiting for an acknowledgement: their numbers, bytes
    /// (empty for a skip) and expiry, for a host that records them.
    pub fn awaiting(&self, channel: u8) -> Vec<(u64, Encoded, Option<Instant>)> {
        self.lanes
            .get(channel as usize)
            .map_or_else(Vec::new, |l| l.sender.awaiting().map(|(s, b, e)| (s, b.clone(), e)).collect())
    }

    /// The peer's incarnation from its last `Hello` (what receive numbers refer to).
    pub fn peer_incarnation(&self) -> Option<u64> {
        self.peer_incarnation
    }

    /// Checks the peer's numbers on every channel (when it knows our incarnation); an
    /// operator's `reset` applies to this handshake only, and only to the channels whose
    /// numbers do not fit ours: those are returned with how they are off.
    fn channels_to_rebase(
        &self,
        hello: &Hello,
        knows_us: bool,
        reset: bool,
        restored: bool,
    ) -> Result<[Option<Rebase>; CHANNELS], SessionError> {
        let mut rebased = [None; CHANNELS];
        if !knows_us {
            return Ok(rebased);
        }
        for (channel, position) in hello.channels.iter().enumerate() {
            let off = match self.check_position(channel as u8, position) {
                Ok(()) => continue,
                Err(SessionError::WentBackwards { .. }) if reset => Rebase::Backwards,
                Err(SessionError::WentBackwards { expected, .. })
                    if self.lanes.get(channel).is_some_and(|l| expected > l.sender.durable_acked()) =>
                {
                    Rebase::Lagged
                }
                // After a restore the peer may have volatile messages sent after the last
                // record: it has everything recorded too.
                Err(SessionError::ClaimsMore { .. }) if reset || restored => Rebase::Ahead,
                Err(error) => return Err(error),
            };
            if let Some(slot) = rebased.get_mut(channel) {
                *slot = Some(off);
            }
        }
        Ok(rebased)
    }

    /// A peer that knows our incarnation may expect neither more than we sent nor less than
    /// it acknowledged, on any channel.
    fn check_position(&self, channel: u8, position: &ChannelPosition) -> Result<(), SessionError> {
        let Some(lane) = self.lanes.get(channel as usize) else { return Ok(()) };
        let (last_sent, acked) = (lane.sender.last_sent(), lane.sender.acked());
        let expected = position.expected;
        if expected == 0 || expected > SEQUENCE_MAX {
            return Err(SessionError::BadPosition { channel, expected });
        }
        if expected > last_sent + 1 {
            return Err(SessionError::ClaimsMore { channel, expected, last_sent });
        }
        if expected <= acked {
            return Err(SessionError::WentBackwards { channel, expected, acked });
        }
        Ok(())
    }
}
