//! The origin of transfers: what a send records, the task per recipient that reads and sends
//! chunks within the window its recipient confirms, and what the recipients' answers do.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use linkbus_client::{FileDirection, FileTransfer, SendFile};
use linkbus_plugin_api::file::{ChunkHead, FileName, FileStamp, Frame};
use linkbus_plugin_api::{
    Address, Batch, Content, Kind, Lifetime, Message, MessageId, Priority, Reliability, SourceFile,
};
use tokio::sync::Notify;
use tracing::{info, warn};

use super::FRAME_NAME;
use super::record::{self, OutRecord, StreamState};
use crate::flow::refusal::{Refusal, RefusalCode};
use crate::node::NodeState;
use crate::results::Outcome;

/// Code of the failure result when the source changed during the transfer.
pub const SOURCE_CHANGED: &str = "file_source_changed";
/// Code of the failure result when the source cannot be read.
pub const SOURCE_UNREADABLE: &str = "file_source_unreadable";
/// How long a restarted origin waits for an answer to its `Query` before asking again.
const QUERY_AGAIN: Duration = Duration::from_secs(30);
/// How long an origin waits for word from a recipient with bytes outstanding before it
/// asks where the recipient is (chunks lost with a restart of a link's end, say). A
/// recipient receiving bytes says how far it is at least every 2 s, however slow its link.
const QUIET: Duration = Duration::from_secs(30);

/// A recipient's task to start.
pub(crate) struct Start {
    transfer: Arc<Transfer>,
    stream: usize,
}

/// Where the sending to one recipient stands.
#[derive(Debug, Default)]
struct Stream {
    /// The next byte to send.
    next: u64,
    /// Bytes the recipient confirmed.
    confirmed: u64,
    /// When a `Query` went out that is not answered yet (a restarted origin sends nothing
    /// until it knows where the recipient is).
    querying: Option<Instant>,
    /// What the recipient said last (a stall), for `file ls`.
    note: String,
    /// When the recipient was last heard from (or the task started).
    heard: Option<Instant>,
}

/// One transfer: its record (attempts and states per recipient) and the streams.
struct Transfer {
    id: MessageId,
    inner: Mutex<(OutRecord, Vec<Stream>)>,
    changed: Notify,
}

impl Transfer {
    fn lock(&self) -> MutexGuard<'_, (OutRecord, Vec<Stream>)> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a recipient's task does next.
enum Next {
    /// Read and send `len` bytes at `offset` as attempt `attempt`.
    Chunk { attempt: u32, offset: u64, len: u64 },
    /// Wait for an answer.
    Wait,
    /// Take the budget of the block the next chunk starts (`from`..`to`).
    Budget { from: u64, to: u64 },
    /// Ask the recipient where it is, as attempt `attempt` (recorded with `record`).
    Ask { attempt: u32, to: Address, priority: u8, record: Batch },
    /// The recipient is settled.
    Done,
}

/// Every transfer of this node under way.
#[derive(Default)]
pub(crate) struct Table {
    all: Mutex<BTreeMap<u64, Arc<Transfer>>>,
}

impl Table {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Transfer>>> {
        self.all.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads back the transfers recorded in `store`.
    ///
    /// # Errors
    /// A record that cannot be read.
    pub(crate) fn load(
        store: &dyn linkbus_plugin_api::Store,
        node: &linkbus_plugin_api::NodeName,
    ) -> Result<Self, String> {
        let table = Self::default();
        for record in record::load_outgoing(store)? {
            let streams = record.recipients.iter().map(|_| Stream::default()).collect();
            let id = MessageId {
                source: node.clone(),
                sequence: record.sequence,
                created_unix_ms: record.created_unix_ms,
            };
            let transfer = Transfer { id, inner: Mutex::new((record, streams)), changed: Notify::new() };
            table.lock().insert(transfer.id.sequence, Arc::new(transfer));
        }
        Ok(table)
    }

