//! What a link records in a durable store about its peer's numbers: the peer's incarnation
//! and, per channel, the next sequence number it expects (space `link.PEER`). A node that
//! restarts takes them up (`Session::restore_receiving`), so its `Hello` tells the peer to
//! resend from where it really stopped: nothing it delivered before the crash comes again,
//! nothing it did not comes never. What it sends is recorded too (`SendRecord`, below).
//!
//! The number after a persistent message goes in the same store batch as all its copies
//! (local queues, dead letters, relayed copies: `Committer::hold` keeps them in one batch),
//! and with the last of them, so it is never ahead of a copy); a batch of deliveries with a
//! persistent message records the numbers of the whole batch (volatile messages, skips) in
//! one write, and the link acknowledges only after a sync covering all of it. A batch of
//! volatile messages and skips records nothing: a receiver that restarts behind numbers it
//! acknowledged for them gets those numbers again as skips (its peer knows they were
//! volatile, see `Session`), so only persistent messages' numbers must never lag.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use linkbus_plugin_api::{Batch, Message, NodeName, Store};
use linkbus_proto::Session;
use linkbus_proto::channel::CHANNELS;
use tracing::info;

use crate::node::NodeState;
use crate::storage::Committer;

const PEER_INCARNATION_KEY: &[u8] = b"peer_incarnation";

fn expected_key(channel: u8) -> Bytes {
    Bytes::copy_from_slice(&[b'i', b'n', channel])
}

/// See the module doc.
#[derive(Debug)]
pub(super) struct Recorded {
    space: String,
    /// Whether the store keeps anything (with the memory store nothing is written).
    durable: bool,
    /// The peer incarnation last written.
    peer_incarnation: Option<u64>,
}

impl Recorded {
    /// Reads what was recorded about `peer` and hands it to `session`.
    ///
    /// # Errors
    /// A record that cannot be read or is damaged: guessing could deliver twice or stop the
    /// link, so the node stops and says which.
    pub(super) fn load(node: &NodeState, peer: &NodeName, session: &mut Session) -> Result<Self, String> {
        let mut recorded =
            Self { space: format!("link.{peer}"), durable: node.store().durable(), peer_incarnation: None };
        if !recorded.durable {
            return Ok(recorded);
        }
        let space = recorded.space.clone();
        let read_u64 = |key: &[u8]| -> Result<Option<u64>, String> {
            let Some(value) = node.store().get(&space, key).map_err(|e| format!("{space}: {e}"))? else {
                return Ok(None);
            };
            let bytes: [u8; 8] = value.as_ref().try_into().map_err(|_| {
                format!("{space}: damaged record {:?} ({} bytes)", String::from_utf8_lossy(key), value.len())
            })?;
            Ok(Some(u64::from_be_bytes(bytes)))
        };
        let Some(incarnation) = read_u64(PEER_INCARNATION_KEY)? else { return Ok(recorded) };
        let expected = (0..CHANNELS as u8)
            .map(|c| read_u64(&expected_key(c)).map(|e| e.unwrap_or(1)))
            .collect::<Result<Vec<u64>, String>>()?;
        session.restore_receiving(incarnation, &expected);
        info!(peer = %peer, ?expected, "Link numbers restored: the peer resends from there.");
        recorded.peer_incarnation = Some(incarnation);
        Ok(recorded)
    }

    /// After a handshake: a new peer incarnation is recorded, with every channel starting
    /// again at 1 (the session restarted its receiving), before any delivery under it.
    pub(super) fn established(&mut self, node: &NodeState, session: &Session) {
        let Some(incarnation) = session.peer_incarnation().filter(|_| self.durable) else { return };
        if self.peer_incarnation == Some(incarnation) {
            return;
        }
        let mut batch = Batch::new();
        batch.put(&self.space, PEER_INCARNATION_KEY, incarnation.to_be_bytes().to_vec());
        for channel in 0..CHANNELS as u8 {
            batch.put(&self.space, expected_key(channel), 1u64.to_be_bytes().to_vec());
        }
        node.committer().write(batch);
        self.peer_incarnation = Some(incarnation);
    }

