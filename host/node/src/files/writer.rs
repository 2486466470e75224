//! A transfer's writer: a thread of its own that writes the chunks a recipient took into
//! the partial file, in order, digests them, and starts their way to the disk a few MiB
//! behind. The receiving link's task only checks and records a chunk: a write that waits
//! for the disk (the kernel throttling a writer of many dirty pages, a full disk) never
//! holds up the messages behind it on the link.
//!
//! What the writer did comes back to the node's file driver as [`Written`] events; a
//! recipient confirms to the origin only bytes written, so what waits here is bounded by
//! the origin's window.

use std::sync::mpsc;

use bytes::Bytes;
use linkbus_plugin_api::PartialFile;
use linkbus_plugin_api::file::Digest;
use tokio::sync::mpsc::UnboundedSender;

use super::record::InKey;

/// How far behind the writes a partial file's writeback is started.
const WRITE_BEHIND: u64 = 8 << 20;

/// What a writer is asked to do, in order.
enum Job {
    /// Write `data` at `offset` (the end of what was written).
    Write { offset: u64, data: Bytes },
    /// Everything is written: report the digest.
    Finish,
    /// Cut the file to `len` bytes and go on from there.
    Cut(u64),
}

/// What a writer reports to the file driver.
#[derive(Debug)]
pub(crate) enum Written {
    /// The bytes before `written` are in the partial file.
    Upto { key: InKey, written: u64 },
    /// A write failed at `written`: later chunks are dropped until a [`Writer::cut`].
    Failed { key: InKey, written: u64, error: std::io::Error },
    /// Every byte is written; their digest.
    Complete { key: InKey, digest: Digest },
}

/// The handle of a transfer's writer; the thread ends once it is dropped and its jobs done.
#[derive(Debug)]
pub(crate) struct Writer {
    jobs: mpsc::Sender<Job>,
}

impl Writer {
    /// Starts the writer of `partial`, whose first `written` bytes are there already and
    /// digested by `hasher`.
    ///
    /// # Errors
    /// When no thread can be started.
    pub(crate) fn start(
        key: InKey,
        partial: Box<dyn PartialFile>,
        written: u64,
        hasher: blake3::Hasher,
        events: UnboundedSender<Written>,
    ) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel();
        let state = State { key, partial, hasher, written, behind: written, failed: false, events };
        std::thread::Builder::new().name("linkbus-file-writer".into()).spawn(move || state.run(&queue))?;
        Ok(Self { jobs })
    }

    /// Writes `data` at `offset`.
    pub(crate) fn write(&self, offset: u64, data: Bytes) {
        let _ = self.jobs.send(Job::Write { offset, data });
    }

    /// Reports the digest once everything before is written.
    pub(crate) fn finish(&self) {
        let _ = self.jobs.send(Job::Finish);
    }

    /// Cuts the file back to `len` bytes, which is what was written (after a failed write)
    /// or 0 (starting over), and goes on writing from there.
    pub(crate) fn cut(&self, len: u64) {
        let _ = self.jobs.send(Job::Cut(len));
    }
}

struct State {
    key: InKey,
    partial: Box<dyn PartialFile>,
    hasher: blake3::Hasher,
    written: u64,
    /// Where the writeback was last started.
    behind: u64,
    /// A write failed: chunks are dropped until a cut.
    failed: bool,
    events: UnboundedSender<Written>,
}

impl State {
    fn run(mut self, queue: &mpsc::Receiver<Job>) {
        while let Ok(job) = queue.recv() {
            let mut moved = self.take(job);
            // Whatever else is waiting first, then one report of how far it is.
            while let Ok(job) = queue.try_recv() {
                moved |= self.take(job);
            }
            if moved && !self.failed {
                let _ = self.events.send(Written::Upto { key: self.key.clone(), written: self.written });
            }
        }
    }

    /// Does `job`; whether it wrote anything.
    fn take(&mut self, job: Job) -> bool {
        match job {
            Job::Write { offset, data } => {
                if self.failed || offset != self.written {
                    return false;
                }
                if let Err(error) = self.partial.write_at(offset, &data) {
                    self.failed = true;
                    let written = self.written;
                    let _ = self.events.send(Written::Failed { key: self.key.clone(), written, error });
                    return false;
                }
                self.hasher.update(&data);
                self.written += data.len() as u64;
                if self.written >= self.behind + WRITE_BEHIND {
                    // The step before (clean by now: let go) and this one (started).
                    let from = self.behind.saturating_sub(WRITE_BEHIND);
                    let _ = self.partial.write_behind(from, self.written - from);
                    self.behind = self.written;
                }
                true
            }
            Job::Finish => {
                if !self.failed {
                    let digest = *self.hasher.finalize().as_bytes();
                    let _ = self.events.send(Written::Complete { key: self.key.clone(), digest });
                }
                false
            }
            Job::Cut(len) => {
                self.failed = false;
                if let Err(error) = self.cut(len) {
                    // Nothing of the file is known good now: from zero.
                    self.failed = true;
                    (self.hasher, self.written, self.behind) = (blake3::Hasher::new(), 0, 0);
                    let _ = self.partial.truncate(0);
                    let _ = self.events.send(Written::Failed { key: self.key.clone(), written: 0, error });
                }
                false
            }
        }
    }

    /// Cuts the file back to what was written (`len` at least that: after a failed write,
    /// whose bytes may be there in part) or to nothing (any `len` short of it: starting
    /// over), the digest with it.
    fn cut(&mut self, len: u64) -> std::io::Result<()> {
        if len < self.written {
            self.hasher = blake3::Hasher::new();
            self.written = 0;
        }
        self.behind = self.written;
        self.partial.truncate(self.written)
    }
}
