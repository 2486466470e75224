//! linkbus: a plugin-extensible, multi-node message bus.
//!
//! This crate gathers the pieces an application needs:
//! - [`Client`] (from `linkbus-client`) to put and get messages through a local node;
//! - [`Node`] and [`Config`] to run a node inside a program;
//! - [`plugin_api`]: the message model and the extension-point traits;
//! - [`proto`]: the sans-io link protocol core.
//!
//! ```no_run
//! # async fn example() -> Result<(), linkbus::ClientError> {
//! let mut client = linkbus::Client::connect_node("A").await?;
//! let to = "B:orders".parse().expect("valid address");
//! client.put(linkbus::Content::buf(to, "hello")).await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub use linkbus_client as client;
pub use linkbus_client::{Client, ClientError, Consumer, Transaction};
pub use linkbus_host as host;
pub use linkbus_host::{Config, Node, StartError, config};
pub use linkbus_plugin_api as plugin_api;
pub use linkbus_plugin_api::{
    Address, Content, Lifetime, Message, MessageId, NodeName, Priority, QueueName, Reliability,
};
pub use linkbus_proto as proto;
