//! `linkbus bench`: named workloads, each measured against its baseline in the same run
//! (these machines are noisy: only ratios measured side by side mean something).
//!
//! Nodes run in this process from embedded configurations, over real TCP on 127.0.0.1 and
//! real Unix sockets, with `fjall` stores in a temporary directory, exactly as the demo's:
//! - `w1`: two nodes, volatile messages of 64 B, 1 KiB, 64 KiB and 1 MiB put on A and taken
//!   on B (plaintext links), against a raw length-prefixed TCP stream of the same payloads
//!   with buffered writes — the ceiling; once with the producer and the consumer on the
//!   client sockets, once inside the nodes' process (`Node::client`); and the client
//!   sockets' case again against the same socket hops carrying the bytes alone (`hops`:
//!   Unix socket, TCP, Unix socket through two forwarders), which shows how much of the
//!   gap to raw TCP is the sockets' and how much the nodes';
//! - `w2`: persistent 1 KiB puts, each answered after the sync that covers it, from 16
//!   clients at once (group commit), one per request and 256 per request, on the node's
//!   `fjall` store and on the `log` store, each against itself syncing every record on
//!   its own, and the disk's raw write-and-`fdatasync` rate;
//! - `w3`: ping-pong of 64 B messages, one round trip at a time at most 1,000 a second
//!   (below saturation): A puts to `B:orders`, a client on B takes it and puts it back to
//!   `A:orders`, where A takes it (each side with a consumer the node pushes to and puts
//!   that do not wait for their answers, as a request/reply program has them) — p50, p99
//!   and p99.9 of the round trip, against the same
//!   ping-pong over a raw TCP connection (the ratio is round trips per second); once with
//!   clients on the client socket (with the round trip through the same socket hops
//!   carrying the bytes alone in its note), once with clients inside the nodes' process
//!   (`Node::client`, as a program embedding its node has them);
//! - `w4`: a relay, A → B → C, volatile 1 KiB, against `w1` at 1 KiB (its socket case,
//!   measured in the same rounds);
//! - `w5`: `w1` at 1 KiB and 64 KiB over Noise links, with AES-256-GCM and with
//!   ChaCha20-Poly1305, against plaintext (measured in the same rounds);
//! - `w6`: a 1 GiB file sent from A to B (`linkbus file send`, two node processes of this
//!   binary, plaintext links), against the same bytes copied file to file over one TCP
//!   connection; each node's peak resident memory in the note;
//! - `w7`: the link from A to B saturated by 1 KiB messages of priorities 0..=8 (three
//!   producers, a consumer draining them on B), and 20 urgent messages a second (priority
//!   9, 64 B, to their own queue): each urgent message's put-to-get latency (p50, p99,
//!   max), against the same urgent messages on the idle link; and the same urgent messages
//!   while files of 256 MiB cross the link one after another (`linkbus file send`).
//!
//! Every payload is checked byte for byte where it is taken, on both sides of a ratio.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use linkbus_plugin_api::{Address, Content};
use linkbus_proto::secure::Cipher;

use crate::demo::{DemoError, is_payload, payload};
use linkbus_client::Client;

mod chain;
pub(crate) mod files;
mod hops;
mod persistent;
mod ping;
mod raw;

pub(crate) use chain::{BenchFilter, Setup, client_of, start_chain};
use persistent::persistent_puts;
pub(crate) use persistent::sqlite_beside_this_binary;
use ping::{PING_PONG_RATE, ping_pong};
use raw::raw_tcp;

/// One measured case and its baseline.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    /// The workload (`w1`, ...).
    pub workload: &'static str,
    /// What was measured, in words.
    pub case: String,
    /// Payload bytes per message.
    pub size: usize,
    /// Messages per second.
    pub messages_per_s: f64,
    /// The baseline, in words.
    pub baseline: String,
    /// The baseline's messages per second.
    pub baseline_per_s: f64,
    /// Anything else worth knowing (puts per sync, ...).
    pub note: String,
}

impl Row {
    /// Payload megabytes per second.
    pub(crate) fn mb_per_s(&self) -> f64 {
        self.messages_per_s * self.size as f64 / 1e6
    }

