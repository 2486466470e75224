//! A message's way in at its origin: a client's put or commit, and the node's own events
//! and results. Contents are checked and stamped, run through the origin stages (once per
//! batch), placed, admitted (room, and pace with a busy link) and queued.

use std::sync::Arc;
use std::time::{Duration, Instant};

use linkbus_plugin_api::{Address, Batch, Content, Lifetime, Message, MessageId, Reliability};

use super::placement::{self, Came, Placement, RoomAsk};
use super::refusal::{CommitError, PutError, Refusal, RefusalCode};
use super::stages::{Site, StageContext, Stages};
use crate::link::LinkHandle;
use crate::node::NodeState;
use crate::queue::LocalQueue;
use crate::results::{Outcome, ResultBook};

/// Longest one put call keeps pace with a busy link (`links.queue_pace_bytes`): a producer
/// faster than its link is held to the link's pace rather than running up to the queue's
/// bound. Puts that may not wait, deliveries from links, events, results and commits are
/// not held. A link that took nothing for that long (down, or its peer not acknowledging)
/// holds no put back. Long enough for a slow link, which takes messages in bursts.
// Perf (OPT-33): keeping pace keeps payloads warm in the cache and memory low.
pub const PACE_WAIT: Duration = Duration::from_secs(1);

/// Perf (OPT-48): messages of one put admitted together at most: enough to take the per-message checks
/// and locks off a batch, few enough that other puts wait little for the admission lock.
pub(crate) const RUN_MESSAGES_MAX: usize = 256;

/// Perf (OPT-48, OPT-49): payload bytes a run (of a put, or of arrivals from a link) gathers
/// at most: a run's room
/// is checked once, and a class with no bytes takes any size, so this bounds how far a run
/// can go past a class's byte bound or its pace where single messages would have stopped.
pub(crate) const RUN_BYTES_MAX: usize = 256 << 10;

/// Room for client puts and commits: one at a time checks room and fills it, and waits for
/// room that is given up.
pub(crate) struct Admission {
    // Invariant: held while room is checked and filled for a client put or a commit, so two
    // of them never both take the last room. The node's own messages and arrivals from
    // links do not take it (they never wait for room, and may overfill a queue a little).
    lock: std::sync::Mutex<()>,
    /// Notified when messages leave a queue or a transmission queue.
    room: Arc<tokio::sync::Notify>,
}

impl Admission {
    /// Admission, woken through `room`.
    pub(crate) fn new(room: Arc<tokio::sync::Notify>) -> Self {
        Self { lock: std::sync::Mutex::new(()), room }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Wakes every put and commit waiting for room (the node stops).
    pub(crate) fn wake_all(&self) {
        self.room.notify_waiters();
    }
}

/// Contents accepted from a client: their sequence numbers and when they were made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The messages' sequence numbers, in order.
    pub sequences: Vec<u64>,
    /// The messages' creation time (milliseconds since the Unix epoch).
    pub created_unix_ms: u64,
}

/// Where one client connection's puts enter the node: the origin stages as built for it.
#[derive(Debug, Default)]
pub struct Origin {
    stages: Option<Stages>,
}

/// A put under way: its limits, and what it accepted so far.
struct Admitting {
    timeout: Duration,
    deadline: tokio::time::Instant,
    /// When the messages arrived (read again after a wait).
    now: Instant,
    pace_bytes: u64,
    /// Until when a put keeps pace with a busy link (none for one that may not wait).
    pace_until: Option<tokio::time::Instant>,
    /// The accepted messages' sequence numbers, in order.
    sequences: Vec<u64>,
    /// Whether an accepted message is persistent.
    persistent: bool,
}

impl Origin {
    /// The chain of origin stages for this connection (built at its first put).
    fn stages(&mut self, node: &NodeState) -> &mut Stages {
        self.stages.get_or_insert_with(|| {
            let context = StageContext { node: node.name(), site: Site::Origin, peer: None };
            Stages::build(node.stage_factories(), &context)
        })
    }

