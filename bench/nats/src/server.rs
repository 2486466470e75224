//! A `nats-server` child process on 127.0.0.1 with JetStream in a temporary directory,
//! killed by its handle when dropped (also when a workload fails).

use std::fs::File;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::Error;

/// How long the server may take to accept connections after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Between two connection attempts while waiting for the server.
const READY_POLL_INTERVAL: Duration = Duration::from_millis(20);
/// The only address the server listens on and the tool connects to.
const HOST: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// A running server; dropping it kills the process and removes its directory.
pub(crate) struct Server {
    /// The process handle, so that exactly this process is killed.
    child: Child,
    /// What clients connect to.
    url: String,
    /// Holds the JetStream store and the server's log; removed after the kill.
    dir: TempDir,
}

impl Server {
    /// Starts the server on a free port and waits until it accepts connections.
    pub(crate) async fn start(bin: &Path) -> Result<Server, Error> {
        let dir = tempfile::Builder::new().prefix("nats-baseline-").tempdir()?;
        let port = free_port()?;
        let log = File::create(dir.path().join("server.log"))?;
        let child = Command::new(bin)
            .args(["-a", &HOST.to_string(), "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir.path().join("store"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|error| spawn_error(bin, error))?;
        let mut server = Server { child, url: format!("nats://{HOST}:{port}"), dir };
        server.wait_ready(SocketAddr::from((HOST, port))).await?;
        Ok(server)
    }

    /// The URL to hand to clients.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Polls the port until it accepts; fails early if the process exits.
    async fn wait_ready(&mut self, addr: SocketAddr) -> Result<(), Error> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(format!("nats-server exited at start ({status}): {}", self.log_tail()).into());
            }
            if TcpStream::connect_timeout(&addr, READY_POLL_INTERVAL).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("nats-server did not accept within {READY_TIMEOUT:?}").into());
            }
            tokio::time::sleep(READY_POLL_INTERVAL).await;
        }
    }

    /// The last lines the server logged, to explain a failed start.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Errors here mean the process is already gone: nothing left to clean up.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The version line the server prints, e.g. `nats-server: v2.9.10`.
pub(crate) fn version(bin: &Path) -> Result<String, Error> {
    let output = Command::new(bin).arg("--version").output().map_err(|error| spawn_error(bin, error))?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// A port that was free a moment ago (the server binds it right after).
fn free_port() -> Result<u16, Error> {
    Ok(TcpListener::bind((HOST, 0))?.local_addr()?.port())
}

/// Says how to install the server when it is missing.
fn spawn_error(bin: &Path, error: std::io::Error) -> Error {
    if error.kind() == ErrorKind::NotFound {
        format!("{} not found: apt-get install -y nats-server, or pass --server-bin PATH", bin.display())
            .into()
    } else {
        format!("cannot run {}: {error}", bin.display()).into()
    }
}
