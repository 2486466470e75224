//! Building a node's state: its plugins, incarnation, queues, links and result book, and
//! what an earlier run left (queues, what links were sending, results waited for).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use linkbus_plugin_api::registry::{BuildContext, Builder};
use linkbus_plugin_api::{
    Address, Batch, Lifetime, NodeName, PluginError, QueueName, Store, StoreError, Transport,
};

use super::NodeState;
use crate::ByName;
use crate::config::{Config, QueueConfig, QueueOrder, WhenFull};
use crate::events::Subscriptions;
use crate::flow::StageFactory;
use crate::flow::dead_letter::DEAD_LETTER_QUEUE;
use crate::link::LinkHandle;
use crate::queue::{EVENT_QUEUE, LocalQueue};
use crate::results::ResultBook;

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
    /// A native plugin library named in the configuration could not be loaded or checked.
    #[error(transparent)]
    Libraries(linkbus_plugin_api::ConfigErrors),
    /// A node task ended while the node was running.
    #[error("node task failed: {0}")]
    TaskFailed(String),
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
        name: QueueName::new(name).expect("the node's own queue names are valid"),
        order: QueueOrder::Fifo,
        queue_messages_max: max,
        message_bytes_max: config.messages.message_bytes_max,
        reliability: linkbus_plugin_api::Reliability::Volatile,
        when_full: WhenFull::Block,
        backout_threshold: None,
        backout_queue: None,
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
pub(super) fn keep_recipients_routed_through(
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

/// The plugins a node is built from.
type Plugins = (Arc<dyn Transport>, Arc<dyn Store>);

/// Builds the transport and the store, loading the native libraries the configuration
/// names first (a configuration from [`crate::config::load_file`] has them loaded already).
pub(super) fn build_plugins(config: &mut Config) -> Result<Plugins, StartError> {
    config.load_libraries().map_err(StartError::Libraries)?;
    let ctx = BuildContext { node: config.node.name.clone(), data_dir: config.node.data_dir.clone() };
    let missing = |kind: &str| PluginError { plugin: kind.to_owned(), reason: "not registered".into() };
    let registry = &config.plugins.registry;
    let t = &config.plugins.transport;
    let transport = match registry.find("transport", &t.kind, t.library_path()).map(|p| &p.builder) {
        Some(Builder::Transport(build)) => Arc::from(build(&t.section, &ctx)?),
        _ => return Err(missing(&t.kind).into()),
    };
    let s = &config.plugins.store;
    let store = match registry.find("store", &s.kind, s.library_path()).map(|p| &p.builder) {
        Some(Builder::Store(build)) => Arc::from(build(&s.section, &ctx)?),
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
    pub fn new(mut config: Config) -> Result<Arc<Self>, StartError> {
        let (transport, store) = build_plugins(&mut config)?;
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
        Self::build(config, (transport, store), Vec::new())
    }

    /// Like [`NodeState::new`], with `stages` acting on messages on their way (see
    /// [`crate::flow::stages`]).
    ///
    /// # Errors
    /// As [`NodeState::new`].
    pub fn with_stages(
        mut config: Config,
        stages: Vec<Arc<dyn StageFactory>>,
    ) -> Result<Arc<Self>, StartError> {
        let plugins = build_plugins(&mut config)?;
        Self::build(config, plugins, stages)
    }

    fn build(
        config: Config,
        (transport, store): Plugins,
        mut stages: Vec<Arc<dyn StageFactory>>,
    ) -> Result<Arc<Self>, StartError> {
        let security = crate::security::Security::load(&config)?;
        // The configured stages act after an embedder's (which see the payload as written):
        // the filters, then the codecs (which choose keys by the recipients filters set).
        let filters = crate::flow::filters::Filters::build(&config)?;
        stages.push(filters.stage());
        let codecs = crate::flow::codecs::Codecs::build(&config)?;
        stages.extend(codecs.stages());
        stages.extend(crate::faults::tamper_relayed());
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
        let event_queue = event_queue(&config)?;
        let dead_letters = queues.get(DEAD_LETTER_QUEUE).cloned().ok_or_else(|| StartError::Io {
            what: "the dead-letter queue".into(),
            source: std::io::Error::other("not opened"),
        })?;
        let links = link_handles(&config, store.durable().then(|| committer.clone()), &room);
        if incarnation_kept {
            restore_sending(&links, &routing, store.as_ref(), now)?;
        }
        let subscriptions = subscriptions(&config, store.as_ref(), &committer, &queues, &links, &routing)?;
        let (results, sequence_kept) = result_book(&config, store.as_ref(), &committer, now)?;
        let files = open_files(&config, store.as_ref())?;
        // Sequence numbers must not repeat across restarts of a node whose store forgets:
        // start from the clock (microsecond resolution leaves room for 1 M puts a second),
        // and above any kept in the store (the clock may have gone back).
        let next_sequence =
            AtomicU64::new(crate::clock::unix_ms().saturating_mul(1000).max(sequence_kept.saturating_add(1)));
        let recycled_bytes_max = usize::try_from(config.links.recycled_bytes_max).unwrap_or(usize::MAX);
        let recycler = Arc::new(linkbus_proto::recycle::Recycler::new(recycled_bytes_max));
        let node = Arc::new(Self {
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
            dead_letters,
            event_queue,
            links,
            routing,
            security,
            next_sequence,
            admission: crate::flow::origin::Admission::new(room),
            events_dropped: crate::events::DroppedCopies::default(),
            results,
            results_dropped: AtomicU64::new(0),
            subscriptions,
            committer,
            failure,
            reload_source: std::sync::OnceLock::new(),
            reloading: std::sync::Mutex::new(()),
            ack_before_sync: std::sync::atomic::AtomicBool::new(crate::faults::ack_before_sync()),
            stopped_at: std::sync::OnceLock::new(),
            stop_signal: tokio::sync::Notify::new(),
            stages,
            codecs,
            filters,
            files,
        });
        crate::flow::dead_letter::take_poison(&node);
        super::results::watch_groups(&node);
        Ok(node)
    }
}

/// This node's `EVENT` queue.
fn event_queue(config: &Config) -> Result<Address, StartError> {
    let queue = QueueName::new(EVENT_QUEUE).map_err(|e| StartError::Io {
        what: "the event queue".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(Address::new(config.node.name.clone(), queue))
}

/// The files directory and the transfers recorded in `store`.
fn open_files(config: &Config, store: &dyn Store) -> Result<crate::files::Files, StartError> {
    crate::files::Files::open(config, store)
        .map_err(|e| StartError::Io { what: "files".into(), source: std::io::Error::other(e) })
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

/// The event subscriptions, those whose queue cannot be reached any more forgotten (by the
/// store thread).
fn subscriptions(
    config: &Config,
    store: &dyn Store,
    committer: &crate::storage::Committer,
    queues: &ByName<QueueName, Arc<LocalQueue>>,
    links: &ByName<NodeName, Arc<LinkHandle>>,
    routing: &crate::routing::Routing,
) -> Result<Subscriptions, StartError> {
    let subscriptions = Subscriptions::load(&config.events.subscriptions, store)?;
    let forgotten =
        subscriptions.remove_unreachable(|to| {
            super::events::subscription_target(&config.node.name, to, |q| queues.contains_key(q), |n| {
            matches!(routing.next_hop(n), Ok(crate::routing::Hop::Via(via)) if links.contains_key(&via))
        })
        .map_err(|refusal| refusal.reason)
        });
    // Invariant: the store is written by its own thread only.
    committer.write(forgotten);
    committer.sync_blocking()?;
    Ok(subscriptions)
}