    /// The write recording that `sequence` on `channel` was delivered (empty when nothing
    /// is recorded).
    pub(super) fn delivered(&self, channel: u8, sequence: u64) -> Batch {
        let mut batch = Batch::new();
        if self.durable {
            batch.put(&self.space, expected_key(channel), (sequence + 1).to_be_bytes().to_vec());
        }
        batch
    }

    /// Records the end of a batch of deliveries with a persistent message: per channel, the
    /// last number handed over (to be synced before it is acknowledged).
    pub(super) fn batch_delivered(&self, node: &NodeState, through: &[Option<u64>]) {
        if !self.durable || through.iter().all(Option::is_none) {
            return;
        }
        let mut batch = Batch::new();
        for (channel, through) in through.iter().enumerate() {
            if let Some(through) = through {
                batch.put(&self.space, expected_key(channel as u8), (through + 1).to_be_bytes().to_vec());
            }
        }
        node.committer().write(batch);
    }
}

/// What a link records in a durable store about what it sends (space `send.PEER`): the
/// persistent messages in its transmission queue (`q` + key), those handed to the session
/// and not yet acknowledged, under their channel and number (`s` + channel + number), and
/// per channel the highest number acknowledged for a persistent message (`a` + channel).
/// After a restart (same incarnation) the node takes them up: the queue refills, the
/// session resends what the peer lacks under the same numbers (`restore_sending`), and a
/// peer expecting a number it had acknowledged for a persistent message is refused as gone
/// backwards (`restore_acknowledged`).
#[derive(Debug)]
pub(crate) struct SendRecord {
    space: String,
    committer: Arc<Committer>,
    next_key: AtomicU64,
}

fn queue_key(key: u64) -> Bytes {
    let mut k = Vec::with_capacity(9);
    k.push(b'q');
    k.extend_from_slice(&key.to_be_bytes());
    Bytes::from(k)
}

fn acked_key(channel: u8) -> Bytes {
    Bytes::copy_from_slice(&[b'a', channel])
}

fn sent_key(channel: u8, sequence: u64) -> Bytes {
    let mut k = Vec::with_capacity(10);
    k.extend_from_slice(&[b's', channel]);
    k.extend_from_slice(&sequence.to_be_bytes());
    Bytes::from(k)
}

/// What a link's send record held at start.
#[derive(Default)]
pub(crate) struct Recovered {
    /// Persistent messages that were in the transmission queue, in key order.
    pub(crate) queued: Vec<Stored>,
    /// Messages sent and not acknowledged, in key order.
    pub(crate) sent: Vec<Stored>,
    /// Per channel, the highest number acknowledged for a persistent message.
    pub(crate) acked: Vec<u64>,
}

/// A stored message: its record (enqueue time, message) and what it decodes to.
pub(crate) struct Stored {
    /// The store key's number part.
    pub(crate) number: u64,
    /// For sent messages, the channel.
    pub(crate) channel: u8,
    /// The message.
    pub(crate) message: Message,
    /// The encoded message as recorded.
    pub(crate) bytes: Bytes,
    /// How long ago it was recorded (by the wall clock).
    pub(crate) age: std::time::Duration,
}

impl SendRecord {
    /// The record of the link to `peer`.
    pub(crate) fn new(peer: &NodeName, committer: Arc<Committer>) -> Self {
        Self { space: format!("send.{peer}"), committer, next_key: AtomicU64::new(1) }
    }

    /// Records a persistent message entering the transmission queue; returns its key. Its
    /// payload becomes the record's last bytes (see `queue::encode_record_sharing`).
    pub(crate) fn queued(&self, message: &mut Message) -> u64 {
        self.queued_with(message, Batch::new())
    }

    /// Like [`SendRecord::queued`], in one store batch with `with`.
    pub(crate) fn queued_with(&self, message: &mut Message, mut with: Batch) -> u64 {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        with.put(&self.space, queue_key(key), crate::queue::encode_record_sharing(message));
        self.committer.write(with);
        key
    }

