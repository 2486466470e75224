//! The node's administration requests on the client socket: status (links with their last
//! errors, the disk, the queues), event subscriptions (a queue on another node is probed
//! first), results, link resets, route explanations and reloads.

use std::sync::atomic::Ordering;
use std::time::Duration;

use linkbus_plugin_api::Address;

use super::protocol::{ErrorCode, Response};
use super::server::{GET_MESSAGES_MAX, GET_WAIT_MS_MAX, refused};
use crate::events::EventKind;
use crate::flow::dead_letter::DEAD_LETTER_QUEUE;
use crate::node::NodeState;

pub(super) fn reload(node: &NodeState) -> Response {
    match node.reload() {
        Ok(text) => Response::Status(text),
        Err(refusal) => Response::Error { code: refusal.code.into(), accepted: 0, message: refusal.reason },
    }
}

/// `linkbus plugins`: every plugin the node can select, with its origin and whether the
/// configuration uses it, then each running filter's module.
pub(super) fn plugins(node: &NodeState) -> Response {
    Response::Status(crate::config::plugins_table(node.config(), &node.filters().origins()))
}

pub(super) fn route_explain(node: &NodeState, destination: &str) -> Response {
    match linkbus_plugin_api::NodeName::new(destination) {
        Ok(name) => {
            Response::Status(node.routing().explain(&name).iter().map(|l| format!("{l}\n")).collect())
        }
        Err(e) => Response::Error { code: ErrorCode::Invalid, accepted: 0, message: e.to_string() },
    }
}

pub(super) fn link_reset(node: &NodeState, peer: &str) -> Response {
    let found = linkbus_plugin_api::NodeName::new(peer).ok().and_then(|name| node.link(&name));
    let Some(link) = found else {
        let message = format!("node {} has no link to '{peer}'", node.name());
        return Response::Error { code: ErrorCode::NoRoute, accepted: 0, message };
    };
    let text = match link.request_reset() {
        Some(reason) => format!(
            "link to {peer} restarted (it was stopped: {reason}); the next handshake takes its sequence numbers as they are\n"
        ),
        None => format!("link to {peer} is not stopped; nothing to reset\n"),
    };
    Response::Status(text)
}

/// The results of messages of this node, once all are final or after `wait_ms`.
pub(super) async fn results(node: &NodeState, source: &str, sequences: &[u64], wait_ms: u64) -> Response {
    if source != node.name().as_str() {
        let message = format!(
            "the results of messages from {source} are kept by node {source}, not by {}",
            node.name()
        );
        return Response::Error { code: ErrorCode::BadRequest, accepted: 0, message };
    }
    if sequences.len() > GET_MESSAGES_MAX as usize {
        let message = format!("at most {GET_MESSAGES_MAX} messages per results request");
        return Response::Error { code: ErrorCode::BadRequest, accepted: 0, message };
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms.min(GET_WAIT_MS_MAX));
    tokio::select! {
        results = node.results().wait(sequences, deadline) => Response::Results(results),
        () = node.until_stopping(), if wait_ms > 0 => refused(ErrorCode::Internal, node.shutting_down()),
    }
}

pub(super) async fn subscribe(node: &NodeState, to: &str, kinds: &[String]) -> Response {
    let to: Address = match to.parse() {
        Ok(to) => to,
        Err(e) => return refused(ErrorCode::Invalid, format!("'{to}': {e}")),
    };
    let mut parsed = Vec::new();
    for kind in kinds {
        match kind.as_str() {
            "all" => parsed.extend(EventKind::ALL),
            k => match k.parse::<EventKind>() {
                Ok(kind) => parsed.push(kind),
                Err(e) => return refused(ErrorCode::Invalid, e),
            },
        }
    }
    // A queue on another node: ask that node whether it has it (when it can answer now).
    let mut note = String::new();
    let link_up = node.link_towards(&to.node).map(|l| l.up.load(Ordering::Relaxed));
    if &to.node != node.name() && !parsed.is_empty() && link_up == Ok(false) {
        note = format!(
            " (not confirmed: the link towards {} is down; copies that cannot be handed over are counted \
             in `linkbus events ls` here and in `linkbus status` on {})",
            to.node, to.node
        );
    }
    if &to.node != node.name() && !parsed.is_empty() && link_up == Ok(true) {
        match node.probe_queue(&to, SUBSCRIBE_PROBE_WAIT).await {
            crate::node::Probe::Exists => {}
            crate::node::Probe::Missing(reason) => {
                return refused(ErrorCode::UnknownQueue, format!("{reason}; {to} not subscribed"));
            }
            crate::node::Probe::Unknown(why) => {
                note = format!(
                    " (not confirmed: {why}; copies that cannot be handed over are counted in `linkbus \
                     events ls` here and in `linkbus status` on {})",
                    to.node
                );
            }
        }
    }
    match node.subscribe(&to, &parsed).await {
        Ok(()) => Response::Status(format!("{to} subscribed{note}\n")),
        Err(refusal) => refused(refusal.code.into(), refusal.reason),
    }
}

