//! Local transactions of a client connection: puts held until commit, gets taken pending
//! until commit (acknowledged) or rollback (given back).
//!
//! A get inside a transaction is settled by the commit; one that asks for manual
//! acknowledgement hands out tags, and each must be acknowledged (inside the transaction:
//! the message leaves only at commit) before the commit, which otherwise fails and rolls the
//! transaction back. Groups roll back with the rest: puts of a group are dropped, members
//! taken go back to their queue's head in index order.

use std::sync::Arc;
use std::time::Duration;

use super::groups::PutGroups;
use super::protocol::{ErrorCode, GetGroups, Request, Response};
use super::queues::{find_queue, get, group_mode};
use super::server::{GET_BYTES_MAX, GET_MESSAGES_MAX, PUT_WAIT_MS_MAX, PendingOnConnection, refused};
use crate::events::{Event, EventKind};
use crate::flow::{CommitError, Origin, Refusal, RefusalCode};
use crate::node::NodeState;
use crate::queue::{LocalQueue, PopLimits};

/// Most messages one transaction puts and gets together.
pub(crate) const TRANSACTION_MESSAGES_MAX: usize = 10_000;
/// Most payload bytes one transaction puts (held in memory until commit).
pub(crate) const TRANSACTION_BYTES_MAX: usize = 64 << 20;

/// The open transaction of a connection: puts held until commit, messages taken pending
/// until commit (acknowledged) or rollback (given back). Dropping it — the connection ended
/// — rolls it back.
#[derive(Default)]
pub(super) struct Transaction {
    puts: Vec<linkbus_plugin_api::Message>,
    put_bytes: usize,
    /// Taken, settled by the commit.
    gets: PendingOnConnection,
    got: usize,
    /// Taken for manual acknowledgement, not acknowledged yet.
    manual: PendingOnConnection,
    /// Taken for manual acknowledgement and acknowledged: they leave at commit.
    acked: PendingOnConnection,
    /// The connection's open group when the transaction began (back to it on rollback).
    groups_at_begin: PutGroups,
}

impl Drop for Transaction {
    /// Rolled back (not committed): what it took goes back in one backout per queue, so
    /// each queue gets its messages back in their order.
    fn drop(&mut self) {
        let (mut manual, mut acked) = (std::mem::take(&mut self.manual), std::mem::take(&mut self.acked));
        self.gets.absorb(&mut manual);
        self.gets.absorb(&mut acked);
    }
}

impl Transaction {
    fn count(&self) -> usize {
        self.puts.len() + self.got
    }

    /// Checks and stamps the contents now (through the origin stages); they are queued at
    /// commit. A put that breaks the group rules is refused whole.
    pub(super) fn put(
        &mut self,
        node: &NodeState,
        (origin, groups): (&mut Origin, &mut PutGroups),
        contents: Vec<linkbus_plugin_api::Content>,
        no_wait: bool,
    ) -> Response {
        if no_wait {
            let message = "a no-wait put cannot be part of a transaction".to_owned();
            return refused(ErrorCode::Invalid, message);
        }
        let members = PutGroups::members(&contents);
        if let Err(reason) = groups.after(&members) {
            return refused(ErrorCode::Invalid, reason);
        }
        let created_unix_ms = crate::clock::unix_ms();
        let sizes: Vec<usize> = contents.iter().map(linkbus_proto::wire::content_encoded_len).collect();
        let mut bytes = self.put_bytes;
        let mut fits = contents.len();
        for (index, size) in sizes.iter().enumerate() {
            bytes += size;
            if self.count() + index >= TRANSACTION_MESSAGES_MAX || bytes > TRANSACTION_BYTES_MAX {
                fits = index;
                break;
            }
        }
        let mut contents = contents;
        let over = fits < contents.len();
        contents.truncate(fits);
        let (messages, refused) = origin.prepare(node, contents, created_unix_ms);
        let sequences: Vec<u64> = messages.iter().map(|m| m.id.sequence).collect();
        let accepted = messages.len();
        groups.accepted(&members, accepted);
        self.put_bytes += sizes.iter().take(accepted).sum::<usize>();
        self.puts.extend(messages);
        if let Some(e) = refused {
            return Response::Error { code: e.code.into(), accepted: e.accepted, message: e.message };
        }
        if over {
            let message = format!(
                "message {}: a transaction holds at most {TRANSACTION_MESSAGES_MAX} messages and {TRANSACTION_BYTES_MAX} bytes of encoded puts",
                accepted + 1
            );
            return Response::Error { code: ErrorCode::TooLarge, accepted: accepted as u32, message };
        }
        Response::PutOk { source: node.name().clone(), sequences, created_unix_ms }
    }

    /// Takes messages pending under the transaction: without tags (the commit settles them),
    /// or with `hand_out`, with tags to acknowledge before the commit.
    pub(super) async fn get(
        &mut self,
        node: &NodeState,
        queue: &str,
        (count_max, wait_ms, bytes_max, hand_out, groups): (u32, u64, u64, bool, GetGroups),
        outside: &PendingOnConnection,
    ) -> Response {
        if let Some(reason) = self.manual.blocked().or_else(|| outside.blocked()) {
            return refused(ErrorCode::BadRequest, reason);
        }
        let q = match find_queue(node, queue) {
            Ok(q) => q,
            Err(response) => return response,
        };
        let room = TRANSACTION_MESSAGES_MAX.saturating_sub(self.count());
        if room == 0 {
            let message = format!("a transaction holds at most {TRANSACTION_MESSAGES_MAX} messages");
            return refused(ErrorCode::TooLarge, message);
        }
        let asked =
            if groups == GetGroups::Whole { GET_MESSAGES_MAX } else { count_max.clamp(1, GET_MESSAGES_MAX) };
        let limits = PopLimits {
            count_max: (asked as usize).min(room),
            message_bytes_max: usize::try_from(bytes_max).unwrap_or(usize::MAX),
            total_bytes_max: GET_BYTES_MAX,
            pending: true,
            groups: group_mode(groups),
        };
        match get(node, &q, limits, wait_ms).await {
            Response::Messages { messages, tags } if hand_out => {
                self.manual.add(&q, &messages, &tags);
                self.got += tags.len();
                Response::Messages { messages, tags }
            }
            Response::Messages { messages, tags } => {
                self.gets.add(&q, &messages, &tags);
                self.got += tags.len();
                Response::Messages { messages, tags: Vec::new() }
            }
            other => other,
        }
    }

