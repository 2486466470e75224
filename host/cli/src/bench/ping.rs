//! `w3`: a ping-pong between clients of two nodes, against raw TCP and the bare socket
//! hops.

use std::path::Path;
use std::time::{Duration, Instant};

use linkbus_plugin_api::{Address, Content, MessageId};

use super::raw::raw_ping_pong;
use super::{Row, client_of, hops, pace, percentiles, row, start_chain};
use crate::demo::{DemoError, is_payload, payload};
use linkbus_client::{Client, ClientError, Consumer};
use linkbus_host::Node;

/// Round trips of a ping-pong, at most this many a second.
pub(super) const PING_PONG_RATE: u32 = 1_000;

/// `w3`: `rounds` round trips of 64 B between A and B (a client on B sends each back), one
/// at a time and at most [`PING_PONG_RATE`] a second, against the same over raw TCP; with
/// `in_process`, both clients are in-process clients of their nodes.
pub(super) async fn ping_pong(scratch: &Path, rounds: usize, in_process: bool) -> Result<Row, DemoError> {
    let nodes = start_chain(scratch, &["A", "B"], super::Setup::default()).await?;
    let (a, b) = (&nodes[0], &nodes[1]);
    // Each side as a request/reply program has it: a consumer the node pushes to, and a
    // producer that does not wait for each put's answer (they are checked at the end).
    let (echo_in, echo_out) = (consumer_of(b, in_process).await?, client_of(b, in_process).await?);
    let echoed = tokio::spawn(echo(echo_in, echo_out, rounds));
    let (mut consumer, mut producer) = (consumer_of(a, in_process).await?, client_of(a, in_process).await?);
    // On a task of its own, as the echo is (and as the raw baseline's ends are).
    let pinged = tokio::spawn(async move {
        let to: Address = "B:orders".parse().expect("valid address");
        let mut times = Vec::with_capacity(rounds);
        let started = Instant::now();
        for i in 0..rounds {
            pace(started, i).await;
            let sent = Instant::now();
            producer.put_async(Content::buf(to.clone(), payload(i, 64))).await?;
            let back =
                tokio::time::timeout(ECHO_WAIT, consumer.next()).await.map_err(std::io::Error::other)??;
            if back.len() != 1 || !back.first().is_some_and(|m| is_payload(i, 64, &m.content.payload)) {
                return Err(DemoError::Io(std::io::Error::other(format!(
                    "ping-pong: round {i} came back wrong"
                ))));
            }
            times.push(sent.elapsed());
        }
        let per_s = rounds as f64 / started.elapsed().as_secs_f64().max(1e-9);
        all_accepted(producer.flush().await?)?;
        Ok((times, per_s))
    });
    let (mut times, per_s) = pinged.await.map_err(std::io::Error::other)??;
    echoed.await.map_err(std::io::Error::other)??;
    for node in nodes {
        node.shutdown().await;
    }
    let (raw_times, raw_per_s) = raw_ping_pong(rounds).await?;
    let [p50, p99, p999] = percentiles(&mut times);
    let [r50, r99, r999] = percentiles(&mut raw_times.clone());
    // Over the client sockets, also the same hops carrying the bytes alone: what of the gap
    // to raw TCP the sockets make.
    let hops = if in_process {
        String::new()
    } else {
        let [h50, h99, h999] = percentiles(&mut hops::ping_pong(scratch, rounds).await?);
        format!("; its socket hops carrying the bytes alone {h50:.0}/{h99:.0}/{h999:.0} us")
    };
    Ok(row(
        "w3",
        format!(
            "A -> B -> A ping-pong, {}, one at a time, at most {PING_PONG_RATE}/s, {rounds} rounds",
            if in_process {
                "clients in the nodes' process (Node::client)"
            } else {
                "clients on the client socket"
            }
        ),
        64,
        per_s,
        "raw TCP ping-pong",
        raw_per_s,
        format!(
            "round trip p50/p99/p99.9 {p50:.0}/{p99:.0}/{p999:.0} us against raw {r50:.0}/{r99:.0}/{r999:.0} us (p99 {:.1}x){hops}",
            p99 / r99.max(1e-9)
        ),
    ))
}

/// Longest a ping-pong waits for a message to come back.
const ECHO_WAIT: Duration = Duration::from_secs(10);

/// A consumer of `node`'s `orders`, one message at a time.
async fn consumer_of(node: &Node, in_process: bool) -> Result<Consumer, ClientError> {
    client_of(node, in_process).await?.consume("orders", 1, u64::MAX).await
}

/// Fails on the first put refused among `outcomes`.
fn all_accepted(outcomes: Vec<Result<MessageId, ClientError>>) -> Result<(), ClientError> {
    outcomes.into_iter().try_for_each(|outcome| outcome.map(drop))
}

/// B's side: sends each of `rounds` messages back to `A:orders` as it comes (failing when
/// none comes for [`ECHO_WAIT`]).
async fn echo(mut from: Consumer, mut back: Client, rounds: usize) -> Result<(), ClientError> {
    let to: Address = "A:orders".parse().expect("valid address");
    let mut echoed = 0;
    while echoed < rounds {
        let Ok(batch) = tokio::time::timeout(ECHO_WAIT, from.next()).await else {
            return Err(ClientError::Protocol(format!("ping-pong: nothing came back for {ECHO_WAIT:?}")));
        };
        for m in batch? {
            back.put_async(Content::buf(to.clone(), m.content.payload)).await?;
            echoed += 1;
        }
    }
    all_accepted(back.flush().await?)
}
