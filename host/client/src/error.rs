//! Why a client call failed, and how a put of many counts what its earlier requests put.

use std::path::PathBuf;
use std::time::Duration;

use crate::protocol::ErrorCode;

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The node's socket could not be reached.
    #[error("cannot reach the node at {path}: {source}")]
    Connect {
        /// The socket path tried.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The connection failed mid-call.
    #[error("connection to the node failed: {0}")]
    Io(#[from] std::io::Error),
    /// The node answered with something this client does not understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The node refused the request.
    #[error("{message}")]
    Refused {
        /// The cause.
        code: ErrorCode,
        /// For puts: contents accepted before the refused one.
        accepted: u32,
        /// The node's explanation.
        message: String,
    },
    /// No answer to a put in time: the messages may or may not have been accepted. The
    /// connection can no longer be used (a late answer would be taken for the next one).
    #[error("no answer within {0:?}: the outcome is unknown (the message may or may not have been accepted)")]
    OutcomeUnknown(Duration),
    /// An earlier call ended without its answer (abandoned, timed out or failed); connect
    /// again.
    #[error("this connection lost track of its answers (an earlier call ended without one); connect again")]
    Broken,
    /// A put of many contents went in several requests: the first `accepted` contents
    /// were accepted, then a later request failed as `source` says (a refusal comes as
    /// [`ClientError::Refused`] counting all of them instead).
    #[error("{accepted} messages were accepted, then: {source}")]
    PartlyAccepted {
        /// Contents accepted by the requests before the one that failed.
        accepted: u32,
        /// How that one failed.
        source: Box<ClientError>,
    },
    /// A [`Consumer`] was ended by an error it returned before; consume again on a new
    /// connection.
    #[error("this consumer has ended (an error ended it); connect again")]
    Ended,
}

/// A refusal of one of the requests a put of many was cut into, as a refusal of the whole
/// put: the `earlier` contents the requests before it put count as accepted, and the refused
/// content is numbered among all of them.
pub(super) fn counting_earlier(error: ClientError, earlier: usize) -> ClientError {
    let earlier = u32::try_from(earlier).unwrap_or(u32::MAX);
    let ClientError::Refused { code, accepted, message } = error else {
        // Any other failure after some were accepted says so, so nobody puts them twice.
        return if earlier == 0 {
            error
        } else {
            ClientError::PartlyAccepted { accepted: earlier, source: Box::new(error) }
        };
    };
    let total = accepted.saturating_add(earlier);
    // The node numbers the refused content within its request ("message N: …").
    let reason =
        message.strip_prefix(&format!("message {}: ", accepted.saturating_add(1))).map(str::to_owned);
    let message = match reason {
        Some(reason) => format!("message {}: {reason}", total.saturating_add(1)),
        None => message,
    };
    ClientError::Refused { code, accepted: total, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal in a later request of a put counts the contents the requests before it
    /// put and numbers the refused one among all; any other failure after some were put
    /// says how many.
    #[test]
    fn a_failure_part_way_through_a_put_counts_what_earlier_requests_put() {
        let refused =
            ClientError::Refused { code: ErrorCode::Full, accepted: 5, message: "message 6: full".into() };
        match counting_earlier(refused, 100) {
            ClientError::Refused { accepted: 105, message, .. } => assert_eq!(message, "message 106: full"),
            other => panic!("{other:?}"),
        }
        let unknown = ClientError::OutcomeUnknown(Duration::from_secs(1));
        assert!(matches!(
            counting_earlier(unknown, 100),
            ClientError::PartlyAccepted { accepted: 100, source } if matches!(*source, ClientError::OutcomeUnknown(_))
        ));
        assert!(matches!(counting_earlier(ClientError::Broken, 0), ClientError::Broken), "nothing earlier");
    }
}
