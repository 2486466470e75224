//! The one place the node reads the wall clock: message creation times and handshake
//! stamps. Every decision about time uses monotonic `Instant`s instead.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Test-only (debug builds): milliseconds added to this node's wall clock, to run nodes
/// whose clocks disagree on one machine. Release builds ignore it.
pub const CLOCK_OFFSET_ENV: &str = "LINKBUS_TEST_CLOCK_OFFSET_MS";

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    ms.saturating_add_signed(offset_ms())
}

fn offset_ms() -> i64 {
    static OFFSET: OnceLock<i64> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        if !cfg!(debug_assertions) {
            return 0;
        }
        std::env::var(CLOCK_OFFSET_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0)
    })
}
