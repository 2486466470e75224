//! Message results: what became of a message at each of its recipients, reported back to
//! the node that accepted it (its origin).
//!
//! A message put with results wanted ([`Content::results`]) is tracked by its origin's
//! [`ResultBook`], one open slot per recipient. Each slot gets one final outcome:
//! - `delivered`: the recipient's node stored it in the recipient's queue (end-to-end
//!   receipt; whether a consumer took it is not part of it);
//! - `expired`: its lifetime ran out after it was sent, before it arrived;
//! - `failed`: it cannot arrive, with a code and a reason — dead-lettered on the way or at the
//!   destination (the dead-letter codes), or expired at its origin before it was sent
//!   (`expired`: the send failed);
//! - `result_wait_timed_out`: nothing came back within `messages.result_wait_ms` after its
//!   lifetime ran out. It does not mean the recipient failed: the result may have been lost
//!   or dropped (the way back was full), or the message expired on the last hop, where its
//!   recipients are no longer known.
//!
//! A node that settles a message for some recipients sends the origin a *result message*: a
//! system-priority event message named `result` to the origin's `EVENT` queue, with the id in
//! the `linkbus.result_for` header and one line per recipient as payload
//! (`node:queue TAB outcome TAB code TAB reason`). It travels like any message (across relays
//! once routes exist) and the origin takes it apart on arrival: each outcome is recorded and
//! raised as a `result` event. A result message that finds no room on its way is dropped and
//! counted, never waited for.
//!
//! [`Content::results`]: linkbus_plugin_api::Content::results

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use linkbus_plugin_api::{Address, Message, MessageId, NodeName, Reliability};

/// Header of a result message naming the message its results are about.
pub const RESULT_FOR_HEADER: &str = "linkbus.result_for";
/// Name of result messages (and of the events they raise).
pub const RESULT_NAME: &str = "result";
/// Finished results kept for late questions (`linkbus result ID`), oldest forgotten first.
const FINISHED_KEPT: usize = 100_000;

/// The final outcome for one recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Stored in the recipient's queue.
    Delivered,
    /// Its lifetime ran out after it was sent.
    Expired,
    /// It cannot arrive.
    Failed {
        /// A dead-letter code, or `expired` for a message that expired before it was sent.
        code: String,
        /// Why, for people.
        reason: String,
    },
    /// No result came back in time (not a failure of the recipient).
    TimedOut,
}

