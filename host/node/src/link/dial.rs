//! Dialing a peer: connecting, the dialer's side of the handshake, and what a failure
//! means for the user (a wrong key looks like the peer closing without an answer, a wrong
//! cluster key like an answer that does not decrypt), with the backoff between attempts.

use std::time::Duration;

use bytes::BytesMut;
use linkbus_plugin_api::Connection;
use linkbus_proto::secure::SecureChannel;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{debug, warn};

use super::{Incoming, Link};
use crate::warnings::reason;

/// Why dialing a peer failed; the handshake failures are what a wrong key looks like.
#[derive(Debug)]
pub(crate) enum DialError {
    /// The connection could not be made (the peer is down, or unreachable).
    Connect(String),
    /// The peer closed the connection before answering the handshake: it refused it.
    PeerClosed,
    /// The handshake failed on this side.
    Secure(linkbus_proto::secure::SecureError),
    /// Reading or writing failed during the handshake.
    Io(String),
    /// No answer within `links.handshake_timeout_ms`.
    TimedOut,
}

impl DialError {
    /// Whether the failure came from the handshake (a wrong key or cluster key), not from
    /// reaching the peer.
    pub(crate) fn is_handshake(&self) -> bool {
        matches!(self, Self::PeerClosed | Self::Secure(_) | Self::TimedOut)
    }
}

/// Dialer: runs the secure channel's handshake on a fresh connection; returns the channel
/// and any plaintext that arrived with the last handshake bytes.
///
/// # Errors
/// A [`DialError`] when the handshake fails, the peer closes, or `timeout` passes.
pub(crate) async fn secure_dial(
    connection: &mut Connection,
    mut channel: SecureChannel,
    timeout: std::time::Duration,
) -> Result<(SecureChannel, BytesMut), DialError> {
    let handshake = async {
        if let Some(bytes) = channel.poll_transmit() {
            connection
                .writer
                .write_all(&bytes)
                .await
                .map_err(|e| DialError::Io(format!("write failed: {e}")))?;
        }
        let mut buf = vec![0u8; 16 * 1024];
        while !channel.is_established() {
            let n = connection
                .reader
                .read(&mut buf)
                .await
                .map_err(|e| DialError::Io(format!("read failed: {e}")))?;
            if n == 0 {
                return Err(DialError::PeerClosed);
            }
            channel.handle_bytes(buf.get(..n).unwrap_or_default()).map_err(DialError::Secure)?;
        }
        let leftover = channel.take_plaintext().map(BytesMut::from).unwrap_or_default();
        Ok((channel, leftover))
    };
    tokio::time::timeout(timeout, handshake).await.map_err(|_| DialError::TimedOut)?
}

impl Link {
    pub(super) fn dial_due(&self) -> Option<tokio::time::Instant> {
        if self.active.is_some() || self.dialing || self.handle.stopped().is_some() {
            return None;
        }
        let wanted = self.handle.peer.permanent || self.handle.queued() > 0 || self.session.in_flight() > 0;
        self.next_dial.filter(|_| wanted)
    }

    pub(super) fn start_dial(&mut self) {
        let Some(address) = self.handle.peer.address.clone() else { return };
        self.dialing = true;
        let node = self.node.clone();
        let peer = self.handle.peer.name.clone();
        let tx = self.dial_tx.clone();
        let links = &self.node.config().links;
        let (connect_timeout, handshake_timeout) = (
            Duration::from_millis(links.connect_timeout_ms),
            Duration::from_millis(links.handshake_timeout_ms),
        );
        tokio::spawn(async move {
            let result = async {
                let mut connection =
                    match tokio::time::timeout(connect_timeout, node.transport().connect(&address)).await {
                        Ok(result) => result.map_err(|e| DialError::Connect(e.to_string()))?,
                        Err(_) => return Err(DialError::Connect(format!("connect {address}: timed out"))),
                    };
                let channel =
                    node.security().dialer(&peer, crate::clock::unix_ms()).map_err(DialError::Secure)?;
                let (secure, leftover) = secure_dial(&mut connection, channel, handshake_timeout).await?;
                Ok(Incoming { connection, hello: None, leftover, secure })
            }
            .await;
            let _ = tx.send(result).await;
        });
    }

    pub(super) fn dialed(&mut self, result: Result<Incoming, DialError>) {
        self.dialing = false;
        match result {
            Ok(incoming) => self.adopt(incoming, true),
            Err(e) => {
                let delay = self.backoff.take();
                let reason = self.dial_failure(&e);
                self.handle.note_error(&reason);
                if e.is_handshake() && self.node.warnings().admit(reason::HANDSHAKE_FAILED) {
                    warn!(
                        peer = self.peer(),
                        reason,
                        retry_ms = delay.as_millis() as u64,
                        "Link handshake failed."
                    );
                } else {
                    debug!(peer = self.peer(), reason, retry_ms = delay.as_millis() as u64, "Dial failed.");
                }
                self.next_dial = Some(tokio::time::Instant::now() + delay);
            }
        }
    }

    /// What a failed dial means, with the configuration keys to check.
    pub(super) fn dial_failure(&self, error: &DialError) -> String {
        let peer = self.peer();
        let address = self.handle.peer.address.as_deref().unwrap_or("-");
        match error {
            DialError::Connect(e) => format!("cannot reach {peer} at {address} (peers[{peer}].address): {e}"),
            DialError::PeerClosed => {
                let ours = self.node.security().public_key().map(|k| linkbus_proto::secure::hex(&k));
                format!(
                    "{peer} refused the handshake (closed the connection without an answer): check that \
                     peers[{peer}].public_key here is {peer}'s public key, and that {peer} lists this node's \
                     public key ({}) among its peers (else the clocks differ by more than \
                     security.clock_skew_max_s, or {peer} is flooded with connections); {peer}'s log names \
                     the cause",
                    ours.as_deref().unwrap_or("none")
                )
            }
            DialError::Secure(e) => format!("handshake with {peer} failed: {e}"),
            DialError::Io(e) => format!("handshake with {peer} failed: {e}"),
            DialError::TimedOut => format!(
                "{peer} did not answer the handshake within links.handshake_timeout_ms ({} ms)",
                self.node.config().links.handshake_timeout_ms
            ),
        }
    }
}
