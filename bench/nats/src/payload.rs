//! Payloads that carry their own index, and the tally that checks them where they arrive.
//!
//! The first 8 bytes are the index, little-endian; every later byte is a pattern seeded by
//! the index, so a payload cut short, shifted or mixed with another one fails the check.
//! The index holds a source (a publisher) in its high 32 bits and that source's message
//! number in the low 32, so one tally checks the order of several publishers at once.

use bytes::Bytes;

/// The index prefix; payloads are at least this long.
pub(crate) const INDEX_BYTES: usize = 8;
/// Where the source starts in an index.
const SOURCE_SHIFT: u32 = 32;

/// The index of message `number` of publisher `source`.
pub(crate) fn index(source: u64, number: u64) -> u64 {
    assert!(number < 1 << SOURCE_SHIFT, "message number {number} exceeds 32 bits");
    source << SOURCE_SHIFT | number
}

/// The payload of message `index`, `size_bytes` long.
pub(crate) fn make(index: u64, size_bytes: usize) -> Bytes {
    assert!(size_bytes >= INDEX_BYTES, "payloads hold at least their index");
    let seed = seed(index);
    let mut payload = Vec::with_capacity(size_bytes);
    payload.extend_from_slice(&index.to_le_bytes());
    payload.extend((INDEX_BYTES..size_bytes).map(|offset| pattern(seed, offset)));
    Bytes::from(payload)
}

/// The index of an intact payload of `size_bytes`, or `None` when any byte is wrong.
pub(crate) fn check(payload: &[u8], size_bytes: usize) -> Option<u64> {
    if payload.len() != size_bytes || size_bytes < INDEX_BYTES {
        return None;
    }
    let (prefix, rest) = payload.split_at(INDEX_BYTES);
    let index = u64::from_le_bytes(prefix.try_into().ok()?);
    let seed = seed(index);
    // Every byte compared, without stopping at the first difference, so the loop
    // vectorises: the harness must cost little next to what it measures.
    let differences =
        rest.iter().zip(INDEX_BYTES..).fold(0u8, |acc, (&byte, offset)| acc | (byte ^ pattern(seed, offset)));
    (differences == 0).then_some(index)
}

/// One byte per index, mixed so that neighbouring indexes differ in every pattern byte.
fn seed(index: u64) -> u8 {
    index.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes()[7]
}

/// The byte at `offset` of a payload with this seed.
fn pattern(seed: u8, offset: usize) -> u8 {
    seed.wrapping_add(offset as u8)
}

/// Counts what arrived: intact or not, and in order per source.
#[derive(Debug)]
pub(crate) struct Tally {
    /// Every payload taken, intact or not.
    pub(crate) received: u64,
    /// Payloads that failed the check, or named an unknown source.
    pub(crate) corrupt: u64,
    /// Payloads at or before one already taken from the same source (reordered or duplicated).
    pub(crate) out_of_order: u64,
    /// Messages skipped over within a source (lost in the middle; losses at the end show
    /// only in `received`).
    pub(crate) skipped: u64,
    /// The next message number expected from each source.
    next: Vec<u64>,
}

impl Tally {
    /// A tally for publishers `0..sources`.
    pub(crate) fn new(sources: usize) -> Tally {
        Tally { received: 0, corrupt: 0, out_of_order: 0, skipped: 0, next: vec![0; sources] }
    }

    /// Checks one payload.
    pub(crate) fn take(&mut self, payload: &[u8], size_bytes: usize) {
        self.received += 1;
        let Some(index) = check(payload, size_bytes) else {
            self.corrupt += 1;
            return;
        };
        let number = index & ((1 << SOURCE_SHIFT) - 1);
        let Some(next) = usize::try_from(index >> SOURCE_SHIFT).ok().and_then(|s| self.next.get_mut(s))
        else {
            self.corrupt += 1;
            return;
        };
        if number < *next {
            self.out_of_order += 1;
        } else {
            self.skipped += number - *next;
            *next = number + 1;
        }
    }

    /// True when exactly `expected` payloads arrived, all intact and in order.
    pub(crate) fn is_clean(&self, expected: u64) -> bool {
        self.received == expected && self.corrupt == 0 && self.out_of_order == 0 && self.skipped == 0
    }

    /// One line for the report: what arrived against what was sent.
    pub(crate) fn summary(&self, expected: u64) -> String {
        if self.is_clean(expected) {
            return format!("all {expected} intact, in order");
        }
        format!(
            "PROBLEM: received {} of {expected} ({} missing), {} corrupt, {} out of order, {} skipped",
            self.received,
            expected.saturating_sub(self.received),
            self.corrupt,
            self.out_of_order,
            self.skipped
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intact_payloads_pass_and_damaged_ones_fail() {
        let payload = make(index(3, 7), 64);
        assert_eq!(check(&payload, 64), Some(index(3, 7)));
        let mut damaged = payload.to_vec();
        damaged[40] ^= 1;
        assert_eq!(check(&damaged, 64), None);
        assert_eq!(check(&payload[..63], 64), None);
    }

    #[test]
    fn tally_counts_order_per_source() {
        let mut tally = Tally::new(2);
        for (source, number) in [(0, 0), (1, 0), (0, 1), (1, 2), (0, 1)] {
            tally.take(&make(index(source, number), 16), 16);
        }
        assert_eq!((tally.received, tally.corrupt, tally.out_of_order, tally.skipped), (5, 0, 1, 1));
        assert!(!tally.is_clean(5));
    }
}
