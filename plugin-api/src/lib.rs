//! The contracts of linkbus: the message model, one trait per extension point, and the
//! registry through which built-in plugins are found by name.
//!
//! Modules:
//! - [`name`]: node names, queue names and `node:queue` addresses, validated on creation.
//! - [`message`]: [`Message`], [`Content`], [`MessageId`] and the limits on every field.
//! - [`config`]: the configuration tree and the path-reporting reader plugins use too.
//! - [`transport`]: the [`Transport`] trait (byte streams between nodes).
//! - [`router`]: the [`Router`] trait (next hop towards a distant node).
//! - [`store`]: the [`Store`] trait (ordered key/value spaces, atomic batches, sync).
//! - [`compressor`]: the [`Compressor`] trait (bounded payload compression).
//! - [`cipher`]: the [`Cipher`] trait (end-to-end payload encryption).
//! - [`file`]: file names under a files directory, and the frames a file transfer is made of.
//! - [`handler`]: the [`MessageHandler`] trait (files read and written under a files directory).
//! - [`filter`]: the [`Filter`] trait (user hooks on send, route, forward and deliver).
//! - [`hex`]: keys, ids and digests as hexadecimal text.
//! - [`json`]: configuration values written as JSON (for filter guests and native plugins).
//! - [`registry`]: [`PluginEntry`] and lookup of built-in plugins by name.
//! - `testing` (feature `testing`): the conformance kit every plugin's tests run.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod cipher;
pub mod compressor;
pub mod config;
pub mod file;
pub mod filter;
pub mod handler;
pub mod hex;
pub mod json;
pub mod message;
pub mod name;
pub mod registry;
pub mod router;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transport;

pub use cipher::Cipher;
pub use compressor::{CodecError, Compressor};
pub use config::{ConfigErrors, ConfigIssue, ConfigValue, Diagnostics, Section, read_plugin_section};
pub use file::{FileName, FileNameError, FileStamp};
pub use filter::{Decision, FailureKind, Filter, FilterError, HeaderChange, Hook, Verdict};
pub use handler::{FilesDir, HandlerError, MessageHandler, PartialFile, SourceFile};
pub use message::{
    Content, Encoding, Group, Kind, Lifetime, Message, MessageError, MessageId, Priority, Recipients,
    Reliability, Step,
};
pub use name::{Address, NameError, NodeName, QueueName};
pub use registry::{BuildContext, Builder, Factory, Origin, Plugin, PluginEntry, PluginError, Registry};
pub use router::{AddressPattern, Explanation, Pattern, RouteError, Router, Topology};
/// The small-vector crate [`Recipients`] is made of, for its `smallvec!` macro.
pub use smallvec;
pub use store::{Batch, Store, StoreError, WriteOp};
pub use transport::{BoxFuture, Connection, Listener, Transport, TransportError};

/// Version of the plugin contracts and message model; nodes exchange it in the handshake.
pub const API_VERSION: u32 = 1;

pub use inventory;