    /// Checks and stamps `contents` and runs the origin stages over them: the messages,
    /// up to the first refused content, and that refusal.
    pub(crate) fn prepare(
        &mut self,
        node: &NodeState,
        contents: Vec<Content>,
        created_unix_ms: u64,
    ) -> (Vec<Message>, Option<PutError>) {
        let mut messages = Vec::with_capacity(contents.len());
        let mut refused = None;
        for (index, content) in contents.into_iter().enumerate() {
            match prepare_one(node, content, created_unix_ms) {
                Ok(message) => messages.push(message),
                Err(refusal) => {
                    refused = Some(PutError::at(index, refusal));
                    break;
                }
            }
        }
        let stages = self.stages(node);
        if !stages.is_empty()
            && let Some((index, refusal)) =
                stages.run(&mut messages.iter_mut().collect::<Vec<_>>()).into_iter().next()
        {
            messages.truncate(index);
            refused = Some(PutError::at(index, refusal));
        }
        (messages, refused)
    }

    /// Checks, stamps and admits `contents` in runs that go the same way (see
    /// [`same_way`]), each run through the origin stages as it is made. Stops at the first
    /// content refused.
    // Perf (LEV-31): the first run is on its way while the next is made.
    async fn admit_in_runs(
        &mut self,
        node: &NodeState,
        contents: Vec<Content>,
        created_unix_ms: u64,
        put: &mut Admitting,
    ) -> Result<(), PutError> {
        let mut contents = contents.into_iter().enumerate();
        let mut carried: Option<Message> = None;
        let mut refused = None;
        loop {
            let mut run: Vec<Message> = carried.take().into_iter().collect();
            let mut bytes = run.first().map_or(0, |m| m.content.payload.len());
            for (index, content) in contents.by_ref() {
                match prepare_one(node, content, created_unix_ms) {
                    Ok(message)
                        if run.len() < RUN_MESSAGES_MAX
                            && bytes < RUN_BYTES_MAX
                            && run.first().is_none_or(|first| same_way(first, &message)) =>
                    {
                        bytes += message.content.payload.len();
                        run.push(message);
                    }
                    Ok(message) => {
                        carried = Some(message);
                        break;
                    }
                    Err(refusal) => {
                        refused = Some(PutError::at(index, refusal));
                        break;
                    }
                }
            }
            if run.is_empty() {
                return refused.map_or(Ok(()), Err);
            }
            let stages = self.stages(node);
            let mut rerouted = false;
            if !stages.is_empty() {
                let first = stages.run(&mut run.iter_mut().collect::<Vec<_>>()).into_iter().next();
                rerouted = stages.rerouted();
                if let Some((at, refusal)) = first {
                    run.truncate(at);
                    carried = None;
                    refused = Some(PutError::at(put.sequences.len() + at, refusal));
                }
            }
            // A filter's `on_route` may have sent some of the run elsewhere.
            let runs = if rerouted { split_same_way(run) } else { vec![run] };
            for run in runs {
                if let Some(singles) = admit(node, run, put).await? {
                    // A run that cannot go at once goes one message at a time.
                    for single in singles {
                        admit(node, vec![single], put).await?;
                    }
                }
            }
            if refused.is_some() {
                return refused.map_or(Ok(()), Err);
            }
        }
    }

