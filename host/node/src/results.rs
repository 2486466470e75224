//! Message results: what became of a message at each of its recipients, reported back to
//! the node that accepted it (its origin).
//!
//! A message put with results wanted ([`Content::results`]) is tracked by its origin's
//! [`ResultBook`], one open slot per recipient. Each slot gets one final outcome:
//! - `delivered`: the recipient's node stored it in the recipient's queue (end-to-end
//!   receipt; whether a consumer took it is not part of it);
//! - `expired`: its lifetime ran out after it was sent, before it arrived. The sender cannot
//!   be sure (its peer may have stored it and not yet acknowledged), so this outcome is
//!   *provisional* for one result wait: a report from the recipient's node replaces it;
//! - `failed`: it cannot arrive, with a code and a reason — dead-lettered on the way or at the
//!   destination (the dead-letter codes), or expired at its origin before it was sent
//!   (`expired_before_sending`: the send failed);
//! - `result_wait_timed_out`: nothing came back within `messages.result_wait_ms` after its
//!   lifetime ran out. It does not mean the recipient failed: the result may have been lost
//!   or dropped (the way back was full), or the message expired on the last hop, where its
//!   recipients are no longer known.
//!
//! A node that settles a message for some recipients sends the origin a *result message*: a
//! system-priority event message named `linkbus.results` to the origin's `EVENT` queue, with the id in
//! the `linkbus.result_for` header and one line per recipient as payload
//! (`node:queue TAB outcome TAB code TAB reason`). It travels like any message (across relays
//! once routes exist) and the origin takes it apart on arrival: each outcome about a recipient
//! on the reporting node is recorded and raised as a `result` event. A result message that finds no room on its way is dropped and
//! counted, never waited for.
//!
//! With a durable store, the book keeps what it knows of persistent messages in the space
//! `results` (one record per message, rewritten as outcomes come in; finished ones until
//! they are forgotten), so a restarted origin still takes their reports, times them out,
//! and answers `linkbus result` for them. Provisional outcomes are not kept: after a
//! restart such a recipient waits for its report or its deadline.
//!
//! [`Content::results`]: linkbus_plugin_api::Content::results

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use linkbus_plugin_api::{Address, Batch, Message, MessageId, NodeName, Reliability, Store};

use crate::storage::Committer;

/// Header of a result message naming the message its results are about.
pub const RESULT_FOR_HEADER: &str = "linkbus.result_for";
/// Name of result messages (the events they raise are named `result`).
pub const RESULT_MESSAGE_NAME: &str = "linkbus.results";
/// Failure code of a group member whose group expired incomplete in its recipient's queue.
pub const GROUP_EXPIRED: &str = "group_expired";
/// Failure code of a message that expired at its origin before it was sent.
pub const EXPIRED_BEFORE_SENDING: &str = "expired_before_sending";
/// Longest failure reason kept, in bytes.
const REASON_BYTES_MAX: usize = 1024;
/// Failure code of a message a filter removed on its way without a dead letter (`drops:
/// discard`, or `on_failure: fail_closed`).
pub const FILTER_DROPPED: &str = "filter_dropped";
/// Failure codes a result may carry: the dead-letter codes, a filter's drop, and expiry
/// before sending.
const FAILURE_CODES: [&str; 13] = [
    FILTER_DROPPED,
    GROUP_EXPIRED,
    "decode_failed",
    "decrypt_failed",
    "stage_failed",
    "no_route",
    "hop_limit",
    "not_authorised",
    "filter_rejected",
    "too_large",
    "queue_missing",
    "queue_full",
    EXPIRED_BEFORE_SENDING,
];
/// Longest a message's results are waited for, plus the result wait: its lifetime, or this
/// when the lifetime is longer or unlimited.
pub const UNLIMITED_LIFETIME_RESULT_WAIT: Duration = Duration::from_secs(7 * 86_400);
/// Finished results kept for late questions (`linkbus result ID`), oldest forgotten first.
const FINISHED_KEPT: usize = 100_000;

pub use linkbus_client::results::{MessageResults, Outcome};

/// Where the results of a message go: its id and reliability (the result message gets the
/// same), for messages that want results.
#[derive(Debug, Clone)]
pub struct ResultTo {
    /// The message the results are about; its source is the origin.
    pub id: MessageId,
    /// The result message's reliability.
    pub reliability: Reliability,
}

