//! The `fjall` store plugin: ordered key/value spaces on disk, in one fjall database (an
//! LSM tree per space, a shared journal, atomic batches across spaces).
//!
//! A write with `sync` returns once the journal holds it on stable storage (`fdatasync`);
//! other writes reach the operating system's buffers at once and stable storage with the
//! next synced write or [`Store::sync`]. A failed journal write or sync poisons the store:
//! every later write fails with [`StoreError::Poisoned`], as the host's durability rules
//! require (the node stops rather than acknowledge what it may have lost). fjall takes a lock
//! on its directory, so a second process cannot open the same store.
//!
//! Configuration: `plugins: { store: { kind: fjall, path: DIR } }`; `path` defaults to
//! `store` inside the node's `data_dir`.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError, RwLock};

use bytes::Bytes;
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use linkbus_plugin_api::registry::{BuildContext, Factory, PluginEntry, PluginError};
use linkbus_plugin_api::{Batch, ConfigValue, Section, Store, StoreError, WriteOp};

/// A store in a fjall database directory; see the crate doc.
pub struct FjallStore {
    db: Database,
    path: PathBuf,
    spaces: RwLock<HashMap<String, Keyspace>>,
    /// Why the store is poisoned, once a journal write or sync failed.
    poisoned: Mutex<Option<String>>,
}

impl std::fmt::Debug for FjallStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FjallStore").field("path", &self.path).finish_non_exhaustive()
    }
}

fn backend(op: &'static str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend { op, reason: e.to_string() }
}

impl FjallStore {
    /// Opens (creating it if needed) the store in directory `path`.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the directory cannot be made or opened — among others
    /// when another process has it open.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(path).map_err(|e| backend("open", format!("{}: {e}", path.display())))?;
        let db = Database::builder(path).open().map_err(|e| {
            backend("open", format!("{}: {e} (is another node using this data directory?)", path.display()))
        })?;
        let mut spaces = HashMap::new();
        for name in db.list_keyspace_names() {
            let name = name.to_string();
            let keyspace =
                db.keyspace(&name, KeyspaceCreateOptions::default).map_err(|e| backend("open", e))?;
            spaces.insert(name, keyspace);
        }
        Ok(Self { db, path: path.to_owned(), spaces: RwLock::new(spaces), poisoned: Mutex::new(None) })
    }

    /// The space's keyspace, if it was ever written.
    fn existing(&self, space: &str) -> Option<Keyspace> {
        self.spaces.read().unwrap_or_else(PoisonError::into_inner).get(space).cloned()
    }

    /// The space's keyspace, created on first use.
    fn keyspace(&self, space: &str) -> Result<Keyspace, StoreError> {
        if let Some(keyspace) = self.existing(space) {
            return Ok(keyspace);
        }
        let mut spaces = self.spaces.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(keyspace) = spaces.get(space) {
            return Ok(keyspace.clone());
        }
        let keyspace =
            self.db.keyspace(space, KeyspaceCreateOptions::default).map_err(|e| self.failed("write", e))?;
        spaces.insert(space.to_owned(), keyspace.clone());
        Ok(keyspace)
    }

    fn check_poisoned(&self) -> Result<(), StoreError> {
        match &*self.poisoned.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(reason) => Err(StoreError::Poisoned(reason.clone())),
            None => Ok(()),
        }
    }

    /// Records a failed journal write or sync: from now on the store refuses writes.
    fn failed(&self, op: &'static str, e: fjall::Error) -> StoreError {
        let reason = format!("{op} in {}: {e}", self.path.display());
        let mut poisoned = self.poisoned.lock().unwrap_or_else(PoisonError::into_inner);
        poisoned.get_or_insert_with(|| reason.clone());
        StoreError::Poisoned(reason)
    }
}

impl Store for FjallStore {
    fn durable(&self) -> bool {
        true
    }

