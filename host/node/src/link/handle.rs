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

/// The shared side of one link; the link task holds the rest.
pub struct LinkHandle {
    /// The peer's configuration.
    pub peer: PeerConfig,
    /// Most messages one class of the transmission queue holds (fixed; read without the
    /// queue's lock).
    class_messages_max: u64,
    /// The durable record of what the link sends (with a durable store).
    pub(crate) record: Option<super::state::SendRecord>,
    /// Messages recorded as sent before a restart, for the link task to hand its session.
    pub(crate) restored_sent: Mutex<super::state::Recovered>,
    /// Messages waiting for the peer, one bounded FIFO per priority class, with the time
    /// they were queued (for their lifetime).
    pub(crate) queue: Mutex<TransmissionQueue>,
    /// Set while a message that can expire may wait in `queue` (the link task sweeps
    /// expired messages out only then).
    pub(crate) expiring: Arc<std::sync::atomic::AtomicBool>,
    /// Notified when messages leave the queue, for puts waiting for room.
    pub(crate) room: Arc<Notify>,
    /// Wakes the link task: the queue gained a message, or a reset was requested.
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
    /// Whether the link is stopped until an operator resets it (the two ends' sequence
    /// numbers do not fit: one end's data was wiped or restored from an old copy).
    stop: Mutex<StopState>,
    /// Since when the link is down and why its last attempt failed, for `linkbus status`
    /// (a wrong key shows there, not only in the log).
    health: Mutex<Health>,
}

/// Since when a link is down, and its last error; wall-clock milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    /// When the link went down (or the node started, for a link never up); `None` while up.
    pub down_since_ms: Option<u64>,
    /// The last error of a connection or attempt, while the link is down.
    pub last_error: Option<LastError>,
}

/// A link's last error, and how often it repeated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastError {
    /// What failed, with the configuration key to check where one is known.
    pub reason: String,
    /// When this reason was first seen in a row.
    pub first_ms: u64,
    /// When it was last seen.
    pub last_ms: u64,
    /// How many times in a row.
    pub count: u64,
}

/// See [`LinkHandle::stop`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum StopState {
    Running,
    /// Stopped, and why.
    Stopped(String),
    /// An operator reset a stopped link; the link task has not taken it up yet.
    ResetRequested,
}

/// What the link task must do with a connection, given the stop state.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Go on as always.
    Open,
    /// Go on, and take the peer's numbers in this handshake (the operator reset the link).
    Reset,
    /// Refuse it: the link is stopped, for this reason.
    Stopped(String),
}

impl std::fmt::Debug for LinkHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkHandle").field("peer", &self.peer.name).finish_non_exhaustive()
    }
}

impl LinkHandle {
    /// A handle with an empty transmission queue.
    pub fn new(
        peer: PeerConfig,
        (queue_messages_max, queue_bytes_max): (u64, u64),
        forward_share: u8,
        room: Arc<Notify>,
        committer: Option<Arc<crate::storage::Committer>>,
    ) -> Self {
        let (incoming_tx, incoming_rx) = mpsc::channel(INCOMING_QUEUE_MAX);
        let queue = TransmissionQueue::new(queue_messages_max, queue_bytes_max, forward_share);
        Self {
            record: committer.map(|c| super::state::SendRecord::new(&peer.name, c)),
            restored_sent: Mutex::new(super::state::Recovered::default()),
            peer,
            class_messages_max: queue_messages_max,
            expiring: queue.expiring(),
            queue: Mutex::new(queue),
            room,
            wake: Notify::new(),
            incoming_tx,
            incoming_rx: Mutex::new(Some(incoming_rx)),
            up: AtomicBool::new(false),
            peer_message_bytes_max: AtomicUsize::new(0),
            acked_total: AtomicU64::new(0),
            received_total: AtomicU64::new(0),
            stats: Mutex::new(SessionStats::default()),
            stop: Mutex::new(StopState::Running),
            health: Mutex::new(Health { down_since_ms: Some(crate::clock::unix_ms()), last_error: None }),
        }
    }

