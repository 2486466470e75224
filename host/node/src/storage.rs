//! The store thread and group commit.
//!
//! Queues hand their writes to one thread, in the order they make them (under their locks),
//! without waiting. The thread takes every write that has arrived, applies them as one store
//! batch, and syncs that batch when somebody waits for durability — a put about to be
//! answered, a link about to acknowledge — so many messages share one `fdatasync` and the
//! writers never wait for a disk in between. Waiting for durability is asking for a sync
//! after one's writes: since the thread keeps the order, that sync covers them.
//!
//! A failed write or sync poisons the store (its writes fail from then on): it is reported
//! to every waiter and to [`Failure`], and the node stops rather than acknowledge what it
//! may have lost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, mpsc};

use linkbus_plugin_api::{Batch, Store, StoreError};
use tokio::sync::oneshot;

/// How many batches the thread wrote and synced, and for how many writes and waiters.
#[derive(Debug, Default)]
pub struct CommitStats {
    /// Store batches written (each one or more writes).
    pub batches: AtomicU64,
    /// Of those, the synced ones.
    pub syncs: AtomicU64,
    /// Writes handed over.
    pub writes: AtomicU64,
    /// Waiters answered (puts or link batches that waited for durability).
    pub waiters: AtomicU64,
}

/// A reason for the node to stop, once there is one.
#[derive(Debug, Default)]
pub struct Failure {
    reason: Mutex<Option<String>>,
    notify: tokio::sync::Notify,
}

impl Failure {
    /// Records the first reason and wakes whoever waits in [`Failure::wait`].
    pub fn set(&self, reason: String) {
        self.reason.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(reason);
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    /// The reason, once set.
    pub fn get(&self) -> Option<String> {
        self.reason.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Completes with the reason once one is set.
    pub async fn wait(&self) -> String {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(reason) = self.get() {
                return reason;
            }
            notified.await;
        }
    }
}

enum Job {
    Write(Batch),
    /// Answer once everything before is written and synced.
    Sync(Waiter),
    /// Answer once everything before is written (in the operating system's hands: it
    /// survives the process, not the machine).
    Applied(Waiter),
    /// The writes up to the matching `Release` go into one store batch with these.
    Hold,
    /// Ends a `Hold`.
    Release,
}

/// The jobs the store thread gathered for one store batch.
#[derive(Default)]
struct Gathered {
    merged: Batch,
    waiters: Vec<Waiter>,
    sync: bool,
    /// Holds not yet released: the batch is not applied before they are.
    holds: usize,
}

impl Gathered {
    fn is_empty(&self) -> bool {
        self.merged.is_empty() && self.waiters.is_empty() && !self.sync
    }

    fn take(&mut self, job: Job, counts: &CommitStats) {
        match job {
            Job::Write(batch) => {
                counts.writes.fetch_add(1, Ordering::Relaxed);
                self.merged.ops.extend(batch.ops);
            }
            Job::Sync(waiter) => {
                self.sync = true;
                self.waiters.push(waiter);
            }
            Job::Applied(waiter) => self.waiters.push(waiter),
            Job::Hold => self.holds += 1,
            Job::Release => self.holds = self.holds.saturating_sub(1),
        }
    }
}

enum Waiter {
    Async(oneshot::Sender<Result<(), StoreError>>),
    Blocking(mpsc::Sender<Result<(), StoreError>>),
}

impl Waiter {
    fn answer(self, result: Result<(), StoreError>) {
        match self {
            Self::Async(tx) => drop(tx.send(result)),
            Self::Blocking(tx) => drop(tx.send(result)),
        }
    }
}

/// The store thread's handle; see the module doc. The thread ends when the handle drops.
pub struct Committer {
    /// The store thread's queue, or (`None`) writes go straight to `direct`.
    jobs: Option<Arc<Jobs>>,
    direct: Option<Arc<dyn Store>>,
    /// Counts, for `linkbus status` and benchmarks.
    pub stats: Arc<CommitStats>,
    failure: Arc<Failure>,
}

impl std::fmt::Debug for Committer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Committer").field("threaded", &self.jobs.is_some()).finish_non_exhaustive()
    }
}

/// The jobs handed to the store thread, in order. The thread swaps the whole list for its
/// empty spare, so both lists keep their room (up to [`JOBS_ROOM_KEPT`]) and, once grown,
/// handing a job over allocates nothing (a channel allocates blocks in the writers' threads
/// that the store thread frees, and under load that free waits for the writers' allocator
/// lock).
struct Jobs {
    queue: Mutex<JobQueue>,
    arrived: Condvar,
}

