//! Dead letters: messages that cannot reach some recipients go to the node's `DLQ`, marked
//! with why, and their origin hears of it.

use std::time::Instant;

use linkbus_plugin_api::{Address, Batch, Message};
use tracing::warn;

use crate::events::{Event, EventKind};
use crate::node::NodeState;
use crate::queue::QueueError;
use crate::results::{Outcome, ResultTo};

/// The dead-letter queue every node has: messages that could not be delivered, with the
/// reason in the `linkbus.dead_letter_reason` header.
pub const DEAD_LETTER_QUEUE: &str = "DLQ";
/// Header naming why a message was dead-lettered, for people.
pub const DEAD_LETTER_REASON_HEADER: &str = "linkbus.dead_letter_reason";
/// Header with the [`DeadLetterCode`] of a dead-lettered message, for programs.
pub const DEAD_LETTER_CODE_HEADER: &str = "linkbus.dead_letter_code";
/// Header listing (comma-separated) the recipients a dead-lettered message could not reach.
pub const DEAD_LETTER_RECIPIENTS_HEADER: &str = "linkbus.dead_letter_recipients";

/// Why a message went to the dead-letter queue: a stable code, in the
/// `linkbus.dead_letter_code` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterCode {
    /// No link or route reaches a recipient's node (or it arrived at the wrong node).
    NoRoute,
    /// It crossed more relays than allowed.
    HopLimit,
    /// The sender may not send there.
    NotAuthorised,
    /// A filter rejected it.
    FilterRejected,
    /// It is larger than a queue or a peer takes.
    TooLarge,
    /// A recipient queue does not exist.
    QueueMissing,
    /// A recipient queue was full.
    QueueFull,
    /// A stage on its path failed on it.
    StageFailed,
    /// Its payload does not decompress here (a dictionary or codec missing, corrupt data).
    DecodeFailed,
    /// Its payload does not open here (a wrong or missing key, a changed payload or header).
    DecryptFailed,
    /// It was backed out of its queue as many times as the queue's `backout_threshold` (a
    /// poison message); it may have gone to the queue's `backout_queue` instead.
    BackoutThreshold,
}

impl DeadLetterCode {
    /// The code as written in the header.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoRoute => "no_route",
            Self::HopLimit => "hop_limit",
            Self::NotAuthorised => "not_authorised",
            Self::FilterRejected => "filter_rejected",
            Self::TooLarge => "too_large",
            Self::QueueMissing => "queue_missing",
            Self::QueueFull => "queue_full",
            Self::StageFailed => "stage_failed",
            Self::DecodeFailed => "decode_failed",
            Self::DecryptFailed => "decrypt_failed",
            Self::BackoutThreshold => "backout_threshold",
        }
    }
}

/// Why a message goes to the dead-letter queue: the code, a reason for people, and the
/// recipients it failed for (what `linkbus dlq replay` puts it to again; empty: all).
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    /// The reason code.
    pub code: DeadLetterCode,
    /// The reason for people.
    pub reason: &'a str,
    /// The recipients it could not reach.
    pub failed: Vec<Address>,
}

/// Whether the dead-letter queue has room for `copies` more messages.
///
/// # Errors
/// [`QueueError::Full`] when it has not.
pub(crate) fn check_room(node: &NodeState, copies: usize) -> Result<(), QueueError> {
    let dlq = node.dead_letters();
    if copies == 0 || dlq.has_room(copies) {
        return Ok(());
    }
    Err(QueueError::Full { queue: dlq.config().name.clone(), max: dlq.config().queue_messages_max })
}

/// Puts `message` into the dead-letter queue within its bound, marked with why.
///
/// # Errors
/// When the dead-letter queue is full.
pub(crate) fn put_bounded(
    node: &NodeState,
    message: Message,
    why: DeadLetter<'_>,
    now: Instant,
) -> Result<(), QueueError> {
    check_room(node, 1)?;
    put(node, message, why, now, Batch::new());
    Ok(())
}