/// How long a subscription of a queue on another node waits for that node to say whether
/// it has the queue.
const SUBSCRIBE_PROBE_WAIT: Duration = Duration::from_secs(5);

pub(super) async fn unsubscribe(node: &NodeState, to: &str) -> Response {
    let to: Address = match to.parse() {
        Ok(to) => to,
        Err(e) => return refused(ErrorCode::Invalid, format!("'{to}': {e}")),
    };
    match node.unsubscribe(&to).await {
        Ok(()) => Response::Status(format!("{to} unsubscribed\n")),
        Err(refusal) => refused(refusal.code.into(), refusal.reason),
    }
}

/// One line per subscription: queue, kinds, where it comes from.
pub(super) fn subscriptions(node: &NodeState) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for sub in node.subscriptions().all() {
        let kinds: Vec<&str> = sub.kinds.iter().map(|k| k.as_str()).collect();
        let from = if sub.from_client { "client" } else { "configuration" };
        let dropped = node.events_dropped().of(node.name(), &sub.to);
        let dropped = if dropped > 0 { format!("  {dropped} copies dropped here") } else { String::new() };
        let _ = writeln!(s, "{}  {}  ({from}){dropped}", sub.to, kinds.join(","));
    }
    s
}

/// A link that is down: for how long, and its last error (how often, since when).
pub(super) fn down(health: &crate::link::Health) -> String {
    let now = crate::clock::unix_ms();
    let ago = |ms: u64| format!("{:.0} s", now.saturating_sub(ms) as f64 / 1000.0);
    let mut text = match health.down_since_ms {
        Some(since) => format!("down for {}", ago(since)),
        None => "down".to_owned(),
    };
    if health.last_error.is_none() {
        text.push_str(" (no error: waiting for the peer to connect, or for a message to send)");
    }
    if let Some(e) = &health.last_error {
        let times = if e.count > 1 {
            format!(", {} times since {} ago", e.count, ago(e.first_ms))
        } else {
            String::new()
        };
        text.push_str(&format!(" (last error {} ago{times}: {})", ago(e.last_ms), e.reason));
    }
    text
}

/// The `stages` lines of `status`: what each codec stage did at this origin.
fn stage_lines(node: &NodeState, s: &mut String) {
    use std::fmt::Write;
    let stages = node.codecs().stats();
    if !stages.is_empty() {
        let _ = writeln!(s, "stages (at this origin):");
    }
    for stage in stages {
        let ratio = stage.bytes_in as f64 / stage.bytes_out.max(1) as f64;
        let _ = writeln!(
            s,
            "  {}: {} messages, {} bytes in, {} bytes out (ratio {ratio:.2})",
            stage.name, stage.messages, stage.bytes_in, stage.bytes_out
        );
    }
}

/// The `filters` lines of `status`: what each running filter did.
fn filter_lines(node: &NodeState, s: &mut String) {
    use std::fmt::Write;
    let filters = node.filters().stats();
    if !filters.is_empty() {
        let _ = writeln!(s, "filters:");
    }
    for f in filters {
        let hooks: Vec<&str> = f.hooks.iter().map(|h| h.as_str()).collect();
        let failures: Vec<String> = f.failures.iter().map(|(k, n)| format!("{} {n}", k.as_str())).collect();
        let failures = if failures.is_empty() { "none".to_owned() } else { failures.join(", ") };
        let fuel = f.fuel / f.calls.max(1);
        let _ = writeln!(
            s,
            "  {} [{}]: {} calls, {} messages, {} dropped, {} rewritten, {} routed; failures: {failures}; \
             rebuilt {}; fuel/call {fuel}; time/call p50 {} us, p99 {} us",
            f.name,
            hooks.join(", "),
            f.calls,
            f.messages,
            f.drops,
            f.rewrites,
            f.routes,
            f.rebuilds,
            f.p50_us,
            f.p99_us
        );
        for (name, value) in &f.counters {
            let _ = writeln!(s, "    counter {name}: {value}");
        }
    }
}

