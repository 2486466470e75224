//! The linkbus client library: talks to a local node over its Unix socket, or to a node in
//! the same program directly ([`Client::in_process`], `linkbus_host::Node::client`). It
//! holds the client protocol ([`protocol`]) and links no node.
//!
//! Modules:
//! - `admin`: the [`Client`] requests not about messages (queues, links, routes, reload,
//!   results, transactions, subscriptions, limits, status);
//! - [`protocol`]: the requests and responses on a node's client socket;
//! - [`results`]: what a client learns of its messages' results;
//! - [`runtime_dir`]: where clients find a node's socket;
//! - [`vectored`]: writing many buffers with few system calls.
//!
//! ```no_run
//! # async fn example() -> Result<(), linkbus_client::ClientError> {
//! use linkbus_client::Client;
//! use linkbus_plugin_api::Content;
//! use std::time::Duration;
//!
//! let mut a = Client::connect_node("A").await?;
//! a.put(Content::buf("B:orders".parse().unwrap(), "hello")).await?;
//! let mut b = Client::connect_node("B").await?;
//! let got = b.get("orders", 1, Duration::from_secs(5)).await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use bytes::BytesMut;
use linkbus_plugin_api::{Content, Message, MessageId};
use linkbus_proto::wire::Chunks;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;

use protocol::{ErrorCode, GetGroups, Request, Response, split_frame};

mod admin;
mod consumer;
mod error;
mod files;
pub mod protocol;
pub mod results;
pub mod runtime_dir;
mod transaction;
pub mod vectored;

pub use consumer::Consumer;
pub use error::ClientError;
use error::counting_earlier;
pub use files::{FileDirection, FileTransfer, SendFile};
pub use transaction::Transaction;

/// Encoded bytes [`Client::put_batch`] packs into one request at most (a larger single
/// message goes alone).
pub const PUT_BATCH_BYTES_MAX: usize = 1 << 20;
/// Contents [`Client::put_batch`] packs into one request at most.
pub const PUT_BATCH_MESSAGES_MAX: usize = 4096;
/// Longest response the client accepts.
const RESPONSE_BYTES_MAX: usize = 1 << 30;
/// Puts made with [`Client::put_async`] whose answers the client has not read, at most:
/// one more first reads the oldest answer. Their answers wait in the socket meanwhile, and
/// a node that cannot write an answer reads no more requests, so they must fit there
/// (a Unix socket holds some hundreds of small writes by default).
pub const PUTS_UNANSWERED_MAX: usize = 64;

/// How long past its put timeout a put's answer may take before the outcome is unknown.
pub const PUT_ANSWER_MARGIN: Duration = Duration::from_secs(10);

/// How long [`Client::put`] waits for room in a full queue unless told otherwise.
pub const PUT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// A connection to one local node. Requests are answered in order on the connection, so a
/// call must not be cancelled halfway (for example by dropping it in a `select!` or a
/// timeout): a client whose call was abandoned refuses further calls
/// ([`ClientError::Broken`]), and messages a `get` had taken may be lost. Give the node a
/// wait instead (`get`'s `wait`). An in-process client follows the same rules.
#[derive(Debug)]
pub struct Client {
    /// How long a put waits for room in a full queue.
    put_timeout: Duration,
    /// Puts are no-wait puts (see [`Client::set_no_wait`]).
    no_wait: bool,
    /// A call ended without its answer: the stream is out of step.
    broken: bool,
    /// Puts made with [`Client::put_async`] whose answers were not read yet (they come
    /// before any later answer on the connection).
    unanswered: usize,
    /// The outcomes of puts made with [`Client::put_async`], read and not yet handed out
    /// by [`Client::flush`].
    outcomes: Vec<Result<MessageId, ClientError>>,
    /// The node's size limits, once asked for (see [`Client::limits`]).
    limits: Option<NodeLimits>,
    /// A [`Transaction`] guard was dropped without commit: its rollback goes first.
    rollback_due: bool,
    to: To,
}

/// A node's size limits, for checking a message before sending it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeLimits {
    /// Largest payload the node accepts (`messages.message_bytes_max`).
    pub message_bytes_max: u64,
    /// Largest request it reads (a larger one is answered `TooLarge` and dropped unread).
    pub frame_bytes_max: u64,
}