impl ResultTo {
    /// Where `message`'s results go, or `None` when it wants none.
    pub fn of(message: &Message) -> Option<Self> {
        message
            .content
            .results
            .then(|| Self { id: message.id.clone(), reliability: message.content.reliability })
    }
}

struct Tracked {
    /// Final outcomes only.
    results: MessageResults,
    /// Outcomes the sender guessed (it sent the message, which then expired there): final
    /// at the instant given unless the recipient's node reports first.
    provisional: Vec<(usize, Outcome, Instant)>,
    /// The message's lifetime when accepted (`None`: unlimited).
    lifetime: Option<Duration>,
    /// When open recipients time out: set once the message is accepted.
    deadline: Option<Instant>,
    /// When it was accepted, by the wall clock (a restarted node's deadlines count from
    /// it); 0 until then.
    accepted_unix_ms: u64,
    /// Kept in the store (a persistent message, with a durable store).
    stored: bool,
}

#[derive(Default)]
struct Book {
    open: HashMap<u64, Tracked>,
    /// Deadlines and provisional outcomes coming due, by instant.
    due: BTreeSet<(Instant, u64)>,
    finished: HashMap<u64, MessageResults>,
    finished_order: VecDeque<u64>,
    /// Records to write (`Some`) or delete (`None`) in the store, handed over before the
    /// book's lock is released (so they reach the store thread in the book's order).
    writes: Vec<(u64, Option<Bytes>)>,
    /// Finished messages with a record in the store.
    stored_finished: std::collections::HashSet<u64>,
}

/// The origin's record of the messages it waits for results of (by their sequence number),
/// and of recently finished ones.
pub struct ResultBook {
    book: Mutex<Book>,
    changed: tokio::sync::Notify,
    /// Notified when the earliest instant in `due` moved earlier.
    earlier: tokio::sync::Notify,
    result_wait: Duration,
    pending_max: usize,
    /// Where the results of persistent messages are kept, with a durable store.
    committer: Option<Arc<Committer>>,
}

impl fmt::Debug for ResultBook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResultBook").field("pending", &self.pending()).finish_non_exhaustive()
    }
}

impl ResultBook {
    /// An empty book: open recipients time out `result_wait` after the lifetime; at most
    /// `pending_max` messages open at once.
    pub fn new(result_wait: Duration, pending_max: usize) -> Self {
        Self {
            book: Mutex::default(),
            changed: tokio::sync::Notify::new(),
            earlier: tokio::sync::Notify::new(),
            result_wait,
            pending_max,
            committer: None,
        }
    }

    /// This book keeps the results of persistent messages through `committer` (space
    /// `results`); [`ResultBook::load`] takes up what an earlier run kept.
    #[must_use]
    pub fn kept_by(mut self, committer: Arc<Committer>) -> Self {
        self.committer = Some(committer);
        self
    }

    /// Takes up the results kept in `store` by an earlier run: open messages wait again
    /// (their deadlines counted by the wall clock from their acceptance; a passed one times
    /// out at once), finished ones answer questions. A damaged record is moved to the space
    /// `results.damaged` and reported (results are advisory: they do not stop a start).
    ///
    /// # Errors
    /// The store cannot be read.
    pub fn load(&self, store: &dyn Store, now: Instant) -> Result<Loaded, String> {
        // Collected first: damaged records are moved while the loop runs.
        let records: Vec<_> = linkbus_plugin_api::store::scan_pages(store, RESULTS_SPACE)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{RESULTS_SPACE}: {e}"))?;
        let now_unix = crate::clock::unix_ms();
        let mut loaded = Loaded::default();
        let mut book = self.lock();
        let mut quarantine = Batch::new();
        for (key, value) in records {
            let (results, lifetime, accepted_unix_ms) = match decode_record(&value) {
                Ok(decoded) => decoded,
                Err(e) => {
                    tracing::error!(key = ?&key[..], error = e, "Damaged result record moved to results.damaged.");
                    quarantine.put(DAMAGED_SPACE, key.clone(), value).delete(RESULTS_SPACE, key);
                    loaded.damaged += 1;
                    continue;
                }
            };
            let sequence = results.id.sequence;
            loaded.sequence_max = loaded.sequence_max.max(sequence);
            if results.is_final() {
                book.finished.insert(sequence, results);
                book.finished_order.push_back(sequence);
                book.stored_finished.insert(sequence);
                continue;
            }
            let waits = self.waits(lifetime);
            let due_unix =
                accepted_unix_ms.saturating_add(u64::try_from(waits.as_millis()).unwrap_or(u64::MAX));
            let deadline = now + Duration::from_millis(due_unix.saturating_sub(now_unix));
            self.insert_due(&mut book, deadline, sequence);
            let tracked = Tracked {
                results,
                provisional: Vec::new(),
                lifetime,
                deadline: Some(deadline),
                accepted_unix_ms,
                stored: true,
            };
            book.open.insert(sequence, tracked);
        }
        loaded.open = book.open.len();
        if let (Some(committer), false) = (&self.committer, quarantine.is_empty()) {
            committer.write(quarantine);
        }
        Ok(loaded)
    }

