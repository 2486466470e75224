//! The sending half of a session: sequence numbers, the awaiting-ACK queue, the write
//! cursor, and the rules for resending (after a reconnect, on a NAK, on a retransmit
//! timeout).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::event::{DropReason, SessionEvent};
use crate::frame::Frame;
use crate::wire::with_lifetime;

/// A message written this long after it was handed over carries its lifetime rewritten.
const LIFETIME_PATCH_AFTER: Duration = Duration::from_millis(100);

/// A message handed over and not yet acknowledged.
#[derive(Debug)]
struct Pending {
    sequence: u64,
    /// The encoded message (empty once dropped in transit: it is then sent as a skip).
    message: Bytes,
    /// When its lifetime runs out, so a resend carries the time left, or a skip.
    expires_at: Option<Instant>,
    /// When it was handed over, to tell whether it waited long enough to need its lifetime
    /// rewritten.
    handed_at: Instant,
    /// When it was last written on the current connection, for the retransmit timeout.
    written_at: Option<Instant>,
    /// NAKs it drew.
    naks: u32,
    /// Bytes it counts in the byte window (its size when handed over).
    counted: usize,
}

/// See the module doc.
#[derive(Debug)]
pub(super) struct Sender {
    /// Next sequence number to assign.
    next_send: u64,
    /// Highest sequence number the peer acknowledged.
    acked: u64,
    /// Messages not yet acknowledged, in sequence order.
    unacked: VecDeque<Pending>,
    /// Sequence number of the next message to write on the current connection.
    next_write: u64,
    /// Encoded bytes of the messages in `unacked`, for the byte window.
    unacked_bytes: usize,
    /// Retransmit timeouts in a row without progress; each doubles the next timeout (up to
    /// 8 times the configured one), so a slow link is not flooded with copies.
    backoff: u32,
}

/// Most NAKs one message may draw before the link is torn down (something damages it every
/// time; a fresh connection may fare better).
pub(super) const NAKS_PER_MESSAGE_MAX: u32 = 8;

/// What a NAK did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NakOutcome {
    /// Writing went back to the refused message.
    Rewound,
    /// Stale (already acknowledged, or already about to be written again): ignored.
    Ignored,
    /// The message was refused too often: close the connection.
    TooMany,
}

/// What writing a message produced besides its frame.
pub(super) struct WriteLimits {
    /// Largest message the peer takes.
    pub(super) message_bytes_max: usize,
    /// Bytes to write at most (at least one message when not zero).
    pub(super) budget: usize,
}

impl Sender {
    pub(super) fn new() -> Self {
        Self { next_send: 1, acked: 0, unacked: VecDeque::new(), next_write: 1, unacked_bytes: 0, backoff: 0 }
    }

    /// Messages handed over and not yet acknowledged.
    pub(super) fn in_flight(&self) -> usize {
        self.unacked.len()
    }

    /// Encoded bytes handed over and not yet acknowledged.
    pub(super) fn in_flight_bytes(&self) -> usize {
        self.unacked_bytes
    }

    /// The highest sequence number ever assigned.
    pub(super) fn last_sent(&self) -> u64 {
        self.next_send - 1
    }

    /// The highest sequence number acknowledged.
    pub(super) fn acked(&self) -> u64 {
        self.acked
    }

    /// Messages handed over but not yet written on the current connection.
    pub(super) fn unwritten(&self) -> usize {
        self.unacked.iter().filter(|p| p.sequence >= self.next_write).count()
    }

    /// Assigns the next sequence number to `message`.
    pub(super) fn push(&mut self, message: Bytes, expires_at: Option<Instant>, now: Instant) -> u64 {
        let sequence = self.next_send;
        self.next_send += 1;
        let counted = message.len();
        self.unacked_bytes += counted;
        self.unacked.push_back(Pending {
            sequence,
            counted,
            message,
            expires_at,
            handed_at: now,
            written_at: None,
            naks: 0,
        });
        sequence
    }

    /// Completes every message up to `through`; returns how many, or `None` when the number
    /// matches nothing awaiting (old, or never sent).
    pub(super) fn complete_through(&mut self, through: u64) -> Option<usize> {
        if through <= self.acked || through >= self.next_send {
            return None;
        }
        let mut messages = 0;
        while self.unacked.front().is_some_and(|p| p.sequence <= through) {
            if let Some(done) = self.unacked.pop_front() {
                self.unacked_bytes -= done.counted;
            }
            messages += 1;
        }
        self.acked = through;
        self.backoff = 0;
        Some(messages)
    }

