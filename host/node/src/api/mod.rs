//! The client API's server: it answers the client protocol (`linkbus_client::protocol`)
//! on the node's Unix socket and for in-process clients.

mod admin;
mod groups;
use linkbus_client::protocol;
mod queues;
pub(crate) mod server;
mod transaction;

impl From<crate::flow::RefusalCode> for protocol::ErrorCode {
    /// The client wire's code for a refusal: the one place the two meet.
    fn from(code: crate::flow::RefusalCode) -> Self {
        use crate::flow::RefusalCode as R;
        match code {
            R::Invalid | R::Filtered | R::StageFailed | R::Dropped | R::DecodeFailed | R::DecryptFailed => {
                Self::Invalid
            }
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