    /// Measured against the baseline.
    pub(crate) fn ratio(&self) -> f64 {
        self.messages_per_s / self.baseline_per_s.max(f64::MIN_POSITIVE)
    }
}

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scale {
    /// Messages per case are divided by this (a quick run for tests uses a large one).
    pub divisor: usize,
    /// How long each timed case runs.
    pub duration: Duration,
    /// Only the cases of this payload size, where a workload has several.
    pub only_size: Option<usize>,
    /// Rounds of each throughput case (`w1`, `w4`, `w5`), its baseline measured in each
    /// round too; the rows give the medians.
    pub rounds: usize,
}

impl Scale {
    /// The full run.
    pub(crate) const FULL: Self =
        Self { divisor: 1, duration: Duration::from_secs(3), only_size: None, rounds: 1 };
    /// A run that only shows everything works (seconds in all).
    pub(crate) const QUICK: Self =
        Self { divisor: 100, duration: Duration::from_millis(200), only_size: None, rounds: 1 };

    fn messages(self, full: usize) -> usize {
        (full / self.divisor).max(10)
    }

    /// Whether a case of `size` bytes runs.
    fn has_size(self, size: usize) -> bool {
        self.only_size.is_none_or(|only| only == size)
    }
}

/// Messages per case of `w1` at each size.
const W1_CASES: [(usize, usize); 4] = [(64, 300_000), (1024, 200_000), (65_536, 10_000), (1 << 20, 3000)];

/// The payload sizes of `w1`'s cases (those of `w5` are among them).
pub(crate) const W1_SIZES: [usize; 4] = [W1_CASES[0].0, W1_CASES[1].0, W1_CASES[2].0, W1_CASES[3].0];

/// Runs the named workloads (all when `names` is empty), printing each row as it comes
/// when `print` is set.
///
/// # Errors
/// [`DemoError`] when a node, a client or the scratch directory fails.
pub(crate) async fn run(
    names: &[String],
    scale: Scale,
    store_library: Option<&Path>,
    print: bool,
) -> Result<Vec<Row>, DemoError> {
    let scratch = Scratch::new("bench")?;
    let wanted = |w: &str| names.is_empty() || names.iter().any(|n| n == w);
    let mut rows = Vec::new();
    let show = |row: Row, rows: &mut Vec<Row>| {
        if print {
            println!("{}", table_line(&row));
        }
        rows.push(row);
    };
    if print {
        println!("{}", table_header());
    }
    if wanted("w1") {
        for (size, full) in W1_CASES.into_iter().filter(|(size, _)| scale.has_size(*size)) {
            for row in two_nodes(&scratch.0, scale, size, full).await? {
                show(row, &mut rows);
            }
        }
    }
    if wanted("w2") {
        for row in persistent_puts(&scratch.0, scale, store_library).await? {
            show(row, &mut rows);
        }
    }
    if wanted("w3") {
        // Clients over the client socket, then clients inside the nodes' process (as a
        // program embedding its node has them: the link between the nodes only).
        for in_process in [false, true] {
            show(ping_pong(&scratch.0, scale.messages(5_000), in_process).await?, &mut rows);
        }
    }
    if wanted("w4") && scale.has_size(1024) {
        let messages = scale.messages(200_000);
        let (plain, [relayed]) =
            beside_w1(&scratch.0, scale, messages, 1024, Setup::default(), [(3, Setup::default())]).await?;
        let case = format!("A -> B -> C, volatile, {messages} messages");
        let note = rounds_note(&relayed, &plain);
        show(row("w4", case, 1024, median(&relayed), "w1: A -> B", median(&plain), note), &mut rows);
    }
    if wanted("w5") {
        for (size, full) in
            [(1024, 200_000), (65_536, 10_000)].into_iter().filter(|(size, _)| scale.has_size(*size))
        {
            for row in sealed_and_compressed(&scratch.0, scale, size, full).await? {
                show(row, &mut rows);
            }
        }
    }
    if wanted("w6") {
        show(files::file_transfer(&scratch.0, scale).await?, &mut rows);
    }
    if wanted("w7") {
        show(urgent_under_load(&scratch.0, scale).await?, &mut rows);
        show(files::urgent_under_files(&scratch.0, scale).await?, &mut rows);
    }
    Ok(rows)
}