    /// A queued message left the queue without being sent (expired, too large).
    pub(crate) fn dropped(&self, key: u64) {
        let mut batch = Batch::new();
        batch.delete(&self.space, queue_key(key));
        self.committer.write(batch);
    }

    /// A queued message went to the session as `sequence` on `channel` (`bytes`: its wire
    /// form as sent).
    pub(crate) fn sent(&self, key: u64, channel: u8, sequence: u64, bytes: &linkbus_proto::wire::Encoded) {
        let mut batch = Batch::new();
        batch.delete(&self.space, queue_key(key));
        batch.put(&self.space, sent_key(channel, sequence), crate::queue::encode_record_of(bytes));
        self.committer.write(batch);
    }

    /// Messages `sequences` of `channel` were acknowledged (or renumbered away).
    pub(crate) fn forget(&self, channel: u8, sequences: impl IntoIterator<Item = u64>) {
        let mut batch = Batch::new();
        for sequence in sequences {
            batch.delete(&self.space, sent_key(channel, sequence));
        }
        self.committer.write(batch);
    }

    /// The peer acknowledged `through` on `channel` for a persistent message (or, after a
    /// renumbering, the highest such number is now `through`).
    pub(crate) fn acked(&self, channel: u8, through: u64) {
        let mut batch = Batch::new();
        batch.put(&self.space, acked_key(channel), through.to_be_bytes().to_vec());
        self.committer.write(batch);
    }

    /// Records, in one batch, that what waits on `channel` is now `current` (numbers and
    /// messages, after a renumbering), forgetting the numbers in `old` no longer used.
    pub(crate) fn rerecord(
        &self,
        channel: u8,
        old: impl IntoIterator<Item = u64>,
        current: &[(u64, Message)],
    ) {
        let mut batch = Batch::new();
        for sequence in old {
            if !current.iter().any(|(s, _)| *s == sequence) {
                batch.delete(&self.space, sent_key(channel, sequence));
            }
        }
        for (sequence, message) in current {
            batch.put(&self.space, sent_key(channel, *sequence), crate::queue::encode_record(message));
        }
        self.committer.write(batch);
    }

    /// Everything recorded: queued messages (channel 0) and sent ones, each in key order,
    /// and the acknowledged numbers.
    ///
    /// # Errors
    /// An unreadable or damaged record, named.
    pub(crate) fn load(&self, store: &dyn Store) -> Result<Recovered, String> {
        let now_unix = crate::clock::unix_ms();
        let mut recovered = Recovered { acked: vec![0; CHANNELS], ..Recovered::default() };
        for entry in linkbus_plugin_api::store::scan_pages(store, &self.space) {
            let (key, value) = entry.map_err(|e| format!("{}: {e}", self.space))?;
            let damaged = || format!("{}: damaged record at key {:02x?}", self.space, &key[..]);
            if let (Some(b'a'), 2) = (key.first(), key.len()) {
                let through: [u8; 8] = value.as_ref().try_into().map_err(|_| damaged())?;
                if let Some(slot) = recovered.acked.get_mut(key[1] as usize) {
                    *slot = u64::from_be_bytes(through);
                }
                continue;
            }
            let (message, at) =
                crate::queue::decode_record(value).map_err(|e| format!("{}: {e}", damaged()))?;
            let bytes = linkbus_proto::wire::message_bytes(&message);
            let age = std::time::Duration::from_millis(now_unix.saturating_sub(at));
            match (key.first(), key.len()) {
                (Some(b'q'), 9) => {
                    let number = u64::from_be_bytes(key[1..9].try_into().map_err(|_| damaged())?);
                    recovered.queued.push(Stored { number, channel: 0, message, bytes, age });
                }
                (Some(b's'), 10) => {
                    let number = u64::from_be_bytes(key[2..10].try_into().map_err(|_| damaged())?);
                    recovered.sent.push(Stored { number, channel: key[1], message, bytes, age });
                }
                _ => return Err(damaged()),
            }
        }
        let next = recovered.queued.iter().map(|s| s.number).max().unwrap_or(0) + 1;
        self.next_key.store(next, Ordering::Relaxed);
        Ok(recovered)
    }
}
