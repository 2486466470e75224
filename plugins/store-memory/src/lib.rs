//! The `memory` store plugin: ordered key/value spaces in process memory.
//!
//! Nothing survives the process, so it reports itself as not durable and the node treats
//! each start as a fresh one. It is the right store for tests, demos and volatile-only
//! nodes; `sync` is a no-op that always succeeds.
//!
//! Configuration: `plugins: { store: { kind: memory } }` (no other keys).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{PoisonError, RwLock};

use bytes::Bytes;
use linkbus_plugin_api::registry::{BuildContext, Factory, PluginEntry, PluginError};
use linkbus_plugin_api::{Batch, ConfigValue, Section, Store, StoreError, WriteOp};

type Space = BTreeMap<Bytes, Bytes>;

/// A store held in memory; see the crate doc.
#[derive(Debug, Default)]
pub struct MemoryStore {
    spaces: RwLock<BTreeMap<String, Space>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Store for MemoryStore {
    fn durable(&self) -> bool {
        false
    }

    fn write(&self, batch: Batch, _sync: bool) -> Result<(), StoreError> {
        // One write lock for the whole batch makes it atomic for every reader.
        let mut spaces = self.spaces.write().unwrap_or_else(PoisonError::into_inner);
        for op in batch.ops {
            match op {
                WriteOp::Put { space, key, value } => {
                    spaces.entry(space).or_default().insert(key, value);
                }
                WriteOp::Delete { space, key } => {
                    if let Some(s) = spaces.get_mut(&space) {
                        s.remove(&key);
                        if s.is_empty() {
                            spaces.remove(&space);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn get(&self, space: &str, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        let spaces = self.spaces.read().unwrap_or_else(PoisonError::into_inner);
        Ok(spaces.get(space).and_then(|s| s.get(key)).cloned())
    }

    fn scan(
        &self,
        space: &str,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>, StoreError> {
        let spaces = self.spaces.read().unwrap_or_else(PoisonError::into_inner);
        let Some(s) = spaces.get(space) else {
            return Ok(Vec::new());
        };
        if linkbus_plugin_api::store::is_empty_range(from, to) {
            return Ok(Vec::new());
        }
        let range = (from.map(Bytes::copy_from_slice), to.map(Bytes::copy_from_slice));
        Ok(s.range(range).take(limit).map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    fn spaces(&self) -> Result<Vec<String>, StoreError> {
        let spaces = self.spaces.read().unwrap_or_else(PoisonError::into_inner);
        Ok(spaces.keys().cloned().collect())
    }

    fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

fn check(_section: &Section<'_>) {}

fn build(_config: &ConfigValue, _ctx: &BuildContext) -> Result<Box<dyn Store>, PluginError> {
    Ok(Box::new(MemoryStore::new()))
}

inventory::submit! {
    PluginEntry {
        name: "memory",
        summary: "volatile in-memory store (nothing survives a restart)",
        check,
        factory: Factory::Store(build),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_the_conformance_kit() {
        linkbus_plugin_api::testing::check_store(&MemoryStore::new());
    }
}
