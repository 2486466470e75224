//! A connection flood and a delaying relay for the listener's tests, both on loopback with
//! chosen source addresses (all of 127.0.0.0/8 is loopback, so the node sees distinct
//! senders without network namespaces). Threads only; bounded in count and time.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};

/// A TCP connection to `target` from `source` (an address of 127.0.0.0/8).
pub fn connect_from(source: &str, target: &str) -> std::io::Result<TcpStream> {
    let target: SocketAddr = target.parse().expect("target address");
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    let from: SocketAddr = format!("{source}:0").parse().expect("source address");
    socket.bind(&from.into())?;
    socket.connect_timeout(&target.into(), Duration::from_secs(2))?;
    Ok(socket.into())
}

/// A relay on 127.0.0.1 that forwards each connection to a target from `source`, holding
/// every byte for `delay` in each direction (a round trip of twice that).
pub struct DelayRelay {
    /// Where clients connect.
    pub address: String,
    stopped: Arc<AtomicBool>,
}

impl DelayRelay {
    /// Starts one.
    pub fn start(target: &str, source: &str, delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        listener.set_nonblocking(true).expect("nonblocking");
        let address = listener.local_addr().expect("address").to_string();
        let stopped = Arc::new(AtomicBool::new(false));
        let (target, source, stop) = (target.to_owned(), source.to_owned(), stopped.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let Ok(server) = connect_from(&source, &target) else { continue };
                client.set_nonblocking(false).expect("blocking");
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (from, to) = (from.try_clone().expect("clone"), to.try_clone().expect("clone"));
                    delayed_pump(from, to, delay, stop.clone());
                }
            }
        });
        Self { address, stopped }
    }
}

impl Drop for DelayRelay {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Relaxed);
    }
}

/// Forwards `from` to `to`, each chunk `delay` after it was read.
fn delayed_pump(mut from: TcpStream, mut to: TcpStream, delay: Duration, stopped: Arc<AtomicBool>) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = from.shutdown(Shutdown::Both);
    });
    std::thread::spawn(move || {
        while let Ok((due, bytes)) = rx.recv() {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if stopped.load(Ordering::Relaxed) || to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    });
}

/// What a flood's connections send.
#[derive(Debug, Clone, Copy)]
pub enum FloodKind {
    /// Nothing: they wait in the handshake until dropped.
    Idle,
    /// A linkbus Noise preamble and random bytes as the first handshake message.
    Garbage,
    /// Idle and garbage connections in turn.
    Mixed,
}

/// Connections opened at a steady rate from a set of source addresses until stopped (or
/// `duration` passed), each kept open until `kept` newer ones were made.
pub struct Flood {
    stopped: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    /// Starts a flood of `per_second` connections a second to `target` from `sources`,
    /// taken in turn.
    pub fn start(
        target: &str,
        sources: Vec<String>,
        per_second: u32,
        kind: FloodKind,
        duration: Duration,
    ) -> Self {
        let stopped = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicUsize::new(0));
        let (stop, count, target) = (stopped.clone(), opened.clone(), target.to_owned());
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut kept = std::collections::VecDeque::new();
            let mut made: u64 = 0;
            let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
            while !stop.load(Ordering::Relaxed) && started.elapsed() < duration {
                // Paced by the count due by now, so a slow connect does not lower the rate.
                let due = (started.elapsed().as_secs_f64() * f64::from(per_second)) as u64;
                if made >= due {
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
                let source = &sources[(made as usize) % sources.len()];
                made += 1;
                let Ok(mut stream) = connect_from(source, &target) else { continue };
                count.fetch_add(1, Ordering::Relaxed);
                let garbage = match kind {
                    FloodKind::Idle => false,
                    FloodKind::Garbage => true,
                    FloodKind::Mixed => made.is_multiple_of(2),
                };
                if garbage {
                    let mut junk = b"LBUS\x01\x02".to_vec();
                    junk.extend_from_slice(&[0, 96]);
                    for _ in 0..96 {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        junk.push(seed as u8);
                    }
                    let _ = stream.set_nonblocking(true);
                    let _ = stream.write(&junk);
                }
                kept.push_back(stream);
                // Under the common limit of 1,024 open files (the node drops them sooner).
                if kept.len() > 800 {
                    kept.pop_front();
                }
            }
        });
        Self { stopped, opened, thread: Some(thread) }
    }

    /// Connections opened so far.
    pub fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
