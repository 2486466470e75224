//! The linkbus node runtime. The client library is `linkbus-client`; the `linkbus`
//! command, `linkbus bench` and `linkbus demo` are `linkbus-cli`.
//!
//! Modules (the map of the whole crate is in `docs/ARCHITECTURE.md`):
//! - [`config`]: the configuration tree, its defaults, and the one YAML reader.
//! - [`node`]: the node's shared state, its building, lifecycle, reload, events and results.
//! - [`flow`]: the path of a message, one pipeline per direction, and its stages.
//! - `queue`: local queues (FIFO or priority order, limits, expiry, write-through).
//! - [`results`]: per-recipient message results, tracked at the origin.
//! - [`link`]: one task per peer pumping a `linkbus_proto::Session` over the transport.
//! - `listener`: accepting links; the handshake pool.
//! - `api`: the Unix-socket server of the client protocol (`linkbus_client::protocol`).
//! - [`security`]: keys, the link security mode, and the handshake replay check.
//! - [`routing`]: which link a message to another node takes.
//! - [`storage`]: group commit (one store sync for many writers).
//! - [`events`]: event kinds and subscriptions.
//! - `clock`, `disk`, `warnings`, `faults`, `segmented`: the wall clock, room on the disk,
//!   aggregated warnings, test-only fault switches, segmented queues.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod api;
mod clock;
pub mod config;
mod disk;
pub mod events;
mod faults;
pub mod files;
pub mod flow;
pub mod link;
mod listener;
pub mod node;
pub mod queue;
pub mod results;
pub mod routing;
pub mod security;
mod segmented;
pub mod storage;
mod warnings;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::info;

/// A map keyed by names from the configuration (queues, peers): hashed with a fast
/// hasher, as only the configuration chooses its keys (looking up a name a peer or
/// client sent only probes it).
pub type ByName<K, V> = std::collections::HashMap<K, V, rustc_hash::FxBuildHasher>;

pub use config::Config;
pub use flow::{Refusal, RefusalCode, Stage, StageFactory};
pub use linkbus_client::{Client, ClientError, Consumer, Delivery, NodeLimits};
pub use node::{NodeState, StartError};

// The linker drops a crate nothing names, and its plugin registrations with it.
use linkbus_compress_zstd as _;
use linkbus_encrypt_chacha as _;
use linkbus_file as _;
use linkbus_route_static as _;
use linkbus_store_fjall as _;
use linkbus_store_log as _;
use linkbus_store_memory as _;
use linkbus_transport_tcp as _;

/// A running node: its tasks, and where to reach it.
pub struct Node {
    state: Arc<NodeState>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    listen_address: Option<String>,
    socket_path: PathBuf,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("name", self.state.name()).field("listen", &self.listen_address).finish()
    }
}

impl Node {
    /// Starts a node: builds its plugins, recovers its queues, binds its link listener and
    /// client socket, and starts one task per link.
    ///
    /// # Errors
    /// [`StartError`] when a plugin, the store or a socket fails; nothing keeps running then.
    pub async fn start(config: Config) -> Result<Self, StartError> {
        Self::start_state(NodeState::new(config)?).await
    }

    /// Like [`Node::start`], with `stages` acting on messages on their way: at the origin,
    /// at a relay, before delivery into a queue (see [`flow::stages`]). Each stage's
    /// factory builds one instance per client connection and per link.
    ///
    /// # Errors
    /// As [`Node::start`].
    pub async fn start_with_stages(
        config: Config,
        stages: Vec<Arc<dyn StageFactory>>,
    ) -> Result<Self, StartError> {
        Self::start_state(NodeState::with_stages(config, stages)?).await
    }

