//! `linkbus demo`: three nodes in one process, from embedded configurations, over real TCP
//! (Noise links) and real Unix sockets; node A sends numbered buffer messages to queue
//! `orders` on node C, which A reaches only through the relay B by a static route; a
//! consumer on C checks every byte, and the report says what arrived and how fast.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use linkbus_plugin_api::{Address, Content};

use crate::Node;
use crate::client::{Client, ClientError};
use crate::config::{self, Overrides};
use crate::node::StartError;

/// Node C: listens on a free loopback port and has the `orders` queue; results go back to
/// A through B.
const NODE_C: &str = "
node: { name: C, listen: 127.0.0.1:0 }
peers: [ { name: B, public_key: '{B_KEY}' } ]
routes: [ { to: A, via: B } ]
queues: [ { name: orders, order: fifo, queue_messages_max: 1000000 } ]
";

/// Node B, the relay: listens for A, dials C (its address is filled in once C listens).
const NODE_B: &str = "
node: { name: B, listen: 127.0.0.1:0 }
peers: [ { name: A, public_key: '{A_KEY}' }, { name: C, public_key: '{C_KEY}' } ]
";

/// Node A: dials B and listens nowhere; C is reached through B.
const NODE_A: &str = "
node: { name: A, listen: none }
peers: [ { name: B, public_key: '{B_KEY}' } ]
routes: [ { to: C, via: B } ]
";

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The embedded configuration was refused (a bug).
    #[error("embedded configuration: {0}")]
    Config(#[from] linkbus_plugin_api::ConfigErrors),
    /// A node did not start.
    #[error("node: {0}")]
    Start(#[from] StartError),
    /// A client call failed.
    #[error("client: {0}")]
    Client(#[from] ClientError),
    /// The scratch directory or a key file could not be written.
    #[error("scratch directory: {0}")]
    Io(#[from] std::io::Error),
    /// Keys could not be made.
    #[error("keys: {0}")]
    Key(#[from] linkbus_proto::secure::SecureError),
}

/// What the demo observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoReport {
    /// Messages put on A.
    pub sent: usize,
    /// Messages taken from C.
    pub received: usize,
    /// Received messages whose payload matched what was sent for their number.
    pub intact: usize,
    /// Received messages that came before one with a lower number.
    pub out_of_order: usize,
    /// Numbers received more than once.
    pub duplicates: usize,
    /// Payload bytes per message.
    pub message_bytes: usize,
    /// From the first put to the last get.
    pub elapsed: Duration,
}

impl DemoReport {
    /// Whether every message arrived once, intact and in order.
    pub fn is_perfect(&self) -> bool {
        self.received == self.sent
            && self.intact == self.sent
            && self.out_of_order == 0
            && self.duplicates == 0
    }
}

impl std::fmt::Display for DemoReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let rate = self.received as f64 / secs;
        writeln!(
            f,
            "sent      {} buffer messages of {} bytes from A to C:orders, through the relay B",
            self.sent, self.message_bytes
        )?;
        writeln!(
            f,
            "received  {} ({} intact, {} out of order, {} duplicates, {} missing)",
            self.received,
            self.intact,
            self.out_of_order,
            self.duplicates,
            self.sent.saturating_sub(self.received.saturating_sub(self.duplicates))
        )?;
        write!(
            f,
            "time      {:.3} s: {:.0} messages/s, {:.1} MB/s",
            secs,
            rate,
            rate * self.message_bytes as f64 / 1e6
        )
    }
}

/// The bytes after the ASCII index of message `index`, eight at a time.
fn filler(index: usize) -> impl Iterator<Item = [u8; 8]> {
    let mut x = index as u64 ^ 0x9e37_79b9_7f4a_7c15;
    std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x.to_le_bytes()
    })
}

const INDEX_BYTES: usize = 11;

/// The payload of message `index`: its number in ASCII, then bytes derived from it (made
/// and checked eight at a time, so they cost little next to moving them).
pub fn payload(index: usize, size: usize) -> Bytes {
    let size = size.max(INDEX_BYTES);
    let mut bytes = Vec::with_capacity(size + 8);
    bytes.extend_from_slice(format!("{index:010}:").as_bytes());
    for chunk in filler(index) {
        if bytes.len() >= size {
            break;
        }
        bytes.extend_from_slice(&chunk);
    }
    bytes.truncate(size);
    Bytes::from(bytes)
}

fn read_u64(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(bytes);
    u64::from_le_bytes(word)
}

/// Whether `bytes` is exactly [`payload`]`(index, size)`, without building it.
pub fn is_payload(index: usize, size: usize, bytes: &[u8]) -> bool {
    let size = size.max(INDEX_BYTES);
    if bytes.len() != size || bytes.get(..INDEX_BYTES) != Some(format!("{index:010}:").as_bytes()) {
        return false;
    }
    let rest = bytes.get(INDEX_BYTES..).unwrap_or_default();
    let mut want = filler(index);
    let whole = rest.chunks_exact(8);
    let tail = whole.remainder();
    let all_whole = whole.zip(&mut want).all(|(got, want)| u64::from_le_bytes(want) == read_u64(got));
    all_whole && want.next().is_some_and(|last| last.get(..tail.len()) == Some(tail))
}

