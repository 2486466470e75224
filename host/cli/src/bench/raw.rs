//! The baselines that involve no node: a raw length-prefixed TCP stream, a raw TCP
//! ping-pong and the disk's raw write-and-sync rate (and the pieces of them that the
//! socket hops of [`super::hops`] share).

use std::path::Path;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};

use super::pace;
use crate::demo::{DemoError, is_payload, payload};

/// The same payloads as a raw length-prefixed TCP stream on 127.0.0.1 with buffered writes,
/// each checked where it is read: messages per second.
pub(super) async fn raw_tcp(messages: usize, size: usize) -> Result<f64, DemoError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let reader = tokio::spawn(async move {
        let (stream, _) = listener.accept().await?;
        read_checked(stream, messages, size).await
    });
    let started = Instant::now();
    // On a task of its own, as the nodes' clients are.
    let writer = tokio::spawn(async move {
        write_payloads(tokio::net::TcpStream::connect(address).await?, messages, size).await
    });
    writer.await.map_err(std::io::Error::other)??;
    let intact = reader.await.map_err(std::io::Error::other)??;
    let elapsed = started.elapsed();
    if intact != messages {
        return Err(DemoError::Io(std::io::Error::other(format!("raw TCP: {intact} of {messages} intact"))));
    }
    Ok(messages as f64 / elapsed.as_secs_f64().max(1e-9))
}

/// Writes `messages` numbered payloads of `size` bytes to `stream`, each after its `u32`
/// big-endian length, in buffered writes.
pub(super) async fn write_payloads<W: AsyncWrite + Unpin>(
    stream: W,
    messages: usize,
    size: usize,
) -> std::io::Result<()> {
    let mut w = BufWriter::with_capacity(256 << 10, stream);
    for i in 0..messages {
        let p = payload(i, size);
        w.write_u32(p.len() as u32).await?;
        w.write_all(&p).await?;
    }
    w.flush().await
}

/// Reads what [`write_payloads`] wrote: how many of the `messages` payloads arrived intact.
pub(super) async fn read_checked<R: AsyncRead + Unpin>(
    stream: R,
    messages: usize,
    size: usize,
) -> std::io::Result<usize> {
    let mut r = BufReader::with_capacity(256 << 10, stream);
    let mut buf = vec![0u8; size.max(16)];
    let mut intact = 0usize;
    for i in 0..messages {
        let len = r.read_u32().await? as usize;
        if len > buf.len() {
            buf.resize(len, 0);
        }
        r.read_exact(&mut buf[..len]).await?;
        intact += usize::from(is_payload(i, size, &buf[..len]));
    }
    Ok(intact)
}

/// The same ping-pong over one raw TCP connection: round-trip times and rounds per second.
pub(super) async fn raw_ping_pong(rounds: usize) -> Result<(Vec<Duration>, f64), DemoError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let echoed = tokio::spawn(async move {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        echo(stream, rounds).await
    });
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream.set_nodelay(true)?;
    let pinged = tokio::spawn(async move { pings(&mut stream, rounds).await });
    let (times, per_s) = pinged.await.map_err(std::io::Error::other)??;
    echoed.await.map_err(std::io::Error::other)??;
    Ok((times, per_s))
}

/// The echoing end of a raw ping-pong: sends each of `rounds` length-prefixed messages back.
pub(super) async fn echo<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    rounds: usize,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64];
    for _ in 0..rounds {
        let len = stream.read_u32().await? as usize;
        buf.resize(len, 0);
        stream.read_exact(&mut buf).await?;
        stream.write_u32(len as u32).await?;
        stream.write_all(&buf).await?;
    }
    Ok(())
}

/// The pinging end of a raw ping-pong (paced as `w3`'s): round-trip times and rounds per
/// second.
pub(super) async fn pings<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    rounds: usize,
) -> Result<(Vec<Duration>, f64), DemoError> {
    let mut times = Vec::with_capacity(rounds);
    let mut buf = vec![0u8; 64];
    let started = Instant::now();
    for i in 0..rounds {
        pace(started, i).await;
        let sent = Instant::now();
        let p = payload(i, 64);
        let mut frame = Vec::with_capacity(4 + p.len());
        frame.extend_from_slice(&(p.len() as u32).to_be_bytes());
        frame.extend_from_slice(&p);
        stream.write_all(&frame).await?;
        let len = stream.read_u32().await? as usize;
        buf.resize(len, 0);
        stream.read_exact(&mut buf).await?;
        if !is_payload(i, 64, &buf) {
            return Err(DemoError::Io(std::io::Error::other(format!(
                "raw ping-pong: round {i} came back wrong"
            ))));
        }
        times.push(sent.elapsed());
    }
    Ok((times, rounds as f64 / started.elapsed().as_secs_f64().max(1e-9)))
}

/// 1 KiB writes to a file, each followed by `fdatasync`, per second.
pub(super) fn raw_syncs(dir: &Path, duration: Duration) -> Result<f64, DemoError> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let mut file = std::fs::File::create(dir.join("raw-syncs"))?;
    let block = [7u8; 1024];
    let started = Instant::now();
    let mut synced = 0u64;
    while started.elapsed() < duration {
        file.write_all(&block)?;
        file.sync_data()?;
        synced += 1;
    }
    Ok(synced as f64 / started.elapsed().as_secs_f64().max(1e-9))
}
