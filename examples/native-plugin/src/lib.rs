//! `tally`: a store kept in memory that refuses a write past `max_keys` keys. An example of
//! a native plugin (docs/native-plugins.md): a `Store`, its section's check and builder, and
//! `export_plugins!`.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use linkbus_plugin_api::registry::{BuildContext, Factory, PluginEntry, PluginError};
use linkbus_plugin_api::store::is_empty_range;
use linkbus_plugin_api::{Batch, ConfigValue, Section, Store, StoreError, WriteOp, read_plugin_section};

type Spaces = BTreeMap<String, BTreeMap<Bytes, Bytes>>;

/// The store: every space a sorted map, all behind one lock.
struct Tally {
    spaces: Mutex<Spaces>,
    max_keys: usize,
}

impl Tally {
    fn spaces(&self) -> MutexGuard<'_, Spaces> {
        self.spaces.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Store for Tally {
    /// Nothing survives the process: the node starts afresh each time.
    fn durable(&self) -> bool {
        false
    }

    fn write(&self, batch: Batch, _sync: bool) -> Result<(), StoreError> {
        let mut spaces = self.spaces();
        // Applied to a copy first, so a refused batch changes nothing (batches are atomic).
        let mut next = spaces.clone();
        for op in batch.ops {
            match op {
                WriteOp::Put { space, key, value } => {
                    next.entry(space).or_default().insert(key, value);
                }
                WriteOp::Delete { space, key } => {
                    if let Some(keys) = next.get_mut(&space) {
                        keys.remove(&key);
                    }
                }
            }
        }
        next.retain(|_, keys| !keys.is_empty());
        let keys: usize = next.values().map(BTreeMap::len).sum();
        if keys > self.max_keys {
            let reason = format!("{keys} keys would pass max_keys {}", self.max_keys);
            return Err(StoreError::Backend { op: "write", reason });
        }
        *spaces = next;
        Ok(())
    }

    fn get(&self, space: &str, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        Ok(self.spaces().get(space).and_then(|keys| keys.get(key).cloned()))
    }

    fn scan(
        &self,
        space: &str,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>, StoreError> {
        if is_empty_range(from, to) {
            return Ok(Vec::new());
        }
        let spaces = self.spaces();
        let Some(keys) = spaces.get(space) else { return Ok(Vec::new()) };
        Ok(keys.range::<[u8], _>((from, to)).take(limit).map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    fn spaces(&self) -> Result<Vec<String>, StoreError> {
        Ok(Tally::spaces(self).keys().cloned().collect())
    }

    fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Reads the section's keys (`kind` is the node's): the check and the builder share it, so
/// what `linkbus config check` accepts is what the node builds.
fn max_keys(section: &Section<'_>) -> u64 {
    section.number("max_keys", 1_000_000, 1, u64::MAX)
}

fn check(section: &Section<'_>) {
    let _ = max_keys(section);
}

fn build(config: &ConfigValue, _context: &BuildContext) -> Result<Box<dyn Store>, PluginError> {
    let max_keys = read_plugin_section("", config, max_keys)
        .map_err(|e| PluginError { plugin: "tally".into(), reason: e.to_string() })?;
    let max_keys = usize::try_from(max_keys).unwrap_or(usize::MAX);
    Ok(Box::new(Tally { spaces: Mutex::default(), max_keys }))
}

/// The plugin, as a built-in one would be registered.
pub static TALLY: PluginEntry = PluginEntry {
    name: "tally",
    summary: "a store in memory with a limit on its keys (an example)",
    check,
    factory: Factory::Store(build),
};

linkbus_native::export_plugins!(version: env!("CARGO_PKG_VERSION"), plugins: [TALLY]);