/// Payloads up to this size are sent without asking the node's limits: every node takes
/// requests of this size (its frame limit is at least 1.5 MiB), and answers one whose
/// payload is over its message limit with a refusal.
const LIMITS_UNASKED_BYTES: usize = 1 << 20;

/// How a client reaches its node.
enum To {
    /// The node's Unix socket.
    Socket {
        stream: UnixStream,
        buf: BytesMut,
        /// The request being written, and its chunks.
        out: Chunks,
        parts: Vec<bytes::Bytes>,
    },
    /// A node in this process: requests are answered by direct calls (no socket, no
    /// encoding), with the same rules.
    InProcess(Box<dyn InProcessNode>),
}

/// A node in this process, as one client connection sees it: it answers requests as its
/// socket server would, and what the connection holds (messages taken pending, an open
/// transaction) goes back when it drops. `linkbus_host::Node::client` makes one.
pub trait InProcessNode: Send {
    /// The node's name.
    fn name(&self) -> &str;

    /// Answers `request`.
    fn call(&mut self, request: Request) -> Pin<Box<dyn Future<Output = Response> + Send + '_>>;
}

impl std::fmt::Debug for To {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Socket { stream, .. } => f.debug_tuple("Socket").field(stream).finish(),
            Self::InProcess(node) => f.debug_tuple("InProcess").field(&node.name()).finish(),
        }
    }
}

/// A message handed out pending by [`Client::get_pending`], with the tag that acknowledges
/// it.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// Acknowledges or backs out this message on the connection that got it.
    pub tag: u64,
    /// The message.
    pub message: Message,
}

