//! Warnings that strangers or a burst of traffic can repeat without bound (a refused
//! connection, a dead letter, a message that expired on its way) are aggregated per reason:
//! the first `log.repeats_max` of an interval (`log.interval_ms`) are logged one by one,
//! the rest are counted and reported as one line when the interval ends.
//!
//! A reason is a fixed string chosen by the code (never text from a peer), so the set of
//! tallies is bounded by the call sites.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::warn;

/// Reasons of the node's repeated warnings, one per kind of event.
pub(crate) mod reason {
    /// A connection refused before it became a link (garbage, unknown key, bad hello).
    pub(crate) const REFUSED_CONNECTION: &str = "refused connection";
    /// A connection dropped to make room for others still in the handshake.
    pub(crate) const HANDSHAKE_EVICTED: &str = "connection dropped from a full handshake pool";
    /// The transport failed to accept a connection.
    pub(crate) const ACCEPT_FAILED: &str = "accept failed";
    /// A link's handshake with its peer failed (wrong key, wrong cluster key, refused).
    pub(crate) const HANDSHAKE_FAILED: &str = "link handshake failed";
    /// A message went to the dead-letter queue.
    pub(crate) const DEAD_LETTER: &str = "message dead-lettered";
    /// A message expired before it was sent, resent, or on its way here.
    pub(crate) const EXPIRED: &str = "message expired on a link";
    /// A client connection could not be accepted.
    pub(crate) const CLIENT_ACCEPT_FAILED: &str = "client accept failed";
    /// An event copy that could not be stored or sent on was dropped.
    pub(crate) const EVENT_COPY_DROPPED: &str = "event copy dropped";
    /// A persistent delivery refused while the disk is short of room.
    pub(crate) const STORE_SHORT: &str = "persistent delivery refused: disk short of room";
    /// A result message (or a message given back by the session) that cannot be read or
    /// is not believed.
    pub(crate) const BAD_RESULT: &str = "unreadable or unbelieved message";
    /// A link's connection closed with an error.
    pub(crate) const LINK_CLOSED: &str = "link closed with an error";
    /// A message handed to a client does not open (its key or dictionary went away).
    pub(crate) const UNDECODABLE: &str = "message handed out still encoded";
    /// A file transfer's frame that does not read, a write that failed, an answer with no
    /// way back.
    pub(crate) const BAD_FILE_FRAME: &str = "file transfer trouble";
}

/// How many of one reason are logged per interval before the rest are only counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WarningLimits {
    /// Warnings of one reason logged one by one per interval.
    pub repeats_max: u32,
    /// The interval.
    pub interval: Duration,
}

/// One reason's counts in the current interval.
#[derive(Debug)]
struct Tally {
    reason: &'static str,
    since: Instant,
    logged: u32,
    counted: u64,
}

/// See the module doc.
#[derive(Debug)]
pub(crate) struct Warnings {
    limits: WarningLimits,
    tallies: Mutex<Vec<Tally>>,
}

impl Warnings {
    /// Aggregation with these limits.
    pub(crate) fn new(limits: WarningLimits) -> Self {
        Self { limits, tallies: Mutex::new(Vec::new()) }
    }

    /// Aggregation as the configuration's `log:` asks.
    pub(crate) fn from_settings(settings: crate::config::LogSettings) -> Self {
        Self::new(WarningLimits {
            repeats_max: u32::try_from(settings.repeats_max).unwrap_or(u32::MAX),
            interval: Duration::from_millis(settings.interval_ms),
        })
    }

    /// Whether a warning of `reason` may be logged now; when not, it is counted for the
    /// interval's summary. A summary of the interval before is logged first when it ended.
    pub(crate) fn admit(&self, reason: &'static str) -> bool {
        self.admit_at(reason, Instant::now())
    }