struct JobQueue {
    jobs: Vec<Job>,
    /// Whether the store thread takes jobs: cleared when the handle drops (the thread
    /// finishes what is queued and ends) or the thread ended.
    open: bool,
    /// Whether the store thread sleeps until a job arrives.
    waiting: bool,
}

impl Jobs {
    fn lock(&self) -> std::sync::MutexGuard<'_, JobQueue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, job: Job) -> Result<(), Job> {
        let mut queue = self.lock();
        if !queue.open {
            return Err(job);
        }
        queue.jobs.push(job);
        let wake = std::mem::take(&mut queue.waiting);
        drop(queue);
        if wake {
            self.arrived.notify_one();
        }
        Ok(())
    }

    /// Swaps the queued jobs into `into` (empty), waiting for at least one; `false` once
    /// the queue is closed and empty.
    fn take_into(&self, into: &mut Vec<Job>) -> bool {
        let mut queue = self.lock();
        while queue.jobs.is_empty() {
            if !queue.open {
                return false;
            }
            queue.waiting = true;
            queue = self.arrived.wait(queue).unwrap_or_else(PoisonError::into_inner);
        }
        std::mem::swap(&mut queue.jobs, into);
        true
    }

    /// Takes no more jobs; the store thread finishes those queued.
    fn close(&self) {
        self.lock().open = false;
        self.arrived.notify_one();
    }

    /// Takes no more jobs and returns those queued (the store thread ended).
    fn abandon(&self) -> Vec<Job> {
        let mut queue = self.lock();
        queue.open = false;
        std::mem::take(&mut queue.jobs)
    }
}

/// Closes the queue when the store thread ends, however it ends: jobs left behind (it
/// panicked) are dropped, so their waiters hear that it stopped instead of waiting forever.
struct ClosedOnExit(Arc<Jobs>);

impl Drop for ClosedOnExit {
    fn drop(&mut self) {
        // Dropped here, after `abandon` let go of the lock.
        drop(self.0.abandon());
    }
}

/// Room for this many jobs is kept in the store thread's lists after a burst.
const JOBS_ROOM_KEPT: usize = 4096;

impl Drop for Committer {
    fn drop(&mut self) {
        if let Some(jobs) = &self.jobs {
            jobs.close();
        }
    }
}

/// The store thread: takes what has arrived, applies it as one store batch (synced when
/// somebody waits for that), answers the waiters; until the handle drops and the jobs
/// queued before are done.
fn run(store: &dyn Store, jobs: &Jobs, counts: &CommitStats, failed: &Failure) {
    // After a failure nothing more is written, and every waiter hears of it (a store that
    // does not poison itself is treated as if it did).
    let mut poisoned: Option<StoreError> = None;
    let mut arrived = Vec::new();
    let mut gathered = Gathered::default();
    loop {
        let open = jobs.take_into(&mut arrived);
        let any = !arrived.is_empty();
        // Most jobs are writes of one change: room for them in one allocation.
        gathered.merged.ops.reserve(arrived.len());
        arrived.drain(..).for_each(|job| gathered.take(job, counts));
        arrived.shrink_to(JOBS_ROOM_KEPT);
        if open && gathered.holds > 0 {
            // A holder is still writing: its writes go into this batch.
            continue;
        }
        if any || !gathered.is_empty() {
            commit(store, std::mem::take(&mut gathered), &mut poisoned, counts, failed);
        }
        if !open {
            return;
        }
    }
}

/// Applies `gathered` and answers its waiters.
fn commit(
    store: &dyn Store,
    gathered: Gathered,
    poisoned: &mut Option<StoreError>,
    counts: &CommitStats,
    failed: &Failure,
) {
    let Gathered { merged, waiters, sync, .. } = gathered;
    let result = match (&*poisoned, merged.is_empty(), sync) {
        (Some(e), _, _) => Err(e.clone()),
        (None, true, true) => store.sync(),
        (None, true, false) => Ok(()),
        (None, false, _) => store.write(merged, sync),
    };
    if let Err(e) = &result {
        poisoned.get_or_insert_with(|| e.clone());
        failed.set(format!("the store failed, so the node cannot vouch for what it holds: {e}"));
    }
    counts.batches.fetch_add(1, Ordering::Relaxed);
    counts.syncs.fetch_add(u64::from(sync), Ordering::Relaxed);
    counts.waiters.fetch_add(waiters.len() as u64, Ordering::Relaxed);
    for waiter in waiters {
        waiter.answer(result.clone());
    }
}