impl Client {
    /// Connects to the node listening on `path`.
    ///
    /// # Errors
    /// [`ClientError::Connect`] when nothing answers there.
    pub async fn connect(path: &Path) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| ClientError::Connect { path: path.to_owned(), source })?;
        let (buf, out, parts) = (BytesMut::with_capacity(64 * 1024), Chunks::default(), Vec::new());
        Ok(Self::with(To::Socket { stream, buf, out, parts }))
    }

    /// A client of a node running in this process (`linkbus_host::Node::client` makes
    /// one): the same calls and rules as over the socket, answered by direct calls — no
    /// socket, no encoding. Messages it took pending go back, and its open transaction is
    /// rolled back, when it drops (as when a connection closes).
    pub fn in_process(node: Box<dyn InProcessNode>) -> Self {
        Self::with(To::InProcess(node))
    }

    fn with(to: To) -> Self {
        Self {
            put_timeout: PUT_TIMEOUT_DEFAULT,
            no_wait: false,
            broken: false,
            rollback_due: false,
            unanswered: 0,
            outcomes: Vec::new(),
            limits: None,
            to,
        }
    }

    /// Connects to the local node called `name` through the runtime directory.
    ///
    /// # Errors
    /// [`ClientError::Connect`] when no such node runs.
    pub async fn connect_node(name: &str) -> Result<Self, ClientError> {
        Self::connect(&runtime_dir::socket_for(name)).await
    }

    async fn call(&mut self, request: Request) -> Result<Response, ClientError> {
        self.settle_unanswered(0).await?;
        self.settle_rollback().await?;
        self.exchange(request).await
    }

    /// Rolls back the transaction of a [`Transaction`] guard dropped without commit.
    async fn settle_rollback(&mut self) -> Result<(), ClientError> {
        if std::mem::take(&mut self.rollback_due) {
            self.settle_unanswered(0).await?;
            self.exchange(Request::Rollback).await?;
        }
        Ok(())
    }

    /// Sends `request` and reads its answer (no answers owed before it).
    async fn exchange(&mut self, request: Request) -> Result<Response, ClientError> {
        // Until the answer is in: a call abandoned half way (or failed) leaves the stream
        // out of step, and the client refuses further calls rather than mix up answers.
        self.broken = true;
        let response = match &mut self.to {
            To::Socket { stream, buf, out, parts } => {
                // Large payloads are shared into a vectored write, not copied.
                send(stream, out, parts, &request).await?;
                read_response(stream, buf).await?
            }
            To::InProcess(node) => node.call(request).await,
        };
        self.broken = false;
        if let Response::Error { code, accepted, message } = response {
            return Err(ClientError::Refused { code, accepted, message });
        }
        Ok(response)
    }

    /// Makes puts no-wait puts: they fail at once when a queue is full and refuse persistent
    /// messages (nothing would vouch for them) — the fast path for volatile traffic.
    pub fn set_no_wait(&mut self, no_wait: bool) {
        self.no_wait = no_wait;
    }

    /// Sets how long puts wait for room when a destination queue is full (zero: they fail
    /// at once, like [`Client::try_put`]). The node never waits longer than a message's
    /// lifetime; past the timeout and [`PUT_ANSWER_MARGIN`] without an answer, a put fails
    /// with [`ClientError::OutcomeUnknown`].
    pub fn set_put_timeout(&mut self, timeout: Duration) {
        self.put_timeout = timeout;
    }

    /// Puts one message, waiting up to the put timeout (default
    /// [`PUT_TIMEOUT_DEFAULT`]) for room if its queue is full; returns its id once the node
    /// accepted it.
    ///
    /// # Errors
    /// [`ClientError::Refused`] naming the cause (unknown queue, no route, too large, still
    /// full at the deadline: then it was not accepted).
    pub async fn put(&mut self, content: Content) -> Result<MessageId, ClientError> {
        let mut ids = self.put_batch_within(vec![content], self.put_timeout).await?;
        ids.pop().ok_or_else(|| ClientError::Protocol("no id returned".into()))
    }

    /// Puts one message without waiting for the node's answer: the request is written, and
    /// its answer read later — by [`Client::flush`], which hands out the outcomes, or
    /// first thing by the next call (which keeps them for `flush`). A producer putting one
    /// message at a time so pays no round trip per message. The node takes the puts in
    /// order, each as [`Client::put`] would (the put timeout, no-wait); one refused does
    /// not stop those after it. At most [`PUTS_UNANSWERED_MAX`] go unanswered: one more
    /// first waits for the oldest answer. An in-process client puts at once.
    ///
    /// # Errors
    /// Only for the connection ([`ClientError::Io`], [`ClientError::Broken`],
    /// [`ClientError::Protocol`] for an answer that is not a put's, or
    /// [`ClientError::OutcomeUnknown`] when the oldest answer did not come in time): a
    /// refusal is an outcome, handed out by `flush`.
    pub async fn put_async(&mut self, content: Content) -> Result<(), ClientError> {
        self.settle_unanswered(PUTS_UNANSWERED_MAX - 1).await?;
        let timeout_ms = wait_ms(self.put_timeout);
        let request = Request::Put { contents: vec![content], timeout_ms, no_wait: self.no_wait };
        if self.rollback_due {
            self.settle_rollback().await?;
        }
        let To::Socket { stream, out, parts, .. } = &mut self.to else {
            let outcome = self.call(request).await.and_then(single_id);
            self.outcomes.push(outcome);
            return Ok(());
        };
        self.broken = true;
        send(stream, out, parts, &request).await?;
        self.unanswered += 1;
        self.broken = false;
        Ok(())
    }

    /// Reads the answers of the puts made with [`Client::put_async`] and returns the
    /// outcome of each put since the last flush, in the order they were made: its id, or
    /// why it was refused (as [`Client::put`] would fail).
    ///
    /// # Errors
    /// Only for the connection: [`ClientError::Io`], [`ClientError::Broken`],
    /// [`ClientError::Protocol`] for an answer that is not a put's, or
    /// [`ClientError::OutcomeUnknown`] when an answer did not come within the put timeout
    /// and [`PUT_ANSWER_MARGIN`]. The client is broken then; the outcomes read before stay
    /// for [`Client::take_outcomes`].
    pub async fn flush(&mut self) -> Result<Vec<Result<MessageId, ClientError>>, ClientError> {
        self.settle_unanswered(0).await?;
        Ok(self.take_outcomes())
    }

    /// The outcomes of puts made with [`Client::put_async`] whose answers were read, and
    /// not handed out yet — also after the connection failed, to learn which of them the
    /// node accepted.
    pub fn take_outcomes(&mut self) -> Vec<Result<MessageId, ClientError>> {
        std::mem::take(&mut self.outcomes)
    }

    /// Reads the answers owed to puts made with [`Client::put_async`] until at most `left`
    /// are owed, each within the put timeout and [`PUT_ANSWER_MARGIN`], keeping their
    /// outcomes.
    ///
    /// # Errors
    /// [`ClientError::Broken`] for a connection out of step already, else as
    /// [`Client::flush`].
    async fn settle_unanswered(&mut self, left: usize) -> Result<(), ClientError> {
        if self.broken {
            return Err(ClientError::Broken);
        }
        let To::Socket { stream, buf, .. } = &mut self.to else { return Ok(()) };
        if self.unanswered <= left {
            return Ok(());
        }
        self.broken = true;
        while self.unanswered > left {
            let response = read_answer_within(stream, buf, self.put_timeout).await?;
            self.outcomes.push(put_outcome(response)?);
            self.unanswered -= 1;
        }
        self.broken = false;
        Ok(())
    }

    /// Puts one message, failing at once if its queue is full.
    ///
    /// # Errors
    /// As [`Client::put`].
    pub async fn try_put(&mut self, content: Content) -> Result<MessageId, ClientError> {
        let mut ids = self.put_batch_within(vec![content], Duration::ZERO).await?;
        ids.pop().ok_or_else(|| ClientError::Protocol("no id returned".into()))
    }

    /// Puts many messages with few round trips (see [`PUT_BATCH_BYTES_MAX`]); they are
    /// accepted in order, and on a refusal those before it stay accepted (the error's
    /// `accepted` counts them, across the requests the put went in; another failure after
    /// some were accepted is [`ClientError::PartlyAccepted`]).
    ///
    /// # Errors
    /// As [`Client::put`].
    pub async fn put_batch(&mut self, contents: Vec<Content>) -> Result<Vec<MessageId>, ClientError> {
        self.put_batch_within(contents, self.put_timeout).await
    }

    /// Puts `contents` as one message group named `id`: member `i` gets index `i`, the last
    /// one closes the group. The recipients hold the members until all have arrived and
    /// hand them out together, in index order ([`Client::get_group`]). Inside a
    /// transaction, a group must end before another begins.
    ///
    /// # Errors
    /// As [`Client::put_batch`]; [`ClientError::Refused`] (code `Invalid`) for an empty
    /// group, or a group put while another one is open on this connection.
    pub async fn put_group(
        &mut self,
        id: &str,
        contents: Vec<Content>,
    ) -> Result<Vec<MessageId>, ClientError> {
        if contents.is_empty() {
            let message = format!("group '{id}' has no message");
            return Err(ClientError::Refused { code: ErrorCode::Invalid, accepted: 0, message });
        }
        let last = contents.len() - 1;
        let contents = contents
            .into_iter()
            .enumerate()
            .map(|(i, c)| c.in_group(id, u32::try_from(i).unwrap_or(u32::MAX), i == last))
            .collect();
        self.put_batch(contents).await
    }

    async fn put_batch_within(
        &mut self,
        contents: Vec<Content>,
        timeout: Duration,
    ) -> Result<Vec<MessageId>, ClientError> {
        // A payload the node would refuse is refused here, before the bytes are sent (those
        // before it are put, as the node would).
        if matches!(self.to, To::Socket { .. })
            && contents.iter().any(|c| c.payload.len() > LIMITS_UNASKED_BYTES)
        {
            let max = self.limits().await?.message_bytes_max;
            if let Some(index) = contents.iter().position(|c| c.payload.len() as u64 > max) {
                let size = contents.get(index).map_or(0, |c| c.payload.len());
                let mut before = contents;
                before.truncate(index);
                let put = Box::pin(self.put_batch_within(before, timeout)).await?;
                return Err(ClientError::Refused {
                    code: ErrorCode::TooLarge,
                    accepted: u32::try_from(put.len()).unwrap_or(u32::MAX),
                    message: format!(
                        "message {}: payload of {size} bytes is over the node's messages.message_bytes_max \
                         {max}; not sent",
                        index + 1
                    ),
                });
            }
        }
        // How many go in each request, from the sizes alone: the contents are moved once,
        // into their request (as they came, when one request takes them all).
        let mut counts = Vec::new();
        let (mut count, mut bytes) = (0, 0);
        for content in &contents {
            let size = linkbus_proto::wire::content_encoded_len(content);
            if count > 0 && (bytes + size > PUT_BATCH_BYTES_MAX || count >= PUT_BATCH_MESSAGES_MAX) {
                counts.push(count);
                (count, bytes) = (0, 0);
            }
            (count, bytes) = (count + 1, bytes + size);
        }
        if counts.is_empty() {
            return if contents.is_empty() {
                Ok(Vec::new())
            } else {
                self.put_request(contents, timeout).await
            };
        }
        counts.push(count);
        let mut ids = Vec::with_capacity(contents.len());
        let mut contents = contents.into_iter();
        for count in counts {
            let batch = contents.by_ref().take(count).collect();
            match self.put_request(batch, timeout).await {
                Ok(put) => ids.extend(put),
                Err(e) => return Err(counting_earlier(e, ids.len())),
            }
        }
        Ok(ids)
    }

    async fn put_request(
        &mut self,
        batch: Vec<Content>,
        timeout: Duration,
    ) -> Result<Vec<MessageId>, ClientError> {
        // Answers owed to earlier puts first, each within its own time.
        self.settle_unanswered(0).await?;
        let timeout_ms = wait_ms(timeout);
        // The node answers within the timeout; past it (and a margin), the outcome is unknown.
        let answer = tokio::time::timeout(
            timeout + PUT_ANSWER_MARGIN,
            self.call(Request::Put { contents: batch, timeout_ms, no_wait: self.no_wait }),
        )
        .await;
        // (An abandoned call leaves the client broken.)
        let Ok(answer) = answer else {
            return Err(ClientError::OutcomeUnknown(timeout + PUT_ANSWER_MARGIN));
        };
        match answer? {
            Response::PutOk { source, sequences, created_unix_ms } => Ok(sequences
                .into_iter()
                .map(|sequence| MessageId { source: source.clone(), sequence, created_unix_ms })
                .collect()),
            other => Err(ClientError::Protocol(format!("unexpected answer to put: {other:?}"))),
        }
    }

    /// Takes up to `count_max` messages from the local queue `queue`, waiting up to `wait`
    /// for the first; they leave the queue at once (automatic acknowledgement). An empty
    /// result means the wait ran out.
    ///
    /// # Errors
    /// [`ClientError::Refused`] when the queue does not exist, or (code `Internal`) when
    /// the node shuts down while the get waits.
    pub async fn get(
        &mut self,
        queue: &str,
        count_max: u32,
        wait: Duration,
    ) -> Result<Vec<Message>, ClientError> {
        let (messages, _) =
            self.get_request(queue, count_max, wait, u64::MAX, false, GetGroups::Complete).await?;
        Ok(messages)
    }

    /// Takes one whole message group from `queue` (the first in queue order whose members
    /// have all arrived), its members in index order, waiting up to `wait` for one; they
    /// leave the queue at once. Messages outside groups stay. An empty result means the
    /// wait ran out.
    ///
    /// # Errors
    /// As [`Client::get`].
    pub async fn get_group(&mut self, queue: &str, wait: Duration) -> Result<Vec<Message>, ClientError> {
        let (messages, _) = self.get_request(queue, 1, wait, u64::MAX, false, GetGroups::Whole).await?;
        Ok(messages)
    }

    /// Like [`Client::get_group`], the members handed out pending (see
    /// [`Client::get_pending`]). Acknowledge the group by its last member's tag (which
    /// acknowledges every member), before getting anything else on this connection.
    ///
    /// # Errors
    /// As [`Client::get_pending`].
    pub async fn get_group_pending(
        &mut self,
        queue: &str,
        wait: Duration,
        bytes_max: u64,
    ) -> Result<Vec<Delivery>, ClientError> {
        self.get_pending_with(queue, 1, wait, bytes_max, GetGroups::Whole).await
    }

    /// [`Client::get_pending`] with groups handed out as `groups` says.
    ///
    /// # Errors
    /// As [`Client::get_pending`].
    pub async fn get_pending_with(
        &mut self,
        queue: &str,
        count_max: u32,
        wait: Duration,
        bytes_max: u64,
        groups: GetGroups,
    ) -> Result<Vec<Delivery>, ClientError> {
        let (messages, tags) = self.get_request(queue, count_max, wait, bytes_max, true, groups).await?;
        deliveries(messages, tags)
    }

    /// Like [`Client::get`], but members of groups still arriving are taken too, one by one
    /// in index order (after the messages free to hand out), rather than held until their
    /// group is complete.
    ///
    /// # Errors
    /// As [`Client::get`].
    pub async fn get_members(
        &mut self,
        queue: &str,
        count_max: u32,
        wait: Duration,
    ) -> Result<Vec<Message>, ClientError> {
        let (messages, _) =
            self.get_request(queue, count_max, wait, u64::MAX, false, GetGroups::Members).await?;
        Ok(messages)
    }

    /// Like [`Client::get`], but the messages are handed out *pending*: they leave the
    /// queue only when [`Client::ack`] acknowledges them, and come back to it (marked
    /// redelivered, their backout count raised) on [`Client::backout`] or when this
    /// connection ends first. A message longer than `bytes_max` at the head fails the call
    /// with [`ClientError::Refused`] (code `TooLarge`, its size in the message) and stays.
    ///
    /// # Errors
    /// [`ClientError::Refused`] when the queue does not exist, the message is too large,
    /// or (code `Internal`) the node shuts down while the get waits.
    pub async fn get_pending(
        &mut self,
        queue: &str,
        count_max: u32,
        wait: Duration,
        bytes_max: u64,
    ) -> Result<Vec<Delivery>, ClientError> {
        let (messages, tags) =
            self.get_request(queue, count_max, wait, bytes_max, true, GetGroups::Complete).await?;
        deliveries(messages, tags)
    }

    async fn get_request(
        &mut self,
        queue: &str,
        count_max: u32,
        wait: Duration,
        bytes_max: u64,
        pending: bool,
        groups: GetGroups,
    ) -> Result<(Vec<Message>, Vec<u64>), ClientError> {
        let request = Request::Get {
            queue: queue.to_owned(),
            count_max,
            wait_ms: wait.as_millis() as u64,
            bytes_max,
            pending,
            groups,
        };
        match self.call(request).await? {
            Response::Messages { messages, tags } => Ok((messages, tags)),
            other => Err(ClientError::Protocol(format!("unexpected answer to get: {other:?}"))),
        }
    }

    /// Acknowledges messages handed out by [`Client::get_pending`] on this connection: they
    /// leave the queue. Returns how many.
    ///
    /// # Errors
    /// [`ClientError::Refused`] when a tag was not handed out pending on this connection
    /// (nothing is acknowledged then).
    pub async fn ack(&mut self, queue: &str, tags: &[u64]) -> Result<u32, ClientError> {
        self.settle(Request::Ack { queue: queue.to_owned(), tags: tags.to_vec() }, "ack").await
    }

    /// Gives messages handed out by [`Client::get_pending`] back to their queue: they return
    /// to its head, marked redelivered, their backout count raised. Returns how many.
    ///
    /// # Errors
    /// As [`Client::ack`].
    pub async fn backout(&mut self, queue: &str, tags: &[u64]) -> Result<u32, ClientError> {
        self.settle(Request::Backout { queue: queue.to_owned(), tags: tags.to_vec() }, "backout").await
    }

    async fn settle(&mut self, request: Request, what: &str) -> Result<u32, ClientError> {
        match self.call(request).await? {
            Response::Settled(count) => Ok(count),
            other => Err(ClientError::Protocol(format!("unexpected answer to {what}: {other:?}"))),
        }
    }

    /// Copies of up to `count_max` messages waiting in `queue`, in hand-out order, without
    /// taking them.
    ///
    /// # Errors
    /// [`ClientError::Refused`] when the queue does not exist.
    pub async fn browse(&mut self, queue: &str, count_max: u32) -> Result<Vec<Message>, ClientError> {
        match self.call(Request::Browse { queue: queue.to_owned(), count_max }).await? {
            Response::Messages { messages, .. } => Ok(messages),
            other => Err(ClientError::Protocol(format!("unexpected answer to browse: {other:?}"))),
        }
    }

    /// Copies of up to `count_max` messages that came into `queue` after the one with key
    /// `after` (0: from the first), without taking them, oldest first, each with its key
    /// (the next call's `after`); waits up to `wait` for the first. Several clients can
    /// follow one queue, each seeing every message.
    ///
    /// # Errors
    /// [`ClientError::Refused`] when the queue does not exist.
    pub async fn follow(
        &mut self,
        queue: &str,
        after: u64,
        count_max: u32,
        wait: Duration,
    ) -> Result<Vec<(u64, Message)>, ClientError> {
        let request = Request::Follow { queue: queue.to_owned(), after, count_max, wait_ms: wait_ms(wait) };
        match self.call(request).await? {
            Response::Messages { messages, tags } => Ok(tags.into_iter().zip(messages).collect()),
            other => Err(ClientError::Protocol(format!("unexpected answer to follow: {other:?}"))),
        }
    }
}

