//! The receiving half of one channel of a session: the next number to deliver, what was
//! handed to the host, the message being assembled from packets (kept across connections,
//! so a large message resumes where it broke off), and the bounded reorder buffer for
//! messages that arrive ahead of a gap.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use linkbus_plugin_api::Message;

use crate::frame::ChannelPosition;
use crate::reader::ReadError;
use crate::recycle::Recycler;
use crate::wire::decode_message;

/// What became of an arriving packet.
#[derive(Debug)]
pub(super) enum PacketOutcome {
    /// Part of the next message, kept until the rest arrives.
    Partial,
    /// A whole message is here (its CRC not yet checked).
    Complete {
        /// The message.
        message: Bytes,
        /// The CRC-32C of an assembled message's bytes, counted as its packets came (while
        /// they were in the cache); `None` for a message that came in one packet.
        crc: Option<u32>,
        /// When its first packet arrived: its lifetime was counted from then.
        first: Instant,
    },
    /// A packet of a message already handed over; `last` when it ends that message.
    Duplicate {
        /// The packet ends its message (acknowledge again).
        last: bool,
    },
    /// Not usable now (ahead of the next message, or after a gap inside it): the sender
    /// writes it again. `last` when it ends its message.
    Dropped {
        /// The packet ends its message.
        last: bool,
    },
}

/// What the host gets for a sequence number delivered in order.
#[derive(Debug)]
pub(super) enum Delivery {
    /// A message, its lifetime counted down to now.
    Message(Message),
    /// A skip: the sender dropped the message in transit (`durable: false`), or an event
    /// message expired on the way (`durable`: it was not volatile).
    Skip {
        /// A message that was not volatile stood behind the number.
        durable: bool,
    },
    /// The message's lifetime ran out on the way (while its packets arrived, or while it
    /// waited behind a gap); it is not handed over.
    Expired {
        /// The message.
        id: linkbus_plugin_api::MessageId,
        /// It was not volatile.
        durable: bool,
    },
}

/// A message (`None`: a skip) whose lifetime was counted when its first packet arrived at
/// `first`: what to hand over at `now`.
fn release(message: Option<Message>, first: Instant, now: Instant) -> Delivery {
    let Some(mut message) = message else { return Delivery::Skip { durable: false } };
    let durable = message.content.reliability != linkbus_plugin_api::Reliability::Volatile;
    let ms = now.saturating_duration_since(first).as_millis() as u64;
    match message.content.lifetime {
        Some(lifetime) if ms > 0 && !lifetime.is_unlimited() => match lifetime.after(ms) {
            Some(left) => {
                message.content.lifetime = Some(left);
                Delivery::Message(message)
            }
            // An expired event message goes quietly (no event about an event).
            None if message.content.kind == linkbus_plugin_api::Kind::Event => Delivery::Skip { durable },
            None => Delivery::Expired { id: message.id, durable },
        },
        _ => Delivery::Message(message),
    }
}

/// Room left in the link's reorder buffers (one budget shared by all channels).
#[derive(Debug, Clone, Copy)]
pub(super) struct HeldRoom {
    pub(super) messages: usize,
    pub(super) bytes: usize,
}

/// One packet of a message, as the session hands it over.
#[derive(Debug)]
pub(super) struct PacketIn {
    pub(super) sequence: u64,
    pub(super) offset: u64,
    pub(super) total: u64,
    pub(super) crc: u32,
    pub(super) bytes: Bytes,
}

/// Most room reserved for a message before its bytes arrive (beyond it, the buffer grows
/// as they do).
const ASSEMBLY_RESERVE_BYTES_MAX: usize = 4 << 20;

/// The next message, assembled from its packets.
#[derive(Debug)]
struct Assembly {
    sequence: u64,
    total: u64,
    crc: u32,
    /// Its bytes so far, in a buffer with room for all of them (up to a bound).
    bytes: Vec<u8>,
    /// The CRC-32C of `bytes`.
    bytes_crc: u32,
    /// When its first packet arrived (the lifetime it carries was counted from then).
    started: Instant,
}

/// What became of an arriving message.
#[derive(Debug)]
pub(super) enum Arrival {
    /// Already handed to the host: acknowledge again, drop the copy.
    Duplicate,
    /// Held in the reorder buffer until the gap fills.
    Held,
    /// Ahead of a gap that the reorder buffer cannot bridge: dropped, the sender resends it.
    Dropped,
    /// Handed over in order; the held messages it unblocked follow from
    /// [`Receiver::next_unblocked`].
    Delivered(u64, Delivery),
}

