//! Priority under saturation, on real node processes over a Noise link: while a large
//! message streams from A to B, an urgent message put after it arrives long before it,
//! because messages travel in packets on per-priority channels and the scheduler serves the
//! urgent channel at the next packet. Latencies are printed for the issue notes (they are
//! measured here, not asserted: speed belongs to the benchmarks).

use crate::support;

use std::time::{Duration, Instant};

use linkbus::{Client, Content, Priority};
use support::Scratch;

const BULK_BYTES: usize = 64 << 20;
const BUF: usize = 256 << 10;

/// Puts an urgent message on A and waits for it on B; returns the time that took.
async fn urgent_round_trip(a: &mut Client, b: &mut Client, n: u32) -> Duration {
    let started = Instant::now();
    let urgent = Content::buf("B:urgent".parse().unwrap(), format!("urgent {n}"))
        .with_priority(Priority::level(9).unwrap());
    a.put(urgent).await.unwrap();
    let got = b.get("urgent", 1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(got.len(), 1, "the urgent message arrived");
    assert_eq!(&got[0].content.payload[..], format!("urgent {n}").as_bytes());
    started.elapsed()
}

#[test]
fn an_urgent_message_overtakes_a_large_one_on_the_same_link() {
    let s = Scratch::new();
    let limits = format!(
        "messages: {{ message_bytes_max: 100000000 }}\n\
         plugins: {{ transport: {{ kind: tcp, send_buffer_bytes: {BUF}, receive_buffer_bytes: {BUF} }} }}"
    );
    let b_extra = format!("{limits}\nqueues: [ {{ name: bulk }}, {{ name: urgent }} ]");
    let (a, b) = s.start_pair(&limits, &b_extra);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut put_a = Client::connect(&a.socket).await.unwrap();
        let mut get_b = Client::connect(&b.socket).await.unwrap();
        let idle: Vec<Duration> = {
            let mut v = Vec::new();
            for n in 0..5 {
                v.push(urgent_round_trip(&mut put_a, &mut get_b, n).await);
            }
            v
        };

        let payload: Vec<u8> = (0..BULK_BYTES).map(|i| (i % 251) as u8).collect();
        let bulk = Content::buf("B:bulk".parse().unwrap(), payload.clone()).with_priority(Priority::level(0).unwrap());
        let bulk_put = Instant::now();
        put_a.put(bulk).await.unwrap();
        let accepted = bulk_put.elapsed();
        // Urgent messages one after another while the large one streams (bounded in count
        // and time), until it has arrived.
        let mut busy = Vec::new();
        let mut got = Vec::new();
        for n in 100..1_100 {
            busy.push(urgent_round_trip(&mut put_a, &mut get_b, n).await);
            got = get_b.get("bulk", 1, Duration::ZERO).await.unwrap();
            if !got.is_empty() || bulk_put.elapsed() > Duration::from_secs(120) {
                break;
            }
        }
        let bulk_done = bulk_put.elapsed();
        assert!(busy.len() > 1, "urgent messages arrived while the large one was still streaming");
        if got.is_empty() {
            got = get_b.get("bulk", 1, Duration::from_secs(120)).await.unwrap();
        }
        assert_eq!(got.len(), 1, "the large message arrived");
        assert!(got[0].content.payload[..] == payload[..], "intact");
        let first = busy[0];
        busy.sort();
        println!(
            "idle urgent latency: {idle:?}\nbulk of {} MiB accepted in {accepted:?}, delivered after about {bulk_done:?}\n\
             {} urgent messages went through while it streamed; latency of the first {first:?}, then \
             min {:?}, median {:?}, max {:?}",
            BULK_BYTES >> 20,
            busy.len(),
            busy[0],
            busy[busy.len() / 2],
            busy[busy.len() - 1],
        );
    });
    let status = s.run(&["status", "--node", "A"]);
    println!("{}", support::stdout(&status));
}

/// With every level waiting, a link shares itself between the levels in proportion to their
/// quotas (`links.priority_quotas`), and inside a level messages keep their order.
#[test]
fn a_saturated_link_is_shared_by_the_priority_quotas() {
    const PER_LEVEL: usize = 2_000;
    const WINDOW: usize = 2_000;
    let s = Scratch::new();
    let quotas = [1u64, 2, 3, 4, 5, 6, 7, 8, 9, 10];
    let a_extra = "links: { reconnect_backoff_min_ms: 50, reconnect_backoff_max_ms: 300, \
                   priority_quotas: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] }";
    let (a, mut b) = s.start_pair(a_extra, "queues: [ { name: all, order: fifo } ]");
    let b_address = b.listen_address();
    assert!(b.stop(), "B stops");
    a.wait_for_log("Link down.", 1, Duration::from_secs(10));
    // Every level queues up while B is away, lowest first.
    for level in 0..10 {
        let lines: String =
            (0..PER_LEVEL).map(|i| format!("L{level} {i:05} {}\n", "x".repeat(200))).collect();
        let put = s.run_with_input(
            &["put", "--node", "A", "--to", "B:all", "--priority", &level.to_string(), "-"],
            lines.as_bytes(),
            Duration::from_secs(60),
        );
        assert!(put.status.success(), "{}", support::stderr(&put));
    }
    let b_config = s.path().join("b.yaml");
    let _b = s.start_node("B", &["-c", b_config.to_str().unwrap(), "--listen", &b_address]);
    let get =
        s.run(&["get", "--node", "B", "all", "--count", &(10 * PER_LEVEL).to_string(), "--wait", "60s"]);
    assert!(get.status.success(), "{}", support::stderr(&get));
    let arrived: Vec<(usize, usize)> = support::stdout(&get)
        .lines()
        .map(|l| {
            let mut words = l.split(' ');
            let level = words.next().unwrap()[1..].parse().unwrap();
            (level, words.next().unwrap().parse().unwrap())
        })
        .collect();
    assert_eq!(arrived.len(), 10 * PER_LEVEL, "everything arrived");
    for level in 0..10 {
        let order: Vec<usize> = arrived.iter().filter(|(l, _)| *l == level).map(|(_, i)| *i).collect();
        assert_eq!(order, (0..PER_LEVEL).collect::<Vec<_>>(), "level {level} keeps its order");
    }
    // While every level still waits (level 9 alone would need 5.5 windows to run dry),
    // the shares follow the quotas.
    let total: u64 = quotas.iter().sum();
    let mut report = Vec::new();
    for (level, quota) in quotas.iter().enumerate() {
        let got = arrived[..WINDOW].iter().filter(|(l, _)| *l == level).count() as f64;
        let expected = WINDOW as f64 * *quota as f64 / total as f64;
        report.push(format!("level {level}: {got} (quota share {expected:.0})"));
        assert!(
            (got - expected).abs() <= 0.25 * expected + 10.0,
            "level {level} got {got} of the first {WINDOW}, expected about {expected:.0}"
        );
    }
    println!("first {WINDOW} of {} arrivals:\n{}", 10 * PER_LEVEL, report.join("\n"));
}
