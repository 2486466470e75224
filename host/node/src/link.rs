//! Links: one task per configured peer pumps a [`Session`] between the transport, the
//! node's transmission queue for that peer, and local delivery.
//!
//! The task owns the session and decides nothing about the protocol; it moves bytes from a
//! reader task, to a writer task (so reading and writing never wait on each other or share a
//! lock), and messages from the transmission queue into the session's window. Links are
//! permanent: when a connection fails, the task dials again with bounded exponential backoff
//! (if the peer has an address), while messages keep waiting in the transmission queue.
//!
//! When both nodes dial each other at once, the connection dialed by the node with the
//! smaller name wins on both sides, so they agree without another round trip.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use linkbus_plugin_api::{Connection, Lifetime, Message, TransportError};
use linkbus_proto::frame::{CloseCode, Frame, Hello};
use linkbus_proto::wire::message_bytes;
use linkbus_proto::{Session, SessionConfig, SessionError, SessionEvent};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Notify, mpsc, watch};
use tracing::{debug, info, warn};

use crate::config::PeerConfig;
use crate::node::NodeState;

/// A connection handed to a link: by the listener (with the peer's `Hello` already read) or
/// by the link's own dialer.
pub struct Incoming {
    /// The byte stream.
    pub connection: Connection,
    /// The peer's `Hello`, for accepted connections.
    pub hello: Option<Hello>,
    /// Bytes read after the `Hello`.
    pub leftover: BytesMut,
}

/// The transmission queue for a peer is full.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("transmission queue is full ({0} messages)")]
pub struct TransmissionQueueFull(pub u64);

/// The shared side of a link: its transmission queue and counters. The link task holds the
/// rest.
pub struct LinkHandle {
    /// The peer's configuration.
    pub peer: PeerConfig,
    /// Messages waiting for the peer, with the time they were queued.
    queue: Mutex<VecDeque<(Message, Instant)>>,
    queue_messages_max: u64,
    /// Wakes the link task when the queue gains a message.
    wake: Notify,
    /// Connections for the link task.
    incoming: Mutex<Option<mpsc::Sender<Incoming>>>,
    /// Whether the session is established.
    pub up: AtomicBool,
    /// Messages acknowledged by the peer.
    pub acked_total: AtomicU64,
    /// Messages received from the peer.
    pub received_total: AtomicU64,
}

impl LinkHandle {
    /// A handle with an empty transmission queue.
    pub fn new(peer: PeerConfig, queue_messages_max: u64) -> Self {
        Self {
            peer,
            queue: Mutex::new(VecDeque::new()),
            queue_messages_max,
            wake: Notify::new(),
            incoming: Mutex::new(None),
            up: AtomicBool::new(false),
            acked_total: AtomicU64::new(0),
            received_total: AtomicU64::new(0),
        }
    }

    /// Queues a message for the peer.
    ///
    /// # Errors
    /// [`TransmissionQueueFull`] at `links.queue_messages_max`.
    pub fn enqueue(&self, message: Message, now: Instant) -> Result<(), TransmissionQueueFull> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.len() as u64 >= self.queue_messages_max {
            return Err(TransmissionQueueFull(self.queue_messages_max));
        }
        queue.push_back((message, now));
        drop(queue);
        self.wake.notify_one();
        Ok(())
    }

    /// Messages waiting for the peer (not yet handed to the session).
    pub fn queued(&self) -> usize {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Hands an accepted connection to the link task.
    pub fn offer(&self, incoming: Incoming) {
        let sender = self.incoming.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(sender) = sender
            && sender.try_send(incoming).is_err()
        {
            debug!(peer = %self.peer.name, "Link busy; incoming connection dropped.");
        }
    }
}

enum ConnEvent {
    Bytes(Bytes),
    Closed(String),
}

