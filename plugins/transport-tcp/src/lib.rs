//! The `tcp` transport plugin: links over plain TCP byte streams.
//!
//! Addresses are `HOST:PORT` socket addresses (`127.0.0.1:7401`, `[::1]:7401`); port `0`
//! on a listen address picks a free port, which [`Listener::local_address`] then reports.
//! Nagle's algorithm is off: the link session already batches frames into few writes.
//!
//! Configuration: `plugins: { transport: { kind: tcp } }` (no other keys yet).
#![forbid(unsafe_code)]

use std::net::SocketAddr;

use linkbus_plugin_api::registry::{BuildContext, Factory, PluginEntry, PluginError};
use linkbus_plugin_api::{BoxFuture, ConfigValue, Connection, Listener, Section, Transport, TransportError};
use tokio::net::{TcpListener, TcpStream};

/// The `tcp` transport.
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpTransport;

fn parse(address: &str) -> Result<SocketAddr, TransportError> {
    address.parse().map_err(|e: std::net::AddrParseError| TransportError::BadAddress {
        address: address.to_owned(),
        reason: format!("{e}; expected HOST:PORT with a numeric IP, e.g. 127.0.0.1:7401"),
    })
}

fn connection(stream: TcpStream, peer: SocketAddr) -> Connection {
    // A failure here only costs latency, never correctness.
    let _ = stream.set_nodelay(true);
    let (reader, writer) = stream.into_split();
    Connection { reader: Box::new(reader), writer: Box::new(writer), peer_address: peer.to_string() }
}

struct TcpAcceptor {
    listener: TcpListener,
    local: String,
}

impl Listener for TcpAcceptor {
    fn local_address(&self) -> String {
        self.local.clone()
    }

    fn accept(&mut self) -> BoxFuture<'_, Result<Connection, TransportError>> {
        Box::pin(async move {
            let (stream, peer) = self.listener.accept().await.map_err(|source| TransportError::Io {
                op: "accept",
                address: self.local.clone(),
                source,
            })?;
            Ok(connection(stream, peer))
        })
    }
}

impl Transport for TcpTransport {
    fn check_address(&self, address: &str) -> Result<(), TransportError> {
        parse(address).map(|_| ())
    }

    fn listen<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<Box<dyn Listener>, TransportError>> {
        Box::pin(async move {
            let addr = parse(address)?;
            let io = |source| TransportError::Io { op: "listen", address: address.to_owned(), source };
            let listener = TcpListener::bind(addr).await.map_err(io)?;
            let local = listener.local_addr().map_err(io)?.to_string();
            Ok(Box::new(TcpAcceptor { listener, local }) as Box<dyn Listener>)
        })
    }

    fn connect<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<Connection, TransportError>> {
        Box::pin(async move {
            let addr = parse(address)?;
            let stream = TcpStream::connect(addr).await.map_err(|source| TransportError::Io {
                op: "connect",
                address: address.to_owned(),
                source,
            })?;
            Ok(connection(stream, addr))
        })
    }
}

fn check(_section: &Section<'_>) {}

fn build(_config: &ConfigValue, _ctx: &BuildContext) -> Result<Box<dyn Transport>, PluginError> {
    Ok(Box::new(TcpTransport))
}

inventory::submit! {
    PluginEntry {
        name: "tcp",
        summary: "plain TCP byte streams between nodes",
        check,
        factory: Factory::Transport(build),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_cross_a_loopback_connection() {
        let t = TcpTransport;
        let mut listener = t.listen("127.0.0.1:0").await.unwrap();
        let addr = listener.local_address();
        assert!(!addr.ends_with(":0"), "the real port is reported");
        let (mut client, server) = tokio::join!(async { t.connect(&addr).await.unwrap() }, listener.accept());
        let mut server = server.unwrap();
        client.writer.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        server.reader.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
    }

    #[test]
    fn bad_addresses_are_explained() {
        let err = TcpTransport.check_address("localhost:x").unwrap_err();
        assert!(err.to_string().contains("HOST:PORT"), "{err}");
    }
}
