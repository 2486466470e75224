//! `w6`: a file sent from A to B (two node processes on 127.0.0.1, plaintext links, fjall
//! stores), against the same bytes copied from file to file over one plain TCP connection
//! on the same machine; each node's peak memory (`VmHWM`) in the note.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use linkbus_client::{Client, SendFile};

use super::{Row, Scale, median, row};
use crate::demo::DemoError;

/// The file's size in a full run.
pub(crate) const FILE_BYTES: u64 = 1 << 30;

fn failed(what: impl std::fmt::Display) -> DemoError {
    DemoError::Io(std::io::Error::other(what.to_string()))
}

/// A node process of this binary, killed when dropped.
struct NodeChild(Child);

impl Drop for NodeChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl NodeChild {
    /// Peak resident memory so far, in bytes (Linux `VmHWM`).
    fn peak_rss(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
    }
}

/// Starts `linkbus node run` for `name` in `dir`, linked to `peer`.
fn start_node(dir: &Path, name: &str, ports: (u16, u16), peer: &str) -> Result<NodeChild, DemoError> {
    let exe = std::env::current_exe().map_err(failed)?;
    let child = Command::new(exe)
        .args(["node", "run", "--name", name, "--insecure-plaintext", "--queue", "inbox"])
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", ports.0))
        .arg("--peer")
        .arg(format!("{peer}=127.0.0.1:{}", ports.1))
        .arg("--data-dir")
        .arg(dir.join(name))
        .arg("--socket")
        .arg(dir.join(format!("{name}.sock")))
        .env("LINKBUS_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(failed)?;
    Ok(NodeChild(child))
}

fn free_port() -> Result<u16, DemoError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(failed)?;
    Ok(listener.local_addr().map_err(failed)?.port())
}

async fn connect(socket: &Path) -> Result<Client, DemoError> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match Client::connect(socket).await {
            Ok(client) => return Ok(client),
            Err(e) if Instant::now() >= deadline => return Err(failed(format!("{}: {e}", socket.display()))),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Writes `size` bytes of noise to `path` (its directory made), 1 MiB at a time.
pub(crate) fn write_noise(path: &Path, size: u64) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut block = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        for word in block.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        file.write_all(&block[..n])?;
        left -= n as u64;
    }
    file.into_inner().map_err(std::io::IntoInnerError::into_error)?.sync_all()
}

/// The baseline: `source` copied to `target` over one TCP connection on 127.0.0.1 (1 MiB
/// reads and writes, the target synced at the end, as a received file is). Seconds taken.
fn socket_copy(source: &Path, target: &Path) -> std::io::Result<f64> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let target = target.to_owned();
    let started = Instant::now();
    let receiver = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut socket, _) = listener.accept()?;
        let mut out = std::fs::File::create(&target)?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = socket.read(&mut buf)?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n])?;
        }
        out.sync_all()
    });
    let mut socket = std::net::TcpStream::connect(address)?;
    let mut file = std::fs::File::open(source)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        socket.write_all(&buf[..n])?;
    }
    drop(socket);
    receiver.join().map_err(|_| std::io::Error::other("the receiver panicked"))??;
    Ok(started.elapsed().as_secs_f64())
}

