//! The `tcp` transport plugin: links over plain TCP byte streams.
//!
//! Addresses are `HOST:PORT` socket addresses (`127.0.0.1:7401`, `[::1]:7401`); port `0`
//! on a listen address picks a free port, which [`Listener::local_address`] then reports.
//! Nagle's algorithm is off: the link session already batches frames into few writes.
//!
//! Configuration:
//!
//! ```yaml
//! plugins:
//!   transport:
//!     kind: tcp
//!     # Kernel socket buffers, in bytes; 0 leaves them to the kernel's autotuning. Smaller
//!     # buffers keep less data queued below the link's scheduler, so an urgent message
//!     # overtakes bulk traffic sooner on a busy link; larger ones (or 0) suit long fat
//!     # networks: a link carries at most about `receive_buffer_bytes` per round trip, so
//!     # 512 KiB is ample on a LAN (500 MB/s at a 1 ms round trip) but only 10 MB/s at
//!     # 50 ms. Linux caps both at `net.core.rmem_max` / `wmem_max` (on many systems
//!     # 208 KiB) without an error: raise those too for larger buffers.
//!     send_buffer_bytes: 0
//!     receive_buffer_bytes: 524288
//!     # Most bytes left unsent in a link socket before the link writes more (Linux:
//!     # TCP_NOTSENT_LOWAT; elsewhere ignored). It bounds what queues below the scheduler
//!     # without limiting what is in flight, so an urgent message overtakes bulk traffic
//!     # within about this many bytes; 0 leaves it to the kernel.
//!     unsent_bytes_max: 131072
//! ```
#![forbid(unsafe_code)]

use std::net::SocketAddr;

use linkbus_plugin_api::registry::{BuildContext, Factory, PluginEntry, PluginError};
use linkbus_plugin_api::{
    BoxFuture, ConfigValue, Connection, Diagnostics, Listener, Section, Transport, TransportError,
};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// The `tcp` transport.
#[derive(Debug, Clone, Copy)]
pub struct TcpTransport {
    /// `SO_SNDBUF` of every link socket (`0`: the kernel's choice).
    pub send_buffer_bytes: u32,
    /// `SO_RCVBUF` of every link socket (`0`: the kernel's choice).
    pub receive_buffer_bytes: u32,
    /// `TCP_NOTSENT_LOWAT` of every link socket (`0`: the kernel's choice).
    pub unsent_bytes_max: u32,
}

impl Default for TcpTransport {
    fn default() -> Self {
        Self {
            send_buffer_bytes: 0,
            receive_buffer_bytes: RECEIVE_BUFFER_DEFAULT,
            unsent_bytes_max: UNSENT_BYTES_DEFAULT,
        }
    }
}

/// Default of `receive_buffer_bytes`. Perf (OPT-52): left to autotuning, a busy receiver's
/// buffer grows to megabytes whenever the node falls behind, and an urgent message waits
/// behind all of it.
pub const RECEIVE_BUFFER_DEFAULT: u32 = 512 * 1024;

/// Default of `unsent_bytes_max`: about a millisecond of a loopback link's bulk traffic.
pub const UNSENT_BYTES_DEFAULT: u32 = 128 * 1024;

/// Largest socket buffer the configuration accepts.
const SOCKET_BUFFER_BYTES_MAX: u64 = 1 << 30;

impl TcpTransport {
    /// A socket for `addr` with the configured buffer sizes (set before connecting or
    /// listening, so the TCP window is sized from them).
    fn socket(&self, addr: SocketAddr) -> std::io::Result<TcpSocket> {
        let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        if self.send_buffer_bytes > 0 {
            socket.set_send_buffer_size(self.send_buffer_bytes)?;
        }
        if self.receive_buffer_bytes > 0 {
            socket.set_recv_buffer_size(self.receive_buffer_bytes)?;
        }
        Ok(socket)
    }
}

fn parse(address: &str) -> Result<SocketAddr, TransportError> {
    address.parse().map_err(|e: std::net::AddrParseError| TransportError::BadAddress {
        address: address.to_owned(),
        reason: format!("{e}; expected HOST:PORT with a numeric IP, e.g. 127.0.0.1:7401"),
    })
}

fn connection(stream: TcpStream, peer: SocketAddr, unsent_bytes_max: u32) -> Connection {
    // A failure here only costs latency, never correctness.
    let _ = stream.set_nodelay(true);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if unsent_bytes_max > 0 {
        let _ = socket2::SockRef::from(&stream).set_tcp_notsent_lowat(unsent_bytes_max);
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = unsent_bytes_max;
    let (reader, writer) = stream.into_split();
    Connection { reader: Box::new(reader), writer: Box::new(writer), peer_address: peer.to_string() }
}

struct TcpAcceptor {
    listener: TcpListener,
    local: String,
    unsent_bytes_max: u32,
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
            Ok(connection(stream, peer, self.unsent_bytes_max))
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
            let socket = self.socket(addr).map_err(io)?;
            socket.set_reuseaddr(true).map_err(io)?;
            socket.bind(addr).map_err(io)?;
            let listener: TcpListener = socket.listen(1024).map_err(io)?;
            let local = listener.local_addr().map_err(io)?.to_string();
            let unsent_bytes_max = self.unsent_bytes_max;
            Ok(Box::new(TcpAcceptor { listener, local, unsent_bytes_max }) as Box<dyn Listener>)
        })
    }

    fn connect<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<Connection, TransportError>> {
        Box::pin(async move {
            let addr = parse(address)?;
            let io = |source| TransportError::Io { op: "connect", address: address.to_owned(), source };
            let stream: TcpStream = self.socket(addr).map_err(io)?.connect(addr).await.map_err(io)?;
            Ok(connection(stream, addr, self.unsent_bytes_max))
        })
    }
}

