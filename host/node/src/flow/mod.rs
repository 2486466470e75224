//! The path of a message through a node, one pipeline per direction:
//! - [`origin`]: a client's put or commit (and the node's own events and results): checked
//!   and stamped, through the origin stages, placed, admitted (room, pace) and queued;
//! - [`inbound`]: what arrived on a link: through the relay and delivery stages, placed,
//!   and queued with the link's record of it;
//! - [`placement`]: where a message's copies go (local queues, links, dead letters), the
//!   room they need, and putting them there — the one place that queues messages;
//! - [`dead_letter`]: the dead-letter queue's marks and reports;
//! - [`stages`]: code that acts on messages on their way, built per task from factories;
//! - [`filters`]: the user filters (`plugins.filters`): one stage at every site, reloadable;
//! - [`codecs`]: the configured compressors and ciphers: stages at the origin, undone at
//!   the destination from what each message records;
//! - [`refusal`]: why something is not taken, as a code and a reason.
//!
//! A batch is planned, checked for room, then applied; a single message is the case of a
//! batch of one, not a path of its own.

pub mod codecs;
pub mod dead_letter;
pub mod filters;
pub(crate) mod inbound;
pub mod origin;
pub(crate) mod placement;
pub mod refusal;
pub mod stages;

pub use codecs::CodecStats;
pub use dead_letter::{DeadLetter, DeadLetterCode};
pub use filters::FilterStats;
pub use origin::{Accepted, Origin};
pub use refusal::{CommitError, PutError, Refusal, RefusalCode};
pub use stages::{Site, Stage, StageBatch, StageContext, StageFactory};