/// See the module doc.
#[derive(Debug)]
pub(super) struct Receiver {
    /// Next sequence number to deliver durably; advertised in `Hello`.
    expected: u64,
    /// Highest sequence number handed to the host on this connection (it may not be stored
    /// yet); reset to `expected - 1` with every connection.
    received_through: u64,
    /// Messages that arrived ahead of a gap (`None`: a skip), with their encoded size and
    /// when their first packet arrived.
    held: BTreeMap<u64, (Option<Message>, usize, Instant)>,
    /// Farthest ahead of the gap a held message may be (the link's reorder limit).
    held_max: usize,
    /// Encoded bytes of the held messages.
    held_bytes: usize,
    /// Test-only negative control: hand duplicates over as if they were new.
    skip_dedup: bool,
    /// The message after `received_through`, while its packets arrive.
    assembly: Option<Assembly>,
    /// Where a large message is gathered.
    recycler: Arc<Recycler>,
}

impl Receiver {
    pub(super) fn new(held_max: usize, recycler: Arc<Recycler>) -> Self {
        Self {
            recycler,
            expected: 1,
            received_through: 0,
            held: BTreeMap::new(),
            held_max,
            held_bytes: 0,
            skip_dedup: false,
            assembly: None,
        }
    }

    /// Where this channel stands, for our `Hello`: the next number and the bytes held of
    /// that message.
    pub(super) fn position(&self) -> ChannelPosition {
        let held = self.assembly.as_ref().filter(|a| a.sequence == self.expected);
        ChannelPosition {
            expected: self.expected,
            held_bytes: held.map_or(0, |a| a.bytes.len() as u64),
            held_crc: held.map_or(0, |a| a.crc),
        }
    }

    /// Bytes held in the message being assembled.
    pub(super) fn assembling(&self) -> usize {
        self.assembly.as_ref().map_or(0, |a| a.bytes.len())
    }

    /// Takes one packet. A message in one packet is complete at once; a longer one is
    /// assembled only when it is the next to deliver (packets of a message arrive in order,
    /// so what does not continue the assembly is dropped and comes again).
    pub(super) fn packet(&mut self, p: PacketIn, now: Instant) -> PacketOutcome {
        let end = p.offset.saturating_add(p.bytes.len() as u64);
        let last = end == p.total;
        if p.offset == 0 && last {
            return PacketOutcome::Complete { message: p.bytes, crc: None, first: now };
        }
        if p.sequence <= self.received_through || self.held.contains_key(&p.sequence) {
            return PacketOutcome::Duplicate { last };
        }
        if p.sequence != self.received_through + 1 || end > p.total {
            return PacketOutcome::Dropped { last };
        }
        let same = |a: &Assembly| a.sequence == p.sequence && a.total == p.total && a.crc == p.crc;
        if !self.assembly.as_ref().is_some_and(same) {
            if p.offset != 0 {
                return PacketOutcome::Dropped { last };
            }
            // A new message, or the sender's bytes changed (it started over): begin afresh,
            // with room for all of it up to a bound (the peer names `total` before sending
            // the bytes), so most messages are copied once, not again at each growth.
            let room = usize::try_from(p.total).unwrap_or(usize::MAX).min(ASSEMBLY_RESERVE_BYTES_MAX);
            self.assembly = Some(Assembly {
                sequence: p.sequence,
                total: p.total,
                crc: p.crc,
                bytes: self.recycler.buffer(room),
                bytes_crc: 0,
                started: now,
            });
        }
        let Some(assembly) = self.assembly.as_mut() else { return PacketOutcome::Dropped { last } };
        let have = assembly.bytes.len() as u64;
        if p.offset > have {
            return PacketOutcome::Dropped { last };
        }
        if end > have {
            let from = usize::try_from(have - p.offset).unwrap_or(usize::MAX);
            let new = p.bytes.get(from..).unwrap_or_default();
            assembly.bytes_crc = crate::crc::crc32c_append(assembly.bytes_crc, new);
            assembly.bytes.extend_from_slice(new);
        }
        if (assembly.bytes.len() as u64) < assembly.total {
            return PacketOutcome::Partial;
        }
        let recycler = &self.recycler;
        self.assembly.take().map_or(PacketOutcome::Partial, |a| PacketOutcome::Complete {
            first: a.started,
            crc: Some(a.bytes_crc),
            message: recycler.freeze(a.bytes),
        })
    }