    /// Accepts a batch of contents from a client, in order: each is checked, stamped and
    /// queued locally or on the link to its destination. A content whose destination (a
    /// queue, or the transmission queue of its link and priority) is full waits up to
    /// `timeout` for room; a zero timeout is a try-put. Persistent messages are durable
    /// before this returns.
    ///
    /// # Errors
    /// [`PutError`] for the first content refused or still without room at the deadline;
    /// those before it stay accepted.
    pub async fn put(
        &mut self,
        node: &NodeState,
        contents: Vec<Content>,
        timeout: Duration,
    ) -> Result<Accepted, PutError> {
        if let Some(reason) = node.failure() {
            let message = format!("the node is stopping: {reason}");
            return Err(PutError { code: RefusalCode::Store, accepted: 0, message });
        }
        let created_unix_ms = crate::clock::unix_ms();
        let deadline = tokio::time::Instant::now() + timeout;
        let pace_bytes = node.config().links.queue_pace_bytes;
        let mut put = Admitting {
            timeout,
            deadline,
            // The batch arrives at one instant (read again after waiting for room).
            now: Instant::now(),
            pace_bytes,
            pace_until: (!timeout.is_zero() && pace_bytes > 0)
                .then(|| deadline.min(tokio::time::Instant::now() + PACE_WAIT)),
            sequences: Vec::with_capacity(contents.len()),
            persistent: false,
        };
        let outcome = self.admit_in_runs(node, contents, created_unix_ms, &mut put).await;
        // Whatever was accepted (all, or those before a refused one) is durable before the
        // client hears of it.
        if let Err(reason) = node.make_durable(put.persistent).await {
            let accepted = u32::try_from(put.sequences.len()).unwrap_or(u32::MAX);
            return Err(PutError { code: RefusalCode::Store, accepted, message: reason });
        }
        outcome.map(|()| Accepted { sequences: put.sequences, created_unix_ms })
    }
}

/// Checks one content from a client and makes it a message of this node.
///
/// # Errors
/// Why the content is refused.
pub(crate) fn prepare_one(
    node: &NodeState,
    content: Content,
    created_unix_ms: u64,
) -> Result<Message, Refusal> {
    check_content(node, &content)?;
    Ok(stamp(node, content, created_unix_ms))
}

/// Checks a content against this node's limits and topology, without side effects.
fn check_content(node: &NodeState, content: &Content) -> Result<(), Refusal> {
    content.validate().map_err(|e| Refusal::new(RefusalCode::Invalid, e.to_string()))?;
    if content.priority.is_system() {
        return Err(Refusal::new(RefusalCode::Invalid, "the system priority is reserved for the node"));
    }
    if let Some((key, _)) =
        content.headers.iter().find(|(k, _)| super::codecs::RESERVED_HEADERS.contains(&k.as_str()))
    {
        return Err(Refusal::new(RefusalCode::Invalid, format!("header '{key}' is written by nodes only")));
    }
    // Perf: the queue lookup that resolves the reliability is made only when short of room.
    if let Err(reason) = node.disk().admit(content.payload.len() as u64)
        && node.reliability_of(content) == Reliability::Persistent
    {
        return Err(Refusal::new(RefusalCode::Busy, reason));
    }
    let size = content.payload.len() as u64;
    let max = node.config().messages.message_bytes_max;
    if size > max {
        let reason = format!("payload of {size} bytes is over messages.message_bytes_max {max}");
        return Err(Refusal::new(RefusalCode::TooLarge, reason));
    }
    let encoded = linkbus_proto::wire::message_encoded_len(node.name().as_str().len(), content);
    let encoded_max = node.encoded_message_bytes_max();
    if encoded > encoded_max {
        let reason = format!(
            "message of {encoded} bytes with its name and headers is over this node's limit of {encoded_max}"
        );
        return Err(Refusal::new(RefusalCode::TooLarge, reason));
    }
    for to in &content.recipients {
        if &to.node == node.name() {
            let queue = node.queue(to.queue.as_str()).ok_or_else(|| {
                let reason = format!("queue '{}' does not exist on node {}", to.queue, to.node);
                Refusal::new(RefusalCode::UnknownQueue, reason)
            })?;
            let max = queue.config().message_bytes_max;
            if size > max {
                let reason = format!("payload of {size} bytes is over queue {to}'s message_bytes_max {max}");
                return Err(Refusal::new(RefusalCode::TooLarge, reason));
            }
        } else if let Err(reason) = node.link_towards(&to.node) {
            return Err(Refusal::new(RefusalCode::NoRoute, reason));
        }
    }
    Ok(())
}

/// Makes a checked content a message of this node: reliability and lifetime defaults, id.
pub(crate) fn stamp(node: &NodeState, mut content: Content, created_unix_ms: u64) -> Message {
    content.reliability = node.reliability_of(&content);
    if content.lifetime.is_none() {
        content.lifetime = Some(match node.config().messages.lifetime_default_s {
            0 => Lifetime::UNLIMITED,
            s => Lifetime::from_secs(s),
        });
    }
    let id = MessageId { source: node.name().clone(), sequence: node.next_sequence(), created_unix_ms };
    Message::new(id, content)
}

