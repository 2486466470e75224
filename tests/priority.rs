//! Priority under saturation, on real node processes over a Noise link: while a large
//! message streams from A to B, an urgent message put after it arrives long before it,
//! because messages travel in packets on per-priority channels and the scheduler serves the
//! urgent channel at the next packet. Latencies are printed for the issue notes (they are
//! measured here, not asserted: speed belongs to the benchmarks).

mod support;

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
