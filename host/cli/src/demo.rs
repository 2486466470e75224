//! `linkbus demo`: three nodes in one process, from embedded configurations, over real TCP
//! (Noise links) and real Unix sockets; node A sends numbered buffer messages to queue
//! `orders` on node C, which A reaches only through the relay B by a static route; a
//! consumer on C checks every byte, and the report says what arrived and how fast.

use std::time::{Duration, Instant};

use bytes::Bytes;
use linkbus_plugin_api::{Address, Content, Reliability};
use linkbus_proto::secure::Cipher;

use linkbus_client::{Client, ClientError};
use linkbus_host::node::StartError;

use crate::bench::{BenchFilter, Setup};

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DemoError {
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
pub(crate) struct DemoReport {
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
    /// What the codec stages at A did (none when the run had none).
    pub stages: Vec<linkbus_host::flow::CodecStats>,
    /// What the filters at A did (none when the run had none).
    pub filters: Vec<linkbus_host::flow::FilterStats>,
    /// Files of each node's data directory that hold a payload's plaintext (searched when
    /// payloads were sealed).
    pub plaintext_at_rest: Option<Vec<(String, Searched)>>,
    /// From the first put to the last get.
    pub elapsed: Duration,
    /// The file sent after the messages, if one was.
    pub file: Option<FileSent>,
}

/// What became of the file the demo sends from A to C.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileSent {
    /// Its size.
    pub bytes: u64,
    /// From the send to the result.
    pub elapsed: Duration,
    /// C's result, as `linkbus result` prints it.
    pub outcome: String,
    /// Whether C's copy has the BLAKE3 digest of A's.
    pub intact: bool,
}

impl std::fmt::Display for FileSent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        write!(
            f,
            "file      {} MiB from A's files directory to C:orders through B ({}): {:.2} s, {:.0} MB/s; C's copy {}",
            self.bytes >> 20,
            self.outcome,
            secs,
            self.bytes as f64 / secs / 1e6,
            if self.intact { "has the same BLAKE3 digest" } else { "DIFFERS" }
        )
    }
}

impl DemoReport {
    /// Whether every message arrived once, intact and in order (and no data directory
    /// held a sealed payload's plaintext).
    pub(crate) fn is_perfect(&self) -> bool {
        self.plaintext_at_rest.as_ref().is_none_or(|found| found.iter().all(|(_, s)| s.holding == 0))
            && self.received == self.sent
            && self.intact == self.sent
            && self.out_of_order == 0
            && self.duplicates == 0
            && self.file.as_ref().is_none_or(|f| f.intact)
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
        )?;
        for stage in &self.stages {
            let change = if stage.bytes_out > stage.bytes_in {
                let each = (stage.bytes_out - stage.bytes_in) / stage.messages.max(1);
                format!("{each} bytes more each (its tag; the nonce and key id travel beside the payload)")
            } else {
                format!("ratio {:.2}", stage.bytes_in as f64 / stage.bytes_out.max(1) as f64)
            };
            write!(
                f,
                "\nstage     {} at A: {} messages, {} bytes -> {} bytes, {change}",
                stage.name, stage.messages, stage.bytes_in, stage.bytes_out
            )?;
        }
        for filter in &self.filters {
            let hooks: Vec<&str> = filter.hooks.iter().map(|h| h.as_str()).collect();
            write!(
                f,
                "\nfilter    {} at A ({}, WebAssembly): {} messages in {} calls, {} rewritten, {} dropped, {} failed; {} fuel and p50 {} us a call",
                filter.name,
                hooks.join(", "),
                filter.messages,
                filter.calls,
                filter.rewrites,
                filter.drops,
                filter.failures.iter().map(|(_, n)| n).sum::<u64>(),
                filter.fuel / filter.calls.max(1),
                filter.p50_us
            )?;
        }
        if let Some(file) = &self.file {
            write!(f, "\n{file}")?;
        }
        if let Some(found) = &self.plaintext_at_rest {
            for (node, searched) in found {
                let verdict = match searched.holding {
                    0 => "none holds a payload's plaintext".to_owned(),
                    n => format!("{n} HOLD A PAYLOAD'S PLAINTEXT"),
                };
                write!(
                    f,
                    "\nat rest   node {node}'s data directory, {} files ({} bytes) searched: {verdict}",
                    searched.files, searched.bytes
                )?;
            }
        }
        Ok(())
    }
}

