//! What a link records in a durable store about its peer's numbers: the peer's incarnation
//! and, per channel, the next sequence number it expects (space `link.PEER`). A node that
//! restarts takes them up (`Session::restore_receiving`), so its `Hello` tells the peer to
//! resend from where it really stopped: nothing it delivered before the crash comes again,
//! nothing it did not comes never. (Its own sending starts afresh under a new incarnation:
//! messages waiting for a peer are not stored yet.)
//!
//! A persistent message's record and the number after it are written in one store batch,
//! before the link acknowledges it; the numbers of a whole batch of deliveries (volatile
//! messages, skips) follow in one write after them.

use bytes::Bytes;
use linkbus_plugin_api::{Batch, NodeName};
use linkbus_proto::Session;
use linkbus_proto::channel::CHANNELS;
use tracing::info;

use crate::node::NodeState;

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
    pub(super) fn load(node: &NodeState, peer: &NodeName, session: &mut Session) -> Self {
        let mut recorded =
            Self { space: format!("link.{peer}"), durable: node.store.durable(), peer_incarnation: None };
        if !recorded.durable {
            return recorded;
        }
        let read_u64 = |key: &[u8]| -> Option<u64> {
            let value = node.store.get(&recorded.space, key).ok()??;
            Some(u64::from_be_bytes(value.as_ref().try_into().ok()?))
        };
        let Some(incarnation) = read_u64(PEER_INCARNATION_KEY) else { return recorded };
        let expected: Vec<u64> =
            (0..CHANNELS as u8).map(|c| read_u64(&expected_key(c)).unwrap_or(1)).collect();
        session.restore_receiving(incarnation, &expected);
        info!(peer = %peer, ?expected, "Link numbers restored: the peer resends from there.");
        recorded.peer_incarnation = Some(incarnation);
        recorded
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
        node.committer.write(batch);
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

    /// Records the end of a batch of deliveries: per channel, the last number handed over.
    pub(super) fn batch_delivered(&self, node: &NodeState, through: &[Option<u64>]) {
        if !self.durable {
            return;
        }
        let mut batch = Batch::new();
        for (channel, through) in through.iter().enumerate() {
            if let Some(through) = through {
                batch.put(&self.space, expected_key(channel as u8), (through + 1).to_be_bytes().to_vec());
            }
        }
        node.committer.write(batch);
    }
}
