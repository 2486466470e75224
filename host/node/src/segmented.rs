//! A double-ended queue kept in segments that never move, for queues that can grow deep.
//!
//! A `VecDeque` grows into a buffer twice as large, copying the wrapped part of what it
//! holds (up to half). Under a queue's lock, with a million messages waiting, that is tens
//! of megabytes and the page faults of the new buffer: every user of the queue (a put, the
//! link bringing an urgent message in, a get) waits tens of milliseconds, at each doubling.
//! Perf (OPT-25): here growing adds a segment and never moves what is already queued, so no
//! operation costs more than one segment's allocation. Segments are as large as the queue is
//! long, from [`SEGMENT_LEN_MIN`] to [`SEGMENT_LEN`] items, so a short queue holds little room.
//! The last segment emptied is kept for the next one needed, so a queue whose length goes
//! up and down by less than a segment allocates nothing.

use std::collections::VecDeque;

/// Most items in one segment (a queue entry, a message with its content boxed, is under
/// 100 bytes: at most 12.5 KiB, below the size at which freeing a block makes glibc's
/// allocator sort its small free blocks).
const SEGMENT_LEN: usize = 128;
/// Fewest items in one segment.
const SEGMENT_LEN_MIN: usize = 8;

/// See the module doc. Holds no empty segment (but for one left by a `retain_mut` whose
/// closure panicked, which `front` and `pop_front` step over).
#[derive(Debug)]
pub(crate) struct Segmented<T> {
    segments: VecDeque<VecDeque<T>>,
    len: usize,
    /// An emptied segment, for the next one needed.
    spare: Option<VecDeque<T>>,
}

impl<T> Default for Segmented<T> {
    fn default() -> Self {
        Self { segments: VecDeque::new(), len: 0, spare: None }
    }
}

impl<T> Segmented<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn front(&self) -> Option<&T> {
        self.segments.iter().find_map(VecDeque::front)
    }

    pub(crate) fn push_back(&mut self, item: T) {
        match self.segments.back_mut() {
            Some(last) if last.len() < last.capacity() => last.push_back(item),
            _ => {
                let mut segment = self.new_segment();
                segment.push_back(item);
                self.segments.push_back(segment);
            }
        }
        self.len += 1;
    }

    pub(crate) fn push_front(&mut self, item: T) {
        match self.segments.front_mut() {
            Some(first) if first.len() < first.capacity() => first.push_front(item),
            _ => {
                let mut segment = self.new_segment();
                segment.push_front(item);
                self.segments.push_front(segment);
            }
        }
        self.len += 1;
    }

    pub(crate) fn pop_front(&mut self) -> Option<T> {
        loop {
            let first = self.segments.front_mut()?;
            let item = first.pop_front();
            if first.is_empty() {
                self.spare = self.segments.pop_front();
            }
            if item.is_some() {
                self.len -= 1;
                return item;
            }
        }
    }

    /// An empty segment (filled to its capacity, never beyond: it is never moved): the
    /// spare if it is large enough for a queue this long.
    fn new_segment(&mut self) -> VecDeque<T> {
        let wanted = self.len.clamp(SEGMENT_LEN_MIN, SEGMENT_LEN);
        match self.spare.take() {
            Some(spare) if spare.capacity() >= wanted => spare,
            _ => VecDeque::with_capacity(wanted),
        }
    }

    /// Keeps the items for which `keep` returns `true`, in their order.
    pub(crate) fn retain_mut(&mut self, mut keep: impl FnMut(&mut T) -> bool) {
        for segment in &mut self.segments {
            let before = segment.len();
            segment.retain_mut(&mut keep);
            self.len -= before - segment.len();
        }
        self.segments.retain(|s| !s.is_empty());
    }

    /// Takes out the items for which `take` returns `true`, in their order; the others stay
    /// in theirs. Only segments holding one are rebuilt.
    pub(crate) fn extract(&mut self, mut take: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut taken = Vec::new();
        for segment in &mut self.segments {
            if !segment.iter().any(&mut take) {
                continue;
            }
            let items: Vec<T> = segment.drain(..).collect();
            for item in items {
                if take(&item) { taken.push(item) } else { segment.push_back(item) }
            }
        }
        self.len -= taken.len();
        self.segments.retain(|s| !s.is_empty());
        taken
    }

    /// The items, front to back.
    pub(crate) fn iter(&self) -> std::iter::Flatten<std::collections::vec_deque::Iter<'_, VecDeque<T>>> {
        self.segments.iter().flatten()
    }
}

