//! The client API server: one task per client connection on the node's Unix socket,
//! answering requests in order.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tracing::{debug, warn};

use super::admin;
use super::groups::{HandedGroups, PutGroups};
use super::protocol::{ErrorCode, GetGroups, Request, Response, split_frame};
use super::queues::{queue_request, take};
use super::transaction::{Transaction, transact};
use crate::events::{Event, EventKind};
use crate::flow::{Origin, RefusalCode};
use crate::node::{NodeState, StartError};
use crate::queue::{LocalQueue, SettleError};
use linkbus_plugin_api::Reliability;
use linkbus_proto::reader::ReadError;
use linkbus_proto::wire::Chunks;

/// Most messages one `get` returns.
pub(crate) const GET_MESSAGES_MAX: u32 = 100_000;
/// Longest a put may wait for room in a full queue.
pub(crate) const PUT_WAIT_MS_MAX: u64 = 3_600_000;
/// Longest a `get` may wait.
pub(crate) const GET_WAIT_MS_MAX: u64 = 3_600_000;
/// Most encoded message bytes one `get` returns beyond its first message.
pub(crate) const GET_BYTES_MAX: usize = 64 << 20;

/// Messages handed out pending on one client connection, by queue; whatever is left when the
/// connection ends goes back to its queue (redelivered, backout count raised).
#[derive(Default)]
pub(super) struct PendingOnConnection {
    pub(super) queues: Vec<(Arc<LocalQueue>, std::collections::BTreeSet<u64>)>,
    /// The groups among them (for the group rules).
    groups: HandedGroups,
}

impl PendingOnConnection {
    /// Notes `messages` handed out pending from `queue` with `tags`.
    pub(super) fn add(
        &mut self,
        queue: &Arc<LocalQueue>,
        messages: &[linkbus_plugin_api::Message],
        tags: &[u64],
    ) {
        self.groups.add(queue, messages, tags);
        match self.queues.iter_mut().find(|(q, _)| Arc::ptr_eq(q, queue)) {
            Some((_, set)) => set.extend(tags),
            None => self.queues.push((queue.clone(), tags.iter().copied().collect())),
        }
    }

    /// Takes over what `other` holds pending (given back together when this drops).
    pub(super) fn absorb(&mut self, other: &mut Self) {
        for (queue, tags) in other.queues.drain(..) {
            match self.queues.iter_mut().find(|(q, _)| Arc::ptr_eq(q, &queue)) {
                Some((_, set)) => set.extend(tags),
                None => self.queues.push((queue, tags)),
            }
        }
    }

    /// Why nothing more may be taken on this connection now (a finished group handed out
    /// and not acknowledged).
    pub(super) fn blocked(&self) -> Option<String> {
        self.groups.blocked()
    }

    /// Settles `tags` of `queue` with `settle` (`ack`: an acknowledgement), if they were all
    /// handed out here; the last member of a group brings every member handed out here.
    pub(super) fn settle(
        &mut self,
        queue: &Arc<LocalQueue>,
        tags: &[u64],
        ack: bool,
        settle: impl FnOnce(&LocalQueue, &[u64]) -> Result<usize, SettleError>,
    ) -> Response {
        let tags = match self.groups.settling(queue, tags, ack) {
            Ok(tags) => tags,
            Err(reason) => return refused(ErrorCode::BadRequest, reason),
        };
        let tags = &tags[..];
        let Some((_, set)) = self.queues.iter_mut().find(|(q, _)| Arc::ptr_eq(q, queue)) else {
            return not_pending(tags);
        };
        let unknown: Vec<u64> = tags.iter().copied().filter(|t| !set.contains(t)).collect();
        if !unknown.is_empty() {
            return not_pending(&unknown);
        }
        match settle(queue, tags) {
            Ok(count) => {
                tags.iter().for_each(|t| {
                    set.remove(t);
                });
                self.groups.settled(queue, tags);
                Response::Settled(count as u32)
            }
            Err(SettleError::Unknown(e)) => not_pending(&e.0),
            Err(SettleError::Store(e)) => {
                Response::Error { code: ErrorCode::Internal, accepted: 0, message: e.to_string() }
            }
        }
    }
}

