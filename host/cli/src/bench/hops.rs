//! The socket hops a message crosses between two nodes' socket clients, carrying the bytes
//! alone: a Unix socket into a forwarder (node A's place), a TCP connection of the `tcp`
//! transport plugin with its default settings (as the nodes' link) to a second forwarder
//! (node B's), a Unix socket out of it. The forwarders copy what they read, unparsed, in
//! reads of up to 256 KiB (a link reads as much; a node reads a large request from a
//! client socket into a buffer with room for all of it); nothing is queued, routed,
//! acknowledged or checked on the way. What is left of `w1`'s and `w3`'s gap to raw TCP
//! once this is taken out is the nodes' own work.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use linkbus_plugin_api::transport::{Connection, Transport};
use linkbus_transport_tcp::TcpTransport;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;

use super::NEXT_SCRATCH;
use super::raw::{echo, pings, read_checked, write_payloads};
use crate::demo::DemoError;

/// What a forwarder reads at a time, each way.
const FORWARD_BYTES: usize = 256 << 10;

/// Longest a run through the hops may take: a forwarder that stalls fails the run instead
/// of hanging it.
const RUN_TIME_MAX: Duration = Duration::from_secs(300);

/// A producer's way in, through the two forwarders, to a listener at the far end.
struct Hops {
    /// Where the producer connects (a Unix socket).
    entry: PathBuf,
    /// The forwarders: stopped when this drops.
    forwarders: JoinSet<std::io::Result<()>>,
}

