//! The node's shared state: its configuration, plugins, queues, links, routing, results and
//! events, behind narrow methods. The path a message takes through it is in
//! [`crate::flow`]; building it is in `start`, stopping in `lifecycle`, reloading in
//! `reload`, and the events and results glue in `events` and `results`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use linkbus_plugin_api::{Content, NodeName, QueueName, Reliability, Store, Transport};

use crate::ByName;
use crate::config::Config;
use crate::events::Subscriptions;
use crate::flow::StageFactory;
use crate::flow::origin::Admission;
use crate::link::LinkHandle;
use crate::queue::LocalQueue;
use crate::results::ResultBook;

mod events;
mod lifecycle;
pub(crate) mod probe;
mod reload;
mod results;
mod start;
#[cfg(test)]
pub(crate) mod testing;

pub use probe::{PROBE_NAME, Probe};
pub use reload::ReloadSource;
pub use start::StartError;

/// The state shared by every task of one node.
pub struct NodeState {
    /// The configuration the node runs with.
    config: Config,
    /// Random id of this run's state (a memory store forgets everything on restart).
    incarnation: u64,
    /// Whether the incarnation is that of the last run (a durable store): what links sent
    /// then is taken up.
    incarnation_kept: bool,
    /// Random id of this process run (told to peers, so they drop a dead old connection).
    run: u64,
    /// Where queues live.
    store: Arc<dyn Store>,
    /// The transport links use.
    transport: Arc<dyn Transport>,
    /// Local queues, the node's own included.
    queues: ByName<QueueName, Arc<LocalQueue>>,
    /// The dead-letter queue (also in `queues`).
    dead_letters: Arc<LocalQueue>,
    /// This node's `EVENT` queue.
    event_queue: linkbus_plugin_api::Address,
    /// One link per configured peer.
    links: ByName<NodeName, Arc<LinkHandle>>,
    /// Which link a message to another node takes.
    routing: crate::routing::Routing,
    /// Link security: mode, keys, replay check.
    security: crate::security::Security,
    /// Next per-source message sequence number.
    next_sequence: AtomicU64,
    /// Room for client puts and commits.
    admission: Admission,
    /// Event copies dropped because their queue or link had no room.
    /// (In all, and per node that raised them and queue they were for.)
    events_dropped: crate::events::DroppedCopies,
    /// The results of this node's messages that asked for them.
    results: ResultBook,
    /// Result messages to other nodes dropped because their way had no room.
    results_dropped: AtomicU64,
    /// Queues that get copies of events: from the configuration and from clients.
    subscriptions: Subscriptions,
    /// The store thread: queues' writes in order, group commit.
    committer: Arc<crate::storage::Committer>,
    /// Large message buffers kept for use again (`links.recycled_bytes_max`), for every
    /// link's session.
    recycler: Arc<linkbus_proto::recycle::Recycler>,
    /// Why the node must stop (a store failure), once it must.
    failure: Arc<crate::storage::Failure>,
    /// Where the configuration came from, for reloads (set by `linkbus node run`).
    reload_source: std::sync::OnceLock<ReloadSource>,
    /// Held while a reload reads and applies the configuration.
    reloading: std::sync::Mutex<()>,
    /// The durability tests' negative control (see `crate::faults`).
    ack_before_sync: std::sync::atomic::AtomicBool,
    /// When [`crate::Node::shutdown`] began (see [`NodeState::stop`]).
    stopped_at: std::sync::OnceLock<tokio::time::Instant>,
    /// Wakes what waits for others (gets, results) when the node stops.
    stop_signal: tokio::sync::Notify,
    /// Repeated warnings, aggregated per reason (`log:`).
    warnings: crate::warnings::Warnings,
    /// Room on the disk (`node.data_free_bytes_min`): persistent messages wait for it.
    disk: crate::disk::DiskRoom,
    /// What builds the stages on messages' way (see [`crate::flow::stages`]).
    stages: Vec<Arc<dyn StageFactory>>,
    /// The configured codecs, which undo what messages record (see [`crate::flow::codecs`]).
    codecs: crate::flow::codecs::Codecs,
    /// The running user filters (see [`crate::flow::filters`]).
    filters: Arc<crate::flow::filters::Filters>,
    /// The files directory and the transfers (see [`crate::files`]).
    files: crate::files::Files,
}

impl std::fmt::Debug for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeState").field("name", &self.config.node.name).finish_non_exhaustive()
    }
}

impl NodeState {
    /// This node's name.
    pub fn name(&self) -> &NodeName {
        &self.config.node.name
    }

    /// The configuration the node runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// This run's state's id, and whether it is the last run's (a durable store).
    pub(crate) fn incarnation(&self) -> (u64, bool) {
        (self.incarnation, self.incarnation_kept)
    }

