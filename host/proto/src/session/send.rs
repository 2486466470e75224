//! The sending half of one channel of a session: sequence numbers, the awaiting-ACK queue,
//! the write cursor (a message and a byte offset in it, since messages go out in packets),
//! and the rules for resending (after a reconnect, on a NAK, on a retransmit timeout).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::event::{DropReason, SessionEvent};
use crate::frame::{DATA_OVERHEAD_BYTES, DataHeader, Frame};
use crate::wire::{Chunks, Encoded};

/// A message written this long after it was handed over carries its lifetime rewritten.
const LIFETIME_PATCH_AFTER: Duration = Duration::from_millis(100);

/// A message handed over and not yet acknowledged.
#[derive(Debug)]
struct Pending {
    sequence: u64,
    /// The encoded message (empty once dropped in transit: it is then sent as a skip). Its
    /// bytes change only when a write starts from its first byte, so a resume inside it
    /// continues the same bytes.
    message: Encoded,
    /// CRC32C of `message`, once a write of it started.
    crc: Option<u32>,
    /// When its lifetime runs out, so a resend carries the time left, or a skip.
    expires_at: Option<Instant>,
    /// When it was handed over, to tell whether it waited long enough to need its lifetime
    /// rewritten.
    handed_at: Instant,
    /// When its last packet was written on the current connection, for the retransmit
    /// timeout.
    written_at: Option<Instant>,
    /// NAKs it drew.
    naks: u32,
    /// Bytes it counts in the byte window (its size when handed over).
    counted: usize,
    /// Bytes counted by the messages handed over on this channel before it.
    before: u64,
}

/// See the module doc.
#[derive(Debug)]
pub(super) struct Sender {
    /// This channel's number, written in every packet.
    channel: u8,
    /// Next sequence number to assign.
    next_send: u64,
    /// Highest sequence number the peer acknowledged.
    acked: u64,
    /// Highest sequence number the peer acknowledged for a message that is not volatile
    /// (or, when that is not known, `acked` at the time): a peer that keeps its promises
    /// synced its receive numbers through it before acknowledging, so it never expects a
    /// number at or below it again; numbers above it it may lose in a machine crash.
    durable_acked: u64,
    /// Messages not yet acknowledged, in sequence order.
    unacked: VecDeque<Pending>,
    /// Sequence number of the next message to write on the current connection.
    next_write: u64,
    /// Bytes of message `next_write` already written (the next packet starts there).
    write_offset: u64,
    /// Encoded bytes of the messages in `unacked`, for the byte window.
    unacked_bytes: usize,
    /// Bytes counted by every message ever handed over on this channel.
    pushed: u64,
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

/// Limits of one packet write.
pub(super) struct WriteLimits {
    /// Largest message the peer takes.
    pub(super) message_bytes_max: usize,
    /// Largest packet (message bytes in one frame).
    pub(super) packet_bytes_max: usize,
    /// Largest packet that ends its message: a little over `packet_bytes_max`, so a message
    /// just over the packet size is not cut into a full packet and a small tail (which the
    /// receiver would then have to gather into one buffer).
    pub(super) last_packet_bytes_max: usize,
}

impl Sender {
    pub(super) fn new(channel: u8) -> Self {
        Self {
            channel,
            next_send: 1,
            acked: 0,
            durable_acked: 0,
            unacked: VecDeque::new(),
            next_write: 1,
            write_offset: 0,
            unacked_bytes: 0,
            pushed: 0,
            backoff: 0,
        }
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

    /// The highest sequence number acknowledged for a message that was not volatile.
    pub(super) fn durable_acked(&self) -> u64 {
        self.durable_acked
    }

    /// Messages handed over but not yet (completely) written on the current connection.
    pub(super) fn unwritten(&self) -> usize {
        self.unacked.iter().filter(|p| p.sequence >= self.next_write).count()
    }

    /// Bytes handed over and not yet written on the current connection (as counted when
    /// handed over).
    pub(super) fn unwritten_bytes(&self) -> usize {
        self.get(self.next_write).map_or(0, |p| {
            let from = p.before + self.write_offset.min(p.counted as u64);
            usize::try_from(self.pushed.saturating_sub(from)).unwrap_or(usize::MAX)
        })
    }

    /// Whether a packet waits to be written.
    pub(super) fn has_unwritten(&self) -> bool {
        self.next_write < self.next_send
    }

    /// Assigns the next sequence number to `message`.
    pub(super) fn push(&mut self, message: Encoded, expires_at: Option<Instant>, now: Instant) -> u64 {
        let sequence = self.next_send;
        self.next_send += 1;
        let counted = message.len();
        self.unacked_bytes += counted;
        let before = self.pushed;
        self.pushed += counted as u64;
        self.unacked.push_back(Pending {
            sequence,
            counted,
            before,
            message,
            crc: None,
            expires_at,
            handed_at: now,
            written_at: None,
            naks: 0,
        });
        sequence
    }

    fn get(&self, sequence: u64) -> Option<&Pending> {
        let front = self.unacked.front()?.sequence;
        self.unacked.get(usize::try_from(sequence.checked_sub(front)?).ok()?)
    }

    fn get_mut(&mut self, sequence: u64) -> Option<&mut Pending> {
        let front = self.unacked.front()?.sequence;
        self.unacked.get_mut(usize::try_from(sequence.checked_sub(front)?).ok()?)
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
                if !done.message.is_empty() && !done.message.is_volatile() {
                    self.durable_acked = done.sequence;
                }
            }
            messages += 1;
        }
        self.acked = through;
        self.backoff = 0;
        if self.next_write <= through {
            self.next_write = through + 1;
            self.write_offset = 0;
        }
        Some(messages)
    }