impl Committer {
    /// Starts the thread writing to `store`; a failure is recorded in `failure`.
    ///
    /// # Errors
    /// When the thread cannot be started.
    pub fn start(store: Arc<dyn Store>, failure: Arc<Failure>) -> std::io::Result<Self> {
        let jobs = Arc::new(Jobs {
            queue: Mutex::new(JobQueue { jobs: Vec::new(), open: true, waiting: false }),
            arrived: Condvar::new(),
        });
        let stats = Arc::new(CommitStats::default());
        let counts = stats.clone();
        let failed = failure.clone();
        let closed = ClosedOnExit(jobs.clone());
        std::thread::Builder::new().name("linkbus-store".into()).spawn(move || {
            run(store.as_ref(), &closed.0, &counts, &failed);
            drop(closed);
        })?;
        Ok(Self { jobs: Some(jobs), direct: None, stats, failure })
    }

    /// A committer without a thread: each write is applied at once in the caller's thread,
    /// each sync syncs the store (for tests and tools).
    pub fn direct(store: Arc<dyn Store>) -> Self {
        Self { jobs: None, direct: Some(store), stats: Arc::default(), failure: Arc::default() }
    }

    fn send(&self, job: Job) -> Result<(), StoreError> {
        let Some(jobs) = &self.jobs else {
            let store = self.direct.as_ref().expect("a committer has a thread or a store");
            return match job {
                Job::Write(batch) => store.write(batch, false),
                Job::Sync(waiter) => {
                    waiter.answer(store.sync());
                    Ok(())
                }
                Job::Applied(waiter) => {
                    waiter.answer(Ok(()));
                    Ok(())
                }
                Job::Hold | Job::Release => Ok(()),
            };
        };
        jobs.push(job)
            .map_err(|_| StoreError::Backend { op: "write", reason: "the store thread has stopped".into() })
    }

    /// Hands a batch to the store thread, in order, without waiting. (A failure stops the
    /// node; [`Committer::sync`] after it reports it.)
    pub fn write(&self, batch: Batch) {
        if batch.is_empty() {
            return;
        }
        if let Err(e) = self.send(Job::Write(batch)) {
            self.failure.set(e.to_string());
        }
    }

    /// Until the returned guard drops, the batches handed over (by anyone) go into one store
    /// batch: all of them are stored, or none (a transaction's puts and the
    /// acknowledgements of its gets). Do not wait for the store while holding it.
    pub fn hold(&self) -> Hold<'_> {
        if let Err(e) = self.send(Job::Hold) {
            self.failure.set(e.to_string());
        }
        Hold(self)
    }

    /// Returns once every batch handed over before the call is on stable storage.
    ///
    /// # Errors
    /// The store's error (the node is stopping then).
    pub async fn sync(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.send(Job::Sync(Waiter::Async(tx)))?;
        rx.await
            .map_err(|_| StoreError::Backend { op: "sync", reason: "the store thread has stopped".into() })?
    }

    /// Returns once every batch handed over before the call is written to the store (not
    /// synced: it survives the process being killed, not the machine), blocking.
    ///
    /// # Errors
    /// As [`Committer::sync`].
    pub fn applied_blocking(&self) -> Result<(), StoreError> {
        let (tx, rx) = mpsc::channel();
        self.send(Job::Applied(Waiter::Blocking(tx)))?;
        blocking(|| rx.recv())
            .map_err(|_| StoreError::Backend { op: "write", reason: "the store thread has stopped".into() })?
    }

    /// Like [`Committer::sync`], blocking the calling thread (for code outside async tasks
    /// and the link tasks' acknowledgement step).
    ///
    /// # Errors
    /// As [`Committer::sync`].
    pub fn sync_blocking(&self) -> Result<(), StoreError> {
        let (tx, rx) = mpsc::channel();
        self.send(Job::Sync(Waiter::Blocking(tx)))?;
        blocking(|| rx.recv())
            .map_err(|_| StoreError::Backend { op: "sync", reason: "the store thread has stopped".into() })?
    }
}

/// See [`Committer::hold`].
#[must_use = "the hold ends when this drops"]
pub struct Hold<'a>(&'a Committer);

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        let _ = self.0.send(Job::Release);
    }
}

