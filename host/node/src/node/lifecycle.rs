//! A node's lifecycle: running, stopping (a shutdown), failing (the store failed).

use std::future::Future;
use std::sync::atomic::Ordering;

use super::NodeState;

impl NodeState {
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
    pub(crate) async fn wait_for_room(
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
        self.admission.wake_all();
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

    /// Why the node must stop, once it must.
    pub(crate) fn failure(&self) -> Option<String> {
        self.failure.get()
    }

    /// Makes every write so far durable, for the messages a client is about to be told are
    /// accepted (group commit); a failure stops the node.
    pub(crate) async fn make_durable(&self, persistent: bool) -> Result<(), String> {
        if !persistent || self.ack_before_sync.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.committer.sync().await.map_err(|e| {
            let reason = format!("store sync failed, so accepted messages may not be durable: {e}");
            self.fail(reason.clone());
            reason
        })
    }
}