/// Word `i` of message `index`'s filler: each word on its own (no chain from one to the
/// next), so making and checking them vectorises — the harness must cost little next to
/// what it measures.
fn filler_word(index: usize, i: usize) -> u64 {
    let seed = (index as u64 ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    seed ^ (i as u64).wrapping_mul(0x94d0_49bb_1331_11eb)
}

const INDEX_BYTES: usize = 11;

/// `index` as ten ASCII digits and a `:` (the last ten digits of larger numbers), without
/// the formatting machinery: the harness makes and checks millions of these.
fn index_text(index: usize) -> [u8; INDEX_BYTES] {
    let mut text = [b':'; INDEX_BYTES];
    let mut rest = index;
    for digit in text.iter_mut().take(INDEX_BYTES - 1).rev() {
        *digit = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    text
}

/// The payload of message `index`: its number in ASCII, then bytes derived from it (made
/// and checked eight at a time, so they cost little next to moving them).
pub(crate) fn payload(index: usize, size: usize) -> Bytes {
    let size = size.max(INDEX_BYTES);
    let mut bytes = vec![0u8; size];
    let (head, rest) = bytes.split_at_mut(INDEX_BYTES);
    head.copy_from_slice(&index_text(index));
    let words = rest.len() / 8;
    let mut whole = rest.chunks_exact_mut(8);
    for (i, chunk) in whole.by_ref().enumerate() {
        chunk.copy_from_slice(&filler_word(index, i).to_le_bytes());
    }
    let tail = whole.into_remainder();
    tail.copy_from_slice(filler_word(index, words).to_le_bytes().get(..tail.len()).unwrap_or_default());
    Bytes::from(bytes)
}

fn read_u64(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(bytes);
    u64::from_le_bytes(word)
}

/// JSON-like order records, a block that text payloads are cut from.
fn orders_text() -> &'static [u8] {
    static TEXT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let mut text = String::new();
        let mut n: u64 = 1;
        while text.len() < TEXT_BLOCK_BYTES + (2 << 20) {
            n = n.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let (customer, sku, qty) = (n >> 40 & 0xffff, n >> 20 & 0x3ff, n >> 12 & 0x7);
            text.push_str(&format!(
                "{{\"order\":{},\"customer\":\"C-{customer:05}\",\"sku\":\"SKU-{sku:04}\",\"qty\":{},\"price\":{}.{:02},\"currency\":\"EUR\",\"status\":\"accepted\"}}\n",
                n >> 34,
                qty + 1,
                sku % 200 + 1,
                n % 100
            ));
        }
        text.into_bytes()
    })
}

/// `count` of the order records text payloads are made of, one per sample (to train a
/// compression dictionary on).
pub(crate) fn sample_records(count: usize) -> Vec<Vec<u8>> {
    orders_text().split(|b| *b == b'\n').rev().skip(1).take(count).map(<[u8]>::to_vec).collect()
}

/// Bytes a text payload may start at in [`orders_text`].
const TEXT_BLOCK_BYTES: usize = 64 * 1024;

/// The text payload of message `index`: its number in ASCII, then JSON-like order records
/// (which compress as such messages do).
pub(crate) fn text_payload(index: usize, size: usize) -> Bytes {
    let size = size.max(INDEX_BYTES);
    let mut bytes = Vec::with_capacity(size);
    bytes.extend_from_slice(&index_text(index));
    let from = index.wrapping_mul(7919) % TEXT_BLOCK_BYTES;
    let text = orders_text();
    let mut at = from;
    while bytes.len() < size {
        let take = (size - bytes.len()).min(text.len() - at);
        bytes.extend_from_slice(text.get(at..at + take).unwrap_or_default());
        at = 0;
    }
    Bytes::from(bytes)
}

/// Whether `bytes` is exactly [`text_payload`]`(index, size)`.
pub(crate) fn is_text_payload(index: usize, size: usize, bytes: &[u8]) -> bool {
    bytes == text_payload(index, size)
}

