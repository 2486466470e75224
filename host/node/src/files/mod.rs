//! File messages: a file under the origin's files directory travels to a recipient queue's
//! node as chunk messages on the links' file channel, lands under that node's files
//! directory, and the queue gets a message describing it.
//!
//! - [`outgoing`]: the origin. A transfer is recorded (file, stamp, recipients) before the
//!   send is answered; one task per recipient reads chunks from the file as the recipient
//!   confirms them (at most the handler's `window_bytes` ahead), so memory stays bounded
//!   whatever the file's size. Chunks are not stored at the origin: the file is their
//!   record, and a restart asks each recipient how far it is (`Query`).
//! - [`incoming`]: a recipient. Each chunk is checked and recorded with its CRC-32C in the
//!   same store batch as the link's record of the message, and handed to the transfer's
//!   [`writer`], a thread that writes it into the partial file off the link's task; the
//!   last one is followed by the BLAKE3 check, the move into place (never replacing a
//!   file), the notice into the queue and `Done` to the origin, in one batch again.
//! - [`record`]: what both record in the store.
//!
//! Relays see chunks as ordinary persistent messages (stored, forwarded, acknowledged): a
//! transfer needs nothing from them. On a link straight to the recipient's node chunks
//! travel volatile, so that neither end syncs its store for them. Every answer to the
//! origin (`Resume`, `Done`, `Refuse`) is a persistent message of the system class, but
//! `Progress`, volatile.

mod incoming;
mod outgoing;
mod record;
mod writer;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use linkbus_plugin_api::file::Frame;
use linkbus_plugin_api::{
    Address, Batch, Content, FilesDir, Kind, Lifetime, Message, MessageHandler, Priority, Reliability,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::warn;

use crate::config::Config;
use crate::flow::placement::{Came, Placement};
use crate::node::NodeState;
use crate::queue::QueueError;

pub use outgoing::{SOURCE_CHANGED, SOURCE_UNREADABLE, start};

/// `name` of the messages that carry a transfer's frames.
pub const FRAME_NAME: &str = "linkbus.file";
/// Header of an answer to the origin: the recipient it comes from (`node:queue`).
pub const RECIPIENT_HEADER: &str = "linkbus.file.recipient";
/// Headers of the message a recipient queue gets for a file received.
pub const NAME_HEADER: &str = "linkbus.file.name";
/// Its size in bytes.
pub const SIZE_HEADER: &str = "linkbus.file.size";
/// Its BLAKE3 digest, hexadecimal.
pub const DIGEST_HEADER: &str = "linkbus.file.blake3";
/// The node that sent it.
pub const SENDER_HEADER: &str = "linkbus.file.sender";
/// The transfer's id (`node/sequence`).
pub const TRANSFER_HEADER: &str = "linkbus.file.transfer";

/// How often transfers are looked over (lifetimes, stalled recipients, silent ones).
const SWEEP: Duration = Duration::from_secs(1);

pub use linkbus_client::{FileTransfer, SendFile};

/// What the node's transfers did since it started.
#[derive(Debug, Default)]
pub struct FileStats {
    /// Chunk bytes sent (origin).
    pub sent_bytes: AtomicU64,
    /// Of those, bytes sent again (a recipient asked for them after a fault).
    pub resent_bytes: AtomicU64,
    /// Chunk bytes written into partial files (recipient).
    pub written_bytes: AtomicU64,
    /// Chunk bytes that came and were not written: stale or out of place after a fault.
    pub discarded_bytes: AtomicU64,
    /// Times a recipient asked its origin to go on from a point (`Resume`).
    pub resumes: AtomicU64,
    /// Files received whole and in place.
    pub received: AtomicU64,
}

/// The node's files: its directory (through the handler plugin) and its transfers.
pub struct Files {
    /// Counters.
    pub stats: FileStats,
    handler: Box<dyn MessageHandler>,
    dir: Box<dyn FilesDir>,
    root: PathBuf,
    outgoing: outgoing::Table,
    incoming: Mutex<incoming::Table>,
    starts: mpsc::UnboundedSender<outgoing::Start>,
    started: Mutex<Option<mpsc::UnboundedReceiver<outgoing::Start>>>,
    publishes: mpsc::UnboundedSender<Publish>,
    to_publish: Mutex<Option<mpsc::UnboundedReceiver<Publish>>>,
    written: mpsc::UnboundedSender<writer::Written>,
    to_take_written: Mutex<Option<mpsc::UnboundedReceiver<writer::Written>>>,
    /// Bytes all transfers from here may have travelling unconfirmed together (the
    /// handler's `in_flight_bytes`), a permit per byte.
    budget: Arc<tokio::sync::Semaphore>,
}

/// A complete file to sync and move into place, off the link's task.
#[derive(Debug, Clone)]
pub(crate) struct Publish {
    key: record::InKey,
    name: linkbus_plugin_api::FileName,
    digest: linkbus_plugin_api::file::Digest,
    /// Already in place (found so at start): nothing to move.
    done: bool,
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Files").field("root", &self.root).finish_non_exhaustive()
    }
}

