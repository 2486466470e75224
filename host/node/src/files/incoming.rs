//! A recipient of transfers: chunks checked and recorded with their CRC-32C on the link's
//! task, written into partial files by each transfer's [`Writer`], the file checked and
//! moved into place, its queue told, its origin answered.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use linkbus_client::{FileDirection, FileTransfer};
use linkbus_plugin_api::file::{Chunk, Digest, Frame, refused};
use linkbus_plugin_api::{
    Address, Batch, Content, FilesDir, Kind, Lifetime, Message, MessageId, Reliability,
};
use tokio::sync::mpsc::UnboundedSender;
use tracing::{info, warn};

use super::record::{self, Ended, InKey, InRecord};
use super::writer::{Writer, Written};
use super::{DIGEST_HEADER, NAME_HEADER, SENDER_HEADER, SIZE_HEADER, TRANSFER_HEADER, answer_origin};
use crate::flow::placement::{Came, Placement};
use crate::node::NodeState;

/// After a write failed (a full disk), how long a transfer waits before asking again.
const STALL_RETRY: Duration = Duration::from_secs(5);
/// How often at least a recipient receiving bytes tells its origin how far it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// How long a recipient remembers how a transfer ended (to answer its origin again).
const ENDED_KEPT_MS: u64 = 7 * 86_400 * 1000;

/// One transfer being received.
struct Receiving {
    /// Where it stands as recorded: `expected` is the end of the chunks taken (checked and
    /// recorded), which the writer may not have written yet.
    record: InRecord,
    writer: Writer,
    /// The end of what the writer wrote.
    written: u64,
    /// The digest the origin sent with the last chunk.
    sent_digest: Option<Digest>,
    /// The digest of the complete file, once the writer made it and it matched.
    digest: Option<Digest>,
    /// Offsets of the chunks recorded (forgotten with the transfer).
    chunks: Vec<u64>,
    /// `written` when the origin was last told.
    progress_sent: u64,
    /// When the origin was last told.
    progress_at: Instant,
    /// Bytes after which to tell it again.
    ack_every: u64,
    /// A `Resume` for the current attempt went out: chunks out of place are dropped quietly.
    asked: bool,
    /// A write failed: why, and when to ask for the bytes again.
    stalled: Option<(String, Instant)>,
    /// Damage found at start: ask for the bytes from `expected` once running.
    damaged: bool,
    /// Found complete at start: finish it once running.
    complete: bool,
    /// Found in place at start (the node stopped between the move and its record): the
    /// move is not made again.
    published: bool,
    /// Its last chunk is taken: its digest, sync and move are under way.
    finishing: bool,
}

impl Receiving {
    /// A transfer at the point `record` says, written that far, with its writer.
    fn new(record: InRecord, writer: Writer, ack_every: u64) -> Self {
        Self {
            written: record.expected,
            progress_sent: record.expected,
            progress_at: Instant::now(),
            record,
            writer,
            sent_digest: None,
            digest: None,
            chunks: Vec::new(),
            ack_every,
            asked: false,
            stalled: None,
            damaged: false,
            complete: false,
            published: false,
            finishing: false,
        }
    }
}

/// Every transfer this node receives, and those that ended here lately.
#[derive(Default)]
pub(crate) struct Table {
    open: BTreeMap<InKey, Receiving>,
    ended: HashMap<InKey, (u64, Ended)>,
}

/// The recipient a frame is for (its first recipient on this node).
fn recipient_here(node: &NodeState, message: &Message) -> Option<Address> {
    message.content.recipients.iter().find(|to| &to.node == node.name()).cloned()
}

fn key_of(message: &Message, to: &Address) -> InKey {
    InKey { origin: message.id.source.clone(), sequence: message.id.sequence, queue: to.queue.clone() }
}

/// Takes a frame from an origin (chunk, query, cancel) with the link's `record` of it.
pub(crate) fn take(node: &NodeState, message: &Message, frame: Frame, record: Batch) {
    let Some(to) = recipient_here(node, message) else {
        node.committer().write(record);
        return;
    };
    let key = key_of(message, &to);
    let files = node.files();
    let mut table = files.incoming();
    match frame {
        Frame::Chunk(chunk) => table.chunk(node, message, &to, key, chunk, record),
        Frame::Query { attempt } => table.query(node, &to, key, attempt, record),
        Frame::Cancel { reason } => {
            table.end(node, &key, Ended::Refused(refused::CANCELLED.into(), reason.clone()), record);
            info!(id = %message.id, reason, "File transfer cancelled by its origin; its partial file removed.");
        }
        _ => node.committer().write(record),
    }
}