impl Outcome {
    /// The outcome's name in events and output.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Expired => "expired",
            Self::Failed { .. } => "failed",
            Self::TimedOut => "result_wait_timed_out",
        }
    }

    /// A failure with `code` and `reason`.
    pub fn failed(code: &str, reason: impl Into<String>) -> Self {
        Self::Failed { code: code.to_owned(), reason: reason.into() }
    }

    /// The outcome named `name` (with `code` and `reason` for failures).
    pub fn from_parts(name: &str, code: &str, reason: &str) -> Option<Self> {
        Some(match name {
            "delivered" => Self::Delivered,
            "expired" => Self::Expired,
            "failed" => Self::failed(code, reason),
            "result_wait_timed_out" => Self::TimedOut,
            _ => return None,
        })
    }

    /// The failure code, empty unless failed.
    pub fn code(&self) -> &str {
        match self {
            Self::Failed { code, .. } => code,
            _ => "",
        }
    }

    /// The failure reason, empty unless failed.
    pub fn reason(&self) -> &str {
        match self {
            Self::Failed { reason, .. } => reason,
            _ => "",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed { code, reason } => write!(f, "failed {code}: {reason}"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// What is known of one message's results at its origin: each recipient with its final
/// outcome, or `None` while it is open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageResults {
    /// The message.
    pub id: MessageId,
    /// Each distinct recipient and its outcome so far.
    pub recipients: Vec<(Address, Option<Outcome>)>,
}

impl MessageResults {
    /// Whether every recipient has its final outcome.
    pub fn is_final(&self) -> bool {
        self.recipients.iter().all(|(_, o)| o.is_some())
    }
}

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
    results: MessageResults,
    /// When open recipients are reported as timed out (`None`: unlimited lifetime).
    deadline: Option<Instant>,
}

#[derive(Default)]
struct Book {
    open: HashMap<u64, Tracked>,
    finished: HashMap<u64, MessageResults>,
    finished_order: VecDeque<u64>,
}

/// The origin's record of the messages it waits for results of (by their sequence number),
/// and of recently finished ones.
pub struct ResultBook {
    book: Mutex<Book>,
    changed: tokio::sync::Notify,
    result_wait: Duration,
    pending_max: usize,
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
        Self { book: Mutex::default(), changed: tokio::sync::Notify::new(), result_wait, pending_max }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Messages waiting for results.
    pub fn pending(&self) -> usize {
        self.lock().open.len()
    }

    /// Starts tracking an accepted message (its lifetime set) with one open slot per
    /// distinct recipient.
    ///
    /// # Errors
    /// When `pending_max` messages already wait for results.
    pub fn track(&self, message: &Message, now: Instant) -> Result<(), String> {
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
        let deadline = match message.content.lifetime {
            Some(l) if !l.is_unlimited() => {
                now.checked_add(Duration::from_millis(l.as_ms()) + self.result_wait)
            }
            _ => None,
        };
        let results = MessageResults { id: message.id.clone(), recipients };
        book.open.insert(message.id.sequence, Tracked { results, deadline });
        Ok(())
    }

    /// Stops tracking a message that was not accepted after all.
    pub fn forget(&self, sequence: u64) {
        self.lock().open.remove(&sequence);
    }

    /// Records `outcome` for `recipient` of the message with `sequence`. Returns whether it
    /// was new: only the first final outcome of an open recipient counts.
    pub fn record(&self, sequence: u64, recipient: &Address, outcome: Outcome) -> bool {
        let mut book = self.lock();
        let Some(tracked) = book.open.get_mut(&sequence) else { return false };
        let Some(slot) = tracked.results.recipients.iter_mut().find(|(a, o)| a == recipient && o.is_none())
        else {
            return false;
        };
        slot.1 = Some(outcome);
        if tracked.results.is_final() {
            finish(&mut book, sequence);
        }
        drop(book);
        self.changed.notify_waiters();
        true
    }

    /// Reports every open recipient whose deadline passed as timed out; returns them.
    pub fn time_out(&self, now: Instant) -> Vec<(MessageId, Address)> {
        let mut book = self.lock();
        let due: Vec<u64> =
            book.open.iter().filter(|(_, t)| t.deadline.is_some_and(|d| d <= now)).map(|(s, _)| *s).collect();
        let mut timed_out = Vec::new();
        for sequence in due {
            if let Some(tracked) = book.open.get_mut(&sequence) {
                for (to, outcome) in &mut tracked.results.recipients {
                    if outcome.is_none() {
                        *outcome = Some(Outcome::TimedOut);
                        timed_out.push((tracked.results.id.clone(), to.clone()));
                    }
                }
            }
            finish(&mut book, sequence);
        }
        drop(book);
        if !timed_out.is_empty() {
            self.changed.notify_waiters();
        }
        timed_out
    }

    /// What is known of the messages with these sequence numbers (`None`: not tracked, or
    /// finished long ago).
    pub fn get(&self, sequences: &[u64]) -> Vec<Option<MessageResults>> {
        let book = self.lock();
        sequences
            .iter()
            .map(|s| book.open.get(s).map(|t| t.results.clone()).or_else(|| book.finished.get(s).cloned()))
            .collect()
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
            let known = self.get(sequences);
            let done = known.iter().all(|r| r.as_ref().is_none_or(MessageResults::is_final));
            if done || tokio::time::timeout_at(deadline, changed).await.is_err() {
                return known;
            }
        }
    }
}

fn finish(book: &mut Book, sequence: u64) {
    if let Some(tracked) = book.open.remove(&sequence) {
        book.finished.insert(sequence, tracked.results);
        book.finished_order.push_back(sequence);
        while book.finished_order.len() > FINISHED_KEPT {
            if let Some(old) = book.finished_order.pop_front() {
                book.finished.remove(&old);
            }
        }
    }
}