impl Files {
    /// Builds the handler (`plugins.files`), opens the files directory and reads back the
    /// transfers recorded in `store` (checking every partial file against its chunks').
    ///
    /// # Errors
    /// The handler cannot be built, the directory opened, or a record read.
    pub(crate) fn open(config: &Config, store: &dyn linkbus_plugin_api::Store) -> Result<Self, String> {
        let choice = &config.plugins.files;
        let ctx = linkbus_plugin_api::BuildContext {
            node: config.node.name.clone(),
            data_dir: config.node.data_dir.clone(),
        };
        let registry = &config.plugins.registry;
        let handler = match registry.find("handler", &choice.kind, choice.library_path()).map(|p| &p.builder)
        {
            Some(linkbus_plugin_api::Builder::Handler(build)) => {
                build(&choice.section, &ctx).map_err(|e| e.to_string())?
            }
            _ => return Err(format!("plugins.files: no handler plugin named '{}'", choice.kind)),
        };
        let root = config.node.files_dir();
        let dir = handler.open(&root).map_err(|e| format!("node.files_dir: {}", e.0))?;
        let (written, to_take_written) = mpsc::unbounded_channel();
        let incoming = incoming::Table::load(store, dir.as_ref(), &written)?;
        let outgoing = outgoing::Table::load(store, &config.node.name)?;
        let (starts, started) = mpsc::unbounded_channel();
        let (publishes, to_publish) = mpsc::unbounded_channel();
        Ok(Self {
            publishes,
            to_publish: Mutex::new(Some(to_publish)),
            written,
            to_take_written: Mutex::new(Some(to_take_written)),
            budget: Arc::new(tokio::sync::Semaphore::new(
                usize::try_from(handler.in_flight_bytes())
                    .unwrap_or(usize::MAX)
                    .min(tokio::sync::Semaphore::MAX_PERMITS),
            )),
            stats: FileStats::default(),
            handler,
            dir,
            root,
            outgoing,
            incoming: Mutex::new(incoming),
            starts,
            started: Mutex::new(Some(started)),
        })
    }

    /// The files directory.
    pub fn root(&self) -> &std::path::Path {
        &self.root
    }

    fn incoming(&self) -> std::sync::MutexGuard<'_, incoming::Table> {
        self.incoming.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The status line: the directory, transfers under way, counters.
    pub fn describe(&self) -> String {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let s = &self.stats;
        let all = self.list();
        let out = all.iter().filter(|t| t.direction == linkbus_client::FileDirection::Out).count();
        format!(
            "files: {} ({} sending, {} receiving); sent {} B (again {} B), written {} B, discarded {} B, resumes {}, received {}",
            self.root.display(),
            out,
            all.len() - out,
            n(&s.sent_bytes),
            n(&s.resent_bytes),
            n(&s.written_bytes),
            n(&s.discarded_bytes),
            n(&s.resumes),
            n(&s.received)
        )
    }