    /// Turns on the test-only mode that skips duplicate detection.
    #[cfg(feature = "fault-injection")]
    pub(super) fn set_skip_dedup(&mut self, on: bool) {
        self.skip_dedup = on;
    }

    /// The next sequence number to deliver durably.
    pub(super) fn expected(&self) -> u64 {
        self.expected
    }

    /// Messages held in the reorder buffer.
    pub(super) fn held(&self) -> usize {
        self.held.len()
    }

    /// Encoded bytes held in the reorder buffer.
    pub(super) fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Whether message `sequence` is still wanted (not yet received or held).
    pub(super) fn wants(&self, sequence: u64) -> bool {
        sequence > self.received_through && !self.held.contains_key(&sequence)
    }

    /// A new connection: what was handed over but not confirmed comes again.
    pub(super) fn reset_connection(&mut self) {
        self.received_through = self.expected - 1;
        self.held.clear();
        self.held_bytes = 0;
        // Bytes of the next message stay, so its sender resumes after them.
        if self.assembly.as_ref().is_some_and(|a| a.sequence != self.expected) {
            self.assembly = None;
        }
    }

    /// Takes up a durably recorded position: messages before `expected` were delivered
    /// (before a restart of this node).
    pub(super) fn restore(&mut self, expected: u64) {
        self.restart();
        self.expected = expected.max(1);
        self.received_through = self.expected - 1;
    }

    /// The peer lost its state: its numbers start again at 1.
    pub(super) fn restart(&mut self) {
        self.expected = 1;
        self.received_through = 0;
        self.held.clear();
        self.held_bytes = 0;
        self.assembly = None;
    }

    /// Takes message `sequence` (empty bytes: a skip), whose CRC was checked.
    ///
    /// # Errors
    /// [`ReadError`] when the bytes do not decode as a message.
    pub(super) fn arrive(
        &mut self,
        sequence: u64,
        message: Bytes,
        first: Instant,
        now: Instant,
        room: HeldRoom,
    ) -> Result<Arrival, ReadError> {
        if self.assembly.as_ref().is_some_and(|a| a.sequence == sequence) {
            // The message came whole in one packet after all (a skip, or a fresh start).
            self.assembly = None;
        }
        if self.skip_dedup && sequence <= self.received_through && !message.is_empty() {
            // The broken mode the fault tests must catch: a copy goes to the host again.
            return Ok(Arrival::Delivered(sequence, Delivery::Message(decode_message(message)?)));
        }
        if sequence <= self.received_through || self.held.contains_key(&sequence) {
            return Ok(Arrival::Duplicate);
        }
        let size = message.len();
        // Kept from here on: a short message is in a buffer of its own already (the frame
        // decoder copies it out of the read chunk), and so is an assembled one; only a long
        // message that came in one packet shares the chunk.
        let held = if message.is_empty() { None } else { Some(decode_message(message)?) };
        if sequence != self.received_through + 1 {
            let ahead = sequence - self.received_through;
            let full = room.messages == 0 || size > room.bytes;
            if ahead > self.held_max as u64 || full {
                return Ok(Arrival::Dropped);
            }
            self.held.insert(sequence, (held, size, first));
            self.held_bytes += size;
            return Ok(Arrival::Held);
        }
        self.received_through = sequence;
        Ok(Arrival::Delivered(sequence, release(held, first, now)))
    }

    /// The next held message in order, now that the gap before it is filled (after
    /// [`Arrival::Delivered`], until `None`).
    pub(super) fn next_unblocked(&mut self, now: Instant) -> Option<(u64, Delivery)> {
        let (held, size, first) = self.held.remove(&(self.received_through + 1))?;
        self.received_through += 1;
        self.held_bytes -= size;
        Some((self.received_through, release(held, first, now)))
    }

    /// The host stored everything up to `through`: returns whether that moved `expected`
    /// (and an acknowledgement is due).
    pub(super) fn delivered(&mut self, through: u64) -> bool {
        if through < self.expected || through > self.received_through {
            return false;
        }
        self.expected = through + 1;
        true
    }
}
