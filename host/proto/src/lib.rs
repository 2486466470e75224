//! The sans-io core of linkbus: everything about the link protocol that can be decided
//! without a socket, a task or a clock. Time comes in as an argument.
//!
//! Modules:
//! - [`channel`]: the channels of a link and which messages travel on which.
//! - [`crc`]: CRC-32C, the checksum of frames, messages and stored records.
//! - [`frame`]: link frames and the incremental, limit-checked frame decoder.
//! - [`wire`]: the wire form of messages and client contents.
//! - [`session`]: the per-neighbour session state machine (handshake, sequence numbers,
//!   cumulative ACK, resend after reconnect, keepalive).
//! - [`reader`]: the bounds-checked byte reader every decoder uses.
//! - [`recycle`]: large buffers used again instead of freed (the host makes one
//!   [`recycle::Recycler`] and hands it to its sessions).
//! - [`secure`]: the connection preamble and the Noise IKpsk2 channel under the frames.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

pub mod channel;
pub mod crc;
pub mod frame;
pub mod reader;
pub mod recycle;
pub mod secure;
pub mod session;
pub mod wire;

pub use frame::{Frame, FrameDecoder, FrameError, Hello, PROTOCOL_VERSION};
pub use reader::{ReadError, Reader};
pub use session::{DropReason, SendError, Session, SessionConfig, SessionError, SessionEvent, SessionStats};