impl Table {
    /// Reads back the transfers recorded in `store`, checking each partial file chunk by
    /// chunk against the CRCs recorded: it is cut after the last chunk that checks (a
    /// transfer with damage asks its origin for the rest once the node runs). A transfer
    /// whose file is in place already and checks whole (the node stopped between the move
    /// and its record) is not moved again. Each gets its writer, reporting to `events`.
    ///
    /// # Errors
    /// A record that cannot be read, a writer that cannot be started.
    pub(crate) fn load(
        store: &dyn linkbus_plugin_api::Store,
        dir: &dyn FilesDir,
        events: &UnboundedSender<Written>,
    ) -> Result<Self, String> {
        let mut table = Self::default();
        for (key, at, ended) in Ended::load(store)? {
            table.ended.insert(key, (at, ended));
        }
        for recovered in record::load_incoming(store)? {
            let id = recovered.key.partial_id();
            let failed = |e: std::io::Error| format!("partial file {id}: {e}");
            let partial = dir.partial(&id, true).map_err(failed)?;
            let mut record = recovered.record;
            let (size, recorded) = (record.size, record.expected);
            let mut hasher = blake3::Hasher::new();
            let mut published = false;
            let in_place = (recorded == size).then(|| dir.open_source(&record.name).ok()).flatten();
            let mut verified = 0;
            if let Some(file) = in_place {
                let mut whole = blake3::Hasher::new();
                if verify(&|at, buf| file.read_at(at, buf), &recovered.chunks, size, &mut whole) == size {
                    (verified, hasher, published) = (size, whole, true);
                }
            }
            if !published {
                verified =
                    verify(&|at, buf| partial.read_at(at, buf), &recovered.chunks, recorded, &mut hasher);
                partial.truncate(verified).map_err(failed)?;
            }
            if verified < recorded {
                warn!(
                    partial = id,
                    recorded,
                    verified,
                    "A partial file does not match its chunks' checksums; it resumes from the last good chunk."
                );
            }
            record.expected = verified;
            let writer = Writer::start(recovered.key.clone(), partial, verified, hasher, events.clone())
                .map_err(failed)?;
            let mut receiving = Receiving::new(record, writer, 0);
            receiving.chunks = recovered.chunks.iter().map(|(offset, ..)| *offset).collect();
            receiving.published = published;
            receiving.complete = verified == size;
            receiving.damaged = verified < recorded;
            table.open.insert(recovered.key, receiving);
        }
        Ok(table)
    }

    /// Once the node runs: asks the origins of the transfers read back for the bytes they
    /// lack (chunks they sent before the restart may be lost: they travel volatile on a
    /// direct link), and finishes those found complete.
    pub(crate) fn after_start(&mut self, node: &NodeState) {
        let mut complete = Vec::new();
        for (key, r) in &mut self.open {
            if std::mem::take(&mut r.complete) {
                complete.push(key.clone());
            } else {
                let note = if std::mem::take(&mut r.damaged) {
                    "the partial file was damaged; resuming from its last good chunk"
                } else {
                    "resuming after the recipient restarted"
                };
                ask(node, key, r, note.to_owned(), Batch::new());
            }
        }
        for key in complete {
            self.finish(node, &key, None, Batch::new());
        }
    }

    /// Every transfer being received.
    pub(crate) fn list(&self) -> Vec<FileTransfer> {
        self.open
            .iter()
            .map(|(key, r)| FileTransfer {
                id: MessageId {
                    source: key.origin.clone(),
                    sequence: key.sequence,
                    created_unix_ms: r.record.created_unix_ms,
                },
                direction: FileDirection::In,
                peer: key.queue.to_string(),
                name: r.record.name.to_string(),
                size: r.record.size,
                done_bytes: r.written,
                note: r.stalled.as_ref().map(|(why, _)| why.clone()).unwrap_or_default(),
            })
            .collect()
    }

