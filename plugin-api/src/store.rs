//! The `Store` extension point: ordered key/value spaces with atomic batches and an explicit
//! sync flag.
//!
//! The host keeps all queue semantics (key layout, watermarks, recovery) above this trait;
//! a backend only has to keep bytes in order and make batches atomic and, when asked,
//! durable. The conformance kit in [`crate::testing`] states the contract as code.

use std::ops::Bound;

use bytes::Bytes;

/// One change in a [`Batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    /// Sets `key` in `space` to `value`.
    Put {
        /// The key space (created on first use).
        space: String,
        /// The key; spaces are ordered by unsigned byte comparison of keys.
        key: Bytes,
        /// The value.
        value: Bytes,
    },
    /// Removes `key` from `space` (a missing key is not an error).
    Delete {
        /// The key space.
        space: String,
        /// The key.
        key: Bytes,
    },
}

/// Changes applied all together or not at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// The changes, applied in order.
    pub ops: Vec<WriteOp>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a put.
    pub fn put(&mut self, space: &str, key: impl Into<Bytes>, value: impl Into<Bytes>) -> &mut Self {
        self.reserve_first();
        self.ops.push(WriteOp::Put { space: space.to_owned(), key: key.into(), value: value.into() });
        self
    }

    /// Adds a delete.
    pub fn delete(&mut self, space: &str, key: impl Into<Bytes>) -> &mut Self {
        self.reserve_first();
        self.ops.push(WriteOp::Delete { space: space.to_owned(), key: key.into() });
        self
    }

    /// The first change gets room for itself alone: most batches hold one.
    fn reserve_first(&mut self) {
        if self.ops.capacity() == 0 {
            self.ops.reserve_exact(1);
        }
    }

    /// Whether the batch holds no change.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// Whether the keys from `from` to `to` can hold no key at all: the start lies past the
/// end, or both are the same key and either bound leaves it out. A store answers such a
/// scan with nothing before ranging over its keys (`BTreeMap::range` panics on them).
pub fn is_empty_range(from: Bound<&[u8]>, to: Bound<&[u8]>) -> bool {
    match (from, to) {
        (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) => {
            a > b || (a == b && !matches!((from, to), (Bound::Included(_), Bound::Included(_))))
        }
        _ => false,
    }
}

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backend failed an operation.
    #[error("store {op} failed: {reason}")]
    Backend {
        /// Which operation.
        op: &'static str,
        /// The backend's explanation.
        reason: String,
    },
    /// A sync failed earlier: the store accepts no more writes, and the node must stop.
    #[error("store is poisoned after a failed sync: {0}")]
    Poisoned(String),
}

/// An ordered key/value store with atomic batches. Synchronous: the host calls it from its
/// own storage thread, never from a network task.
pub trait Store: Send + Sync {
    /// Whether data survives the process (a memory store says `false`, and the host then
    /// treats every restart as a fresh start).
    fn durable(&self) -> bool;

    /// Applies `batch` atomically; with `sync`, returns only once it is on stable storage.
    ///
    /// # Errors
    /// [`StoreError`]; after a failed sync every later write fails with
    /// [`StoreError::Poisoned`].
    fn write(&self, batch: Batch, sync: bool) -> Result<(), StoreError>;

    /// The value of `key` in `space`.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn get(&self, space: &str, key: &[u8]) -> Result<Option<Bytes>, StoreError>;

    /// Up to `limit` entries of `space` with keys between `from` and `to`, in key order.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn scan(
        &self,
        space: &str,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>, StoreError>;

    /// Names of the spaces that hold at least one key, in order.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn spaces(&self) -> Result<Vec<String>, StoreError>;

    /// Makes every write so far durable.
    ///
    /// # Errors
    /// [`StoreError`]; a failure poisons the store.
    fn sync(&self) -> Result<(), StoreError>;
}

/// Keys a [`scan_pages`] page holds: recovery reads whole spaces this many keys at a time,
/// so no single scan (nor, for a native store, a single vector across the library
/// boundary) holds a whole space.
pub const SCAN_PAGE_KEYS: usize = 4096;

/// Every entry of `space` in key order, read [`SCAN_PAGE_KEYS`] at a time: each page starts
/// after the last key of the one before. An error ends the iteration after it is yielded.
pub fn scan_pages<'a>(store: &'a dyn Store, space: &'a str) -> ScanPages<'a> {
    ScanPages { store, space, after: None, page: Vec::new().into_iter(), done: false }
}

/// The iterator of [`scan_pages`].
pub struct ScanPages<'a> {
    store: &'a dyn Store,
    space: &'a str,
    after: Option<Bytes>,
    page: std::vec::IntoIter<(Bytes, Bytes)>,
    done: bool,
}

impl Iterator for ScanPages<'_> {
    type Item = Result<(Bytes, Bytes), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(entry) = self.page.next() {
            return Some(Ok(entry));
        }
        if self.done {
            return None;
        }
        let from = self.after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        match self.store.scan(self.space, from, Bound::Unbounded, SCAN_PAGE_KEYS) {
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
            Ok(page) => {
                self.done = page.len() < SCAN_PAGE_KEYS;
                self.after = page.last().map(|(key, _)| key.clone());
                self.page = page.into_iter();
                self.page.next().map(Ok)
            }
        }
    }
}