impl Hops {
    /// Binds the entry, the TCP hop and the exit in their own directory under `scratch`,
    /// and starts the forwarders (each serves one connection); the hops and where the far
    /// end is reached (a Unix socket the second forwarder connects to).
    async fn start(scratch: &Path) -> Result<(Self, UnixListener), DemoError> {
        let dir = scratch.join(format!("hops-{}", NEXT_SCRATCH.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir_all(&dir)?;
        let (entry, exit_path) = (dir.join("in.sock"), dir.join("out.sock"));
        let into_first = UnixListener::bind(&entry)?;
        let exit = UnixListener::bind(&exit_path)?;
        let transport = TcpTransport::default();
        let mut between = transport.listen("127.0.0.1:0").await.map_err(std::io::Error::other)?;
        let second_at = between.local_address();
        let mut forwarders = JoinSet::new();
        forwarders.spawn(async move {
            let (from, _) = into_first.accept().await?;
            let to = transport.connect(&second_at).await.map_err(std::io::Error::other)?;
            let (read, write) = from.into_split();
            forward((read, write), (to.reader, to.writer)).await
        });
        forwarders.spawn(async move {
            let Connection { reader, writer, .. } = between.accept().await.map_err(std::io::Error::other)?;
            let (read, write) = UnixStream::connect(&exit_path).await?.into_split();
            forward((reader, writer), (read, write)).await
        });
        Ok((Self { entry, forwarders }, exit))
    }

    /// Waits for the one task in `end` (the producer's or the far end's), failing as soon
    /// as a forwarder fails (either end would wait for it for ever) or the run takes longer
    /// than [`RUN_TIME_MAX`].
    async fn finish<T>(&mut self, end: &mut JoinSet<std::io::Result<T>>) -> Result<T, DemoError>
    where
        T: Send + 'static,
    {
        let run = async {
            loop {
                tokio::select! {
                    done = end.join_next() => {
                        let done = done.ok_or_else(|| std::io::Error::other("socket hops: no task to wait for"))?;
                        return Ok(done.map_err(std::io::Error::other)??);
                    }
                    Some(ended) = self.forwarders.join_next() => {
                        ended.map_err(std::io::Error::other)?.map_err(|e| {
                            std::io::Error::new(e.kind(), format!("socket hops: a forwarder failed: {e}"))
                        })?;
                    }
                }
            }
        };
        tokio::time::timeout(RUN_TIME_MAX, run).await.map_err(|_| {
            DemoError::Io(std::io::Error::other(format!("socket hops: the run took over {RUN_TIME_MAX:?}")))
        })?
    }
}

/// Copies each way until both ends are done, as a node passes bytes on.
async fn forward<AR, AW, BR, BW>(a: (AR, AW), b: (BR, BW)) -> std::io::Result<()>
where
    AR: AsyncRead + Unpin,
    AW: AsyncWrite + Unpin,
    BR: AsyncRead + Unpin,
    BW: AsyncWrite + Unpin,
{
    tokio::try_join!(pipe(a.0, b.1), pipe(b.0, a.1)).map(|_| ())
}

/// Copies `from` to `to` in reads of up to [`FORWARD_BYTES`], then ends `to`'s writing side.
async fn pipe<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(mut from: R, mut to: W) -> std::io::Result<()> {
    let mut buf = vec![0u8; FORWARD_BYTES];
    loop {
        let n = from.read(&mut buf).await?;
        let Some(read) = buf.get(..n).filter(|read| !read.is_empty()) else {
            return to.shutdown().await;
        };
        to.write_all(read).await?;
    }
}

/// `messages` numbered payloads of `size` bytes, length-prefixed in buffered writes, through
/// the hops, each checked at the far end: messages per second.
///
/// # Errors
/// [`DemoError`] when a socket or a forwarder fails, a payload arrives damaged or not at
/// all, or the run takes longer than [`RUN_TIME_MAX`].
pub(super) async fn stream(scratch: &Path, messages: usize, size: usize) -> Result<f64, DemoError> {
    let (mut hops, exit) = Hops::start(scratch).await?;
    let mut far = JoinSet::new();
    far.spawn(async move {
        let (stream, _) = exit.accept().await?;
        read_checked(stream, messages, size).await
    });
    let started = Instant::now();
    // On a task of its own, as the nodes' clients are.
    let mut near = JoinSet::new();
    let entry = hops.entry.clone();
    near.spawn(async move { write_payloads(UnixStream::connect(&entry).await?, messages, size).await });
    hops.finish(&mut near).await?;
    let intact = hops.finish(&mut far).await?;
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
/// [`DemoError`] when a socket or a forwarder fails, a payload comes back wrong, or the
/// run takes longer than [`RUN_TIME_MAX`].
pub(super) async fn ping_pong(scratch: &Path, rounds: usize) -> Result<Vec<Duration>, DemoError> {
    let (mut hops, exit) = Hops::start(scratch).await?;
    let mut far = JoinSet::new();
    far.spawn(async move {
        let (stream, _) = exit.accept().await?;
        echo(stream, rounds).await
    });
    let mut near = JoinSet::new();
    let entry = hops.entry.clone();
    near.spawn(async move {
        let mut stream = UnixStream::connect(&entry).await?;
        let pinged = pings(&mut stream, rounds).await.map_err(std::io::Error::other);
        let _ = stream.shutdown().await;
        pinged
    });
    let (times, _) = hops.finish(&mut near).await?;
    hops.finish(&mut far).await?;
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_hops_carry_every_payload_intact_both_ways() {
        let scratch = crate::bench::Scratch::new("hops-test").expect("scratch");
        for size in [0, 64, 70_000] {
            let rate = stream(&scratch.0, 300, size).await.expect("through the hops");
            assert!(rate > 0.0, "{size} B: {rate}");
        }
        let times = ping_pong(&scratch.0, 20).await.expect("ping-pong through the hops");
        assert_eq!(times.len(), 20, "one time per round: {times:?}");
        assert!(times.iter().all(|t| *t > Duration::ZERO), "{times:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_forwarder_that_fails_fails_the_run_instead_of_hanging_it() {
        let scratch = crate::bench::Scratch::new("hops-fail").expect("scratch");
        let (mut hops, _exit) = Hops::start(&scratch.0).await.expect("hops");
        // The far end's socket is gone: the second forwarder cannot reach it.
        std::fs::remove_file(hops.entry.with_file_name("out.sock")).expect("exit removed");
        let mut near = JoinSet::new();
        let entry = hops.entry.clone();
        near.spawn(async move { write_payloads(UnixStream::connect(&entry).await?, 10, 64).await });
        // A far end that would wait for ever.
        let mut far: JoinSet<std::io::Result<()>> = JoinSet::new();
        far.spawn(std::future::pending());
        let failed = tokio::time::timeout(Duration::from_secs(30), hops.finish(&mut far))
            .await
            .expect("the run ends")
            .expect_err("a forwarder failed");
        assert!(failed.to_string().contains("a forwarder failed"), "{failed}");
    }
}
