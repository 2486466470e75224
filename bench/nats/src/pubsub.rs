//! Workload `core`: NATS core pub/sub throughput, one publishing and one subscribing
//! connection, from the first publish to the last message received.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::{Client, ConnectOptions, Event, Subject, Subscriber};
use futures::StreamExt;

use crate::config::Scale;
use crate::payload::{self, Tally};
use crate::report::Row;
use crate::Error;

/// Payload sizes and their default message counts.
const CASES: [(usize, u64); 2] = [(64, 1_000_000), (1024, 500_000)];
/// Messages the subscriber's client may hold before it drops (NATS core drops for slow
/// consumers instead of pushing back). Larger than a run, so the client never drops;
/// costs up to one run's messages in memory (~600 MB at 1 KiB) when the checker lags.
const SUBSCRIPTION_MESSAGES_MAX: usize = 1 << 20;
/// The subscriber gives up after this long without a message (the rest were dropped).
const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// No case runs longer than this, whatever the rate.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs every size.
pub(crate) async fn measure(url: &str, scale: &Scale) -> Result<Vec<Row>, Error> {
    let mut rows = Vec::new();
    for (size_bytes, count) in CASES {
        let count = scale.count(count);
        eprintln!("core: {count} x {size_bytes} B");
        rows.push(measure_size(url, size_bytes, count).await?);
    }
    Ok(rows)
}

/// Events that mean messages were or may have been lost.
#[derive(Debug, Default)]
struct Losses {
    /// Slow-consumer events; a lower bound, the client may drop events too.
    slow_consumer: AtomicU64,
    /// Disconnects, e.g. the server cutting off a slow consumer.
    disconnected: AtomicU64,
}

/// Connects with a large subscription capacity, counting loss events.
async fn connect(url: &str, losses: &Arc<Losses>) -> Result<Client, Error> {
    let losses = Arc::clone(losses);
    let options =
        ConnectOptions::new().subscription_capacity(SUBSCRIPTION_MESSAGES_MAX).event_callback(move |event| {
            let losses = Arc::clone(&losses);
            async move {
                match event {
                    Event::SlowConsumer(_) => losses.slow_consumer.fetch_add(1, Ordering::Relaxed),
                    Event::Disconnected => losses.disconnected.fetch_add(1, Ordering::Relaxed),
                    _ => 0,
                };
            }
        });
    Ok(options.connect(url).await?)
}

/// One size: subscribe, publish everything from another connection, count what arrives.
async fn measure_size(url: &str, size_bytes: usize, count: u64) -> Result<Row, Error> {
    let losses = Arc::new(Losses::default());
    let subject = Subject::from(format!("core.{size_bytes}"));
    let subscriber = connect(url, &losses).await?;
    let mut subscription = subscriber.subscribe(subject.clone()).await?;
    // The PONG to this flush means the server has the subscription.
    subscriber.flush().await?;
    let publisher = connect(url, &losses).await?;

    let started = Instant::now();
    let publishing = tokio::spawn(publish(publisher, subject, size_bytes, count));
    let (tally, last_received) = receive(&mut subscription, size_bytes, count, started).await;
    publishing.await??;

    let elapsed = last_received.duration_since(started);
    let mut note = format!("1 publisher + 1 subscriber connection; {}", tally.summary(count));
    let slow = losses.slow_consumer.load(Ordering::Relaxed);
    let disconnected = losses.disconnected.load(Ordering::Relaxed);
    if tally.received < count || slow > 0 || disconnected > 0 {
        note += &format!(
            "; DROPPED {} (slow-consumer events {slow}, disconnects {disconnected})",
            count - tally.received.min(count)
        );
    }
    Ok(Row::throughput("core", size_bytes, tally.received, elapsed, note))
}

/// Publishes as fast as the client takes messages, then flushes.
async fn publish(client: Client, subject: Subject, size_bytes: usize, count: u64) -> Result<(), Error> {
    for number in 0..count {
        client.publish(subject.clone(), payload::make(payload::index(0, number), size_bytes)).await?;
    }
    client.flush().await?;
    Ok(())
}

/// Takes messages until all arrived, none came for `IDLE_TIMEOUT`, or the run timed out;
/// returns the tally and when the last message arrived.
async fn receive(
    subscription: &mut Subscriber,
    size_bytes: usize,
    count: u64,
    started: Instant,
) -> (Tally, Instant) {
    let mut tally = Tally::new(1);
    let mut last_received = started;
    while tally.received < count && last_received.duration_since(started) < RUN_TIMEOUT {
        match tokio::time::timeout(IDLE_TIMEOUT, subscription.next()).await {
            Ok(Some(message)) => {
                tally.take(&message.payload, size_bytes);
                last_received = Instant::now();
            }
            Ok(None) | Err(_) => break,
        }
    }
    (tally, last_received)
}