    /// Removes transfers whose lifetime ran out here (their partial files too), asks again
    /// for the bytes of stalled ones, and forgets endings kept long enough.
    pub(crate) fn sweep(&mut self, node: &NodeState, now_unix_ms: u64, now: Instant) {
        let expired: Vec<InKey> = self
            .open
            .iter()
            .filter(|(_, r)| {
                !r.finishing && r.record.deadline_unix_ms != 0 && now_unix_ms >= r.record.deadline_unix_ms
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            warn!(origin = %key.origin, transfer = key.sequence, "A file transfer's lifetime ran out here; its partial file removed.");
            self.end(
                node,
                &key,
                Ended::Refused("expired".into(), "its lifetime ran out".into()),
                Batch::new(),
            );
        }
        let mut complete = Vec::new();
        for (key, r) in &mut self.open {
            if r.stalled.as_ref().is_some_and(|(_, at)| *at <= now) {
                let why = r.stalled.take().map(|(why, _)| why).unwrap_or_default();
                if r.record.expected == r.record.size {
                    complete.push(key.clone()); // Whole here: only the move failed.
                } else {
                    ask(node, key, r, format!("resuming after: {why}"), Batch::new());
                }
            }
        }
        for key in complete {
            self.finish(node, &key, None, Batch::new());
        }
        let old: Vec<InKey> = self
            .ended
            .iter()
            .filter(|(_, (at, _))| now_unix_ms.saturating_sub(*at) > ENDED_KEPT_MS)
            .map(|(k, _)| k.clone())
            .collect();
        let mut batch = Batch::new();
        for key in old {
            self.ended.remove(&key);
            batch.delete(record::DONE_SPACE, key.bytes());
        }
        if !batch.is_empty() {
            node.committer().write(batch);
        }
    }

    fn chunk(
        &mut self,
        node: &NodeState,
        message: &Message,
        to: &Address,
        key: InKey,
        chunk: Chunk,
        record: Batch,
    ) {
        if self.ended.contains_key(&key) {
            return node.committer().write(record); // A chunk of a transfer already ended here.
        }
        if !self.open.contains_key(&key) {
            match begin(node, message, to, &key, &chunk) {
                Ok(receiving) => {
                    self.open.insert(key.clone(), receiving);
                }
                Err((code, reason)) => {
                    warn!(id = %message.id, code, reason, "File refused.");
                    let ended = Ended::Refused(code.to_owned(), reason);
                    return self.end(node, &key, ended, record);
                }
            }
        }
        let Some(r) = self.open.get_mut(&key) else { return node.committer().write(record) };
        let stats = &node.files().stats;
        let len = chunk.data.len() as u64;
        if chunk.attempt < r.record.attempt || r.stalled.is_some() {
            stats.discarded_bytes.fetch_add(len, Ordering::Relaxed);
            return node.committer().write(record);
        }
        if chunk.attempt > r.record.attempt {
            r.record.attempt = chunk.attempt;
            r.asked = false;
        }
        r.ack_every = u64::from(chunk.ack_every).max(1);
        let crc = linkbus_proto::crc::crc32c(&chunk.data);
        if chunk.offset != r.record.expected || crc != chunk.crc {
            stats.discarded_bytes.fetch_add(len, Ordering::Relaxed);
            if r.asked {
                return node.committer().write(record);
            }
            let note = if crc == chunk.crc { "bytes missing here" } else { "a chunk failed its checksum" };
            return ask(node, &key, r, note.to_owned(), record);
        }
        r.writer.write(chunk.offset, chunk.data);
        r.record.expected += len;
        r.chunks.push(chunk.offset);
        let mut batch = record;
        record::write_chunk(&key, chunk.offset, len as u32, crc, &mut batch);
        r.record.write(&key, &mut batch);
        if r.record.expected == r.record.size {
            return self.finish(node, &key, chunk.digest, batch);
        }
        node.committer().write(batch);
    }

    /// Takes what a transfer's writer reports: bytes written (confirmed to the origin every
    /// `ack_every`: returned as a `Progress` to send once the store is synced, as the chunks'
    /// records must survive the node for the bytes to count), a write that failed (the
    /// transfer cut back to what is written, stalled, and asking again later), or the
    /// digest of the complete file (checked, then the file synced and moved into place by
    /// a blocking job).
    pub(crate) fn written(&mut self, node: &NodeState, event: Written) -> Option<(InKey, Frame)> {
        let now = Instant::now();
        match event {
            Written::Upto { key, written } => {
                let r = self.open.get_mut(&key)?;
                let stats = &node.files().stats;
                stats.written_bytes.fetch_add(written.saturating_sub(r.written), Ordering::Relaxed);
                r.written = written;
                // At each multiple of `ack_every` passed (where the origin's blocks end).
                let every = r.ack_every.max(1);
                // And at least every `PROGRESS_EVERY` while bytes come (a slow link would
                // otherwise leave the origin without word for long: it asks after `QUIET`).
                let due = written / every > r.progress_sent / every
                    || written > r.progress_sent && r.progress_at.elapsed() >= PROGRESS_EVERY;
                if !r.finishing && due {
                    (r.progress_sent, r.progress_at) = (written, now);
                    let progress = Frame::Progress { transfer: key.sequence, verified: written };
                    return Some((key, progress));
                }
            }
            Written::Failed { key, written, error } => {
                let r = self.open.get_mut(&key)?;
                r.finishing = false;
                r.written = written;
                let mut batch = Batch::new();
                if r.record.expected > written {
                    let beyond: Vec<u64> = r.chunks.iter().copied().filter(|at| *at >= written).collect();
                    r.chunks.retain(|at| *at < written);
                    record::forget_chunks(&key, beyond, &mut batch);
                    r.record.expected = written;
                    r.record.write(&key, &mut batch);
                }
                r.writer.cut(written);
                stall(node, &key, r, &error, now);
                node.committer().write(batch);
            }
            Written::Complete { key, digest } => {
                let r = self.open.get_mut(&key)?;
                if r.sent_digest.is_some_and(|sent| sent != digest) {
                    warn!(origin = %key.origin, transfer = key.sequence, "A file's digest differs from its origin's; receiving it again.");
                    let mut batch = Batch::new();
                    record::forget(&key, r.chunks.drain(..), &mut batch);
                    (r.record.expected, r.written, r.progress_sent, r.finishing) = (0, 0, 0, false);
                    r.writer.cut(0);
                    let note = "its BLAKE3 digest differed from the origin's; starting again".to_owned();
                    ask(node, &key, r, note, batch);
                    return None;
                }
                r.digest = Some(digest);
                self.publish(node, &key);
            }
        }
        None
    }

    /// The last chunk is taken (recorded with `batch`): the writer reports the file's
    /// digest once it has written it ([`Self::written`] checks it against `sent`), unless
    /// it is known already (only the move failed before).
    fn finish(&mut self, node: &NodeState, key: &InKey, sent: Option<Digest>, batch: Batch) {
        let Some(r) = self.open.get_mut(key) else { return node.committer().write(batch) };
        r.finishing = true;
        r.sent_digest = sent.or(r.sent_digest);
        node.committer().write(batch);
        if r.digest.is_some() {
            return self.publish(node, key);
        }
        r.writer.finish();
    }

    /// Hands a complete file's sync and move into place to a blocking job
    /// ([`super::publish`]): they wait on the disk, which a link's task must not (urgent
    /// messages come through it).
    fn publish(&mut self, node: &NodeState, key: &InKey) {
        let Some(r) = self.open.get_mut(key) else { return };
        let Some(digest) = r.digest else { return };
        r.finishing = true;
        let job = super::Publish { key: key.clone(), name: r.record.name.clone(), digest, done: r.published };
        node.files().publish_later(job);
    }

    /// What the blocking job made of a complete file: in place (the queue told, the origin
    /// answered, in one store batch), a name taken (refused), or a failure (stalled, the job
    /// run again later).
    pub(crate) fn published(
        &mut self,
        node: &NodeState,
        key: &InKey,
        digest: Digest,
        result: std::io::Result<()>,
    ) {
        let now = Instant::now();
        let Some(r) = self.open.get_mut(key) else { return };
        r.finishing = false;
        if let Err(e) = result {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return stall(node, key, r, &e, now);
            }
            let reason =
                format!("a file '{}' is already in {}'s files directory", r.record.name, node.name());
            return self.end(node, key, Ended::Refused(refused::EXISTS.into(), reason), Batch::new());
        }
        r.published = true;
        info!(origin = %key.origin, transfer = key.sequence, file = %r.record.name, size = r.record.size, "File received.");
        node.files().stats.received.fetch_add(1, Ordering::Relaxed);
        let to = Address::new(node.name().clone(), key.queue.clone());
        let notice = notice(key, r, &to, &digest);
        node.emit(
            crate::events::Event::new(
                crate::events::EventKind::FileReceived,
                format!("file {} ({} bytes) from {} into {to}", r.record.name, r.record.size, key.origin),
            )
            .with("name", &r.record.name)
            .with("size", r.record.size)
            .with("blake3", linkbus_plugin_api::hex::encode(&digest))
            .with("sender", &key.origin)
            .with("queue", &to),
        );
        let hold = node.committer().hold();
        self.end(node, key, Ended::Delivered(digest), Batch::new());
        let placement = Placement::of(node, &notice, Came::Arrived).or_dead_letter(node, &notice);
        placement.apply(node, notice, now, Came::Arrived, Batch::new());
        drop(hold);
    }