/// A timeout in whole milliseconds for the node, rounded up, so a sub-millisecond one still
/// waits rather than becoming a try.
fn wait_ms(timeout: Duration) -> u64 {
    timeout.as_micros().div_ceil(1000) as u64
}

/// Writes `request` on a client's connection (large payloads shared into a vectored
/// write, not copied).
async fn send(
    stream: &mut UnixStream,
    out: &mut Chunks,
    parts: &mut Vec<bytes::Bytes>,
    request: &Request,
) -> std::io::Result<()> {
    request.encode_chunks(out);
    out.take(parts);
    vectored::write_all(stream, parts).await
}

/// Reads the next response on a client's connection.
///
/// Cancel-safe: what was read stays in `buf`.
async fn read_response(stream: &mut UnixStream, buf: &mut BytesMut) -> Result<Response, ClientError> {
    loop {
        if let Some((kind, body)) = split_frame(buf, RESPONSE_BYTES_MAX).map_err(ClientError::Protocol)? {
            return Response::decode(kind, body).map_err(|e| ClientError::Protocol(e.to_string()));
        }
        if stream.read_buf(buf).await? == 0 {
            return Err(ClientError::Protocol("the node closed the connection".into()));
        }
    }
}

/// Reads the answer of a put made with [`Client::put_async`], waiting at most as long as
/// [`Client::put`] would.
async fn read_answer_within(
    stream: &mut UnixStream,
    buf: &mut BytesMut,
    put_timeout: Duration,
) -> Result<Response, ClientError> {
    tokio::time::timeout(put_timeout + PUT_ANSWER_MARGIN, read_response(stream, buf))
        .await
        .map_err(|_| ClientError::OutcomeUnknown(put_timeout + PUT_ANSWER_MARGIN))?
}

