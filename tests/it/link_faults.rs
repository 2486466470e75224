//! The link protocol over a faulty network (a fault proxy between A and B, plaintext links):
//! connections cut again and again, bit flips (refused by CRC, asked again with a NAK, or
//! tearing the connection down when they hit a header), one-byte writes, stalls longer than
//! the keepalive, and a long black-out with large backlogs in both directions. The history
//! checker must count no lost, duplicated, reordered or corrupted message.

use crate::support;

use std::time::{Duration, Instant};

use linkbus::{Client, Content};
use support::history::History;
use support::proxy::FaultProxy;
use support::{NodeProcess, Scratch, stderr, stdout};

const FAST_LINKS: &str = "links: { reconnect_backoff_min_ms: 20, reconnect_backoff_max_ms: 200, \
     ping_interval_ms: 500, pong_timeout_ms: 1000 }\nmessages: { message_bytes_max: 100000000 }";

/// `FAST_LINKS` with more `links` keys (`extra`: `key: value, ...`).
fn fast_links_with(extra: &str) -> String {
    FAST_LINKS.replacen("links: { ", &format!("links: {{ {extra}, "), 1)
}

/// B listens; A reaches it only through the proxy; both have queue `q`; `secure` chooses
/// Noise or plaintext links.
fn start_behind_proxy(s: &Scratch, secure: bool) -> (NodeProcess, NodeProcess, FaultProxy) {
    start_behind_proxy_env(s, secure, &[])
}

/// Like `start_behind_proxy`, with extra environment variables for B.
fn start_behind_proxy_env(
    s: &Scratch,
    secure: bool,
    b_env: &[(&str, &str)],
) -> (NodeProcess, NodeProcess, FaultProxy) {
    start_behind(s, secure, b_env, false)
}

/// Plaintext, with more `links` keys for A (`key: value, ...`).
fn start_behind_proxy_with_a_links(s: &Scratch, a_links: &str) -> (NodeProcess, NodeProcess, FaultProxy) {
    start_behind_with(s, false, &[], false, a_links)
}

/// The general form: `framed` makes the proxy parse plaintext frames from the start.
fn start_behind(
    s: &Scratch,
    secure: bool,
    b_env: &[(&str, &str)],
    framed: bool,
) -> (NodeProcess, NodeProcess, FaultProxy) {
    start_behind_with(s, secure, b_env, framed, "")
}

/// The general form, with more `links` keys for A (`a_links`, possibly empty).
fn start_behind_with(
    s: &Scratch,
    secure: bool,
    b_env: &[(&str, &str)],
    framed: bool,
    a_links: &str,
) -> (NodeProcess, NodeProcess, FaultProxy) {
    let (a_key, b_key) = if secure { (s.keys("A"), s.keys("B")) } else { (String::new(), String::new()) };
    let key = |k: &str| if secure { format!(", public_key: '{k}'") } else { String::new() };
    let security = |name: &str| {
        if secure { s.security_yaml(name) } else { "security: { insecure_plaintext: true }".to_owned() }
    };
    let b_yaml = format!(
        "node: {{ name: B, listen: 127.0.0.1:0 }}\npeers: [ {{ name: A{} }} ]\nqueues: [ {{ name: q, order: fifo }} ]\n{FAST_LINKS}\n{}\n",
        key(&a_key),
        security("B")
    );
    let b = s.start_node_env("B", &["-c", s.write("b.yaml", &b_yaml).to_str().unwrap()], b_env);
    let proxy = FaultProxy::start(&b.listen_address());
    if framed {
        proxy.set_framed();
    }
    let a_yaml = format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '{}'{} }} ]\nqueues: [ {{ name: q, order: fifo }} ]\n{}\n{}\n",
        proxy.address,
        key(&b_key),
        if a_links.is_empty() { FAST_LINKS.to_owned() } else { fast_links_with(a_links) },
        security("A")
    );
    let a = s.start_node("A", &["-c", s.write("a.yaml", &a_yaml).to_str().unwrap()]);
    a.wait_for_log("Link up.", 1, Duration::from_secs(10));
    (a, b, proxy)
}

fn get_all(s: &Scratch, node: &str, count: usize, within: Duration) -> String {
    s.take_all(node, "q", count, within)
}