    /// Answers an origin's `Query`: where the transfer stands here.
    fn query(&mut self, node: &NodeState, to: &Address, key: InKey, attempt: u32, record: Batch) {
        let frame = match (self.ended.get(&key), self.open.get_mut(&key)) {
            (Some((_, Ended::Delivered(digest))), _) => {
                Frame::Done { transfer: key.sequence, digest: *digest }
            }
            (Some((_, Ended::Refused(code, reason))), _) => {
                Frame::Refuse { transfer: key.sequence, code: code.clone(), reason: reason.clone() }
            }
            (None, Some(r)) => {
                r.record.attempt = r.record.attempt.max(attempt);
                r.asked = true;
                let mut batch = record;
                r.record.write(&key, &mut batch);
                let note = r.stalled.as_ref().map(|(why, _)| why.clone()).unwrap_or_default();
                let frame = Frame::Resume {
                    transfer: key.sequence,
                    attempt: r.record.attempt,
                    from: r.record.expected,
                    note,
                };
                return answer_origin(node, &key.origin, to, &frame, batch);
            }
            (None, None) => Frame::Resume { transfer: key.sequence, attempt, from: 0, note: String::new() },
        };
        answer_origin(node, &key.origin, to, &frame, record);
    }

    /// Ends a transfer here: its partial file and records removed, how it ended kept (and,
    /// for a refusal, told to its origin), in one store batch with `with`.
    fn end(&mut self, node: &NodeState, key: &InKey, ended: Ended, with: Batch) {
        let mut batch = with;
        if let Some(r) = self.open.remove(key) {
            record::forget(key, r.chunks, &mut batch);
            // (Gone already once moved into place, unless the node stopped in between.)
            if let Err(e) = node.files().dir.remove_partial(&key.partial_id()) {
                warn!(partial = key.partial_id(), error = %e, "A partial file could not be removed.");
            }
        }
        ended.write(key, &mut batch);
        self.ended.insert(key.clone(), (crate::clock::unix_ms(), ended.clone()));
        let to = Address::new(node.name().clone(), key.queue.clone());
        match ended {
            Ended::Delivered(digest) => {
                answer_origin(node, &key.origin, &to, &Frame::Done { transfer: key.sequence, digest }, batch);
            }
            Ended::Refused(code, _) if code == refused::CANCELLED || code == "expired" => {
                node.committer().write(batch);
            }
            Ended::Refused(code, reason) => {
                answer_origin(
                    node,
                    &key.origin,
                    &to,
                    &Frame::Refuse { transfer: key.sequence, code, reason },
                    batch,
                );
            }
        }
    }
}

