//! A TCP fault proxy on 127.0.0.1 for link tests: forwards connections to a target and, on
//! command, cuts every connection, black-holes traffic (reads it, forwards nothing), stalls
//! it (stops reading, so it queues up), trickles it one byte per write, or flips one bit in
//! every so many bytes. Threads only; everything stops when the proxy drops.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The proxy's switches, shared with its pump threads.
#[derive(Default)]
struct Modes {
    blackhole: AtomicBool,
    stall: AtomicBool,
    trickle: AtomicBool,
    /// Flip a bit once every this many forwarded bytes (0: never).
    flip_every: AtomicUsize,
    /// Bits flipped so far.
    flipped: AtomicUsize,
}

/// See the module doc.
pub struct FaultProxy {
    /// Where clients connect.
    pub address: String,
    modes: Arc<Modes>,
    stopped: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
}

impl FaultProxy {
    /// A proxy forwarding to `target`.
    pub fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let address = listener.local_addr().expect("address").to_string();
        let proxy = Self {
            address,
            modes: Arc::new(Modes::default()),
            stopped: Arc::new(AtomicBool::new(false)),
            streams: Arc::new(Mutex::new(Vec::new())),
        };
        let (modes, stopped, streams) = (proxy.modes.clone(), proxy.stopped.clone(), proxy.streams.clone());
        let target = target.to_owned();
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(server) = TcpStream::connect(&target) else { continue };
                        client.set_nonblocking(false).expect("blocking");
                        let mut all = streams.lock().expect("lock");
                        all.push(client.try_clone().expect("clone"));
                        all.push(server.try_clone().expect("clone"));
                        drop(all);
                        pump(
                            client.try_clone().expect("clone"),
                            server.try_clone().expect("clone"),
                            modes.clone(),
                        );
                        pump(server, client, modes.clone());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        proxy
    }

    /// Closes every connection open through the proxy (new ones still pass).
    pub fn cut(&self) {
        for stream in self.streams.lock().expect("lock").drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// While on, connections stay open but nothing crosses them.
    pub fn set_blackhole(&self, on: bool) {
        self.modes.blackhole.store(on, Ordering::Relaxed);
    }

    /// While on, the proxy stops reading: traffic waits (TCP buffers fill, senders block).
    pub fn set_stall(&self, on: bool) {
        self.modes.stall.store(on, Ordering::Relaxed);
    }

    /// While on, every byte is forwarded in its own write.
    pub fn set_trickle(&self, on: bool) {
        self.modes.trickle.store(on, Ordering::Relaxed);
    }

    /// Flips one bit in every `bytes` forwarded bytes (0 turns it off).
    pub fn set_flip_every(&self, bytes: usize) {
        self.modes.flip_every.store(bytes, Ordering::Relaxed);
    }

    /// Bits flipped so far.
    pub fn flipped(&self) -> usize {
        self.modes.flipped.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.cut();
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, modes: Arc<Modes>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut since_flip = 0usize;
        loop {
            while modes.stall.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
            }
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if modes.blackhole.load(Ordering::Relaxed) {
                continue;
            }
            let chunk = &mut buf[..n];
            let every = modes.flip_every.load(Ordering::Relaxed);
            if every > 0 {
                since_flip += n;
                if since_flip >= every {
                    since_flip = 0;
                    let bit = (modes.flipped.fetch_add(1, Ordering::Relaxed) * 7919) % (n * 8);
                    chunk[bit / 8] ^= 1 << (bit % 8);
                }
            }
            let written = if modes.trickle.load(Ordering::Relaxed) {
                chunk.chunks(1).try_for_each(|b| to.write_all(b))
            } else {
                to.write_all(chunk)
            };
            if written.is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
