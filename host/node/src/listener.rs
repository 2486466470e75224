//! Accepting links: reads the opening `Hello` of each incoming connection to learn which
//! peer it is from, refuses strangers and garbage with a clear `Close`, and hands the rest to
//! that peer's link task.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use linkbus_plugin_api::{Connection, Listener, NodeName};
use linkbus_proto::frame::{CloseCode, Hello};
use linkbus_proto::secure::{Mode, SecureChannel, SecureError};
use linkbus_proto::session::peek_hello;
use linkbus_proto::{FrameDecoder, PROTOCOL_VERSION};
use std::collections::VecDeque;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use tokio::sync::watch;
use tracing::{info, warn};

use crate::link::{Incoming, refuse};
use crate::node::NodeState;

/// Incoming connections whose hello is being read at once; beyond it the oldest is dropped,
/// so strangers can neither hold unbounded memory (each may buffer up to 64 KiB for the
/// handshake timeout) nor keep real peers out by holding every slot.
pub const HANDSHAKES_MAX: usize = 64;

/// Accepts connections until `shutdown` turns true.
pub async fn run(node: Arc<NodeState>, mut listener: Box<dyn Listener>, mut shutdown: watch::Receiver<bool>) {
    let mut pending: VecDeque<tokio::task::JoinHandle<()>> = VecDeque::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok(connection) => {
                    pending.retain(|h| !h.is_finished());
                    if pending.len() >= HANDSHAKES_MAX
                        && let Some(oldest) = pending.pop_front()
                    {
                        // Idle strangers cannot lock peers out: the oldest waiting one goes.
                        warn!("Too many connections in handshake; dropping the oldest.");
                        oldest.abort();
                    }
                    pending.push_back(tokio::spawn(handshake(node.clone(), connection)));
                }
                Err(e) => {
                    warn!(error = %e, "Accept failed.");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
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
    secure: Option<SecureChannel>,
    /// The preamble was wrong (not linkbus, or another mode): safe to say so in plaintext.
    preamble: bool,
}

fn refusal(reason: impl Into<String>, code: CloseCode, secure: Option<SecureChannel>) -> Refusal {
    Refusal { reason: reason.into(), code, secure, preamble: false }
}

/// Reads the preamble, runs the listener's side of the handshake (identifying the peer by
/// its static key and refusing replays), then reads the peer's `Hello`.
async fn open(
    node: &NodeState,
    connection: &mut Connection,
    frame_bytes_max: usize,
) -> Result<Opening, Refusal> {
    let mut secure =
        node.security.listener().map_err(|e| refusal(e.to_string(), CloseCode::ProtocolError, None))?;
    let mut decoder = FrameDecoder::new(frame_bytes_max);
    let mut proven = None;
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
                return Err(refusal(
                    format!("expected a linkbus hello: {e}"),
                    CloseCode::ProtocolError,
                    Some(secure),
                ));
            }
        }
        let n = match connection.reader.read(&mut buf).await {
            Ok(0) => return Err(refusal("closed before its hello", CloseCode::ProtocolError, None)),
            Ok(n) => n,
            Err(e) => return Err(refusal(format!("read failed: {e}"), CloseCode::ProtocolError, None)),
        };
        if let Err(e) = secure.handle_bytes(buf.get(..n).unwrap_or_default()) {
            let preamble = matches!(e, SecureError::Preamble | SecureError::Mode { .. });
            return Err(Refusal { preamble, ..refusal(e.to_string(), CloseCode::ProtocolError, None) });
        }
        if let Some((key, stamp)) = secure.identity() {
            let Some(peer) = node.security.identify(&key).cloned() else {
                return Err(refusal("unknown static key", CloseCode::UnknownPeer, None));
            };
            match node.security.check_fresh(&peer, stamp, crate::clock::unix_ms()) {
                Ok(()) => {}
                Err(crate::security::Stale::Replayed) => {
                    return Err(refusal(
                        format!("replayed handshake from {peer}"),
                        CloseCode::ProtocolError,
                        None,
                    ));
                }
                Err(crate::security::Stale::Ahead { by_ms, max_s }) => {
                    let reason = format!(
                        "handshake from {peer} is stamped {:.1} s ahead of this node's clock, more than \
                         security.clock_skew_max_s ({max_s} s) allows: set the clocks right, or raise it",
                        by_ms as f64 / 1000.0
                    );
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

async fn handshake(node: Arc<NodeState>, mut connection: Connection) {
    let links = &node.config.links;
    let timeout = Duration::from_millis(links.handshake_timeout_ms);
    // Only a hello is expected; bound what a stranger can make us buffer.
    let limit = (links.frame_bytes_max as usize).min(64 * 1024);
    let address = connection.peer_address.clone();
    let opening = match tokio::time::timeout(timeout, open(&node, &mut connection, limit)).await {
        Ok(Ok(opening)) => opening,
        Ok(Err(r)) => {
            warn!(%address, reason = r.reason, "Refused connection.");
            // Before the channel is up, a Noise listener tells a stranger nothing but a
            // wrong preamble or mode (the reason could name a peer).
            let silent = node.security.mode == Mode::Noise && r.secure.is_none() && !r.preamble;
            if silent {
                return;
            }
            return refuse(connection, r.secure, r.code, &r.reason);
        }
        Err(_) => {
            warn!(%address, "Refused connection: no hello in time.");
            return refuse(connection, None, CloseCode::ProtocolError, "no hello in time");
        }
    };
    let Opening { secure, hello, leftover, proven } = opening;
    if let Err(r) = check_hello(&node, &hello, proven.as_ref().map(|(peer, _)| peer)) {
        warn!(%address, from = hello.from, reason = r.0, "Refused connection.");
        return refuse(connection, Some(secure), r.1, &r.0);
    }
    let Some(link) = NodeName::new(&hello.from).ok().and_then(|name| node.links.get(&name)) else { return };
    if let Some((peer, stamp)) = &proven {
        // Only now, with a hello decrypted under the session keys, does the stamp count.
        node.security.record_handshake(peer, *stamp);
    }
    info!(%address, peer = hello.from, "Accepted connection.");
    link.offer(Incoming { connection, hello: Some(hello), leftover, secure });
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
    let known = NodeName::new(&hello.from).ok().filter(|name| node.links.contains_key(name));
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