#[test]
fn repeated_cuts_lose_nothing_and_duplicate_nothing() {
    let s = Scratch::new();
    let (a, _b, proxy) = start_behind_proxy(&s, true);
    let lines: String = (0..30_000).map(|i| format!("m{i}\n")).collect();
    let history = stream_through(&s, &lines, || {
        for _ in 0..15 {
            std::thread::sleep(Duration::from_millis(60));
            proxy.cut();
        }
    });
    println!("{history:?}");
    assert!(history.is_clean(), "{history:?}");
    assert!(a.log_text().matches("Link up.").count() > 3, "the link really was cut:\n{}", a.log_text());
}

#[test]
fn large_backlogs_both_ways_recover_after_a_blackout() {
    let s = Scratch::new();
    let (_a, _b, proxy) = start_behind_proxy(&s, true);
    proxy.set_blackhole(true);
    let payload = "x".repeat(30_000);
    let lines: String = (0..1300).map(|i| format!("{i:04}{payload}\n")).collect();
    for (node, to) in [("A", "B:q"), ("B", "A:q")] {
        let out = s.run_with_input(
            &["put", "--node", node, "--to", to, "-"],
            lines.as_bytes(),
            Duration::from_secs(60),
        );
        assert!(out.status.success(), "{}", stderr(&out));
    }
    std::thread::sleep(Duration::from_secs(2));
    proxy.set_blackhole(false);
    proxy.cut();
    for node in ["A", "B"] {
        let got = get_all(&s, node, 1300, Duration::from_secs(60));
        assert_eq!(got.lines().count(), 1300, "node {node} got everything");
        assert!(got == lines, "node {node}: once each, in order");
    }
}

/// Streams `lines` from A to `B:q` in small pieces (so faults land mid-stream), runs
/// `during` meanwhile, then gets everything from B and checks the history.
fn stream_through(s: &Scratch, lines: &str, during: impl FnOnce()) -> History {
    let put = s.put_streaming(
        &["put", "--node", "A", "--to", "B:q", "-"],
        lines,
        4 * 1024,
        Duration::from_millis(3),
    );
    during();
    put.finish();
    let count = lines.lines().count();
    let got = get_all(s, "B", count, Duration::from_secs(60));
    let sent: Vec<&str> = lines.lines().collect();
    let received: Vec<&str> = got.lines().collect();
    History::check(&sent, &received)
}

