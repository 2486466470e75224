//! Test-only fault switches, for the fault and durability tests' negative controls. They
//! exist only in builds with the `fault-injection` cargo feature (the tests turn it on);
//! any other build reads no such variable and behaves as if none were set.

/// Answer persistent puts before the store has synced them: acknowledged messages are then
/// lost in a crash, as the durability tests' negative control expects.
pub(crate) const ACK_BEFORE_SYNC_ENV: &str = "LINKBUS_TEST_ACK_BEFORE_SYNC";
/// Deliver duplicates instead of dropping them (`1`): the link fault tests' negative control.
#[cfg(feature = "fault-injection")]
pub(crate) const SKIP_DEDUP_ENV: &str = "LINKBUS_TEST_SKIP_DEDUP";
/// Store what arrives but never acknowledge it (`1`), so a test can crash a receiver that
/// holds messages its peer still waits on.
pub(crate) const HOLD_ACKS_ENV: &str = "LINKBUS_TEST_HOLD_ACKS";
/// Milliseconds added to this node's wall clock, to run nodes whose clocks disagree on one
/// machine.
pub(crate) const CLOCK_OFFSET_ENV: &str = "LINKBUS_TEST_CLOCK_OFFSET_MS";

/// Whether `name` is set (to `1` when `one`), in a build with fault injection; `warning`
/// is logged when it is.
#[cfg(feature = "fault-injection")]
fn set(name: &str, one: bool, warning: Option<&str>) -> bool {
    let on = std::env::var_os(name).is_some_and(|v| !one || v == "1");
    if let Some(warning) = warning.filter(|_| on) {
        tracing::warn!("{name}=1: {warning}");
    }
    on
}

#[cfg(not(feature = "fault-injection"))]
fn set(_: &str, _: bool, _: Option<&str>) -> bool {
    false
}

/// See [`ACK_BEFORE_SYNC_ENV`].
pub(crate) fn ack_before_sync() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| set(ACK_BEFORE_SYNC_ENV, false, None))
}

/// Whether `LINKBUS_TEST_SKIP_DEDUP` is `1`.
#[cfg(feature = "fault-injection")]
pub(crate) fn skip_dedup() -> bool {
    set(SKIP_DEDUP_ENV, true, Some("duplicate detection is OFF (test-only negative control)."))
}

/// See [`HOLD_ACKS_ENV`].
pub(crate) fn hold_acks() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| set(HOLD_ACKS_ENV, true, Some("nothing received is acknowledged (test-only).")))
}

/// See [`CLOCK_OFFSET_ENV`].
pub(crate) fn clock_offset_ms() -> i64 {
    static OFFSET: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *OFFSET.get_or_init(|| {
        if !set(CLOCK_OFFSET_ENV, false, None) {
            return 0;
        }
        std::env::var(CLOCK_OFFSET_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0)
    })
}
