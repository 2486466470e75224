//! Workload `reqrep`: request/reply round-trip latency of 64 B, one request at a time at a
//! fixed pace, answered by a responder on its own connection.

use std::time::{Duration, Instant};

use async_nats::Client;
use futures::StreamExt;
use tokio::time::MissedTickBehavior;

use crate::config::Scale;
use crate::latency::Percentiles;
use crate::payload::{self, Tally};
use crate::report::Row;
use crate::Error;

/// The subject the responder answers on.
const SUBJECT: &str = "echo";
/// Payload of every request and reply.
const SIZE_BYTES: usize = 64;
/// Measured round trips.
const ROUNDS: u64 = 5_000;
/// Round trips before the measured ones, not counted.
const WARMUP_ROUNDS: u64 = 200;
/// One request starts every this often (1,000 a second), so latency is not queueing.
const PACE: Duration = Duration::from_millis(1);

/// Starts the responder, measures, stops the responder.
pub(crate) async fn measure(url: &str, scale: &Scale) -> Result<Vec<Row>, Error> {
    let (rounds, warmup) = (scale.count(ROUNDS), scale.count(WARMUP_ROUNDS));
    eprintln!("reqrep: {rounds} x {SIZE_BYTES} B after {warmup} warm-up");
    let responder = async_nats::connect(url).await?;
    let mut requests = responder.subscribe(SUBJECT).await?;
    responder.flush().await?;
    let echo = tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            if let Some(reply) = request.reply {
                responder.publish(reply, request.payload).await?;
            }
        }
        Ok::<(), Error>(())
    });
    let requester = async_nats::connect(url).await?;
    let measured = round_trips(&requester, rounds, warmup).await;
    echo.abort();
    let (samples, tally) = measured?;
    let note = format!(
        "{rounds} rounds one at a time, paced {}/s, after {warmup} warm-up; responder on its own connection; replies {}",
        Duration::from_secs(1).as_micros() / PACE.as_micros(),
        tally.summary(rounds + warmup)
    );
    let row = Row {
        workload: "reqrep",
        size_bytes: SIZE_BYTES,
        messages_per_s: None,
        latency: Percentiles::of(samples),
        note,
    };
    Ok(vec![row])
}

/// Sends `warmup + rounds` requests at the pace; returns the measured round trips and the
/// tally of every reply.
async fn round_trips(client: &Client, rounds: u64, warmup: u64) -> Result<(Vec<Duration>, Tally), Error> {
    let mut ticker = tokio::time::interval(PACE);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut samples = Vec::with_capacity(usize::try_from(rounds)?);
    let mut tally = Tally::new(1);
    for number in 0..warmup + rounds {
        ticker.tick().await;
        let request = payload::make(payload::index(0, number), SIZE_BYTES);
        let sent = Instant::now();
        let reply = client.request(SUBJECT, request).await?;
        let round_trip = sent.elapsed();
        tally.take(&reply.payload, SIZE_BYTES);
        if number >= warmup {
            samples.push(round_trip);
        }
    }
    Ok((samples, tally))
}