    /// How long after acceptance open recipients of a message with `lifetime` time out.
    fn waits(&self, lifetime: Option<Duration>) -> Duration {
        // An unlimited lifetime still gets an end: a result lost on the way (dropped for
        // want of room, a peer restarted with a forgetting store) must not hold a slot forever.
        lifetime.unwrap_or(UNLIMITED_LIFETIME_RESULT_WAIT).min(UNLIMITED_LIFETIME_RESULT_WAIT)
            + self.result_wait
    }

    /// Hands the book's pending record writes to the store thread (under the book's lock).
    fn flush(&self, book: &mut Book) {
        if book.writes.is_empty() {
            return;
        }
        let mut batch = Batch::new();
        for (sequence, value) in book.writes.drain(..) {
            match value {
                Some(value) => batch.put(RESULTS_SPACE, sequence.to_be_bytes().to_vec(), value),
                None => batch.delete(RESULTS_SPACE, sequence.to_be_bytes().to_vec()),
            };
        }
        if let Some(committer) = &self.committer {
            committer.write(batch);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Messages waiting for results.
    pub fn pending(&self) -> usize {
        self.lock().open.len()
    }

    /// Starts tracking a message (its lifetime set) with one open slot per distinct
    /// recipient; it times out only once [`ResultBook::accepted`].
    ///
    /// # Errors
    /// When `pending_max` messages already wait for results.
    pub fn track(&self, message: &Message) -> Result<(), String> {
        let mut book = self.lock();
        if book.open.len() >= self.pending_max {
            return Err(format!(
                "{} messages already wait for their results (messages.results_pending_max); not accepted",
                self.pending_max
            ));
        }
        let mut recipients: Vec<(Address, Option<Outcome>)> = Vec::new();
        for to in &message.content.recipients {
            if !recipients.iter().any(|(a, _)| a == to) {
                recipients.push((to.clone(), None));
            }
        }
        let lifetime = match message.content.lifetime {
            Some(l) if !l.is_unlimited() => Some(Duration::from_millis(l.as_ms())),
            _ => None,
        };
        let results = MessageResults { id: message.id.clone(), recipients };
        let stored = self.committer.is_some() && message.content.reliability == Reliability::Persistent;
        let tracked = Tracked {
            results,
            provisional: Vec::new(),
            lifetime,
            deadline: None,
            accepted_unix_ms: 0,
            stored,
        };
        book.open.insert(message.id.sequence, tracked);
        Ok(())
    }

    /// The message was accepted at `now`: its open recipients time out `result_wait` after
    /// its lifetime from now.
    pub fn accepted(&self, sequence: u64, now: Instant) {
        let mut book = self.lock();
        let Some(tracked) = book.open.get_mut(&sequence) else { return };
        let Some(deadline) = now.checked_add(self.waits(tracked.lifetime)) else { return };
        tracked.deadline = Some(deadline);
        // Kept from now on (the message is in its queues, whose writes went first).
        tracked.accepted_unix_ms = crate::clock::unix_ms();
        self.insert_due(&mut book, deadline, sequence);
        note(&mut book, sequence);
        self.flush(&mut book);
    }

    /// Stops tracking a message that was not accepted after all.
    pub fn forget(&self, sequence: u64) {
        let mut book = self.lock();
        if close(&mut book, sequence).is_some_and(|t| t.stored && t.accepted_unix_ms > 0) {
            book.writes.push((sequence, None));
        }
        self.flush(&mut book);
    }

    /// Records the final `outcome` for `recipient` of the message with `sequence`. Returns
    /// whether it was new: only the first final outcome of a recipient counts (it replaces a
    /// provisional one).
    pub fn record(&self, sequence: u64, recipient: &Address, outcome: Outcome) -> bool {
        let mut book = self.lock();
        let Some(tracked) = book.open.get_mut(&sequence) else { return false };
        let Some(slot) = tracked.results.recipients.iter().position(|(a, o)| a == recipient && o.is_none())
        else {
            return false;
        };
        tracked.results.recipients[slot].1 = Some(outcome);
        let replaced: Vec<Instant> =
            tracked.provisional.iter().filter(|(s, _, _)| *s == slot).map(|(_, _, until)| *until).collect();
        tracked.provisional.retain(|(s, _, _)| *s != slot);
        // An index entry may stand for several outcomes coming due at once.
        let still_due: Vec<Instant> =
            tracked.provisional.iter().map(|(_, _, u)| *u).chain(tracked.deadline).collect();
        for until in replaced.into_iter().filter(|u| !still_due.contains(u)) {
            book.due.remove(&(until, sequence));
        }
        if book.open.get(&sequence).is_some_and(|t| t.results.is_final()) {
            finish(&mut book, sequence);
        } else {
            note(&mut book, sequence);
        }
        self.flush(&mut book);
        drop(book);
        self.changed.notify_waiters();
        true
    }

    /// Records an outcome the sender can only guess for `recipient`: it becomes final
    /// `result_wait` after `now` unless a final one is recorded first.
    pub fn record_provisional(&self, sequence: u64, recipient: &Address, outcome: Outcome, now: Instant) {
        let mut book = self.lock();
        let until = now + self.result_wait;
        let Some(tracked) = book.open.get_mut(&sequence) else { return };
        let Some(slot) = tracked.results.recipients.iter().position(|(a, o)| a == recipient && o.is_none())
        else {
            return;
        };
        if tracked.provisional.iter().any(|(s, _, _)| *s == slot) {
            return;
        }
        tracked.provisional.push((slot, outcome, until));
        self.insert_due(&mut book, until, sequence);
    }

    /// Indexes `sequence` as coming due at `at`, telling [`ResultBook::earlier_due`] when
    /// that is the earliest instant now.
    fn insert_due(&self, book: &mut Book, at: Instant, sequence: u64) {
        book.due.insert((at, sequence));
        if book.due.first() == Some(&(at, sequence)) {
            self.earlier.notify_one();
        }
    }

    /// When the next provisional outcome or deadline comes due, if any is awaited.
    pub fn next_due(&self) -> Option<Instant> {
        self.lock().due.first().map(|&(at, _)| at)
    }

    /// Returns once an outcome or deadline was added that comes due before all others
    /// (also one added since the last call).
    pub async fn earlier_due(&self) {
        self.earlier.notified().await;
    }

    /// Makes final what came due by `now`: provisional outcomes, and open recipients past
    /// their message's deadline (their provisional outcome if any, else timed out). Returns
    /// those outcomes.
    pub fn time_out(&self, now: Instant) -> Vec<(MessageId, Address, Outcome)> {
        let mut book = self.lock();
        let mut settled = Vec::new();
        while let Some(&(at, sequence)) = book.due.first() {
            if at > now {
                break;
            }
            book.due.pop_first();
            let Some(tracked) = book.open.get_mut(&sequence) else { continue };
            let past_deadline = tracked.deadline.is_some_and(|d| d <= now);
            let provisional = std::mem::take(&mut tracked.provisional);
            for (slot, outcome, until) in provisional {
                if until <= now || past_deadline {
                    if let Some((to, o)) = tracked.results.recipients.get_mut(slot) {
                        *o = Some(outcome.clone());
                        settled.push((tracked.results.id.clone(), to.clone(), outcome));
                    }
                } else {
                    tracked.provisional.push((slot, outcome, until));
                }
            }
            if past_deadline {
                for (to, outcome) in &mut tracked.results.recipients {
                    if outcome.is_none() {
                        *outcome = Some(Outcome::TimedOut);
                        settled.push((tracked.results.id.clone(), to.clone(), Outcome::TimedOut));
                    }
                }
            }
            if tracked.results.is_final() {
                finish(&mut book, sequence);
            } else {
                note(&mut book, sequence);
            }
        }
        self.flush(&mut book);
        drop(book);
        if !settled.is_empty() {
            self.changed.notify_waiters();
        }
        settled
    }

    /// What is known of the messages with these sequence numbers (`None`: not tracked, or
    /// finished long ago). Provisional outcomes show as open.
    pub fn get(&self, sequences: &[u64]) -> Vec<Option<MessageResults>> {
        let book = self.lock();
        sequences
            .iter()
            .map(|s| book.open.get(s).map(|t| t.results.clone()).or_else(|| book.finished.get(s).cloned()))
            .collect()
    }

    /// Whether every one of these messages is finished (or unknown).
    fn all_final(&self, sequences: &[u64]) -> bool {
        let book = self.lock();
        sequences.iter().all(|s| !book.open.contains_key(s))
    }

    /// Waits until every one of these messages has its final results (or is unknown), or
    /// until `deadline`; returns what is known then.
    pub async fn wait(
        &self,
        sequences: &[u64],
        deadline: tokio::time::Instant,
    ) -> Vec<Option<MessageResults>> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.all_final(sequences) || tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.get(sequences);
            }
        }
    }
}