/// `w5` at one size: Noise links with each cipher against plaintext links (noise
/// payloads); then, on plaintext links with JSON-like text payloads, zstd, the end-to-end
/// payload cipher, and both, against the same without stages.
async fn sealed_and_compressed(
    scratch: &Path,
    scale: Scale,
    size: usize,
    full: usize,
) -> Result<Vec<Row>, DemoError> {
    let messages = scale.messages(full);
    let mut rows = Vec::new();
    let ciphers = [Cipher::AesGcm, Cipher::ChaChaPoly];
    let cases = ciphers.map(|cipher| (2, Setup::noise(cipher)));
    let (plain, sealed) = beside_w1(scratch, scale, messages, size, Setup::default(), cases).await?;
    for (cipher, sealed) in ciphers.iter().zip(sealed) {
        let case = format!("A -> B over Noise ({}), volatile, {messages} messages", cipher.name());
        let note = rounds_note(&sealed, &plain);
        rows.push(row("w5", case, size, median(&sealed), "w1: plaintext", median(&plain), note));
    }
    let text = Setup { text: true, ..Setup::default() };
    let stages = [
        ("zstd level 3", Setup { compress: true, ..text }),
        ("payload sealed end to end (XChaCha20-Poly1305)", Setup { seal: true, ..text }),
        ("zstd, then sealed", Setup { compress: true, seal: true, ..text }),
    ];
    let (plain, staged) =
        beside_w1(scratch, scale, messages, size, text, stages.map(|(_, s)| (2, s))).await?;
    for ((what, _), staged) in stages.iter().zip(staged) {
        let case = format!("A -> B, {what}, JSON-like text, volatile, {messages} messages");
        let note = rounds_note(&staged, &plain);
        rows.push(row(
            "w5",
            case,
            size,
            median(&staged),
            "w1: no stages, the same payloads",
            median(&plain),
            note,
        ));
    }
    rows.extend(filtered(scratch, scale, messages, size).await?);
    Ok(rows)
}