/// Sends `name` as `as_name` from A to queue `to` and waits for its result; seconds taken.
async fn send_file(a: &mut Client, name: &str, as_name: &str, to: &str) -> Result<f64, DemoError> {
    let started = Instant::now();
    let send = SendFile { name: Some(as_name.to_owned()), ..SendFile::new(name, to) };
    let (_, results) = a.send_file_and_wait(send, Duration::from_secs(600)).await.map_err(failed)?;
    let delivered = results.as_ref().is_some_and(|r| {
        r.recipients.iter().all(|(_, o)| *o == Some(linkbus_host::results::Outcome::Delivered))
    });
    if !delivered {
        return Err(failed(format!("the file was not delivered: {results:?}")));
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Runs `w6`: rounds of the socket copy and the transfer in turn.
pub(crate) async fn file_transfer(scratch: &Path, scale: Scale) -> Result<Row, DemoError> {
    // (A quick run sends 16 MiB: it shows the workload runs, not how fast.)
    let size = if scale.divisor > 1 { 16 << 20 } else { FILE_BYTES };
    let dir: PathBuf = scratch.join("w6");
    let a_files = dir.join("A").join("files");
    std::fs::create_dir_all(&a_files).map_err(failed)?;
    let source = a_files.join("big.bin");
    write_noise(&source, size).map_err(failed)?;
    let (a_port, b_port) = (free_port()?, free_port()?);
    let a_node = start_node(&dir, "A", (a_port, b_port), "B")?;
    let b_node = start_node(&dir, "B", (b_port, a_port), "A")?;
    let mut a = connect(&dir.join("A.sock")).await?;
    connect(&dir.join("B.sock")).await?;
    let (mut copies, mut sends) = (Vec::new(), Vec::new());
    for round in 0..scale.rounds {
        let copy = dir.join(format!("copy-{round}.bin"));
        let seconds = tokio::task::spawn_blocking({
            let (source, copy) = (source.clone(), copy.clone());
            move || socket_copy(&source, &copy)
        })
        .await
        .map_err(failed)?
        .map_err(failed)?;
        copies.push(1.0 / seconds);
        let _ = std::fs::remove_file(&copy);
        let as_name = format!("big-{round}.bin");
        sends.push(1.0 / send_file(&mut a, "big.bin", &as_name, "B:inbox").await?);
        let received = dir.join("B").join("files").join(&as_name);
        let same = std::fs::metadata(&received).map(|m| m.len()).map_err(failed)? == size;
        let _ = std::fs::remove_file(&received);
        if !same {
            return Err(failed("w6: the received file has another size"));
        }
    }
    let rss = |node: &NodeChild| {
        node.peak_rss().map_or("?".to_owned(), |b| format!("{:.1} MiB", b as f64 / 1048576.0))
    };
    let mut note = format!(
        "peak RSS A {}, B {}; plaintext links, fjall stores, chunks of 256 KiB, window 16 MiB",
        rss(&a_node),
        rss(&b_node)
    );
    let rounds = super::rounds_note(&sends, &copies);
    if !rounds.is_empty() {
        note = format!("{note}; {rounds}");
    }
    let case = format!("a {} file A -> B (linkbus file send)", size_text(size));
    let size_bytes = usize::try_from(size).unwrap_or(usize::MAX);
    Ok(row(
        "w6",
        case,
        size_bytes,
        median(&sends),
        "the same bytes over one TCP socket, file to file",
        median(&copies),
        note,
    ))
}

fn size_text(size: u64) -> String {
    if size >= 1 << 30 { format!("{} GiB", size >> 30) } else { format!("{} MiB", size >> 20) }
}

/// `w7`'s second row: urgent messages (priority 9, 64 B) from A to B while files of
/// `size` bytes cross the same link one after another (nodes in this process, plaintext
/// links), against the same urgent messages on the idle link.
pub(crate) async fn urgent_under_files(scratch: &Path, scale: Scale) -> Result<Row, DemoError> {
    let size: u64 = if scale.divisor > 1 { 16 << 20 } else { 256 << 20 };
    let nodes = super::start_chain(scratch, &["A", "B"], super::Setup::default()).await?;
    let (a, b) = (nodes[0].socket_path().to_owned(), nodes[1].socket_path().to_owned());
    write_noise(&nodes[0].state().config().node.files_dir().join("load.bin"), size)?;
    let seconds = scale.duration.as_secs_f64().max(0.5) * 2.0;
    let count = ((f64::from(super::URGENT_RATE) * seconds) as usize).max(10);
    let idle = super::urgent_latencies(&a, &b, count).await?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = {
        let (stop, a) = (stop.clone(), a.clone());
        tokio::spawn(async move {
            let mut client = Client::connect(&a).await?;
            let (mut sent, started) = (0u64, Instant::now());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let as_name = format!("load-{sent}.bin");
                send_file(&mut client, "load.bin", &as_name, "B:orders").await?;
                sent += 1;
            }
            Ok::<f64, DemoError>(sent as f64 * size as f64 / started.elapsed().as_secs_f64().max(1e-9))
        })
    };
    // Let the first file fill the link before measuring.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let loaded = super::urgent_latencies(&a, &b, count).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let bytes_per_s = sender.await.map_err(std::io::Error::other)??;
    for node in nodes {
        node.shutdown().await;
    }
    let note = super::urgent_note(&mut loaded?, &mut { idle }, "while files cross", "the files', in MiB");
    Ok(row(
        "w7",
        format!(
            "files of {} sent A -> B one after another, with {count} urgent messages (priority 9, 64 B) at {}/s",
            size_text(size),
            super::URGENT_RATE
        ),
        1 << 20,
        bytes_per_s / f64::from(1u32 << 20),
        "the urgent messages on the idle link",
        0.0,
        note,
    ))
}