    /// Queues a complete file's sync and move for [`run`]'s blocking jobs.
    fn publish_later(&self, job: Publish) {
        let _ = self.publishes.send(job);
    }

    /// Where transfers' writers report.
    fn written_events(&self) -> mpsc::UnboundedSender<writer::Written> {
        self.written.clone()
    }

    /// Every transfer under way, both ways.
    pub fn list(&self) -> Vec<FileTransfer> {
        let mut all = self.outgoing.list();
        all.extend(self.incoming().list());
        all
    }
}

/// Whether `message` is one of a transfer's frames.
pub(crate) fn is_frame(message: &Message) -> bool {
    message.content.kind == Kind::File && message.content.name == FRAME_NAME
}

/// Takes a frame that arrived for this node (with the link's record of it, written in the
/// same store batch as what the frame changes).
///
/// # Errors
/// When a refusal cannot be dead-lettered (no room): nothing was written then.
pub(crate) fn arrived(
    node: &NodeState,
    message: Message,
    record: Batch,
    now: Instant,
) -> Result<(), QueueError> {
    let payload = match decoded_payload(node, &message) {
        Ok(payload) => payload,
        Err(reason) => return bad_frame(node, message, record, &reason, now),
    };
    let frame = match Frame::decode(payload) {
        Ok(frame) => frame,
        Err(e) => return bad_frame(node, message, record, &e.to_string(), now),
    };
    match frame {
        Frame::Chunk(_) | Frame::Query { .. } | Frame::Cancel { .. } => {
            incoming::take(node, &message, frame, record);
        }
        answer => {
            let recipient = message.content.header(RECIPIENT_HEADER).and_then(|a| a.parse::<Address>().ok());
            match recipient {
                Some(recipient) => outgoing::answer(node, &recipient, answer),
                None => return bad_frame(node, message, record, "an answer without its recipient", now),
            }
            node.committer().write(record);
        }
    }
    Ok(())
}

/// The frame's bytes: the payload, decoded when its origin's codecs encoded it.
fn decoded_payload(node: &NodeState, message: &Message) -> Result<bytes::Bytes, String> {
    if !message.is_encoded() {
        return Ok(message.content.payload.clone());
    }
    let Some(to) = message.content.recipients.first() else { return Err("no recipient".into()) };
    let max = usize::try_from(node.config().messages.message_bytes_max).unwrap_or(usize::MAX);
    node.codecs().decode(message, to, max).map_err(|r| r.reason)
}

/// A frame that does not read goes to the dead-letter queue with the reason.
fn bad_frame(
    node: &NodeState,
    message: Message,
    record: Batch,
    reason: &str,
    now: Instant,
) -> Result<(), QueueError> {
    if node.warnings().admit(crate::warnings::reason::BAD_FILE_FRAME) {
        warn!(id = %message.id, reason, "A file frame does not read; dead-lettered.");
    }
    crate::flow::dead_letter::check_room(node, 1)?;
    let why = crate::flow::DeadLetter {
        code: crate::flow::DeadLetterCode::DecodeFailed,
        reason: &format!("bad file frame: {reason}"),
        failed: message.content.recipients.to_vec(),
    };
    crate::flow::dead_letter::put(node, message, why, now, record);
    Ok(())
}

/// Sends `frame` from this node (a recipient) to `origin`'s node about the transfer to
/// `recipient`, in one store batch with `with`. An answer for this node itself is taken at
/// once.
fn answer_origin(
    node: &NodeState,
    origin: &linkbus_plugin_api::NodeName,
    recipient: &Address,
    frame: &Frame,
    with: Batch,
) {
    if origin == node.name() {
        outgoing::answer(node, recipient, frame.clone());
        node.committer().write(with);
        return;
    }
    let to = Address::new(origin.clone(), node.event_queue().queue.clone());
    // A `Progress` only moves the origin's window on: volatile, it costs the origin's link
    // no store sync (one lost with a node is made up by the origin asking, `Query`).
    let reliability =
        if matches!(frame, Frame::Progress { .. }) { Reliability::Volatile } else { Reliability::Persistent };
    let mut content = Content::buf(to, frame.encode())
        .with_priority(Priority::SYSTEM)
        .with_reliability(reliability)
        .with_lifetime(Lifetime::UNLIMITED);
    content.kind = Kind::File;
    content.name = FRAME_NAME.to_owned();
    content.headers.push((RECIPIENT_HEADER.into(), recipient.to_string()));
    place(node, crate::flow::origin::stamp(node, content, crate::clock::unix_ms()), with);
}