/// Removes an open message and its entries in the `due` index.
fn close(book: &mut Book, sequence: u64) -> Option<Tracked> {
    let tracked = book.open.remove(&sequence)?;
    if let Some(deadline) = tracked.deadline {
        book.due.remove(&(deadline, sequence));
    }
    for (_, _, until) in &tracked.provisional {
        book.due.remove(&(*until, sequence));
    }
    Some(tracked)
}

fn finish(book: &mut Book, sequence: u64) {
    if let Some(tracked) = close(book, sequence) {
        if tracked.stored {
            let value = encode_record(&tracked.results, tracked.lifetime, tracked.accepted_unix_ms);
            book.writes.push((sequence, Some(value)));
            book.stored_finished.insert(sequence);
        }
        book.finished.insert(sequence, tracked.results);
        book.finished_order.push_back(sequence);
        while book.finished_order.len() > FINISHED_KEPT {
            if let Some(old) = book.finished_order.pop_front() {
                book.finished.remove(&old);
                if book.stored_finished.remove(&old) {
                    book.writes.push((old, None));
                }
            }
        }
    }
}

/// Notes that the record of open message `sequence` must be rewritten (when it is kept).
fn note(book: &mut Book, sequence: u64) {
    if let Some(tracked) = book.open.get(&sequence).filter(|t| t.stored && t.accepted_unix_ms > 0) {
        let value = encode_record(&tracked.results, tracked.lifetime, tracked.accepted_unix_ms);
        book.writes.push((sequence, Some(value)));
    }
}

