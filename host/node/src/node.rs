//! The node: its queues, links and store, and the two ways messages enter it — a client
//! put (origin) and a delivery from a link (destination).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use linkbus_plugin_api::registry::{self, BuildContext, Factory};
use linkbus_plugin_api::{
    Address, Batch, Content, Lifetime, Message, MessageId, NodeName, PluginError, QueueName, Reliability,
    Store, StoreError, Transport,
};
use linkbus_proto::wire::{address_encoded_len, encoded_len, encoded_len_without_recipients};
use smallvec::SmallVec;
use tracing::{debug, warn};

use crate::ByName;
use crate::api::protocol::ErrorCode;
use crate::config::{Config, QueueConfig, QueueOrder, WhenFull};
use crate::events::{EVENT_KIND_HEADER, Event, EventKind, Subscriptions};
use crate::link::LinkHandle;
use crate::queue::{
    DEAD_LETTER_CODE_HEADER, DEAD_LETTER_QUEUE, DEAD_LETTER_REASON_HEADER, DEAD_LETTER_RECIPIENTS_HEADER,
    DeadLetterCode, EVENT_QUEUE, LocalQueue, QueueError,
};
use crate::results::{Outcome, RESULT_FOR_HEADER, RESULT_MESSAGE_NAME, ResultBook, ResultTo};

mod probe;
use probe::is_probe;
pub use probe::{PROBE_NAME, Probe};

/// Why a put was refused: a code for programs, a message for people, and how many of the
/// batch's contents were accepted before the refused one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PutError {
    /// The cause.
    pub code: ErrorCode,
    /// Contents accepted before this error.
    pub accepted: u32,
    /// What went wrong.
    pub message: String,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A plugin could not be built.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The store failed while recovering.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// A socket or file could not be opened.
    #[error("{what}: {source}")]
    Io {
        /// What was being opened.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The transport could not listen.
    #[error(transparent)]
    Transport(#[from] linkbus_plugin_api::TransportError),
    /// Key files are missing, unreadable, too open or malformed.
    #[error(transparent)]
    Security(#[from] linkbus_plugin_api::ConfigErrors),
    /// A node task ended while the node was running.
    #[error("node task failed: {0}")]
    TaskFailed(String),
}

/// Why a commit failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitError {
    /// Nothing was queued.
    Refused((ErrorCode, String)),
    /// The store failed after some puts were queued.
    Partly(String),
}

/// Results tracking of messages not yet accepted: forgotten on drop unless kept.
struct Tracking<'a> {
    book: &'a ResultBook,
    sequences: Vec<u64>,
}

impl Tracking<'_> {
    /// The messages of these sequence numbers were accepted (the others, when the guard
    /// drops, were not).
    fn keep_these(&mut self, sequences: impl IntoIterator<Item = u64>) {
        let now = Instant::now();
        for sequence in sequences {
            if let Some(at) = self.sequences.iter().position(|s| *s == sequence) {
                self.sequences.swap_remove(at);
                self.book.accepted(sequence, now);
            }
        }
    }

    /// The messages were accepted (now): their results stay tracked, and time out counting
    /// from now.
    fn keep(mut self) {
        if self.sequences.is_empty() {
            return;
        }
        let now = Instant::now();
        for sequence in std::mem::take(&mut self.sequences) {
            self.book.accepted(sequence, now);
        }
    }
}

impl Drop for Tracking<'_> {
    fn drop(&mut self) {
        self.sequences.iter().for_each(|s| self.book.forget(*s));
    }
}

/// The node's result book; with a durable store it keeps the results of persistent
/// messages and takes up what an earlier run kept.
/// Also returns the highest message sequence number it holds.
fn result_book(
    config: &Config,
    store: &dyn Store,
    committer: &Arc<crate::storage::Committer>,
    now: Instant,
) -> Result<(ResultBook, u64), StartError> {
    let results = ResultBook::new(
        std::time::Duration::from_millis(config.messages.result_wait_ms),
        usize::try_from(config.messages.results_pending_max).unwrap_or(usize::MAX),
    );
    if !store.durable() {
        return Ok((results, 0));
    }
    let results = results.kept_by(committer.clone());
    let loaded = results
        .load(store, now)
        .map_err(|reason| StartError::Store(StoreError::Backend { op: "recover", reason }))?;
    if loaded.open > 0 {
        tracing::info!(
            open = loaded.open,
            "Results of persistent messages from before the restart waited for again."
        );
    }
    Ok((results, loaded.sequence_max))
}

/// Opens the configured queues and the node's own (`DLQ`, `EVENT`), recovering them.
fn open_queues(
    config: &Config,
    store: &dyn Store,
    committer: &Arc<crate::storage::Committer>,
    room: &Arc<tokio::sync::Notify>,
    now: Instant,
) -> Result<ByName<QueueName, Arc<LocalQueue>>, StartError> {
    let mut queues = ByName::default();
    // The node's own queues: FIFO, volatile, any message the node accepts.
    let own = |name: &str, max: u64| QueueConfig {
        name: QueueName::new(name).expect("valid"),
        order: QueueOrder::Fifo,
        queue_messages_max: max,
        message_bytes_max: config.messages.message_bytes_max,
        reliability: linkbus_plugin_api::Reliability::Volatile,
        when_full: WhenFull::Block,
    };
    let dead_letters = own(DEAD_LETTER_QUEUE, config.messages.dead_letter_messages_max);
    let events = own(EVENT_QUEUE, config.events.queue_messages_max);
    for q in config.queues.iter().cloned().chain([dead_letters, events]) {
        let queue = LocalQueue::open(q, store, committer.clone(), room.clone(), now)?;
        queues.insert(queue.config().name.clone(), Arc::new(queue));
    }
    Ok(queues)
}

/// Takes up what each link recorded as sending before a restart: the transmission queues
/// refill (their lifetimes having counted on), and what was sent goes to the link tasks.
fn restore_sending(
    links: &ByName<NodeName, Arc<LinkHandle>>,
    routing: &crate::routing::Routing,
    store: &dyn Store,
    now: Instant,
) -> Result<(), StartError> {
    for link in links.values() {
        let Some(record) = &link.record else { continue };
        let mut recovered = record
            .load(store)
            .map_err(|reason| StartError::Store(StoreError::Backend { op: "recover", reason }))?;
        for stored in recovered.queued.iter_mut().chain(recovered.sent.iter_mut()) {
            keep_recipients_routed_through(stored, &link.peer.name, routing);
        }
        let mut queue = link.lock();
        for mut stored in std::mem::take(&mut recovered.queued) {
            // The time down counts against the lifetime (by the wall clock).
            let lifetime = stored.message.content.lifetime.unwrap_or(Lifetime::UNLIMITED);
            let left = lifetime.after(stored.age.as_millis() as u64).unwrap_or(Lifetime::from_ms(1));
            stored.message.content.lifetime = Some(left);
            queue.push_checked(stored.message, now, Some(stored.number));
        }
        drop(queue);
        if let Ok(mut restored) = link.restored_sent.lock() {
            *restored = recovered;
        }
    }
    Ok(())
}

/// A message recorded for the link to `peer` keeps only the recipients routed through that
/// link. (Records from before routing held every recipient in each link's copy; a peer
/// that relays would reach the others a second time.) When the routes changed so that none
/// is left, it keeps them all.
fn keep_recipients_routed_through(
    stored: &mut crate::link::state::Stored,
    peer: &NodeName,
    routing: &crate::routing::Routing,
) {
    let via_peer =
        |to: &&Address| matches!(routing.next_hop(&to.node), Ok(crate::routing::Hop::Via(v)) if &v == peer);
    let kept: linkbus_plugin_api::Recipients =
        stored.message.content.recipients.iter().filter(via_peer).cloned().collect();
    if kept.is_empty() || kept.len() == stored.message.content.recipients.len() {
        return;
    }
    stored.message.content.recipients = kept;
    stored.bytes = linkbus_proto::wire::message_bytes(&stored.message);
}

/// Why an arriving message cannot go to a local recipient: dead-letter code, reason, and
/// the recipients concerned.
type Failed = (DeadLetterCode, String, Vec<linkbus_plugin_api::Address>);