/// `w5`'s filter rows: a WebAssembly filter at A's `on_send` (one that passes every message,
/// and the JSON redactor) against the same chain without it; the note says what the filter
/// adds per message.
async fn filtered(scratch: &Path, scale: Scale, messages: usize, size: usize) -> Result<Vec<Row>, DemoError> {
    let text = Setup { text: true, ..Setup::default() };
    let filters = [
        (
            "a pass-through WebAssembly filter (SDK) at on_send",
            Setup { filter: Some(BenchFilter::Pass), ..text },
        ),
        ("the JSON redactor (WebAssembly) at on_send", Setup { filter: Some(BenchFilter::Redact), ..text }),
    ];
    let (plain, rates) =
        beside_w1(scratch, scale, messages, size, text, filters.map(|(_, s)| (2, s))).await?;
    let mut rows = Vec::new();
    for ((what, _), rates) in filters.iter().zip(rates) {
        let case = format!("A -> B, {what}, JSON-like text, volatile, {messages} messages");
        let (with, without) = (median(&rates), median(&plain));
        let added = 1e6 / with.max(f64::MIN_POSITIVE) - 1e6 / without.max(f64::MIN_POSITIVE);
        let note = [format!("{added:.2} us more per message"), rounds_note(&rates, &plain)]
            .into_iter()
            .filter(|n| !n.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        rows.push(row("w5", case, size, with, "w1: no filter, the same payloads", without, note));
    }
    Ok(rows)
}

/// `w1` at one size: per round, over the client sockets, raw TCP, with the clients in the
/// nodes' process (only the link between them), and the socket hops the first case
/// crosses carrying the bytes alone ([`hops`]), side by side; `w1`'s three rows.
async fn two_nodes(scratch: &Path, scale: Scale, size: usize, full: usize) -> Result<[Row; 3], DemoError> {
    let messages = scale.messages(full);
    let (mut through, mut raw, mut inside, mut bare) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..scale.rounds {
        through.push(through_nodes(scratch, 2, Setup::default(), false, messages, size).await?);
        raw.push(raw_tcp(messages, size).await?);
        inside.push(through_nodes(scratch, 2, Setup::default(), true, messages, size).await?);
        bare.push(hops::stream(scratch, messages, size).await?);
    }
    let baseline = "raw TCP stream, buffered writes";
    let base = median(&raw);
    let case = format!("A -> B, volatile, {messages} messages");
    let sockets = row("w1", case, size, median(&through), baseline, base, rounds_note(&through, &raw));
    let case = format!("A -> B, volatile, {messages} messages, in-process clients");
    let inside = row("w1", case, size, median(&inside), baseline, base, rounds_note(&inside, &raw));
    let case = format!("A -> B, volatile, {messages} messages, the client sockets' case");
    let hops_baseline = "its socket hops carrying the bytes alone: Unix socket, TCP, Unix socket";
    let note = [
        rounds_note(&through, &bare),
        format!("the hops alone carry {:.2}x of raw TCP", median(&bare) / base.max(f64::MIN_POSITIVE)),
    ]
    .into_iter()
    .filter(|n| !n.is_empty())
    .collect::<Vec<_>>()
    .join("; ");
    let hops = row("w1", case, size, median(&through), hops_baseline, median(&bare), note);
    Ok([sockets, inside, hops])
}

/// Per round: `w1`'s case over the client sockets (two nodes, plaintext) and each of
/// `cases` (a chain of that many nodes, set up so; `w1`'s is set up as `base`),
/// clients on the client sockets, in an order that turns from round to round; the rates of
/// `w1` and of each case, round by round.
async fn beside_w1<const N: usize>(
    scratch: &Path,
    scale: Scale,
    messages: usize,
    size: usize,
    base: Setup,
    cases: [(usize, Setup); N],
) -> Result<(Vec<f64>, [Vec<f64>; N]), DemoError> {
    let mut plain = Vec::with_capacity(scale.rounds);
    let mut rates = std::array::from_fn(|_| Vec::with_capacity(scale.rounds));
    for round in 0..scale.rounds {
        // Each round starts with another of them (job 0 is `w1`), so none always goes first.
        for job in (0..=N).map(|j| (j + round) % (N + 1)) {
            let case = job.checked_sub(1);
            let (count, setup) = case.and_then(|i| cases.get(i)).copied().unwrap_or((2, base));
            let rate = through_nodes(scratch, count, setup, false, messages, size).await?;
            match case.and_then(|i| rates.get_mut(i)) {
                Some(rates) => rates.push(rate),
                None => plain.push(rate),
            }
        }
    }
    Ok((plain, rates))
}

/// The median of `values` (the upper one of an even count; 0 for none).
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// With several rounds, says so and how far they spread: the ratio of each round to its
/// own baseline (`base`, measured in the same round), or the rates when the baseline was
/// measured elsewhere (`base` empty).
fn rounds_note(values: &[f64], base: &[f64]) -> String {
    if values.len() < 2 {
        return String::new();
    }
    let spread = |list: &[f64]| {
        let min = list.iter().copied().fold(f64::INFINITY, f64::min);
        let max = list.iter().copied().fold(0.0, f64::max);
        (min, max)
    };
    if base.len() == values.len() {
        let ratios: Vec<f64> = values.iter().zip(base).map(|(v, b)| v / b.max(f64::MIN_POSITIVE)).collect();
        let (min, max) = spread(&ratios);
        format!("median of {} rounds; ratio per round {min:.2}x-{max:.2}x", values.len())
    } else {
        let (min, max) = spread(values);
        format!("median of {} rounds; {min:.0}-{max:.0} messages/s", values.len())
    }
}

fn row(
    workload: &'static str,
    case: String,
    size: usize,
    per_s: f64,
    baseline: &str,
    base: f64,
    note: String,
) -> Row {
    Row {
        workload,
        case,
        size,
        messages_per_s: per_s,
        baseline: baseline.to_owned(),
        baseline_per_s: base,
        note,
    }
}

/// The table's header line.
pub(crate) fn table_header() -> String {
    format!(
        "{:<4} {:>8} {:>12} {:>9} {:>12} {:>7}  {}",
        "", "size", "messages/s", "MB/s", "baseline/s", "ratio", "case (against baseline)"
    )
}

/// One row of the table.
pub(crate) fn table_line(row: &Row) -> String {
    let note = if row.note.is_empty() { String::new() } else { format!("; {}", row.note) };
    // A row without a rate to compare (latency workloads say theirs in the note).
    let (base, ratio) = if row.baseline_per_s > 0.0 {
        (format!("{:.0}", row.baseline_per_s), format!("{:.2}x", row.ratio()))
    } else {
        ("-".to_owned(), "-".to_owned())
    };
    format!(
        "{:<4} {:>8} {:>12.0} {:>9.1} {base:>12} {ratio:>7}  {} (against {}){note}",
        row.workload,
        size_text(row.size),
        row.messages_per_s,
        row.mb_per_s(),
        row.case,
        row.baseline
    )
}

fn size_text(size: usize) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1024 && s % 1024 == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// The rows as a JSON array (one object per row).
pub(crate) fn to_json(rows: &[Row]) -> String {
    let quoted = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    let items: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{{\"workload\":{},\"case\":{},\"size\":{},\"messages_per_s\":{:.1},\"mb_per_s\":{:.2},\"baseline\":{},\"baseline_per_s\":{},\"ratio\":{},\"note\":{}}}",
                quoted(r.workload),
                quoted(&r.case),
                r.size,
                r.messages_per_s,
                r.mb_per_s(),
                quoted(&r.baseline),
                if r.baseline_per_s > 0.0 { format!("{:.1}", r.baseline_per_s) } else { "null".into() },
                if r.baseline_per_s > 0.0 { format!("{:.4}", r.ratio()) } else { "null".into() },
                quoted(&r.note)
            )
        })
        .collect();
    format!("[\n  {}\n]", items.join(",\n  "))
}

