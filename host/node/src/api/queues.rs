//! The queue requests of the client protocol: taking messages (a get, a consumer's
//! answer) and the requests about queues that neither wait nor hand messages out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::debug;

use super::protocol::{ErrorCode, GetGroups, Request, Response};
use super::server::{GET_BYTES_MAX, GET_MESSAGES_MAX, GET_WAIT_MS_MAX, PendingOnConnection, refused};
use crate::events::{Event, EventKind};
use crate::node::NodeState;
use crate::queue::{GroupMode, LocalQueue, PopLimits};
use linkbus_plugin_api::Reliability;

/// Takes messages from the local queue `queue` for a get (or a consumer's answer): up to
/// `count_max`, waiting up to `wait_ms` for the first, none encoded over `bytes_max`,
/// handed out pending with `hand_out`, groups as `groups` says; also the queue they came
/// from. Refused while the connection holds a finished group unacknowledged.
pub(super) async fn take(
    node: &NodeState,
    queue: &str,
    (count_max, wait_ms, bytes_max, hand_out, groups): (u32, u64, u64, bool, GetGroups),
    pending: &mut PendingOnConnection,
) -> (Response, Option<Arc<LocalQueue>>) {
    if let Some(reason) = pending.blocked() {
        return (refused(ErrorCode::BadRequest, reason), None);
    }
    let q = match find_queue(node, queue) {
        Ok(q) => q,
        Err(response) => return (response, None),
    };
    let limits = PopLimits {
        // (A whole group is taken up to what any get takes.)
        count_max: if groups == GetGroups::Whole {
            GET_MESSAGES_MAX
        } else {
            count_max.clamp(1, GET_MESSAGES_MAX)
        } as usize,
        message_bytes_max: usize::try_from(bytes_max).unwrap_or(usize::MAX),
        total_bytes_max: GET_BYTES_MAX,
        pending: hand_out,
        groups: group_mode(groups),
    };
    let (messages, tags) = match get(node, &q, limits, wait_ms).await {
        Response::Messages { messages, tags } => (messages, tags),
        other => return (other, Some(q)),
    };
    pending.add(&q, &messages, &tags);
    // Taking a persistent message (or marking it handed out) is durable before the
    // consumer has it, so a crash never hands it out again unmarked.
    let stored = messages.iter().any(|m| m.content.reliability == Reliability::Persistent);
    if !(stored && node.store().durable()) {
        return (Response::Messages { messages, tags }, Some(q));
    }
    // Until the consumer has them, taken messages go back to the queue if the sync fails
    // or the wait for it is abandoned (the client left, the node stops). Pending ones go
    // back with the connection instead.
    let mut taken = Taken { queue: &q, messages, restore: tags.is_empty() };
    if let Err(e) = node.committer().sync().await {
        drop(taken);
        return (refused(ErrorCode::Internal, format!("store failed: {e}")), Some(q));
    }
    let messages = std::mem::take(&mut taken.messages);
    drop(taken);
    (Response::Messages { messages, tags }, Some(q))
}

/// The queue's group mode for a get's.
pub(super) fn group_mode(groups: GetGroups) -> GroupMode {
    match groups {
        GetGroups::Complete => GroupMode::Complete,
        GetGroups::Whole => GroupMode::Whole,
        GetGroups::Members => GroupMode::Members,
    }
}

/// Messages taken from `queue` for a consumer that does not have them yet: with `restore`
/// (taken acknowledged at once), they go back to the queue's head if this drops first.
struct Taken<'a> {
    queue: &'a LocalQueue,
    messages: Vec<linkbus_plugin_api::Message>,
    restore: bool,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if self.restore && !self.messages.is_empty() {
            self.queue.restore(std::mem::take(&mut self.messages), Instant::now());
        }
    }
}

/// The queue's handle, or the error naming the missing queue.
pub(super) fn find_queue(node: &NodeState, queue: &str) -> Result<Arc<LocalQueue>, Response> {
    let found = linkbus_plugin_api::QueueName::new(queue).ok().and_then(|name| node.queue(&name));
    found.cloned().ok_or_else(|| {
        let message = format!("queue '{queue}' does not exist on node {}", node.name());
        Response::Error { code: ErrorCode::UnknownQueue, accepted: 0, message }
    })
}

/// Requests about queues that neither wait nor hand messages out.
pub(super) fn queue_request(
    node: &NodeState,
    request: Request,
    pending: &mut PendingOnConnection,
) -> Response {
    let answer = |queue: &str, f: &mut dyn FnMut(Arc<LocalQueue>) -> Response| match find_queue(node, queue) {
        Ok(q) => f(q),
        Err(response) => response,
    };
    match request {
        Request::Queues { name } if name.is_empty() => Response::Status(queue_list(node)),
        Request::Queues { name } => answer(&name, &mut |q| Response::Status(queue_detail(&q))),
        Request::Browse { queue, count_max } => answer(&queue, &mut |q| {
            let messages =
                q.browse(count_max.clamp(1, GET_MESSAGES_MAX) as usize, GET_BYTES_MAX, Instant::now());
            Response::Messages { messages, tags: Vec::new() }
        }),
        Request::Ack { queue, tags } => {
            answer(&queue, &mut |q| pending.settle(&q, &tags, true, |q, t| q.ack(t)))
        }
        Request::Backout { queue, tags } => {
            answer(&queue, &mut |q| pending.settle(&q, &tags, false, |q, t| q.backout(t, Instant::now())))
        }
        other => {
            let message = format!("request {other:?} is not a queue request");
            Response::Error { code: ErrorCode::BadRequest, accepted: 0, message }
        }
    }
}