/// Where one message goes: local queues, each once, and links, each once with the
/// recipients routed through it.
struct Targets<'a> {
    local: SmallVec<[&'a Arc<LocalQueue>; 2]>,
    remote: SmallVec<[(&'a Arc<LinkHandle>, Picked); 1]>,
}

/// The recipients a link's copy of a message names: their places among the message's
/// recipients (a message to one node needs no list of its own: inline up to four).
type Picked = SmallVec<[usize; 4]>;

/// One place an arriving message goes.
enum Target<'a> {
    /// A local queue.
    Local(&'a Arc<LocalQueue>),
    /// On through a link, for the recipients routed there.
    Forward(&'a Arc<LinkHandle>, Picked),
}

/// The recipients routed through one link, or why some cannot be reached.
type Group<'a> = Result<(&'a Arc<LinkHandle>, Picked), Failed>;

/// Adds `to` to the failure group for `code`, or starts one.
fn push_failed(groups: &mut SmallVec<[Group<'_>; 1]>, code: DeadLetterCode, reason: String, to: &Address) {
    match groups.iter_mut().find(|g| matches!(g, Err((c, _, _)) if *c == code)) {
        Some(Err((_, _, failed))) => failed.push(to.clone()),
        _ => groups.push(Err((code, reason, vec![to.clone()]))),
    }
}

/// The recipients at `picked` among `all`, in order.
fn picked_from<'m>(all: &'m [Address], picked: &'m Picked) -> impl Iterator<Item = &'m Address> {
    picked.iter().filter_map(|&i| all.get(i))
}

/// Bytes the recipients at `picked` among `all` take in an encoded copy.
fn picked_encoded_len(all: &[Address], picked: &Picked) -> usize {
    picked_from(all, picked).map(address_encoded_len).sum()
}

/// `message` naming only the recipients at `picked` (in their order), or all of them.
fn addressed_to_picked(mut message: Message, picked: &Picked) -> Message {
    if picked.len() != message.content.recipients.len() {
        message.content.recipients = picked_from(&message.content.recipients, picked).cloned().collect();
    }
    message
}

/// Why a message goes to the dead-letter queue: the code, a reason for people, and the
/// recipients it failed for (what `linkbus dlq replay` puts it to again; empty: all).
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    /// The reason code.
    pub code: DeadLetterCode,
    /// The reason for people.
    pub reason: &'a str,
    /// The recipients it could not reach.
    pub failed: Vec<linkbus_plugin_api::Address>,
}

/// Where a node's configuration came from: a file (or none) and command-line overrides.
#[derive(Debug, Clone)]
pub struct ReloadSource {
    /// The configuration file.
    pub path: Option<std::path::PathBuf>,
    /// The command-line overrides, applied again on every reload.
    pub overrides: crate::config::Overrides,
}

/// The state shared by every task of one node.
pub struct NodeState {
    /// The configuration the node runs with.
    pub config: Config,
    /// Random id of this run's state (a memory store forgets everything on restart).
    pub incarnation: u64,
    /// Whether the incarnation is that of the last run (a durable store): what links sent
    /// then is taken up.
    pub incarnation_kept: bool,
    /// Random id of this process run (told to peers, so they drop a dead old connection).
    pub run: u64,
    /// Where queues live.
    pub store: Arc<dyn Store>,
    /// The transport links use.
    pub transport: Arc<dyn Transport>,
    /// Local queues, the dead-letter queue included.
    pub queues: ByName<QueueName, Arc<LocalQueue>>,
    /// One link per configured peer.
    pub links: ByName<NodeName, Arc<LinkHandle>>,
    /// Which link a message to another node takes.
    pub routing: crate::routing::Routing,
    /// Link security: mode, keys, replay check.
    pub security: crate::security::Security,
    /// Next per-source message sequence number.
    next_sequence: AtomicU64,
    /// Notified when messages leave a queue or a transmission queue, for puts waiting for
    /// room.
    room: Arc<tokio::sync::Notify>,
    /// Event copies dropped because their queue or link had no room.
    /// (In all, and per node that raised them and queue they were for.)
    pub events_dropped: crate::events::DroppedCopies,
    /// The results of this node's messages that asked for them.
    pub results: ResultBook,
    /// Result messages to other nodes dropped because their way had no room.
    pub results_dropped: AtomicU64,
    /// Queues that get copies of events: from the configuration and from clients.
    pub subscriptions: Subscriptions,
    /// Held while room is checked and filled for client puts and commits, so that two of
    /// them never both take the last room.
    admission: std::sync::Mutex<()>,
    /// The store thread: queues' writes in order, group commit.
    pub committer: Arc<crate::storage::Committer>,
    /// Large message buffers kept for use again (`links.recycled_bytes_max`), for every
    /// link's session.
    pub recycler: Arc<linkbus_proto::recycle::Recycler>,
    /// Why the node must stop (a store failure), once it must.
    failure: Arc<crate::storage::Failure>,
    /// Where the configuration came from, for reloads (set by `linkbus node run`).
    pub reload_source: std::sync::OnceLock<ReloadSource>,
    /// Held while a reload reads and applies the configuration.
    reloading: std::sync::Mutex<()>,
    /// The durability tests' negative control (see [`ACK_BEFORE_SYNC_ENV`]).
    #[doc(hidden)]
    pub ack_before_sync: std::sync::atomic::AtomicBool,
    /// When [`crate::Node::shutdown`] began (see [`NodeState::stop`]).
    stopped_at: std::sync::OnceLock<tokio::time::Instant>,
    /// Wakes what waits for others (gets, results) when the node stops.
    stop_signal: tokio::sync::Notify,
    /// Repeated warnings, aggregated per reason (`log:`).
    pub warnings: crate::warnings::Warnings,
    /// Room on the disk (`node.data_free_bytes_min`): persistent messages wait for it.
    pub disk: crate::disk::DiskRoom,
}

impl std::fmt::Debug for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeState").field("name", &self.config.node.name).finish_non_exhaustive()
    }
}

/// The plugins a node is built from.
type Plugins = (Arc<dyn Transport>, Arc<dyn Store>);

fn build_plugins(config: &Config) -> Result<Plugins, StartError> {
    let ctx = BuildContext { node: config.node.name.clone(), data_dir: config.node.data_dir.clone() };
    let missing = |kind: &str| PluginError { plugin: kind.to_owned(), reason: "not registered".into() };
    let t = &config.plugins.transport;
    let transport = match registry::find("transport", &t.kind).map(|e| e.factory) {
        Some(Factory::Transport(build)) => Arc::from(build(&t.section, &ctx)?),
        _ => return Err(missing(&t.kind).into()),
    };
    let s = &config.plugins.store;
    let store = match registry::find("store", &s.kind).map(|e| e.factory) {
        Some(Factory::Store(build)) => Arc::from(build(&s.section, &ctx)?),
        _ => return Err(missing(&s.kind).into()),
    };
    Ok((transport, store))
}

fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // Without OS randomness, the clock still tells runs apart.
    if getrandom::fill(&mut bytes).is_err() {
        return crate::clock::unix_ms() ^ u64::from(std::process::id());
    }
    u64::from_le_bytes(bytes).max(1)
}

const META_SPACE: &str = "meta";
const INCARNATION_KEY: &[u8] = b"incarnation";

