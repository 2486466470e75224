//! Links: one task per configured peer pumps a `linkbus_proto::Session` between the
//! transport, the node's transmission queue for that peer, and local delivery.
//!
//! The task owns the session and decides nothing about the protocol: the session says which
//! connection wins when two exist, what to resend, and what to acknowledge. The task reads
//! the connection itself, and writes to it itself what the socket takes at once while
//! nothing waits for the connection's writer task; the rest goes to that task, so reading
//! never waits on writing. A message crossing a quiet link thus wakes no task between the
//! link task and the socket on either side. The task also moves messages from the
//! transmission queue into the session's window. Links are permanent:
//! when a connection fails, the task dials again with bounded exponential backoff (if the
//! peer has an address), while messages keep waiting in the transmission queue.
//!
//! Packets leave the session only while less than `DATA_BACKLOG_BYTES` wait for the writer,
//! so the session's scheduler, not a deep queue in front of the socket, decides which
//! channel goes next (an urgent message waits behind at most that much). Memory stays
//! bounded when the peer stops reading: above twice `WRITE_BACKLOG_BYTES_MAX` bytes not yet
//! written (only control frames get there), the task stops reading (so the peer's own
//! writes stall) until the writer drains.

mod backoff;
mod dial;
mod handle;
mod io;
pub(crate) mod state;
mod transmit;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use linkbus_plugin_api::message::Kind;
use linkbus_plugin_api::{Batch, Lifetime, Message};
use linkbus_proto::channel::{CHANNELS, channel_for};
use linkbus_proto::frame::{CloseCode, Frame};
use linkbus_proto::secure::SecureChannel;
use linkbus_proto::wire::{Encoded, Heads};
use linkbus_proto::{DropReason, SendError, Session, SessionConfig, SessionError, SessionEvent};
use tokio::sync::{Notify, mpsc, watch};
use tracing::{debug, error, info, warn};

use crate::events::{Event, EventKind};
use crate::flow::inbound::{Arrival, Inbound};
use crate::flow::origin::{RUN_BYTES_MAX, RUN_MESSAGES_MAX};
use crate::flow::{DeadLetter, DeadLetterCode};
use crate::node::NodeState;
use crate::results::{EXPIRED_BEFORE_SENDING, Outcome, RESULT_MESSAGE_NAME, ResultTo};
use crate::warnings::reason;
use backoff::Backoff;
use dial::DialError;
pub(crate) use handle::{Gate, Incoming};
pub use handle::{Health, LastError, LinkHandle};
pub(crate) use io::refuse;
use io::{ConnEvent, read_chunk, write_loop};
pub use transmit::CLASSES;

/// Bytes handed to the writer task and not yet written, twice which the link stops reading (so a
/// peer that sends but never reads gets no more answers queued).
pub const WRITE_BACKLOG_BYTES_MAX: usize = 16 << 20;

/// Bytes of packets handed to the writer and not yet written, above which the session
/// writes no more packets: enough to keep the connection busy, small enough that a packet
/// of an urgent channel is not queued behind much.
pub const DATA_BACKLOG_BYTES: usize = 256 << 10;

/// What one round of a session's events brought in.
#[derive(Default)]
struct Arrivals {
    /// Messages that arrived and are not yet handed to the node, with the link's records.
    messages: Vec<Arrival>,
    /// Each of those messages' channel and sequence number.
    numbers: Vec<(u8, u64)>,
    /// Their payload bytes.
    bytes: usize,
    /// Per channel, the last number delivered or skipped: what to acknowledge.
    delivered: [Option<u64>; CHANNELS],
    /// Whether a message the sender counts as kept came: its number is synced before the
    /// acknowledgement.
    persistent: bool,
}

impl Arrivals {
    fn delivered(&mut self, channel: u8, sequence: u64) {
        if let Some(slot) = self.delivered.get_mut(usize::from(channel)) {
            *slot = Some(sequence);
        }
    }
}
/// Perf (OPT-42, LEV-23): writes up to this size go straight to the socket while nothing
/// waits for the writer task (no wake-up on a quiet link); larger ones go through the
/// writer task, as writing them here delays urgent messages under load.
const DIRECT_WRITE_BYTES_MAX: usize = 64 << 10;
/// Bytes of messages a channel holds in the session not yet written, at or above which it
/// takes no more from the transmission queue: the window bounds what travels unacknowledged,
/// not what waits to be written, which waits in the queue (its lifetime counted there, and
/// its payload not pulled out of the cache by tens of megabytes taken ahead of the writer).
pub const PULL_AHEAD_BYTES: usize = 1 << 20;
/// How often expired messages are swept out of a transmission queue.
const EXPIRY_SWEEP: Duration = Duration::from_millis(250);

/// Whether `session` takes another message on `channel`: its window has room, and less
/// than [`PULL_AHEAD_BYTES`] of the channel's messages wait unwritten.
fn takes_more(session: &Session, channel: u8) -> bool {
    session.has_window(channel) && session.unwritten_bytes(channel) < PULL_AHEAD_BYTES
}

struct Active {
    id: u64,
    dialed_by_us: bool,
    /// Encrypts what the session writes, decrypts what the reader reads.
    secure: SecureChannel,
    /// The connection's writing half, written to directly while `backlog` is empty.
    writer: io::SharedWriter,
    /// What waits for the writer task.
    to_writer: mpsc::UnboundedSender<Vec<Bytes>>,
    /// Bytes sent to `to_writer` and not yet written.
    backlog: Arc<AtomicUsize>,
    /// Read by the link task itself (one wake-up less per chunk than a reader task).
    reader: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    /// Where reads land; each chunk read is split off it.
    read_buf: bytes::BytesMut,
}

