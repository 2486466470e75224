//! The client API: the protocol spoken on the node's Unix socket and the server that
//! answers it.

mod admin;
pub mod protocol;
mod queues;
pub mod server;

impl From<crate::flow::RefusalCode> for protocol::ErrorCode {
    /// The client wire's code for a refusal: the one place the two meet.
    fn from(code: crate::flow::RefusalCode) -> Self {
        use crate::flow::RefusalCode as R;
        match code {
            R::Invalid | R::Filtered => Self::Invalid,
            R::UnknownQueue => Self::UnknownQueue,
            R::NoRoute => Self::NoRoute,
            R::TooLarge => Self::TooLarge,
            R::Full => Self::Full,
            R::Rejected => Self::Rejected,
            R::Busy => Self::Busy,
            R::Stopping | R::Store => Self::Internal,
        }
    }
}