impl<'a, T> IntoIterator for &'a Segmented<T> {
    type Item = &'a T;
    type IntoIter = std::iter::Flatten<std::collections::vec_deque::Iter<'a, VecDeque<T>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_behaves_as_a_deque_across_segment_ends() {
        let (mut segmented, mut model) = (Segmented::default(), VecDeque::new());
        // A fixed pseudo-random walk of pushes and pops at both ends, deep enough for many
        // segments, emptied on the way several times.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for step in 0..200_000u32 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let bias = if (step / 20_000) % 2 == 0 { 6 } else { 3 };
            match state % 10 {
                r if r < bias => {
                    if r % 3 == 0 {
                        segmented.push_front(step);
                        model.push_front(step);
                    } else {
                        segmented.push_back(step);
                        model.push_back(step);
                    }
                }
                _ => assert_eq!(segmented.pop_front(), model.pop_front()),
            }
            assert_eq!(segmented.len(), model.len());
            assert_eq!(segmented.front(), model.front());
            if step % 10_007 == 0 {
                assert!(segmented.iter().eq(model.iter()));
                assert!(segmented.iter().rev().eq(model.iter().rev()));
            }
        }
        assert!(segmented.segments.iter().all(|s| !s.is_empty() && s.capacity() <= 2 * SEGMENT_LEN));
        assert!(
            segmented.segments.len() <= 2 * model.len() / SEGMENT_LEN + 2,
            "full-size segments when deep"
        );
        while let Some(item) = model.pop_front() {
            assert_eq!(segmented.pop_front(), Some(item));
        }
        assert!(segmented.is_empty() && segmented.segments.is_empty() && segmented.pop_front().is_none());
    }

    #[test]
    fn retain_keeps_the_order_and_drops_emptied_segments() {
        let mut segmented = Segmented::default();
        (0..2_000u32).for_each(|n| segmented.push_back(n));
        segmented.retain_mut(|n| *n % 3 == 0 || (600..1_100).contains(n));
        let kept: Vec<u32> = (0..2_000).filter(|n| n % 3 == 0 || (600..1_100).contains(n)).collect();
        assert!(segmented.iter().copied().eq(kept.iter().copied()));
        assert_eq!(segmented.len(), kept.len());
        segmented.retain_mut(|n| *n >= 1_990);
        assert_eq!(segmented.segments.len(), 1, "emptied segments are gone");
        assert_eq!((&segmented).into_iter().count(), segmented.len());
    }

    #[test]
    fn a_retain_whose_closure_panics_leaves_a_consistent_queue() {
        let mut segmented = Segmented::default();
        (0..1_000u32).for_each(|n| segmented.push_back(n));
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            segmented.retain_mut(|n| {
                assert!(*n != 700, "a bug in the closure");
                *n >= 300
            });
        }));
        assert!(outcome.is_err());
        let len = segmented.len();
        let mut left = Vec::new();
        while let Some(n) = segmented.pop_front() {
            left.push(n);
        }
        assert_eq!(left.len(), len, "len counts what is there");
        assert!(left.iter().all(|n| *n >= 300), "what was dropped before the panic is gone");
        assert!(segmented.is_empty() && segmented.front().is_none());
    }

    #[test]
    fn a_short_queue_holds_little_room_and_an_emptied_segment_serves_the_next() {
        let mut segmented = Segmented::default();
        segmented.push_back(0u32);
        assert!(segmented.segments[0].capacity() < SEGMENT_LEN, "a short queue, a small segment");
        (1..1_000).for_each(|n| segmented.push_back(n));
        let first = segmented.segments[0].capacity();
        (0..first).for_each(|_| assert!(segmented.pop_front().is_some()));
        assert!(segmented.spare.is_some(), "the emptied segment is kept");
        // Filling the last segment, then one more: a new segment is needed.
        let room = segmented.segments.back().map_or(0, |s| s.capacity() - s.len());
        (0..=room as u32).for_each(|n| segmented.push_back(n));
        assert!(segmented.spare.is_none(), "the spare is taken (or, too small, let go)");
        let last = segmented.segments.back().expect("segments");
        assert!(last.capacity() >= SEGMENT_LEN_MIN && last.len() == 1);
    }

    #[test]
    fn growing_never_moves_what_is_queued() {
        let mut segmented = Segmented::default();
        segmented.push_back(0u64);
        let first: *const u64 = segmented.front().expect("one item");
        (1..100_000).for_each(|n| segmented.push_back(n));
        assert!(std::ptr::eq(first, segmented.front().expect("items")), "the first item stayed where it was");
    }
}
