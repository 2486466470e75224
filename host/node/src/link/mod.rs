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
mod connection;
mod dial;
mod handle;
mod inbound;
mod io;
mod ledger;
mod outbound;
mod reports;
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
use connection::Active;
use dial::DialError;
pub(crate) use handle::Health;
pub use handle::LinkHandle;
pub(crate) use handle::{Gate, Incoming};
pub(crate) use io::refuse;
use io::{ConnEvent, read_chunk, write_loop};
use outbound::DIRECT_WRITE_BYTES_MAX;
use reports::EXPIRY_SWEEP;

/// Bytes handed to the writer task and not yet written, twice which the link stops reading (so a
/// peer that sends but never reads gets no more answers queued).
pub(crate) const WRITE_BACKLOG_BYTES_MAX: usize = 16 << 20;

/// Bytes of packets handed to the writer and not yet written, above which the session
/// writes no more packets: enough to keep the connection busy, small enough that a packet
/// of an urgent channel is not queued behind much.
pub(crate) const DATA_BACKLOG_BYTES: usize = 256 << 10;

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
pub(crate) async fn run(node: Arc<NodeState>, handle: Arc<LinkHandle>, mut shutdown: watch::Receiver<bool>) {
    let taken = handle.incoming_rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    let Some(mut incoming_rx) = taken else {
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
    #[cfg(feature = "fault-injection")]
    if crate::faults::skip_dedup() {
        session.skip_dedup_for_tests();
    }
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
}
