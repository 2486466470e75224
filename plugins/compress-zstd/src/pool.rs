//! Compression contexts of one rule, kept between calls: making a zstd context (and digesting
//! a dictionary into it) costs more than compressing a small message.

use std::io;
use std::sync::{Mutex, PoisonError};

use zstd::bulk::Compressor;
use zstd::dict::EncoderDictionary;

/// Idle contexts kept per rule (more calls at once make more, dropped when they finish). Each
/// holds zstd's tables for the largest payload it compressed: about a MiB at level 3, tens of
/// MiB at level 19 for MiB-sized payloads.
pub(crate) const CONTEXTS_IDLE_MAX: usize = 8;

/// Contexts set up for one level and dictionary.
pub(crate) struct ContextPool {
    /// Level of contexts without a dictionary (a prepared dictionary carries its own).
    level: i32,
    /// Prepared once, shared by reference by every context of the pool.
    dictionary: Option<EncoderDictionary<'static>>,
    /// Contexts no call holds, at most [`CONTEXTS_IDLE_MAX`].
    idle: Mutex<Vec<Compressor<'static>>>,
}

impl std::fmt::Debug for ContextPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextPool")
            .field("level", &self.level)
            .field("dictionary", &self.dictionary.is_some())
            .finish_non_exhaustive()
    }
}

impl ContextPool {
    /// A pool compressing at `level`, with the dictionary `dictionary` (ZDICT bytes) if any.
    pub(crate) fn new(level: i32, dictionary: Option<&[u8]>) -> io::Result<Self> {
        let dictionary = dictionary.map(|bytes| EncoderDictionary::try_copy(bytes, level)).transpose()?;
        Ok(Self { level, dictionary, idle: Mutex::new(Vec::new()) })
    }

    /// Runs `compress` with a context of the pool, made if none is idle, and keeps it
    /// afterwards while fewer than [`CONTEXTS_IDLE_MAX`] are.
    pub(crate) fn with<T>(&self, compress: impl FnOnce(&mut Compressor<'static>) -> T) -> io::Result<T> {
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let mut context = match idle {
            Some(context) => context,
            None => self.fresh()?,
        };
        let result = compress(&mut context);
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < CONTEXTS_IDLE_MAX {
            idle.push(context);
        }
        Ok(result)
    }

    /// How many contexts are idle now.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> usize {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    fn fresh(&self) -> io::Result<Compressor<'static>> {
        let mut context = match &self.dictionary {
            Some(dictionary) => Compressor::with_prepared_dictionary(dictionary)?,
            None => Compressor::new(self.level)?,
        };
        // The content size goes in the frame by default (the receiver's first bomb check);
        // the checksum makes a damaged payload an error rather than wrong bytes.
        context.include_checksum(true)?;
        Ok(context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_are_reused_and_at_most_the_limit_is_kept() {
        let pool = ContextPool::new(3, None).unwrap();
        let packed = pool.with(|c| c.compress(&[7u8; 1000])).unwrap().unwrap();
        assert!(packed.len() < 100);
        assert_eq!(pool.idle(), 1, "the context is kept for the next call");
        // Calls nested inside each other each need their own context.
        fn nest(pool: &ContextPool, depth: usize) {
            if depth > 0 {
                pool.with(|_| nest(pool, depth - 1)).unwrap();
            }
        }
        nest(&pool, CONTEXTS_IDLE_MAX + 4);
        assert_eq!(pool.idle(), CONTEXTS_IDLE_MAX, "contexts past the limit are dropped");
    }
}
