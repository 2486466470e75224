//! The `Router` extension point: which neighbour a message to a distant node goes through.
//!
//! Routers are pure functions of the destination and the node's topology: they do no I/O and
//! keep no per-message state, so they can be swapped or reloaded at any time.

use crate::name::NodeName;

/// What a router may look at: this node and its direct neighbours.
#[derive(Debug, Clone, Copy)]
pub struct Topology<'a> {
    /// The node doing the routing.
    pub local: &'a NodeName,
    /// Direct neighbours, whether or not their link is up.
    pub neighbours: &'a [NodeName],
}

/// Why no next hop was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// No neighbour and no route reaches the destination.
    #[error("no route to node '{0}'")]
    NoRoute(NodeName),
}

/// Chooses the next hop for a destination node that is not this node.
pub trait Router: Send + Sync {
    /// The neighbour to send through. Direct neighbours are resolved by the host before
    /// the router is asked.
    ///
    /// # Errors
    /// [`RouteError::NoRoute`] when nothing reaches `destination`.
    fn next_hop(&self, destination: &NodeName, topology: &Topology<'_>) -> Result<NodeName, RouteError>;
}