/// The outcome of a put of one message from its answer: its id, or the refusal.
///
/// # Errors
/// [`ClientError::Protocol`] for an answer that is neither.
fn put_outcome(response: Response) -> Result<Result<MessageId, ClientError>, ClientError> {
    match response {
        Response::Error { code, accepted, message } => {
            Ok(Err(ClientError::Refused { code, accepted, message }))
        }
        other => single_id(other).map(Ok),
    }
}

/// The id in the answer to a put of one message.
fn single_id(response: Response) -> Result<MessageId, ClientError> {
    match response {
        Response::PutOk { source, mut sequences, created_unix_ms } if sequences.len() == 1 => {
            let sequence = sequences.pop().unwrap_or_default();
            Ok(MessageId { source, sequence, created_unix_ms })
        }
        other => Err(ClientError::Protocol(format!("unexpected answer to a put of one message: {other:?}"))),
    }
}

/// Pairs a pending get's messages with their tags.
fn deliveries(messages: Vec<Message>, tags: Vec<u64>) -> Result<Vec<Delivery>, ClientError> {
    if tags.len() != messages.len() {
        return Err(ClientError::Protocol("a pending get came back without tags".into()));
    }
    Ok(tags.into_iter().zip(messages).map(|(tag, message)| Delivery { tag, message }).collect())
}