/// Starts receiving a transfer at its first chunk: the queue must be here, the name free.
fn begin(
    node: &NodeState,
    message: &Message,
    to: &Address,
    key: &InKey,
    chunk: &Chunk,
) -> Result<Receiving, (&'static str, String)> {
    if node.queue(to.queue.as_str()).is_none() {
        return Err((refused::NO_QUEUE, format!("no queue '{}' on node {}", to.queue, node.name())));
    }
    let files = node.files();
    let write_failed =
        |e: std::io::Error| (refused::WRITE_FAILED, format!("{}: {e}", files.root().display()));
    if files.dir.exists(&chunk.name).map_err(write_failed)? {
        return Err((
            refused::EXISTS,
            format!("a file '{}' is already in {}'s files directory", chunk.name, node.name()),
        ));
    }
    let partial = files.dir.partial(&key.partial_id(), true).map_err(write_failed)?;
    partial.truncate(0).map_err(write_failed)?;
    let deadline_unix_ms = match message.content.lifetime {
        Some(l) if !l.is_unlimited() => crate::clock::unix_ms().saturating_add(l.as_ms()),
        _ => 0,
    };
    let record = InRecord {
        created_unix_ms: message.id.created_unix_ms,
        name: chunk.name.clone(),
        size: chunk.size,
        attempt: chunk.attempt,
        expected: 0,
        deadline_unix_ms,
    };
    let writer = Writer::start(key.clone(), partial, 0, blake3::Hasher::new(), files.written_events())
        .map_err(write_failed)?;
    // A transfer first seen past its start (this node lost it) starts again from zero: the
    // chunk is out of place, so the origin is asked for the bytes from 0.
    Ok(Receiving::new(record, writer, u64::from(chunk.ack_every).max(1)))
}