    /// The tasks for the transfers read back at start: each open recipient is asked how far
    /// it is (a new attempt, recorded) before anything is sent.
    pub(crate) fn recovered(&self, node: &NodeState) -> Vec<Start> {
        let mut starts = Vec::new();
        let all: Vec<Arc<Transfer>> = self.lock().values().cloned().collect();
        for transfer in all {
            let mut batch = Batch::new();
            let mut queries = Vec::new();
            {
                let mut inner = transfer.lock();
                let (record, streams) = &mut *inner;
                for (stream, (to, attempt, state)) in record.recipients.iter_mut().enumerate() {
                    if *state != StreamState::Open {
                        continue;
                    }
                    *attempt += 1;
                    streams[stream].querying = Some(Instant::now());
                    queries.push((to.clone(), *attempt, record.priority));
                    starts.push(Start { transfer: transfer.clone(), stream });
                }
                record.write(&mut batch);
            }
            node.committer().write(batch);
            // (Sent with no lock held: an answer from this very node comes back at once.)
            for (to, attempt, priority) in queries {
                query(node, &transfer.id, priority, &to, attempt);
            }
        }
        starts
    }

    /// Ends the transfers whose lifetime ran out (each open recipient `expired`, and told),
    /// and asks again recipients that did not answer a `Query`.
    pub(crate) fn sweep(&self, node: &NodeState, now_unix_ms: u64) {
        let all: Vec<Arc<Transfer>> = self.lock().values().cloned().collect();
        for transfer in all {
            let (deadline, priority) = {
                let inner = transfer.lock();
                (inner.0.deadline_unix_ms, inner.0.priority)
            };
            if deadline != 0 && now_unix_ms >= deadline {
                settle_all(node, &transfer, &Outcome::Expired, "its lifetime ran out");
                continue;
            }
            let mut queries = Vec::new();
            {
                let mut inner = transfer.lock();
                let (record, streams) = &mut *inner;
                for (stream, (to, attempt, _)) in streams.iter_mut().zip(&record.recipients) {
                    if stream.querying.is_some_and(|at| at.elapsed() >= QUERY_AGAIN) {
                        stream.querying = Some(Instant::now());
                        queries.push((to.clone(), *attempt));
                    }
                }
            }
            for (to, attempt) in queries {
                query(node, &transfer.id, priority, &to, attempt);
            }
        }
    }