/// Runs `wait` (a wait for the store thread) so that, called from a task of a multi-thread
/// runtime, the runtime first hands its other tasks to another worker: a link waiting for
/// a sync must not hold up the tasks queued behind it.
fn blocking<T>(wait: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ops::Bound;

    #[test]
    fn writes_under_a_hold_reach_the_store_together_when_it_ends() {
        let store: Arc<dyn Store> = Arc::new(linkbus_store_memory::MemoryStore::new());
        let committer = Committer::start(store.clone(), Arc::default()).unwrap();
        let write = |key: &str| {
            let mut batch = Batch::new();
            batch.put("s", key.as_bytes().to_vec(), "v");
            committer.write(batch);
        };
        let hold = committer.hold();
        write("a");
        std::thread::sleep(std::time::Duration::from_millis(100));
        let seen = || store.scan("s", Bound::Unbounded, Bound::Unbounded, usize::MAX).unwrap().len();
        assert_eq!(seen(), 0, "nothing is applied while the hold lasts");
        write("b");
        drop(hold);
        committer.sync_blocking().unwrap();
        assert_eq!(seen(), 2);
        // a and b in one batch (the sync in it, or after it).
        assert!(committer.stats.batches.load(Ordering::Relaxed) <= 2);
    }

    #[test]
    fn what_was_handed_over_is_written_after_the_handle_drops() {
        let store: Arc<dyn Store> = Arc::new(linkbus_store_memory::MemoryStore::new());
        let committer = Committer::start(store.clone(), Arc::default()).unwrap();
        // Even under a hold that never ends (its guard forgotten).
        std::mem::forget(committer.hold());
        for n in 0..1000u32 {
            let mut batch = Batch::new();
            batch.put("s", n.to_be_bytes().to_vec(), "v");
            committer.write(batch);
        }
        drop(committer);
        let seen = || store.scan("s", Bound::Unbounded, Bound::Unbounded, usize::MAX).unwrap().len();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while seen() < 1000 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(seen(), 1000, "the thread finishes the queue before it ends");
    }

    /// A store whose writes panic.
    struct Panicking;

    impl Store for Panicking {
        fn durable(&self) -> bool {
            true
        }
        fn write(&self, _: Batch, _: bool) -> Result<(), StoreError> {
            panic!("a store bug");
        }
        fn get(&self, _: &str, _: &[u8]) -> Result<Option<bytes::Bytes>, StoreError> {
            Ok(None)
        }
        fn scan(
            &self,
            _: &str,
            _: Bound<&[u8]>,
            _: Bound<&[u8]>,
            _: usize,
        ) -> Result<Vec<(bytes::Bytes, bytes::Bytes)>, StoreError> {
            Ok(Vec::new())
        }
        fn spaces(&self) -> Result<Vec<String>, StoreError> {
            Ok(Vec::new())
        }
        fn sync(&self) -> Result<(), StoreError> {
            Ok(())
        }
    }

    #[test]
    fn waiters_hear_of_a_store_thread_that_died_instead_of_waiting_forever() {
        let committer = Committer::start(Arc::new(Panicking), Arc::default()).unwrap();
        let mut batch = Batch::new();
        batch.put("s", "k", "v");
        committer.write(batch);
        // Queued with the write, or after the thread died: either way an error, no hang.
        let error = committer.sync_blocking().unwrap_err();
        assert!(error.to_string().contains("store thread has stopped"), "{error}");
        let error = committer.sync_blocking().unwrap_err();
        assert!(error.to_string().contains("store thread has stopped"), "{error}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_keep_their_order_and_waiters_share_syncs() {
        let store: Arc<dyn Store> = Arc::new(linkbus_store_memory::MemoryStore::new());
        let committer = Arc::new(Committer::start(store.clone(), Arc::default()).unwrap());
        let mut tasks = Vec::new();
        for n in 0..200u32 {
            let committer = committer.clone();
            tasks.push(tokio::spawn(async move {
                let mut batch = Batch::new();
                batch.put("s", n.to_be_bytes().to_vec(), "v");
                committer.write(batch);
                let mut delete = Batch::new();
                delete.delete("s", n.to_be_bytes().to_vec());
                if n % 2 == 0 {
                    committer.write(delete);
                }
                committer.sync().await.unwrap();
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        committer.sync_blocking().unwrap();
        let left = store.scan("s", Bound::Unbounded, Bound::Unbounded, usize::MAX).unwrap();
        assert_eq!(left.len(), 100, "each delete applied after its put");
        assert_eq!(committer.stats.waiters.load(Ordering::Relaxed), 201);
        assert!(committer.stats.syncs.load(Ordering::Relaxed) <= 201);
    }
}
