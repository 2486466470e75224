//! A TCP fault proxy on 127.0.0.1 for link tests: forwards connections to a target and can
//! cut every connection, or black-hole traffic (accept and read it, forward nothing), on
//! command. Threads only; everything stops when the proxy drops.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// See the module doc.
pub struct FaultProxy {
    /// Where clients connect.
    pub address: String,
    blackhole: Arc<AtomicBool>,
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
            blackhole: Arc::new(AtomicBool::new(false)),
            stopped: Arc::new(AtomicBool::new(false)),
            streams: Arc::new(Mutex::new(Vec::new())),
        };
        let (blackhole, stopped, streams) =
            (proxy.blackhole.clone(), proxy.stopped.clone(), proxy.streams.clone());
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
                            blackhole.clone(),
                        );
                        pump(server, client, blackhole.clone());
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
        self.blackhole.store(on, Ordering::Relaxed);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.cut();
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, blackhole: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if blackhole.load(Ordering::Relaxed) {
                continue;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