/// Longest one put call keeps pace with a busy link (`links.queue_pace_bytes`): a producer
/// faster than its link is held to the link's pace rather than running up to the queue's
/// bound, which buys no throughput and leaves every payload cold in memory by the time it
/// is sent (BENCHMARKS.md, tenth round). Puts that may not wait, deliveries from links,
/// events, results and commits are not held.
///
/// A link that took nothing for that long (down, or its peer not acknowledging) holds no
/// put back, so its queue fills up to `links.queue_bytes_max` as before. Long enough for a
/// slow link, which takes messages in bursts (100 ms was too short at 4 MiB/s:
/// `tests/link_faults.rs`).
pub const PACE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The incarnation of this run: with a durable store the one recorded before (what links
/// sent and received is kept, `link/state.rs`, so peers keep expecting its numbers), else a
/// fresh one, recorded. Returns it and whether it was kept.
fn incarnation(store: &dyn Store) -> Result<(u64, bool), StoreError> {
    // A durable store keeps what links sent (`link/state.rs`): the numbers go on.
    if store.durable()
        && let Some(kept) = store.get(META_SPACE, INCARNATION_KEY)?
        && let Ok(bytes) = <[u8; 8]>::try_from(kept.as_ref())
    {
        return Ok((u64::from_be_bytes(bytes), true));
    }
    let fresh = random_u64();
    let mut batch = Batch::new();
    batch.put(META_SPACE, INCARNATION_KEY, fresh.to_be_bytes().to_vec());
    store.write(batch, true)?;
    Ok((fresh, false))
}

impl NodeState {
    /// Builds the plugins, recovers the queues and prepares (but does not start) the links.
    ///
    /// # Errors
    /// [`StartError`] when a plugin or the store fails.
    pub fn new(config: Config) -> Result<Arc<Self>, StartError> {
        let (transport, store) = build_plugins(&config)?;
        Self::with_plugins(config, transport, store)
    }

    /// Like [`NodeState::new`] with plugins built elsewhere (tests, embedding programs).
    ///
    /// # Errors
    /// [`StartError`] when the store fails or key files are wrong.
    pub fn with_plugins(
        config: Config,
        transport: Arc<dyn Transport>,
        store: Arc<dyn Store>,
    ) -> Result<Arc<Self>, StartError> {
        let security = crate::security::Security::load(&config)?;
        let routing = crate::routing::Routing::new(&config)?;
        let now = Instant::now();
        let (incarnation, incarnation_kept) = incarnation(store.as_ref())?;
        let room = Arc::new(tokio::sync::Notify::new());
        let failure = Arc::new(crate::storage::Failure::default());
        let committer = Arc::new(
            crate::storage::Committer::start(store.clone(), failure.clone())
                .map_err(|source| StartError::Io { what: "store thread".into(), source })?,
        );
        let queues = open_queues(&config, store.as_ref(), &committer, &room, now)?;
        let links = link_handles(&config, store.durable().then(|| committer.clone()), &room);
        if incarnation_kept {
            restore_sending(&links, &routing, store.as_ref(), now)?;
        }
        let subscriptions = Subscriptions::load(&config.events.subscriptions, store.as_ref())?;
        subscriptions.remove_unreachable(store.as_ref(), |to| {
            subscription_target(&config.node.name, to, |q| queues.contains_key(q), |n| {
                matches!(routing.next_hop(n), Ok(crate::routing::Hop::Via(via)) if links.contains_key(&via))
            })
                .map_err(|(_, reason)| reason)
        })?;
        let (results, sequence_kept) = result_book(&config, store.as_ref(), &committer, now)?;
        // Sequence numbers must not repeat across restarts of a node whose store forgets:
        // start from the clock (microsecond resolution leaves room for 1 M puts a second),
        // and above any kept in the store (the clock may have gone back).
        let next_sequence =
            AtomicU64::new(crate::clock::unix_ms().saturating_mul(1000).max(sequence_kept.saturating_add(1)));
        let recycled_bytes_max = usize::try_from(config.links.recycled_bytes_max).unwrap_or(usize::MAX);
        let recycler = Arc::new(linkbus_proto::recycle::Recycler::new(recycled_bytes_max));
        Ok(Arc::new(Self {
            recycler,
            warnings: crate::warnings::Warnings::from_settings(config.log),
            disk: disk_room(&config, store.as_ref()),
            config,
            incarnation,
            incarnation_kept,
            run: random_u64(),
            store,
            transport,
            queues,
            links,
            routing,
            security,
            next_sequence,
            room,
            events_dropped: crate::events::DroppedCopies::default(),
            results,
            results_dropped: AtomicU64::new(0),
            subscriptions,
            admission: std::sync::Mutex::new(()),
            committer,
            failure,
            reload_source: std::sync::OnceLock::new(),
            reloading: std::sync::Mutex::new(()),
            ack_before_sync: std::sync::atomic::AtomicBool::new(ack_before_sync()),
            stopped_at: std::sync::OnceLock::new(),
            stop_signal: tokio::sync::Notify::new(),
        }))
    }

    /// Stops the node: the store failed, so nothing more may be acknowledged. The node's
    /// run ends with an error (exit status non-zero).
    pub fn fail(&self, reason: String) {
        tracing::error!(reason, "Store failed: the node stops acknowledging and exits.");
        self.failure.set(reason);
    }

    /// Whether the node is shutting down (see [`NodeState::stop`]).
    pub(crate) fn stopping(&self) -> bool {
        self.stopped_at.get().is_some()
    }

    /// Completes when the node is shutting down (at once if it is): for what waits for
    /// others, a get or a results query, to end with [`NodeState::shutting_down`].
    pub(crate) async fn until_stopping(&self) {
        // Made before the check: a `stop` after it wakes it.
        let signal = self.stop_signal.notified();
        if !self.stopping() {
            signal.await;
        }
    }

    /// When the node started shutting down (`None` while it runs).
    pub(crate) fn stopped_at(&self) -> Option<tokio::time::Instant> {
        self.stopped_at.get().copied()
    }

    /// Why a request that waited was ended by the node's shutdown.
    pub(crate) fn shutting_down(&self) -> String {
        format!("node {} is shutting down", self.name())
    }

    /// Waits until `room` (made before room was found missing, so a shutdown after that
    /// wakes it) is given up or `deadline` passes: whether room came in time; `Err` with
    /// the reason when the node is shutting down (nothing waits for room then).
    async fn wait_for_room(
        &self,
        room: impl Future<Output = ()>,
        deadline: tokio::time::Instant,
    ) -> Result<bool, String> {
        if self.stopping() {
            return Err(self.shutting_down());
        }
        Ok(tokio::time::Instant::now() < deadline && tokio::time::timeout_at(deadline, room).await.is_ok())
    }

    /// Marks the node as shutting down. From then on in-process calls are refused, a put
    /// or commit that would wait for room is refused instead (those waiting are woken),
    /// no producer is paced, and gets and results queries that wait end with
    /// [`NodeState::shutting_down`]. Requests that wait for nothing finish as usual.
    pub(crate) fn stop(&self) {
        let _ = self.stopped_at.set(tokio::time::Instant::now());
        self.room.notify_waiters();
        self.stop_signal.notify_waiters();
    }

    /// Whether the store failed and the node is stopping (it acknowledges nothing more).
    pub fn is_failing(&self) -> bool {
        self.failure.get().is_some()
    }

    /// Completes with the reason once the node must stop (see [`NodeState::fail`]; the
    /// store thread calls it too).
    pub async fn failed(&self) -> String {
        self.failure.wait().await
    }

    /// Makes every write so far durable, for the messages a client is about to be told are
    /// accepted (group commit); a failure stops the node.
    async fn make_durable(&self, persistent: bool) -> Result<(), String> {
        if !persistent || self.ack_before_sync.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.committer.sync().await.map_err(|e| {
            let reason = format!("store sync failed, so accepted messages may not be durable: {e}");
            self.fail(reason.clone());
            reason
        })
    }

    /// This node's name.
    pub fn name(&self) -> &NodeName {
        &self.config.node.name
    }

    /// The client socket path.
    pub fn socket_path(&self) -> PathBuf {
        self.config
            .node
            .client_socket
            .clone()
            .unwrap_or_else(|| crate::runtime_dir::socket_for(self.name().as_str()))
    }

    /// Longest encoded message this node accepts, from a client or a link: the payload
    /// limit plus room for the largest envelope.
    pub fn encoded_message_bytes_max(&self) -> usize {
        usize::try_from(self.config.messages.message_bytes_max + crate::config::ENVELOPE_BYTES_MAX)
            .unwrap_or(usize::MAX)
    }

    /// Checks a content against this node's limits and topology, without side effects.
    fn check_content(&self, content: &Content) -> Result<(), (ErrorCode, String)> {
        content.validate().map_err(|e| (ErrorCode::Invalid, e.to_string()))?;
        if content.priority.is_system() {
            return Err((ErrorCode::Invalid, "the system priority is reserved for the node".into()));
        }
        // Perf: the queue lookup that resolves the reliability is made only when short of room.
        if let Err(reason) = self.disk.admit(content.payload.len() as u64)
            && self.reliability_of(content) == Reliability::Persistent
        {
            return Err((ErrorCode::Busy, reason));
        }
        let size = content.payload.len() as u64;
        let max = self.config.messages.message_bytes_max;
        if size > max {
            return Err((
                ErrorCode::TooLarge,
                format!("payload of {size} bytes is over messages.message_bytes_max {max}"),
            ));
        }
        let encoded = linkbus_proto::wire::message_encoded_len(self.name().as_str().len(), content);
        let encoded_max = self.encoded_message_bytes_max();
        if encoded > encoded_max {
            let msg = format!(
                "message of {encoded} bytes with its name and headers is over this node's limit of {encoded_max}"
            );
            return Err((ErrorCode::TooLarge, msg));
        }
        for to in &content.recipients {
            if &to.node == self.name() {
                let queue = self.queues.get(&to.queue).ok_or_else(|| {
                    (
                        ErrorCode::UnknownQueue,
                        format!("queue '{}' does not exist on node {}", to.queue, to.node),
                    )
                })?;
                let max = queue.config().message_bytes_max;
                if size > max {
                    let msg = format!("payload of {size} bytes is over queue {to}'s message_bytes_max {max}");
                    return Err((ErrorCode::TooLarge, msg));
                }
            } else if let Err(e) = self.link_towards(&to.node) {
                return Err((ErrorCode::NoRoute, e));
            }
        }
        Ok(())
    }

    /// Accepts a batch of contents from a client, in order: each is checked, stamped with an
    /// id, and queued locally or on the link to its destination.
    ///
    /// # Errors
    /// [`PutError`] for the first content refused; those before it stay accepted.
    pub fn put(&self, contents: Vec<Content>) -> Result<(Vec<u64>, u64), PutError> {
        let created_unix_ms = crate::clock::unix_ms();
        let mut sequences = Vec::with_capacity(contents.len());
        for (index, content) in contents.into_iter().enumerate() {
            let message = self.prepare(index, content, created_unix_ms)?;
            let tracking = self.track([&message]).map_err(|e| put_error(index, e))?;
            let (sequence, here) = (message.id.sequence, self.results_here(&message));
            self.dispatch(message, Instant::now()).map_err(|e| put_error(index, e))?;
            tracking.keep();
            self.delivered_here(here);
            sequences.push(sequence);
        }
        // Blocking: this form is for callers outside the runtime (tests, tools).
        self.committer.sync_blocking().map_err(|e| PutError {
            code: ErrorCode::Internal,
            accepted: 0,
            message: e.to_string(),
        })?;
        Ok((sequences, created_unix_ms))
    }

    /// Like [`NodeState::put`], but a content whose destination queue (local, or the
    /// transmission queue of its link and priority) is full waits up to `timeout` for room
    /// instead of failing at once; a zero timeout is a try-put.
    ///
    /// # Errors
    /// [`PutError`] for the first content refused or still without room at the deadline
    /// (it was not accepted); those before it stay accepted.
    pub async fn put_waiting(
        &self,
        contents: Vec<Content>,
        timeout: std::time::Duration,
    ) -> Result<(Vec<u64>, u64), PutError> {
        if let Some(reason) = self.failure.get() {
            let message = format!("the node is stopping: {reason}");
            return Err(PutError { code: ErrorCode::Internal, accepted: 0, message });
        }
        let mut persistent = false;
        let outcome = self.put_waiting_unsynced(contents, timeout, &mut persistent).await;
        // Whatever was accepted (all, or those before a refused one) is durable before the
        // client hears of it.
        if let Err(reason) = self.make_durable(persistent).await {
            let accepted = match &outcome {
                Ok((sequences, _)) => sequences.len() as u32,
                Err(e) => e.accepted,
            };
            return Err(PutError { code: ErrorCode::Internal, accepted, message: reason });
        }
        outcome
    }

    async fn put_waiting_unsynced(
        &self,
        contents: Vec<Content>,
        timeout: std::time::Duration,
        persistent: &mut bool,
    ) -> Result<(Vec<u64>, u64), PutError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let created_unix_ms = crate::clock::unix_ms();
        // A put that may wait keeps pace with a busy link, for a while (see `PACE_WAIT`).
        let pace_bytes = self.config.links.queue_pace_bytes;
        let mut put = OnePut {
            timeout,
            deadline,
            // The batch arrives at one instant (read again after waiting for room).
            now: Instant::now(),
            pace_bytes,
            pace_until: (!timeout.is_zero() && pace_bytes > 0)
                .then(|| deadline.min(tokio::time::Instant::now() + PACE_WAIT)),
            sequences: Vec::with_capacity(contents.len()),
            persistent: false,
        };
        let outcome = self.put_runs(contents, created_unix_ms, &mut put).await;
        *persistent |= put.persistent;
        outcome.map(|()| (put.sequences, created_unix_ms))
    }

    /// Puts `contents` in runs: the messages that go the same way as the one before them
    /// (see [`same_way`]) are admitted and queued together when they can go at once, under
    /// one check of the room and one hold of the link's queue; the others, and a run that
    /// would have to wait, one at a time.
    async fn put_runs(
        &self,
        contents: Vec<Content>,
        created_unix_ms: u64,
        put: &mut OnePut,
    ) -> Result<(), PutError> {
        let mut contents = contents.into_iter().enumerate();
        let mut run: Vec<(usize, Message)> = Vec::new();
        let mut carried = None;
        loop {
            let mut bytes = 0;
            run.extend(carried.take());
            let mut refused = None;
            for (index, content) in contents.by_ref() {
                match self.prepare(index, content, created_unix_ms) {
                    Ok(message)
                        if run.len() < RUN_MESSAGES_MAX
                            && bytes < RUN_BYTES_MAX
                            && run.first().is_none_or(|(_, first)| same_way(first, &message)) =>
                    {
                        bytes += message.content.payload.len();
                        run.push((index, message));
                    }
                    Ok(message) => {
                        carried = Some((index, message));
                        break;
                    }
                    Err(e) => {
                        refused = Some(e);
                        break;
                    }
                }
            }
            if run.is_empty() {
                return refused.map_or(Ok(()), Err);
            }
            if !(run.len() > 1 && self.admit_run(&mut run, put)) {
                for (index, message) in run.drain(..) {
                    self.put_one(index, message, put).await?;
                }
            }
            if let Some(e) = refused {
                return Err(e);
            }
        }
    }

    /// Queues all of `run` (prepared messages that go the same way, none wanting results)
    /// when they go to one link, which has room for all of them and is not ahead; says
    /// whether it did (and then `run` is empty). Anything else, a refusal included, is left
    /// to [`NodeState::put_one`], which waits or says why.
    fn admit_run(&self, run: &mut Vec<(usize, Message)>, put: &mut OnePut) -> bool {
        let _admission = self.admission.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(Ok(targets)) = run.first().map(|(_, first)| self.targets(first)) else { return false };
        let [(link, picked)] = &targets.remote[..] else { return false };
        let everyone = run.first().is_some_and(|(_, m)| picked.len() == m.content.recipients.len());
        if !targets.local.is_empty() || !everyone {
            return false;
        }
        let planned: Vec<(&Message, &Targets<'_>)> = run.iter().map(|(_, m)| (m, &targets)).collect();
        let pace = put.pace_until.map(|_| (put.pace_bytes, PACE_WAIT));
        if !matches!(self.check_room(&planned, &[], pace), Ok(false)) {
            return false;
        }
        drop(planned);
        for (_, message) in run.iter() {
            put.sequences.push(message.id.sequence);
            put.persistent |= message.content.reliability == Reliability::Persistent;
        }
        link.enqueue_checked_run(run.drain(..).map(|(_, message)| message), put.now);
        true
    }

    /// Puts one prepared message: waits for room (up to the put's timeout, never past the
    /// message's lifetime) and, while a link it goes to is ahead, for the link (see
    /// `PACE_WAIT`).
    async fn put_one(&self, index: usize, message: Message, put: &mut OnePut) -> Result<(), PutError> {
        // Undone if the put is refused, or abandoned while it waits.
        let tracking = self.track([&message]).map_err(|e| put_error(index, e))?;
        // A message never waits past its lifetime.
        let (deadline, waits) = match message.content.lifetime {
            Some(l) if !l.is_unlimited() => {
                let life = std::time::Duration::from_millis(l.as_ms());
                (put.deadline.min(tokio::time::Instant::from_std(put.now) + life), put.timeout.min(life))
            }
            _ => (put.deadline, put.timeout),
        };
        let (sequence, here) = (message.id.sequence, self.results_here(&message));
        let is_persistent = message.content.reliability == Reliability::Persistent;
        // At most half the time the message may wait (its timeout or lifetime), so a put
        // that was admissible when it came keeps time to find room after pacing.
        let pace_until = put.pace_until.map(|until| {
            let start = tokio::time::Instant::from_std(put.now);
            until.min(start + deadline.saturating_duration_since(start) / 2)
        });
        loop {
            // Made before the check, so room given up after it wakes the wait below
            // (`notify_waiters` reaches every `Notified` made before it, polled or not).
            let room = self.room.notified();
            let admission = self.admission.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match self.admit_paced(&message, pace_until.map(|_| (put.pace_bytes, PACE_WAIT))) {
                Ok((targets, ahead)) => {
                    // The clock is read only when a link is ahead.
                    // A node that is stopping takes what it can at once.
                    if let Some(until) = pace_until.filter(|_| ahead && !self.stopping())
                        && tokio::time::Instant::now() < until
                    {
                        drop(targets);
                        drop(admission);
                        // Woken as the link takes messages; room is checked again after.
                        let _ = tokio::time::timeout_at(until, room).await;
                        put.now = Instant::now();
                        continue;
                    }
                    self.push(message, targets, put.now).map_err(|e| put_error(index, e))?;
                    drop(admission);
                    break;
                }
                Err((ErrorCode::Full, reason)) => {
                    drop(admission);
                    let waited = self.wait_for_room(room, deadline).await.map_err(|stopping| {
                        put_error(index, (ErrorCode::Internal, format!("{reason}; {stopping}, not accepted")))
                    })?;
                    put.now = Instant::now();
                    if !waited {
                        let reason = format!("{reason}; no room within {waits:?}, not accepted");
                        return Err(put_error(index, (ErrorCode::Full, reason)));
                    }
                }
                Err(e) => return Err(put_error(index, e)),
            }
        }
        tracking.keep();
        self.delivered_here(here);
        put.persistent |= is_persistent;
        put.sequences.push(sequence);
        Ok(())
    }

    /// Checks one content from a client and makes it a message.
    fn prepare(&self, index: usize, content: Content, created_unix_ms: u64) -> Result<Message, PutError> {
        self.prepare_in_transaction(content, created_unix_ms).map_err(|e| put_error(index, e))
    }

    /// Starts tracking the results of those of `messages` that want them — before they are
    /// queued anywhere, so no result can come back untracked. Undone when the returned
    /// guard drops before [`Tracking::keep`].
    fn track<'m>(
        &self,
        messages: impl IntoIterator<Item = &'m Message>,
    ) -> Result<Tracking<'_>, (ErrorCode, String)> {
        let mut tracking = Tracking { book: &self.results, sequences: Vec::new() };
        for message in messages.into_iter().filter(|m| m.content.results) {
            self.results.track(message).map_err(|e| (ErrorCode::Busy, e))?;
            tracking.sequences.push(message.id.sequence);
        }
        Ok(tracking)
    }

    /// Records an accepted message that wants results as delivered to its recipients on
    /// this node.
    fn delivered_here(&self, here: Option<(MessageId, Vec<Address>)>) {
        let Some((id, recipients)) = here else { return };
        for to in &recipients {
            self.record_result(&id, to, Outcome::Delivered);
        }
    }

    /// What [`NodeState::delivered_here`] records for `message` once it is queued: its
    /// recipients on this node, when it wants results.
    fn results_here(&self, message: &Message) -> Option<(MessageId, Vec<Address>)> {
        message.content.results.then(|| {
            let here = message.content.recipients.iter().filter(|to| &to.node == self.name());
            (message.id.clone(), here.cloned().collect())
        })
    }

    /// Reports what became of a message at some of its recipients to its origin: recorded
    /// here when this node is the origin, else sent there as a result message (dropped and
    /// counted when its way has no room). Nothing happens for a message that wants no results.
    pub fn report(&self, to: Option<&ResultTo>, outcomes: Vec<(Address, Outcome)>) {
        let Some(to) = to else { return };
        if outcomes.is_empty() {
            return;
        }
        let payload = crate::results::encode_report(&outcomes);
        if &to.id.source == self.name() {
            for (recipient, outcome) in outcomes {
                self.record_result(&to.id, &recipient, outcome);
            }
            return;
        }
        let origin = Address::new(to.id.source.clone(), QueueName::new(EVENT_QUEUE).expect("valid"));
        let mut content = Content::buf(origin, payload)
            .with_priority(linkbus_plugin_api::Priority::SYSTEM)
            .with_reliability(to.reliability)
            .with_lifetime(Lifetime::from_ms(self.config.messages.result_wait_ms));
        content.kind = linkbus_plugin_api::Kind::Event;
        content.name = RESULT_MESSAGE_NAME.to_owned();
        content.headers.push((RESULT_FOR_HEADER.into(), to.id.to_string()));
        if let Err(e) = content.validate() {
            self.results_dropped.fetch_add(1, Ordering::Relaxed);
            if self.warnings.admit(crate::warnings::reason::BAD_RESULT) {
                warn!(id = %to.id, error = %e, "Result message not valid; dropped.");
            }
            return;
        }
        let message = self.stamp(content, crate::clock::unix_ms());
        if let Err((_, reason)) = self.dispatch_own(message, Instant::now()) {
            self.results_dropped.fetch_add(1, Ordering::Relaxed);
            debug!(id = %to.id, reason, "Result message dropped.");
        }
    }

    /// Records what the sender of a message of this node can only guess for some of its
    /// recipients (it sent the message, which then expired there): final one result wait
    /// later unless their node reports first.
    pub fn report_provisional(&self, to: Option<&ResultTo>, outcomes: Vec<(Address, Outcome)>) {
        let Some(to) = to.filter(|to| &to.id.source == self.name()) else { return };
        let now = Instant::now();
        for (recipient, outcome) in outcomes {
            self.results.record_provisional(to.id.sequence, &recipient, outcome, now);
        }
    }

    /// Records one outcome of a message of this node and raises it as a `result` event.
    fn record_result(&self, id: &MessageId, recipient: &Address, outcome: Outcome) {
        if !self.results.record(id.sequence, recipient, outcome.clone()) {
            return;
        }
        self.emit(result_event(id, recipient, &outcome));
    }

    /// Reports every recipient whose result did not come back in time as timed out.
    pub fn time_out_results(&self, now: Instant) {
        for (id, recipient, outcome) in self.results.time_out(now) {
            self.emit(result_event(&id, &recipient, &outcome));
        }
    }

    /// Takes apart a result message that arrived for this node's `EVENT` queue.
    fn take_results(&self, message: &Message) {
        let about = message.content.header(RESULT_FOR_HEADER).map(crate::results::parse_id);
        let outcomes = crate::results::decode_report(&message.content.payload);
        match (about, outcomes) {
            (Some(Ok(id)), Ok(outcomes)) if &id.source == self.name() => {
                // Only a recipient's own node says it was delivered; a relay on the way may
                // say it failed or expired.
                for (recipient, outcome) in outcomes {
                    if recipient.node == message.id.source || outcome != Outcome::Delivered {
                        self.record_result(&id, &recipient, outcome);
                    } else {
                        if self.warnings.admit(crate::warnings::reason::BAD_RESULT) {
                            warn!(from = %message.id.source, %recipient, "Delivery reported by another node than the recipient's; ignored.");
                        }
                    }
                }
            }
            (about, outcomes) => {
                if self.warnings.admit(crate::warnings::reason::BAD_RESULT) {
                    warn!(from = %message.id.source, ?about, error = ?outcomes.err(), "Result message not for this node's messages or unreadable; dropped.");
                }
            }
        }
    }

    /// The reliability `content` gets here: its own, or (when it chose none) persistent if
    /// one of its recipient queues on this node is persistent by default.
    pub fn reliability_of(&self, content: &Content) -> Reliability {
        if content.reliability != Reliability::AsQueue {
            return content.reliability;
        }
        let persistent = content.recipients.iter().any(|to| {
            &to.node == self.name()
                && self
                    .queues
                    .get(&to.queue)
                    .is_some_and(|q| q.config().reliability == Reliability::Persistent)
        });
        if persistent { Reliability::Persistent } else { Reliability::Volatile }
    }

    /// Makes a checked content a message of this node: reliability and lifetime defaults,
    /// id.
    fn stamp(&self, mut content: Content, created_unix_ms: u64) -> Message {
        content.reliability = self.reliability_of(&content);
        if content.lifetime.is_none() {
            content.lifetime = Some(match self.config.messages.lifetime_default_s {
                0 => Lifetime::UNLIMITED,
                s => Lifetime::from_secs(s),
            });
        }
        let sequence = self.next_sequence.fetch_add(1, Ordering::Relaxed);
        let id = MessageId { source: self.name().clone(), sequence, created_unix_ms };
        Message { id, hop_count: 0, redelivered: false, backout_count: 0, content: Box::new(content) }
    }

    /// Queues one accepted message: into local queues for recipients on this node, and once
    /// onto each link whose node has recipients. Room is checked everywhere first, so a
    /// refusal leaves nothing queued (unless a concurrent put takes the room in between).
    fn dispatch(&self, message: Message, now: Instant) -> Result<(), (ErrorCode, String)> {
        let _admission = self.admission.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.dispatch_own(message, now)
    }

    /// Like [`NodeState::dispatch`] for the node's own messages (events, results), without
    /// the admission lock: they never wait behind client puts.
    fn dispatch_own(&self, message: Message, now: Instant) -> Result<(), (ErrorCode, String)> {
        let targets = self.admit(&message)?;
        self.push(message, targets, now)
    }

    /// Where `message` goes, once room for it was found everywhere.
    fn admit(&self, message: &Message) -> Result<Targets<'_>, (ErrorCode, String)> {
        self.admit_paced(message, None).map(|(targets, _)| targets)
    }

    /// [`NodeState::admit`], and with `pace` (bytes, recently) whether a link it goes to is
    /// ahead (see [`LinkHandle::room_and_pace`]), read as its room is checked.
    fn admit_paced(
        &self,
        message: &Message,
        pace: Option<(u64, std::time::Duration)>,
    ) -> Result<(Targets<'_>, bool), (ErrorCode, String)> {
        let targets = self.targets(message)?;
        let ahead = self.check_room(&[(message, &targets)], &[], pace)?;
        Ok((targets, ahead))
    }

    /// Reads the configuration again (file and overrides) and takes up its routes and
    /// router; returns what changed. Everything else is left as it is: changes elsewhere
    /// are named as needing a restart.
    ///
    /// # Errors
    /// The node was not started from a configuration source, the new configuration is
    /// invalid (every problem, with its path), names another node, or routes through a
    /// node that is not a peer of the running node. The running configuration stays.
    pub fn reload(&self) -> Result<String, String> {
        let source = self.reload_source.get().ok_or_else(|| {
            "this node was not started by `linkbus node run`; it has no configuration to read again"
                .to_owned()
        })?;
        // One reload at a time, so the file read last is the one applied.
        let _one = self.reloading.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let new = crate::config::load_file(source.path.as_deref(), &source.overrides)
            .map_err(|e| format!("the new configuration is refused (the running one stays):\n{e}"))?;
        if new.node.name != self.config.node.name {
            return Err(format!(
                "the new configuration is for node '{}', not '{}'; the running one stays",
                new.node.name,
                self.name()
            ));
        }
        if let Some(route) = new.routes.iter().find(|r| !self.links.contains_key(&r.via)) {
            return Err(format!(
                "route '{}' goes through '{}', which is not a peer of the running node (new peers need a restart); the running configuration stays",
                route.to, route.via
            ));
        }
        let router = crate::routing::build_router(&new)
            .map_err(|e| format!("{e}; the running configuration stays"))?;
        self.routing.replace(router);
        let mut text =
            format!("routes reloaded: {} route(s), router '{}'\n", new.routes.len(), new.plugins.router.kind);
        let old = &self.config;
        let restart: Vec<&str> = [
            ("node", new.node != old.node),
            ("peers", new.peers != old.peers),
            ("queues", new.queues != old.queues),
            ("messages", new.messages != old.messages),
            ("links", new.links != old.links),
            ("security", new.security != old.security),
            ("events", new.events != old.events),
            ("plugins.transport", new.plugins.transport != old.plugins.transport),
            ("plugins.store", new.plugins.store != old.plugins.store),
        ]
        .into_iter()
        .filter_map(|(section, changed)| changed.then_some(section))
        .collect();
        if !restart.is_empty() {
            text.push_str(&format!(
                "changed, but taken up only at the next restart: {}\n",
                restart.join(", ")
            ));
        }
        tracing::info!(routes = new.routes.len(), "Routes reloaded.");
        Ok(text)
    }

    /// The link a message to `node` (not this node) leaves by.
    ///
    /// # Errors
    /// Why none does, in words.
    pub fn link_towards(&self, node: &NodeName) -> Result<&Arc<LinkHandle>, String> {
        // A neighbour is its own next hop (peers change only with a restart).
        if let Some(link) = self.links.get(node) {
            return Ok(link);
        }
        match self.routing.next_hop(node)? {
            crate::routing::Hop::Via(via) => self
                .links
                .get(&via)
                .ok_or_else(|| format!("no link to '{via}', the next hop to node '{node}'")),
            crate::routing::Hop::Local => Err(format!("node '{node}' is this node")),
        }
    }

    /// The local queues and links of `message`'s recipients, each once.
    fn targets(&self, message: &Message) -> Result<Targets<'_>, (ErrorCode, String)> {
        let mut targets = Targets { local: SmallVec::new(), remote: SmallVec::new() };
        for (index, to) in message.content.recipients.iter().enumerate() {
            if &to.node == self.name() {
                let queue = self.queues.get(&to.queue).ok_or((ErrorCode::UnknownQueue, to.to_string()))?;
                if !targets.local.iter().any(|q| Arc::ptr_eq(q, queue)) {
                    targets.local.push(queue);
                }
            } else {
                let link = self.link_towards(&to.node).map_err(|e| (ErrorCode::NoRoute, e))?;
                match targets.remote.iter_mut().find(|(l, _)| Arc::ptr_eq(l, link)) {
                    Some((_, picked)) => picked.push(index),
                    None => targets.remote.push((link, smallvec::smallvec![index])),
                }
            }
        }
        Ok(targets)
    }

    /// Checks that every target has room for all the `planned` messages together, and that
    /// each fits the peers it goes to; with `pace` (bytes, recently), returns whether a link
    /// they go to is ahead (see [`LinkHandle::room_and_pace`]; its queue's lock is taken once for
    /// both).
    fn check_room(
        &self,
        planned: &[(&Message, &Targets<'_>)],
        credit: &[(&Arc<LocalQueue>, usize)],
        pace: Option<(u64, std::time::Duration)>,
    ) -> Result<bool, (ErrorCode, String)> {
        let (local, remote) = tally(planned)?;
        // More than a queue ever holds can never fit: refused at once, not waited for.
        if let Some((q, n)) = local.iter().find(|(q, n)| *n as u64 > q.config().queue_messages_max) {
            let (name, max) = (&q.config().name, q.config().queue_messages_max);
            return Err((
                ErrorCode::TooLarge,
                format!("{n} messages for queue '{name}', which holds at most {max}"),
            ));
        }
        if let Some((l, _, n, _)) = remote.iter().find(|(l, _, n, _)| *n as u64 > l.class_messages_max()) {
            let (name, max) = (&l.peer.name, l.class_messages_max());
            return Err((
                ErrorCode::TooLarge,
                format!(
                    "{n} messages of one priority for node {name}, whose transmission queue holds {max} of each"
                ),
            ));
        }
        let credit_of =
            |q: &Arc<LocalQueue>| credit.iter().filter(|(c, _)| Arc::ptr_eq(c, q)).map(|(_, n)| *n).sum();
        let lacking: Vec<&Arc<LocalQueue>> = local
            .iter()
            .filter(|(q, n)| !q.has_room(n.saturating_sub(credit_of(q))))
            .map(|(q, _)| *q)
            .collect();
        // A queue that rejects when full decides, wherever it stands among the recipients.
        if let Some(full) = lacking.iter().find(|q| q.config().when_full == WhenFull::Reject) {
            let (name, max) = (&full.config().name, full.config().queue_messages_max);
            return Err((
                ErrorCode::Rejected,
                format!("queue '{name}' is full ({max} messages) and rejects puts then"),
            ));
        }
        if let Some(full) = lacking.first() {
            let (name, max) = (&full.config().name, full.config().queue_messages_max);
            return Err((ErrorCode::Full, format!("queue '{name}' is full ({max} messages)")));
        }
        let mut ahead = false;
        for (link, m, n, bytes) in &remote {
            let (room, link_ahead) = link.room_and_pace(m, (*n, *bytes), pace);
            if !room {
                let (name, fill) = (&link.peer.name, link.fill(m));
                return Err((ErrorCode::Full, format!("transmission queue to node {name} is full ({fill})")));
            }
            ahead |= link_ahead;
        }
        Ok(ahead)
    }

    /// Queues `message` at its targets, whose room was checked (under the admission lock for
    /// client puts and commits; deliveries from links, events and result messages do not
    /// take it and may overfill a queue a little). A message is never queued in some places
    /// and refused in others.
    fn push(&self, message: Message, targets: Targets<'_>, now: Instant) -> Result<(), (ErrorCode, String)> {
        // The last target gets the message itself; those before, copies.
        let mut left = targets.local.len() + targets.remote.len();
        let mut message = Some(message);
        let mut take = || {
            left -= 1;
            if left == 0 { message.take() } else { message.clone() }
        };
        let moved = "the message is moved out at the last target only";
        for queue in targets.local {
            queue.push_bounded(take().expect(moved), now, u64::MAX).map_err(|e| queue_error(&e))?;
        }
        for (link, picked) in targets.remote {
            link.enqueue_checked(addressed_to_picked(take().expect(moved), &picked), now);
        }
        Ok(())
    }

    /// Checks a content put inside a transaction and makes it a message of this node; it
    /// is queued only when the transaction commits.
    ///
    /// # Errors
    /// Why the content is refused (as for a put).
    pub fn prepare_in_transaction(
        &self,
        content: Content,
        created_unix_ms: u64,
    ) -> Result<Message, (ErrorCode, String)> {
        self.check_content(&content)?;
        Ok(self.stamp(content, created_unix_ms))
    }

    /// Commits the puts of a transaction: all of `messages` are queued, or none. When some
    /// destination lacks room, waits up to `timeout` for room for all of them together.
    /// Their lifetimes count from now.
    ///
    /// `gets` are the transaction's own gets (queue, tags): they are acknowledged in the same
    /// step, so the room they leave counts as free for the puts.
    ///
    /// # Errors
    /// [`CommitError::Refused`]: nothing was queued (no room within the timeout, more puts
    /// for a queue than it ever holds, no route, too large, too many results pending);
    /// [`CommitError::Partly`]: the store failed while queueing, after some were queued
    /// (the store's atomic batches come with the storage work).
    pub async fn commit(
        &self,
        messages: Vec<Message>,
        gets: &[(Arc<LocalQueue>, Vec<u64>)],
        timeout: std::time::Duration,
    ) -> Result<(), CommitError> {
        // Undone if the commit fails, or is abandoned while it waits.
        let mut tracking = self.track(&messages).map_err(CommitError::Refused)?;
        // Known before the puts move into their queues.
        let count = messages.len();
        let persistent_puts = self.disk_room_for(&messages).map_err(CommitError::Refused)?;
        let credit: Vec<(&Arc<LocalQueue>, usize)> = gets.iter().map(|(q, tags)| (q, tags.len())).collect();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            let targets = messages
                .iter()
                .map(|m| self.targets(m))
                .collect::<Result<Vec<_>, _>>()
                .map_err(CommitError::Refused)?;
            let refs: Vec<(&Message, &Targets<'_>)> = messages.iter().zip(&targets).collect();
            let admission = self.admission.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match self.check_room(&refs, &credit, None) {
                Ok(_) => {
                    let now = Instant::now();
                    // The puts and the gets' acknowledgements reach the store as one batch:
                    // a crash keeps all of the commit or none of it.
                    let hold = self.committer.hold();
                    // Each put moves into its queues (no copy); what is needed of it after is
                    // kept here: its number and its recipients on this node.
                    let mut queued = Vec::with_capacity(count);
                    for (message, targets) in messages.into_iter().zip(targets) {
                        let (sequence, here) = (message.id.sequence, self.results_here(&message));
                        if let Err((_, e)) = self.push(message, targets, now) {
                            drop(admission);
                            // Those queued stay tracked (the one that failed may be in some
                            // of its queues: its results are not followed).
                            let done = queued.len();
                            tracking.keep_these(queued.iter().map(|(sequence, _)| *sequence));
                            queued.into_iter().for_each(|(_, here)| self.delivered_here(here));
                            return Err(CommitError::Partly(format!(
                                "{done} of {count} puts were queued, then: {e}"
                            )));
                        }
                        queued.push((sequence, here));
                    }
                    // The gets leave in the same section, so the room they made is not
                    // counted twice.
                    let acked = gets.iter().try_for_each(|(queue, tags)| {
                        queue
                            .ack(tags)
                            .map(|_| ())
                            .map_err(|e| format!("queue '{}': {e}", queue.config().name))
                    });
                    // Their results are kept from here, in the same store batch.
                    tracking.keep();
                    drop(hold);
                    drop(admission);
                    queued.into_iter().for_each(|(_, here)| self.delivered_here(here));
                    // Stored puts, and the acknowledged gets' deletes, are durable first.
                    let persistent = persistent_puts || (!gets.is_empty() && self.store.durable());
                    self.make_durable(persistent).await.map_err(CommitError::Partly)?;
                    return acked.map_err(|e| {
                        CommitError::Partly(format!(
                            "the puts were queued, but the gets were not acknowledged: {e}"
                        ))
                    });
                }
                Err((ErrorCode::Full, reason)) => {
                    drop(admission);
                    let waited = self.wait_for_room(room.as_mut(), deadline).await.map_err(|stopping| {
                        CommitError::Refused((
                            ErrorCode::Internal,
                            format!("{reason}; {stopping}, not committed"),
                        ))
                    })?;
                    if !waited {
                        let reason = format!("{reason}; no room for the transaction within {timeout:?}");
                        return Err(CommitError::Refused((ErrorCode::Full, reason)));
                    }
                }
                Err(e) => return Err(CommitError::Refused(e)),
            }
        }
    }

    /// Delivers a message that arrived on a link to its recipients on this node; what cannot
    /// be delivered goes to the dead-letter queue with the reason.
    ///
    /// # Errors
    /// When the dead-letter queue has no room for what must go there (or the store fails):
    /// nothing was queued then, so the caller may leave the message unacknowledged and take
    /// it again later without a duplicate.
    pub fn deliver(&self, message: Message, now: Instant) -> Result<(), QueueError> {
        self.deliver_with(message, now, Batch::new())
    }

    /// Whether a message that arrived over a link may join a delivery run (see
    /// [`NodeState::deliver_run`]): volatile (nothing to record), wanting no results, not
    /// one of the node's own system messages.
    pub fn may_run(message: &Message) -> bool {
        message.content.reliability == Reliability::Volatile
            && !message.content.results
            && !message.content.priority.is_system()
    }

    /// Whether `b` may join the delivery run `a` started: the same recipients, as many hops,
    /// the same transmission class (a relayed run's room is checked in one class).
    pub fn runs_with(a: &Message, b: &Message) -> bool {
        a.hop_count == b.hop_count
            && a.content.recipients == b.content.recipients
            && LinkHandle::same_class(a, b)
    }

    /// Delivers a run of messages that arrived over a link ([`NodeState::may_run`], each
    /// [`NodeState::runs_with`] the first) at once, when their recipients are on one node
    /// and they go to one place with room for all of them: one local queue, or the link
    /// towards that node (a relay). Says whether
    /// it did (`messages` is empty then); otherwise nothing was delivered, and each goes
    /// through [`NodeState::deliver_with`], which finds each its place or dead letter.
    pub fn deliver_run(&self, messages: &mut Vec<Message>, now: Instant) -> bool {
        let Some(first) = messages.first() else { return true };
        let (count, recipients) = (messages.len(), &first.content.recipients);
        let Some(to) = recipients.first() else { return false };
        if recipients.iter().any(|r| r.node != to.node || (r.node == *self.name() && r.queue != to.queue)) {
            return false;
        }
        if &to.node == self.name() {
            let Some(queue) = self.queues.get(&to.queue) else { return false };
            let max = queue.config().message_bytes_max;
            if messages.iter().any(|m| m.content.payload.len() as u64 > max) || !queue.has_room(count) {
                return false;
            }
            queue.push_run(messages.drain(..), now);
            return true;
        }
        if u64::from(first.hop_count) >= self.config.messages.hop_count_max {
            return false;
        }
        let Ok(link) = self.link_towards(&to.node) else { return false };
        let bytes: usize = messages.iter().map(encoded_len).sum();
        if !link.has_room_for_many(first, count, bytes as u64) {
            return false;
        }
        let onwards = messages.drain(..).map(|mut m| {
            m.hop_count = m.hop_count.saturating_add(1);
            m
        });
        link.enqueue_checked_run(onwards, now);
        true
    }

    /// Like [`NodeState::deliver`], writing `with` (a link's record of what it delivered) in
    /// the same store batch as the message's first queue, or on its own after it.
    ///
    /// # Errors
    /// As [`NodeState::deliver`] (nothing was written then, `with` included).
    pub fn deliver_with(
        &self,
        mut message: Message,
        now: Instant,
        mut with: Batch,
    ) -> Result<(), QueueError> {
        // Origins resolve it; one that did not gets it resolved here.
        message.content.reliability = self.reliability_of(&message.content);
        if is_result_message(&message) && message.content.recipients.iter().any(|to| &to.node == self.name())
        {
            self.take_results(&message);
            self.committer.write(with);
            return Ok(());
        }
        let targets = self.delivery_targets(&message);
        if is_probe(&message) && !targets.is_empty() {
            return self.answer_probe(&message, &targets, with);
        }
        let forwards = self.forward_targets(&message);
        // An event message that cannot be stored is dropped: events never hold a link up.
        let event = message.content.kind == linkbus_plugin_api::Kind::Event;
        let dead =
            targets.iter().filter(|t| t.is_err()).count() + forwards.iter().filter(|f| f.is_err()).count();
        if !event {
            self.dead_letter_room(dead)?;
        }
        // Room was checked everywhere: push past the limits rather than deliver partly.
        // (A message of this node that came back over a link reports nothing from here.)
        let result_to = ResultTo::of(&message).filter(|to| &to.id.source != self.name());
        // Outcomes to report (only where somebody asked for results).
        let mut delivered = Vec::new();
        // Every copy (local queues, dead letters, relayed copies' records) and the link's
        // record reach the store as one batch: a crash keeps all or none of them. The record
        // also goes with the last write, so even a store that split the batch would make the
        // peer resend (a duplicate), never lose one. (Volatile messages write nothing here.)
        let persistent = message.content.reliability == Reliability::Persistent;
        let hold = (persistent && self.store.durable()).then(|| self.committer.hold());
        let last = (targets.len() + forwards.len()).saturating_sub(1);
        let forwards = forwards.into_iter().map(|f| f.map(|(link, to)| Target::Forward(link, to)));
        let all = targets.into_iter().map(|t| t.map(Target::Local)).chain(forwards);
        let id = message.id.clone();
        // The last target that needs the message itself gets it; those before, copies.
        let mut message = Some(message);
        for (index, target) in all.enumerate() {
            let with_this = if index == last { std::mem::take(&mut with) } else { Batch::new() };
            let mut this = || if index == last { message.take() } else { message.clone() };
            match target {
                Ok(Target::Forward(link, recipients)) => {
                    let this = this().expect("the message is moved out at the last target only");
                    let mut copy = addressed_to_picked(this, &recipients);
                    copy.hop_count = copy.hop_count.saturating_add(1);
                    if let Some(unused) = link.enqueue_with(copy, now, with_this) {
                        self.committer.write(unused);
                    }
                }
                Ok(Target::Local(queue)) => {
                    let this = this().expect("the message is moved out at the last target only");
                    queue.push_bounded_with(this, now, u64::MAX, with_this)?;
                    if result_to.is_none() {
                        continue;
                    }
                    delivered.push((
                        Address::new(self.name().clone(), queue.config().name.clone()),
                        Outcome::Delivered,
                    ));
                }
                Err((code, reason, failed)) if event => {
                    self.event_copy_dropped(&id.source, &failed, code, &reason);
                    self.committer.write(with_this);
                }
                Err((code, reason, failed)) => {
                    let this = this().expect("the message is moved out at the last target only");
                    self.dead_letter_with(
                        this,
                        DeadLetter { code, reason: &reason, failed },
                        now,
                        u64::MAX,
                        with_this,
                    )?;
                }
            }
        }
        self.report(result_to.as_ref(), delivered);
        self.committer.write(with);
        drop(hold);
        Ok(())
    }

    /// Where an arriving message goes on this node: each distinct local recipient's queue,
    /// or why it cannot go there (dead-letter code, reason, the recipients concerned).
    fn delivery_targets(&self, message: &Message) -> SmallVec<[Result<&Arc<LocalQueue>, Failed>; 1]> {
        let mut targets = SmallVec::new();
        let mut seen: SmallVec<[&QueueName; 2]> = SmallVec::new();
        for to in message.content.recipients.iter().filter(|to| &to.node == self.name()) {
            // A queue named twice among the recipients still gets one copy.
            if seen.contains(&&to.queue) {
                continue;
            }
            seen.push(&to.queue);
            let failed = |code, reason: String| Err((code, reason, vec![to.clone()]));
            targets.push(match self.queues.get(&to.queue) {
                None => failed(
                    DeadLetterCode::QueueMissing,
                    format!("queue '{}' does not exist on node {}", to.queue, to.node),
                ),
                Some(q) if message.content.payload.len() as u64 > q.config().message_bytes_max => failed(
                    DeadLetterCode::TooLarge,
                    format!("payload is over queue {to}'s message_bytes_max"),
                ),
                Some(q) if !q.has_room(1) => failed(DeadLetterCode::QueueFull, format!("queue {to} is full")),
                Some(q) => Ok(q),
            });
        }
        targets
    }

    /// Where an arriving message goes on from this node (a relay): each next hop with the
    /// recipients routed through it (it gets a copy naming them, its hop count raised) — or
    /// why those recipients cannot be reached (no route, the hop limit, a full transmission
    /// queue).
    fn forward_targets(&self, message: &Message) -> SmallVec<[Group<'_>; 1]> {
        let mut groups = SmallVec::new();
        let all = &message.content.recipients;
        for (index, to) in all.iter().enumerate().filter(|(_, to)| &to.node != self.name()) {
            if u64::from(message.hop_count) >= self.config.messages.hop_count_max {
                let reason = format!(
                    "it passed {} relays, the most allowed (messages.hop_count_max on {}): a routing loop?",
                    message.hop_count,
                    self.name()
                );
                push_failed(&mut groups, DeadLetterCode::HopLimit, reason, to);
                continue;
            }
            match self.link_towards(&to.node) {
                Ok(link) => match groups.iter_mut().find(|g| matches!(g, Ok((l, _)) if Arc::ptr_eq(l, link)))
                {
                    Some(Ok((_, picked))) => picked.push(index),
                    _ => groups.push(Ok((link, smallvec::smallvec![index]))),
                },
                Err(reason) => push_failed(&mut groups, DeadLetterCode::NoRoute, reason, to),
            }
        }
        let others = encoded_len_without_recipients(message);
        groups
            .into_iter()
            .map(|group| {
                let (link, picked) = group?;
                // The copy for this link names only the recipients routed through it.
                let bytes = others + picked_encoded_len(all, &picked);
                if !link.has_room_for_many(message, 1, bytes as u64) {
                    let reason = format!(
                        "the transmission queue to {} is full ({})",
                        link.peer.name,
                        link.fill(message)
                    );
                    return Err((
                        DeadLetterCode::QueueFull,
                        reason,
                        picked_from(all, &picked).cloned().collect(),
                    ));
                }
                Ok((link, picked))
            })
            .collect()
    }

    /// Raises an event: into the `EVENT` queue, and a copy to each queue subscribed to its
    /// kind. Never waits: a copy without room is dropped (counted in `events_dropped`).
    pub fn emit(&self, event: Event) {
        let now = Instant::now();
        let mut content = Content::buf(
            linkbus_plugin_api::Address {
                node: self.name().clone(),
                queue: QueueName::new(EVENT_QUEUE).expect("valid"),
            },
            event.text,
        )
        .with_priority(linkbus_plugin_api::Priority::SYSTEM)
        .with_reliability(Reliability::Volatile);
        content.kind = linkbus_plugin_api::Kind::Event;
        content.name = event.kind.as_str().to_owned();
        content.headers.push((EVENT_KIND_HEADER.into(), event.kind.as_str().into()));
        for (key, value) in event.fields {
            content.headers.push((format!("linkbus.{key}"), value));
        }
        let subscribers = self.subscriptions.targets(event.kind);
        // One message per destination, so a full one never holds back the others.
        let targets: Vec<linkbus_plugin_api::Address> =
            content.recipients.iter().cloned().chain(subscribers).collect();
        for to in targets {
            let mut copy = content.clone();
            copy.recipients = smallvec::smallvec![to.clone()];
            // The node's own message: system priority allowed, only its fields checked.
            if copy.validate().is_err() {
                self.events_dropped.count_one();
                continue;
            }
            let message = self.stamp(copy, crate::clock::unix_ms());
            if &to.node == self.name()
                && to.queue.as_str() == EVENT_QUEUE
                && let Some(events) = self.queues.get(EVENT_QUEUE)
            {
                // A log: followers read it without taking, so the oldest make room.
                for _ in 0..events.drop_oldest_for(1) {
                    self.events_dropped.count_one();
                }
            }
            if let Err((code, reason)) = self.dispatch_own(message, now) {
                self.events_dropped.count_one();
                let code = if code == ErrorCode::NoRoute { "no_route" } else { "not_sent" };
                self.events_dropped.count(self.name(), &to, code, &reason);
                tracing::debug!(kind = %event.kind, reason, "Event copy dropped.");
            }
        }
    }

    /// Whether `messages` hold a persistent one, when the disk has room for them (see
    /// [`crate::disk`]).
    ///
    /// # Errors
    /// `Busy`, with why, when the node is short of room for a persistent one.
    fn disk_room_for(&self, messages: &[Message]) -> Result<bool, (ErrorCode, String)> {
        let persistent = messages.iter().any(|m| m.content.reliability == Reliability::Persistent);
        if persistent {
            let bytes = messages.iter().map(|m| m.content.payload.len() as u64).sum();
            self.disk.admit(bytes).map_err(|reason| (ErrorCode::Busy, reason))?;
        }
        Ok(persistent)
    }

    /// Counts (per origin and queue, for `linkbus status`) and logs, aggregated, an event
    /// copy that could not be stored here or sent on: events never hold a link up, so it is
    /// dropped, but never silently.
    fn event_copy_dropped(&self, origin: &NodeName, failed: &[Address], code: DeadLetterCode, reason: &str) {
        self.events_dropped.count_one();
        for to in failed {
            self.events_dropped.count(origin, to, code.as_str(), reason);
        }
        if self.warnings.admit(crate::warnings::reason::EVENT_COPY_DROPPED) {
            warn!(from = %origin, code = code.as_str(), reason, "Event copy dropped.");
        }
    }

    /// Subscribes queue `to` to events of `kinds` for a client (replacing the kinds of its
    /// earlier subscription); kept in the store.
    ///
    /// # Errors
    /// When `to` is not a queue here or on a peer, is this node's `EVENT` queue, is
    /// subscribed by the configuration, or the store fails.
    pub async fn subscribe(&self, to: &Address, kinds: &[EventKind]) -> Result<(), (ErrorCode, String)> {
        if kinds.is_empty() {
            return Err((ErrorCode::Invalid, "no event kinds given".into()));
        }
        subscription_target(
            self.name(),
            to,
            |q| self.queues.contains_key(q),
            |n| self.link_towards(n).is_ok(),
        )?;
        // Invariant: the store is written by its own thread only; the list's lock is not
        // held while the write is synced, so events never wait for it.
        let _one_at_a_time = self.subscriptions.changes().lock().await;
        let (batch, kinds) =
            self.subscriptions.plan_subscribe(to, kinds).map_err(|e| (ErrorCode::Invalid, e))?;
        self.write_synced(batch).await?;
        self.subscriptions.apply_subscribe(to, kinds);
        Ok(())
    }

    /// Ends the client subscription of `to`; kept in the store.
    ///
    /// # Errors
    /// When there is none, the configuration declares it, or the store fails.
    pub async fn unsubscribe(&self, to: &Address) -> Result<(), (ErrorCode, String)> {
        let _one_at_a_time = self.subscriptions.changes().lock().await;
        let batch = self.subscriptions.plan_unsubscribe(to).map_err(|e| (ErrorCode::Invalid, e))?;
        self.write_synced(batch).await?;
        self.subscriptions.apply_unsubscribe(to);
        Ok(())
    }

    /// Hands `batch` to the store thread and waits for the sync that covers it.
    async fn write_synced(&self, batch: Batch) -> Result<(), (ErrorCode, String)> {
        self.committer.write(batch);
        self.committer.sync().await.map_err(|e| (ErrorCode::Internal, format!("store: {e}")))
    }

    /// Whether the dead-letter queue has room for `copies` more messages.
    ///
    /// # Errors
    /// [`QueueError::Full`] when it has not.
    fn dead_letter_room(&self, copies: usize) -> Result<(), QueueError> {
        if copies == 0 {
            return Ok(());
        }
        let dlq = self.dead_letter_queue();
        if dlq.has_room(copies) {
            return Ok(());
        }
        let max = dlq.config().queue_messages_max;
        Err(QueueError::Full { queue: dlq.config().name.clone(), max })
    }

    fn dead_letter_queue(&self) -> &Arc<LocalQueue> {
        self.queues.get(DEAD_LETTER_QUEUE).expect("the dead-letter queue always exists")
    }

    /// Puts `message` into the dead-letter queue, marked with why (see [`DeadLetter`]).
    ///
    /// # Errors
    /// When the dead-letter queue is full or the store fails.
    pub fn dead_letter(&self, message: Message, why: DeadLetter<'_>, now: Instant) -> Result<(), QueueError> {
        let max = self.dead_letter_queue().config().queue_messages_max;
        self.dead_letter_with(message, why, now, max, Batch::new())
    }

    fn dead_letter_with(
        &self,
        mut message: Message,
        why: DeadLetter<'_>,
        now: Instant,
        max: u64,
        with: Batch,
    ) -> Result<(), QueueError> {
        let DeadLetter { code, reason, failed } = why;
        let id = message.id.clone();
        let result_to = ResultTo::of(&message);
        // Reported for the recipients this node settles: its own, those it would have
        // relayed, or any of a message of its own.
        let outcomes = failed.iter().map(|to| (to.clone(), Outcome::failed(code.as_str(), reason))).collect();
        let event = message.content.kind == linkbus_plugin_api::Kind::Event;
        // Earlier dead-letter marks (a replayed message that failed again) make way.
        message.content.headers.retain(|(k, _)| !k.starts_with("linkbus.dead_letter_"));
        let failed: Vec<String> = failed.iter().map(ToString::to_string).collect();
        let marks = [
            (DEAD_LETTER_CODE_HEADER, code.as_str().to_owned()),
            (DEAD_LETTER_RECIPIENTS_HEADER, failed.join(",")),
            (DEAD_LETTER_REASON_HEADER, reason.to_owned()),
        ];
        for (key, mut value) in marks {
            if message.content.headers.len() >= linkbus_plugin_api::message::HEADERS_MAX {
                break;
            }
            let mut cut = value.len().min(linkbus_plugin_api::message::HEADER_VALUE_BYTES_MAX);
            while !value.is_char_boundary(cut) {
                cut -= 1;
            }
            value.truncate(cut);
            message.content.headers.push((key.into(), value));
        }
        self.dead_letter_queue().push_bounded_with(message, now, max, with)?;
        if self.warnings.admit(crate::warnings::reason::DEAD_LETTER) {
            warn!(%id, code = code.as_str(), reason, "Message dead-lettered.");
        }
        self.report(result_to.as_ref(), outcomes);
        if !event {
            self.emit(
                Event::new(
                    EventKind::DeadLetter,
                    format!("message {id} dead-lettered ({}): {reason}", code.as_str()),
                )
                .with("id", &id)
                .with("code", code.as_str())
                .with("reason", reason),
            );
        }
        Ok(())
    }
}

/// Checks that `to` can take event copies from node `node`: a queue there (not `EVENT`),
/// or a peer's queue.
fn subscription_target(
    node: &NodeName,
    to: &Address,
    queue_exists: impl Fn(&QueueName) -> bool,
    reachable: impl Fn(&NodeName) -> bool,
) -> Result<(), (ErrorCode, String)> {
    if &to.node == node {
        if to.queue.as_str() == EVENT_QUEUE {
            return Err((ErrorCode::Invalid, format!("{to} already gets every event")));
        }
        if !queue_exists(&to.queue) {
            return Err((
                ErrorCode::UnknownQueue,
                format!("queue '{}' does not exist on node {}", to.queue, to.node),
            ));
        }
    } else if !reachable(&to.node) {
        return Err((
            ErrorCode::NoRoute,
            format!("no route to node '{}' (not a peer, and no route matches)", to.node),
        ));
    }
    Ok(())
}

/// Test-only (debug builds): answer persistent puts before the store has synced them — the
/// negative control of the durability tests, which must then see acknowledged messages lost
/// in a crash. Release builds ignore it.
pub const ACK_BEFORE_SYNC_ENV: &str = "LINKBUS_TEST_ACK_BEFORE_SYNC";

fn ack_before_sync() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| cfg!(debug_assertions) && std::env::var_os(ACK_BEFORE_SYNC_ENV).is_some())
}

