//! The history checker of fault tests: what was put against what was got, counted as lost,
//! duplicated, reordered and corrupted messages (all must be zero).

use std::collections::HashMap;

/// Counts of what went wrong.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct History {
    /// Messages put.
    pub sent: usize,
    /// Messages got.
    pub received: usize,
    /// Put and never got.
    pub lost: usize,
    /// Got more than once (each extra copy counts).
    pub duplicated: usize,
    /// Got after a message that was put later.
    pub reordered: usize,
    /// Got, but never put in that form.
    pub corrupted: usize,
}

impl History {
    /// Compares the lines put with the lines got (one producer, one queue).
    pub fn check(sent: &[&str], received: &[&str]) -> Self {
        let position: HashMap<&str, usize> = sent.iter().enumerate().map(|(i, s)| (*s, i)).collect();
        let mut seen = vec![0usize; sent.len()];
        let mut h = Self { sent: sent.len(), received: received.len(), ..Self::default() };
        let mut last = None;
        for line in received {
            let Some(&i) = position.get(line) else {
                h.corrupted += 1;
                continue;
            };
            seen[i] += 1;
            if seen[i] > 1 {
                h.duplicated += 1;
                continue;
            }
            if last.is_some_and(|l| l > i) {
                h.reordered += 1;
            }
            last = Some(i);
        }
        h.lost = seen.iter().filter(|n| **n == 0).count();
        h
    }

    /// Whether nothing went wrong.
    pub fn is_clean(&self) -> bool {
        self.lost == 0 && self.duplicated == 0 && self.reordered == 0 && self.corrupted == 0
    }
}
