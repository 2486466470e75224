//! The socket hops a message crosses between two nodes' socket clients, carrying the bytes
//! alone: a Unix socket into a forwarder (node A's place), TCP to a second forwarder (node
//! B's), a Unix socket out of it. The forwarders copy what they read, unparsed; nothing
//! is queued, routed, acknowledged or checked on the way. What is left of `w1`'s and
//! `w3`'s gap to raw TCP once this is taken out is the nodes' own work: a client
//! protocol over sockets cannot go faster than its sockets.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::task::JoinSet;

use super::{NEXT_SCRATCH, pings, read_checked, write_payloads};
use crate::demo::DemoError;

/// What a forwarder reads at a time, each way (as the nodes' socket buffers).
const FORWARD_BYTES: usize = 256 << 10;

/// A producer's way in, through the two forwarders, to a listener at the far end.
struct Hops {
    /// Where the producer connects (a Unix socket).
    entry: PathBuf,
    /// Where the far end is reached (a Unix socket the second forwarder connects to).
    exit: UnixListener,
    /// The forwarders: stopped when this drops.
    forwarders: JoinSet<std::io::Result<()>>,
}

impl Hops {
    /// Binds the entry, the TCP hop and the exit in their own directory under `scratch`,
    /// and starts the forwarders (each serves one connection).
    async fn start(scratch: &Path) -> Result<Self, DemoError> {
        let dir =
            scratch.join(format!("hops-{}", NEXT_SCRATCH.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
        std::fs::create_dir_all(&dir)?;
        let (entry, exit_path) = (dir.join("in.sock"), dir.join("out.sock"));
        let into_first = UnixListener::bind(&entry)?;
        let exit = UnixListener::bind(&exit_path)?;
        let between = TcpListener::bind("127.0.0.1:0").await?;
        let second_at = between.local_addr()?;
        let mut forwarders = JoinSet::new();
        forwarders.spawn(async move {
            let (mut from, _) = into_first.accept().await?;
            let mut to = TcpStream::connect(second_at).await?;
            to.set_nodelay(true)?;
            forward(&mut from, &mut to).await
        });
        forwarders.spawn(async move {
            let (mut from, _) = between.accept().await?;
            from.set_nodelay(true)?;
            let mut to = UnixStream::connect(&exit_path).await?;
            forward(&mut from, &mut to).await
        });
        Ok(Self { entry, exit, forwarders })
    }
}

/// Copies each way until both ends are done, as a node passes bytes on.
async fn forward<A, B>(a: &mut A, b: &mut B) -> std::io::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    tokio::io::copy_bidirectional_with_sizes(a, b, FORWARD_BYTES, FORWARD_BYTES).await.map(|_| ())
}

/// `messages` numbered payloads of `size` bytes, length-prefixed in buffered writes, through
/// the hops, each checked at the far end: messages per second.
///
/// # Errors
/// [`DemoError`] when a socket fails or a payload arrives damaged or not at all.
pub(super) async fn stream(scratch: &Path, messages: usize, size: usize) -> Result<f64, DemoError> {
    let hops = Hops::start(scratch).await?;
    let exit = hops.exit;
    let reader = tokio::spawn(async move {
        let (stream, _) = exit.accept().await?;
        read_checked(stream, messages, size).await
    });
    let started = Instant::now();
    let entry = hops.entry;
    // On a task of its own, as the nodes' clients are.
    let writer =
        tokio::spawn(async move { write_payloads(UnixStream::connect(&entry).await?, messages, size).await });
    writer.await.map_err(std::io::Error::other)??;
    let intact = reader.await.map_err(std::io::Error::other)??;
    let elapsed = started.elapsed();
    if intact != messages {
        return Err(DemoError::Io(std::io::Error::other(format!(
            "socket hops: {intact} of {messages} intact"
        ))));
    }
    Ok(messages as f64 / elapsed.as_secs_f64().max(1e-9))
}

/// `rounds` ping-pongs of 64 B through the hops to an echo at the far end and back, paced
/// as `w3`'s: each round trip's time.
///
/// # Errors
/// [`DemoError`] when a socket fails or a payload comes back wrong.
pub(super) async fn ping_pong(scratch: &Path, rounds: usize) -> Result<Vec<Duration>, DemoError> {
    let hops = Hops::start(scratch).await?;
    let exit = hops.exit;
    let echo = tokio::spawn(async move {
        let (stream, _) = exit.accept().await?;
        super::echo(stream, rounds).await
    });
    let mut stream = UnixStream::connect(&hops.entry).await?;
    let pinged = tokio::spawn(async move {
        let times = pings(&mut stream, rounds).await;
        let _ = stream.shutdown().await;
        times
    });
    let (times, _) = pinged.await.map_err(std::io::Error::other)??;
    echo.await.map_err(std::io::Error::other)??;
    drop(hops.forwarders);
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_hops_carry_every_payload_intact_both_ways() {
        let scratch = super::super::Scratch::new("hops-test").expect("scratch");
        for size in [0, 64, 70_000] {
            let rate = stream(&scratch.0, 300, size).await.expect("through the hops");
            assert!(rate > 0.0, "{size} B: {rate}");
        }
        let times = ping_pong(&scratch.0, 20).await.expect("ping-pong through the hops");
        assert_eq!(times.len(), 20);
        assert!(times.iter().all(|t| *t > Duration::ZERO), "{times:?}");
    }
}
