//! Persistent put throughput with group commit, against the store syncing each message on
//! its own: one node (fjall store in a temporary directory) and `CLIENTS` clients that each
//! put 1 KiB persistent messages one at a time; then the same number of 1 KiB records
//! written straight to a fresh fjall store with a sync each.
//!
//! Run with `cargo run --release --example persistent_puts [CLIENTS] [SECONDS]` (with
//! `VOLATILE=1` the clients put volatile messages instead, for comparison).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use linkbus::config::{self, Overrides};
use linkbus::plugin_api::{Batch, Store};
use linkbus::{Client, Content, Node, Reliability};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let clients: usize = args.next().map_or(Ok(16), |a| a.parse())?;
    let seconds: u64 = args.next().map_or(Ok(5), |a| a.parse())?;
    let scratch = std::env::temp_dir().join(format!("linkbus-persistent-puts-{}", std::process::id()));
    let overrides = Overrides::local("A", &scratch);
    let yaml = "queues: [ { name: q, order: fifo, queue_messages_max: 100000000 } ]\nmessages: { lifetime_default_s: 0 }";
    let mut tree = config::parse_yaml(yaml)?;
    config::apply_overrides(&mut tree, &overrides);
    let node = Node::start(config::from_value(&tree)?).await?;

    let put = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (socket, put) = (node.socket_path().to_owned(), put.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect(&socket).await?;
            let reliability = if std::env::var_os("VOLATILE").is_some() {
                Reliability::Volatile
            } else {
                Reliability::Persistent
            };
            let content = Content::buf("A:q".parse()?, vec![7u8; 1024]).with_reliability(reliability);
            while Instant::now() < deadline {
                client.put(content.clone()).await?;
                put.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    let started = Instant::now();
    for task in tasks {
        task.await??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let count = put.load(Ordering::Relaxed);
    let syncs = node.state().store_stats().syncs.load(Ordering::Relaxed);
    println!(
        "group commit: {count} persistent puts from {clients} clients in {elapsed:.2} s: {:.0} puts/s, \
         {syncs} syncs ({:.1} puts per sync)",
        count as f64 / elapsed,
        count as f64 / syncs.max(1) as f64
    );
    node.shutdown().await;

    // The same store syncing every record on its own.
    let store = linkbus_store_fjall::FjallStore::open(&scratch.join("alone"))?;
    let started = Instant::now();
    let mut alone = 0u64;
    while started.elapsed() < Duration::from_secs(seconds.min(3)) {
        let mut batch = Batch::new();
        batch.put("q", alone.to_be_bytes().to_vec(), vec![7u8; 1024]);
        store.write(batch, true)?;
        alone += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "one sync per message: {alone} records in {elapsed:.2} s: {:.0} records/s",
        alone as f64 / elapsed
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}