fn not_pending(tags: &[u64]) -> Response {
    let message = format!("tag(s) {tags:?} are not pending on this connection");
    Response::Error { code: ErrorCode::BadRequest, accepted: 0, message }
}

impl Drop for PendingOnConnection {
    fn drop(&mut self) {
        for (queue, tags) in self.queues.drain(..) {
            let tags: Vec<u64> = tags.into_iter().collect();
            if tags.is_empty() {
                continue;
            }
            match queue.backout(&tags, Instant::now()) {
                Ok(count) => debug!(queue = %queue.config().name, count, "Unacknowledged messages returned."),
                Err(e) => {
                    warn!(queue = %queue.config().name, error = %e, "Could not return unacknowledged messages.")
                }
            }
        }
    }
}

/// Completes when the client closes its connection while a request waits; bytes of a
/// pipelined request are kept in `buf` for later, up to a frame's worth (then it stops
/// reading ahead, and the request in `buf` is answered in its turn: refused when over the
/// limit).
async fn client_gone(stream: &mut UnixStream, buf: &mut BytesMut, frame_bytes_max: usize) {
    loop {
        match stream.read_buf(buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) if buf.len() > frame_bytes_max => return std::future::pending().await,
            Ok(_) => {}
        }
    }
}

/// Binds the client socket, refusing to take over the socket of a running node.
///
/// # Errors
/// [`StartError::Io`] when the directory cannot be made, another node answers on the
/// socket, or binding fails.
pub(crate) async fn bind(path: &Path) -> Result<UnixListener, StartError> {
    let io = |what: String| move |source| StartError::Io { what, source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    }
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            let what = format!("client socket {}", path.display());
            let source = std::io::Error::new(std::io::ErrorKind::AddrInUse, "another node is running on it");
            return Err(StartError::Io { what, source });
        }
        // A socket left behind by a node that died.
        std::fs::remove_file(path).map_err(io(format!("removing stale {}", path.display())))?;
    }
    UnixListener::bind(path).map_err(io(format!("binding {}", path.display())))
}

