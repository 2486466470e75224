//! Reconnect delays: doubling from a minimum to a maximum, back to the minimum once the
//! link made progress.

use std::time::Duration;

/// See the module doc.
#[derive(Debug)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Delays from `min_ms` to `max_ms`.
    pub(crate) fn new(min_ms: u64, max_ms: u64) -> Self {
        let min = Duration::from_millis(min_ms);
        Self { min, max: Duration::from_millis(max_ms), next: min }
    }

    /// The next delay; the one after is twice as long, up to the maximum.
    pub(crate) fn take(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    /// Back to the minimum.
    pub(crate) fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_maximum_and_resets() {
        let mut b = Backoff::new(100, 350);
        let ms: Vec<u128> = (0..4).map(|_| b.take().as_millis()).collect();
        assert_eq!(ms, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.take().as_millis(), 100);
    }
}