    /// Takes up messages recorded durably before a restart, with their numbers (sorted);
    /// numbers between them (volatile messages lost with the restart) go as skips. Nothing
    /// is acknowledged yet: the peer's `Hello` says where it stands.
    pub(super) fn restore(&mut self, entries: Vec<(u64, Bytes, Option<Instant>)>, now: Instant) {
        self.unacked.clear();
        self.unacked_bytes = 0;
        let Some(first) = entries.first().map(|(s, _, _)| *s) else { return };
        self.next_send = first;
        self.acked = first - 1;
        self.next_write = first;
        self.write_offset = 0;
        for (sequence, message, expires_at) in entries {
            while self.next_send < sequence {
                self.push(Encoded::default(), None, now);
            }
            self.push(message.into(), expires_at, now);
        }
    }

    /// After a restore: the peer expects `expected`, before our first recorded message —
    /// the numbers between were volatile messages lost with the restart, so they go as
    /// skips. The same when the peer lost the receive numbers of volatile messages it had
    /// acknowledged (its machine crashed): they go again as skips.
    pub(super) fn skip_from(&mut self, expected: u64, now: Instant) {
        let first = self.unacked.front().map_or(self.next_send, |p| p.sequence);
        // At or below a persistent message it acknowledged, the peer went backwards: that
        // is for the handshake's check to refuse, not to paper over.
        if expected == 0 || expected >= first || expected <= self.durable_acked {
            return;
        }
        let before = self.unacked.front().map_or(self.pushed, |p| p.before);
        for sequence in (expected..first).rev() {
            self.unacked.push_front(Pending {
                sequence,
                counted: 0,
                before,
                message: Encoded::default(),
                crc: None,
                expires_at: None,
                handed_at: now,
                written_at: None,
                naks: 0,
            });
        }
        self.acked = expected - 1;
        self.durable_acked = self.durable_acked.min(self.acked);
    }

    /// After a restart: the peer had acknowledged everything through `through`, a message
    /// that was not volatile (recorded durably). Numbering goes on after it when nothing
    /// recorded waits.
    pub(super) fn restore_acked(&mut self, through: u64) {
        // Nothing waiting can be at or below an acknowledged number (a record left from
        // before a renumbering would say so).
        let through = self.unacked.front().map_or(through, |p| through.min(p.sequence - 1));
        self.durable_acked = self.durable_acked.max(through);
        if self.unacked.is_empty() && self.next_send <= through {
            self.next_send = through + 1;
            self.acked = through;
            self.next_write = through + 1;
            self.write_offset = 0;
        }
    }

    /// What waits for an acknowledgement: numbers, bytes (empty for a skip) and expiry.
    pub(super) fn awaiting(&self) -> impl Iterator<Item = (u64, &Encoded, Option<Instant>)> {
        self.unacked.iter().map(|p| (p.sequence, &p.message, p.expires_at))
    }

    /// The peer never saw this incarnation of ours: number what still waits from 1.
    pub(super) fn renumber(&mut self) {
        for (index, pending) in self.unacked.iter_mut().enumerate() {
            pending.sequence = index as u64 + 1;
        }
        self.next_send = self.unacked.len() as u64 + 1;
        self.acked = 0;
        self.durable_acked = 0;
    }

    /// The operator accepted the peer's numbers after they went backwards (its data was
    /// wiped or restored): what still waits is numbered from `expected`, the number the peer
    /// expects, and everything before it counts as acknowledged.
    pub(super) fn rebase(&mut self, expected: u64) {
        for (index, pending) in self.unacked.iter_mut().enumerate() {
            pending.sequence = expected + index as u64;
            pending.crc = None;
        }
        self.next_send = expected + self.unacked.len() as u64;
        self.acked = expected - 1;
        self.durable_acked = self.acked;
    }

    /// The operator accepted the peer's numbers after it claimed more than we remember
    /// sending (our data was restored from an old copy): every message still waiting was
    /// received by the peer (it expects beyond all of them), so they are complete, and
    /// numbering goes on from `expected`. Returns how many were completed.
    pub(super) fn jump(&mut self, expected: u64) -> usize {
        let done = self.unacked.len();
        // Only what we still hold is known to have been kept; the numbers beyond were
        // volatile messages sent after the last record.
        if let Some(last) =
            self.unacked.iter().rev().find(|p| !p.message.is_empty() && !p.message.is_volatile())
        {
            self.durable_acked = self.durable_acked.max(last.sequence);
        }
        self.unacked.clear();
        self.unacked_bytes = 0;
        self.next_send = expected;
        self.acked = expected - 1;
        self.next_write = expected;
        self.write_offset = 0;
        self.backoff = 0;
        done
    }