/// `payload` with the digits of its first `"customer"` string value masked (`*`): what the
/// `redact_json` example filter makes of it with `{ field: customer, keep_last: 0 }` (it
/// looks for the field's name followed by `:`, the same way).
pub(crate) fn redact_customer(payload: &[u8]) -> Vec<u8> {
    let mut out = payload.to_vec();
    let key = b"\"customer\"";
    let mut from = 0;
    while let Some(found) = memchr::memmem::find(&payload[from..], key) {
        let after = from + found + key.len();
        let skip = |at: usize| at + payload[at..].iter().take_while(|b| b.is_ascii_whitespace()).count();
        let colon = skip(after);
        if payload.get(colon) != Some(&b':') {
            from = after;
            continue;
        }
        let quote = skip(colon + 1);
        if payload.get(quote) != Some(&b'"') {
            return out;
        }
        let start = quote + 1;
        let mut escaped = false;
        for (i, &b) in payload[start..].iter().enumerate() {
            match b {
                b'\\' if !escaped => escaped = true,
                b'"' if !escaped => {
                    for byte in &mut out[start..start + i] {
                        if byte.is_ascii_digit() {
                            *byte = b'*';
                        }
                    }
                    return out;
                }
                _ => escaped = false,
            }
        }
        return out;
    }
    out
}

/// Whether `bytes` is [`text_payload`]`(index, size)` as the redacting filter leaves it.
pub(crate) fn is_redacted_text_payload(index: usize, size: usize, bytes: &[u8]) -> bool {
    bytes == redact_customer(&text_payload(index, size))
}

/// Whether `bytes` is exactly [`payload`]`(index, size)`, without building it.
pub(crate) fn is_payload(index: usize, size: usize, bytes: &[u8]) -> bool {
    let size = size.max(INDEX_BYTES);
    if bytes.len() != size || bytes.get(..INDEX_BYTES) != Some(&index_text(index)[..]) {
        return false;
    }
    let rest = bytes.get(INDEX_BYTES..).unwrap_or_default();
    let whole = rest.chunks_exact(8);
    let tail = whole.remainder();
    let words = whole.len();
    // Differences gathered without stopping early, so the loop vectorises.
    let differ = whole.enumerate().fold(0u64, |acc, (i, got)| acc | (filler_word(index, i) ^ read_u64(got)));
    let last = filler_word(index, words).to_le_bytes();
    differ == 0 && last.get(..tail.len()) == Some(tail)
}

fn index_of(payload: &[u8]) -> Option<usize> {
    std::str::from_utf8(payload.get(..10)?).ok()?.parse().ok()
}

/// Runs the demo with `messages` messages of `size` bytes.
///
/// # Errors
/// [`DemoError`] when a node or client fails; a report with losses is not an error.
/// The file the demo sends after its messages.
const DEMO_FILE_BYTES: u64 = 32 << 20;

pub(crate) async fn run(messages: usize, size: usize) -> Result<DemoReport, DemoError> {
    let scratch = crate::bench::Scratch::new("demo")?;
    let setup = Setup {
        cipher: Some(Cipher::fastest()),
        compress: true,
        seal: true,
        text: true,
        persistent: true,
        dictionary: true,
        filter: Some(BenchFilter::Redact),
        file_bytes: DEMO_FILE_BYTES,
    };
    deliver_through(&scratch.0, &["A", "B", "C"], setup, false, messages, size).await
}