/// Serves clients until `shutdown` turns true; then removes the socket file and waits for
/// the requests under way to be answered (see [`serve`]; the node bounds that wait).
pub(crate) async fn run(
    node: Arc<NodeState>,
    listener: UnixListener,
    path: PathBuf,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            Some(_) = connections.join_next() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve(node.clone(), stream, shutdown.clone()));
                }
                Err(e) => {
                    if node.warnings().admit(crate::warnings::reason::CLIENT_ACCEPT_FAILED) {
                        warn!(error = %e, "Client accept failed.");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    let _ = std::fs::remove_file(&path);
    while connections.join_next().await.is_some() {}
}

/// The largest request frame a client may send: the largest encoded message and 1 MiB for
/// the rest of the request.
fn client_frame_bytes_max(node: &NodeState) -> usize {
    node.encoded_message_bytes_max().saturating_add(1 << 20)
}

/// The next request on a client's connection; `None` when the connection or the node
/// ends. A frame over the limit is answered with `TooLarge` and read past without being
/// kept (so the client, which writes it whole before reading, gets the answer rather than
/// a broken pipe); a frame of length zero ends the connection after an error answer.
async fn next_request(
    stream: &mut UnixStream,
    buf: &mut BytesMut,
    frame_bytes_max: usize,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Result<Request, ReadError>> {
    loop {
        if let Some(len) = oversized(buf, frame_bytes_max) {
            let message = format!(
                "request of {len} bytes is over this node's client limit of {frame_bytes_max} bytes \
                 (messages.message_bytes_max plus the envelope and 1 MiB); not read"
            );
            let response = Response::Error { code: ErrorCode::TooLarge, accepted: 0, message };
            let mut out = BytesMut::new();
            response.encode(&mut out);
            if tokio::time::timeout(ANSWER_GRACE, stream.write_all(&out)).await.is_err() {
                return None;
            }
            skip(stream, buf, 4 + len as u64, shutdown).await?;
            continue;
        }
        let frame = match split_frame(buf, frame_bytes_max) {
            Ok(frame) => frame,
            Err(reason) => {
                let response = Response::Error { code: ErrorCode::BadRequest, accepted: 0, message: reason };
                let mut out = BytesMut::new();
                response.encode(&mut out);
                // The connection ends after it: a client that does not read it is not waited for.
                let _ = tokio::time::timeout(ANSWER_GRACE, stream.write_all(&out)).await;
                return None;
            }
        };
        if let Some((kind, body)) = frame {
            return Some(Request::decode(kind, body));
        }
        tokio::select! {
            _ = shutdown.changed() => return None,
            read = stream.read_buf(buf) => match read {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            },
        }
    }
}

async fn serve(node: Arc<NodeState>, mut stream: UnixStream, mut shutdown: watch::Receiver<bool>) {
    let frame_bytes_max = client_frame_bytes_max(&node);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    // A response's chunks: large payloads are shared into a vectored write, not copied.
    let (mut chunks, mut parts) = (Chunks::default(), Vec::new());
    // Dropped with the connection: an open transaction is rolled back.
    let mut held = Held::default();
    // A consumer's `Consume`, taken up again after each answer: nothing more is read.
    let mut consuming: Option<Request> = None;
    loop {
        // A node that is stopping starts no other request: those under way were answered.
        // (A consumer between batches is told so.)
        if node.stopping() {
            let first = consuming.take().map(Ok);
            return answer_at_stop(&node, &mut stream, &mut buf, frame_bytes_max, first, &mut held).await;
        }
        let decoded = match consuming.take() {
            Some(request) => Ok(request),
            None => match next_request(&mut stream, &mut buf, frame_bytes_max, &mut shutdown).await {
                // Read as the node began to stop, or left waiting in the socket then: not
                // started either.
                first if node.stopping() => {
                    return answer_at_stop(&node, &mut stream, &mut buf, frame_bytes_max, first, &mut held)
                        .await;
                }
                Some(decoded) => decoded,
                None => return,
            },
        };
        let asked = decoded.as_ref().ok().and_then(queue_asked);
        let (response, taken_from) = match decoded {
            // A get may wait long: stop it, before it takes anything, if the client leaves.
            // (When the node stops, what waits for others ends with an error, and a put or
            // commit waiting for room is refused: see `NodeState::stop`.)
            Ok(request) => tokio::select! {
                biased;
                answer = answer(&node, request, &mut consuming, &mut held) => answer,
                () = client_gone(&mut stream, &mut buf, frame_bytes_max) => {
                    debug!("Client left while its request waited.");
                    return;
                }
            },
            Err(e) => {
                let message = format!("bad request: {e}");
                (Response::Error { code: ErrorCode::BadRequest, accepted: 0, message }, None)
            }
        };
        // A consumer goes on while its answers are messages (an error ends it); a wait
        // that ran out without any is not answered.
        if !matches!(response, Response::Messages { .. }) {
            consuming = None;
        }
        if consuming.is_some()
            && matches!(&response, Response::Messages { messages, .. } if messages.is_empty())
        {
            continue;
        }
        // (Opened only on its way out: what goes back to a queue goes back as stored.)
        match opened(&node, asked.as_deref(), &response) {
            Some(opened) => opened.encode_chunks(&mut chunks),
            None => response.encode_chunks(&mut chunks),
        }
        chunks.take(&mut parts);
        let written = tokio::select! {
            biased;
            written = linkbus_client::vectored::write_all(&mut stream, &mut parts) => written,
            () = grace_at_stop(&node) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the node is shutting down and the client does not read",
            )),
        };
        if let Err(e) = written {
            // The client is gone: messages it never received go back to the head of the queue.
            // (Pending ones go back when `pending` drops.)
            if let (Response::Messages { messages, tags }, Some(queue)) = (response, taken_from)
                && tags.is_empty()
                && !messages.is_empty()
            {
                queue.restore(messages, Instant::now());
            }
            debug!(error = %e, "Client connection lost.");
            return;
        }
    }
}

/// The queue a request takes or reads messages from, if it does.
fn queue_asked(request: &Request) -> Option<String> {
    match request {
        Request::Get { queue, .. }
        | Request::Consume { queue, .. }
        | Request::Browse { queue, .. }
        | Request::Follow { queue, .. } => Some(queue.clone()),
        _ => None,
    }
}