    fn admit_at(&self, reason: &'static str, now: Instant) -> bool {
        let mut tallies = self.tallies.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let index = match tallies.iter().position(|t| t.reason == reason) {
            Some(i) => i,
            None => {
                tallies.push(Tally { reason, since: now, logged: 0, counted: 0 });
                tallies.len() - 1
            }
        };
        let tally = tallies.get_mut(index).expect("index found or pushed");
        if now.duration_since(tally.since) >= self.limits.interval {
            summarise(tally, now);
        }
        if tally.logged < self.limits.repeats_max {
            tally.logged += 1;
            true
        } else {
            tally.counted += 1;
            false
        }
    }

    /// Logs the summaries of intervals that ended (called by the node's timer, so a burst's
    /// count comes out even when nothing follows it). Returns how many warnings they counted.
    pub(crate) fn flush(&self) -> u64 {
        self.flush_at(Instant::now(), false)
    }

    fn flush_at(&self, now: Instant, all: bool) -> u64 {
        let mut tallies = self.tallies.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut counted = 0;
        tallies.retain_mut(|tally| {
            if !all && now.duration_since(tally.since) < self.limits.interval {
                return true;
            }
            // A reason quiet for a whole interval is forgotten.
            let quiet = tally.logged == 0 && tally.counted == 0;
            counted += summarise(tally, now);
            !quiet
        });
        counted
    }

    /// Logs every count not yet summarised, whether its interval ended or not (at shutdown).
    pub(crate) fn flush_all(&self) -> u64 {
        self.flush_at(Instant::now(), true)
    }

    /// The interval, for the timer that flushes.
    pub(crate) fn interval(&self) -> Duration {
        self.limits.interval
    }
}

/// Logs what an ended interval counted beyond the warnings it logged, and starts the next.
fn summarise(tally: &mut Tally, now: Instant) -> u64 {
    let counted = std::mem::take(&mut tally.counted);
    if counted > 0 {
        let seconds = now.duration_since(tally.since).as_secs_f64();
        warn!(
            reason = tally.reason,
            more = counted,
            seconds = format_args!("{seconds:.1}"),
            "More warnings of this reason in the last interval were counted, not logged one by one."
        );
    }
    tally.since = now;
    tally.logged = 0;
    counted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warnings(repeats_max: u32) -> Warnings {
        Warnings::new(WarningLimits { repeats_max, interval: Duration::from_secs(10) })
    }

    #[test]
    fn logs_the_first_of_each_reason_then_counts_until_the_interval_ends() {
        let w = warnings(3);
        let t0 = Instant::now();
        let admitted = (0..100).filter(|_| w.admit_at(reason::DEAD_LETTER, t0)).count();
        assert_eq!(admitted, 3);
        // Another reason has its own allowance.
        assert!(w.admit_at(reason::REFUSED_CONNECTION, t0));
        assert_eq!(w.flush_at(t0 + Duration::from_secs(5), false), 0, "the interval has not ended");
        assert_eq!(w.flush_at(t0 + Duration::from_secs(10), false), 97, "one summary counts the rest");
        // The next interval logs afresh.
        assert!(w.admit_at(reason::DEAD_LETTER, t0 + Duration::from_secs(11)));
    }

    #[test]
    fn an_ended_interval_is_summarised_by_the_next_warning_when_no_timer_ran() {
        let w = warnings(1);
        let t0 = Instant::now();
        assert!(w.admit_at(reason::EXPIRED, t0));
        assert!(!w.admit_at(reason::EXPIRED, t0));
        assert!(w.admit_at(reason::EXPIRED, t0 + Duration::from_secs(20)));
        assert_eq!(w.flush_at(t0 + Duration::from_secs(20), false), 0, "already summarised");
    }

    #[test]
    fn tallies_stay_bounded_by_the_reasons_in_use() {
        let w = warnings(1);
        let t0 = Instant::now();
        for i in 0..1000u64 {
            w.admit_at(reason::DEAD_LETTER, t0 + Duration::from_millis(i));
        }
        w.flush_at(t0 + Duration::from_secs(30), false);
        w.flush_at(t0 + Duration::from_secs(60), false);
        assert!(w.tallies.lock().unwrap().is_empty(), "quiet reasons are forgotten");
    }
}