/// A scratch directory, removed when dropped.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    /// A new, empty directory under the system's temporary directory. One left there by a
    /// run that was killed may carry this process's number (numbers are reused), with its
    /// nodes' keys and stores in it: such a name is passed over, never reused.
    pub(crate) fn new(what: &str) -> std::io::Result<Self> {
        for _ in 0..SCRATCH_NAMES_TRIED_MAX {
            let unique = NEXT_SCRATCH.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("linkbus-{what}-{}-{unique}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(Self(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!(
                "{SCRATCH_NAMES_TRIED_MAX} scratch directories named linkbus-{what}-{}-* already exist in {}",
                std::process::id(),
                std::env::temp_dir().display()
            ),
        ))
    }
}

/// Names a [`Scratch`] tries before it gives up.
const SCRATCH_NAMES_TRIED_MAX: usize = 1000;

static NEXT_SCRATCH: AtomicU64 = AtomicU64::new(0);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Puts `messages` numbered payloads of `size` bytes on the first node of a chain of
/// `count` for `orders` on the last, takes them there, checks each, and returns messages
/// per second from the first put to the last get (clients on the client sockets, or in
/// the nodes' process with `in_process`; links plaintext, or Noise with `cipher`).
async fn through_nodes(
    scratch: &Path,
    count: usize,
    setup: Setup,
    in_process: bool,
    messages: usize,
    size: usize,
) -> Result<f64, DemoError> {
    let names: Vec<&str> = ["A", "B", "C", "D", "E"].into_iter().take(count).collect();
    let report = crate::demo::deliver_through(scratch, &names, setup, in_process, messages, size).await?;
    if !report.is_perfect() {
        return Err(DemoError::Io(std::io::Error::other(format!(
            "bench delivery was not perfect: {report}"
        ))));
    }
    Ok(messages as f64 / report.elapsed.as_secs_f64().max(1e-9))
}

/// Urgent messages a second in `w7`.
const URGENT_RATE: u32 = 20;

/// `w7`: urgent messages' put-to-get latency while bulk traffic of every other level
/// saturates the link, against the same on the idle link.
async fn urgent_under_load(scratch: &Path, scale: Scale) -> Result<Row, DemoError> {
    let nodes = start_chain(scratch, &["A", "B"], Setup::default()).await?;
    let (a, b) = (nodes[0].socket_path().to_owned(), nodes[1].socket_path().to_owned());
    let seconds = scale.duration.as_secs_f64().max(0.5) * 2.0;
    let count = ((f64::from(URGENT_RATE) * seconds) as usize).max(10);
    let idle = urgent_latencies(&a, &b, count).await?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let bulk_sent = Arc::new(AtomicU64::new(0));
    let tasks = spawn_bulk(&a, &b, &stop, &bulk_sent);
    // Let the bulk traffic fill the link before measuring.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let before = bulk_sent.load(Ordering::Relaxed);
    let loaded = urgent_latencies(&a, &b, count).await;
    let bulk_per_s =
        (bulk_sent.load(Ordering::Relaxed) - before) as f64 / started.elapsed().as_secs_f64().max(1e-9);
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.map_err(std::io::Error::other)??;
    }
    for node in nodes {
        node.shutdown().await;
    }
    let note = urgent_note(&mut loaded?, &mut { idle }, "under load", "the bulk's");
    Ok(row(
        "w7",
        format!(
            "1 KiB bulk of levels 0..=8 with {count} urgent messages (priority 9, 64 B) at {URGENT_RATE}/s"
        ),
        1024,
        bulk_per_s,
        "the urgent messages on the idle link",
        0.0,
        note,
    ))
}

