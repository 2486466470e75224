//! `w2`: persistent puts answered after the sync that covers them (group commit), against
//! the same store syncing each record alone and the disk's raw write-and-sync rate.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use linkbus_plugin_api::{Address, Batch, Content, Reliability};

use super::raw::raw_syncs;
use super::{Row, Scale, row};
use crate::demo::DemoError;
use linkbus_client::Client;
use linkbus_host::Node;
use linkbus_host::config::{self, Overrides};

/// `w2`: 16 clients putting persistent 1 KiB messages on one node for `scale.duration`,
/// one at a time and then [`W2_BATCH`] per request, each request answered after the sync
/// that covers it; on each of [`W2_STORES`], against the same store syncing each record
/// alone, with the disk's raw sync rate in the note and the share of what group commit
/// allows (the faster of the two sync rates times the puts per sync measured).
pub(super) async fn persistent_puts(
    scratch: &Path,
    scale: Scale,
    store_library: Option<&Path>,
) -> Result<Vec<Row>, DemoError> {
    let dir = scratch.join("w2");
    let duration = scale.duration;
    let raw_dir = dir.clone();
    let raw = tokio::task::spawn_blocking(move || raw_syncs(&raw_dir, duration))
        .await
        .map_err(std::io::Error::other)??;
    let mut rows = Vec::new();
    for store in w2_stores(store_library)? {
        let mut measured = Vec::new();
        for batch in [1, W2_BATCH] {
            let at = dir.join(format!("{}-b{batch}", store.name));
            measured.push((batch, persistent_puts_in(&at, &store.section, duration, batch).await?));
        }
        let alone_dir = dir.join(format!("{}-alone", store.name));
        let opened = store.clone();
        let alone = tokio::task::spawn_blocking(move || sync_each(&opened, &alone_dir, duration))
            .await
            .map_err(std::io::Error::other)??;
        let store = &store.name;
        rows.extend(measured.into_iter().map(|(batch, (rate, per_sync))| {
            let case = if batch == 1 {
                format!("{W2_CLIENTS} clients, persistent puts one at a time, each answered after its sync, store {store}")
            } else {
                format!(
                    "{W2_CLIENTS} clients, {batch} persistent puts per request, answered after their sync, store {store}"
                )
            };
            // What group commit allows at that many puts per sync, at the faster of the two
            // sync rates measured.
            let allows = alone.max(raw) * per_sync;
            let share = 100.0 * rate / allows.max(f64::MIN_POSITIVE);
            let note = format!(
                "{per_sync:.1} puts per sync, {share:.0} % of what group commit allows (syncs/s x puts per sync: {allows:.0}/s); \
                 the disk's raw write+fdatasync rate {raw:.0}/s"
            );
            let baseline = format!("{store} syncing each record alone");
            row("w2", case, 1024, rate, &baseline, alone, note)
        }));
    }
    Ok(rows)
}

/// Clients putting at `w2`.
const W2_CLIENTS: usize = 16;
/// Puts per request in `w2`'s batched case.
const W2_BATCH: usize = 256;
/// A store `w2` runs on.
#[derive(Debug, Clone)]
struct W2Store {
    /// Its plugin name.
    name: String,
    /// What follows `kind:` in its `plugins.store` section.
    section: String,
    /// The native library it comes from.
    library: Option<PathBuf>,
}

/// The store plugins `w2` runs on: the default, the log that writes each record once, and
/// each store of the native library `store_library`.
fn w2_stores(store_library: Option<&Path>) -> Result<Vec<W2Store>, DemoError> {
    let mut stores: Vec<W2Store> = ["fjall", "log"]
        .into_iter()
        .map(|name| W2Store { name: name.into(), section: name.into(), library: None })
        .collect();
    if let Some(path) = store_library {
        let library =
            linkbus_native::load(path, None).map_err(|e| DemoError::Io(std::io::Error::other(e)))?;
        for plugin in library.plugins().iter().filter(|p| p.kind == "store") {
            let section = format!("{}, library: '{}'", plugin.name, library.path().display());
            stores.push(W2Store {
                name: plugin.name.clone(),
                section,
                library: Some(library.path().to_owned()),
            });
        }
    }
    Ok(stores)
}

