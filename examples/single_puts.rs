//! A producer putting one message at a time over the client socket: each `put` waiting for
//! its answer, against `put_async` with one `flush` at the end. One node (fjall store in a
//! temporary directory), volatile 64 B messages to a local queue, emptied after each
//! measurement.
//!
//! Run with `cargo run --release --example single_puts [MESSAGES] [ROUNDS]`.

use std::time::{Duration, Instant};

use linkbus::config::{self, Overrides};
use linkbus::{Client, Content, Node};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let messages: usize = args.next().map_or(Ok(50_000), |a| a.parse())?;
    let rounds: usize = args.next().map_or(Ok(2), |a| a.parse())?;
    let scratch = std::env::temp_dir().join(format!("linkbus-single-puts-{}", std::process::id()));
    let overrides = Overrides::local("A", &scratch);
    let mut tree = config::parse_yaml("queues: [ { name: q, order: fifo, queue_messages_max: 10000000 } ]")?;
    config::apply_overrides(&mut tree, &overrides);
    let node = Node::start(config::from_value(&tree)?).await?;
    let content = Content::buf("A:q".parse()?, vec![7u8; 64]);
    for round in 1..=rounds {
        let mut producer = Client::connect(node.socket_path()).await?;
        let started = Instant::now();
        for _ in 0..messages {
            producer.put(content.clone()).await?;
        }
        let waiting = messages as f64 / started.elapsed().as_secs_f64();
        drain(&node, messages).await?;
        let started = Instant::now();
        for _ in 0..messages {
            producer.put_async(content.clone()).await?;
        }
        let refused = producer.flush().await?.into_iter().filter(Result::is_err).count();
        anyhow::ensure!(refused == 0, "{refused} puts were refused");
        let not_waiting = messages as f64 / started.elapsed().as_secs_f64();
        drain(&node, messages).await?;
        println!(
            "round {round}: put {waiting:.0} messages/s, put_async {not_waiting:.0} messages/s ({:.1}x)",
            not_waiting / waiting
        );
    }
    node.shutdown().await;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

/// Takes the `count` messages just put, so each measurement starts from an empty queue.
async fn drain(node: &Node, count: usize) -> anyhow::Result<()> {
    let mut consumer = Client::connect(node.socket_path()).await?;
    let mut left = count;
    while left > 0 {
        let got = consumer.get("q", 10_000, Duration::from_secs(10)).await?;
        anyhow::ensure!(!got.is_empty(), "{left} messages did not arrive");
        left = left.saturating_sub(got.len());
    }
    Ok(())
}