/// Asks the origin for the bytes from `expected` on, as a new attempt (chunks of older ones
/// are dropped from now on), in one store batch with `with`.
fn ask(node: &NodeState, key: &InKey, r: &mut Receiving, note: String, with: Batch) {
    node.files().stats.resumes.fetch_add(1, Ordering::Relaxed);
    r.record.attempt += 1;
    r.asked = true;
    r.damaged = false;
    let mut batch = with;
    r.record.write(key, &mut batch);
    let to = Address::new(node.name().clone(), key.queue.clone());
    let frame =
        Frame::Resume { transfer: key.sequence, attempt: r.record.attempt, from: r.record.expected, note };
    answer_origin(node, &key.origin, &to, &frame, batch);
}

/// A write failed: the transfer waits, then asks for the bytes again.
fn stall(node: &NodeState, key: &InKey, r: &mut Receiving, error: &std::io::Error, now: Instant) {
    if node.warnings().admit(crate::warnings::reason::BAD_FILE_FRAME) {
        warn!(partial = key.partial_id(), error = %error, "Cannot write a file being received; it resumes later.");
    }
    r.stalled = Some((error.to_string(), now + STALL_RETRY));
    r.asked = true;
}

/// What a file is read through (`read_at`).
type ReadAt<'a> = dyn Fn(u64, &mut [u8]) -> std::io::Result<usize> + 'a;

/// Checks a file against the chunks recorded (in offset order) up to `expected`, and
/// digests what checks; returns the bytes that do.
fn verify(
    read_at: &ReadAt<'_>,
    chunks: &[(u64, u32, u32)],
    expected: u64,
    hasher: &mut blake3::Hasher,
) -> u64 {
    let mut verified = 0;
    let mut buf = Vec::new();
    for &(offset, len, crc) in chunks {
        if offset != verified || verified + u64::from(len) > expected {
            break;
        }
        buf.resize(len as usize, 0);
        let mut read = 0;
        while read < buf.len() {
            match read_at(offset + read as u64, &mut buf[read..]) {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
        if read != buf.len() || linkbus_proto::crc::crc32c(&buf) != crc {
            break;
        }
        hasher.update(&buf);
        verified += u64::from(len);
    }
    verified
}

/// The message the recipient queue gets for a file received.
fn notice(key: &InKey, r: &Receiving, to: &Address, digest: &Digest) -> Message {
    let hex = linkbus_plugin_api::hex::encode(digest);
    let id = MessageId {
        source: key.origin.clone(),
        sequence: key.sequence,
        created_unix_ms: r.record.created_unix_ms,
    };
    let text = format!("{} ({} bytes, blake3 {hex}) from {}", r.record.name, r.record.size, key.origin);
    let mut content = Content::buf(to.clone(), text)
        .with_reliability(Reliability::Persistent)
        .with_lifetime(Lifetime::UNLIMITED);
    content.kind = Kind::File;
    content.name = r.record.name.to_string();
    content.headers.extend([
        (NAME_HEADER.into(), r.record.name.to_string()),
        (SIZE_HEADER.into(), r.record.size.to_string()),
        (DIGEST_HEADER.into(), hex),
        (SENDER_HEADER.into(), key.origin.to_string()),
        (TRANSFER_HEADER.into(), id.to_string()),
    ]);
    Message::new(id, content)
}
