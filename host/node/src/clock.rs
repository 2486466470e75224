//! The one place the node reads the wall clock: message creation times and handshake
//! stamps. Every decision about time uses monotonic `Instant`s instead.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn unix_ms() -> u64 {
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    ms.saturating_add_signed(crate::faults::clock_offset_ms())
}