    /// The peer never saw this incarnation of ours: number what still waits from 1.
    pub(super) fn renumber(&mut self) {
        for (index, pending) in self.unacked.iter_mut().enumerate() {
            pending.sequence = index as u64 + 1;
        }
        self.next_send = self.unacked.len() as u64 + 1;
        self.acked = 0;
    }

    /// A new connection writes from `from` on; returns how many messages that resends.
    pub(super) fn start_connection(&mut self, from: u64) -> usize {
        self.next_write = from;
        for pending in &mut self.unacked {
            pending.written_at = None;
        }
        self.unacked.iter().filter(|p| p.sequence >= from).count()
    }

    /// Writes messages from the cursor on, in order, within `limits`; returns how many.
    pub(super) fn write(
        &mut self,
        now: Instant,
        limits: &WriteLimits,
        out: &mut BytesMut,
        events: &mut VecDeque<SessionEvent>,
    ) -> usize {
        if limits.budget == 0 {
            return 0;
        }
        let skip = self.unacked.front().map_or(0, |p| self.next_write.saturating_sub(p.sequence)) as usize;
        let start = out.len();
        let mut written = 0;
        for pending in self.unacked.iter_mut().skip(skip) {
            if out.len() - start >= limits.budget {
                break;
            }
            written += 1;
            self.next_write = pending.sequence + 1;
            write_one(pending, now, limits.message_bytes_max, out, events);
        }
        written
    }

    /// The peer refused message `sequence` (its CRC failed): write it again, and the ones
    /// after it, which the peer held or dropped behind the gap (go-back-N).
    pub(super) fn nak(&mut self, sequence: u64) -> NakOutcome {
        let Some(front) = self.unacked.front() else { return NakOutcome::Ignored };
        if sequence < front.sequence || sequence >= self.next_write {
            return NakOutcome::Ignored;
        }
        let index = (sequence - front.sequence) as usize;
        let Some(pending) = self.unacked.get_mut(index) else { return NakOutcome::Ignored };
        pending.naks += 1;
        if pending.naks > NAKS_PER_MESSAGE_MAX {
            return NakOutcome::TooMany;
        }
        self.next_write = sequence;
        NakOutcome::Rewound
    }

    /// When the oldest written message times out, if any.
    pub(super) fn retransmit_at(&self, timeout: Duration) -> Option<Instant> {
        let timeout = timeout * (1u32 << self.backoff.min(3));
        self.unacked.front().and_then(|p| p.written_at).map(|at| at + timeout)
    }

    /// Goes back to the oldest message when it timed out (go-back-N: everything after it is
    /// written again too, within the write budget); returns whether it did. The timer
    /// restarts, longer each time until an acknowledgement makes progress.
    pub(super) fn rewind_if_overdue(&mut self, now: Instant, timeout: Duration) -> bool {
        let due = self.retransmit_at(timeout).is_some_and(|at| now >= at);
        let Some(front) = self.unacked.front_mut().filter(|_| due) else { return false };
        front.written_at = Some(now);
        self.next_write = front.sequence;
        self.backoff = (self.backoff + 1).min(3);
        true
    }
}

/// Writes one message: with the lifetime it has left, or as an empty skip when it expired or
/// is too large for the peer.
fn write_one(
    pending: &mut Pending,
    now: Instant,
    message_bytes_max: usize,
    out: &mut BytesMut,
    events: &mut VecDeque<SessionEvent>,
) {
    pending.written_at = Some(now);
    let left = pending.expires_at.map(|at| at.saturating_duration_since(now).as_millis() as u64);
    let reason = match left {
        Some(0) => Some(DropReason::Expired),
        _ if pending.message.len() > message_bytes_max => Some(DropReason::TooLargeForPeer),
        _ => None,
    };
    if let Some(reason) = reason {
        Frame::encode_data(pending.sequence, &[], out);
        let message = std::mem::take(&mut pending.message);
        events.push_back(SessionEvent::Dropped { message, reason });
        pending.expires_at = None;
        return;
    }
    // Only a message that waited is copied to carry its new lifetime.
    if let Some(ms) = left
        && now.saturating_duration_since(pending.handed_at) >= LIFETIME_PATCH_AFTER
    {
        pending.message = with_lifetime(&pending.message, ms).unwrap_or_else(|| pending.message.clone());
    }
    Frame::encode_data(pending.sequence, &pending.message, out);
}