/// Admits a run of messages that go the same way (one placement): all at once when every
/// place has room and no link they go to is ahead. Otherwise a run of more than one is
/// handed back (to go one at a time), and a single message waits for room (up to the put's
/// timeout, never past its lifetime) and, while its link is ahead, for the link.
async fn admit(
    node: &NodeState,
    run: Vec<Message>,
    put: &mut Admitting,
) -> Result<Option<Vec<Message>>, PutError> {
    let index = put.sequences.len();
    let Some(first) = run.first() else { return Ok(None) };
    // Undone if the put is refused, or abandoned while it waits. (Only a run of one may
    // want results: see `same_way`.)
    let single = run.len() == 1;
    let tracking = track(node, if single { &run } else { &[] }).map_err(|e| PutError::at(index, e))?;
    // A message never waits past its lifetime.
    let (deadline, waits) = match first.content.lifetime {
        Some(l) if !l.is_unlimited() => {
            let life = Duration::from_millis(l.as_ms());
            (put.deadline.min(tokio::time::Instant::from_std(put.now) + life), put.timeout.min(life))
        }
        _ => (put.deadline, put.timeout),
    };
    // At most half the time the message may wait (its timeout or lifetime), so a put that
    // was admissible when it came keeps time to find room after pacing.
    let pace_until = put.pace_until.map(|until| {
        let start = tokio::time::Instant::from_std(put.now);
        until.min(start + deadline.saturating_duration_since(start) / 2)
    });
    let here = if single { run.first().and_then(|m| results_here(node, m)) } else { None };
    loop {
        // Made before the check, so room given up after it wakes the wait below
        // (`notify_waiters` reaches every `Notified` made before it, polled or not).
        let room = node.admission().room.notified();
        let admission = node.admission().lock();
        let placement =
            Placement::of(node, first, Came::Put).reachable().map_err(|e| PutError::at(index, e))?;
        let planned: Vec<(&Message, &Placement<'_>)> = run.iter().map(|m| (m, &placement)).collect();
        let ask = RoomAsk { credit: &[], pace: pace_until.map(|_| (put.pace_bytes, PACE_WAIT)) };
        let checked = placement::check_room(&planned, &ask);
        drop(planned);
        let waits_for_pace = |ahead: bool| {
            // The clock is read only when a link is ahead. A node that is stopping takes
            // what it can at once.
            pace_until.filter(|until| ahead && !node.stopping() && tokio::time::Instant::now() < *until)
        };
        match checked {
            Ok(ahead) if waits_for_pace(ahead).is_none() => {
                for message in &run {
                    put.sequences.push(message.id.sequence);
                    put.persistent |= placement::is_persistent(message);
                }
                match <[Message; 1]>::try_from(run) {
                    Ok([message]) => placement.apply(node, message, put.now, Came::Put, Batch::new()),
                    Err(run) => placement.apply_run(node, run, put.now, Came::Put),
                }
                drop(admission);
                tracking.keep();
                here.into_iter().for_each(|h| delivered_here(node, h));
                return Ok(None);
            }
            _ if run.len() > 1 => return Ok(Some(run)),
            Ok(ahead) => {
                let until = waits_for_pace(ahead).unwrap_or(deadline);
                drop(placement);
                drop(admission);
                // Woken as the link takes messages; room is checked again after.
                let _ = tokio::time::timeout_at(until, room).await;
                put.now = Instant::now();
            }
            Err(refusal) if refusal.is_full() => {
                drop(placement);
                drop(admission);
                let waited = node.wait_for_room(room, deadline).await.map_err(|stopping| {
                    let reason = format!("{}; {stopping}, not accepted", refusal.reason);
                    PutError::at(index, Refusal::new(RefusalCode::Stopping, reason))
                })?;
                put.now = Instant::now();
                if !waited {
                    let refusal = refusal.and(&format!("; no room within {waits:?}, not accepted"));
                    return Err(PutError::at(index, refusal));
                }
            }
            Err(refusal) => return Err(PutError::at(index, refusal)),
        }
    }
}

/// Whether `b` goes the way `a` goes: to the same recipients, in the same transmission
/// class, neither wanting results (tracked one message at a time).
fn same_way(a: &Message, b: &Message) -> bool {
    !a.content.results
        && !b.content.results
        && a.content.recipients == b.content.recipients
        && LinkHandle::same_class(a, b)
}

/// `run` cut where consecutive messages no longer go the same way (as one run, in the
/// usual case where the stages changed no recipients).
fn split_same_way(mut run: Vec<Message>) -> Vec<Vec<Message>> {
    let mut runs = Vec::new();
    while let Some(cut) = (1..run.len()).find(|&i| !same_way(&run[i - 1], &run[i])) {
        let rest = run.split_off(cut);
        runs.push(std::mem::replace(&mut run, rest));
    }
    if !run.is_empty() {
        runs.push(run);
    }
    runs
}

/// Queues one of the node's own messages (an event, a result) at once, without the
/// admission lock: they never wait behind client puts, and are dropped without room.
///
/// # Errors
/// Why it was not queued.
pub(crate) fn queue_own(node: &NodeState, message: Message, now: Instant) -> Result<(), Refusal> {
    let placement = Placement::of(node, &message, Came::Put).reachable()?;
    placement::check_room(&[(&message, &placement)], &RoomAsk { credit: &[], pace: None })?;
    placement.apply(node, message, now, Came::Put, Batch::new());
    Ok(())
}

/// Commits the puts of a transaction: all of `messages` are queued, or none. When some
/// destination lacks room, waits up to `timeout` for room for all of them together.
///
/// `gets` are the transaction's own gets (queue, tags): they are acknowledged in the same
/// step, so the room they leave counts as free for the puts.
///
/// # Errors
/// [`CommitError::Refused`]: nothing was queued (no room within the timeout, more puts
/// for a queue than it ever holds, no route, too large, too many results pending);
/// [`CommitError::Partly`]: the store failed.
pub(crate) async fn commit(
    node: &NodeState,
    messages: Vec<Message>,
    gets: &[(Arc<LocalQueue>, Vec<u64>)],
    timeout: Duration,
) -> Result<(), CommitError> {
    // Undone if the commit fails, or is abandoned while it waits.
    let tracking = track(node, &messages).map_err(CommitError::Refused)?;
    let persistent_puts = disk_room_for(node, &messages).map_err(CommitError::Refused)?;
    let credit: Vec<(&Arc<LocalQueue>, usize)> = gets.iter().map(|(q, tags)| (q, tags.len())).collect();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let room = node.admission().room.notified();
        tokio::pin!(room);
        room.as_mut().enable();
        let placements = messages
            .iter()
            .map(|m| Placement::of(node, m, Came::Put).reachable())
            .collect::<Result<Vec<_>, _>>()
            .map_err(CommitError::Refused)?;
        let planned: Vec<(&Message, &Placement<'_>)> = messages.iter().zip(&placements).collect();
        let admission = node.admission().lock();
        let checked = placement::check_room(&planned, &RoomAsk { credit: &credit, pace: None });
        drop(planned);
        match checked {
            Ok(_) => {
                let now = Instant::now();
                crate::faults::crash_in_commit("before");
                // The puts and the gets' acknowledgements reach the store as one batch: a
                // crash keeps all of the commit or none of it.
                let hold = node.committer().hold();
                let here: Vec<_> = messages.iter().filter_map(|m| results_here(node, m)).collect();
                for (message, placement) in messages.into_iter().zip(placements) {
                    placement.apply(node, message, now, Came::Put, Batch::new());
                }
                // The gets leave in the same section, so the room they made is not counted
                // twice.
                let acked = gets.iter().try_for_each(|(queue, tags)| {
                    queue.ack(tags).map(|_| ()).map_err(|e| format!("queue '{}': {e}", queue.config().name))
                });
                // Their results are kept from here, in the same store batch.
                tracking.keep();
                crate::faults::crash_in_commit("inside");
                drop(hold);
                drop(admission);
                here.into_iter().for_each(|h| delivered_here(node, h));
                // Stored puts, and the acknowledged gets' deletes, are durable first.
                let persistent = persistent_puts || (!gets.is_empty() && node.store().durable());
                node.make_durable(persistent).await.map_err(CommitError::Partly)?;
                crate::faults::crash_in_commit("after");
                return acked.map_err(|e| {
                    CommitError::Partly(format!(
                        "the puts were queued, but the gets were not acknowledged: {e}"
                    ))
                });
            }
            Err(refusal) if refusal.is_full() => {
                drop(placements);
                drop(admission);
                let waited = node.wait_for_room(room.as_mut(), deadline).await.map_err(|stopping| {
                    CommitError::Refused(Refusal::new(
                        RefusalCode::Stopping,
                        format!("{}; {stopping}, not committed", refusal.reason),
                    ))
                })?;
                if !waited {
                    let reason =
                        format!("{}; no room for the transaction within {timeout:?}", refusal.reason);
                    return Err(CommitError::Refused(Refusal::new(RefusalCode::Full, reason)));
                }
            }
            Err(refusal) => return Err(CommitError::Refused(refusal)),
        }
    }
}

/// Whether `messages` hold a persistent one, when the disk has room for them (see
/// [`crate::disk`]).
///
/// # Errors
/// `Busy`, with why, when the node is short of room for a persistent one.
fn disk_room_for(node: &NodeState, messages: &[Message]) -> Result<bool, Refusal> {
    let persistent = messages.iter().any(placement::is_persistent);
    if persistent {
        let bytes = messages.iter().map(|m| m.content.payload.len() as u64).sum();
        node.disk().admit(bytes).map_err(|reason| Refusal::new(RefusalCode::Busy, reason))?;
    }
    Ok(persistent)
}

/// Results tracking of messages not yet accepted: forgotten on drop unless kept.
struct Tracking<'a> {
    book: &'a ResultBook,
    sequences: Vec<u64>,
}