/// One link handle per configured peer; `committer` when the store keeps anything.
fn link_handles(
    config: &Config,
    committer: Option<Arc<crate::storage::Committer>>,
    room: &Arc<tokio::sync::Notify>,
) -> ByName<NodeName, Arc<LinkHandle>> {
    let class = (config.links.queue_messages_max, config.links.queue_bytes_max);
    let share = u8::try_from(config.links.forward_share).unwrap_or(50);
    let handle = |p: &crate::config::PeerConfig| {
        Arc::new(LinkHandle::new(p.clone(), class, share, room.clone(), committer.clone()))
    };
    config.peers.iter().map(|p| (p.name.clone(), handle(p))).collect()
}

/// Room on the disk for a store that keeps anything (a memory store needs none).
fn disk_room(config: &Config, store: &dyn Store) -> crate::disk::DiskRoom {
    let min = if store.durable() { config.node.data_free_bytes_min } else { 0 };
    crate::disk::DiskRoom::new(config.node.data_dir.clone(), min)
}

/// Whether `message` is a result message from another node (only nodes send the system
/// priority).
fn is_result_message(message: &Message) -> bool {
    message.content.kind == linkbus_plugin_api::Kind::Event
        && message.content.priority.is_system()
        && message.content.name == RESULT_MESSAGE_NAME
        && message.content.header(RESULT_FOR_HEADER).is_some()
        && message.content.recipients.iter().all(|to| to.queue.as_str() == EVENT_QUEUE)
}