/// `w7`'s note: the urgent messages' put-to-get p50/p99/max `while` the link is loaded and
/// when idle; `rate` says whose rate the row's column is.
fn urgent_note(loaded: &mut [Duration], idle: &mut [Duration], while_: &str, rate: &str) -> String {
    let [l50, l99, _] = percentiles(loaded);
    let [i50, i99, _] = percentiles(idle);
    let max = |t: &[Duration]| t.iter().max().map_or(0.0, |d| d.as_secs_f64() * 1e6);
    format!(
        "urgent put-to-get p50/p99/max {:.1}/{:.1}/{:.1} ms {while_}, {:.1}/{:.1}/{:.1} ms idle (the rate column is {rate})",
        l50 / 1e3,
        l99 / 1e3,
        max(loaded) / 1e3,
        i50 / 1e3,
        i99 / 1e3,
        max(idle) / 1e3
    )
}

type BulkTask = tokio::task::JoinHandle<Result<(), linkbus_client::ClientError>>;

/// Three producers putting batches of 1 KiB messages of levels 0..=8 on A for `B:orders`,
/// and a consumer draining them on B, until `stop`; `sent` counts the messages put.
fn spawn_bulk(
    a: &Path,
    b: &Path,
    stop: &Arc<std::sync::atomic::AtomicBool>,
    sent: &Arc<AtomicU64>,
) -> Vec<BulkTask> {
    let mut tasks = Vec::new();
    for producer in 0..3u8 {
        let (socket, stop, sent) = (a.to_owned(), stop.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect(&socket).await?;
            let to: Address = "B:orders".parse().expect("valid address");
            let mut round = 0u8;
            while !stop.load(Ordering::Relaxed) {
                let level =
                    linkbus_plugin_api::Priority::level((producer * 3 + round % 3) % 9).expect("0..=8");
                round = round.wrapping_add(1);
                let batch: Vec<Content> = (0..256)
                    .map(|_| Content::buf(to.clone(), vec![1u8; 1024]).with_priority(level))
                    .collect();
                client.put_batch(batch).await?;
                sent.fetch_add(256, Ordering::Relaxed);
            }
            Ok(())
        }));
    }
    let (socket, stop) = (b.to_owned(), stop.clone());
    tasks.push(tokio::spawn(async move {
        let mut client = Client::connect(&socket).await?;
        while !stop.load(Ordering::Relaxed) {
            // Perf (OPT-12): a thousand per get; an answer of ten thousand 1 KiB messages is
            // encoded in one go and holds a runtime worker for milliseconds.
            client.get("orders", 1_000, Duration::from_millis(100)).await?;
        }
        Ok(())
    }));
    tasks
}

/// Put-to-get latencies of `count` urgent messages from A to `B:urgent`, paced at
/// [`URGENT_RATE`] a second.
async fn urgent_latencies(a: &Path, b: &Path, count: usize) -> Result<Vec<Duration>, DemoError> {
    let (producer, consumer) = (Client::connect(a).await?, Client::connect(b).await?);
    // On a task of its own, as the bulk's producers and consumer are.
    let measured = tokio::spawn(urgent_rounds(producer, consumer, count));
    measured.await.map_err(std::io::Error::other)?
}

