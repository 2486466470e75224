//! Shared harness for integration tests: real `linkbus` processes on 127.0.0.1 with
//! ephemeral ports, a scratch directory per test (configs, data, runtime directory with the
//! client sockets), bounded waits, and CLI invocations against those nodes.
//!
//! Every process a test starts is killed when its handle drops, so a failing test leaves
//! nothing running.
#![allow(dead_code, unreachable_pub)]

pub mod cluster;
pub mod flood;
pub mod history;
pub mod proxy;
pub mod soak;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The `linkbus` binary, built once per test process (a no-op when it is up to date).
pub fn linkbus_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let status = Command::new(cargo)
            .args([
                "build",
                "--quiet",
                "-p",
                "linkbus-cli",
                "--features",
                "fault-injection",
                "--bin",
                "linkbus",
            ])
            .current_dir(root)
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building the linkbus binary failed");
        let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
        let bin = target.join("debug").join("linkbus");
        assert!(bin.exists(), "{} missing after build", bin.display());
        bin
    })
}

/// A scratch directory for one test, holding configs, data and the runtime directory.
pub struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    /// A fresh, empty scratch directory.
    pub fn new() -> Self {
        Self { dir: tempfile::tempdir().expect("tempdir") }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The runtime directory clients use to find nodes by name.
    pub fn runtime_dir(&self) -> PathBuf {
        self.path().join("run")
    }

    /// Writes a file and returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path().join(name);
        std::fs::write(&path, text).expect("write file");
        path
    }

    /// A `linkbus` command with this scratch's runtime directory.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(linkbus_bin());
        // Relative paths (the default data directories) land in the scratch directory.
        cmd.args(args)
            .current_dir(self.path())
            .env("LINKBUS_RUNTIME_DIR", self.runtime_dir())
            .env_remove("LINKBUS_LOG");
        cmd
    }

    /// Runs `linkbus ARGS` to completion (bounded by `timeout`), with `stdin` as input.
    pub fn run_with_input(&self, args: &[&str], stdin: &[u8], timeout: Duration) -> Output {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn linkbus");
        let mut input = child.stdin.take().expect("stdin");
        let data = stdin.to_vec();
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            let _ = input.write_all(&data);
        });
        let output = wait_bounded(child, timeout);
        let _ = writer.join();
        output
    }

    /// Runs `linkbus ARGS` to completion, bounded by 30 s.
    pub fn run(&self, args: &[&str]) -> Output {
        self.run_with_input(args, b"", Duration::from_secs(30))
    }

    /// Makes `NAME.key` with `linkbus keygen` (and the shared `cluster.psk` once) and
    /// returns the public key.
    pub fn keys(&self, name: &str) -> String {
        let psk = self.path().join("cluster.psk");
        if !psk.exists() {
            let out = self.run(&["keygen", "--psk", "--out", psk.to_str().expect("utf-8 path")]);
            assert!(out.status.success(), "{}", stderr(&out));
        }
        let key = self.path().join(format!("{name}.key"));
        let out = self.run(&["keygen", "--out", key.to_str().expect("utf-8 path")]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).trim().to_owned()
    }

    /// The `security:` section for node `name` (after [`Scratch::keys`]).
    pub fn security_yaml(&self, name: &str) -> String {
        let dir = self.path().display();
        format!("security: {{ key_file: '{dir}/{name}.key', psk_file: '{dir}/cluster.psk' }}")
    }

    /// Starts node B (listening on a free port, writing `b.yaml`) and node A (dialing B,
    /// writing `a.yaml`) with Noise links, each configuration extended by the given
    /// top-level YAML keys, and waits until A's link to B is up.
    pub fn start_pair(&self, a_extra: &str, b_extra: &str) -> (NodeProcess, NodeProcess) {
        self.start_pair_with(a_extra, b_extra, true)
    }

    /// Like [`Scratch::start_pair`]; `secure: false` makes both links plaintext.
    pub fn start_pair_with(&self, a_extra: &str, b_extra: &str, secure: bool) -> (NodeProcess, NodeProcess) {
        self.start_pair_full(a_extra, b_extra, secure, "")
    }

    /// Like [`Scratch::start_pair`], with more keys (`b_node`, YAML flow-map entries) in B's
    /// `node:` section.
    pub fn start_pair_with_node(
        &self,
        a_extra: &str,
        b_extra: &str,
        b_node: &str,
    ) -> (NodeProcess, NodeProcess) {
        self.start_pair_full(a_extra, b_extra, true, b_node)
    }

    fn start_pair_full(
        &self,
        a_extra: &str,
        b_extra: &str,
        secure: bool,
        b_node: &str,
    ) -> (NodeProcess, NodeProcess) {
        let b_node = if b_node.is_empty() { String::new() } else { format!(", {b_node}") };
        let (a_key, b_key) =
            if secure { (self.keys("A"), self.keys("B")) } else { (String::new(), String::new()) };
        let security = |name: &str| {
            if secure {
                self.security_yaml(name)
            } else {
                "security: { insecure_plaintext: true }".to_owned()
            }
        };
        let key = |k: &str| if secure { format!(", public_key: '{k}'") } else { String::new() };
        let b_yaml = format!(
            "node: {{ name: B, listen: 127.0.0.1:0{b_node} }}\npeers: [ {{ name: A{} }} ]\n{}\n{b_extra}\n",
            key(&a_key),
            security("B")
        );
        let b_config = self.write("b.yaml", &b_yaml);
        let b = self.start_node("B", &["-c", b_config.to_str().expect("utf-8 path")]);
        let a_yaml = format!(
            "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '{}'{} }} ]\n{}\n{a_extra}\n",
            b.listen_address(),
            key(&b_key),
            security("A")
        );
        let a_config = self.write("a.yaml", &a_yaml);
        let a = self.start_node("A", &["-c", a_config.to_str().expect("utf-8 path")]);
        a.wait_for_log("Link up.", 1, Duration::from_secs(10));
        (a, b)
    }

    /// Takes `count` messages from `node`'s `queue` (waiting at most `within`), then whatever
    /// else is there half a second later — which would be a duplicate.
    pub fn take_all(&self, node: &str, queue: &str, count: usize, within: Duration) -> String {
        let deadline = Instant::now() + within;
        let mut got = String::new();
        while got.lines().count() < count && Instant::now() < deadline {
            let left = (count - got.lines().count()).to_string();
            got.push_str(&stdout(
                &self.run(&["get", "--node", node, queue, "--count", &left, "--wait", "1s"]),
            ));
        }
        got.push_str(&stdout(
            &self.run(&["get", "--node", node, queue, "--count", "100000", "--wait", "500ms"]),
        ));
        got
    }

    /// Starts `linkbus ARGS` (a put reading standard input) fed `lines` in pieces of
    /// `piece` bytes with `pause` between them, so what a test does meanwhile lands
    /// mid-stream.
    pub fn put_streaming(&self, args: &[&str], lines: &str, piece: usize, pause: Duration) -> StreamingPut {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn linkbus put");
        let mut stdin = child.stdin.take().expect("stdin");
        let data = lines.to_owned();
        let feeder = std::thread::spawn(move || {
            use std::io::Write;
            for chunk in data.as_bytes().chunks(piece) {
                stdin.write_all(chunk).expect("write to put");
                std::thread::sleep(pause);
            }
        });
        StreamingPut { child, feeder }
    }

    /// Starts node `name` without peers, from flags only, with the given `--queue` values
    /// (`NAME[:ORDER]`) and its data under the scratch directory.
    pub fn start_lone(&self, name: &str, queues: &[&str]) -> NodeProcess {
        let data = self.path().join(format!("{name}-data"));
        let mut args =
            vec!["--name", name, "--listen", "none", "--data-dir", data.to_str().expect("utf-8 path")];
        for q in queues {
            args.extend(["--queue", q]);
        }
        self.start_node(name, &args)
    }

    /// Starts `linkbus node run ARGS` and waits until its client socket answers.
    pub fn start_node(&self, name: &str, args: &[&str]) -> NodeProcess {
        self.start_node_env(name, args, &[])
    }

    /// Like [`Scratch::start_node`], with extra environment variables.
    pub fn start_node_env(&self, name: &str, args: &[&str], env: &[(&str, &str)]) -> NodeProcess {
        let mut full = vec!["node", "run"];
        full.extend_from_slice(args);
        self.spawn_node(name, self.command(&full), env)
    }

    /// Like [`Scratch::start_node`], inside network namespace `netns` (`ip netns exec`,
    /// which runs the node as its own process).
    pub fn start_node_in(&self, netns: &str, name: &str, args: &[&str]) -> NodeProcess {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", netns])
            .arg(linkbus_bin())
            .args(["node", "run"])
            .args(args)
            .current_dir(self.path())
            .env("LINKBUS_RUNTIME_DIR", self.runtime_dir());
        self.spawn_node(name, cmd, &[])
    }

    fn spawn_node(&self, name: &str, mut cmd: Command, env: &[(&str, &str)]) -> NodeProcess {
        let log = self.path().join(format!("{name}.log"));
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("log file");
        let child = cmd
            .env("LINKBUS_LOG", "info,linkbus_host=debug")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("spawn node");
        let mut node = NodeProcess {
            child: Some(child),
            name: name.to_owned(),
            log,
            socket: self.runtime_dir().join(format!("{name}.sock")),
        };
        node.wait_ready();
        node
    }
}

