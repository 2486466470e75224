//! The `Filter` extension point: user hooks on the path of a message (WASM or native).

use crate::message::Message;

/// Where on the path a filter runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    /// At the origin node, after the put is validated.
    OnSend,
    /// At a relay, before the message goes to the next hop.
    OnForward,
    /// At the destination node, before the message enters its queue.
    OnDeliver,
}

/// What a filter decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let the message go on (possibly rewritten in place).
    Pass,
    /// Remove the message; the reason goes to the dead-letter record and the result.
    Drop {
        /// Why, in the filter's words.
        reason: String,
    },
}

/// Why a filter call failed (a trap, a timeout, a memory cap): the hook's failure policy
/// decides what happens to the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("filter '{filter}' failed: {reason}")]
pub struct FilterError {
    /// The filter's configured name.
    pub filter: String,
    /// What went wrong.
    pub reason: String,
}

/// A user hook. Synchronous, bounded per call by the host.
pub trait Filter: Send {
    /// Inspects and may rewrite `message` (payload, headers).
    ///
    /// # Errors
    /// [`FilterError`] when the filter itself fails.
    fn filter(&mut self, hook: Hook, message: &mut Message) -> Result<Verdict, FilterError>;
}