/// The `result` event for one outcome of message `id`.
fn result_event(id: &MessageId, recipient: &Address, outcome: &Outcome) -> Event {
    let mut event = Event::new(EventKind::Result, format!("message {id} to {recipient}: {outcome}"))
        .with("id", id)
        .with("recipient", recipient)
        .with("result", outcome.as_str());
    if let Outcome::Failed { code, reason } = outcome {
        event = event.with("code", code).with("reason", reason);
    }
    event
}

/// Messages of one put admitted together at most (see [`NodeState::put_runs`]): enough to
/// take the per-message checks and locks off a batch, few enough that other puts wait
/// little for the admission lock.
const RUN_MESSAGES_MAX: usize = 256;

/// Payload bytes a run (of a put, or of deliveries from a link) gathers at most before it
/// ends: a run's room is checked once, and a class with no bytes takes any size, so this
/// bounds how far a run can go past a class's byte bound or its pace (see `PACE_WAIT`)
/// where single messages would have stopped after the first.
pub const RUN_BYTES_MAX: usize = 256 << 10;

/// Whether `b` goes the way `a` goes: to the same recipients, in the same transmission
/// class, neither wanting results (tracked one message at a time).
fn same_way(a: &Message, b: &Message) -> bool {
    !a.content.results
        && !b.content.results
        && a.content.recipients == b.content.recipients
        && LinkHandle::same_class(a, b)
}