impl Active {
    /// Writes `chunks` to the socket at once when they are few ([`DIRECT_WRITE_BYTES_MAX`])
    /// and nothing waits for the writer task; hands the writer what is left in one go (one
    /// count, at most one wake-up), counted in the backlog until written.
    ///
    /// # Errors
    /// The socket's, from a write at once (the connection is then done for).
    fn write(&self, mut chunks: Vec<Bytes>) -> std::io::Result<()> {
        let mut len: usize = chunks.iter().map(Bytes::len).sum();
        if len <= DIRECT_WRITE_BYTES_MAX
            && self.backlog.load(Ordering::Acquire) == 0
            && let Ok(mut writer) = self.writer.try_lock()
            && let Some(writer) = writer.as_mut()
        {
            crate::vectored::write_now(writer, &mut chunks)?;
            if chunks.is_empty() {
                return Ok(());
            }
            len = chunks.iter().map(Bytes::len).sum();
        }
        self.backlog.fetch_add(len, Ordering::Relaxed);
        if self.to_writer.send(chunks).is_err() {
            // The writer is gone (its connection failed): nothing will drain these bytes.
            self.backlog.fetch_sub(len, Ordering::Relaxed);
        }
        Ok(())
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
    dial_tx: mpsc::Sender<Result<Incoming, DialError>>,
    /// Woken by writers as they drain.
    drained: Arc<Notify>,
    dialing: bool,
    next_dial: Option<tokio::time::Instant>,
    backoff: Backoff,
    /// What the store holds about the peer's numbers.
    recorded: state::Recorded,
    /// Where arrivals enter the node (this link's relay and delivery stages).
    inbound: Inbound,
    /// Per channel, the numbers of the messages recorded as sent and not yet acknowledged.
    sent: Vec<std::collections::BTreeSet<u64>>,
    /// Per channel, the highest number acknowledged for a persistent message, as recorded.
    acked_recorded: Vec<u64>,
    /// A sent record was handed to the store thread since the last barrier: it must be
    /// synced before the message's bytes leave (or a crash of the process or the machine
    /// could send it twice, under a new number).
    unsynced: bool,
    /// Per channel, where the heads of the messages handed to the session are written
    /// (acknowledgements come in order within a channel, so a buffer's heads go together).
    heads: [Heads; CHANNELS],
    /// Per channel, the last number delivered here under the peer's current incarnation:
    /// recorded at a clean stop, so a restart does not take volatile messages' numbers for
    /// a loss (only a crash forgets them).
    delivered_through: [Option<u64>; CHANNELS],
    /// Why this node refused a persistent delivery, for the `Close` that follows.
    busy: Option<String>,
    /// After a `Busy` close, either way: no dial before then (the backoff resets whenever
    /// a message goes through, and volatile ones do).
    redial_not_before: Option<tokio::time::Instant>,
}

/// How long a link whose peer (or itself) took no persistent message waits before it
/// connects again.
const BUSY_REDIAL: Duration = Duration::from_secs(1);

fn session_config(node: &NodeState, handle: &LinkHandle) -> SessionConfig {
    let links = &node.config().links;
    SessionConfig {
        local: node.name().clone(),
        peer: handle.peer.name.clone(),
        incarnation: node.incarnation().0,
        run: node.run_id(),
        durable: node.store().durable(),
        frame_bytes_max: links.frame_bytes_max as usize,
        message_bytes_max: node.encoded_message_bytes_max(),
        packet_bytes_max: links.packet_bytes_max as usize,
        channel_weights: channel_weights(links),
        in_flight_messages_max: links.in_flight_messages_max as usize,
        in_flight_bytes_max: links.in_flight_bytes_max as usize,
        reorder_messages_max: links.reorder_messages_max as usize,
        reorder_bytes_max: links.reorder_bytes_max as usize,
        retransmit_timeout: Duration::from_millis(links.retransmit_timeout_ms),
        ping_interval: Duration::from_millis(links.ping_interval_ms),
        pong_timeout: Duration::from_millis(links.pong_timeout_ms),
        handshake_timeout: Duration::from_millis(links.handshake_timeout_ms),
        ack_delay: Duration::from_millis(links.ack_delay_ms),
        recycler: node.recycler().clone(),
        skip_dedup_for_tests: crate::faults::skip_dedup(),
    }
}

/// The scheduler's weight of each channel: the level quotas, the file quota (the system
/// channel goes first whatever its weight).
fn channel_weights(links: &crate::config::LinkSettings) -> [u32; CHANNELS] {
    let mut weights = linkbus_proto::channel::EQUAL_WEIGHTS;
    for (level, quota) in (0u8..).zip(links.priority_quotas) {
        if let Some(w) = weights.get_mut(channel_for(level, false) as usize) {
            *w = u32::try_from(quota).unwrap_or(u32::MAX);
        }
    }
    if let Some(w) = weights.get_mut(linkbus_proto::channel::FILE_CHANNEL as usize) {
        *w = u32::try_from(links.file_quota).unwrap_or(u32::MAX);
    }
    weights
}

/// Runs the link for `handle.peer` until `shutdown` turns true.
pub async fn run(node: Arc<NodeState>, handle: Arc<LinkHandle>, mut shutdown: watch::Receiver<bool>) {
    let Some(mut incoming_rx) = handle.incoming_rx.lock().ok().and_then(|mut rx| rx.take()) else {
        warn!(peer = %handle.peer.name, "Link task started twice.");
        return;
    };
    // Writer tasks report here that their connection failed. Reads are this task's own, one
    // chunk at a time, so no received data queues ahead of an urgent message (TCP holds
    // the rest back at the peer).
    let (conn_tx, mut conn_rx) = mpsc::channel(1);
    let (dial_tx, mut dial_rx) = mpsc::channel(1);
    let links = &node.config().links;
    let mut session = Session::new(session_config(&node, &handle), Instant::now());
    let recorded = match state::Recorded::load(&node, &handle.peer.name, &mut session) {
        Ok(recorded) => recorded,
        Err(reason) => {
            return node.fail(format!("cannot read the link state of {}: {reason}", handle.peer.name));
        }
    };
    let (sent, acked_recorded) = restore_sent(&node, &handle, &mut session);
    let mut link = Link {
        session,
        recorded,
        inbound: Inbound::new(&node, &handle.peer.name),
        sent,
        acked_recorded,
        unsynced: false,
        delivered_through: [None; CHANNELS],
        busy: None,
        redial_not_before: None,
        heads: Default::default(),
        next_dial: handle.peer.address.as_ref().map(|_| tokio::time::Instant::now()),
        backoff: Backoff::new(links.reconnect_backoff_min_ms, links.reconnect_backoff_max_ms),
        node,
        handle,
        active: None,
        next_conn_id: 1,
        conn_tx,
        dial_tx,
        drained: Arc::new(Notify::new()),
        dialing: false,
    };
    // Expired messages leave the transmission queue also while the link is down (or its
    // window is full), so their origin learns of them; the sweep ticks only while a message
    // that can expire waits (a producer's enqueue wakes this task, which then sees it).
    let mut sweep = tokio::time::interval(EXPIRY_SWEEP);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut timeout, mut dial_at) = (Deadline::new(), Deadline::new());
    loop {
        timeout.set(link.session.poll_timeout().map(tokio::time::Instant::from_std));
        dial_at.set(link.dial_due());
        let reading = link.backlog() < 2 * WRITE_BACKLOG_BYTES_MAX;
        tokio::select! {
            _ = shutdown.changed() => break,
            Some(incoming) = incoming_rx.recv() => link.adopt(incoming, false),
            Some(result) = dial_rx.recv() => link.dialed(result),
            Some((id, event)) = conn_rx.recv() => link.connection_event(id, event),
            (id, event) = read_chunk(&mut link.active), if reading => link.connection_event(id, event),
            () = link.handle.wake.notified() => {}
            () = link.drained.notified() => {}
            () = timeout.wait() => link.session.handle_timeout(Instant::now()),
            () = dial_at.wait() => link.start_dial(),
            _ = sweep.tick(), if link.handle.expiring.load(Ordering::Relaxed) => link.sweep_expired(),
        }
        let _still_stopped = link.apply_reset();
        link.pump();
    }
    link.shutdown().await;
}