fn index_of(payload: &[u8]) -> Option<usize> {
    std::str::from_utf8(payload.get(..10)?).ok()?.parse().ok()
}

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the demo with `messages` messages of `size` bytes.
///
/// # Errors
/// [`DemoError`] when a node or client fails; a report with losses is not an error.
pub async fn run(messages: usize, size: usize) -> Result<DemoReport, DemoError> {
    let scratch = Scratch(std::env::temp_dir().join(format!("linkbus-demo-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0)?;
    let (a, b, c) = start_nodes(&scratch.0).await?;
    let mut producer = Client::connect(a.socket_path()).await?;
    let mut consumer = Client::connect(c.socket_path()).await?;
    let started = Instant::now();
    let (produced, consumed) =
        tokio::join!(produce(&mut producer, messages, size), consume(&mut consumer, messages, size));
    produced?;
    let mut report = consumed?;
    report.elapsed = started.elapsed();
    a.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;
    Ok(report)
}

/// Starts C from [`NODE_C`], B from [`NODE_B`] pointed at C's port, then A from
/// [`NODE_A`] pointed at B's, each keeping its socket and data under `scratch`.
async fn start_nodes(scratch: &std::path::Path) -> Result<(Node, Node, Node), DemoError> {
    use crate::security::write_key_file;
    use linkbus_proto::secure::{Keypair, hex};
    let (a_keys, b_keys, c_keys) = (Keypair::generate()?, Keypair::generate()?, Keypair::generate()?);
    for (name, keys) in [("A", &a_keys), ("B", &b_keys), ("C", &c_keys)] {
        write_key_file(&scratch.join(format!("{name}.key")), &keys.private)?;
    }
    write_key_file(&scratch.join("cluster.psk"), &Keypair::generate()?.private)?;
    let fill = |yaml: &str| {
        yaml.replace("{A_KEY}", &hex(&a_keys.public))
            .replace("{B_KEY}", &hex(&b_keys.public))
            .replace("{C_KEY}", &hex(&c_keys.public))
    };
    let overrides = |name: &str| Overrides {
        data_dir: Some(scratch.join(name)),
        client_socket: Some(scratch.join(format!("{name}.sock"))),
        key_file: Some(scratch.join(format!("{name}.key"))),
        psk_file: Some(scratch.join("cluster.psk")),
        ..Overrides::default()
    };
    let start = |yaml: &str, overrides: Overrides| {
        let tree = config::parse_yaml(&fill(yaml)).map(|mut tree| {
            config::apply_overrides(&mut tree, &overrides);
            tree
        });
        async move { Ok::<Node, DemoError>(Node::start(config::from_value(&tree?)?).await?) }
    };
    let c = start(NODE_C, overrides("C")).await?;
    let c_address = c.listen_address().unwrap_or_default().to_owned();
    let b = start(NODE_B, Overrides { peers: vec![format!("C={c_address}")], ..overrides("B") }).await?;
    let b_address = b.listen_address().unwrap_or_default().to_owned();
    let a = start(NODE_A, Overrides { peers: vec![format!("B={b_address}")], ..overrides("A") }).await?;
    Ok((a, b, c))
}

/// Puts the numbered messages in slices, so the demo never holds more than a slice of
/// payloads in memory.
async fn produce(producer: &mut Client, messages: usize, size: usize) -> Result<(), ClientError> {
    let to: Address = "C:orders".parse().expect("valid address");
    let slice =
        (crate::client::PUT_BATCH_BYTES_MAX / size.max(1)).clamp(1, crate::client::PUT_BATCH_MESSAGES_MAX);
    let mut next = 0;
    while next < messages {
        let end = (next + slice).min(messages);
        producer.put_batch((next..end).map(|i| Content::buf(to.clone(), payload(i, size))).collect()).await?;
        next = end;
    }
    Ok(())
}

/// Takes messages until all arrived or none came for 10 s, checking each.
async fn consume(consumer: &mut Client, messages: usize, size: usize) -> Result<DemoReport, ClientError> {
    let mut report = DemoReport {
        sent: messages,
        received: 0,
        intact: 0,
        out_of_order: 0,
        duplicates: 0,
        message_bytes: size.max(INDEX_BYTES),
        elapsed: Duration::ZERO,
    };
    let mut seen = vec![false; messages];
    let mut last = None;
    while report.received < messages {
        let got = consumer.get("orders", 10_000, Duration::from_secs(10)).await?;
        if got.is_empty() {
            break;
        }
        for m in got {
            report.received += 1;
            let Some(i) = index_of(&m.content.payload).filter(|i| *i < messages) else { continue };
            report.intact += usize::from(is_payload(i, size, &m.content.payload));
            report.duplicates += usize::from(seen.get_mut(i).is_some_and(|s| std::mem::replace(s, true)));
            report.out_of_order += usize::from(last.is_some_and(|l| l > i));
            last = Some(i);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_carry_their_index() {
        let p = payload(42, 100);
        assert_eq!(p.len(), 100);
        assert_eq!(index_of(&p), Some(42));
        assert_ne!(payload(43, 100), p);
        assert_eq!(payload(7, 0).len(), 11);
        for size in [11, 12, 19, 100, 4096] {
            assert!(is_payload(5, size, &payload(5, size)), "{size}");
            assert!(!is_payload(6, size, &payload(5, size)));
            let mut damaged = payload(5, size).to_vec();
            *damaged.last_mut().unwrap() ^= 1;
            assert!(!is_payload(5, size, &damaged), "{size}");
        }
    }
}
