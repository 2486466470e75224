//! Accepting links: reads the opening `Hello` of each incoming connection to learn which
//! peer it is from, refuses strangers and garbage with a clear `Close`, and hands the rest to
//! that peer's link task.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use linkbus_plugin_api::{Connection, Listener, NodeName};
use linkbus_proto::frame::{CloseCode, Hello};
use linkbus_proto::session::peek_hello;
use linkbus_proto::{FrameDecoder, PROTOCOL_VERSION};
use tokio::io::AsyncReadExt;
use tokio::sync::{Semaphore, watch};
use tracing::{info, warn};

use crate::link::{Incoming, refuse};
use crate::node::NodeState;

/// Incoming connections whose hello is being read at once; more are refused at once, so
/// strangers cannot hold unbounded memory (each may buffer up to 64 KiB for the handshake
/// timeout).
pub const HANDSHAKES_MAX: usize = 64;

/// Accepts connections until `shutdown` turns true.
pub async fn run(node: Arc<NodeState>, mut listener: Box<dyn Listener>, mut shutdown: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(HANDSHAKES_MAX));
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok(connection) => match slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        let node = node.clone();
                        tokio::spawn(async move {
                            handshake(node, connection).await;
                            drop(slot);
                        });
                    }
                    Err(_) => {
                        warn!(address = %connection.peer_address, "Refused connection: too many handshakes.");
                        refuse(connection, CloseCode::ProtocolError, "too many connections in handshake");
                    }
                },
                Err(e) => {
                    warn!(error = %e, "Accept failed.");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

async fn read_hello(
    connection: &mut Connection,
    frame_bytes_max: usize,
) -> Result<(Hello, BytesMut), String> {
    let mut decoder = FrameDecoder::new(frame_bytes_max);
    let mut buf = [0u8; 4096];
    loop {
        if let Some(hello) = peek_hello(&mut decoder).map_err(|e| e.to_string())? {
            return Ok((hello, decoder.take_buffered()));
        }
        match connection.reader.read(&mut buf).await {
            Ok(0) => return Err("closed before its hello".into()),
            Ok(n) => decoder.extend(buf.get(..n).unwrap_or_default()),
            Err(e) => return Err(format!("read failed: {e}")),
        }
    }
}

async fn handshake(node: Arc<NodeState>, mut connection: Connection) {
    let links = &node.config.links;
    let timeout = Duration::from_millis(links.handshake_timeout_ms);
    // Only a hello is expected; bound what a stranger can make us buffer.
    let limit = (links.frame_bytes_max as usize).min(64 * 1024);
    let address = connection.peer_address.clone();
    let (hello, leftover) = match tokio::time::timeout(timeout, read_hello(&mut connection, limit)).await {
        Ok(Ok(hello)) => hello,
        Ok(Err(reason)) => {
            warn!(%address, reason, "Refused connection: not a linkbus peer.");
            return refuse(
                connection,
                CloseCode::ProtocolError,
                &format!("expected a linkbus hello: {reason}"),
            );
        }
        Err(_) => {
            warn!(%address, "Refused connection: no hello in time.");
            return refuse(connection, CloseCode::ProtocolError, "no hello in time");
        }
    };
    if hello.protocol_version != PROTOCOL_VERSION {
        // Refused here, so a peer of another version never disturbs the live link.
        let reason = format!(
            "peer speaks protocol version {}, this node speaks {PROTOCOL_VERSION}",
            hello.protocol_version
        );
        warn!(%address, from = hello.from, reason, "Refused connection.");
        return refuse(connection, CloseCode::VersionMismatch, &reason);
    }
    if hello.to != node.name().as_str() {
        let reason = format!("this is node {}, not {}", node.name(), hello.to);
        warn!(%address, from = hello.from, reason, "Refused connection.");
        return refuse(connection, CloseCode::UnknownPeer, &reason);
    }
    let link = NodeName::new(&hello.from).ok().and_then(|name| node.links.get(&name));
    let Some(link) = link else {
        let reason = format!("node '{}' is not a configured peer of {}", hello.from, node.name());
        warn!(%address, reason, "Refused connection.");
        return refuse(connection, CloseCode::UnknownPeer, &reason);
    };
    info!(%address, peer = hello.from, "Accepted connection.");
    link.offer(Incoming { connection, hello: Some(hello), leftover });
}