/// `response` as its client gets it, when it hands out encoded messages: opened (see
/// [`crate::flow::codecs::open_for_client`]), unless they come from the dead-letter queue.
fn opened(node: &NodeState, queue: Option<&str>, response: &Response) -> Option<Response> {
    let Response::Messages { messages, tags } = response else { return None };
    let dead_letters = queue? == crate::flow::dead_letter::DEAD_LETTER_QUEUE;
    let messages = crate::flow::codecs::open_for_client(node, messages, dead_letters)?;
    Some(Response::Messages { messages, tags: tags.clone() })
}

/// The declared length of the frame at the head of `buf` when it is over `frame_bytes_max`.
fn oversized(buf: &BytesMut, frame_bytes_max: usize) -> Option<usize> {
    let prefix: [u8; 4] = buf.get(..4)?.try_into().ok()?;
    let len = u32::from_be_bytes(prefix) as usize;
    (len > frame_bytes_max).then_some(len)
}

/// Reads past `bytes` bytes of the connection (those in `buf` first) without keeping them;
/// `None` when the connection or the node ends first.
async fn skip(
    stream: &mut UnixStream,
    buf: &mut BytesMut,
    bytes: u64,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<()> {
    let held = (buf.len() as u64).min(bytes);
    bytes::Buf::advance(buf, held as usize);
    let mut left = bytes - held;
    let mut sink = vec![0u8; 64 * 1024];
    while left > 0 {
        let want = sink.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        tokio::select! {
            _ = shutdown.changed() => return None,
            read = stream.read(&mut sink[..want]) => match read {
                Ok(0) | Err(_) => return None,
                Ok(n) => left -= n as u64,
            },
        }
    }
    Some(())
}

/// How long after a node began to shut down its answers may take to go into clients'
/// sockets: a client that does not read keeps its connection no longer (what it was to
/// get goes back to its queue). Also how long an error that ends a connection may wait.
const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// Completes [`ANSWER_GRACE`] after the node began to shut down.
async fn grace_at_stop(node: &NodeState) {
    node.until_stopping().await;
    let since = node.stopped_at().unwrap_or_else(tokio::time::Instant::now);
    tokio::time::sleep_until(since + ANSWER_GRACE).await;
}

/// Ends a connection of a node that is stopping. What the client sent that was not
/// started (`first`, then what waits in the socket) is not carried out, except
/// acknowledgements and backouts, so what the client took stays taken; each gets its
/// answer, a consumer too (its `Consume` as `first`), within [`ANSWER_GRACE`].
async fn answer_at_stop(
    node: &NodeState,
    stream: &mut UnixStream,
    buf: &mut BytesMut,
    frame_bytes_max: usize,
    first: Option<Result<Request, ReadError>>,
    held: &mut Held,
) {
    // What the socket holds already (no waiting for more).
    while buf.len() <= frame_bytes_max && matches!(stream.try_read_buf(buf), Ok(n) if n > 0) {}
    let reason = node.shutting_down();
    let mut out = BytesMut::new();
    let rest = std::iter::from_fn(|| match split_frame(buf, frame_bytes_max) {
        Ok(Some((kind, body))) => Some(Request::decode(kind, body)),
        _ => None,
    });
    for request in first.into_iter().chain(rest) {
        let response = match request {
            Ok(request @ (Request::Ack { .. } | Request::Backout { .. })) => {
                handle(node, request, held).await.0
            }
            _ => refused(ErrorCode::Internal, format!("{reason}; request not carried out")),
        };
        response.encode(&mut out);
    }
    if !out.is_empty() {
        tokio::select! {
            _ = stream.write_all(&out) => {}
            () = grace_at_stop(node) => {}
        }
    }
}

/// A put outside a transaction; one that breaks the group rules is refused whole.
async fn put(
    node: &NodeState,
    (origin, groups): (&mut Origin, &mut PutGroups),
    contents: Vec<linkbus_plugin_api::Content>,
    timeout_ms: u64,
    no_wait: bool,
) -> Response {
    let members = PutGroups::members(&contents);
    if let Err(reason) = groups.after(&members) {
        return refused(ErrorCode::Invalid, reason);
    }
    if no_wait
        && let Some(i) = contents.iter().position(|c| node.reliability_of(c) == Reliability::Persistent)
    {
        let message = format!(
            "message {}: a no-wait put cannot carry a persistent message (nothing would vouch for it); use a waiting put",
            i + 1
        );
        return refused(ErrorCode::Invalid, message);
    }
    let timeout_ms = if no_wait { 0 } else { timeout_ms };
    let timeout = Duration::from_millis(timeout_ms.min(PUT_WAIT_MS_MAX));
    let answer = origin.put(node, contents, timeout).await;
    // The connection's open group follows what was accepted.
    let accepted = match &answer {
        Ok(_) => usize::MAX,
        Err(e) => e.accepted as usize,
    };
    groups.accepted(&members, accepted);
    match answer {
        Ok(accepted) => Response::PutOk {
            source: node.name().clone(),
            sequences: accepted.sequences,
            created_unix_ms: accepted.created_unix_ms,
        },
        Err(e) => {
            if matches!(e.code, RefusalCode::Full | RefusalCode::Rejected) {
                node.emit(Event::new(EventKind::QueueFull, e.message.clone()).with("reason", &e.message));
            }
            Response::Error { code: e.code.into(), accepted: e.accepted, message: e.message }
        }
    }
}

/// What a client connection holds on the node (messages taken pending, an open
/// transaction), for a client in the node's own process: no socket, no encoding. Dropped
/// with the client, like a closed connection.
pub(crate) struct InProcess {
    node: Arc<NodeState>,
    held: Held,
}

impl InProcess {
    /// A client connection to `node` in this process.
    pub(crate) fn new(node: Arc<NodeState>) -> Self {
        Self { node, held: Held::default() }
    }
}

/// What a client connection holds on the node: messages taken pending, an open
/// transaction, and where its puts enter (its origin stages). Dropped with the connection.
#[derive(Default)]
struct Held {
    pending: PendingOnConnection,
    transaction: Option<Transaction>,
    origin: Origin,
    /// The group its puts are inside, if any.
    groups: PutGroups,
}

impl linkbus_client::InProcessNode for InProcess {
    fn name(&self) -> &str {
        self.node.name().as_str()
    }

    /// Answers `request` as the socket server would; refused once the node was shut down.
    /// (Messages a non-pending get took are lost if the call is abandoned while it waits
    /// for the store, as on a socket whose client leaves then: calls are not cancel-safe.)
    /// A put keeps the caller's payloads as given (no copy): a caller that slices a large
    /// buffer of its own into small payloads keeps that buffer alive while they wait (in a
    /// queue, or on a link until the peer acknowledges them).
    fn call(&mut self, request: Request) -> Pin<Box<dyn Future<Output = Response> + Send + '_>> {
        Box::pin(async move {
            if self.node.stopping() {
                return refused(ErrorCode::Internal, format!("node {} is shut down", self.node.name()));
            }
            let asked = queue_asked(&request);
            let response = handle(&self.node, request, &mut self.held).await.0;
            opened(&self.node, asked.as_deref(), &response).unwrap_or(response)
        })
    }
}