/// The payload of a result message: one line per recipient.
pub fn encode_report(outcomes: &[(Address, Outcome)]) -> String {
    let clean = |s: &str| s.replace(['\t', '\n', '\r'], " ");
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

/// Reads the payload of a result message.
///
/// # Errors
/// The first line that is not `node:queue TAB outcome TAB code TAB reason`.
pub fn decode_report(payload: &[u8]) -> Result<Vec<(Address, Outcome)>, String> {
    let text = std::str::from_utf8(payload).map_err(|_| "result payload is not UTF-8".to_owned())?;
    text.lines()
        .map(|line| {
            let mut parts = line.splitn(4, '\t');
            let mut next = || parts.next().unwrap_or("");
            let (to, name, code, reason) = (next(), next(), next(), next());
            let to: Address = to.parse().map_err(|e| format!("result line '{line}': {e}"))?;
            let outcome = Outcome::from_parts(name, code, reason)
                .ok_or_else(|| format!("result line '{line}': unknown outcome"))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use linkbus_plugin_api::{Content, Lifetime};

    fn message(sequence: u64, to: &[&str], lifetime_ms: u64) -> Message {
        let mut content =
            Content::buf(to[0].parse().unwrap(), "x").with_lifetime(Lifetime::from_ms(lifetime_ms));
        content.recipients = to.iter().map(|a| a.parse().unwrap()).collect();
        content.results = true;
        Message {
            id: MessageId { source: NodeName::new("A").unwrap(), sequence, created_unix_ms: 1 },
            hop_count: 0,
            redelivered: false,
            backout_count: 0,
            content,
        }
    }

    #[test]
    fn each_recipient_gets_one_final_outcome() {
        let book = ResultBook::new(Duration::from_millis(100), 10);
        let now = Instant::now();
        book.track(&message(1, &["B:q", "C:q", "B:q"], 1000), now).unwrap();
        let b: Address = "B:q".parse().unwrap();
        let c: Address = "C:q".parse().unwrap();
        assert!(book.record(1, &b, Outcome::Delivered));
        assert!(!book.record(1, &b, Outcome::Expired), "the first outcome is final");
        assert!(!book.record(2, &b, Outcome::Delivered), "unknown message");
        assert_eq!(book.pending(), 1);
        assert!(book.record(1, &c, Outcome::failed("queue_missing", "no such queue")));
        assert_eq!(book.pending(), 0);
        let results = book.get(&[1]).remove(0).unwrap();
        assert_eq!(results.recipients.len(), 2, "a recipient named twice has one slot");
        assert!(results.is_final());
    }

    #[test]
    fn open_recipients_time_out_after_lifetime_plus_wait_and_the_limit_holds() {
        let book = ResultBook::new(Duration::from_millis(100), 1);
        let now = Instant::now();
        book.track(&message(1, &["B:q"], 1000), now).unwrap();
        assert!(book.track(&message(2, &["B:q"], 1000), now).unwrap_err().contains("results_pending_max"));
        assert!(book.time_out(now + Duration::from_millis(1099)).is_empty());
        let out = book.time_out(now + Duration::from_millis(1100));
        assert_eq!(out.len(), 1);
        assert_eq!(book.get(&[1])[0].as_ref().unwrap().recipients[0].1, Some(Outcome::TimedOut));
    }

    #[test]
    fn reports_and_ids_round_trip() {
        let outcomes = vec![
            ("B:q".parse().unwrap(), Outcome::Delivered),
            ("B:r".parse().unwrap(), Outcome::failed("queue_missing", "queue 'r'\tdoes not\nexist")),
            ("C:q".parse().unwrap(), Outcome::Expired),
        ];
        let back = decode_report(encode_report(&outcomes).as_bytes()).unwrap();
        assert_eq!(back[0], outcomes[0]);
        assert_eq!(back[1].1, Outcome::failed("queue_missing", "queue 'r' does not exist"));
        assert_eq!(back[2], outcomes[2]);
        assert!(decode_report(b"B:q\tlost\t\t\n").unwrap_err().contains("unknown outcome"));
        assert_eq!(parse_id("A/42").unwrap().sequence, 42);
        assert!(parse_id("A42").is_err() && parse_id("A/x").is_err() && parse_id("1A/2").is_err());
    }
}