/// Starts the chain `names` ([`crate::bench::start_chain`], under `scratch`, its links
/// plaintext or Noise with `cipher`), puts
/// `messages` numbered payloads of `size` bytes on the first node for `orders` on the last,
/// takes and checks them there, stops the nodes, and reports (timed from the first put to
/// the last get). The producer and the consumer run on tasks of their own, as clients on
/// the nodes' client sockets or, with `in_process`, as in-process clients (`Node::client`).
///
/// # Errors
/// [`DemoError`] when a node or client fails; a report with losses is not an error.
pub(crate) async fn deliver_through(
    scratch: &std::path::Path,
    names: &[&str],
    setup: Setup,
    in_process: bool,
    messages: usize,
    size: usize,
) -> Result<DemoReport, DemoError> {
    let nodes = crate::bench::start_chain(scratch, names, setup).await?;
    let (first, last) = (&nodes[0], &nodes[nodes.len() - 1]);
    let (mut producer, mut consumer) =
        (crate::bench::client_of(first, in_process).await?, crate::bench::client_of(last, in_process).await?);
    let to: Address = format!("{}:orders", names[names.len() - 1]).parse().expect("valid address");
    let started = Instant::now();
    // Each on a task of its own, as separate programs would be (an in-process client
    // answers its calls on the task that makes them).
    let (text, persistent) = (setup.text, setup.persistent);
    let producing =
        tokio::spawn(async move { produce(&mut producer, &to, messages, size, text, persistent).await });
    let check = match (text, setup.filter) {
        (true, Some(BenchFilter::Redact)) => is_redacted_text_payload,
        (true, _) => is_text_payload,
        (false, _) => is_payload,
    };
    let consuming = tokio::spawn(async move { consume(&mut consumer, messages, size, check).await });
    let (produced, consumed) = (producing.await, consuming.await);
    produced.map_err(std::io::Error::other)??;
    let mut report = consumed.map_err(std::io::Error::other)??;
    report.elapsed = started.elapsed();
    if setup.file_bytes > 0 {
        report.file = Some(send_file(first, last, setup.file_bytes, in_process).await?);
    }
    report.stages = first.codec_stats();
    report.filters = first.filter_stats();
    let data_dirs: Vec<_> = nodes
        .iter()
        .map(|n| (n.state().name().to_string(), n.state().config().node.data_dir.clone()))
        .collect();
    for node in nodes {
        node.shutdown().await;
    }
    if setup.seal && text {
        // Any payload, whole: in no file, unless in plaintext.
        let plaintext = |bytes: &[u8]| holds_a_payload(bytes, messages, size);
        report.plaintext_at_rest =
            Some(data_dirs.into_iter().map(|(name, dir)| (name, files_holding(&dir, &plaintext))).collect());
    }
    Ok(report)
}

/// What a search of a data directory for a payload's plaintext found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Searched {
    /// Files searched.
    pub files: usize,
    /// Their bytes.
    pub bytes: usize,
    /// Files holding it.
    pub holding: usize,
}

/// Whether `bytes` hold the whole text payload of one of `messages` messages of `size`
/// bytes: each starts with its number, ten digits and a `:`.
fn holds_a_payload(bytes: &[u8], messages: usize, size: usize) -> bool {
    memchr::memmem::find_iter(bytes, b":").any(|colon| {
        let Some(start) = colon.checked_sub(INDEX_BYTES - 1) else { return false };
        let Some(index) = bytes.get(start..).and_then(index_of).filter(|i| *i < messages) else {
            return false;
        };
        bytes
            .get(start..start + size.max(INDEX_BYTES))
            .is_some_and(|found| is_text_payload(index, size, found))
    })
}

/// Searches the files under `dir` (and its subdirectories) with `holds`.
fn files_holding(dir: &std::path::Path, holds: &dyn Fn(&[u8]) -> bool) -> Searched {
    let mut searched = Searched::default();
    let Ok(entries) = std::fs::read_dir(dir) else { return searched };
    for path in entries.flatten().map(|entry| entry.path()) {
        if path.is_dir() {
            let below = files_holding(&path, holds);
            searched.files += below.files;
            searched.bytes += below.bytes;
            searched.holding += below.holding;
        } else {
            let bytes = std::fs::read(&path).unwrap_or_default();
            searched.files += 1;
            searched.bytes += bytes.len();
            searched.holding += usize::from(holds(&bytes));
        }
    }
    searched
}

/// Puts the numbered messages in slices, so the demo never holds more than a slice of
/// payloads in memory.
async fn produce(
    producer: &mut Client,
    to: &Address,
    messages: usize,
    size: usize,
    text: bool,
    persistent: bool,
) -> Result<(), ClientError> {
    let make = if text { text_payload } else { payload };
    let reliability = if persistent { Reliability::Persistent } else { Reliability::AsQueue };
    let slice =
        (linkbus_client::PUT_BATCH_BYTES_MAX / size.max(1)).clamp(1, linkbus_client::PUT_BATCH_MESSAGES_MAX);
    let mut next = 0;
    while next < messages {
        let end = (next + slice).min(messages);
        let contents =
            (next..end).map(|i| Content::buf(to.clone(), make(i, size)).with_reliability(reliability));
        producer.put_batch(contents.collect()).await?;
        next = end;
    }
    Ok(())
}