    fn health_state(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Since when the link is down, and its last error.
    pub fn health(&self) -> Health {
        self.health_state().clone()
    }

    /// Records why a connection or an attempt failed.
    pub(crate) fn note_error(&self, reason: &str) {
        let now = crate::clock::unix_ms();
        let mut health = self.health_state();
        match &mut health.last_error {
            Some(last) if last.reason == reason => {
                last.last_ms = now;
                last.count += 1;
            }
            slot => {
                *slot = Some(LastError { reason: reason.to_owned(), first_ms: now, last_ms: now, count: 1 })
            }
        }
    }

    /// The link is up: the last error is history.
    pub(crate) fn note_up(&self) {
        *self.health_state() = Health::default();
    }

    /// The link went down.
    pub(crate) fn note_down(&self) {
        let mut health = self.health_state();
        if health.down_since_ms.is_none() {
            health.down_since_ms = Some(crate::clock::unix_ms());
        }
    }

    fn stop_state(&self) -> std::sync::MutexGuard<'_, StopState> {
        self.stop.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why the link is stopped, if it is.
    pub fn stopped(&self) -> Option<String> {
        match &*self.stop_state() {
            StopState::Stopped(reason) => Some(reason.clone()),
            _ => None,
        }
    }

    /// Stops the link until [`LinkHandle::request_reset`].
    pub(crate) fn stop(&self, reason: String) {
        *self.stop_state() = StopState::Stopped(reason);
    }

    /// An operator's reset of a stopped link: the link restarts and its next handshake
    /// takes the peer's numbers. Returns why the link was stopped, or `None` (and changes
    /// nothing) when it was not.
    pub fn request_reset(&self) -> Option<String> {
        let mut state = self.stop_state();
        let StopState::Stopped(reason) = &*state else { return None };
        let reason = reason.clone();
        *state = StopState::ResetRequested;
        drop(state);
        self.wake.notify_one();
        Some(reason)
    }

    /// Decides, in one step, what to do with the next connection (or dial): a requested
    /// reset is taken up here, so no connection slips in between a reset and its effect.
    pub(crate) fn gate(&self) -> Gate {
        let mut state = self.stop_state();
        match &*state {
            StopState::Running => Gate::Open,
            StopState::Stopped(reason) => Gate::Stopped(reason.clone()),
            StopState::ResetRequested => {
                *state = StopState::Running;
                Gate::Reset
            }
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, TransmissionQueue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `message`'s priority class has room for `count` messages of `bytes` bytes
    /// (encoded) in all now.
    pub fn has_room_for_many(&self, message: &Message, count: usize, bytes: u64) -> bool {
        self.lock().has_room_for_many(message, count, bytes)
    }

    /// Whether `message`'s priority class has room for `count` messages of `bytes` bytes
    /// (as [`LinkHandle::has_room_for_many`]), and, with `pace` (bytes, recently), whether
    /// the link is ahead: established, it took a message within `recently`, and the class
    /// holds at least that many bytes of this node's own messages, so a put there had
    /// better wait for the link to take some (relayed messages, which no put can hold back,
    /// take turns with them and do not count). The queue's lock is taken once for both.
    pub fn room_and_pace(
        &self,
        message: &Message,
        (count, bytes): (usize, u64),
        pace: Option<(u64, std::time::Duration)>,
    ) -> (bool, bool) {
        let up = self.up.load(std::sync::atomic::Ordering::Relaxed);
        let queue = self.lock();
        let room = queue.has_room_for_many(message, count, bytes);
        let ahead =
            pace.is_some_and(|(ahead_bytes, recently)| up && queue.is_ahead(message, ahead_bytes, recently));
        (room, ahead)
    }

    /// Whether the link is ahead, as [`LinkHandle::room_and_pace`] says.
    #[cfg(test)]
    pub fn is_ahead(&self, message: &Message, bytes: u64, recently: std::time::Duration) -> bool {
        self.up.load(std::sync::atomic::Ordering::Relaxed) && self.lock().is_ahead(message, bytes, recently)
    }

    /// How full `message`'s priority class is: messages and bytes waiting, and the bounds.
    pub fn fill(&self, message: &Message) -> String {
        self.lock().fill(message).to_string()
    }

    /// Most messages one class of the transmission queue holds.
    pub fn class_messages_max(&self) -> u64 {
        self.class_messages_max
    }

    /// Whether two messages wait in the same class of a transmission queue.
    pub fn same_class(a: &Message, b: &Message) -> bool {
        TransmissionQueue::class_of(a) == TransmissionQueue::class_of(b)
    }

    /// A persistent message entering the queue is recorded (under the queue's lock, so the
    /// store sees the queue's order).
    fn record_queued(&self, message: &mut Message) -> Option<u64> {
        let record = self.record.as_ref()?;
        (message.content.reliability == linkbus_plugin_api::Reliability::Persistent)
            .then(|| record.queued(message))
    }

    /// Queues a message whose room [`LinkHandle::has_room_for_many`] confirmed (see
    /// `TransmissionQueue::push_checked`).
    pub fn enqueue_checked(&self, message: Message, now: Instant) {
        self.enqueue_checked_run(std::iter::once(message), now);
    }

    /// Queues messages whose room was confirmed together, in order, under one hold of the
    /// queue's lock.
    pub fn enqueue_checked_run(&self, messages: impl IntoIterator<Item = Message>, now: Instant) {
        let mut queue = self.lock();
        for mut message in messages {
            let key = self.record_queued(&mut message);
            queue.push_checked(message, now, key);
        }
        drop(queue);
        self.wake.notify_one();
    }

    /// Queues a message that this node does not record, persistent or not: a file's chunk
    /// at its origin, whose file is its record (after a restart the transfer asks its
    /// recipient where to go on; the link fills the numbers it lost with skips).
    pub fn enqueue_unrecorded(&self, message: Message, now: Instant) {
        self.lock().push_checked(message, now, None);
        self.wake.notify_one();
    }

    /// Queues a message relayed from another link, with `with` (the inbound link's record)
    /// in the same store batch as its own record when it is persistent. Returns `with` when
    /// it was not written (nothing recorded here): the caller writes it.
    pub fn enqueue_with(
        &self,
        mut message: Message,
        now: Instant,
        with: linkbus_plugin_api::Batch,
    ) -> Option<linkbus_plugin_api::Batch> {
        let mut queue = self.lock();
        let persistent = message.content.reliability == linkbus_plugin_api::Reliability::Persistent;
        let (key, unused) = match self.record.as_ref().filter(|_| persistent) {
            Some(record) => (Some(record.queued_with(&mut message, with)), None),
            None => (None, Some(with)),
        };
        queue.push_checked(message, now, key);
        drop(queue);
        self.wake.notify_one();
        unused
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

#[cfg(test)]
mod tests {
    use super::*;
    use linkbus_plugin_api::{Content, MessageId, NodeName};
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    fn handle() -> LinkHandle {
        let peer = PeerConfig {
            name: NodeName::new("B").unwrap(),
            address: None,
            permanent: true,
            public_key: None,
        };
        LinkHandle::new(peer, (1000, 1 << 30), 50, Arc::new(Notify::new()), None)
    }

    fn message(bytes: usize) -> Message {
        Message {
            encoding: Default::default(),
            id: MessageId { source: NodeName::new("A").unwrap(), sequence: 1, created_unix_ms: 0 },
            hop_count: 0,
            redelivered: false,
            backout_count: 0,
            content: Box::new(Content::buf("B:q".parse().unwrap(), vec![0u8; bytes])),
        }
    }

    /// [`LinkHandle::is_ahead`], checked against what [`LinkHandle::room_and_pace`] says
    /// under one taking of the lock (and that without pacing nothing is ahead).
    fn ahead(link: &LinkHandle, m: &Message, bytes: u64, recently: Duration) -> bool {
        let ahead = link.is_ahead(m, bytes, recently);
        let room = link.has_room_for_many(m, 1, 1000);
        assert_eq!(link.room_and_pace(m, (1, 1000), Some((bytes, recently))), (room, ahead));
        assert_eq!(link.room_and_pace(m, (1, 1000), None), (room, false));
        ahead
    }

    #[test]
    fn a_put_is_held_back_only_while_the_link_is_up_taking_and_deep() {
        const RECENTLY: Duration = Duration::from_secs(1);
        let link = handle();
        let m = message(1000);
        let now = Instant::now();
        for _ in 0..10 {
            link.enqueue_checked(m.clone(), now);
        }
        let deep = 5 * 1000;
        assert!(!ahead(&link, &m, deep, RECENTLY), "down");
        link.up.store(true, Ordering::Relaxed);
        assert!(!ahead(&link, &m, deep, RECENTLY), "up, but it never took anything");
        link.lock().mark_taken(now);
        assert!(ahead(&link, &m, deep, RECENTLY), "up, taking, and deeper than the bound");
        assert!(!ahead(&link, &m, 100 * 1000, RECENTLY), "not that deep");
        assert!(!ahead(&link, &m, deep, Duration::ZERO), "it took nothing lately");
        let urgent = Message {
            encoding: Default::default(),
            content: Box::new(
                m.content.clone().with_priority(linkbus_plugin_api::Priority::level(9).unwrap()),
            ),
            ..m.clone()
        };
        assert!(!ahead(&link, &urgent, deep, RECENTLY), "another class holds nothing");
        link.up.store(false, Ordering::Relaxed);
        assert!(!ahead(&link, &m, deep, RECENTLY), "down again");
    }

    #[test]
    fn a_recorded_message_waits_with_its_payload_in_its_record() {
        use linkbus_plugin_api::{Reliability, Store};
        let store: Arc<dyn Store> = Arc::new(linkbus_store_memory::MemoryStore::new());
        let committer = Arc::new(crate::storage::Committer::direct(store.clone()));
        let peer = handle().peer;
        let link = LinkHandle::new(peer, (1000, 1 << 30), 50, Arc::new(Notify::new()), Some(committer));
        // A payload cut out of a larger buffer, as a client's request may give it.
        let buffer = bytes::Bytes::from(vec![3u8; 4096]);
        let mut m = message(0);
        m.content.payload = buffer.slice(..100);
        m.content.reliability = Reliability::Persistent;
        link.enqueue_checked(m, Instant::now());
        let records =
            store.scan("send.B", std::ops::Bound::Unbounded, std::ops::Bound::Unbounded, 10).unwrap();
        assert_eq!(records.len(), 1);
        let (waiting, _, key) = link.lock().pop(|_| true).unwrap();
        assert!(key.is_some(), "recorded");
        let (payload, record) = (&waiting.content.payload, &records[0].1);
        assert_eq!(payload, &vec![3u8; 100]);
        assert!(record.as_ptr_range().contains(&payload.as_ptr()) && record.ends_with(payload));
        drop(waiting);
        assert!(buffer.try_into_mut().is_ok(), "nothing holds the larger buffer any more");
    }

    #[test]
    fn relayed_messages_do_not_hold_back_this_nodes_puts() {
        let link = handle();
        let relayed = Message { hop_count: 1, ..message(1000) };
        let now = Instant::now();
        for _ in 0..10 {
            link.enqueue_checked(relayed.clone(), now);
        }
        link.up.store(true, Ordering::Relaxed);
        link.lock().mark_taken(now);
        let own = message(1000);
        let own = Message {
            encoding: Default::default(),
            content: Box::new(own.content.with_lifetime(linkbus_plugin_api::Lifetime::from_secs(60))),
            ..own
        };
        assert!(!link.is_ahead(&own, 5 * 1000, Duration::from_secs(1)), "ten relayed, none of our own");
        for _ in 0..6 {
            link.enqueue_checked(own.clone(), now);
        }
        let six = 6 * crate::link::transmit::size_of(&own);
        assert!(link.is_ahead(&own, six, Duration::from_secs(1)), "six of our own now");
        let taken = link.lock().pop(|m| m.hop_count == 0).map(|(m, _, _)| m.hop_count);
        assert_eq!(taken, Some(0), "one of ours taken");
        assert!(!link.is_ahead(&own, six, Duration::from_secs(1)), "five left");
        let expired = link.lock().take_expired(now + Duration::from_secs(61));
        assert_eq!(expired.len(), 5, "ours, which had a lifetime");
        assert!(!link.is_ahead(&own, 1, Duration::from_secs(1)), "expired ones no longer count");
    }
}
