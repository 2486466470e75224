//! The `Transport` extension point: how nodes reach each other as byte streams.
//!
//! A transport only opens connections; framing, sequencing and security belong to the link
//! session above it. Transports are linked statically (async code does not cross a C ABI).

use std::future::Future;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};

/// A boxed future, as returned by the object-safe async methods of this module.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One established byte stream to a peer, split so that reading and writing never share a
/// lock.
pub struct Connection {
    /// Bytes from the peer.
    pub reader: Box<dyn AsyncRead + Send + Unpin>,
    /// Bytes to the peer.
    pub writer: Box<dyn AsyncWrite + Send + Unpin>,
    /// The peer's address as the transport writes it, for logs.
    pub peer_address: String,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("peer_address", &self.peer_address).finish_non_exhaustive()
    }
}

/// Why a transport operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The address cannot be parsed by this transport.
    #[error("bad address '{address}': {reason}")]
    BadAddress {
        /// The address as given.
        address: String,
        /// Why it is not valid.
        reason: String,
    },
    /// The operating system refused or broke the operation.
    #[error("{op} {address}: {source}")]
    Io {
        /// `listen`, `connect` or `accept`.
        op: &'static str,
        /// The address involved.
        address: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// Accepts incoming connections on one bound address.
pub trait Listener: Send {
    /// The address actually bound (with the port filled in when `:0` was asked for).
    fn local_address(&self) -> String;

    /// Waits for the next incoming connection.
    fn accept(&mut self) -> BoxFuture<'_, Result<Connection, TransportError>>;
}

/// A way to open byte streams between nodes (`tcp` by default).
pub trait Transport: Send + Sync {
    /// Checks an address without opening anything, so configuration can reject it early.
    ///
    /// # Errors
    /// [`TransportError::BadAddress`] saying why.
    fn check_address(&self, address: &str) -> Result<(), TransportError>;

    /// Binds `address` and returns a listener.
    fn listen<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<Box<dyn Listener>, TransportError>>;

    /// Opens a connection to `address`.
    fn connect<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<Connection, TransportError>>;
}