impl Tracking<'_> {
    /// The messages were accepted (now): their results stay tracked, and time out counting
    /// from now.
    fn keep(mut self) {
        if self.sequences.is_empty() {
            return;
        }
        let now = Instant::now();
        for sequence in std::mem::take(&mut self.sequences) {
            self.book.accepted(sequence, now);
        }
    }
}

impl Drop for Tracking<'_> {
    fn drop(&mut self) {
        self.sequences.iter().for_each(|s| self.book.forget(*s));
    }
}

/// Starts tracking the results of those of `messages` that want them — before they are
/// queued anywhere, so no result can come back untracked. Undone when the returned guard
/// drops before [`Tracking::keep`].
fn track<'n>(node: &'n NodeState, messages: &[Message]) -> Result<Tracking<'n>, Refusal> {
    let mut tracking = Tracking { book: node.results(), sequences: Vec::new() };
    for message in messages.iter().filter(|m| m.content.results) {
        node.results().track(message).map_err(|e| Refusal::new(RefusalCode::Busy, e))?;
        tracking.sequences.push(message.id.sequence);
    }
    Ok(tracking)
}

/// The recipients on this node of an accepted message that wants results (recorded as
/// delivered once it is queued).
fn results_here(node: &NodeState, message: &Message) -> Option<(MessageId, Vec<Address>)> {
    // (A member of a group is reported by its queue, once its group is complete.)
    (message.content.results && crate::queue::held_key(message).is_none()).then(|| {
        let here = message.content.recipients.iter().filter(|to| &to.node == node.name());
        (message.id.clone(), here.cloned().collect())
    })
}

/// Records an accepted message that wants results as delivered to its recipients here.
fn delivered_here(node: &NodeState, (id, recipients): (MessageId, Vec<Address>)) {
    for to in &recipients {
        node.record_result(&id, to, Outcome::Delivered);
    }
}
