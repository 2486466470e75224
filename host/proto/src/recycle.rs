//! Large buffers used again. A message gathered from many packets needs a buffer of its
//! whole size, and a fresh megabyte costs its page faults (the kernel zeroes every page on
//! first touch), more than copying the message into it. So a buffer of at least
//! [`RECYCLE_BYTES_MIN`] handed out by [`buffer`] and frozen by [`freeze`] comes back here
//! when the last handle on its bytes is dropped, and the next [`buffer`] of a size it can
//! hold takes it. The buffers waiting hold at most [`KEPT_BYTES_MAX`] in all, so what stays
//! allocated between large messages is bounded; the others are freed as usual.

use std::sync::{Mutex, PoisonError};

use bytes::Bytes;

/// Smallest buffer worth keeping.
pub const RECYCLE_BYTES_MIN: usize = 256 * 1024;
/// Most bytes the buffers waiting to be used again may hold in all.
pub const KEPT_BYTES_MAX: usize = 16 << 20;

/// Buffers given back, waiting to be used again (empty, their pages still mapped).
static KEPT: Mutex<Kept> = Mutex::new(Kept { buffers: Vec::new(), bytes: 0 });

struct Kept {
    buffers: Vec<Vec<u8>>,
    /// Their capacities, summed.
    bytes: usize,
}

/// An empty buffer with room for `capacity` bytes: a kept one when there is one large
/// enough (and not more than twice as large), else a new one.
pub fn buffer(capacity: usize) -> Vec<u8> {
    if capacity >= RECYCLE_BYTES_MIN {
        let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
        let fits = |b: &Vec<u8>| (capacity..=capacity.saturating_mul(2)).contains(&b.capacity());
        if let Some(at) = kept.buffers.iter().position(fits) {
            let buffer = kept.buffers.swap_remove(at);
            kept.bytes -= buffer.capacity();
            return buffer;
        }
    }
    Vec::with_capacity(capacity)
}

/// `buffer`'s bytes, shared; a large buffer comes back for [`buffer`] once the last handle
/// on them is dropped.
pub fn freeze(buffer: Vec<u8>) -> Bytes {
    if buffer.capacity() >= RECYCLE_BYTES_MIN {
        Bytes::from_owner(Returning(buffer))
    } else {
        Bytes::from(buffer)
    }
}

/// Owns a large buffer's bytes while they are shared; gives the buffer back when dropped.
struct Returning(Vec<u8>);

impl AsRef<[u8]> for Returning {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        let mut buffer = std::mem::take(&mut self.0);
        buffer.clear();
        let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.bytes + buffer.capacity() <= KEPT_BYTES_MAX {
            kept.bytes += buffer.capacity();
            kept.buffers.push(buffer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_buffer_comes_back_once_its_bytes_are_dropped_and_others_do_not() {
        let kept = || KEPT.lock().unwrap().bytes;
        // A size no other test asks for, so buffers of other tests do not interfere.
        let size = RECYCLE_BYTES_MIN + 12_345;
        let mut first = buffer(size);
        first.extend_from_slice(&vec![7u8; size]);
        let at = first.as_ptr();
        let bytes = freeze(first);
        let slice = bytes.slice(10..20);
        drop(bytes);
        let meanwhile = buffer(size);
        assert_ne!(meanwhile.as_ptr(), at, "still in use by the slice");
        drop(slice);
        let again = buffer(size);
        assert_eq!(again.as_ptr(), at, "given back when the last handle went");
        assert!(again.is_empty() && again.capacity() >= size);
        let larger = buffer(size * 3);
        assert!(larger.capacity() >= size * 3, "too small ones are not handed out");

        let before = kept();
        drop(freeze(buffer(KEPT_BYTES_MAX + 1)));
        assert_eq!(kept(), before, "a buffer larger than may be kept is freed");
        drop(freeze(vec![1u8; 1000]));
        assert_eq!(kept(), before, "so is a small one");
    }
}