fn wait_bounded(mut child: Child, timeout: Duration) -> Output {
    // Drain both pipes while waiting, or a chatty child blocks on a full pipe.
    fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = err.join().unwrap_or_default();
            panic!("command timed out after {timeout:?}; stderr: {}", String::from_utf8_lossy(&stderr));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() }
}

/// A running node process; killed on drop.
pub struct NodeProcess {
    child: Option<Child>,
    /// The node's name.
    pub name: String,
    /// Its log (stderr).
    pub log: PathBuf,
    /// Its client socket.
    pub socket: PathBuf,
}

impl NodeProcess {
    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.log_text().contains("Node started.")
                && std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
            {
                return;
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("node {} exited with {status} during start:\n{}", self.name, self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("node {} did not start within 20 s:\n{}", self.name, self.log_text());
    }

    /// Everything the node logged so far.
    pub fn log_text(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        text
    }

    /// The link address the node listens on, read from its start line.
    pub fn listen_address(&self) -> String {
        let text = self.log_text();
        let line = text.lines().rev().find(|l| l.contains("Node started.")).expect("start line");
        let field = line.split_whitespace().find_map(|w| w.strip_prefix("listen=")).expect("listen field");
        field.trim_matches('"').to_owned()
    }

    /// Waits (bounded) until the log contains `needle` `count` times.
    pub fn wait_for_log(&self, needle: &str, count: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.log_text().matches(needle).count() >= count {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "node {}: '{needle}' not logged {count} times within {timeout:?}:\n{}",
            self.name,
            self.log_text()
        );
    }

    /// Sends SIGTERM and waits (bounded) for a clean exit; returns whether it exited 0.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else { return false };
        // The shell builtin, so no procps package is needed.
        let _ = Command::new("sh").args(["-c", &format!("kill -TERM {}", child.id())]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// Waits (bounded) for the process to end on its own; its exit status, or `None` if it
    /// still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Kills the process with SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An encoded `Hello` from `from` to B, speaking `version`.
pub fn hello_frame(from: &str, version: u16) -> Vec<u8> {
    use linkbus::proto::frame::{Frame, Hello};
    let mut out = bytes::BytesMut::new();
    Frame::Hello(Hello { protocol_version: version, ..Hello::new(from, "B") }).encode(&mut out);
    out.to_vec()
}

/// Standard output as text.
/// A put fed in pieces, from [`Scratch::put_streaming`].
pub struct StreamingPut {
    child: Child,
    feeder: std::thread::JoinHandle<()>,
}

impl StreamingPut {
    /// Waits until everything was fed and the put ended, which must be a success.
    pub fn finish(self) {
        self.feeder.join().expect("feeder");
        let out = self.child.wait_with_output().expect("put");
        assert!(out.status.success(), "{}", stderr(&out));
    }
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Standard error as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A TCP port on 127.0.0.1 that was free a moment ago (for a node that must listen on the
/// same port across restarts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port()
}