/// Takes messages until all arrived or none came for 10 s, checking each with `check`.
async fn consume(
    consumer: &mut Client,
    messages: usize,
    size: usize,
    check: fn(usize, usize, &[u8]) -> bool,
) -> Result<DemoReport, ClientError> {
    let mut report = DemoReport {
        sent: messages,
        received: 0,
        intact: 0,
        out_of_order: 0,
        duplicates: 0,
        message_bytes: size.max(INDEX_BYTES),
        elapsed: Duration::ZERO,
        stages: Vec::new(),
        filters: Vec::new(),
        plaintext_at_rest: None,
        file: None,
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
            report.intact += usize::from(check(i, size, &m.content.payload) && !m.is_encoded());
            report.duplicates += usize::from(seen.get_mut(i).is_some_and(|s| std::mem::replace(s, true)));
            report.out_of_order += usize::from(last.is_some_and(|l| l > i));
            last = Some(i);
        }
    }
    Ok(report)
}

/// Sends a file of `bytes` bytes of noise from `first`'s files directory to `last`'s
/// `orders` and checks the copy that lands in `last`'s files directory.
async fn send_file(
    first: &linkbus_host::Node,
    last: &linkbus_host::Node,
    bytes: u64,
    in_process: bool,
) -> Result<FileSent, DemoError> {
    let name = "demo/q3 report.bin";
    let source = first.state().config().node.files_dir().join(name);
    crate::bench::files::write_noise(&source, bytes)?;
    let mut client = crate::bench::client_of(first, in_process).await?;
    let to = format!("{}:orders", last.state().name());
    let started = Instant::now();
    let send = linkbus_client::SendFile::new(name, to);
    let (_, results) = client.send_file_and_wait(send, Duration::from_secs(300)).await?;
    let elapsed = started.elapsed();
    let outcome = results
        .as_ref()
        .and_then(|r| {
            r.recipients.first().map(|(_, o)| o.as_ref().map_or("no result".to_owned(), ToString::to_string))
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let copy = last.state().config().node.files_dir().join(name);
    let digest = |path: &std::path::Path| std::fs::read(path).map(|b| blake3::hash(&b));
    let intact = matches!((digest(&source), digest(&copy)), (Ok(a), Ok(b)) if a == b);
    Ok(FileSent { bytes, elapsed, outcome, intact })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_at_rest_finds_a_whole_payload_and_nothing_else() {
        let mut file = b"junk 0000000009: not one ".to_vec();
        assert!(!holds_a_payload(&file, 100, 200), "a number alone is not a payload");
        file.extend_from_slice(&text_payload(42, 200));
        file.extend_from_slice(b" more junk");
        assert!(holds_a_payload(&file, 100, 200));
        assert!(!holds_a_payload(&file, 42, 200), "only the payloads sent");
        let mut cut = text_payload(7, 200).to_vec();
        cut.pop();
        assert!(!holds_a_payload(&cut, 100, 200), "a payload cut short");
        assert!(
            is_text_payload(3, 500, &text_payload(3, 500)) && !is_text_payload(4, 500, &text_payload(3, 500))
        );
    }

    #[test]
    fn the_redaction_masks_the_first_customer_only() {
        let masked = redact_customer(br#"00:{"customer" : "C-01234","x":1}{"customer":"C-9"}"#);
        assert_eq!(masked, br#"00:{"customer" : "C-*****","x":1}{"customer":"C-9"}"#);
        assert_eq!(redact_customer(br#"{"customer":"C-12"#), br#"{"customer":"C-12"#, "no closing quote");
        assert_eq!(redact_customer(br#"{"customer", "customer":"7"}"#), br#"{"customer", "customer":"*"}"#);
    }

    #[test]
    fn payloads_carry_their_index() {
        let p = payload(42, 100);
        assert_eq!(p.len(), 100);
        assert_eq!(index_of(&p), Some(42));
        assert_ne!(payload(43, 100), p);
        assert_eq!(payload(7, 0).len(), 11);
        assert_eq!(&payload(1_234_567, 11)[..], b"0001234567:");
        assert_eq!(index_of(&payload(9_876_543_210, 11)), Some(9_876_543_210));
        for size in [11, 12, 19, 100, 4096] {
            assert!(is_payload(5, size, &payload(5, size)), "{size}");
            assert!(!is_payload(6, size, &payload(5, size)));
            let mut damaged = payload(5, size).to_vec();
            *damaged.last_mut().unwrap() ^= 1;
            assert!(!is_payload(5, size, &damaged), "{size}");
        }
    }
}
