//! The scheduler: which channel the next packet comes from, so channels share the connection
//! by their weights and the system channel goes first.

use std::time::Instant;

#[cfg(doc)]
use super::SessionEvent;
use super::send::WriteLimits;
use super::{Lane, Phase, RECENT_HALF_LIFE, Session};
use crate::channel::{FILE_CHANNEL, SYSTEM_CHANNEL};

impl Session {
    /// Writes waiting packets until about `budget` bytes are written (at least one packet
    /// when the budget is not zero). Each packet comes from the system channel when it has
    /// one waiting, else from the channel that wrote the fewest bytes recently for its
    /// weight; within a channel, messages go in sequence order (first those to resend after
    /// a reconnect or a retransmit timeout, then new ones). A message whose write starts
    /// after it waited carries the lifetime it has left; one that expired, or that is larger
    /// than the peer accepts, goes as an empty skip message and is reported as
    /// [`SessionEvent::Dropped`]. Returns how many packets were written.
    pub fn write_pending(&mut self, now: Instant, budget: usize) -> usize {
        if self.phase != Phase::Established || budget == 0 {
            return 0;
        }
        self.decay_recent(now);
        let (packet_bytes_max, last_packet_bytes_max) = self.packet_bytes_max();
        let limits = WriteLimits {
            message_bytes_max: self.message_bytes_max(),
            packet_bytes_max,
            last_packet_bytes_max,
        };
        let (mut written, mut packets) = (0, 0);
        while written < budget {
            let Some(channel) = self.next_channel() else { break };
            let Some(lane) = self.lanes.get_mut(channel) else { break };
            let Some(bytes) = lane.sender.write_packet(now, &limits, &mut self.transmit, &mut self.events)
            else {
                break;
            };
            lane.recent = lane.recent.saturating_add(bytes as u64);
            written += bytes;
            packets += 1;
        }
        packets
    }

    /// The channel to write the next packet from: see [`Session::write_pending`].
    fn next_channel(&self) -> Option<usize> {
        let weights = &self.config.channel_weights;
        let waiting = |(_, lane): &(usize, &Lane)| lane.sender.has_unwritten();
        // Preference order for ties: the system channel, then the levels from the highest,
        // then files.
        let order = std::iter::once(SYSTEM_CHANNEL as usize)
            .chain((1..FILE_CHANNEL as usize).rev())
            .chain(std::iter::once(FILE_CHANNEL as usize));
        let mut candidates = order.filter_map(|c| self.lanes.get(c).map(|lane| (c, lane))).filter(waiting);
        let first = candidates.next()?;
        if first.0 == SYSTEM_CHANNEL as usize {
            return Some(first.0);
        }
        // Fewest recent bytes per unit of weight: compare recent_a / w_a with recent_b / w_b.
        let cost = |(channel, lane): &(usize, &Lane)| {
            let weight = u128::from(weights.get(*channel).copied().unwrap_or(1).max(1));
            (u128::from(lane.recent), weight)
        };
        let best = candidates.fold(first, |best, next| {
            let ((rb, wb), (rn, wn)) = (cost(&best), cost(&next));
            if rn * wb < rb * wn { next } else { best }
        });
        Some(best.0)
    }

    /// Halves every channel's recent bytes once per [`RECENT_HALF_LIFE`] gone by.
    fn decay_recent(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.recent_decayed_at);
        let halvings = (elapsed.as_nanos() / RECENT_HALF_LIFE.as_nanos()).min(64) as u32;
        if halvings == 0 {
            return;
        }
        for lane in &mut self.lanes {
            lane.recent = lane.recent.checked_shr(halvings).unwrap_or(0);
        }
        self.recent_decayed_at += RECENT_HALF_LIFE * halvings;
        if halvings == 64 {
            self.recent_decayed_at = now;
        }
    }
}