    async fn start_state(state: Arc<NodeState>) -> Result<Self, StartError> {
        let (shutdown, watch_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let mut listen_address = None;
        if let Some(address) = &state.config().node.listen {
            let listener = state.transport().listen(address).await?;
            listen_address = Some(listener.local_address());
            tasks.spawn(listener::run(state.clone(), listener, watch_rx.clone()));
        }
        let socket_path = state.socket_path();
        let client_listener = api::server::bind(&socket_path).await?;
        tasks.spawn(api::server::run(state.clone(), client_listener, socket_path.clone(), watch_rx.clone()));
        for link in state.links() {
            tasks.spawn(link::run(state.clone(), link.clone(), watch_rx.clone()));
        }
        tasks.spawn(result_timer(state.clone(), watch_rx.clone()));
        tasks.spawn(warnings_timer(state.clone(), watch_rx.clone()));
        tasks.spawn(disk_timer(state.clone(), watch_rx.clone()));
        tasks.spawn(groups_timer(state.clone(), watch_rx.clone()));
        tasks.spawn(files::run(state.clone(), watch_rx.clone()));
        if state.security().mode == linkbus_proto::secure::Mode::Plaintext {
            tracing::warn!(node = %state.name(), "INSECURE: links are plaintext, unauthenticated and unencrypted (security.insecure_plaintext).");
        }
        info!(
            node = %state.name(),
            listen = listen_address.as_deref().unwrap_or("-"),
            socket = %socket_path.display(),
            peers = state.links().count(),
            queues = state.config().queues.len(),
            "Node started."
        );
        Ok(Self { state, shutdown, tasks, listen_address, socket_path })
    }

    /// What each configured codec stage did to the puts of this node, in configured order.
    pub fn codec_stats(&self) -> Vec<flow::CodecStats> {
        self.state.codecs().stats()
    }

    /// What each running filter did, in configured order.
    pub fn filter_stats(&self) -> Vec<flow::FilterStats> {
        self.state.filters().stats()
    }

    /// The address peers reach this node at (with the real port when `:0` was configured).
    pub fn listen_address(&self) -> Option<&str> {
        self.listen_address.as_deref()
    }

    /// The client socket.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// A client of this node in this process: the calls of [`Client`], answered without
    /// the socket or any encoding (for applications that embed their node).
    pub fn client(&self) -> Client {
        Client::in_process(Box::new(api::server::InProcess::new(self.state().clone())))
    }

    /// The node's shared state.
    pub fn state(&self) -> &Arc<NodeState> {
        &self.state
    }

    /// Stops every task (links send a close frame) and waits for them, at most a few seconds;
    /// then makes every store write durable.
    pub async fn shutdown(mut self) {
        self.state.stop();
        let _ = self.shutdown.send(true);
        let drained = tokio::time::timeout(Duration::from_secs(5), async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            self.tasks.abort_all();
        }
        // What was written (gets, acknowledgements, backouts) is on disk before the process ends.
        if let Err(e) = self.state.committer().sync().await {
            tracing::error!(error = %e, "Final store sync failed.");
        }
        info!(node = %self.state.name(), "Node stopped.");
    }
}

/// How often, at most, results that did not come back in time are reported.
const RESULT_TICK: Duration = Duration::from_millis(100);

/// Reports results that did not come back in time, until shutdown: wakes when the earliest
/// awaited outcome comes due (at most every [`RESULT_TICK`]) and sleeps while none is
/// awaited, so a node that tracks no results does not wake for them.
async fn result_timer(state: Arc<NodeState>, mut shutdown: watch::Receiver<bool>) {
    let mut last = tokio::time::Instant::now();
    let mut due = link::Deadline::new();
    loop {
        due.set(
            state.results().next_due().map(|at| tokio::time::Instant::from_std(at).max(last + RESULT_TICK)),
        );
        tokio::select! {
            () = due.wait() => {
                last = tokio::time::Instant::now();
                state.time_out_results(std::time::Instant::now());
            }
            () = state.results().earlier_due() => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// How often held message groups are checked for a lifetime that ran out.
const GROUPS_TICK: Duration = Duration::from_secs(1);

/// Expires held message groups whose lifetime ran out (every member together), until
/// shutdown; gets expire them too on their way.
async fn groups_timer(state: Arc<NodeState>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(GROUPS_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = std::time::Instant::now();
                state.queues().for_each(|q| q.expire_groups(now));
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// Logs the summaries of repeated warnings once per interval, until shutdown.
async fn warnings_timer(state: Arc<NodeState>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(state.warnings().interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                state.warnings().flush();
            }
            _ = shutdown.changed() => {
                // Not wait for the interval: what was counted is said before the node stops.
                state.warnings().flush_all();
                return;
            }
        }
    }
}

/// Reads the disk's free space every [`disk::CHECK_INTERVAL`], until shutdown.
async fn disk_timer(state: Arc<NodeState>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(disk::CHECK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => state.disk().check(),
            _ = shutdown.changed() => return,
        }
    }
}

/// Runs a node until `shutdown` completes, then stops it gracefully.
///
/// # Errors
/// [`StartError`] when the node cannot start, or [`StartError::TaskFailed`] when one of its
/// tasks ended on its own (a bug): the node stops rather than run without, say, a link.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), StartError> {
    run_with(config, None, shutdown).await
}

/// Like [`run`], for a node whose configuration came from `source` (a file and command-line
/// overrides): `linkbus reload` and SIGHUP read it again and take up its routes.
///
/// # Errors
/// As [`run`].
pub async fn run_reloadable(
    config: Config,
    source: node::ReloadSource,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    run_with(config, Some(source), shutdown).await
}

async fn run_with(
    config: Config,
    source: Option<node::ReloadSource>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    // Taken before the start (which may recover a large store), so a SIGHUP meanwhile is
    // a reload afterwards rather than the signal's default: ending the process.
    let mut hangup = None;
    if source.is_some() {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(signal) => hangup = Some(signal),
            Err(e) => tracing::warn!(error = %e, "Cannot take SIGHUP; use `linkbus reload` instead."),
        }
    }
    let mut node = Node::start(config).await?;
    let state = node.state.clone();
    if let Some(source) = source {
        state.set_reload_source(source);
    }
    let reloads = async {
        let Some(hangup) = hangup.as_mut() else { return std::future::pending().await };
        while hangup.recv().await.is_some() {
            match state.reload() {
                Ok(text) => info!(changes = text.trim_end(), "Configuration reloaded (SIGHUP)."),
                Err(refusal) => tracing::error!(
                    reason = refusal.reason,
                    "Configuration reload (SIGHUP) refused; the running one stays."
                ),
            }
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = shutdown => {}
        () = reloads => {}
        reason = state.failed() => {
            tracing::error!(reason, "Node failed; stopping.");
            node.shutdown().await;
            return Err(StartError::TaskFailed(reason));
        }
        failure = node.tasks.join_next() => {
            let reason = match failure {
                Some(Err(e)) => e.to_string(),
                _ => "a task ended unexpectedly".to_owned(),
            };
            tracing::error!(reason, "Node task failed; stopping.");
            node.shutdown().await;
            return Err(StartError::TaskFailed(reason));
        }
    }
    node.shutdown().await;
    // A store that failed while the node was stopping still means an error exit.
    if state.is_failing() {
        return Err(StartError::TaskFailed("the store failed while the node was stopping".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use linkbus_plugin_api::registry;

    #[test]
    fn every_built_in_plugin_is_registered() {
        assert_eq!(registry::names("transport"), ["tcp"]);
        assert_eq!(registry::names("store"), ["fjall", "log", "memory"]);
        assert_eq!(registry::names("router"), ["static"]);
        assert_eq!(registry::names("compressor"), ["zstd"]);
        assert_eq!(registry::names("cipher"), ["chacha20poly1305"]);
    }
}
