//! A TCP fault proxy on 127.0.0.1 for link tests: forwards connections to a target and, on
//! command, cuts every connection (now, or each one after it carried so many bytes),
//! black-holes traffic (reads it, forwards nothing), stalls it (stops reading, so it queues
//! up), trickles it one byte per write, limits it to so many bytes a second, or flips one
//! bit in every so many bytes. Threads only; everything stops when the proxy drops.

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
    /// Plaintext links only: every this many data frames, send one twice (0: never).
    duplicate_every: AtomicUsize,
    /// Plaintext links only: every this many data frames, swap it with the next one.
    swap_every: AtomicUsize,
    /// Plaintext links only: drop every this many acknowledgement frames.
    drop_ack_every: AtomicUsize,
    /// Frames duplicated, swapped and dropped so far.
    frame_faults: AtomicUsize,
    /// Connections are parsed into plaintext link frames (set before any connection).
    framed: AtomicBool,
    /// Cut a connection once one direction of it carried this many bytes (0: never).
    cut_after_bytes: AtomicUsize,
    /// Connections cut that way so far.
    cuts: AtomicUsize,
    /// Bytes a second each direction of a connection carries (0: no limit).
    rate: AtomicUsize,
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
                        // Only the dialer's direction starts with the 6-byte preamble.
                        let (c, v) = (client.try_clone().expect("clone"), server.try_clone().expect("clone"));
                        pump(c, v, modes.clone(), 6);
                        pump(server, client, modes.clone(), 0);
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

    /// Cuts every connection once one of its directions carried `bytes` bytes (0 turns it
    /// off), so no connection lives long enough to carry more.
    pub fn set_cut_after_bytes(&self, bytes: usize) {
        self.modes.cut_after_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Connections cut by [`FaultProxy::set_cut_after_bytes`] so far.
    pub fn cuts(&self) -> usize {
        self.modes.cuts.load(Ordering::Relaxed)
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

    /// Limits each direction of every connection to `bytes_per_s` (0 turns it off).
    pub fn set_rate(&self, bytes_per_s: usize) {
        self.modes.rate.store(bytes_per_s, Ordering::Relaxed);
    }

    /// Flips one bit in every `bytes` forwarded bytes (0 turns it off).
    pub fn set_flip_every(&self, bytes: usize) {
        self.modes.flip_every.store(bytes, Ordering::Relaxed);
    }

    /// Parses new connections as plaintext link frames, so frame faults can be applied
    /// (call before the nodes connect; only for plaintext links).
    pub fn set_framed(&self) {
        self.modes.framed.store(true, Ordering::Relaxed);
    }

    /// Plaintext links: duplicates every `n`-th data frame, swaps every `m`-th with the next,
    /// drops every `k`-th acknowledgement (0 turns a fault off).
    pub fn set_frame_faults(&self, n: usize, m: usize, k: usize) {
        self.modes.duplicate_every.store(n, Ordering::Relaxed);
        self.modes.swap_every.store(m, Ordering::Relaxed);
        self.modes.drop_ack_every.store(k, Ordering::Relaxed);
    }

    /// Frames duplicated, swapped or dropped so far.
    pub fn frame_faults(&self) -> usize {
        self.modes.frame_faults.load(Ordering::Relaxed)
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

/// Splits plaintext link traffic into frames (after the 6-byte preamble) and applies the
/// frame faults; returns the bytes to forward.
struct Framer {
    buf: Vec<u8>,
    preamble_left: usize,
    data_frames: usize,
    acks: usize,
    /// A data frame held back to be sent after the next one (a swap).
    held: Option<Vec<u8>>,
}

const TYPE_DATA: u8 = 2;
const TYPE_ACK: u8 = 3;

impl Framer {
    fn new(preamble: usize) -> Self {
        Self { buf: Vec::new(), preamble_left: preamble, data_frames: 0, acks: 0, held: None }
    }

    fn feed(&mut self, bytes: &[u8], modes: &Modes) -> Vec<u8> {
        let mut out = Vec::new();
        let mut bytes = bytes;
        let skip = self.preamble_left.min(bytes.len());
        out.extend_from_slice(&bytes[..skip]);
        self.preamble_left -= skip;
        bytes = &bytes[skip..];
        self.buf.extend_from_slice(bytes);
        while self.buf.len() >= 5 {
            let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
            if self.buf.len() < 4 + len {
                break;
            }
            let frame: Vec<u8> = self.buf.drain(..4 + len).collect();
            self.apply(frame, modes, &mut out);
        }
        out
    }

    fn apply(&mut self, frame: Vec<u8>, modes: &Modes, out: &mut Vec<u8>) {
        let every = |n: &AtomicUsize, count: usize| {
            let n = n.load(Ordering::Relaxed);
            n > 0 && count.is_multiple_of(n)
        };
        match frame.get(4).copied() {
            Some(TYPE_ACK) => {
                self.acks += 1;
                if every(&modes.drop_ack_every, self.acks) {
                    modes.frame_faults.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                out.extend_from_slice(&frame);
            }
            Some(TYPE_DATA) => {
                self.data_frames += 1;
                if let Some(held) = self.held.take() {
                    out.extend_from_slice(&frame);
                    out.extend_from_slice(&held);
                    return;
                }
                if every(&modes.swap_every, self.data_frames) {
                    modes.frame_faults.fetch_add(1, Ordering::Relaxed);
                    self.held = Some(frame);
                    return;
                }
                out.extend_from_slice(&frame);
                if every(&modes.duplicate_every, self.data_frames) {
                    modes.frame_faults.fetch_add(1, Ordering::Relaxed);
                    out.extend_from_slice(&frame);
                }
            }
            _ => {
                // Anything else first releases a held frame, so nothing waits forever.
                if let Some(held) = self.held.take() {
                    out.extend_from_slice(&held);
                }
                out.extend_from_slice(&frame);
            }
        }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, modes: Arc<Modes>, preamble: usize) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut since_flip = 0usize;
        let mut carried = 0usize;
        let mut framer = modes.framed.load(Ordering::Relaxed).then(|| Framer::new(preamble));
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
            let mut framed;
            let chunk: &mut [u8] = if let Some(framer) = framer.as_mut() {
                framed = framer.feed(&buf[..n], &modes);
                &mut framed
            } else {
                &mut buf[..n]
            };
            let n = chunk.len();
            if n == 0 {
                continue;
            }
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
            let rate = modes.rate.load(Ordering::Relaxed);
            if rate > 0 {
                std::thread::sleep(Duration::from_secs_f64(n as f64 / rate as f64));
            }
            carried += n;
            let limit = modes.cut_after_bytes.load(Ordering::Relaxed);
            if limit > 0 && carried >= limit {
                modes.cuts.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
