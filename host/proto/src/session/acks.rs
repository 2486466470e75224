//! The acknowledgement policy: when the acknowledgements of delivered messages go, and what
//! the peer's acknowledgements complete.

use std::time::{Duration, Instant};

use super::{Phase, Session, SessionConfig, SessionError, SessionEvent};
use crate::frame::{Frame, Hello};

/// Messages of one channel delivered but not acknowledged after which the acknowledgement
/// goes at once, without waiting for `ack_delay`: a sender busy enough to have this many
/// waiting is not slowed by acknowledgements that come late. At most a quarter of the
/// sender's window (from its `Hello`), so a small window keeps moving too.
pub(super) const ACK_WAITING_MESSAGES_MAX: u64 = 32;

/// The same in bytes (at most a quarter of the sender's byte window).
pub(super) const ACK_WAITING_BYTES_MAX: usize = 1 << 20;

/// Share of the sender's retransmit timeout an acknowledgement may wait at most, so the
/// sender never writes a message again only because its acknowledgement was kept back.
const ACK_DELAY_SHARE_OF_RETRANSMIT: u32 = 4;

/// When an acknowledgement goes at once and how long one may wait otherwise: our
/// `ack_delay`, within the bounds the peer's window and retransmit timeout set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AckBounds {
    /// Messages waiting after which the acknowledgement goes at once.
    pub(super) messages: u64,
    /// Bytes waiting after which it goes at once.
    pub(super) bytes: usize,
    /// Longest wait.
    pub(super) delay: Duration,
}

impl AckBounds {
    /// The bounds for a peer that advertised `window` (messages, bytes) and `retransmit`.
    pub(super) fn new(ack_delay: Duration, window: (u64, u64), retransmit: Duration) -> Self {
        Self {
            messages: ACK_WAITING_MESSAGES_MAX.min(window.0 / 4).max(1),
            bytes: ACK_WAITING_BYTES_MAX.min(usize::try_from(window.1 / 4).unwrap_or(usize::MAX)),
            delay: ack_delay.min(retransmit / ACK_DELAY_SHARE_OF_RETRANSMIT),
        }
    }

    /// Before the peer's first `Hello` (when nothing is acknowledged anyway): each at once.
    pub(super) const AT_ONCE: Self = Self { messages: 1, bytes: 0, delay: Duration::ZERO };

    /// The bounds for the peer that sent `hello`.
    pub(super) fn of_peer(config: &SessionConfig, hello: &Hello) -> Self {
        let window = (u64::from(hello.in_flight_messages_max), hello.in_flight_bytes_max);
        Self::new(config.ack_delay, window, Duration::from_millis(u64::from(hello.retransmit_timeout_ms)))
    }
}

impl Session {
    /// A duplicate arrived: acknowledge again what this channel already stored (an
    /// acknowledgement waiting on the channel goes with it: it names the same number).
    pub(super) fn ack_again(&mut self, channel: u8) {
        let Some(lane) = self.lanes.get_mut(channel as usize) else { return };
        let expected = lane.receiver.expected();
        if expected > 1 {
            Frame::Ack { channel, sequence: expected - 1 }.encode(&mut self.control);
            lane.acked(expected - 1);
        }
    }

    /// An ACK says everything of `channel` through `through` arrived; a number that matches
    /// nothing awaiting is ignored.
    pub(super) fn complete_through(&mut self, channel: u8, through: u64) {
        let Some(lane) = self.lanes.get_mut(channel as usize) else {
            return self.close(SessionError::UnknownChannel(channel));
        };
        if let Some(messages) = lane.sender.complete_through(through) {
            self.events.push_back(SessionEvent::Acked { channel, through, messages });
        }
    }

    /// The host stored every received message of `channel` up to `through`: acknowledge
    /// them. Numbers from an earlier connection (already forgotten) are ignored.
    ///
    /// The acknowledgement waits up to `ack_delay` for other frames to go with it — the
    /// host's next packets, or another channel's acknowledgement — so that an answer to a
    /// message carries its acknowledgement in the same write. It goes at once when the
    /// channel has [`ACK_WAITING_MESSAGES_MAX`] messages or [`ACK_WAITING_BYTES_MAX`] bytes
    /// unacknowledged (or a quarter of the peer's window, when that is less), and waits at
    /// most a quarter of the peer's retransmit timeout (both from its `Hello`).
    pub fn handle_delivered(&mut self, channel: u8, through: u64, now: Instant) {
        let established = self.phase == Phase::Established;
        let Some(lane) = self.lanes.get_mut(channel as usize) else { return };
        if !lane.receiver.delivered(through) || !established {
            return;
        }
        lane.ack_waiting = Some(through);
        let bounds = self.ack_bounds;
        let busy = through.saturating_sub(lane.ack_written) >= bounds.messages
            || lane.ack_waiting_bytes >= bounds.bytes;
        if bounds.delay.is_zero() || busy {
            self.write_acks();
        } else {
            self.acks_due.get_or_insert(now + bounds.delay);
        }
    }

    /// Writes the acknowledgements that wait for company now (the host is about to close
    /// the connection: what was delivered must not be sent again).
    pub fn flush_acks(&mut self) {
        if self.phase == Phase::Established {
            self.write_acks();
        }
    }

    /// Writes the waiting acknowledgements of every channel.
    pub(super) fn write_acks(&mut self) {
        self.acks_due = None;
        for (channel, lane) in (0u8..).zip(&mut self.lanes) {
            if let Some(through) = lane.ack_waiting {
                Frame::Ack { channel, sequence: through }.encode(&mut self.control);
                lane.acked(through);
            }
        }
    }
}