/// Answers `request` on a connection; for a get, also the queue the messages came from. A
/// `Consume` (outside a transaction) is answered as a get that waits as long as any may,
/// and is kept in `consuming`, to be answered again.
async fn answer(
    node: &NodeState,
    request: Request,
    consuming: &mut Option<Request>,
    held: &mut Held,
) -> (Response, Option<Arc<LocalQueue>>) {
    if let Request::Consume { queue, count_max, bytes_max } = &request
        && held.transaction.is_none()
    {
        let asked = (*count_max, GET_WAIT_MS_MAX, *bytes_max, false, GetGroups::Complete);
        let answer = take(node, queue, asked, &mut held.pending).await;
        *consuming = Some(request);
        return answer;
    }
    handle(node, request, held).await
}

/// Answers `request` when the transaction open on the connection takes it; else gives it back.
async fn in_transaction(
    node: &NodeState,
    request: Request,
    held: &mut Held,
) -> Result<(Response, Option<Arc<LocalQueue>>), Request> {
    let Held { pending, transaction, origin, groups } = held;
    match request {
        Request::Begin | Request::Commit { .. } | Request::Rollback => {
            Ok((transact(node, request, transaction, groups).await, None))
        }
        Request::Put { contents, no_wait, .. } if let Some(tx) = transaction.as_mut() => {
            Ok((tx.put(node, (origin, groups), contents, no_wait), None))
        }
        Request::Get { queue, count_max, wait_ms, bytes_max, pending: hand_out, groups: mode }
            if let Some(tx) = transaction.as_mut() =>
        {
            let asked = (count_max, wait_ms, bytes_max, hand_out, mode);
            Ok((tx.get(node, &queue, asked, pending).await, None))
        }
        Request::Ack { queue, tags }
            if let Some(tx) = transaction.as_mut().filter(|tx| tx.holds(&queue, &tags)) =>
        {
            Ok((tx.settle(node, &queue, &tags, true), None))
        }
        Request::Backout { queue, tags }
            if let Some(tx) = transaction.as_mut().filter(|tx| tx.holds(&queue, &tags)) =>
        {
            Ok((tx.settle(node, &queue, &tags, false), None))
        }
        Request::Consume { .. } if transaction.is_some() => {
            let message = "a connection with an open transaction cannot consume: commit or roll back first";
            Ok((refused(ErrorCode::BadRequest, message.into()), None))
        }
        other => Err(other),
    }
}

