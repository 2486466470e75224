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
/// Stop the node abruptly (`1`) right after it moved a file received into place, before
/// that is recorded: the crash a recipient's restart must recognise.
pub(crate) const CRASH_AFTER_MOVE_ENV: &str = "LINKBUS_TEST_CRASH_AFTER_MOVE";

/// See [`CRASH_AFTER_MOVE_ENV`].
pub(crate) fn crash_after_move() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        set(
            CRASH_AFTER_MOVE_ENV,
            true,
            Some("the node stops right after moving a file into place (test-only)."),
        )
    })
}

/// Stop the node abruptly at a point of a transaction's commit: `before` (room checked,
/// nothing written), `inside` (its puts and acknowledgements issued to the store's batch,
/// not yet released to the store) or `after` (durable, not yet answered).
pub(crate) const CRASH_IN_COMMIT_ENV: &str = "LINKBUS_TEST_CRASH_IN_COMMIT";

/// Aborts the process when [`CRASH_IN_COMMIT_ENV`] names `point`.
pub(crate) fn crash_in_commit(point: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| {
        set(CRASH_IN_COMMIT_ENV, false, Some("the node stops inside a commit (test-only)."))
            .then(|| std::env::var(CRASH_IN_COMMIT_ENV).unwrap_or_default())
    });
    if at.as_deref() == Some(point) {
        eprintln!("{CRASH_IN_COMMIT_ENV}={point}: stopping now");
        std::process::abort();
    }
}

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

/// Change what a relay passes on (`payload`: flip a byte of each relayed user message's
/// payload; `header`: change its name; `strip`: drop its encoding and put a payload of the
/// relay's own; `truncate`: cut its payload to half), past the link's own integrity checks: the payload
/// cipher's negative control, which must make the destination dead-letter such messages.
pub(crate) const TAMPER_RELAYED_ENV: &str = "LINKBUS_TEST_TAMPER_RELAYED";

/// The relay stage [`TAMPER_RELAYED_ENV`] asks for, if it is set.
pub(crate) fn tamper_relayed() -> Option<std::sync::Arc<dyn crate::flow::StageFactory>> {
    if !set(TAMPER_RELAYED_ENV, false, Some("relayed messages are changed on their way (test-only).")) {
        return None;
    }
    let how = match std::env::var(TAMPER_RELAYED_ENV).as_deref() {
        Ok("header") => How::Header,
        Ok("strip") => How::Strip,
        Ok("truncate") => How::Truncate,
        _ => How::Payload,
    };
    Some(std::sync::Arc::new(Tamper { how }))
}

/// See [`TAMPER_RELAYED_ENV`].
#[derive(Clone, Copy)]
enum How {
    Payload,
    Header,
    Strip,
    Truncate,
}

/// See [`TAMPER_RELAYED_ENV`].
struct Tamper {
    how: How,
}

impl crate::flow::StageFactory for Tamper {
    fn name(&self) -> &str {
        "test-tamper"
    }

    fn build(&self, context: &crate::flow::StageContext<'_>) -> Option<Box<dyn crate::flow::Stage>> {
        (context.site == crate::flow::Site::Relay).then(|| Box::new(Tamper { how: self.how }) as _)
    }
}

impl crate::flow::Stage for Tamper {
    fn run(&mut self, batch: &mut crate::flow::StageBatch<'_, '_>) {
        // (Users' messages only: results and events go on as they are.)
        for message in batch.messages().iter_mut().filter(|m| !m.content.priority.is_system()) {
            match self.how {
                How::Header => message.content.name.push('!'),
                How::Truncate => {
                    let half = message.content.payload.len() / 2;
                    message.content.payload.truncate(half);
                }
                How::Strip => {
                    message.encoding.clear();
                    message.content.payload = bytes::Bytes::from_static(b"forged by the relay");
                }
                How::Payload => {
                    if let Some(&last) = message.content.payload.last() {
                        let mut payload = message.content.payload.to_vec();
                        if let Some(byte) = payload.last_mut() {
                            *byte = last ^ 1;
                        }
                        message.content.payload = payload.into();
                    }
                }
            }
        }
    }
}
