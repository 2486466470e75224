//! Accepting links: reads the opening `Hello` of each incoming connection to learn which
//! peer it is from, refuses strangers and garbage with a clear `Close`, and hands the rest to
//! that peer's link task.
//!
//! Connections in the handshake are held in a [`pool::HandshakePool`]: bounded per source
//! address and in all, with connections that proved a peer's key kept apart, so a flood of
//! connections cannot keep a configured peer from linking up. Each refusal is logged at a
//! warning aggregated per reason (`log:`), with the cause and the YAML key to check.

mod pool;

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use linkbus_plugin_api::{Connection, Listener, NodeName};
use linkbus_proto::frame::{CloseCode, Hello};
use linkbus_proto::secure::{Mode, SecureChannel, SecureError};
use linkbus_proto::session::peek_hello;
use linkbus_proto::{FrameDecoder, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use tokio::sync::watch;
use tracing::{info, warn};

use crate::link::{Incoming, refuse};
use crate::node::NodeState;
use crate::warnings::reason;
use pool::{Eviction, HandshakePool, PoolLimits, Slot};

/// Accepts connections until `shutdown` turns true.
pub(crate) async fn run(
    node: Arc<NodeState>,
    mut listener: Box<dyn Listener>,
    mut shutdown: watch::Receiver<bool>,
) {
    let links = &node.config().links;
    let pool = HandshakePool::new(PoolLimits {
        anonymous_max: usize::try_from(links.handshakes_max).unwrap_or(usize::MAX),
        per_address_max: usize::try_from(links.handshakes_per_address_max).unwrap_or(usize::MAX),
        per_peer_max: usize::try_from(links.handshakes_per_peer_max).unwrap_or(usize::MAX),
    });
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok(connection) => {
                    let address = connection.peer_address.clone();
                    let node_for_task = node.clone();
                    let evicted = pool.admit(&address, std::time::Instant::now(), |slot| {
                        tokio::spawn(handshake(node_for_task, connection, slot)).abort_handle()
                    });
                    for eviction in evicted {
                        log_eviction(&node, &eviction);
                    }
                }
                Err(e) => {
                    if node.warnings().admit(reason::ACCEPT_FAILED) {
                        warn!(error = %e, "Accept failed.");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

fn log_eviction(node: &NodeState, eviction: &Eviction) {
    if !node.warnings().admit(reason::HANDSHAKE_EVICTED) {
        return;
    }
    let links = &node.config().links;
    match eviction {
        Eviction::Address(source) => warn!(
            %source,
            limit = links.handshakes_per_address_max,
            "Too many connections in the handshake from one address (links.handshakes_per_address_max); \
             dropped its oldest."
        ),
        Eviction::Full(source) => warn!(
            %source,
            limit = links.handshakes_max,
            "Too many connections in the handshake (links.handshakes_max); dropped the oldest of the \
             address holding the most."
        ),
        Eviction::Peer(peer) => warn!(
            %peer,
            limit = links.handshakes_per_peer_max,
            "Too many handshakes proving one peer's key at once (links.handshakes_per_peer_max); dropped \
             the oldest."
        ),
    }
}

/// What the listener learned from a new connection before handing it over.
struct Opening {
    secure: SecureChannel,
    hello: Hello,
    leftover: BytesMut,
    /// The peer its static key proved it to be, and its handshake stamp (Noise links).
    proven: Option<(NodeName, u64)>,
}

/// Why a connection was refused, and whether the refusal can go through its channel.
struct Refusal {
    reason: String,
    code: CloseCode,
    secure: Option<Box<SecureChannel>>,
    /// The preamble was wrong (not linkbus, or another mode): safe to say so in plaintext.
    preamble: bool,
    /// The configured peer the connection proved to be, when it failed after that.
    peer: Option<NodeName>,
}

fn refusal(reason: impl Into<String>, code: CloseCode, secure: Option<SecureChannel>) -> Refusal {
    Refusal { reason: reason.into(), code, secure: secure.map(Box::new), preamble: false, peer: None }
}

/// Reads the preamble, runs the listener's side of the handshake (identifying the peer by
/// its static key and refusing replays), then reads the peer's `Hello`.
async fn open(
    node: &NodeState,
    connection: &mut Connection,
    frame_bytes_max: usize,
    slot: &Slot,
) -> Result<Opening, Refusal> {
    let mut secure =
        node.security().listener().map_err(|e| refusal(e.to_string(), CloseCode::ProtocolError, None))?;
    let mut decoder = FrameDecoder::new(frame_bytes_max);
    let mut proven: Option<(NodeName, u64)> = None;
    let of_peer = |r: Refusal, proven: &Option<(NodeName, u64)>| Refusal {
        peer: proven.as_ref().map(|p| p.0.clone()),
        ..r
    };
    let mut buf = [0u8; 4096];
    loop {
        if let Some(plain) = secure.take_plaintext() {
            decoder.extend(&plain);
        }
        match peek_hello(&mut decoder) {
            Ok(Some(hello)) => {
                return Ok(Opening { secure, hello, leftover: decoder.take_buffered(), proven });
            }
            Ok(None) => {}
            Err(e) => {
                let r =
                    refusal(format!("expected a linkbus hello: {e}"), CloseCode::ProtocolError, Some(secure));
                return Err(of_peer(r, &proven));
            }
        }
        let n = match connection.reader.read(&mut buf).await {
            Ok(0) => return Err(of_peer(closed_early(proven.as_ref()), &proven)),
            Ok(n) => n,
            Err(e) => {
                let r = refusal(format!("read failed: {e}"), CloseCode::ProtocolError, None);
                return Err(of_peer(r, &proven));
            }
        };
        if let Err(e) = secure.handle_bytes(buf.get(..n).unwrap_or_default()) {
            let preamble = matches!(e, SecureError::Preamble | SecureError::Mode { .. });
            let r = Refusal { preamble, ..refusal(e.to_string(), CloseCode::ProtocolError, None) };
            return Err(of_peer(r, &proven));
        }
        if let Some((key, stamp)) = secure.identity() {
            let peer = identify(node, &key, stamp)?;
            match slot.identified(&peer, stamp) {
                Ok(Some(eviction)) => log_eviction(node, &eviction),
                Ok(None) => {}
                Err(pool::Replayed) => {
                    // Not the peer's failure: its own handshake is under way.
                    let reason = format!("replayed handshake from {peer} (the same one is under way)");
                    return Err(refusal(reason, CloseCode::ProtocolError, None));
                }
            }
            secure.accept().map_err(|e| refusal(e.to_string(), CloseCode::ProtocolError, None))?;
            if let Some(bytes) = secure.poll_transmit() {
                connection
                    .writer
                    .write_all(&bytes)
                    .await
                    .map_err(|e| refusal(e.to_string(), CloseCode::ProtocolError, None))?;
            }
            proven = Some((peer, stamp));
        }
    }
}

/// The configured peer whose static key the first handshake message proved, if its clock
/// reading is fresh.
fn identify(node: &NodeState, key: &[u8; 32], stamp: u64) -> Result<NodeName, Refusal> {
    let Some(peer) = node.security().identify(key).cloned() else {
        let reason = format!(
            "unknown static key {}: no peers[].public_key of this node is that key (add the dialer \
             there if it is a peer)",
            linkbus_proto::secure::hex(key)
        );
        return Err(refusal(reason, CloseCode::UnknownPeer, None));
    };
    let fail = |reason: String| Refusal {
        peer: Some(peer.clone()),
        ..refusal(reason, CloseCode::ProtocolError, None)
    };
    match node.security().check_fresh(&peer, stamp, crate::clock::unix_ms()) {
        Ok(()) => Ok(peer.clone()),
        Err(crate::security::Stale::Replayed) => Err(fail(format!("replayed handshake from {peer}"))),
        Err(crate::security::Stale::Ahead { by_ms, max_s }) => Err(fail(format!(
            "handshake from {peer} is stamped {:.1} s ahead of this node's clock, more than \
             security.clock_skew_max_s ({max_s} s) allows: set the clocks right, or raise it",
            by_ms as f64 / 1000.0
        ))),
    }
}

/// Why a connection that closed before its hello did: after this node answered a peer's
/// handshake, the peer could not read the answer.
fn closed_early(proven: Option<&(NodeName, u64)>) -> Refusal {
    let reason = match proven {
        Some((peer, _)) => format!(
            "{peer} closed the connection after this node's handshake answer: most likely its cluster key \
             differs from this node's (security.psk_file on both nodes; {peer}'s log says more)"
        ),
        None => "closed before its hello".to_owned(),
    };
    refusal(reason, CloseCode::ProtocolError, None)
}

async fn handshake(node: Arc<NodeState>, mut connection: Connection, slot: Slot) {
    let links = &node.config().links;
    let timeout = Duration::from_millis(links.handshake_timeout_ms);
    // Only a hello is expected; bound what a stranger can make us buffer.
    let limit = (links.frame_bytes_max as usize).min(64 * 1024);
    let address = connection.peer_address.clone();
    let opening = match tokio::time::timeout(timeout, open(&node, &mut connection, limit, &slot)).await {
        Ok(Ok(opening)) => opening,
        Ok(Err(r)) => {
            log_refusal(&node, &address, None, &r.reason, r.peer.as_ref());
            // Before the channel is up, a Noise listener tells a stranger nothing but a
            // wrong preamble or mode (the reason could name a peer).
            let silent = node.security().mode == Mode::Noise && r.secure.is_none() && !r.preamble;
            if silent {
                return;
            }
            return refuse(connection, r.secure.map(|s| *s), r.code, &r.reason);
        }
        Err(_) => {
            let reason =
                format!("no hello within links.handshake_timeout_ms ({} ms)", links.handshake_timeout_ms);
            log_refusal(&node, &address, None, &reason, None);
            return refuse(connection, None, CloseCode::ProtocolError, "no hello in time");
        }
    };
    drop(slot);
    let Opening { secure, hello, leftover, proven } = opening;
    if let Err(r) = check_hello(&node, &hello, proven.as_ref().map(|(peer, _)| peer)) {
        let peer = proven.as_ref().map(|(peer, _)| peer);
        log_refusal(&node, &address, Some(&hello.from), &r.0, peer);
        return refuse(connection, Some(secure), r.1, &r.0);
    }
    let Some(link) = NodeName::new(&hello.from).ok().and_then(|name| node.link(&name)) else { return };
    if let Some((peer, stamp)) = &proven {
        // Only now, with a hello decrypted under the session keys, does the stamp count.
        node.security().record_handshake(peer, *stamp);
    }
    info!(%address, peer = hello.from, "Accepted connection.");
    link.offer(Incoming { connection, hello: Some(hello), leftover, secure });
}

/// Logs a refusal, aggregated: a configured peer's failures under their own reason (so a
/// flood of strangers cannot hide them) and recorded as its link's last error.
fn log_refusal(node: &NodeState, address: &str, from: Option<&str>, why: &str, peer: Option<&NodeName>) {
    if let Some(link) = peer.and_then(|p| node.link(p)) {
        link.note_error(why);
        if node.warnings().admit(reason::HANDSHAKE_FAILED) {
            warn!(%address, peer = %link.peer.name, reason = why, "Refused a connection from a configured peer.");
        }
    } else if node.warnings().admit(reason::REFUSED_CONNECTION) {
        warn!(%address, from = from.unwrap_or("-"), reason = why, "Refused connection.");
    }
}

/// Checks a `Hello` against this node: version, names, and (Noise) the proven identity.
fn check_hello(
    node: &NodeState,
    hello: &Hello,
    proven: Option<&NodeName>,
) -> Result<(), (String, CloseCode)> {
    if hello.protocol_version != PROTOCOL_VERSION {
        // Refused here, so a peer of another version never disturbs the live link.
        let reason = format!(
            "peer speaks protocol version {}, this node speaks {PROTOCOL_VERSION}",
            hello.protocol_version
        );
        return Err((reason, CloseCode::VersionMismatch));
    }
    if hello.to != node.name().as_str() {
        return Err((format!("this is node {}, not {}", node.name(), hello.to), CloseCode::UnknownPeer));
    }
    let known = NodeName::new(&hello.from).ok().filter(|name| node.link(name).is_some());
    let Some(name) = known else {
        return Err((
            format!("node '{}' is not a configured peer of {}", hello.from, node.name()),
            CloseCode::UnknownPeer,
        ));
    };
    if proven.is_some_and(|p| *p != name) {
        return Err((
            format!(
                "the key of {} introduced itself as {name}",
                proven.map(ToString::to_string).unwrap_or_default()
            ),
            CloseCode::UnknownPeer,
        ));
    }
    Ok(())
}
