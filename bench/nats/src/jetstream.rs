//! Workload `jetstream`: JetStream publishes of 1 KiB to a file-backed stream, with a window
//! of outstanding acks, and from 16 publishers that each await every ack. Everything stored
//! is read back afterwards (not timed) and checked.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use async_nats::jetstream::stream::{Config as StreamConfig, StorageType, Stream};
use async_nats::jetstream::{self, context::PublishAckFuture, Context};
use futures::StreamExt;

use crate::config::Scale;
use crate::latency::Percentiles;
use crate::payload::{self, Tally};
use crate::report::Row;
use crate::Error;

/// The stream every case writes to; deleted and created again before each case.
const STREAM_NAME: &str = "BENCH";
/// The stream's subjects.
const STREAM_SUBJECTS: &str = "js.>";
/// Payload of every message.
const SIZE_BYTES: usize = 1024;
/// Messages of the windowed case.
const WINDOW_MESSAGES: u64 = 200_000;
/// Publishes whose acks may be outstanding at once in the windowed case.
const WINDOW_ACKS_MAX: usize = 256;
/// Publishers of the one-at-a-time case, each on its own connection.
const PUBLISHERS: u64 = 16;
/// How long the one-at-a-time publishers keep publishing.
const PUBLISHERS_DURATION: Duration = Duration::from_secs(4);
/// Bounds each one-at-a-time publisher by count too, whatever the rate.
const PUBLISHER_MESSAGES_MAX: u64 = 1_000_000;
/// Reading back gives up after this long without a message.
const READ_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Said with every JetStream figure: what its ack does and does not promise.
const SYNC_NOTE: &str = "nats-server acks before its file store syncs (it syncs on an interval, \
2 min by default per the NATS docs), unlike linkbus";

/// Runs both cases against a fresh stream each.
pub(crate) async fn measure(url: &str, scale: &Scale) -> Result<Vec<Row>, Error> {
    let count = scale.count(WINDOW_MESSAGES);
    eprintln!("jetstream: {count} x {SIZE_BYTES} B, window {WINDOW_ACKS_MAX}");
    let window = measure_window(url, count).await?;
    let duration = scale.duration(PUBLISHERS_DURATION);
    eprintln!("jetstream: {PUBLISHERS} publishers one at a time for {duration:?}");
    let publishers = measure_publishers(url, duration).await?;
    Ok(vec![window, publishers])
}

/// Deletes the stream if it exists and creates it empty, file-backed.
async fn fresh_stream(context: &Context) -> Result<Stream, Error> {
    // Not found on the first case: nothing to delete.
    let _ = context.delete_stream(STREAM_NAME).await;
    let config = StreamConfig {
        name: STREAM_NAME.to_string(),
        subjects: vec![STREAM_SUBJECTS.to_string()],
        storage: StorageType::File,
        ..Default::default()
    };
    Ok(context.create_stream(config).await?)
}

/// One connection publishing `count` messages, up to `WINDOW_ACKS_MAX` acks outstanding;
/// timed until the last ack. Each ack must carry the next stream sequence.
async fn measure_window(url: &str, count: u64) -> Result<Row, Error> {
    let context = jetstream::new(async_nats::connect(url).await?);
    let stream = fresh_stream(&context).await?;
    let mut pending: VecDeque<PublishAckFuture> = VecDeque::with_capacity(WINDOW_ACKS_MAX);
    let mut acked = 0;
    let mut out_of_sequence = 0;
    let started = Instant::now();
    for number in 0..count {
        if pending.len() == WINDOW_ACKS_MAX {
            if let Some(ack) = pending.pop_front() {
                acked += 1;
                out_of_sequence += u64::from(ack.await?.sequence != acked);
            }
        }
        let message = payload::make(payload::index(0, number), SIZE_BYTES);
        pending.push_back(context.publish("js.window", message).await?);
    }
    while let Some(ack) = pending.pop_front() {
        acked += 1;
        out_of_sequence += u64::from(ack.await?.sequence != acked);
    }
    let elapsed = started.elapsed();
    let tally = read_back(&stream, 1, count).await?;
    let note = format!(
        "1 connection, window {WINDOW_ACKS_MAX}, file store; {acked} acked, {out_of_sequence} out of \
sequence; read back: {}; {SYNC_NOTE}",
        tally.summary(count)
    );
    Ok(Row::throughput("jetstream", SIZE_BYTES, acked, elapsed, note))
}

/// `PUBLISHERS` connections, each awaiting every ack before its next publish, for
/// `duration`; timed until the last publisher stopped. Latency is publish to ack.
async fn measure_publishers(url: &str, duration: Duration) -> Result<Row, Error> {
    let setup = jetstream::new(async_nats::connect(url).await?);
    let stream = fresh_stream(&setup).await?;
    let mut contexts = Vec::new();
    for _ in 0..PUBLISHERS {
        contexts.push(jetstream::new(async_nats::connect(url).await?));
    }
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = (0..PUBLISHERS)
        .zip(contexts)
        .map(|(source, context)| tokio::spawn(publish_one_at_a_time(context, source, deadline)))
        .collect();
    let mut samples = Vec::new();
    for task in tasks {
        samples.extend(task.await??);
    }
    let elapsed = started.elapsed();
    let acked = samples.len() as u64;
    let tally = read_back(&stream, PUBLISHERS, acked).await?;
    let note = format!(
        "{PUBLISHERS} connections, each publish awaits its ack (latency = publish to ack), file store; \
read back: {}; {SYNC_NOTE}",
        tally.summary(acked)
    );
    let mut row = Row::throughput("jetstream", SIZE_BYTES, acked, elapsed, note);
    row.latency = Percentiles::of(samples);
    Ok(row)
}

/// Publishes from `source` one message at a time until `deadline`; returns each
/// publish-to-ack duration.
async fn publish_one_at_a_time(
    context: Context,
    source: u64,
    deadline: Instant,
) -> Result<Vec<Duration>, Error> {
    let subject = format!("js.sync.{source}");
    let mut samples = Vec::new();
    let mut number = 0;
    while Instant::now() < deadline && number < PUBLISHER_MESSAGES_MAX {
        let message = payload::make(payload::index(source, number), SIZE_BYTES);
        let sent = Instant::now();
        context.publish(subject.clone(), message).await?.await?;
        samples.push(sent.elapsed());
        number += 1;
    }
    Ok(samples)
}

/// Reads the whole stream with an ordered consumer and checks every payload, in order per
/// publisher; stops after `expected` messages or `READ_IDLE_TIMEOUT` without one.
async fn read_back(stream: &Stream, sources: u64, expected: u64) -> Result<Tally, Error> {
    let config = OrderedConfig { deliver_policy: DeliverPolicy::All, ..Default::default() };
    let mut messages = stream.create_consumer(config).await?.messages().await?;
    let mut tally = Tally::new(usize::try_from(sources)?);
    while tally.received < expected {
        match tokio::time::timeout(READ_IDLE_TIMEOUT, messages.next()).await {
            Ok(Some(message)) => tally.take(&message?.payload, SIZE_BYTES),
            Ok(None) | Err(_) => break,
        }
    }
    Ok(tally)
}