    /// Whether `tags` of `queue` were taken for manual acknowledgement in this transaction.
    pub(super) fn holds(&self, queue: &str, tags: &[u64]) -> bool {
        self.manual
            .queues
            .iter()
            .any(|(q, held)| q.config().name.as_str() == queue && tags.iter().any(|t| held.contains(t)))
    }

    /// Acknowledges (`ack`) or backs out messages taken for manual acknowledgement here:
    /// acknowledged, they leave at commit; backed out, they go back now.
    pub(super) fn settle(&mut self, node: &NodeState, queue: &str, tags: &[u64], ack: bool) -> Response {
        let q = match find_queue(node, queue) {
            Ok(q) => q,
            Err(response) => return response,
        };
        if !ack {
            return self.manual.settle(&q, tags, false, |q, t| q.backout(t, std::time::Instant::now()));
        }
        let mut settled = Vec::new();
        let response = self.manual.settle(&q, tags, true, |_, t| {
            settled = t.to_vec();
            Ok(t.len())
        });
        self.acked.add(&q, &[], &settled);
        response
    }

    /// Why the commit may not go ahead: messages taken for manual acknowledgement and not
    /// acknowledged.
    fn unacknowledged(&self) -> Option<String> {
        let (q, tags) = self.manual.queues.iter().find(|(_, tags)| !tags.is_empty())?;
        let count: usize = self.manual.queues.iter().map(|(_, tags)| tags.len()).sum();
        let shown: Vec<u64> = tags.iter().copied().take(10).collect();
        Some(format!(
            "{count} message(s) taken with manual acknowledgement in it are not acknowledged (queue '{}', tags {shown:?}): acknowledge them before the commit",
            q.config().name
        ))
    }
}

/// `Begin`, `Commit` and `Rollback`; `groups` is the connection's open group, back to
/// what it was at `Begin` when the transaction does not commit.
pub(super) async fn transact(
    node: &NodeState,
    request: Request,
    transaction: &mut Option<Transaction>,
    groups: &mut PutGroups,
) -> Response {
    match (request, transaction.take()) {
        (Request::Begin, None) => {
            let mut tx = Transaction::default();
            tx.groups_at_begin = groups.clone();
            *transaction = Some(tx);
            Response::Settled(0)
        }
        (Request::Begin, Some(open)) => {
            *transaction = Some(open);
            refused(ErrorCode::BadRequest, "a transaction is already open on this connection".into())
        }
        // As with MQ's MQCMIT / MQBACK, nothing open: nothing to do.
        (Request::Commit { .. } | Request::Rollback, None) => Response::Settled(0),
        (Request::Commit { timeout_ms }, Some(mut tx)) => {
            // Back to where it began unless the commit succeeds.
            let after = std::mem::replace(groups, tx.groups_at_begin.clone());
            if let Some(reason) = tx.unacknowledged() {
                return refused(ErrorCode::BadRequest, format!("transaction rolled back: {reason}"));
            }
            let timeout = Duration::from_millis(timeout_ms.min(PUT_WAIT_MS_MAX));
            let gets: Vec<(Arc<LocalQueue>, Vec<u64>)> = (tx.gets.queues.iter())
                .chain(&tx.acked.queues)
                .map(|(q, tags)| (q.clone(), tags.iter().copied().collect()))
                .collect();
            let count = tx.count();
            // A commit abandoned while it waits (the client left) drops `tx`: rolled back.
            // The puts move into the commit (a commit that fails drops them, as a rollback).
            match crate::flow::origin::commit(node, std::mem::take(&mut tx.puts), &gets, timeout).await {
                Ok(()) => {
                    // Acknowledged by the commit: nothing left to give back.
                    tx.gets.queues.clear();
                    tx.acked.queues.clear();
                    *groups = after;
                    Response::Settled(count as u32)
                }
                Err(CommitError::Refused(Refusal { code, reason })) => {
                    if matches!(code, RefusalCode::Full | RefusalCode::Rejected) {
                        node.emit(Event::new(EventKind::QueueFull, reason.clone()).with("reason", &reason));
                    }
                    refused(code.into(), format!("transaction rolled back: {reason}"))
                }
                Err(CommitError::Partly(reason)) => {
                    // What was not acknowledged goes back when `tx` drops.
                    let message = format!("transaction partly committed (the store failed): {reason}");
                    refused(ErrorCode::Internal, message)
                }
            }
        }
        (Request::Rollback, Some(tx)) => {
            let count = tx.count();
            *groups = tx.groups_at_begin.clone();
            drop(tx);
            Response::Settled(count as u32)
        }
        (other, open) => {
            *transaction = open;
            refused(ErrorCode::BadRequest, format!("request {other:?} is not a transaction request"))
        }
    }
}
