//! The shared side of a link: the transmission queue that puts fill and the link task
//! drains, the channel that hands it connections, and its counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use bytes::BytesMut;
use linkbus_plugin_api::{Connection, Message};
use linkbus_proto::SessionStats;
use linkbus_proto::frame::{CloseCode, Hello};
use linkbus_proto::secure::SecureChannel;
use tokio::sync::{Notify, mpsc};
use tracing::debug;

use super::io::refuse;
use super::transmit::TransmissionQueue;
use crate::config::PeerConfig;

/// Connections waiting for the link task; more are refused as busy.
const INCOMING_QUEUE_MAX: usize = 4;

/// A connection handed to a link: by the listener (with the peer's `Hello` already read) or
/// by the link's own dialer.
pub(crate) struct Incoming {
    /// The byte stream.
    pub(crate) connection: Connection,
    /// The peer's `Hello`, for accepted connections.
    pub(crate) hello: Option<Hello>,
    /// Plaintext read after the `Hello` (or after the handshake, when dialed).
    pub(crate) leftover: BytesMut,
    /// The established secure channel of the connection.
    pub(crate) secure: SecureChannel,
}

/// A priority class of the transmission queue for a peer is full.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("transmission queue is full ({0} messages of this priority)")]
pub struct TransmissionQueueFull(pub u64);

/// The shared side of one link; the link task holds the rest.
pub struct LinkHandle {
    /// The peer's configuration.
    pub peer: PeerConfig,
    /// Messages waiting for the peer, one bounded FIFO per priority class, with the time
    /// they were queued (for their lifetime).
    pub(crate) queue: Mutex<TransmissionQueue>,
    /// Limit of each class (`links.queue_messages_max`).
    queue_messages_max: u64,
    /// Notified when messages leave the queue, for puts waiting for room.
    pub(crate) room: Arc<Notify>,
    /// Wakes the link task: the queue gained a message, or the writer drained.
    pub(crate) wake: Notify,
    /// Connections for the link task; created here so none is lost before the task starts.
    incoming_tx: mpsc::Sender<Incoming>,
    /// The receiving end, taken once by the link task.
    pub(crate) incoming_rx: Mutex<Option<mpsc::Receiver<Incoming>>>,
    /// Whether the session is established.
    pub up: AtomicBool,
    /// Largest encoded message the peer takes, from its last hello (0: not known yet).
    pub peer_message_bytes_max: AtomicUsize,
    /// Sequence numbers acknowledged by the peer (skipped messages included).
    pub acked_total: AtomicU64,
    /// Messages received from the peer and delivered here.
    pub received_total: AtomicU64,
    /// The session's counters, copied after every pump.
    pub stats: Mutex<SessionStats>,
    /// Why the link is stopped until an operator resets it (the peer's sequence numbers
    /// went backwards), if it is.
    stopped: Mutex<Option<String>>,
    /// An operator asked for a reset; the link task applies it.
    pub(crate) reset_requested: AtomicBool,
}

impl std::fmt::Debug for LinkHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkHandle").field("peer", &self.peer.name).finish_non_exhaustive()
    }
}

impl LinkHandle {
    /// A handle with an empty transmission queue.
    pub fn new(peer: PeerConfig, queue_messages_max: u64, room: Arc<Notify>) -> Self {
        let (incoming_tx, incoming_rx) = mpsc::channel(INCOMING_QUEUE_MAX);
        Self {
            peer,
            queue: Mutex::new(TransmissionQueue::new(queue_messages_max)),
            queue_messages_max,
            room,
            wake: Notify::new(),
            incoming_tx,
            incoming_rx: Mutex::new(Some(incoming_rx)),
            up: AtomicBool::new(false),
            peer_message_bytes_max: AtomicUsize::new(0),
            acked_total: AtomicU64::new(0),
            received_total: AtomicU64::new(0),
            stats: Mutex::new(SessionStats::default()),
            stopped: Mutex::new(None),
            reset_requested: AtomicBool::new(false),
        }
    }

    /// Why the link is stopped, if it is.
    pub fn stopped(&self) -> Option<String> {
        self.stopped.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Stops the link until [`LinkHandle::request_reset`].
    pub(crate) fn stop(&self, reason: String) {
        *self.stopped.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason);
    }

    /// An operator's reset: the link restarts and its next handshake takes the peer's
    /// numbers as they are. Returns why the link was stopped, if it was.
    pub fn request_reset(&self) -> Option<String> {
        // The flag first: the link task checks it before taking any connection, so no
        // connection can slip in between without it.
        self.reset_requested.store(true, std::sync::atomic::Ordering::SeqCst);
        let was = self.stopped.lock().unwrap_or_else(PoisonError::into_inner).take();
        self.wake.notify_one();
        was
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, TransmissionQueue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `message`'s priority class has room for it now.
    pub fn has_room_for(&self, message: &Message) -> bool {
        self.lock().has_room_for(message)
    }

    /// Queues a message for the peer in its priority class.
    ///
    /// # Errors
    /// [`TransmissionQueueFull`] when that class holds `links.queue_messages_max`.
    pub fn enqueue(&self, message: Message, now: Instant) -> Result<(), TransmissionQueueFull> {
        if !self.lock().push(message, now) {
            return Err(TransmissionQueueFull(self.queue_messages_max));
        }
        self.wake.notify_one();
        Ok(())
    }

    /// Queues a message whose room [`LinkHandle::has_room_for`] confirmed (see
    /// `TransmissionQueue::push_checked`).
    pub fn enqueue_checked(&self, message: Message, now: Instant) {
        self.lock().push_checked(message, now);
        self.wake.notify_one();
    }

    /// Messages waiting for the peer (not yet handed to the session).
    pub fn queued(&self) -> usize {
        self.lock().len()
    }

    /// Hands an accepted connection to the link task, or refuses it when the task is busy.
    pub(crate) fn offer(&self, incoming: Incoming) {
        if let Err(e) = self.incoming_tx.try_send(incoming) {
            debug!(peer = %self.peer.name, "Link busy; incoming connection refused.");
            let incoming = match e {
                mpsc::error::TrySendError::Full(i) | mpsc::error::TrySendError::Closed(i) => i,
            };
            refuse(
                incoming.connection,
                Some(incoming.secure),
                CloseCode::Duplicate,
                "the link is busy with other connections",
            );
        }
    }
}
