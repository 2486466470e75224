//! The `Filter` extension point: user code that decides on messages on their way, one call
//! per batch (WebAssembly modules through `linkbus-filter-wasm`, or native plugins).
//!
//! A filter sees a batch of messages at one [`Hook`] and answers one [`Verdict`] per
//! message. The host applies the verdicts (it checks every change against the message
//! limits), counts them, and applies the filter's failure policy when the call fails
//! ([`FilterError`]). A filter is shared by every task of the node that runs its hooks, so it
//! is `Sync`: an implementation with state of its own keeps it behind its own lock.

use bytes::Bytes;

use crate::message::Message;
use crate::name::Address;

/// Where on the path a filter runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    /// At the origin node, after the put is checked.
    OnSend,
    /// At the origin node, after `on_send`: may set the recipients (content-based routing);
    /// the static routes apply after it.
    OnRoute,
    /// At a relay, before the message goes to the next hop.
    OnForward,
    /// At the destination node, before the message enters its queue.
    OnDeliver,
}

impl Hook {
    /// Every hook, in the order a message meets them.
    pub const ALL: [Self; 4] = [Self::OnSend, Self::OnRoute, Self::OnForward, Self::OnDeliver];

    /// The hook's name as written in YAML (`on_send`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OnSend => "on_send",
            Self::OnRoute => "on_route",
            Self::OnForward => "on_forward",
            Self::OnDeliver => "on_deliver",
        }
    }

    /// The hook named `name` in YAML.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|hook| hook.as_str() == name)
    }
}

impl std::fmt::Display for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A change to a header a filter asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderChange {
    /// Set `key` to `value` (added when absent).
    Set(String, String),
    /// Remove `key`.
    Remove(String),
}

/// What a filter decided for one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let the message go on unchanged.
    Pass,
    /// Remove the message; the reason goes to the dead-letter record and the result.
    Drop {
        /// Why, in the filter's words.
        reason: String,
    },
    /// Let it go on changed: a new payload (when given), then the header changes in order.
    Change {
        /// The new payload.
        payload: Option<Bytes>,
        /// Header changes, in order.
        headers: Vec<HeaderChange>,
    },
    /// Send it to these recipients instead ([`Hook::OnRoute`] only; to add one, name the
    /// message's own recipients too).
    Route(Vec<Address>),
}

/// A filter's answer to one batch: a verdict per message, in order, and the work it took.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decision {
    /// One verdict per message of the batch.
    pub verdicts: Vec<Verdict>,
    /// Fuel the call used (instructions, for a WebAssembly filter; 0 when not measured).
    pub fuel: u64,
}

/// Why a filter call failed, by kind (counted apart in `linkbus status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// It ran out of fuel (`fuel_per_call`).
    Fuel,
    /// It ran past its time (`time_per_call_ms`).
    Time,
    /// It would grow its memory past its cap (`memory_bytes_max`).
    Memory,
    /// It trapped: an unreachable, a bad memory access, a stack overflow.
    Trap,
    /// What it answered is malformed or breaks a limit (`output_bytes_max`, a header key).
    Output,
}

impl FailureKind {
    /// Every kind, in the order `status` shows them.
    pub const ALL: [Self; 5] = [Self::Fuel, Self::Time, Self::Memory, Self::Trap, Self::Output];

    /// The kind's name in `status` and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fuel => "fuel",
            Self::Time => "time",
            Self::Memory => "memory",
            Self::Trap => "trap",
            Self::Output => "output",
        }
    }
}

/// Why a filter call failed: the filter's failure policy decides what happens to the batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct FilterError {
    /// What kind of failure.
    pub kind: FailureKind,
    /// What went wrong, naming the limit when one was reached.
    pub reason: String,
}

impl FilterError {
    /// A failure of `kind`, for `reason`.
    pub fn new(kind: FailureKind, reason: impl Into<String>) -> Self {
        Self { kind, reason: reason.into() }
    }
}

/// A user filter. Called synchronously, once per batch, outside every lock of the node;
/// bounded per call by its own limits.
pub trait Filter: Send + Sync {
    /// Decides on `messages` at `hook`: one verdict each, in order. A message whose payload
    /// is encoded (compressed or sealed end to end) must only pass or be dropped: its
    /// payload and headers are bound by its origin.
    ///
    /// # Errors
    /// [`FilterError`] when the call itself fails.
    fn filter(&self, hook: Hook, messages: &[&Message]) -> Result<Decision, FilterError>;

    /// The filter's own counters (a guest's `counter_add`), by name.
    fn counters(&self) -> Vec<(String, i64)> {
        Vec::new()
    }

    /// How many times its instance was rebuilt after repeated failures.
    fn rebuilds(&self) -> u64 {
        0
    }

    /// Whether what it was built from is unchanged (a module file not rewritten since): a
    /// reload keeps a filter that is, with its state, and builds one that is not anew.
    fn is_current(&self) -> bool {
        true
    }

    /// Where its code comes from, for `linkbus plugins`: a module file and its digest
    /// ([`crate::registry::Origin::Module`]), or the plugin itself ([`crate::registry::Origin::BuiltIn`]).
    fn origin(&self) -> crate::registry::Origin {
        crate::registry::Origin::BuiltIn
    }
}