/// Answers one request; for a get, also the queue the messages came from.
async fn handle(node: &NodeState, request: Request, held: &mut Held) -> (Response, Option<Arc<LocalQueue>>) {
    let request = match in_transaction(node, request, held).await {
        Ok(answer) => return answer,
        Err(request) => request,
    };
    let Held { pending, origin, groups, .. } = held;
    match request {
        Request::Put { contents, timeout_ms, no_wait } => {
            (put(node, (origin, groups), contents, timeout_ms, no_wait).await, None)
        }
        Request::Get { queue, count_max, wait_ms, bytes_max, pending: hand_out, groups: mode } => {
            take(node, &queue, (count_max, wait_ms, bytes_max, hand_out, mode), pending).await
        }
        Request::Results { source, sequences, wait_ms } => {
            (admin::results(node, &source, &sequences, wait_ms).await, None)
        }
        Request::Subscribe { to, kinds } => (admin::subscribe(node, &to, &kinds).await, None),
        Request::Follow { queue, after, count_max, wait_ms } => {
            (super::queues::follow(node, &queue, after, count_max, wait_ms).await, None)
        }
        Request::Unsubscribe { to } => (admin::unsubscribe(node, &to).await, None),
        Request::Subscriptions => (Response::Status(admin::subscriptions(node)), None),
        Request::Status => (Response::Status(admin::status(node)), None),
        Request::LinkReset { peer } => (admin::link_reset(node, &peer), None),
        Request::RouteExplain { destination } => (admin::route_explain(node, &destination), None),
        Request::Reload => (admin::reload(node), None),
        Request::Plugins => (admin::plugins(node), None),
        Request::SendFile(send) => (admin::send_file(node, send).await, None),
        Request::Files => (Response::Files(node.files().list()), None),
        Request::Limits => (
            Response::Limits {
                message_bytes_max: node.config().messages.message_bytes_max,
                frame_bytes_max: client_frame_bytes_max(node) as u64,
            },
            None,
        ),
        other => {
            let settles = matches!(other, Request::Ack { .. } | Request::Backout { .. });
            let response = queue_request(node, other, pending);
            // A settled message stays settled across a crash.
            if settles
                && matches!(response, Response::Settled(n) if n > 0)
                && node.store().durable()
                && let Err(e) = node.committer().sync().await
            {
                return (refused(ErrorCode::Internal, format!("store failed: {e}")), None);
            }
            (response, None)
        }
    }
}

pub(super) fn refused(code: ErrorCode, message: String) -> Response {
    Response::Error { code, accepted: 0, message }
}
