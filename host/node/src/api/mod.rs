//! The client API: the protocol spoken on the node's Unix socket and the server that
//! answers it.

pub mod protocol;
mod queues;
pub mod server;