    /// Every transfer under way, one line per open recipient.
    pub(crate) fn list(&self) -> Vec<FileTransfer> {
        let mut all = Vec::new();
        for transfer in self.lock().values() {
            let inner = transfer.lock();
            let (record, streams) = &*inner;
            for ((to, _, state), stream) in record.recipients.iter().zip(streams) {
                if *state != StreamState::Open {
                    continue;
                }
                all.push(FileTransfer {
                    id: transfer.id.clone(),
                    direction: FileDirection::Out,
                    peer: to.to_string(),
                    name: record.name.to_string(),
                    size: record.stamp.size,
                    done_bytes: stream.confirmed,
                    note: stream.note.clone(),
                });
            }
        }
        all
    }
}

/// Starts sending a file: checks the request and the file, records the transfer (synced
/// before this returns) and starts one task per recipient. Returns the transfer's id, whose
/// results (one per recipient) the node keeps like a message's.
///
/// # Errors
/// A name breaking a rule, a file that cannot be read, a recipient without a way there, too
/// many results waited for.
pub async fn start(node: &NodeState, request: SendFile) -> Result<MessageId, Refusal> {
    let invalid = |m: String| Refusal::new(RefusalCode::Invalid, m);
    let source = FileName::new(&request.source).map_err(|e| invalid(e.to_string()))?;
    let name = match &request.name {
        Some(name) => FileName::new(name).map_err(|e| invalid(e.to_string()))?,
        None => source.clone(),
    };
    let priority = Priority::level(request.priority).map_err(|e| invalid(e.to_string()))?;
    let recipients = recipients(node, &request.to)?;
    let files = node.files();
    let file = files.dir.open_source(&source).map_err(|e| {
        invalid(format!("cannot read '{source}' in the files directory {}: {e}", files.root().display()))
    })?;
    let stamp = file.stamp().map_err(|e| invalid(format!("cannot read '{source}': {e}")))?;
    let mut content = Content::buf(recipients[0].clone(), Bytes::new())
        .with_priority(priority)
        .with_reliability(Reliability::Persistent);
    content.recipients = recipients.iter().cloned().collect();
    content.kind = Kind::File;
    content.name = name.to_string();
    content.results = true;
    content.lifetime = request.lifetime_ms.map(Lifetime::from_ms);
    let created = crate::clock::unix_ms();
    let message = crate::flow::origin::stamp(node, content, created);
    let deadline_unix_ms = match message.content.lifetime {
        Some(l) if !l.is_unlimited() => created.saturating_add(l.as_ms()),
        _ => 0,
    };
    node.results().track(&message).map_err(|e| Refusal::new(RefusalCode::Busy, e))?;
    let record = OutRecord {
        sequence: message.id.sequence,
        created_unix_ms: created,
        source,
        name,
        stamp,
        priority: priority.code(),
        deadline_unix_ms,
        delete_after: request.delete_after,
        recipients: recipients.iter().map(|to| (to.clone(), 0, StreamState::Open)).collect(),
    };
    let mut batch = Batch::new();
    record.write(&mut batch);
    node.committer().write(batch);
    if let Err(e) = node.committer().sync().await {
        node.results().forget(message.id.sequence);
        return Err(Refusal::new(RefusalCode::Stopping, format!("the store failed: {e}")));
    }
    node.results().accepted(message.id.sequence, Instant::now());
    let streams = recipients.iter().map(|_| Stream::default()).collect();
    let transfer = Arc::new(Transfer {
        id: message.id.clone(),
        inner: Mutex::new((record, streams)),
        changed: Notify::new(),
    });
    files.outgoing.lock().insert(message.id.sequence, transfer.clone());
    for stream in 0..recipients.len() {
        let _ = files.starts.send(Start { transfer: transfer.clone(), stream });
    }
    info!(id = %message.id, file = %request.source, size = stamp.size, "File transfer accepted.");
    Ok(message.id)
}

/// The recipients, checked: each a queue address with a way there (a local one, a queue of
/// this node), none twice.
fn recipients(node: &NodeState, to: &[String]) -> Result<Vec<Address>, Refusal> {
    let invalid = |m: String| Refusal::new(RefusalCode::Invalid, m);
    if to.is_empty() || to.len() > linkbus_plugin_api::message::RECIPIENTS_MAX {
        return Err(invalid(format!(
            "a file goes to 1 to {} recipients, not {}",
            linkbus_plugin_api::message::RECIPIENTS_MAX,
            to.len()
        )));
    }
    let mut all: Vec<Address> = Vec::new();
    for text in to {
        let address: Address = text.parse().map_err(|e| invalid(format!("recipient '{text}': {e}")))?;
        match node.routing().next_hop(&address.node) {
            Ok(crate::routing::Hop::Local) if node.queue(address.queue.as_str()).is_none() => {
                return Err(Refusal::new(
                    RefusalCode::UnknownQueue,
                    format!("no queue '{}' here", address.queue),
                ));
            }
            Ok(_) => {}
            Err(reason) => return Err(Refusal::new(RefusalCode::NoRoute, reason)),
        }
        if !all.contains(&address) {
            all.push(address);
        }
    }
    Ok(all)
}

/// A file read in order, with the digest of what was read so far.
struct Reader {
    file: Box<dyn SourceFile>,
    stamp: FileStamp,
    hasher: blake3::Hasher,
    hashed: u64,
}

/// Why the source could not be read.
enum ReadError {
    Changed(String),
    Io(String),
}

impl Reader {
    /// Checks the source is still the file the transfer began with.
    fn check(&self) -> Result<(), ReadError> {
        let now = self.file.stamp().map_err(|e| ReadError::Io(e.to_string()))?;
        if now != self.stamp {
            return Err(ReadError::Changed(format!(
                "the source changed during the transfer (size {} -> {}, modified {} -> {} ns)",
                self.stamp.size, now.size, self.stamp.modified_ns, now.modified_ns
            )));
        }
        Ok(())
    }

