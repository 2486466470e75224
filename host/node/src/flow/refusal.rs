//! Why the node does not take something: a code for programs and a reason for people. The
//! client wire's error codes are chosen from it in one place, `api/`.

/// What kind of refusal it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RefusalCode {
    /// A field is invalid, or what was asked is not allowed.
    Invalid,
    /// The destination queue does not exist.
    UnknownQueue,
    /// No link reaches the destination node.
    NoRoute,
    /// Over a size limit, or more than a queue ever holds.
    TooLarge,
    /// A queue or transmission queue is full (a put may wait for room).
    Full,
    /// A queue that rejects puts when full (`when_full: reject`) is full.
    Rejected,
    /// The node holds as much as it may of something else (results waited for, room on
    /// the disk): try again later.
    Busy,
    /// A stage on the message's path refused it.
    Filtered,
    /// A stage on the message's path failed on it.
    StageFailed,
    /// A filter removed it on a link, on purpose or by its failure policy: it is not
    /// dead-lettered; its origin hears `filter_dropped`. (At the origin a put is refused
    /// with [`RefusalCode::Filtered`] or [`RefusalCode::StageFailed`] instead.)
    Dropped,
    /// A codec step it records (a compressor's) does not undo here.
    DecodeFailed,
    /// A cipher step it records does not open here: a wrong or missing key, or a payload or
    /// header changed on the way.
    DecryptFailed,
    /// The node is shutting down.
    Stopping,
    /// The store failed.
    Store,
}

/// Why the node does not take a message or carry out a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Refusal {
    /// What kind of refusal.
    pub code: RefusalCode,
    /// Why, for people.
    pub reason: String,
}

impl Refusal {
    /// A refusal of `code`, for `reason`.
    pub fn new(code: RefusalCode, reason: impl Into<String>) -> Self {
        Self { code, reason: reason.into() }
    }

    /// The same refusal with `more` after its reason.
    pub(crate) fn and(mut self, more: &str) -> Self {
        self.reason.push_str(more);
        self
    }

    /// Whether waiting may lift it (room may come).
    pub(crate) fn is_full(&self) -> bool {
        self.code == RefusalCode::Full
    }
}

/// Why a put was refused: the refusal, and how many of the batch's contents were accepted
/// before the refused one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PutError {
    /// The cause.
    pub code: RefusalCode,
    /// Contents accepted before this error.
    pub accepted: u32,
    /// What went wrong.
    pub message: String,
}

impl PutError {
    /// `refusal` of the content at `index` of a batch (those before it were accepted).
    pub(crate) fn at(index: usize, refusal: Refusal) -> Self {
        Self {
            code: refusal.code,
            accepted: u32::try_from(index).unwrap_or(u32::MAX),
            message: format!("message {}: {}", index + 1, refusal.reason),
        }
    }
}

/// Why a commit failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitError {
    /// Nothing was queued.
    Refused(Refusal),
    /// The store failed after some puts were queued.
    Partly(String),
}
