//! Nodes for unit tests: in process, on a memory store, not started.

use std::sync::Arc;

use super::NodeState;
use crate::config::{self, Overrides};

/// Node from YAML `text` (overrides applied as a command line without any would).
pub(crate) fn node_from(text: &str) -> Arc<NodeState> {
    let mut tree = config::parse_yaml(text).unwrap();
    config::apply_overrides(&mut tree, &Overrides::default());
    NodeState::new(config::from_value(&tree).unwrap()).unwrap()
}

/// Node A with peers B and C, and `D*` routed through B.
pub(crate) fn routed_node() -> Arc<NodeState> {
    node_from(
        "node: { name: A, listen: none }\npeers: [ { name: B }, { name: C } ]\n\
         routes: [ { to: 'D*', via: B } ]\nsecurity: { insecure_plaintext: true }\n\
         plugins: { store: { kind: memory } }",
    )
}
