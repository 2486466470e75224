//! The `MessageHandler` extension point: expands message kinds at the edges of the bus.
//!
//! The `file` handler, for instance, turns one file message into chunks at the sender and
//! assembles them (with resume) at the receiver. Handlers keep their state through the host's
//! store, never through their own I/O.

use crate::message::{Kind, Message};

/// Why a handler refused or failed a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("handler failed: {0}")]
pub struct HandlerError(pub String);

/// Serves one message kind at the sending and receiving edges.
pub trait MessageHandler: Send + Sync {
    /// The kind this handler serves.
    fn kind(&self) -> Kind;

    /// Expands a message at its origin into the messages that actually travel.
    ///
    /// # Errors
    /// [`HandlerError`] when the message cannot be expanded.
    fn expand(&self, message: Message) -> Result<Vec<Message>, HandlerError> {
        Ok(vec![message])
    }

    /// Takes one travelling message at the destination; returns the assembled message once
    /// complete.
    ///
    /// # Errors
    /// [`HandlerError`] when the parts do not assemble.
    fn assemble(&self, message: Message) -> Result<Option<Message>, HandlerError> {
        Ok(Some(message))
    }
}