    /// Reads exactly `len` bytes at `offset` straight into a chunk frame (`head`), with
    /// its CRC and, on the last chunk, the file's digest, hashed in order (first again from
    /// the start up to `offset` when it is not the next read in order).
    fn frame(&mut self, head: ChunkHead<'_>, len: u64) -> Result<Bytes, ReadError> {
        self.check()?;
        let offset = head.offset;
        if offset != self.hashed {
            self.hasher = blake3::Hasher::new();
            self.hashed = 0;
            let mut buf = vec![0; 1 << 20];
            while self.hashed < offset {
                let want = (offset - self.hashed).min(buf.len() as u64) as usize;
                let got = self.fill(self.hashed, &mut buf[..want])?;
                self.hasher.update(&buf[..got]);
                self.hashed += got as u64;
            }
        }
        let len = usize::try_from(len).unwrap_or(0);
        let mut frame = Vec::with_capacity(128 + head.name.as_str().len() + len);
        let head_len = head.write(&mut frame);
        self.file.read_into(offset, len, &mut frame).map_err(|e| ReadError::Io(e.to_string()))?;
        let data = &frame[head_len..];
        if data.len() != len {
            return Err(ReadError::Changed("the source is shorter than when the transfer began".into()));
        }
        self.hasher.update(data);
        self.hashed = offset + len as u64;
        let crc = linkbus_proto::crc::crc32c(data);
        // A change during the read is caught by the stamp read after it.
        self.check()?;
        let digest = (self.hashed == self.stamp.size).then(|| *self.hasher.finalize().as_bytes());
        ChunkHead::finish(&mut frame, head_len, crc, digest.as_ref());
        Ok(Bytes::from(frame))
    }

    /// Fills `buf` from `offset`; a file shorter than its stamp changed.
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<usize, ReadError> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(offset + done as u64, &mut buf[done..]) {
                Ok(0) => {
                    return Err(ReadError::Changed(
                        "the source is shorter than when the transfer began".into(),
                    ));
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ReadError::Io(e.to_string())),
            }
        }
        Ok(done)
    }
}

