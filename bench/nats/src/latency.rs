//! Percentiles of measured durations (nearest rank), in microseconds.

use std::time::Duration;

/// p50, p99 and p99.9 of one set of samples.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Percentiles {
    /// The median.
    pub(crate) p50_us: f64,
    /// One sample in a hundred is slower.
    pub(crate) p99_us: f64,
    /// One sample in a thousand is slower.
    pub(crate) p999_us: f64,
}

impl Percentiles {
    /// The percentiles of `samples`; `None` when there are none.
    pub(crate) fn of(mut samples: Vec<Duration>) -> Option<Percentiles> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let at = |quantile: f64| {
            let rank = (quantile * samples.len() as f64).ceil() as usize;
            samples[rank.clamp(1, samples.len()) - 1].as_nanos() as f64 / 1e3
        };
        Some(Percentiles { p50_us: at(0.50), p99_us: at(0.99), p999_us: at(0.999) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let samples = (1..=1000).map(Duration::from_micros).collect();
        let p = Percentiles::of(samples).unwrap();
        assert_eq!((p.p50_us, p.p99_us, p.p999_us), (500.0, 990.0, 999.0));
    }
}
