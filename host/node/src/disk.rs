//! Room on the disk: the free space of the file system holding the data directory, against
//! `node.data_free_bytes_min`. Below it the node is *short of room*: it refuses persistent
//! puts and commits and takes no persistent delivery from a link (the peer keeps the message
//! and sends it again after reconnecting), while volatile traffic and the client API go on;
//! once a quarter more than the minimum is free again, it takes them as before. The store
//! itself is never written full, so a failed write or sync still means a broken disk: it
//! poisons the store and stops the node, as data below a failed sync may be lost.
//!
//! The space is read (`statvfs`) by the node's timer every [`CHECK_INTERVAL`], and at once
//! by a persistent admission once a quarter of the minimum was admitted since the last
//! reading, so a fast writer cannot run through the margin between readings.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tracing::{info, warn};

/// How often the free space is read.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// See the module doc.
#[derive(Debug)]
pub(crate) struct DiskRoom {
    /// A directory on the file system that holds the store.
    dir: PathBuf,
    /// `node.data_free_bytes_min`; 0 turns the check off.
    min: u64,
    /// Whether the node is short of room.
    short: AtomicBool,
    /// Free bytes at the last reading.
    free: AtomicU64,
    /// Bytes admitted for the store since the last reading.
    admitted: AtomicU64,
    /// Why the last reading failed, if it did (the check is then off until one succeeds).
    error: Mutex<Option<String>>,
}

impl DiskRoom {
    /// Watches the file system holding `dir` (which must exist).
    pub(crate) fn new(dir: PathBuf, min: u64) -> Self {
        let room = Self {
            dir,
            min,
            short: AtomicBool::new(false),
            free: AtomicU64::new(u64::MAX),
            admitted: AtomicU64::new(0),
            error: Mutex::new(None),
        };
        room.check();
        room
    }

    /// Reads the free space and updates the state; logs a change.
    pub(crate) fn check(&self) {
        if self.min == 0 {
            return;
        }
        self.admitted.store(0, Ordering::Relaxed);
        let free = match rustix::fs::statvfs(&self.dir) {
            Ok(s) => s.f_bavail.saturating_mul(s.f_frsize),
            Err(e) => {
                let mut error = self.error.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if error.is_none() {
                    warn!(dir = %self.dir.display(), error = %e, "Cannot read the free space of the data directory; not checked.");
                }
                *error = Some(e.to_string());
                return;
            }
        };
        *self.error.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        self.free.store(free, Ordering::Relaxed);
        let short = self.short.load(Ordering::Relaxed);
        if !short && free < self.min {
            self.short.store(true, Ordering::Relaxed);
            warn!(
                free_bytes = free,
                min_bytes = self.min,
                "The disk is nearly full: persistent messages are refused until there is room (node.data_free_bytes_min)."
            );
        } else if short && free >= self.resume_at() {
            self.short.store(false, Ordering::Relaxed);
            info!(free_bytes = free, "There is room on the disk again: persistent messages are taken.");
        }
    }

    fn resume_at(&self) -> u64 {
        self.min.saturating_add(self.min / 4)
    }

    /// Counts `bytes` about to be admitted (a caller that does not know yet whether they
    /// are persistent counts them anyway: a reading too many costs a microsecond); reads the
    /// free space at once when a quarter of the minimum went by since the last reading.
    /// Returns why the node cannot take a persistent message, when it is short of room.
    pub(crate) fn admit(&self, bytes: u64) -> Result<(), String> {
        if self.min == 0 {
            return Ok(());
        }
        if self.admitted.fetch_add(bytes, Ordering::Relaxed).saturating_add(bytes) >= self.min / 4 {
            self.check();
        }
        match self.shortage() {
            Some(reason) => Err(reason),
            None => Ok(()),
        }
    }

    /// Why the node takes no persistent messages now, when it is short of room.
    pub(crate) fn shortage(&self) -> Option<String> {
        self.short.load(Ordering::Relaxed).then(|| {
            format!(
                "the disk is nearly full: {} free in {}, below node.data_free_bytes_min ({}); persistent \
                 messages are refused until {} are free (volatile ones are taken)",
                mib(self.free.load(Ordering::Relaxed)),
                self.dir.display(),
                mib(self.min),
                mib(self.resume_at())
            )
        })
    }

    /// A line for `linkbus status`.
    pub(crate) fn describe(&self) -> String {
        if self.min == 0 {
            return "not checked (node.data_free_bytes_min: 0)".to_owned();
        }
        if let Some(e) = self.error.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref() {
            return format!("not checked: {e}");
        }
        let free = mib(self.free.load(Ordering::Relaxed));
        match self.shortage() {
            Some(reason) => format!("SHORT: {reason}"),
            None => format!("{free} free (minimum {})", mib(self.min)),
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}