/// The task of one recipient: sends chunks while the window and the node's budget allow,
/// until it is settled.
pub(crate) async fn send(node: Arc<NodeState>, start: Start) {
    let Start { transfer, stream } = start;
    let Some(mut sender) = Sender::new(&node, &transfer, stream) else { return };
    let budget = node.files().budget.clone();
    loop {
        let changed = transfer.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        sender.release(&transfer);
        let limit = sender.held.back().map_or(0, |(end, _)| *end);
        match next(&transfer, stream, &sender, limit) {
            Next::Done => return,
            Next::Wait => {
                let _ = tokio::time::timeout(Duration::from_secs(1), changed).await;
            }
            Next::Budget { from, to } => {
                // The block's share of the node's budget (other transfers give theirs back
                // as their recipients confirm whole blocks; a settled transfer, all of it).
                let permits = u32::try_from(to - from).unwrap_or(u32::MAX);
                tokio::select! {
                    permit = budget.clone().acquire_many_owned(permits) => {
                        if let Ok(permit) = permit {
                            sender.held.push_back((to, permit));
                        }
                    }
                    () = &mut changed => {}
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
            Next::Ask { attempt, to, priority, record } => {
                warn!(id = %transfer.id, to = %to, "No word from a file's recipient; asking where it is.");
                node.committer().write(record);
                query(&node, &transfer.id, priority, &to, attempt);
            }
            Next::Chunk { attempt, offset, len } => {
                sender.last_end = offset + len;
                if !sender.chunk(&node, &transfer, (attempt, offset, len)).await {
                    return;
                }
            }
        }
    }
}

/// What one recipient's task keeps: the source, its codec stages, how far it sent.
struct Sender {
    stream: usize,
    source: FileName,
    /// The name the file takes at its recipient.
    name: FileName,
    reader: Option<Reader>,
    stages: crate::flow::stages::Stages,
    chunk_bytes: u64,
    window: u64,
    /// The end of what this task sent, so bytes sent again are counted.
    high: u64,
    /// Bytes after which the recipient confirms: the file in blocks of it, each taking its
    /// share of the node's budget ([`super::Files::budget`]) before its chunks go.
    ack_every: u64,
    /// The blocks held (each one's end), in order.
    held: std::collections::VecDeque<(u64, tokio::sync::OwnedSemaphorePermit)>,
    /// The end of the last chunk sent.
    last_end: u64,
}

impl Sender {
    /// Opens the source; settles the transfer as failed when it cannot be read.
    fn new(node: &NodeState, transfer: &Transfer, stream: usize) -> Option<Self> {
        let files = node.files();
        let (source, name, stamp) = {
            let inner = transfer.lock();
            (inner.0.source.clone(), inner.0.name.clone(), inner.0.stamp)
        };
        let file = match files.dir.open_source(&source) {
            Ok(file) => file,
            Err(e) => {
                let reason = format!("cannot read '{source}': {e}");
                settle_all(node, transfer, &Outcome::failed(SOURCE_UNREADABLE, &reason), &reason);
                return None;
            }
        };
        let context =
            crate::flow::StageContext { node: node.name(), site: crate::flow::Site::Origin, peer: None };
        Some(Self {
            stream,
            source,
            name,
            reader: Some(Reader { file, stamp, hasher: blake3::Hasher::new(), hashed: 0 }),
            stages: crate::flow::stages::Stages::build(&node.codecs().stages(), &context),
            chunk_bytes: files.handler.chunk_bytes() as u64,
            window: files.handler.window_bytes(),
            high: 0,
            ack_every: (files.handler.window_bytes() / 4).max(files.handler.chunk_bytes() as u64),
            held: std::collections::VecDeque::new(),
            last_end: 0,
        })
    }

    /// Gives back the budget of blocks confirmed, or of all when the recipient asked to go
    /// on from an earlier point (its blocks are sent again, each taking its share again).
    fn release(&mut self, transfer: &Transfer) {
        let (next, confirmed) = {
            let inner = transfer.lock();
            let s = &inner.1[self.stream];
            (s.next, s.confirmed)
        };
        if next < self.last_end {
            self.held.clear();
            self.last_end = next;
        }
        while self.held.front().is_some_and(|(end, _)| *end <= confirmed) {
            self.held.pop_front();
        }
    }

    /// Reads and sends one chunk; `false` once the transfer ended for this recipient.
    async fn chunk(
        &mut self,
        node: &NodeState,
        transfer: &Transfer,
        (attempt, offset, len): (u32, u64, u64),
    ) -> bool {
        // Reading (and hashing again after a resume) waits on the disk: not on a runtime worker.
        let Some(mut taken) = self.reader.take() else { return false };
        let name = self.name.clone();
        let ack_every = u32::try_from(self.ack_every).unwrap_or(u32::MAX);
        let Ok((back, read)) = tokio::task::spawn_blocking(move || {
            let read = taken
                .frame(ChunkHead { attempt, name: &name, size: taken.stamp.size, offset, ack_every }, len);
            (taken, read)
        })
        .await
        else {
            return false;
        };
        self.reader = Some(back);
        let frame = match read {
            Ok(frame) => frame,
            Err(ReadError::Changed(reason)) => {
                settle_all(node, transfer, &Outcome::failed(SOURCE_CHANGED, &reason), &reason);
                return false;
            }
            Err(ReadError::Io(e)) => {
                let reason = format!("cannot read '{}': {e}", self.source);
                settle_all(node, transfer, &Outcome::failed(SOURCE_UNREADABLE, &reason), &reason);
                return false;
            }
        };
        let stats = &node.files().stats;
        stats.sent_bytes.fetch_add(len, Ordering::Relaxed);
        stats.resent_bytes.fetch_add(self.high.min(offset + len).saturating_sub(offset), Ordering::Relaxed);
        self.high = self.high.max(offset + len);
        let mut message = chunk_message(transfer, self.stream, frame);
        if !self.stages.is_empty() {
            self.stages.run(&mut [&mut message]);
        }
        if let Err(reason) = deliver(node, message) {
            let to = transfer.lock().0.recipients[self.stream].0.clone();
            settle(node, transfer, self.stream, Outcome::failed("no_route", &reason));
            warn!(id = %transfer.id, to = %to, reason, "File transfer to a recipient failed.");
            return false;
        }
        true
    }
}

/// What the task of `stream` does next, moving its `next` on when it sends.
fn next(transfer: &Transfer, stream: usize, sender: &Sender, limit: u64) -> Next {
    let mut inner = transfer.lock();
    let (record, streams) = &mut *inner;
    let (_, attempt, state) = &record.recipients[stream];
    let s = &mut streams[stream];
    if *state != StreamState::Open {
        return Next::Done;
    }
    let size = record.stamp.size;
    if s.querying.is_some() {
        return Next::Wait;
    }
    let now = Instant::now();
    if s.next > s.confirmed && s.heard.get_or_insert(now).elapsed() >= QUIET {
        let (to, attempt, _) = &mut record.recipients[stream];
        *attempt += 1;
        (s.querying, s.heard) = (Some(now), Some(now));
        let (to, attempt) = (to.clone(), *attempt);
        let mut batch = Batch::new();
        record.write(&mut batch);
        return Next::Ask { attempt, to, priority: record.priority, record: batch };
    }
    if s.next >= size && size > 0 || s.next.saturating_sub(s.confirmed) >= sender.window {
        return Next::Wait;
    }
    if size == 0 && s.next > 0 {
        return Next::Wait;
    }
    let offset = s.next;
    if offset >= limit {
        // Blocks end at multiples of `ack_every`, where the recipient confirms.
        let end = (offset / sender.ack_every + 1).saturating_mul(sender.ack_every);
        return Next::Budget { from: offset, to: end.min(size).max(offset + 1) };
    }
    let len = sender.chunk_bytes.min(size - offset).min(limit - offset);
    // An empty file is one empty chunk (marked sent by moving past it).
    s.next = if size == 0 { 1 } else { offset + len };
    Next::Chunk { attempt: *attempt, offset, len }
}

/// A chunk frame of `transfer` for recipient `stream`, as a message of the transfer's id.
fn chunk_message(transfer: &Transfer, stream: usize, frame: Bytes) -> Message {
    let inner = transfer.lock();
    let record = &inner.0;
    frame_message(&transfer.id, record.priority, &record.recipients[stream].0, remaining(record), frame)
}

/// What is left of a transfer's lifetime.
fn remaining(record: &OutRecord) -> Lifetime {
    match record.deadline_unix_ms {
        0 => Lifetime::UNLIMITED,
        deadline => Lifetime::from_ms(deadline.saturating_sub(crate::clock::unix_ms()).max(1)),
    }
}

fn frame_message(id: &MessageId, priority: u8, to: &Address, lifetime: Lifetime, frame: Bytes) -> Message {
    let priority = Priority::from_code(priority).unwrap_or_default();
    let mut content = Content::buf(to.clone(), frame)
        .with_priority(priority)
        .with_reliability(Reliability::Persistent)
        .with_lifetime(lifetime);
    content.kind = Kind::File;
    content.name = FRAME_NAME.to_owned();
    Message::new(id.clone(), content)
}

/// Hands a chunk to the link towards its recipient, without a record (the file is its
/// record), or takes it here for a recipient of this node.
///
/// On a link straight to the recipient's node a chunk travels volatile: the recipient then
/// takes it without syncing its store before acknowledging it (the transfer's own records
/// need no sync: a restarted recipient checks its partial file against them and asks for
/// what it lacks). Through relays it stays persistent, so that each relay spools it to
/// disk.
fn deliver(node: &NodeState, mut message: Message) -> Result<(), String> {
    let Some(to) = message.content.recipients.first().cloned() else { return Ok(()) };
    let now = Instant::now();
    match node.routing().next_hop(&to.node)? {
        crate::routing::Hop::Local => {
            super::arrived(node, message, Batch::new(), now).map_err(|e| e.to_string())
        }
        crate::routing::Hop::Via(peer) => {
            let link = node.link(&peer).ok_or_else(|| format!("no link to {peer}"))?;
            if peer == to.node {
                message.content.reliability = Reliability::Volatile;
            }
            link.enqueue_unrecorded(message, now);
            Ok(())
        }
    }
}

/// Sends a frame that must arrive (`Query`, `Cancel`) like any persistent message: stored
/// until its link's peer has it.
fn send_stored(node: &NodeState, message: Message) {
    let here = message.content.recipients.first().is_some_and(|to| &to.node == node.name());
    if here {
        let _ = super::arrived(node, message, Batch::new(), Instant::now());
        return;
    }
    super::place(node, message, Batch::new());
}

/// Asks `to` how far it is with the transfer (answered by `Resume`).
fn query(node: &NodeState, id: &MessageId, priority: u8, to: &Address, attempt: u32) {
    send_stored(
        node,
        frame_message(id, priority, to, Lifetime::UNLIMITED, Frame::Query { attempt }.encode()),
    );
}

/// Takes a recipient's answer about one of this node's transfers.
pub(crate) fn answer(node: &NodeState, recipient: &Address, frame: Frame) {
    let sequence = match &frame {
        Frame::Resume { transfer, .. }
        | Frame::Progress { transfer, .. }
        | Frame::Done { transfer, .. }
        | Frame::Refuse { transfer, .. } => *transfer,
        _ => return,
    };
    let Some(transfer) = node.files().outgoing.lock().get(&sequence).cloned() else { return };
    let Some(stream) = transfer.lock().0.recipients.iter().position(|(to, ..)| to == recipient) else {
        return;
    };
    match frame {
        Frame::Progress { verified, .. } => {
            let mut inner = transfer.lock();
            let s = &mut inner.1[stream];
            s.confirmed = s.confirmed.max(verified);
            s.heard = Some(Instant::now());
            s.note.clear();
        }
        Frame::Resume { attempt, from, note, .. } => resume(node, &transfer, stream, attempt, from, note),
        Frame::Done { digest, .. } => {
            info!(id = %transfer.id, to = %recipient, blake3 = %linkbus_plugin_api::hex::encode(&digest), "File delivered.");
            settle(node, &transfer, stream, Outcome::Delivered);
        }
        Frame::Refuse { code, reason, .. } => {
            warn!(id = %transfer.id, to = %recipient, code, reason, "File refused by its recipient.");
            settle(node, &transfer, stream, Outcome::failed(&code, &reason));
        }
        _ => {}
    }
    transfer.changed.notify_waiters();
}

/// A recipient asks for the bytes from `from` as attempt `attempt` (a newer one than sent,
/// or the answer to this node's `Query`).
fn resume(node: &NodeState, transfer: &Transfer, stream: usize, attempt: u32, from: u64, note: String) {
    let mut batch = Batch::new();
    {
        let mut inner = transfer.lock();
        let (record, streams) = &mut *inner;
        let current = &mut record.recipients[stream].1;
        let s = &mut streams[stream];
        if attempt < *current || attempt == *current && s.querying.is_none() {
            return; // Stale: an answer to an attempt already taken up.
        }
        *current = attempt;
        s.querying = None;
        s.heard = Some(Instant::now());
        s.next = from.min(record.stamp.size);
        s.confirmed = s.next;
        s.note = note;
        record.write(&mut batch);
    }
    node.committer().write(batch);
}

/// Records `outcome` for recipient `stream` (if still open); once every recipient is
/// settled, removes the source when asked and every recipient has it, and forgets the
/// transfer.
fn settle(node: &NodeState, transfer: &Transfer, stream: usize, outcome: Outcome) {
    let mut batch = Batch::new();
    let (to, finished) = {
        let mut inner = transfer.lock();
        let record = &mut inner.0;
        let (to, _, state) = &mut record.recipients[stream];
        if *state != StreamState::Open {
            return;
        }
        *state = if outcome == Outcome::Delivered { StreamState::Delivered } else { StreamState::Failed };
        let to = to.clone();
        let finished = record.recipients.iter().all(|(_, _, s)| *s != StreamState::Open);
        if finished {
            batch.delete(record::OUT_SPACE, OutRecord::key(record.sequence).to_vec());
        } else {
            record.write(&mut batch);
        }
        (to, finished.then(|| record.clone()))
    };
    node.record_result(&transfer.id, &to, outcome);
    if let Some(record) = finished {
        let files = node.files();
        if record.delete_after && record.recipients.iter().all(|(_, _, s)| *s == StreamState::Delivered) {
            match files.dir.remove(&record.source) {
                Ok(()) => info!(id = %transfer.id, file = %record.source, "File removed after sending."),
                Err(e) => {
                    warn!(id = %transfer.id, file = %record.source, error = %e, "File sent, but not removed.")
                }
            }
        }
        files.outgoing.lock().remove(&record.sequence);
    }
    node.committer().write(batch);
    transfer.changed.notify_waiters();
}

/// Settles every open recipient with `outcome`, telling each the transfer is off.
fn settle_all(node: &NodeState, transfer: &Transfer, outcome: &Outcome, reason: &str) {
    let open: Vec<(usize, Address, u8)> = {
        let inner = transfer.lock();
        let record = &inner.0;
        record
            .recipients
            .iter()
            .enumerate()
            .filter(|(_, (_, _, s))| *s == StreamState::Open)
            .map(|(i, (to, ..))| (i, to.clone(), record.priority))
            .collect()
    };
    for (stream, to, priority) in open {
        let cancel = Frame::Cancel { reason: reason.to_owned() };
        send_stored(node, frame_message(&transfer.id, priority, &to, Lifetime::UNLIMITED, cancel.encode()));
        settle(node, transfer, stream, outcome.clone());
    }
    warn!(id = %transfer.id, reason, "File transfer ended.");
}