fn status_number(s: &Scratch, node: &str, field: &str) -> u64 {
    let text = stdout(&s.run(&["status", "--node", node]));
    let at = text.find(field).unwrap_or_else(|| panic!("no '{field}' in {text}"));
    text[at + field.len()..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn bit_flips_are_caught_and_resent() {
    let s = Scratch::new();
    // Plaintext, so damaged messages reach the CRC and NAK path (under Noise a flip fails
    // decryption and tears the connection down instead).
    let (_a, _b, proxy) = start_behind_proxy(&s, false);
    let lines: String = (0..6_000).map(|i| format!("flip {i:05} {}\n", "p".repeat(40))).collect();
    proxy.set_flip_every(20_000);
    let history = stream_through(&s, &lines, || {});
    proxy.set_flip_every(0);
    println!("{history:?}, bits flipped: {}", proxy.flipped());
    assert!(history.is_clean(), "{history:?}");
    assert!(proxy.flipped() > 10, "the proxy flipped bits");
    let naks = status_number(&s, "B", "naks sent");
    let renegotiations = status_number(&s, "A", "renegotiations");
    println!("B sent {naks} NAKs; A renegotiated {renegotiations} times");
    assert!(naks > 0, "damaged messages were refused by NAK");
    if std::env::var_os("LINKBUS_TEST_SHOW_LOGS").is_some() {
        println!("A:\n{}\nB:\n{}", _a.log_text(), _b.log_text());
    }
}

#[test]
fn one_byte_writes_and_stalls_past_the_keepalive_lose_nothing() {
    let s = Scratch::new();
    let (a, _b, proxy) = start_behind_proxy(&s, true);
    let lines: String = (0..3_000).map(|i| format!("slow {i:05}\n")).collect();
    proxy.set_trickle(true);
    let history = stream_through(&s, &lines, || {
        std::thread::sleep(Duration::from_millis(200));
        proxy.set_stall(true);
        // Longer than ping_interval_ms + pong_timeout_ms (1.5 s): the link must notice.
        std::thread::sleep(Duration::from_millis(2_500));
        proxy.set_stall(false);
        proxy.cut();
    });
    println!("{history:?}");
    assert!(history.is_clean(), "{history:?}");
    assert!(
        a.log_text().contains("no answer within the pong timeout"),
        "the stall was detected:\n{}",
        a.log_text()
    );
}

#[test]
fn the_history_checker_counts_each_kind_of_fault() {
    let sent = ["a", "b", "c", "d"];
    let h = History::check(&sent, &["a", "c", "b", "c", "x"]);
    assert_eq!((h.lost, h.duplicated, h.reordered, h.corrupted), (1, 1, 1, 1));
    assert!(History::check(&sent, &sent).is_clean());
}

/// Negative control: with B's duplicate detection switched off (a test-only mode), a run
/// where the proxy duplicates frames must make the checker report duplicates; so a clean
/// report from the fault tests means something. Duplicated frames (not bit flips, whose
/// resends may all land before delivery) make every run show them.
#[test]
fn without_dedup_the_checker_reports_duplicates() {
    let s = Scratch::new();
    let (_a, b, proxy) = start_behind(&s, false, &[("LINKBUS_TEST_SKIP_DEDUP", "1")], true);
    b.wait_for_log("duplicate detection is OFF", 1, Duration::from_secs(5));
    proxy.set_frame_faults(5, 0, 0);
    let lines: String = (0..3_000).map(|i| format!("dup {i:05}\n")).collect();
    let history = stream_through(&s, &lines, || {});
    proxy.set_frame_faults(0, 0, 0);
    println!("negative control: {history:?}, frame faults: {}", proxy.frame_faults());
    assert!(proxy.frame_faults() > 100, "the proxy duplicated frames");
    assert!(history.duplicated > 0, "the checker must see the duplicates: {history:?}");
}

#[test]
fn duplicated_swapped_frames_and_dropped_acks_lose_nothing() {
    let s = Scratch::new();
    // Plaintext, so the proxy can see frames (under Noise it could only break them).
    let (_a, _b, proxy) = start_behind(&s, false, &[], true);
    proxy.set_frame_faults(7, 11, 3);
    let lines: String = (0..5_000).map(|i| format!("frame {i:05}\n")).collect();
    let history = stream_through(&s, &lines, || {});
    println!("{history:?}, frame faults: {}", proxy.frame_faults());
    assert!(history.is_clean(), "{history:?}");
    assert!(proxy.frame_faults() > 100, "the proxy meddled");
}

#[test]
fn bit_flips_on_noise_links_tear_down_and_resync() {
    let s = Scratch::new();
    let (a, b, proxy) = start_behind_proxy(&s, true);
    let lines: String = (0..4_000).map(|i| format!("sealed {i:05} {}\n", "n".repeat(40))).collect();
    proxy.set_flip_every(40_000);
    let history = stream_through(&s, &lines, || {
        // Faults for a while, then a clean network: the link must resync and finish.
        std::thread::sleep(Duration::from_millis(1_500));
        proxy.set_flip_every(0);
    });
    println!("{history:?}, bits flipped: {}", proxy.flipped());
    assert!(history.is_clean(), "{history:?}");
    assert!(proxy.flipped() > 3, "the proxy flipped bits");
    let logs = format!("{}{}", a.log_text(), b.log_text());
    assert!(logs.contains("a message failed to decrypt"), "a flip fails decryption and ends the connection");
    assert!(a.log_text().matches("Link up.").count() > 1, "and the link renegotiates");
}

/// A message larger than any connection carries: the proxy cuts each connection after
/// 6 MiB, so only resuming from the byte the receiver holds (not from the message's start)
/// gets a 48 MiB message across. Without the resume it never arrives.
#[test]
fn a_large_message_crosses_a_link_that_breaks_before_it_could_carry_it_whole() {
    const BYTES: usize = 48 << 20;
    let s = Scratch::new();
    let (a, b, proxy) = start_behind_proxy(&s, true);
    proxy.set_cut_after_bytes(6 << 20);
    let payload: Vec<u8> = (0..BYTES).map(|i| (i % 253) as u8).collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let started = Instant::now();
    let got = runtime.block_on(async {
        let mut client = Client::connect(&a.socket).await.unwrap();
        client.put(Content::buf("B:q".parse().unwrap(), payload.clone())).await.unwrap();
        let mut client = Client::connect(&b.socket).await.unwrap();
        client.get("q", 1, Duration::from_secs(60)).await.unwrap()
    });
    proxy.set_cut_after_bytes(0);
    assert_eq!(got.len(), 1, "the message arrived");
    assert!(got[0].content.payload[..] == payload[..], "intact");
    let resumed = status_number(&s, "A", "resumed bytes");
    let connections = a.log_text().matches("Link up.").count();
    println!(
        "{} MiB arrived after {:?}: {} connections cut after 6 MiB, {connections} connections, \
         {resumed} bytes resumed (not sent again)",
        BYTES >> 20,
        started.elapsed(),
        proxy.cuts()
    );
    assert!(proxy.cuts() >= 7, "no connection carried more than 6 MiB");
    assert!(resumed >= (40 << 20), "later connections resumed inside the message: {resumed}");
}

const PACED_SIZE: usize = 64 << 10;
const PACED_COUNT: usize = 320;

/// A → proxy carrying 4 MiB a second → B, A with more `links` keys (`a_links`): puts 320
/// messages of 64 KiB in batches of 16 on A through the Rust client, polls A's `queued`
/// every 20 ms while that runs (and once after), then takes everything on B and checks each
/// message is there, intact and in order. Returns the most messages seen queued at A.
fn put_ahead_of_a_slow_link(a_links: &str) -> u64 {
    let s = Scratch::new();
    let (a, b, proxy) = start_behind_proxy_with_a_links(&s, a_links);
    proxy.set_rate(4 << 20);
    let socket = a.socket.clone();
    let producer = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let mut client = Client::connect(&socket).await.unwrap();
            for slice in (0..PACED_COUNT).collect::<Vec<_>>().chunks(16) {
                let contents =
                    slice.iter().map(|&i| Content::buf("B:q".parse().unwrap(), vec![i as u8; PACED_SIZE]));
                client.put_batch(contents.collect()).await.unwrap();
            }
        });
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut most = 0;
    // Once more after the producer is done: the link takes seconds to drain what it left.
    loop {
        let done = producer.is_finished();
        most = most.max(status_number(&s, "A", "queued"));
        if done || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    producer.join().unwrap();
    proxy.set_rate(0);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let got = runtime.block_on(async {
        let mut client = Client::connect(&b.socket).await.unwrap();
        let mut got = Vec::new();
        while got.len() < PACED_COUNT {
            let more = client.get("q", 64, Duration::from_secs(20)).await.unwrap();
            if more.is_empty() {
                break;
            }
            got.extend(more.into_iter().map(|m| m.content.payload));
        }
        got
    });
    println!("most messages queued at A while the producer ran: {most}");
    assert_eq!(got.len(), PACED_COUNT, "all arrived");
    for (i, payload) in got.iter().enumerate() {
        assert!(
            payload.len() == PACED_SIZE && payload.iter().all(|&b| b == i as u8),
            "message {i} intact, in order"
        );
    }
    most
}

/// A producer faster than its link is held to the link's pace while the link is up and
/// moving: A's transmission queue stays near `links.queue_pace_bytes` (4 MiB by default, 64
/// messages of 64 KiB) rather than taking all 20 MiB the producer has (its
/// `queue_bytes_max` is 256 MiB).
#[test]
fn a_producer_faster_than_its_link_waits_for_it_instead_of_filling_the_queue() {
    let most = put_ahead_of_a_slow_link("");
    // 64 messages at the pace bound; a put call whose second of pacing ran out lets the rest
    // of its batch of 16 through; and the polling's slack.
    assert!(most <= 100, "A's queue stayed near the pace bound: {most}");
    assert!(most >= 32, "the producer did run ahead of the link: {most}");
}

/// With `links.queue_pace_bytes: 0` nothing holds the producer back: A's queue takes nearly
/// everything it puts, and the link then drains it.
#[test]
fn without_a_pace_bound_a_producer_fills_the_queue_of_a_slow_link() {
    let most = put_ahead_of_a_slow_link("queue_pace_bytes: 0");
    assert!(most >= 200, "A's queue took what the producer had: {most}");
}