/// The store space of kept results.
const RESULTS_SPACE: &str = "results";
/// Where damaged result records are moved at start.
const DAMAGED_SPACE: &str = "results.damaged";

/// What [`ResultBook::load`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// Messages whose results are waited for again.
    pub open: usize,
    /// Damaged records moved aside.
    pub damaged: usize,
    /// The highest message sequence number among the records (new messages must go above).
    pub sequence_max: u64,
}
/// Format of a kept result record.
const RESULT_RECORD_FORMAT: u8 = 1;

/// A kept result record: format u8, CRC32C (u32, of the text after it), then text: a line
/// `SOURCE/SEQUENCE TAB CREATED_MS TAB LIFETIME_MS (0: unlimited) TAB ACCEPTED_UNIX_MS`, then
/// one line per recipient as in a report (`open` for a recipient still waited for).
fn encode_record(results: &MessageResults, lifetime: Option<Duration>, accepted_unix_ms: u64) -> Bytes {
    let lifetime_ms = lifetime.map_or(0, |l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX));
    let mut text =
        format!("{}\t{}\t{lifetime_ms}\t{accepted_unix_ms}\n", results.id, results.id.created_unix_ms);
    for (to, outcome) in &results.recipients {
        match outcome {
            Some(outcome) => text.push_str(&encode_report(&[(to.clone(), outcome.clone())])),
            None => text.push_str(&format!("{to}\topen\t\t\n")),
        }
    }
    let mut record = vec![RESULT_RECORD_FORMAT, 0, 0, 0, 0];
    record.extend_from_slice(text.as_bytes());
    let crc = linkbus_proto::crc::crc32c(&record[5..]);
    record[1..5].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(record)
}