struct Active {
    id: u64,
    dialed_by_us: bool,
    writer: mpsc::UnboundedSender<Bytes>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Active {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Reconnect delays: doubling from the minimum to the maximum, reset on success.
struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(min_ms: u64, max_ms: u64) -> Self {
        let min = Duration::from_millis(min_ms);
        Self { min, max: Duration::from_millis(max_ms), next: min }
    }
    fn take(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }
    fn reset(&mut self) {
        self.next = self.min;
    }
}

/// The link task's state.
struct Link {
    node: Arc<NodeState>,
    handle: Arc<LinkHandle>,
    session: Session,
    active: Option<Active>,
    next_conn_id: u64,
    conn_tx: mpsc::Sender<(u64, ConnEvent)>,
    dial_tx: mpsc::Sender<Result<Connection, TransportError>>,
    dialing: bool,
    next_dial: Option<tokio::time::Instant>,
    backoff: Backoff,
}

/// Runs the link for `handle.peer` until `shutdown` turns true.
pub async fn run(node: Arc<NodeState>, handle: Arc<LinkHandle>, mut shutdown: watch::Receiver<bool>) {
    let links = &node.config.links;
    let config = SessionConfig {
        local: node.name().clone(),
        peer: handle.peer.name.clone(),
        incarnation: node.incarnation,
        durable: node.store.durable(),
        frame_bytes_max: links.frame_bytes_max as usize,
        in_flight_messages_max: links.in_flight_messages_max as usize,
        ping_interval: Duration::from_millis(links.ping_interval_ms),
        pong_timeout: Duration::from_millis(links.pong_timeout_ms),
        handshake_timeout: Duration::from_millis(links.handshake_timeout_ms),
    };
    let (incoming_tx, mut incoming_rx) = mpsc::channel(4);
    *handle.incoming.lock().unwrap_or_else(PoisonError::into_inner) = Some(incoming_tx);
    let (conn_tx, mut conn_rx) = mpsc::channel(64);
    let (dial_tx, mut dial_rx) = mpsc::channel(1);
    let backoff = Backoff::new(links.reconnect_backoff_min_ms, links.reconnect_backoff_max_ms);
    let mut link = Link {
        session: Session::new(config, Instant::now()),
        next_dial: handle.peer.address.as_ref().map(|_| tokio::time::Instant::now()),
        node,
        handle,
        active: None,
        next_conn_id: 1,
        conn_tx,
        dial_tx,
        dialing: false,
        backoff,
    };
    loop {
        let timeout = link.session.poll_timeout().map(tokio::time::Instant::from_std);
        let dial_at = link.dial_due();
        tokio::select! {
            _ = shutdown.changed() => break,
            Some(incoming) = incoming_rx.recv() => link.adopt(incoming, false),
            Some(result) = dial_rx.recv() => link.dialed(result),
            Some((id, event)) = conn_rx.recv() => link.connection_event(id, event),
            () = link.handle.wake.notified() => {}
            () = sleep_until(timeout) => link.session.handle_timeout(Instant::now()),
            () = sleep_until(dial_at) => link.start_dial(),
        }
        link.pump();
    }
    link.shutdown().await;
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Link {
    fn peer(&self) -> &str {
        self.handle.peer.name.as_str()
    }

    fn dial_due(&self) -> Option<tokio::time::Instant> {
        if self.active.is_some() || self.dialing {
            return None;
        }
        let wanted = self.handle.peer.permanent || self.handle.queued() > 0 || self.session.in_flight() > 0;
        self.next_dial.filter(|_| wanted)
    }

    fn start_dial(&mut self) {
        let Some(address) = self.handle.peer.address.clone() else { return };
        self.dialing = true;
        let transport = self.node.transport.clone();
        let tx = self.dial_tx.clone();
        let timeout = Duration::from_millis(self.node.config.links.connect_timeout_ms);
        tokio::spawn(async move {
            let result = match tokio::time::timeout(timeout, transport.connect(&address)).await {
                Ok(result) => result,
                Err(_) => Err(TransportError::Io {
                    op: "connect",
                    address,
                    source: std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
                }),
            };
            let _ = tx.send(result).await;
        });
    }

    fn dialed(&mut self, result: Result<Connection, TransportError>) {
        self.dialing = false;
        match result {
            Ok(connection) => {
                self.adopt(Incoming { connection, hello: None, leftover: BytesMut::new() }, true)
            }
            Err(e) => {
                let delay = self.backoff.take();
                debug!(peer = self.peer(), error = %e, retry_ms = delay.as_millis() as u64, "Dial failed.");
                self.next_dial = Some(tokio::time::Instant::now() + delay);
            }
        }
    }

    /// Takes a new connection, unless the current one wins the tie-break.
    fn adopt(&mut self, incoming: Incoming, dialed_by_us: bool) {
        if let Some(current) = &self.active {
            let local_is_smaller = self.node.name().as_str() < self.peer();
            // The connection dialed by the smaller name wins; between equals, the newer.
            let preferred = |by_us: bool| by_us == local_is_smaller;
            if preferred(current.dialed_by_us) && !preferred(dialed_by_us) {
                debug!(peer = self.peer(), "Duplicate connection refused.");
                refuse(incoming.connection, CloseCode::Duplicate, "a connection to this peer already exists");
                return;
            }
            self.drop_connection("replaced by a newer connection");
        }
        let Incoming { connection, hello, leftover } = incoming;
        let id = self.next_conn_id;
        self.next_conn_id += 1;
        debug!(peer = self.peer(), address = %connection.peer_address, dialed_by_us, "Connection open.");
        let (writer_tx, writer_rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(connection.writer, writer_rx, id, self.conn_tx.clone()));
        let reader = tokio::spawn(read_loop(connection.reader, id, self.conn_tx.clone()));
        self.active = Some(Active { id, dialed_by_us, writer: writer_tx, reader });
        let now = Instant::now();
        self.session.handle_connected(now);
        if let Some(hello) = hello {
            self.session.handle_frame(Frame::Hello(hello), now);
        }
        if !leftover.is_empty() {
            self.session.handle_bytes(&leftover, now);
        }
    }

    fn connection_event(&mut self, id: u64, event: ConnEvent) {
        if self.active.as_ref().is_none_or(|a| a.id != id) {
            return;
        }
        match event {
            ConnEvent::Bytes(bytes) => self.session.handle_bytes(&bytes, Instant::now()),
            ConnEvent::Closed(reason) => self.drop_connection(&reason),
        }
    }

    fn drop_connection(&mut self, reason: &str) {
        if self.active.take().is_none() {
            return;
        }
        if self.handle.up.swap(false, Ordering::Relaxed) {
            info!(peer = self.peer(), reason, "Link down.");
        } else {
            debug!(peer = self.peer(), reason, "Connection closed.");
        }
        self.session.handle_disconnected();
        if self.handle.peer.address.is_some() {
            self.next_dial = Some(tokio::time::Instant::now() + self.backoff.take());
        }
    }

    /// Moves messages into the session, handles its events and writes its output, until
    /// nothing changes.
    fn pump(&mut self) {
        for _ in 0..4 {
            self.fill_window();
            let progressed = self.handle_events();
            if let Some(bytes) = self.session.poll_transmit()
                && let Some(active) = &self.active
            {
                let _ = active.writer.send(bytes);
            }
            if !progressed {
                break;
            }
        }
    }

    fn fill_window(&mut self) {
        if !self.session.is_established() {
            return;
        }
        let now = Instant::now();
        let mut queue = self.handle.queue.lock().unwrap_or_else(PoisonError::into_inner);
        while self.session.has_window() {
            let Some((mut message, queued_at)) = queue.pop_front() else { break };
            let elapsed = now.saturating_duration_since(queued_at).as_millis() as u64;
            match message.content.lifetime.unwrap_or(Lifetime::UNLIMITED).after(elapsed) {
                None => warn!(peer = self.peer(), id = %message.id, "Message expired before it was sent."),
                Some(left) => {
                    message.content.lifetime = Some(left);
                    // The window was checked, so the session accepts it.
                    let _ = self.session.send(message_bytes(&message));
                }
            }
        }
    }

    /// Returns whether anything happened that may let more work through.
    fn handle_events(&mut self) -> bool {
        let mut progressed = false;
        let mut delivered = None;
        let mut closed = None;
        let now = Instant::now();
        while let Some(event) = self.session.poll_event() {
            progressed = true;
            match event {
                SessionEvent::Established { peer_restarted, resent } => {
                    info!(peer = self.peer(), peer_restarted, resent, "Link up.");
                    self.backoff.reset();
                    self.handle.up.store(true, Ordering::Relaxed);
                }
                SessionEvent::Received { sequence, message } => {
                    self.handle.received_total.fetch_add(1, Ordering::Relaxed);
                    match self.node.deliver(message, now) {
                        Ok(()) => delivered = Some(sequence),
                        Err(e) => {
                            warn!(peer = self.peer(), error = %e, "Cannot take delivery; dropping the connection.");
                            closed = Some(e.to_string());
                            break;
                        }
                    }
                }
                SessionEvent::Acked { messages, .. } => {
                    self.handle.acked_total.fetch_add(messages as u64, Ordering::Relaxed);
                }
                SessionEvent::Closed(SessionError::PeerClosed { code, reason })
                    if code == CloseCode::Shutdown as u16 || code == CloseCode::Duplicate as u16 =>
                {
                    // Orderly: the peer stops, or keeps the other of two simultaneous dials.
                    if code == CloseCode::Shutdown as u16 {
                        info!(peer = self.peer(), reason, "Peer closed the link.");
                    } else {
                        debug!(peer = self.peer(), reason, "Duplicate connection closed by the peer.");
                    }
                    closed = Some(reason);
                }
                SessionEvent::Closed(error) => {
                    warn!(peer = self.peer(), %error, "Link closed.");
                    closed = Some(error.to_string());
                }
            }
        }
        if let Some(through) = delivered {
            self.session.handle_delivered(through);
        }
        if let Some(reason) = closed {
            if let (Some(bytes), Some(active)) = (self.session.poll_transmit(), &self.active) {
                let _ = active.writer.send(bytes);
            }
            self.drop_connection(&reason);
        }
        progressed
    }

    async fn shutdown(mut self) {
        if let Some(active) = self.active.take() {
            let mut out = BytesMut::new();
            Frame::Close { code: CloseCode::Shutdown as u16, reason: "node shutting down".into() }
                .encode(&mut out);
            let _ = active.writer.send(out.freeze());
            drop(active);
            // Give the writer a moment to send the close frame.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn read_loop(
    mut reader: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    id: u64,
    events: mpsc::Sender<(u64, ConnEvent)>,
) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        if buf.capacity() < 16 * 1024 {
            buf.reserve(64 * 1024);
        }
        let event = match reader.read_buf(&mut buf).await {
            Ok(0) => ConnEvent::Closed("connection closed by peer".into()),
            Ok(_) => ConnEvent::Bytes(buf.split().freeze()),
            Err(e) => ConnEvent::Closed(format!("read failed: {e}")),
        };
        let last = matches!(event, ConnEvent::Closed(_));
        if events.send((id, event)).await.is_err() || last {
            return;
        }
    }
}

async fn write_loop(
    mut writer: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    mut rx: mpsc::UnboundedReceiver<Bytes>,
    id: u64,
    events: mpsc::Sender<(u64, ConnEvent)>,
) {
    while let Some(bytes) = rx.recv().await {
        if let Err(e) = writer.write_all(&bytes).await {
            let _ = events.send((id, ConnEvent::Closed(format!("write failed: {e}")))).await;
            return;
        }
    }
    let _ = writer.shutdown().await;
}

/// Writes a `Close` frame on a connection that will not be used, then drops it.
pub fn refuse(connection: Connection, code: CloseCode, reason: &str) {
    let mut out = BytesMut::new();
    Frame::Close { code: code as u16, reason: reason.to_owned() }.encode(&mut out);
    let mut writer = connection.writer;
    tokio::spawn(async move {
        let _ = writer.write_all(&out).await;
        let _ = writer.shutdown().await;
    });
}