/// Puts `count` urgent messages at [`URGENT_RATE`], each taken before the next: their
/// put-to-get times.
async fn urgent_rounds(
    mut producer: Client,
    mut consumer: Client,
    count: usize,
) -> Result<Vec<Duration>, DemoError> {
    let to: Address = "B:urgent".parse().expect("valid address");
    let mut times = Vec::with_capacity(count);
    let started = Instant::now();
    for i in 0..count {
        let due = started + Duration::from_secs(1) * u32::try_from(i).unwrap_or(u32::MAX) / URGENT_RATE;
        tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
        let sent = Instant::now();
        producer
            .put(
                Content::buf(to.clone(), payload(i, 64))
                    .with_priority(linkbus_plugin_api::Priority::level(9).expect("9")),
            )
            .await?;
        let got = consumer.get("urgent", 1, Duration::from_secs(30)).await?;
        if !got.first().is_some_and(|m| is_payload(i, 64, &m.content.payload)) {
            return Err(DemoError::Io(std::io::Error::other(format!(
                "urgent message {i} did not arrive intact"
            ))));
        }
        times.push(sent.elapsed());
    }
    Ok(times)
}

/// Waits until round `i` may start, so rounds go at most [`PING_PONG_RATE`] a second.
async fn pace(started: Instant, i: usize) {
    let due = started + Duration::from_secs(1) * u32::try_from(i).unwrap_or(u32::MAX) / PING_PONG_RATE;
    tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
}

/// p50, p99 and p99.9 of `times`, in microseconds.
fn percentiles(times: &mut [Duration]) -> [f64; 3] {
    times.sort_unstable();
    let at = |q: f64| {
        let index =
            ((times.len() as f64 * q).ceil() as usize).saturating_sub(1).min(times.len().saturating_sub(1));
        times.get(index).map_or(0.0, |t| t.as_secs_f64() * 1e6)
    };
    [at(0.50), at(0.99), at(0.999)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_print_as_a_table_and_as_json() {
        let r = row("w1", "A -> B".into(), 1024, 2000.0, "raw", 4000.0, "n\"ote".into());
        assert!((r.ratio() - 0.5).abs() < 1e-9 && (r.mb_per_s() - 2.048).abs() < 1e-9);
        assert!(table_line(&r).contains("1 KiB"), "{}", table_line(&r));
        assert!(table_line(&r).contains("0.50x"), "{}", table_line(&r));
        let json = to_json(&[r]);
        assert!(json.contains("\"ratio\":0.5000") && json.contains("\"note\":\"n\\\"ote\""), "{json}");
        assert_eq!(size_text(64), "64 B");
        let mut times: Vec<Duration> = (1..=1000).map(Duration::from_micros).collect();
        assert_eq!(percentiles(&mut times).map(f64::round), [500.0, 990.0, 999.0]);
        assert_eq!(size_text(1 << 20), "1 MiB");
    }

    #[test]
    fn a_scratch_directory_left_by_a_killed_run_is_passed_over() {
        // The names the next few scratch directories would take, left behind with a store's
        // file in each, as a killed run with this process's number would leave them.
        let next = NEXT_SCRATCH.load(Ordering::Relaxed);
        let stale: Vec<PathBuf> = (next..next + 3)
            .map(|n| std::env::temp_dir().join(format!("linkbus-stale-{}-{n}", std::process::id())))
            .collect();
        for dir in &stale {
            std::fs::create_dir_all(dir).expect("stale directory");
            std::fs::write(dir.join("left-behind"), b"old").expect("stale file");
        }
        let scratch = Scratch::new("stale").expect("a fresh scratch directory");
        let entries = std::fs::read_dir(&scratch.0).expect("readable").count();
        for dir in &stale {
            assert_ne!(&scratch.0, dir, "a name already taken was used");
            std::fs::remove_dir_all(dir).expect("cleaned up");
        }
        assert_eq!(entries, 0, "the scratch directory is empty: {}", scratch.0.display());
    }

    #[test]
    fn rounds_give_the_median_and_their_spread() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(rounds_note(&[5.0], &[10.0]), "", "one round says nothing more");
        assert_eq!(
            rounds_note(&[5.0, 9.0, 6.0], &[10.0, 10.0, 12.0]),
            "median of 3 rounds; ratio per round 0.50x-0.90x"
        );
        assert_eq!(rounds_note(&[5.0, 9.0], &[]), "median of 2 rounds; 5-9 messages/s");
    }
}