/// Copies of what came into `queue` after key `after`, without taking it; waits up to
/// `wait_ms` for the first. The answer's tags are the messages' keys.
pub(super) async fn follow(
    node: &NodeState,
    queue: &str,
    after: u64,
    count_max: u32,
    wait_ms: u64,
) -> Response {
    let Some(q) = node.queue(queue).cloned() else {
        let message = format!("queue '{queue}' does not exist on node {}", node.name());
        return Response::Error { code: ErrorCode::UnknownQueue, accepted: 0, message };
    };
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms.min(GET_WAIT_MS_MAX));
    let stopping = node.until_stopping();
    tokio::pin!(stopping);
    loop {
        let pushed = q.pushed();
        tokio::pin!(pushed);
        pushed.as_mut().enable();
        let found = q.browse_after(
            after,
            count_max.clamp(1, GET_MESSAGES_MAX) as usize,
            GET_BYTES_MAX,
            Instant::now(),
        );
        if !found.is_empty() || tokio::time::Instant::now() >= deadline {
            let (tags, messages) = found.into_iter().unzip();
            return Response::Messages { messages, tags };
        }
        tokio::select! {
            _ = tokio::time::timeout_at(deadline, pushed) => {}
            () = &mut stopping => return refused(ErrorCode::Internal, node.shutting_down()),
        }
    }
}

/// Takes what `limits` allow from `q`, waiting up to `wait_ms` for the first message; a
/// node that shuts down ends the wait with an error.
pub(super) async fn get(node: &NodeState, q: &LocalQueue, limits: PopLimits, wait_ms: u64) -> Response {
    let queue = q.config().name.as_str();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms.min(GET_WAIT_MS_MAX));
    // Listens (on the node's one signal) only from the first wait, and once per get.
    let stopping = node.until_stopping();
    tokio::pin!(stopping);
    loop {
        // A whole-group get waits for a push even when the queue holds other messages.
        let pushed = q.pushed();
        tokio::pin!(pushed);
        pushed.as_mut().enable();
        let popped = q.pop(limits, Instant::now());
        if popped.expired > 0 {
            debug!(queue, expired = popped.expired, "Expired messages dropped.");
            node.emit(
                Event::new(
                    EventKind::Expired,
                    format!("{} message(s) expired in queue '{queue}'", popped.expired),
                )
                .with("queue", queue)
                .with("count", popped.expired),
            );
        }
        if let Some(size) = popped.too_large {
            let message = format!(
                "the next message in queue '{queue}' has {size} bytes, over this get's limit of {}; it stays in the queue",
                limits.message_bytes_max
            );
            return Response::Error { code: ErrorCode::TooLarge, accepted: 0, message };
        }
        if let Some((count, bytes)) = popped.group_too_large {
            let message = format!(
                "the next group in queue '{queue}' has {count} members and {bytes} bytes, more than one get takes \
                 ({} messages, {} bytes); it stays in the queue",
                limits.count_max, limits.total_bytes_max
            );
            return Response::Error { code: ErrorCode::TooLarge, accepted: 0, message };
        }
        if !popped.messages.is_empty() || tokio::time::Instant::now() >= deadline {
            return Response::Messages { messages: popped.messages, tags: popped.tags };
        }
        let whole = limits.groups == GroupMode::Whole;
        tokio::select! {
            () = q.wait(deadline), if !whole => {}
            _ = tokio::time::timeout_at(deadline, pushed), if whole => {}
            () = &mut stopping => return refused(ErrorCode::Internal, node.shutting_down()),
        }
    }
}

fn queue_list(node: &NodeState) -> String {
    use std::fmt::Write;
    let mut queues: Vec<_> = node.queues().collect();
    queues.sort_by(|a, b| a.config().name.cmp(&b.config().name));
    let mut s = format!(
        "{:<20} {:<9} {:>10} {:>8} {:>10} {:>10}\n",
        "QUEUE", "ORDER", "DEPTH", "PENDING", "MAX", "OLDEST"
    );
    let now = Instant::now();
    for q in queues {
        let stats = q.stats(now);
        let c = q.config();
        let _ = writeln!(
            s,
            "{:<20} {:<9} {:>10} {:>8} {:>10} {:>10}",
            c.name.as_str(),
            format!("{:?}", c.order).to_lowercase(),
            stats.by_level.iter().sum::<usize>(),
            stats.pending,
            c.queue_messages_max,
            age(stats.oldest),
        );
    }
    s
}

fn queue_detail(q: &LocalQueue) -> String {
    use std::fmt::Write;
    let stats = q.stats(Instant::now());
    let c = q.config();
    let mut s = String::new();
    let _ = writeln!(s, "queue: {}", c.name);
    let _ = writeln!(s, "order: {}", format!("{:?}", c.order).to_lowercase());
    let _ = writeln!(s, "depth: {}", stats.by_level.iter().sum::<usize>());
    let _ = writeln!(s, "pending (handed out, not acknowledged): {}", stats.pending);
    let _ = writeln!(s, "held (members of groups not complete): {}", stats.held);
    let _ = writeln!(s, "limit: {} messages, {} bytes each", c.queue_messages_max, c.message_bytes_max);
    let _ = writeln!(s, "oldest: {}", age(stats.oldest));
    if stats.by_level.len() > 1 {
        let _ = writeln!(s, "depth by priority:");
        for (level, depth) in stats.by_level.iter().enumerate().rev() {
            let name = if level > 9 { "system".to_owned() } else { level.to_string() };
            let _ = writeln!(s, "  {name:>6}: {depth}");
        }
    }
    s
}

fn age(oldest: Option<Duration>) -> String {
    oldest.map_or_else(|| "-".to_owned(), |d| format!("{:.1}s", d.as_secs_f64()))
}