    /// A new connection writes from message `from` on, starting at byte `held_bytes` of it
    /// when the peer holds that many bytes of the same message (CRC `held_crc`) and its
    /// lifetime has not run out (else it starts over, and goes as a skip). Returns how many
    /// messages that resends and how many bytes the resume saved.
    pub(super) fn start_connection(
        &mut self,
        from: u64,
        held_bytes: u64,
        held_crc: u32,
        now: Instant,
    ) -> (usize, u64) {
        self.next_write = from;
        self.write_offset = 0;
        for pending in &mut self.unacked {
            pending.written_at = None;
        }
        let resumable = self.get(from).is_some_and(|p| {
            p.crc == Some(held_crc)
                && held_bytes < p.message.len() as u64
                && p.expires_at.is_none_or(|at| at > now)
        });
        if resumable && held_bytes > 0 {
            self.write_offset = held_bytes;
        }
        (self.unacked.iter().filter(|p| p.sequence >= from).count(), self.write_offset)
    }

    /// Writes the next packet at the cursor; returns its size in bytes on the wire, or
    /// `None` when nothing waits.
    pub(super) fn write_packet(
        &mut self,
        now: Instant,
        limits: &WriteLimits,
        out: &mut Chunks,
        events: &mut VecDeque<SessionEvent>,
    ) -> Option<usize> {
        let (channel, offset) = (self.channel, self.write_offset);
        let sequence = self.next_write;
        let pending = self.get_mut(sequence)?;
        if offset == 0 {
            start_message(pending, now, limits.message_bytes_max, events);
        }
        let total = pending.message.len();
        let start = usize::try_from(offset).unwrap_or(total).min(total);
        let end = if total - start <= limits.last_packet_bytes_max {
            total
        } else {
            start.saturating_add(limits.packet_bytes_max).min(total)
        };
        let crc = pending.crc.unwrap_or_default();
        let (offset, len) = (start as u64, end - start);
        let header = DataHeader { channel, sequence, offset, total: total as u64, crc, len };
        // The header is written; the bytes are shared (copied only when small).
        Frame::encode_data_header(&header, out.buf());
        pending.message.append_to(start, end, out);
        let written = DATA_OVERHEAD_BYTES + (end - start);
        if end == total {
            pending.written_at = Some(now);
            self.next_write = sequence + 1;
            self.write_offset = 0;
        } else {
            self.write_offset = end as u64;
        }
        Some(written)
    }

    /// The peer refused message `sequence` (its CRC failed): write it again, and the ones
    /// after it, which the peer held or dropped behind the gap (go-back-N).
    pub(super) fn nak(&mut self, sequence: u64) -> NakOutcome {
        if sequence > self.next_write || (sequence == self.next_write && self.write_offset == 0) {
            return NakOutcome::Ignored;
        }
        let Some(pending) = self.get_mut(sequence) else { return NakOutcome::Ignored };
        pending.naks += 1;
        if pending.naks > NAKS_PER_MESSAGE_MAX {
            return NakOutcome::TooMany;
        }
        self.next_write = sequence;
        self.write_offset = 0;
        NakOutcome::Rewound
    }

    /// When the oldest completely written message times out, if any.
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
        self.write_offset = 0;
        self.backoff = (self.backoff + 1).min(3);
        true
    }
}

/// A write of `pending` starts from its first byte: it goes with the lifetime it has left
/// (rewritten only when it waited), or as an empty skip when it expired or is too large for
/// the peer.
fn start_message(
    pending: &mut Pending,
    now: Instant,
    message_bytes_max: usize,
    events: &mut VecDeque<SessionEvent>,
) {
    let left = pending.expires_at.map(|at| at.saturating_duration_since(now).as_millis() as u64);
    let reason = match left {
        Some(0) => Some(DropReason::Expired),
        _ if pending.message.len() > message_bytes_max => Some(DropReason::TooLargeForPeer),
        _ => None,
    };
    if let Some(reason) = reason {
        let message = std::mem::take(&mut pending.message).to_bytes();
        events.push_back(SessionEvent::Dropped { message, reason });
        pending.expires_at = None;
    } else if let Some(ms) = left
        && now.saturating_duration_since(pending.handed_at) >= LIFETIME_PATCH_AFTER
    {
        // Only a message that waited gets its lifetime rewritten (its head copied).
        if let Some(patched) = pending.message.with_lifetime(ms) {
            pending.message = patched;
        }
        pending.crc = None;
    }
    if pending.crc.is_none() || pending.message.is_empty() {
        pending.crc = Some(pending.message.crc());
    }
}