/// Puts `message` into the dead-letter queue, marked with why, with `with` in the same
/// store batch; reports the failure to its origin and raises a `dead_letter` event.
// Invariant: room was checked (`check_room`) before; the push goes past the bound.
pub(crate) fn put(node: &NodeState, message: Message, why: DeadLetter<'_>, now: Instant, with: Batch) {
    put_into(node, node.dead_letters(), message, why, now, with);
}

/// Like [`put`], into `queue` (a queue's `backout_queue`) rather than the dead-letter queue.
pub(crate) fn put_into(
    node: &NodeState,
    queue: &crate::queue::LocalQueue,
    mut message: Message,
    why: DeadLetter<'_>,
    now: Instant,
    with: Batch,
) {
    let DeadLetter { code, reason, failed } = why;
    let id = message.id.clone();
    let result_to = ResultTo::of(&message);
    // Reported for the recipients this node settles: its own, those it would have
    // relayed, or any of a message of its own.
    let outcomes = failed.iter().map(|to| (to.clone(), Outcome::failed(code.as_str(), reason))).collect();
    let event = message.content.kind == linkbus_plugin_api::Kind::Event;
    mark(&mut message, code, reason, &failed);
    queue.push_past_bound(message, now, with);
    if node.warnings().admit(crate::warnings::reason::DEAD_LETTER) {
        warn!(%id, code = code.as_str(), reason, "Message dead-lettered.");
    }
    node.report(result_to.as_ref(), outcomes);
    if !event {
        node.emit(
            Event::new(
                EventKind::DeadLetter,
                format!(
                    "message {id} dead-lettered ({}) into {}: {reason}",
                    code.as_str(),
                    queue.config().name
                ),
            )
            .with("id", &id)
            .with("code", code.as_str())
            .with("reason", reason)
            .with("queue", &queue.config().name),
        );
    }
}

/// Gives every queue with a `backout_threshold` its poison hook: a message backed out that
/// many times goes to the queue's `backout_queue` (the dead-letter queue by default), with
/// reason `backout_threshold`, in the same store batch as its removal, and an event.
pub(crate) fn take_poison(node: &std::sync::Arc<NodeState>) {
    for queue in node.queues() {
        let config = queue.config();
        let Some(threshold) = config.backout_threshold else { continue };
        let from = Address::new(node.name().clone(), config.name.clone());
        let to = config.backout_queue.clone().unwrap_or_else(|| node.dead_letters().config().name.clone());
        let weak = std::sync::Arc::downgrade(node);
        queue.set_poison_hook(std::sync::Arc::new(
            move |messages: Vec<Message>, batch: Batch, now: Instant| {
                let Some(node) = weak.upgrade() else { return };
                let Some(target) = node.queue(to.as_str()) else { return node.committer().write(batch) };
                let reason = format!("backed out {threshold} times from {from} (its backout_threshold)");
                let mut with = batch;
                for message in messages {
                    let why = DeadLetter {
                        code: DeadLetterCode::BackoutThreshold,
                        reason: &reason,
                        failed: vec![from.clone()],
                    };
                    put_into(&node, target, message, why, now, std::mem::take(&mut with));
                }
            },
        ));
    }
}

/// Writes the dead-letter headers on `message` (earlier marks, of a replayed message that
/// failed again, make way), each cut to the header limits.
fn mark(message: &mut Message, code: DeadLetterCode, reason: &str, failed: &[Address]) {
    message.content.headers.retain(|(k, _)| !k.starts_with("linkbus.dead_letter_"));
    let failed: Vec<String> = failed.iter().map(ToString::to_string).collect();
    let marks = [
        (DEAD_LETTER_CODE_HEADER, code.as_str().to_owned()),
        (DEAD_LETTER_RECIPIENTS_HEADER, failed.join(",")),
        (DEAD_LETTER_REASON_HEADER, reason.to_owned()),
    ];
    for (key, mut value) in marks {
        if message.content.headers.len() >= linkbus_plugin_api::message::HEADERS_MAX {
            break;
        }
        let mut cut = value.len().min(linkbus_plugin_api::message::HEADER_VALUE_BYTES_MAX);
        while !value.is_char_boundary(cut) {
            cut -= 1;
        }
        value.truncate(cut);
        message.content.headers.push((key.into(), value));
    }
}