/// A put under way: its limits, and what it accepted so far.
struct OnePut {
    timeout: std::time::Duration,
    deadline: tokio::time::Instant,
    /// When the messages arrived (read again after a wait).
    now: Instant,
    pace_bytes: u64,
    /// Until when a put keeps pace with a busy link (none for one that may not wait).
    pace_until: Option<tokio::time::Instant>,
    /// The accepted messages' sequence numbers, in order.
    sequences: Vec<u64>,
    /// Whether an accepted message is persistent.
    persistent: bool,
}

fn put_error(index: usize, (code, message): (ErrorCode, String)) -> PutError {
    PutError { code, accepted: index as u32, message: format!("message {}: {message}", index + 1) }
}

/// What `planned` puts in each place: per local queue how many messages; per link and
/// transmission class a message of the class, how many and their bytes (each link's copy
/// names only the recipients routed through it). Refuses a message larger than a peer
/// takes.
fn tally<'a, 't: 'a>(
    planned: &[(&'a Message, &'a Targets<'t>)],
) -> Result<(LocalTally<'a>, RemoteTally<'a>), (ErrorCode, String)> {
    let (mut local, mut remote): (LocalTally<'a>, RemoteTally<'a>) = (SmallVec::new(), SmallVec::new());
    for (message, targets) in planned {
        for queue in &targets.local {
            match local.iter_mut().find(|(q, _)| Arc::ptr_eq(q, queue)) {
                Some((_, n)) => *n += 1,
                None => local.push((queue, 1)),
            }
        }
        let others = encoded_len_without_recipients(message);
        let all = &message.content.recipients;
        for (link, picked) in &targets.remote {
            // The copy for this link names only the recipients routed through it.
            let encoded = others + picked_encoded_len(all, picked);
            let max = link.peer_message_bytes_max.load(std::sync::atomic::Ordering::Relaxed);
            if max != 0 && encoded > max {
                let msg =
                    format!("message of {encoded} bytes is larger than node {} accepts", link.peer.name);
                return Err((ErrorCode::TooLarge, msg));
            }
            match remote
                .iter_mut()
                .find(|(l, m, _, _)| Arc::ptr_eq(l, link) && LinkHandle::same_class(m, message))
            {
                Some((_, _, n, bytes)) => {
                    *n += 1;
                    *bytes += encoded as u64;
                }
                None => remote.push((link, message, 1, encoded as u64)),
            }
        }
    }
    Ok((local, remote))
}

/// Per local queue: how many messages.
type LocalTally<'a> = SmallVec<[(&'a Arc<LocalQueue>, usize); 2]>;
/// Per link and transmission class: a message of the class, how many, and their bytes.
type RemoteTally<'a> = SmallVec<[(&'a Arc<LinkHandle>, &'a Message, usize, u64); 2]>;

fn queue_error(e: &QueueError) -> (ErrorCode, String) {
    match e {
        QueueError::Full { .. } => (ErrorCode::Full, e.to_string()),
        QueueError::Store(_) => (ErrorCode::Internal, e.to_string()),
    }
}

#[cfg(test)]
mod tests;