/// Reads this plugin's section (reporting problems through the section's diagnostics).
fn read(section: &Section<'_>) -> TcpTransport {
    let bytes =
        |key, default: u32| section.number(key, u64::from(default), 0, SOCKET_BUFFER_BYTES_MAX) as u32;
    TcpTransport {
        send_buffer_bytes: bytes("send_buffer_bytes", 0),
        receive_buffer_bytes: bytes("receive_buffer_bytes", RECEIVE_BUFFER_DEFAULT),
        unsent_bytes_max: section.number(
            "unsent_bytes_max",
            u64::from(UNSENT_BYTES_DEFAULT),
            0,
            SOCKET_BUFFER_BYTES_MAX,
        ) as u32,
    }
}

fn check(section: &Section<'_>) {
    read(section);
}

fn build(config: &ConfigValue, _ctx: &BuildContext) -> Result<Box<dyn Transport>, PluginError> {
    let diag = Diagnostics::new();
    let transport = Section::new(&diag, "plugins.transport", config).map(|s| read(&s)).unwrap_or_default();
    diag.finish().map_err(|e| PluginError { plugin: "tcp".into(), reason: e.to_string() })?;
    Ok(Box::new(transport))
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
        let t = TcpTransport {
            send_buffer_bytes: 64 * 1024,
            receive_buffer_bytes: 64 * 1024,
            ..TcpTransport::default()
        };
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

    /// What `read` makes of a `plugins.transport` section, or the errors it reports.
    fn read_section(entries: Vec<(&str, ConfigValue)>) -> Result<TcpTransport, String> {
        let value = ConfigValue::Map(entries.into_iter().map(|(k, v)| (k.to_owned(), v)).collect());
        let diag = Diagnostics::new();
        let transport =
            Section::new(&diag, "plugins.transport", &value).map(|s| read(&s)).unwrap_or_default();
        diag.finish().map(|()| transport).map_err(|e| e.to_string())
    }

    #[test]
    fn unsent_bytes_max_has_a_default_takes_zero_and_refuses_what_is_out_of_range() {
        let kind = || ("kind", ConfigValue::Str("tcp".into()));
        assert_eq!(read_section(vec![kind()]).unwrap().unsent_bytes_max, UNSENT_BYTES_DEFAULT);
        let off = read_section(vec![kind(), ("unsent_bytes_max", ConfigValue::Uint(0))]).unwrap();
        assert_eq!(off.unsent_bytes_max, 0, "0 leaves it to the kernel");
        let too_big =
            read_section(vec![kind(), ("unsent_bytes_max", ConfigValue::Uint(1 << 40))]).unwrap_err();
        assert!(too_big.contains("plugins.transport.unsent_bytes_max"), "{too_big}");
        let negative = read_section(vec![kind(), ("unsent_bytes_max", ConfigValue::Int(-1))]).unwrap_err();
        assert!(negative.contains("unsent_bytes_max"), "{negative}");
    }

    #[test]
    fn the_receive_buffer_is_bounded_unless_zero_leaves_it_to_the_kernel() {
        let kind = || ("kind", ConfigValue::Str("tcp".into()));
        let default = read_section(vec![kind()]).unwrap();
        assert_eq!(default.receive_buffer_bytes, RECEIVE_BUFFER_DEFAULT);
        assert_eq!(default.send_buffer_bytes, 0, "the sending side is bounded by unsent_bytes_max");
        assert_eq!(TcpTransport::default().receive_buffer_bytes, RECEIVE_BUFFER_DEFAULT);
        let auto = read_section(vec![kind(), ("receive_buffer_bytes", ConfigValue::Uint(0))]).unwrap();
        assert_eq!(auto.receive_buffer_bytes, 0, "0 leaves it to the kernel's autotuning");
        // The bound reaches the socket (the kernel may double it, or cap it at rmem_max).
        let socket = default.socket("127.0.0.1:0".parse().unwrap()).unwrap();
        let size = socket.recv_buffer_size().unwrap();
        assert!(size > 0 && size <= 2 * RECEIVE_BUFFER_DEFAULT, "{size}");
    }

    #[test]
    fn bad_addresses_are_explained() {
        let err = TcpTransport::default().check_address("localhost:x").unwrap_err();
        assert!(err.to_string().contains("HOST:PORT"), "{err}");
    }
}