    /// This process run's id.
    pub(crate) fn run_id(&self) -> u64 {
        self.run
    }

    /// The files directory and the file transfers.
    pub fn files(&self) -> &crate::files::Files {
        &self.files
    }

    /// The store.
    pub(crate) fn store(&self) -> &dyn Store {
        self.store.as_ref()
    }

    /// The transport links use.
    pub(crate) fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// The local queue `name`.
    pub(crate) fn queue<Q>(&self, name: &Q) -> Option<&Arc<LocalQueue>>
    where
        QueueName: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.queues.get(name)
    }

    /// Every local queue.
    pub(crate) fn queues(&self) -> impl Iterator<Item = &Arc<LocalQueue>> {
        self.queues.values()
    }

    /// The dead-letter queue.
    pub(crate) fn dead_letters(&self) -> &Arc<LocalQueue> {
        &self.dead_letters
    }

    /// This node's `EVENT` queue.
    pub(crate) fn event_queue(&self) -> &linkbus_plugin_api::Address {
        &self.event_queue
    }

    /// The link to peer `name`.
    pub(crate) fn link<Q>(&self, name: &Q) -> Option<&Arc<LinkHandle>>
    where
        NodeName: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.links.get(name)
    }

    /// Every link.
    pub(crate) fn links(&self) -> impl Iterator<Item = &Arc<LinkHandle>> {
        self.links.values()
    }

    /// Whether every link is established.
    pub fn links_up(&self) -> bool {
        self.links.values().all(|l| l.up.load(Ordering::Relaxed))
    }

    /// Which link a message to another node takes.
    pub(crate) fn routing(&self) -> &crate::routing::Routing {
        &self.routing
    }

    /// Link security.
    pub(crate) fn security(&self) -> &crate::security::Security {
        &self.security
    }

    /// Room for client puts and commits.
    pub(crate) fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Event copies dropped.
    pub(crate) fn events_dropped(&self) -> &crate::events::DroppedCopies {
        &self.events_dropped
    }

    /// The results of this node's messages.
    pub(crate) fn results(&self) -> &ResultBook {
        &self.results
    }

    /// Result messages to other nodes dropped so far.
    pub(crate) fn results_dropped(&self) -> u64 {
        self.results_dropped.load(Ordering::Relaxed)
    }

    /// Counts a result message to another node dropped.
    pub(crate) fn count_result_dropped(&self) {
        self.results_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Queues that get copies of events.
    pub(crate) fn subscriptions(&self) -> &Subscriptions {
        &self.subscriptions
    }

    /// The store thread.
    pub(crate) fn committer(&self) -> &Arc<crate::storage::Committer> {
        &self.committer
    }

    /// What the store thread did so far (writes, batches, syncs).
    pub fn store_stats(&self) -> &crate::storage::CommitStats {
        &self.committer.stats
    }

    /// Message buffers kept for use again.
    pub(crate) fn recycler(&self) -> &Arc<linkbus_proto::recycle::Recycler> {
        &self.recycler
    }

    /// Repeated warnings, aggregated per reason.
    pub(crate) fn warnings(&self) -> &crate::warnings::Warnings {
        &self.warnings
    }

    /// Room on the disk.
    pub(crate) fn disk(&self) -> &crate::disk::DiskRoom {
        &self.disk
    }

    /// What builds the stages on messages' way.
    pub(crate) fn stage_factories(&self) -> &[Arc<dyn StageFactory>] {
        &self.stages
    }

    /// The configured codecs.
    pub(crate) fn codecs(&self) -> &crate::flow::codecs::Codecs {
        &self.codecs
    }

    /// The running user filters.
    pub(crate) fn filters(&self) -> &crate::flow::filters::Filters {
        &self.filters
    }

    /// The next sequence number of a message of this node.
    pub(crate) fn next_sequence(&self) -> u64 {
        self.next_sequence.fetch_add(1, Ordering::Relaxed)
    }

    /// Notes where the configuration came from, for reloads (once).
    pub fn set_reload_source(&self, source: ReloadSource) {
        let _ = self.reload_source.set(source);
    }

    /// The client socket path.
    pub fn socket_path(&self) -> PathBuf {
        self.config
            .node
            .client_socket
            .clone()
            .unwrap_or_else(|| linkbus_client::runtime_dir::socket_for(self.name().as_str()))
    }

    /// Longest encoded message this node accepts, from a client or a link: the payload
    /// limit plus room for the largest envelope.
    pub fn encoded_message_bytes_max(&self) -> usize {
        usize::try_from(self.config.messages.message_bytes_max + crate::config::ENVELOPE_BYTES_MAX)
            .unwrap_or(usize::MAX)
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
}

#[cfg(test)]
mod tests;
