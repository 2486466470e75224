//! The client API: the protocol spoken on the node's Unix socket and the server that
//! answers it.

mod admin;
pub mod protocol;
mod queues;
pub mod server;
