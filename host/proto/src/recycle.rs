//! Large buffers used again. A message gathered from many packets needs a buffer of its
//! whole size, and a fresh megabyte costs its page faults (the kernel zeroes every page on
//! first touch), more than copying the message into it. So a buffer of at least
//! [`RECYCLE_BYTES_MIN`] handed out by [`Recycler::buffer`] and frozen by
//! [`Recycler::freeze`] comes back to its recycler when the last handle on its bytes is
//! dropped, and a later [`Recycler::buffer`] of about its size takes it. The buffers waiting
//! hold at most the recycler's `bytes_max` in all (the oldest go first to make room), so
//! what stays allocated between large messages is bounded.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

/// Smallest buffer worth keeping.
pub const RECYCLE_BYTES_MIN: usize = 256 * 1024;

/// Large buffers given back, waiting to be used again; see the module doc.
#[derive(Debug)]
pub struct Recycler {
    kept: Mutex<Kept>,
    /// Most bytes the waiting buffers may hold in all.
    bytes_max: usize,
}

#[derive(Debug, Default)]
struct Kept {
    /// Empty buffers, their pages still mapped; the oldest first.
    buffers: VecDeque<Vec<u8>>,
    /// Their capacities, summed.
    bytes: usize,
}

impl Recycler {
    /// A recycler keeping at most `bytes_max` bytes of buffers (0: none).
    pub fn new(bytes_max: usize) -> Self {
        Self { kept: Mutex::new(Kept::default()), bytes_max }
    }

    /// An empty buffer with room for `capacity` bytes: the smallest kept one that holds
    /// them and is at most an eighth larger, else a new one.
    pub fn buffer(&self, capacity: usize) -> Vec<u8> {
        if capacity >= RECYCLE_BYTES_MIN && self.bytes_max > 0 {
            let mut kept = self.lock();
            let fits = |b: &Vec<u8>| (capacity..=capacity + capacity / 8).contains(&b.capacity());
            let best =
                kept.buffers.iter().enumerate().filter(|(_, b)| fits(b)).min_by_key(|(_, b)| b.capacity());
            if let Some(buffer) = best.map(|(at, _)| at).and_then(|at| kept.buffers.remove(at)) {
                kept.bytes -= buffer.capacity();
                return buffer;
            }
        }
        Vec::with_capacity(capacity)
    }

    /// `buffer`'s bytes, shared; a large buffer comes back here once the last handle on
    /// them is dropped.
    pub fn freeze(self: &Arc<Self>, buffer: Vec<u8>) -> Bytes {
        if buffer.capacity() < RECYCLE_BYTES_MIN || buffer.capacity() > self.bytes_max {
            return Bytes::from(buffer);
        }
        Bytes::from_owner(Returning { buffer, to: self.clone() })
    }

    /// Bytes of the buffers waiting.
    pub fn kept_bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `buffer`, letting the oldest waiting ones go to make room.
    fn give_back(&self, mut buffer: Vec<u8>) {
        buffer.clear();
        let mut kept = self.lock();
        while kept.bytes + buffer.capacity() > self.bytes_max {
            let Some(old) = kept.buffers.pop_front() else { return };
            kept.bytes -= old.capacity();
        }
        kept.bytes += buffer.capacity();
        kept.buffers.push_back(buffer);
    }
}

/// Owns a large buffer while its bytes are shared; gives it back when dropped.
struct Returning {
    buffer: Vec<u8>,
    to: Arc<Recycler>,
}

impl AsRef<[u8]> for Returning {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        self.to.give_back(std::mem::take(&mut self.buffer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(recycler: &Arc<Recycler>, size: usize) -> (Bytes, *const u8) {
        let mut buffer = recycler.buffer(size);
        buffer.resize(size, 7);
        let at = buffer.as_ptr();
        (recycler.freeze(buffer), at)
    }

    #[test]
    fn a_large_buffer_comes_back_once_its_bytes_are_dropped() {
        let recycler = Arc::new(Recycler::new(16 << 20));
        let size = RECYCLE_BYTES_MIN + 1000;
        let (bytes, at) = filled(&recycler, size);
        let slice = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(recycler.kept_bytes(), 0, "still in use by the slice");
        drop(slice);
        assert_eq!(recycler.kept_bytes(), size, "given back when the last handle went");
        assert_eq!(recycler.buffer(size * 2).capacity(), size * 2, "a much smaller one is not handed out");
        let again = recycler.buffer(size - 100);
        assert_eq!(again.as_ptr(), at, "one a little larger is");
        assert!(again.is_empty());
        assert_eq!(recycler.kept_bytes(), 0);

        drop(recycler.freeze(vec![1u8; 1000]));
        assert_eq!(recycler.kept_bytes(), 0, "a small buffer is not kept");
    }

    #[test]
    fn the_kept_bytes_stay_within_the_bound_the_oldest_going_first() {
        let size = RECYCLE_BYTES_MIN;
        let recycler = Arc::new(Recycler::new(2 * size + size / 2));
        let made: Vec<(Bytes, *const u8)> = (0..3).map(|_| filled(&recycler, size)).collect();
        let first = made[0].1;
        let newest = made[2].1;
        drop(made);
        assert_eq!(recycler.kept_bytes(), 2 * size, "two fit; the oldest went for the third");
        let taken: Vec<Vec<u8>> = (0..2).map(|_| recycler.buffer(size)).collect();
        assert!(taken.iter().all(|b| b.as_ptr() != first) && taken.iter().any(|b| b.as_ptr() == newest));

        let bigger = Arc::new(Recycler::new(size));
        drop(filled(&bigger, size + 1).0);
        assert_eq!(bigger.kept_bytes(), 0, "a buffer larger than the bound is not kept");
        let none = Arc::new(Recycler::new(0));
        drop(filled(&none, size).0);
        assert_eq!(none.kept_bytes(), 0, "a bound of 0 keeps nothing");
    }
}