/// Hands the session what was recorded as sent before a restart (same incarnation), and
/// returns those numbers per channel, and the acknowledged numbers recorded.
fn restore_sent(
    node: &NodeState,
    handle: &LinkHandle,
    session: &mut Session,
) -> (Vec<std::collections::BTreeSet<u64>>, Vec<u64>) {
    let mut sent = vec![std::collections::BTreeSet::new(); CHANNELS];
    if handle.record.is_none() || !node.incarnation().1 {
        return (sent, vec![0; CHANNELS]);
    }
    let recovered = handle.restored_sent.lock().map(|mut r| std::mem::take(&mut *r)).unwrap_or_default();
    let now = Instant::now();
    let mut per_channel: Vec<Vec<(u64, Bytes, Option<Instant>)>> = vec![Vec::new(); CHANNELS];
    for entry in recovered.sent {
        let lifetime = entry.message.content.lifetime.unwrap_or(Lifetime::UNLIMITED);
        let left = lifetime.after(entry.age.as_millis() as u64);
        let expires_at = match left {
            Some(left) if left.is_unlimited() => None,
            Some(left) => Some(now + Duration::from_millis(left.as_ms())),
            // It ran out while the node was down: it goes as a skip.
            None => Some(now),
        };
        // The bytes carry the lifetime left now (the time down counted).
        let bytes = match left {
            Some(left) if !left.is_unlimited() => {
                linkbus_proto::wire::with_lifetime(&entry.bytes, left.as_ms()).unwrap_or(entry.bytes)
            }
            _ => entry.bytes,
        };
        if let (Some(list), Some(numbers)) =
            (per_channel.get_mut(entry.channel as usize), sent.get_mut(entry.channel as usize))
        {
            list.push((entry.number, bytes, expires_at));
            numbers.insert(entry.number);
        }
    }
    for (channel, mut entries) in per_channel.into_iter().enumerate() {
        entries.sort_by_key(|(sequence, _, _)| *sequence);
        session.restore_sending(channel as u8, entries, now);
        if let Some(&through) = recovered.acked.get(channel).filter(|t| **t > 0) {
            session.restore_acknowledged(channel as u8, through);
        }
    }
    let count: usize = sent.iter().map(std::collections::BTreeSet::len).sum();
    info!(peer = %handle.peer.name, count, "Messages recorded as sent before the restart taken up.");
    let mut acked = recovered.acked;
    acked.resize(CHANNELS, 0);
    (sent, acked)
}

/// The link channel a message travels on: its priority class, or the file channel.
fn channel_of(message: &Message) -> u8 {
    channel_for(message.content.priority.code(), message.content.kind == Kind::File)
}

/// A timer kept across a loop's rounds (the link loop's, the result timer's) and moved only
/// when its deadline changes: a fresh timer each round would register anew each time, and
/// one due before the runtime's next wake-up wakes the runtime's driver (a system call)
/// each time.
pub(crate) struct Deadline {
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    at: Option<tokio::time::Instant>,
}

impl Deadline {
    pub(crate) fn new() -> Self {
        let far = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
        Self { sleep: Box::pin(tokio::time::sleep_until(far)), at: None }
    }

    /// Fires at `at` from now on (never, for `None`).
    pub(crate) fn set(&mut self, at: Option<tokio::time::Instant>) {
        if at != self.at {
            if let Some(at) = at {
                self.sleep.as_mut().reset(at);
            }
            self.at = at;
        }
    }

    /// Waits until the deadline (forever while there is none). Cancel-safe.
    pub(crate) async fn wait(&mut self) {
        if self.at.is_none() {
            return std::future::pending().await;
        }
        self.sleep.as_mut().await;
        self.at = None;
    }
}

impl Link {
    fn peer(&self) -> &str {
        self.handle.peer.name.as_str()
    }

    fn backlog(&self) -> usize {
        self.active.as_ref().map_or(0, |a| a.backlog.load(Ordering::Relaxed))
    }