/// The SQLite store library beside the running binary, when it was built there
/// (`cargo build --release -p linkbus-store-sqlite`).
pub(crate) fn sqlite_beside_this_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.join("liblinkbus_store_sqlite.so")).filter(|path| path.exists())
}

/// One node in `dir` on the store plugin `store`, [`W2_CLIENTS`] clients putting `batch`
/// persistent 1 KiB messages per request for `duration`: puts per second and puts per
/// store sync.
async fn persistent_puts_in(
    dir: &Path,
    store: &str,
    duration: Duration,
    batch: usize,
) -> Result<(f64, f64), DemoError> {
    let overrides = Overrides::local("A", dir);
    let mut tree = config::parse_yaml(&format!(
        "queues: [ {{ name: q, order: fifo, queue_messages_max: 100000000 }} ]\nplugins: {{ store: {{ kind: {store} }} }}"
    ))?;
    config::apply_overrides(&mut tree, &overrides);
    let node = Node::start(config::from_value(&tree)?).await?;
    let put = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + duration;
    let mut tasks = Vec::new();
    for _ in 0..W2_CLIENTS {
        let (socket, put) = (node.socket_path().to_owned(), put.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect(&socket).await?;
            let to: Address = "A:q".parse().expect("valid address");
            let content = Content::buf(to, vec![7u8; 1024]).with_reliability(Reliability::Persistent);
            while Instant::now() < deadline {
                let ids = client.put_batch(vec![content.clone(); batch]).await?;
                put.fetch_add(ids.len() as u64, Ordering::Relaxed);
            }
            Ok::<(), linkbus_client::ClientError>(())
        }));
    }
    let started = Instant::now();
    let syncs_before = node.state().store_stats().syncs.load(Ordering::Relaxed);
    for task in tasks {
        task.await.map_err(std::io::Error::other)??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let count = put.load(Ordering::Relaxed);
    let syncs = node.state().store_stats().syncs.load(Ordering::Relaxed) - syncs_before;
    node.shutdown().await;
    Ok((count as f64 / elapsed.max(1e-9), count as f64 / syncs.max(1) as f64))
}

/// Records per second when the store plugin `store` syncs each 1 KiB record on its own.
fn sync_each(store: &W2Store, dir: &Path, duration: Duration) -> Result<f64, DemoError> {
    let failed = |e: &dyn std::fmt::Display| DemoError::Io(std::io::Error::other(e.to_string()));
    let store: Box<dyn linkbus_plugin_api::Store> = match (store.name.as_str(), &store.library) {
        (name, Some(path)) => {
            let library = linkbus_native::load(path, None).map_err(|e| failed(&e))?;
            let plugins = linkbus_native::plugins(&library);
            let Some(linkbus_plugin_api::Builder::Store(build)) =
                plugins.iter().find(|p| p.name == name).map(|p| &p.builder)
            else {
                return Err(failed(&format!("{} offers no store named '{name}'", path.display())));
            };
            let section = linkbus_plugin_api::ConfigValue::Map(vec![(
                "kind".into(),
                linkbus_plugin_api::ConfigValue::Str(name.into()),
            )]);
            let node = linkbus_plugin_api::NodeName::new("A").map_err(|e| failed(&e))?;
            let context = linkbus_plugin_api::BuildContext { node, data_dir: dir.to_owned() };
            build(&section, &context).map_err(|e| failed(&e))?
        }
        ("log", None) => Box::new(
            linkbus_store_log::LogStore::open(dir, linkbus_store_log::SEGMENT_MIB_DEFAULT << 20)
                .map_err(|e| failed(&e))?,
        ),
        _ => Box::new(linkbus_store_fjall::FjallStore::open(dir).map_err(|e| failed(&e))?),
    };
    let failed = |e: linkbus_plugin_api::StoreError| failed(&e);
    let started = Instant::now();
    let mut written = 0u64;
    while started.elapsed() < duration {
        let mut batch = Batch::new();
        batch.put("q", written.to_be_bytes().to_vec(), vec![7u8; 1024]);
        store.write(batch, true).map_err(failed)?;
        written += 1;
    }
    Ok(written as f64 / started.elapsed().as_secs_f64().max(1e-9))
}