/// Queues a frame (an answer, a `Query`, a `Cancel`) like any message, in one store batch
/// with `with`: a persistent one is stored until its link's peer has it. One without a way
/// there is logged and dropped (`with` is written all the same).
fn place(node: &NodeState, message: Message, with: Batch) {
    match Placement::of(node, &message, Came::Put).reachable() {
        Ok(placement) => placement.apply(node, message, Instant::now(), Came::Put, with),
        Err(refusal) => {
            if node.warnings().admit(crate::warnings::reason::BAD_FILE_FRAME) {
                warn!(id = %message.id, reason = refusal.reason, "A file frame has no way to its node.");
            }
            node.committer().write(with);
        }
    }
}

/// Runs the node's transfers until shutdown: starts a task per recipient of each transfer
/// (those read back at start ask their recipients how far they are first), and looks them
/// over every [`SWEEP`].
pub(crate) async fn run(node: Arc<NodeState>, mut shutdown: watch::Receiver<bool>) {
    let files = node.files();
    let Some(mut starts) = files.started.lock().unwrap_or_else(PoisonError::into_inner).take() else {
        return;
    };
    let Some(mut to_publish) = files.to_publish.lock().unwrap_or_else(PoisonError::into_inner).take() else {
        return;
    };
    let Some(mut written) = files.to_take_written.lock().unwrap_or_else(PoisonError::into_inner).take()
    else {
        return;
    };
    let mut tasks = JoinSet::new();
    for start in files.outgoing.recovered(&node) {
        tasks.spawn(outgoing::send(node.clone(), start));
    }
    files.incoming().after_start(&node);
    let mut sweep = tokio::time::interval(SWEEP);
    loop {
        tokio::select! {
            Some(start) = starts.recv() => {
                tasks.spawn(outgoing::send(node.clone(), start));
            }
            Some(job) = to_publish.recv() => {
                tasks.spawn(publish(node.clone(), job));
            }
            Some(event) = written.recv() => {
                let progress = files.incoming().written(&node, event);
                if let Some((key, frame)) = progress {
                    tasks.spawn(confirm(node.clone(), key, frame));
                }
            }
            _ = sweep.tick() => {
                let now = crate::clock::unix_ms();
                files.outgoing.sweep(&node, now);
                files.incoming().sweep(&node, now, Instant::now());
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    tasks.abort_all();
}

/// Tells a transfer's origin how far its recipient is once the store is synced (the
/// chunks' records with it).
async fn confirm(node: Arc<NodeState>, key: record::InKey, progress: Frame) {
    if node.committer().sync().await.is_ok() {
        let to = Address::new(node.name().clone(), key.queue.clone());
        answer_origin(&node, &key.origin, &to, &progress, Batch::new());
    }
}

/// Syncs a complete partial file and moves it into place (blocking, on a thread of its
/// own), then hands the outcome to the transfer.
async fn publish(node: Arc<NodeState>, job: Publish) {
    let (on, what) = (node.clone(), job.clone());
    let moved = tokio::task::spawn_blocking(move || {
        if what.done {
            return Ok(());
        }
        let files = on.files();
        let id = what.key.partial_id();
        files.dir.partial(&id, false)?.sync()?;
        files.dir.publish(&id, &what.name)?;
        if crate::faults::crash_after_move() {
            std::process::abort();
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
    node.files().incoming().published(&node, &job.key, job.digest, moved);
}