pub(super) fn status(node: &NodeState) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "node: {}", node.name());
    let _ = writeln!(
        s,
        "store: {} (durable: {}); {} writes in {} batches, {} synced for {} waiters",
        node.config().plugins.store.kind,
        node.store().durable(),
        node.committer().stats.writes.load(Ordering::Relaxed),
        node.committer().stats.batches.load(Ordering::Relaxed),
        node.committer().stats.syncs.load(Ordering::Relaxed),
        node.committer().stats.waiters.load(Ordering::Relaxed)
    );
    let _ = writeln!(s, "disk: {}", node.disk().describe());
    let _ = writeln!(s, "{}", node.files().describe());
    stage_lines(node, &mut s);
    filter_lines(node, &mut s);
    let _ = writeln!(s, "links:");
    let mut links: Vec<_> = node.links().collect();
    links.sort_by(|a, b| a.peer.name.cmp(&b.peer.name));
    for l in links {
        let state = match l.stopped() {
            Some(reason) => format!("STOPPED ({reason}; run `linkbus link reset {}`)", l.peer.name),
            None if l.up.load(Ordering::Relaxed) => "up".to_owned(),
            None => "down".to_owned(),
        };
        let stats = l.stats.lock().map(|s| *s).unwrap_or_default();
        let _ = writeln!(
            s,
            "  {}: {state}, queued {}, acked {}, received {}; renegotiations {}, resent {}, retransmit timeouts {}, naks sent {}, naks received {}, duplicates {}, resumed bytes {}, expired on the way {}",
            l.peer.name,
            l.queued(),
            l.acked_total.load(Ordering::Relaxed),
            l.received_total.load(Ordering::Relaxed),
            stats.renegotiations,
            stats.resent,
            stats.retransmit_timeouts,
            stats.naks_sent,
            stats.naks_received,
            stats.duplicates,
            stats.resumed_bytes,
            stats.expired_on_the_way,
        );
        if l.stopped().is_none() && !l.up.load(Ordering::Relaxed) {
            let _ = writeln!(s, "    {}", down(&l.health()));
        }
    }
    let _ = writeln!(s, "events dropped: {}", node.events_dropped().total());
    for d in node.events_dropped().all() {
        let (origin, to) = match (&d.origin, &d.to) {
            (Some(origin), Some(to)) => (origin.to_string(), to.to_string()),
            _ => ("other nodes".to_owned(), "other queues".to_owned()),
        };
        let _ = writeln!(s, "  from {origin} to {to}: {}, last {} ({})", d.count, d.last.0, d.last.1);
    }
    let _ = writeln!(
        s,
        "results: {} messages waiting for theirs; result messages dropped (no room): {}",
        node.results().pending(),
        node.results_dropped()
    );
    let _ = writeln!(s, "queues:");
    let mut queues: Vec<_> = node.queues().collect();
    queues.sort_by(|a, b| a.config().name.cmp(&b.config().name));
    for q in queues {
        let kind = if q.config().name.as_str() == DEAD_LETTER_QUEUE { " (dead letters)" } else { "" };
        let _ = writeln!(s, "  {}: {} messages{kind}", q.config().name, q.len());
    }
    s
}

/// Starts sending a file (see [`crate::files`]); answered with the transfer's id.
pub(super) async fn send_file(node: &NodeState, send: linkbus_client::SendFile) -> Response {
    match crate::files::start(node, send).await {
        Ok(id) => Response::PutOk {
            source: id.source,
            sequences: vec![id.sequence],
            created_unix_ms: id.created_unix_ms,
        },
        Err(refusal) => Response::Error { code: refusal.code.into(), accepted: 0, message: refusal.reason },
    }
}