    fn write(&self, batch: Batch, sync: bool) -> Result<(), StoreError> {
        self.check_poisoned()?;
        let mut writes = self.db.batch();
        if sync {
            writes = writes.durability(Some(PersistMode::SyncData));
        }
        for op in batch.ops {
            match op {
                WriteOp::Put { space, key, value } => writes.insert(&self.keyspace(&space)?, key, value),
                WriteOp::Delete { space, key } => {
                    if let Some(keyspace) = self.existing(&space) {
                        writes.remove(&keyspace, key);
                    }
                }
            }
        }
        writes.commit().map_err(|e| self.failed("write", e))
    }

    fn get(&self, space: &str, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        let Some(keyspace) = self.existing(space) else { return Ok(None) };
        Ok(keyspace.get(key).map_err(|e| backend("get", e))?.map(Bytes::from))
    }

    fn scan(
        &self,
        space: &str,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>, StoreError> {
        let Some(keyspace) = self.existing(space) else { return Ok(Vec::new()) };
        if linkbus_plugin_api::store::is_empty_range(from, to) {
            return Ok(Vec::new());
        }
        let mut entries = Vec::new();
        for guard in keyspace.range::<&[u8], _>((from, to)).take(limit) {
            let (key, value) = guard.into_inner().map_err(|e| backend("scan", e))?;
            entries.push((Bytes::from(key), Bytes::from(value)));
        }
        Ok(entries)
    }

    fn spaces(&self) -> Result<Vec<String>, StoreError> {
        let spaces = self.spaces.read().unwrap_or_else(PoisonError::into_inner);
        let mut names = Vec::new();
        for (name, keyspace) in spaces.iter() {
            if !keyspace.is_empty().map_err(|e| backend("spaces", e))? {
                names.push(name.clone());
            }
        }
        names.sort();
        Ok(names)
    }

    fn sync(&self) -> Result<(), StoreError> {
        self.check_poisoned()?;
        self.db.persist(PersistMode::SyncData).map_err(|e| self.failed("sync", e))
    }
}

fn check(section: &Section<'_>) {
    let _ = section.string("path");
}

fn build(config: &ConfigValue, ctx: &BuildContext) -> Result<Box<dyn Store>, PluginError> {
    let path = match config {
        ConfigValue::Map(entries) => entries.iter().find(|(k, _)| k == "path").and_then(|(_, v)| match v {
            ConfigValue::Str(s) => Some(PathBuf::from(s)),
            _ => None,
        }),
        _ => None,
    }
    .unwrap_or_else(|| ctx.data_dir.join("store"));
    let store =
        FjallStore::open(&path).map_err(|e| PluginError { plugin: "fjall".into(), reason: e.to_string() })?;
    Ok(Box::new(store))
}

inventory::submit! {
    PluginEntry {
        name: "fjall",
        summary: "persistent store on disk (fjall LSM tree; synced writes are fdatasync'ed)",
        check,
        factory: Factory::Store(build),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_the_conformance_kit() {
        let dir = tempfile::tempdir().unwrap();
        linkbus_plugin_api::testing::check_store(&FjallStore::open(dir.path()).unwrap());
    }

    #[test]
    fn synced_data_survives_a_reopen_and_a_second_process_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        linkbus_plugin_api::testing::check_store_reopens(&|| {
            Box::new(FjallStore::open(dir.path()).unwrap()) as Box<dyn Store>
        });
        let first = FjallStore::open(dir.path()).unwrap();
        let second = FjallStore::open(dir.path()).unwrap_err().to_string();
        assert!(second.contains("another node"), "{second}");
        drop(first);
    }

    /// The kit's failure case on a 4 MiB tmpfs (mounted when the tests run as root; skipped,
    /// saying so, elsewhere).
    #[test]
    fn a_full_disk_poisons_the_store_and_loses_no_synced_write() {
        let dir = tempfile::tempdir().unwrap();
        linkbus_plugin_api::testing::check_store_fails_closed_on_a_small_tmpfs(dir.path(), &|path| {
            Box::new(FjallStore::open(path).unwrap()) as Box<dyn Store>
        });
    }
}