/// Reads a record written by [`encode_record`]: the results, the lifetime and when it was
/// tracked.
fn decode_record(record: &[u8]) -> Result<(MessageResults, Option<Duration>, u64), String> {
    if record.len() < 5 || record[0] != RESULT_RECORD_FORMAT {
        return Err(format!("not a result record of format {RESULT_RECORD_FORMAT}"));
    }
    if linkbus_proto::crc::crc32c(&record[5..]).to_be_bytes() != record[1..5] {
        return Err("checksum mismatch".into());
    }
    let text = std::str::from_utf8(&record[5..]).map_err(|_| "not UTF-8".to_owned())?;
    let (head, lines) = text.split_once('\n').ok_or("no header line")?;
    let fields: Vec<&str> = head.split('\t').collect();
    let [id, created, lifetime_ms, tracked] = fields[..] else { return Err(format!("header '{head}'")) };
    let number = |t: &str| t.parse::<u64>().map_err(|_| format!("header '{head}'"));
    let mut id = parse_id(id)?;
    id.created_unix_ms = number(created)?;
    let lifetime = Some(number(lifetime_ms)?).filter(|ms| *ms > 0).map(Duration::from_millis);
    let mut recipients = Vec::new();
    for line in lines.lines() {
        match line.split_once('\t') {
            Some((to, rest)) if rest.starts_with("open\t") => {
                recipients.push((to.parse().map_err(|e| format!("'{line}': {e}"))?, None));
            }
            _ => recipients.extend(decode_report(line.as_bytes())?.into_iter().map(|(to, o)| (to, Some(o)))),
        }
    }
    Ok((MessageResults { id, recipients }, lifetime, number(tracked)?))
}

/// The payload of a result message: one line per recipient.
pub fn encode_report(outcomes: &[(Address, Outcome)]) -> String {
    let mut text = String::new();
    for (to, outcome) in outcomes {
        text.push_str(&format!(
            "{to}\t{}\t{}\t{}\n",
            outcome.as_str(),
            clean(outcome.code()),
            clean(outcome.reason())
        ));
    }
    text
}

/// `text` on one line, at most [`REASON_BYTES_MAX`] bytes.
fn clean(text: &str) -> String {
    let mut cut = text.len().min(REASON_BYTES_MAX);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text[..cut].replace(['\t', '\n', '\r'], " ")
}

/// Reads the payload of a result message.
///
/// # Errors
/// The first line that is not `node:queue TAB outcome TAB code TAB reason` with a known
/// outcome and failure code.
pub fn decode_report(payload: &[u8]) -> Result<Vec<(Address, Outcome)>, String> {
    let text = std::str::from_utf8(payload).map_err(|_| "result payload is not UTF-8".to_owned())?;
    text.lines()
        .map(|line| {
            let mut parts = line.splitn(4, '\t');
            let mut next = || parts.next().unwrap_or("");
            let (to, name, code, reason) = (next(), next(), next(), next());
            let shown = clean(line);
            let to: Address = to.parse().map_err(|e| format!("result line '{shown}': {e}"))?;
            if name == "failed" && !FAILURE_CODES.contains(&code) {
                return Err(format!("result line '{shown}': unknown failure code"));
            }
            let outcome = Outcome::from_parts(name, code, &clean(reason))
                .ok_or_else(|| format!("result line '{shown}': unknown outcome"))?;
            Ok((to, outcome))
        })
        .collect()
}

/// Reads a message id written as `SOURCE/SEQUENCE` (its creation time unknown: zero).
///
/// # Errors
/// A message saying what is wrong with the text.
pub fn parse_id(text: &str) -> Result<MessageId, String> {
    let (source, sequence) =
        text.split_once('/').ok_or_else(|| format!("'{text}' is not a message id like A/1234"))?;
    let source = NodeName::new(source).map_err(|e| format!("'{text}': {e}"))?;
    let sequence = sequence.parse().map_err(|_| format!("'{text}': the sequence is not a number"))?;
    Ok(MessageId { source, sequence, created_unix_ms: 0 })
}

/// Whether `message` is a result message from another node (only nodes send the system
/// priority).
pub(crate) fn is_result_message(message: &Message) -> bool {
    message.content.kind == linkbus_plugin_api::Kind::Event
        && message.content.priority.is_system()
        && message.content.name == RESULT_MESSAGE_NAME
        && message.content.header(RESULT_FOR_HEADER).is_some()
        && message.content.recipients.iter().all(|to| to.queue.as_str() == crate::queue::EVENT_QUEUE)
}

#[cfg(test)]
mod tests;