    /// Takes up an operator's reset of a stopped link: the next handshake takes the peer's
    /// numbers, and the link dials again at once. Returns why the link is still stopped, if
    /// it is.
    fn apply_reset(&mut self) -> Option<String> {
        match self.handle.gate() {
            Gate::Open => None,
            Gate::Stopped(reason) => Some(reason),
            Gate::Reset => {
                warn!(
                    peer = self.peer(),
                    "Link reset by the operator: the next handshake takes the peer's numbers."
                );
                self.session.reset_numbers();
                self.backoff.reset();
                if self.handle.peer.address.is_some() {
                    self.next_dial = Some(tokio::time::Instant::now());
                }
                None
            }
        }
    }

    /// Takes a new connection, unless the link is stopped or the session prefers the
    /// current one.
    fn adopt(&mut self, incoming: Incoming, dialed_by_us: bool) {
        if let Some(reason) = self.apply_reset() {
            let reason = format!(
                "the link is stopped on {} ({reason}); an operator must run `linkbus link reset {}` there",
                self.node.name(),
                self.peer()
            );
            refuse(incoming.connection, Some(incoming.secure), CloseCode::ProtocolError, &reason);
            return;
        }
        if let Some(current) = &self.active {
            let peer = incoming.hello.as_ref().map(|h| (h.incarnation, h.run));
            if !self.session.should_replace(current.dialed_by_us, dialed_by_us, peer) {
                debug!(peer = self.peer(), "Duplicate connection refused.");
                let reason = "a connection to this peer already exists";
                refuse(incoming.connection, Some(incoming.secure), CloseCode::Duplicate, reason);
                return;
            }
            debug!(peer = self.peer(), "Connection replaced by a newer one.");
            self.active = None;
            self.handle.up.store(false, Ordering::Relaxed);
            self.session.handle_disconnected();
        }
        let Incoming { connection, hello, leftover, secure } = incoming;
        let id = self.next_conn_id;
        self.next_conn_id += 1;
        debug!(peer = self.peer(), address = %connection.peer_address, dialed_by_us, "Connection open.");
        let (writer_tx, writer_rx) = mpsc::unbounded_channel();
        let backlog = Arc::new(AtomicUsize::new(0));
        let events = self.conn_tx.clone();
        let writer: io::SharedWriter = Arc::new(std::sync::Mutex::new(Some(connection.writer)));
        tokio::spawn(write_loop(
            writer.clone(),
            writer_rx,
            backlog.clone(),
            self.drained.clone(),
            id,
            events,
            io::LET_GO_WRITE_GRACE,
        ));
        self.active = Some(Active {
            id,
            dialed_by_us,
            secure,
            writer,
            to_writer: writer_tx,
            backlog,
            reader: connection.reader,
            read_buf: bytes::BytesMut::new(),
        });
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
            ConnEvent::Bytes(bytes) => {
                let Some(active) = self.active.as_mut() else { return };
                if let Err(e) = active.secure.handle_received(bytes) {
                    if self.node.warnings().admit(reason::LINK_CLOSED) {
                        warn!(peer = self.peer(), error = %e, "Secure channel failed.");
                    }
                    return self.drop_connection(&e.to_string());
                }
                while let Some(plain) = self.active.as_mut().and_then(|a| a.secure.take_plaintext()) {
                    self.session.handle_received(plain, Instant::now());
                }
            }
            ConnEvent::Closed(reason) => self.drop_connection(&reason),
        }
    }

    fn drop_connection(&mut self, reason: &str) {
        if self.active.take().is_none() {
            return;
        }
        self.handle.note_down();
        self.handle.note_error(reason);
        if self.handle.up.swap(false, Ordering::Relaxed) {
            info!(peer = self.peer(), reason, "Link down.");
            self.node.emit(
                Event::new(EventKind::LinkDown, format!("link to {} down: {reason}", self.peer()))
                    .with("peer", self.peer())
                    .with("reason", reason),
            );
        } else {
            debug!(peer = self.peer(), reason, "Connection closed.");
        }
        self.session.handle_disconnected();
        if self.handle.peer.address.is_some() {
            let after = tokio::time::Instant::now() + self.backoff.take();
            self.next_dial = Some(self.redial_not_before.take().map_or(after, |busy| busy.max(after)));
        }
    }

    /// Writes what the session has to send: its control frames, then its packets — once the
    /// records of messages just sent are synced (a node must not have sent what it does not
    /// remember sending after a crash; one sync covers every message of the pump, and the
    /// other writers' waiting with it).
    fn write_transmit(&mut self) {
        if std::mem::take(&mut self.unsynced)
            && let Err(e) = self.node.committer().sync_blocking()
        {
            self.node.fail(format!("store failed while recording messages for {}: {e}", self.peer()));
            return self.drop_connection("store failed");
        }
        let mut out = Vec::new();
        self.session.take_transmit(&mut out);
        if let Some(active) = &mut self.active {
            if let Err(e) = active.secure.send_chunks(&mut out) {
                if self.node.warnings().admit(reason::LINK_CLOSED) {
                    warn!(peer = self.handle.peer.name.as_str(), error = %e, "Secure channel failed.");
                }
                return self.drop_connection(&e.to_string());
            }
            active.secure.take_transmit(&mut out);
            if !out.is_empty()
                && let Err(e) = active.write(out)
            {
                self.drop_connection(&format!("write failed: {e}"));
            }
        }
    }

    /// Moves messages into the session, handles its events and writes its output, until
    /// nothing changes.
    fn pump(&mut self) {
        for _ in 0..4 {
            self.fill_window();
            // Bounded, so a large resend after a reconnect never stops the reading that
            // brings the acknowledgements.
            let budget = DATA_BACKLOG_BYTES.saturating_sub(self.backlog() + self.session.transmit_len());
            self.session.write_pending(Instant::now(), budget);
            let progressed = self.handle_events();
            self.write_transmit();
            if !progressed {
                break;
            }
        }
        // What the socket took at once wakes no writer task, so nothing says it drained:
        // with more to write, go round again (each round writes at least one packet).
        if self.active.is_some()
            && self.session.is_established()
            && self.backlog() == 0
            && self.session.unwritten() > 0
        {
            self.drained.notify_one();
        }
        if let Ok(mut stats) = self.handle.stats.lock() {
            *stats = *self.session.stats();
        }
    }

    fn fill_window(&mut self) {
        if !self.session.is_established() {
            return;
        }
        let now = Instant::now();
        let mut too_large = Vec::new();
        // Events are raised after the queue's lock is released (an event copy may go into
        // this very queue).
        let mut expired = Vec::new();
        {
            let mut queue = self.handle.lock();
            let before = queue.len();
            // Whether a message went to the session (not only expired or too large ones out).
            let mut took = false;
            loop {
                let session = &self.session;
                let Some((mut message, queued_at, key)) = queue.pop(|m| takes_more(session, channel_of(m)))
                else {
                    break;
                };
                let elapsed = now.saturating_duration_since(queued_at);
                let lifetime = message.content.lifetime.unwrap_or(Lifetime::UNLIMITED);
                let Some(left) = lifetime.after(elapsed.as_millis() as u64) else {
                    expired.push((message, key));
                    continue;
                };
                message.content.lifetime = Some(left);
                let expires_at = (!left.is_unlimited()).then(|| now + Duration::from_millis(left.as_ms()));
                let channel = channel_of(&message);
                // The payload of a large message is shared, not copied behind its head.
                let bytes = match self.heads.get_mut(usize::from(channel)) {
                    Some(heads) => Encoded::of_in(&message, heads),
                    None => Encoded::of(&message),
                };
                // A second handle on the bytes only for a message to record (a shared clone
                // costs an allocation).
                let recorded = self.handle.record.as_ref().zip(key).map(|(r, k)| (r, k, bytes.clone()));
                match self.session.send(channel, bytes, expires_at, now) {
                    Ok(sequence) => {
                        took = true;
                        // Recorded as sent under its number, in the queue's order.
                        if let Some((record, key, bytes)) = &recorded {
                            record.sent(*key, channel, sequence, bytes);
                            self.unsynced = true;
                            if let Some(sent) = self.sent.get_mut(channel as usize) {
                                sent.insert(sequence);
                            }
                        }
                    }
                    Err(SendError::TooLarge { max, .. }) => {
                        if let (Some(record), Some(key)) = (&self.handle.record, key) {
                            record.dropped(key);
                        }
                        too_large.push((message, max));
                    }
                    Err(_) => {
                        queue.unpop(message, queued_at, key);
                        break;
                    }
                }
            }
            let freed = queue.len() < before;
            if took {
                queue.mark_taken(now);
            }
            drop(queue);
            if freed {
                self.handle.room.notify_waiters();
            }
        }
        for (message, key) in &expired {
            self.expire_unsent(message, *key);
        }
        for (message, max) in too_large {
            let reason = format!("message is larger than peer {}'s message limit ({max} bytes)", self.peer());
            self.dead_letter_local(message, &reason, now);
        }
    }

    /// Takes expired messages out of the transmission queue and reports them (see
    /// [`Link::expired`]).
    fn sweep_expired(&self) {
        let expired = self.handle.lock().take_expired(Instant::now());
        if expired.is_empty() {
            return;
        }
        self.handle.room.notify_waiters();
        for (message, key) in &expired {
            self.expire_unsent(message, *key);
        }
    }

    /// A message that expired in the transmission queue: its record goes, and it is
    /// reported (see [`Link::expired`]).
    fn expire_unsent(&self, message: &linkbus_plugin_api::Message, key: Option<u64>) {
        if let (Some(record), Some(key)) = (&self.handle.record, key) {
            record.dropped(key);
        }
        if self.node.warnings().admit(reason::EXPIRED) {
            warn!(peer = self.peer(), id = %message.id, "Message expired before it was sent.");
        }
        self.expired(message, false);
    }

    /// The handshake completed: the records follow its numbers, and the link is up (logged,
    /// and raised as an event).
    fn established(&mut self, peer_restarted: bool, resent: usize, resumed_bytes: u64, lost_by_peer: u64) {
        if peer_restarted {
            // Its numbers start again: those delivered under its old incarnation mean nothing.
            self.delivered_through = [None; CHANNELS];
        }
        // The records of a renumbering go to the store as one batch.
        let node = self.node.clone();
        let hold = node.committer().hold();
        self.recorded.established(&self.node, &self.session);
        self.rerecord_sent();
        self.record_acked();
        drop(hold);
        let security = self.active.as_ref().map(|a| a.secure.protection()).unwrap_or_default();
        info!(peer = self.peer(), security, peer_restarted, resent, resumed_bytes, "Link up.");
        if lost_by_peer > 0 {
            warn!(
                peer = self.peer(),
                lost_by_peer,
                "The peer lost the receive numbers of volatile messages it had acknowledged (it crashed, \
                 or its data was restored); they go again as skips."
            );
        }
        let renegotiations = self.session.stats().renegotiations;
        let text = format!(
            "link to {} up (renegotiation {renegotiations}: {resent} resent, {resumed_bytes} bytes resumed, \
             {lost_by_peer} volatile lost by the peer)",
            self.peer()
        );
        self.node.emit(
            Event::new(EventKind::LinkUp, text)
                .with("peer", self.peer())
                .with("renegotiations", renegotiations)
                .with("resent", resent)
                .with("resumed_bytes", resumed_bytes)
                .with("lost_by_peer", lost_by_peer)
                .with("peer_restarted", peer_restarted),
        );
        // A link counts as taking messages from the moment it is up (for
        // `links.queue_pace_bytes`).
        self.handle.lock().mark_taken(Instant::now());
        self.handle.up.store(true, Ordering::Relaxed);
        self.handle.note_up();
        self.handle.peer_message_bytes_max.store(self.session.message_bytes_max(), Ordering::Relaxed);
    }

    /// Raises the event for a message of ours that expired before it reached the peer, and
    /// reports it to the message's origin: for its recipients on the peer it failed (expired
    /// before it was sent from its origin) or expired (after it was `sent`, or on a relay).
    fn expired(&self, message: &linkbus_plugin_api::Message, sent: bool) {
        if message.content.kind == linkbus_plugin_api::Kind::Event {
            if message.content.name == RESULT_MESSAGE_NAME {
                self.node.count_result_dropped();
            }
            return;
        }
        let to = ResultTo::of(message);
        let with = |outcome: Outcome| self.recipients_here(message).map(|r| (r, outcome.clone())).collect();
        match (&message.id.source == self.node.name(), sent) {
            // Never sent from its origin: the send failed.
            (true, false) => {
                let reason = format!("expired before it was sent to {}", self.peer());
                self.node.report(to.as_ref(), with(Outcome::failed(EXPIRED_BEFORE_SENDING, reason)));
            }
            // Sent, but the peer may have it and not have acknowledged yet: a guess.
            (true, true) => self.node.report_provisional(to.as_ref(), with(Outcome::Expired)),
            // A relay that never sent it on knows it expired.
            (false, false) => self.node.report(to.as_ref(), with(Outcome::Expired)),
            // A relay that sent it on cannot know: the origin waits for the recipients' node.
            (false, true) => {}
        }
        self.node.emit(
            Event::new(
                EventKind::Expired,
                format!("message {} expired before it reached {}", message.id, self.peer()),
            )
            .with("id", &message.id)
            .with("peer", self.peer()),
        );
    }

    fn stopped_event(&self, error: &SessionError) {
        self.node.emit(
            Event::new(
                EventKind::LinkStopped,
                format!("link to {} stopped: {error}; run `linkbus link reset {}`", self.peer(), self.peer()),
            )
            .with("peer", self.peer())
            .with("reason", error),
        );
    }

    /// The recipients of `message` this link takes it to: all of the copy's (a message
    /// leaves in one copy per next hop, naming the recipients routed through it).
    fn recipients_here<'m>(
        &self,
        message: &'m linkbus_plugin_api::Message,
    ) -> impl Iterator<Item = linkbus_plugin_api::Address> + 'm {
        message.content.recipients.iter().cloned()
    }

    /// Dead-letters a message of ours too large for the peer (its recipients there failed).
    fn dead_letter_local(&self, message: linkbus_plugin_api::Message, reason: &str, now: Instant) {
        let failed = self.recipients_here(&message).collect();
        let why = DeadLetter { code: DeadLetterCode::TooLarge, reason, failed };
        if let Err(e) = crate::flow::dead_letter::put_bounded(&self.node, message, why, now)
            && self.node.warnings().admit(reason::DEAD_LETTER)
        {
            warn!(peer = self.peer(), error = %e, "Dead-letter queue refused a message; it is lost.");
        }
    }

    /// Takes a message that arrived into this round's arrivals, which the node takes
    /// together before any other event of the round, at its end, or once they reach a
    /// run's bounds.
    ///
    /// # Errors
    /// As [`Link::deliver`]; or the node takes no persistent message now (short of disk).
    fn received(
        &mut self,
        arrivals: &mut Arrivals,
        (channel, sequence): (u8, u64),
        mut message: Message,
        now: Instant,
    ) -> Result<(), String> {
        // The sender counts what is not volatile on the wire as kept: its number is synced
        // before the acknowledgement, whatever the queue makes of it.
        let kept = message.content.reliability != linkbus_plugin_api::Reliability::Volatile;
        // Resolved once here (origins resolve it; one that did not gets it resolved here).
        message.content.reliability = self.node.reliability_of(&message.content);
        let stored = message.content.reliability == linkbus_plugin_api::Reliability::Persistent;
        if (kept || stored)
            && let Err(reason) = self.node.disk().admit(message.content.payload.len() as u64)
        {
            // What came before is delivered (and acknowledged); this one and those after
            // stay with the peer, which sends them again when it reconnects.
            self.deliver(arrivals, now)?;
            return Err(self.refuse_busy(&reason));
        }
        arrivals.persistent |= kept || stored;
        // A stored message and the number after it are written together.
        let record = if stored { self.recorded.delivered(channel, sequence) } else { Batch::new() };
        arrivals.bytes += message.content.payload.len();
        arrivals.messages.push(Arrival { message, record });
        arrivals.numbers.push((channel, sequence));
        if arrivals.messages.len() >= RUN_MESSAGES_MAX || arrivals.bytes >= RUN_BYTES_MAX {
            self.deliver(arrivals, now)?;
        }
        Ok(())
    }

    /// Notes that this node cannot take what the peer sends now: the connection is dropped
    /// after a `Close` with code `Busy` (written after the acknowledgements of what was
    /// taken). Returns the reason.
    fn refuse_busy(&mut self, reason: &str) -> String {
        let reason = format!("{} takes no persistent message now: {reason}", self.node.name());
        if self.node.warnings().admit(reason::STORE_SHORT) {
            warn!(peer = self.peer(), reason, "Persistent delivery refused; the peer keeps it.");
        }
        self.busy = Some(reason.clone());
        reason
    }

    /// Writes a `Close` frame on the connection, if there is one.
    fn send_close(&mut self, code: CloseCode, reason: String) {
        let Some(active) = self.active.as_mut() else { return };
        let mut out = BytesMut::new();
        Frame::Close { code: code as u16, reason }.encode(&mut out);
        if active.secure.send(&out).is_ok()
            && let Some(bytes) = active.secure.poll_transmit()
        {
            let _ = active.write(vec![bytes]);
        }
    }

    /// Hands the node what waits in `arrivals` (see `flow::inbound`); marks what it took
    /// for acknowledgement.
    ///
    /// # Errors
    /// Why a message could not be taken (the connection is dropped then; it and those after
    /// it are not acknowledged).
    fn deliver(&mut self, arrivals: &mut Arrivals, now: Instant) -> Result<(), String> {
        if arrivals.messages.is_empty() {
            return Ok(());
        }
        arrivals.bytes = 0;
        let (taken, outcome) = self.inbound.take(&self.node, std::mem::take(&mut arrivals.messages), now);
        for (channel, sequence) in std::mem::take(&mut arrivals.numbers).into_iter().take(taken) {
            arrivals.delivered(channel, sequence);
        }
        self.handle.received_total.fetch_add(taken as u64, Ordering::Relaxed);
        outcome.map_err(|e| {
            if self.node.warnings().admit(reason::LINK_CLOSED) {
                warn!(peer = self.peer(), error = %e, "Cannot take delivery; dropping the connection.");
            }
            e.to_string()
        })
    }

    /// Returns whether anything happened that may let more work through.
    fn handle_events(&mut self) -> bool {
        let mut progressed = false;
        let mut arrivals = Arrivals::default();
        let mut closed = None;
        let now = Instant::now();
        while let Some(event) = self.session.poll_event() {
            progressed = true;
            if let SessionEvent::Received { channel, sequence, message } = event {
                if let Err(e) = self.received(&mut arrivals, (channel, sequence), message, now) {
                    closed = Some(e);
                    break;
                }
                continue;
            }
            // Whatever else happens, after the messages that came before it. The event was
            // taken from the session, so it is handled even when they could not be taken
            // (the connection is dropped then, and nothing after them is acknowledged).
            let taken = match self.deliver(&mut arrivals, now) {
                Ok(()) => true,
                Err(e) => {
                    closed = Some(e);
                    false
                }
            };
            match event {
                SessionEvent::Established { peer_restarted, resent, resumed_bytes, lost_by_peer } => {
                    self.established(peer_restarted, resent, resumed_bytes, lost_by_peer);
                }
                SessionEvent::Received { .. } => {}
                SessionEvent::Skipped { .. } if !taken => {}
                SessionEvent::Skipped { channel, sequence, expired, durable } => {
                    arrivals.persistent |= durable;
                    if let Some(id) = expired {
                        if self.node.warnings().admit(reason::EXPIRED) {
                            warn!(peer = self.peer(), %id, "Message expired on its way here; dropped.");
                        }
                        let text = format!("message {id} expired on its way from {}", self.peer());
                        self.node.emit(
                            Event::new(EventKind::Expired, text).with("id", id).with("peer", self.peer()),
                        );
                    }
                    arrivals.delivered(channel, sequence);
                }
                SessionEvent::Dropped { message, reason } => self.dropped(message, reason, now),
                SessionEvent::Acked { channel, through, messages } => self.acked(channel, through, messages),
                SessionEvent::Closed(error) => {
                    closed = Some(self.closed(&error));
                    break;
                }
            }
            if !taken {
                break;
            }
        }
        if closed.is_none()
            && let Err(e) = self.deliver(&mut arrivals, now)
        {
            closed = Some(e);
        }
        if !self.acknowledge(arrivals.delivered, arrivals.persistent, now) {
            closed.get_or_insert_with(|| "store failed".to_owned());
        }
        if let Some(reason) = closed {
            self.write_transmit();
            if let Some(busy) = self.busy.take() {
                self.send_close(CloseCode::Busy, busy);
                self.redial_not_before = Some(tokio::time::Instant::now() + BUSY_REDIAL);
            }
            self.drop_connection(&reason);
        }
        progressed
    }

    /// Acknowledges a batch of deliveries (`through` per channel), once they and the
    /// recorded numbers are durable — or the numbers could go backwards for the peer after a
    /// crash (and stop the link). Returns `false` when the store failed (nothing was
    /// acknowledged; the node is stopping).
    fn acknowledge(&mut self, delivered: [Option<u64>; CHANNELS], persistent: bool, now: Instant) -> bool {
        // Only a batch with a message that is not volatile records its numbers (synced): a
        // receiver that restarts behind volatile numbers it acknowledged gets them again as
        // skips (its peer knows they were volatile), so they need no store at all.
        if persistent {
            self.recorded.batch_delivered(&self.node, &delivered);
        }
        if let Err(e) = self.make_durable(persistent) {
            self.node
                .fail(format!("store sync failed before acknowledging messages from {}: {e}", self.peer()));
            return false;
        }
        for (seen, through) in self.delivered_through.iter_mut().zip(delivered) {
            *seen = through.or(*seen);
        }
        for (channel, through) in delivered.into_iter().enumerate() {
            if let Some(through) = through.filter(|_| !crate::faults::hold_acks()) {
                self.session.handle_delivered(channel as u8, through, now);
                self.backoff.reset();
            }
        }
        true
    }

    /// The peer acknowledged `messages` of `channel`, through `through`.
    fn acked(&mut self, channel: u8, through: u64, messages: usize) {
        // Records change (and go to the store as one batch) only when a persistent message
        // was among those acknowledged.
        let forgets =
            self.sent.get(channel as usize).and_then(|s| s.first()).is_some_and(|first| *first <= through);
        if forgets {
            let node = self.node.clone();
            let hold = node.committer().hold();
            self.forget_sent(channel, through);
            self.record_acked();
            drop(hold);
        }
        self.handle.acked_total.fetch_add(messages as u64, Ordering::Relaxed);
        if messages > 0 {
            self.backoff.reset();
        }
    }

    /// Messages of `channel` acknowledged through `through` are no longer recorded as sent.
    fn forget_sent(&mut self, channel: u8, through: u64) {
        let (Some(record), Some(sent)) = (&self.handle.record, self.sent.get_mut(channel as usize)) else {
            return;
        };
        let rest = sent.split_off(&(through + 1));
        let done = std::mem::replace(sent, rest);
        if !done.is_empty() {
            record.forget(channel, done);
        }
    }

    /// Records, per channel, the highest number the peer acknowledged for a persistent
    /// message, when it changed (it also goes down: a renumbering after the handshake).
    fn record_acked(&mut self) {
        let Some(record) = &self.handle.record else { return };
        for (channel, recorded) in self.acked_recorded.iter_mut().enumerate() {
            let now = self.session.durable_acked(channel as u8);
            if now != *recorded {
                record.acked(channel as u8, now);
                *recorded = now;
            }
        }
    }

    /// After a handshake that renumbered what waits (the peer lost track of our numbers, or
    /// an operator reset), the record follows the new numbers.
    fn rerecord_sent(&mut self) {
        let Some(record) = &self.handle.record else { return };
        let now = Instant::now();
        for channel in 0..CHANNELS as u8 {
            let Some(sent) = self.sent.get_mut(channel as usize) else { continue };
            // The persistent messages waiting, read from their heads: only a renumbering
            // (their numbers are not the recorded ones) decodes them to record them again.
            let mut awaiting = self.session.awaiting(channel);
            awaiting.retain(|(_, bytes, _)| bytes.is_persistent());
            let numbers: std::collections::BTreeSet<u64> = awaiting.iter().map(|(s, _, _)| *s).collect();
            if &numbers == sent {
                continue;
            }
            let current: Vec<(u64, linkbus_plugin_api::Message)> = awaiting
                .into_iter()
                .filter_map(|(sequence, bytes, expires_at)| {
                    let mut message = linkbus_proto::wire::decode_message(bytes.to_bytes()).ok()?;
                    // Recorded with the lifetime it has left now.
                    if let Some(at) = expires_at {
                        let left = at.saturating_duration_since(now).as_millis().max(1) as u64;
                        message.content.lifetime = Some(Lifetime::from_ms(left));
                    }
                    Some((sequence, message))
                })
                .collect();
            record.rerecord(channel, std::mem::take(sent), &current);
            *sent = current.iter().map(|(s, _)| *s).collect();
            self.unsynced = true;
        }
    }

    /// What is acknowledged is durable first: one sync for a batch with a message that is
    /// not volatile (group commit); a node whose store failed acknowledges nothing more.
    fn make_durable(&self, persistent: bool) -> Result<(), linkbus_plugin_api::StoreError> {
        if self.node.is_failing() {
            return Err(linkbus_plugin_api::StoreError::Poisoned("the node is stopping".into()));
        }
        if persistent { self.node.committer().sync_blocking() } else { Ok(()) }
    }

    fn dropped(&self, message: Bytes, reason: DropReason, now: Instant) {
        // A dead letter can stay for long: copied out of a buffer it may share with other
        // messages' heads (an expired one is only reported).
        let message =
            if reason == DropReason::TooLargeForPeer { Bytes::copy_from_slice(&message) } else { message };
        let decoded = linkbus_proto::wire::decode_message(message);
        match (reason, decoded) {
            (DropReason::Expired, Ok(m)) => {
                if self.node.warnings().admit(reason::EXPIRED) {
                    warn!(peer = self.peer(), id = %m.id, "Message expired before it was resent.");
                }
                self.expired(&m, true);
            }
            (DropReason::TooLargeForPeer, Ok(m)) => {
                let reason = format!("message is larger than peer {}'s message limit", self.peer());
                self.dead_letter_local(m, &reason, now);
            }
            (_, Err(e)) => {
                if self.node.warnings().admit(reason::BAD_RESULT) {
                    warn!(peer = self.peer(), error = %e, "Dropped message does not decode.");
                }
            }
        }
    }

    fn closed(&mut self, error: &SessionError) -> String {
        match error {
            SessionError::PeerClosed { code, reason } if *code == CloseCode::Busy as u16 => {
                // Its messages wait here; asking again at once would only be refused again.
                self.redial_not_before = Some(tokio::time::Instant::now() + BUSY_REDIAL);
                if self.node.warnings().admit(reason::STORE_SHORT) {
                    warn!(
                        peer = self.peer(),
                        reason, "The peer takes no persistent message now; they wait here."
                    );
                }
            }
            SessionError::PeerClosed { code, reason } if *code == CloseCode::Shutdown as u16 => {
                info!(peer = self.peer(), reason, "Peer closed the link.");
            }
            SessionError::PeerClosed { code, reason } if *code == CloseCode::Duplicate as u16 => {
                debug!(peer = self.peer(), reason, "Duplicate connection closed by the peer.");
            }
            SessionError::WentBackwards { .. } => {
                error!(
                    peer = self.peer(),
                    %error,
                    "Link STOPPED: the peer's sequence numbers went backwards (its data was wiped or restored \
                     from an old copy). Check its store, then run `linkbus link reset {}` on this node to take \
                     its numbers as they are (messages it acknowledged before are not sent again).",
                    self.peer()
                );
                self.handle.stop(error.to_string());
                self.stopped_event(error);
            }
            SessionError::ClaimsMore { .. } => {
                error!(
                    peer = self.peer(),
                    %error,
                    "Link STOPPED: the peer received more than this node remembers sending (this node's data \
                     was wiped or restored from an old copy). Check this node's store, then run `linkbus link \
                     reset {}` on this node to take the peer's numbers (messages waiting here on that channel \
                     count as delivered: the peer has them).",
                    self.peer()
                );
                self.handle.stop(error.to_string());
                self.stopped_event(error);
            }
            error => {
                if self.node.warnings().admit(reason::LINK_CLOSED) {
                    warn!(peer = self.peer(), %error, "Link closed.");
                }
            }
        }
        error.to_string()
    }

    async fn shutdown(mut self) {
        // Acknowledgements waiting for company go first: the peer must not send again what
        // was delivered here (it would arrive twice after a restart).
        self.session.flush_acks();
        self.write_transmit();
        // Every number delivered here is recorded (the node syncs the store last), the
        // volatile messages' too: a clean restart expects exactly the next ones.
        self.recorded.batch_delivered(&self.node, &self.delivered_through);
        if self.active.is_some() {
            self.send_close(CloseCode::Shutdown, "node shutting down".into());
            self.active = None;
            // Give the writer a moment to send the close frame.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
