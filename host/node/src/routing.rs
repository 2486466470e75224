//! Where a message to another node goes next: a direct neighbour's link, or the link of
//! the neighbour the router plugin names (static routes by default). The router is built
//! from the configuration and can be replaced while the node runs (`linkbus reload`).
//!
//! A message with recipients on several nodes leaves in one copy per next hop, each copy
//! naming only the recipients routed through that hop, so no node downstream reaches a
//! recipient twice.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use linkbus_plugin_api::registry::{BuildContext, Builder, PluginError};
use linkbus_plugin_api::{ConfigValue, Explanation, NodeName, Router, Topology};

use crate::config::Config;

/// The node's router and its neighbours.
pub struct Routing {
    local: NodeName,
    neighbours: Vec<NodeName>,
    router: RwLock<Arc<dyn Router>>,
    /// The router's answers so far, by destination (at most [`DECIDED_MAX`]). A router is
    /// a pure function of the destination and the topology, so an answer holds until the
    /// router is replaced; asking it again for every message cost a lock, a list of
    /// candidate routes and a sort.
    decided: RwLock<HashMap<NodeName, Result<NodeName, String>>>,
}

/// Most destinations whose next hop is remembered; past it the answers start afresh.
const DECIDED_MAX: usize = 4096;

impl std::fmt::Debug for Routing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routing").field("local", &self.local).field("neighbours", &self.neighbours).finish()
    }
}

/// Builds the configured router: its plugin section, with the configuration's `routes`
/// handed over in it.
///
/// # Errors
/// The plugin is not registered, or refuses its configuration.
pub fn build_router(config: &Config) -> Result<Arc<dyn Router>, PluginError> {
    let choice = &config.plugins.router;
    let found = config.plugins.registry.find("router", &choice.kind, choice.library_path());
    let Some(Builder::Router(build)) = found.map(|p| &p.builder) else {
        return Err(PluginError { plugin: choice.kind.clone(), reason: "not registered".into() });
    };
    let mut section = match &choice.section {
        ConfigValue::Map(entries) => entries.clone(),
        _ => Vec::new(),
    };
    let text = |s: &str| ConfigValue::Str(s.to_owned());
    let routes = config
        .routes
        .iter()
        .map(|r| {
            ConfigValue::Map(vec![("to".into(), text(r.to.as_str())), ("via".into(), text(r.via.as_str()))])
        })
        .collect();
    section.retain(|(k, _)| k != "routes");
    section.push(("routes".into(), ConfigValue::Seq(routes)));
    let ctx = BuildContext { node: config.node.name.clone(), data_dir: config.node.data_dir.clone() };
    Ok(Arc::from(build(&ConfigValue::Map(section), &ctx)?))
}

/// Where a destination node is reached from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hop {
    /// This node.
    Local,
    /// Through this neighbour.
    Via(NodeName),
}

impl Routing {
    /// The routing of node `config.node.name`.
    ///
    /// # Errors
    /// As [`build_router`].
    pub fn new(config: &Config) -> Result<Self, PluginError> {
        Ok(Self {
            local: config.node.name.clone(),
            neighbours: config.peers.iter().map(|p| p.name.clone()).collect(),
            router: RwLock::new(build_router(config)?),
            decided: RwLock::default(),
        })
    }

    /// Replaces the router (a reload).
    pub fn replace(&self, router: Arc<dyn Router>) {
        let mut current = self.router.write().unwrap_or_else(PoisonError::into_inner);
        *current = router;
        // Under the router's lock: an answer of the old router is written, if at all,
        // before this (see `next_hop`).
        self.decided.write().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// The destination patterns of the router's routes.
    pub fn patterns(&self) -> Vec<linkbus_plugin_api::Pattern> {
        self.router().patterns()
    }

    fn router(&self) -> Arc<dyn Router> {
        self.router.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn topology(&self) -> Topology<'_> {
        Topology { local: &self.local, neighbours: &self.neighbours }
    }

    /// The next hop towards `destination`, or why there is none.
    ///
    /// # Errors
    /// No neighbour and no route reaches it, or the router named a node that is not a
    /// neighbour.
    pub fn next_hop(&self, destination: &NodeName) -> Result<Hop, String> {
        if destination == &self.local {
            return Ok(Hop::Local);
        }
        if self.neighbours.contains(destination) {
            return Ok(Hop::Via(destination.clone()));
        }
        if let Some(decided) = self.decided.read().unwrap_or_else(PoisonError::into_inner).get(destination) {
            return decided.clone().map(Hop::Via);
        }
        // The router stays while its answer is written down (`replace` waits for it).
        let router = self.router.read().unwrap_or_else(PoisonError::into_inner);
        let decided = match router.next_hop(destination, &self.topology()) {
            Ok(via) if via == self.local || !self.neighbours.contains(&via) => Err(format!(
                "the route to node '{destination}' goes through '{via}', which is not a neighbour"
            )),
            Ok(via) => Ok(via),
            Err(e) => Err(e.to_string()),
        };
        let mut known = self.decided.write().unwrap_or_else(PoisonError::into_inner);
        if known.len() >= DECIDED_MAX {
            known.clear();
        }
        known.insert(destination.clone(), decided.clone());
        drop(known);
        drop(router);
        decided.map(Hop::Via)
    }

    /// The decision for `destination` with its reasons, as lines for people.
    pub fn explain(&self, destination: &NodeName) -> Vec<String> {
        let router = self.router();
        let Explanation { next_hop, chosen, others } = router.explain(destination, &self.topology());
        let mut lines = Vec::new();
        if destination == &self.local {
            lines.push(format!("{destination}: this node; delivered here"));
            return lines;
        }
        if self.neighbours.contains(destination) {
            lines.push(format!("{destination}: next hop {destination} (a direct neighbour)"));
            if next_hop.is_ok() {
                lines.push(format!("  {chosen} lost: direct neighbours win over routes"));
            }
            lines.extend(others.into_iter().map(|o| format!("  {o}")));
            return lines;
        }
        match next_hop {
            Ok(via) if self.neighbours.contains(&via) => {
                lines.push(format!("{destination}: next hop {via}, by {chosen}"));
            }
            Ok(via) => {
                lines.push(format!("{destination}: no next hop: {chosen} names '{via}', not a neighbour"))
            }
            Err(_) => lines.push(format!("{destination}: no route: {chosen}")),
        }
        lines.extend(others.into_iter().map(|o| format!("  {o}")));
        lines
    }
}

/// Checks the configurations of a cluster together: node names are unique, the two ends
/// of every link list each other, and no message can loop — for every node and every
/// destination (each node named anywhere, and a name matching each route pattern), the
/// next hops are followed from node to node until the destination, a node outside the
/// set, or no route; coming back to a node on the way is a loop, reported with its path.
/// Returns the problems, each one line.
pub fn check_cluster(configs: &[Config]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut by_name: std::collections::BTreeMap<&NodeName, (&Config, Routing)> =
        std::collections::BTreeMap::new();
    for config in configs {
        let name = &config.node.name;
        if by_name.contains_key(name) {
            problems.push(format!("node {name} has two configurations"));
            continue;
        }
        match Routing::new(config) {
            Ok(routing) => {
                by_name.insert(name, (config, routing));
            }
            Err(e) => problems.push(format!("node {name}: {e}")),
        }
    }
    for (name, (config, _)) in &by_name {
        for peer in &config.peers {
            if let Some((other, _)) = by_name.get(&peer.name)
                && !other.peers.iter().any(|p| &p.name == *name)
            {
                problems.push(format!(
                    "node {name} lists peer {}, but {}'s configuration does not list {name}",
                    peer.name, peer.name
                ));
            }
        }
    }
    // Every node named anywhere, names matching each pattern, and names matching each
    // pair of patterns (a loop may need two nodes' routes to match the same name).
    let mut destinations: std::collections::BTreeSet<NodeName> = std::collections::BTreeSet::new();
    let mut patterns = Vec::new();
    for (config, routing) in by_name.values() {
        destinations.insert(config.node.name.clone());
        destinations.extend(config.peers.iter().map(|p| p.name.clone()));
        patterns.extend(routing.patterns());
    }
    for (i, pattern) in patterns.iter().enumerate() {
        destinations.extend(pattern.examples());
        destinations.extend(patterns[i + 1..].iter().filter_map(|other| pattern.common_example(other)));
    }
    // One report per loop, whichever node and destination found it first; the other
    // destinations caught in it are named too.
    let mut loops: Vec<(Vec<NodeName>, Vec<NodeName>, Vec<&NodeName>)> = Vec::new();
    for destination in &destinations {
        for start in by_name.keys() {
            let Some(path) = follow(&by_name, start, destination) else { continue };
            let cycle_start = path.iter().position(|n| Some(n) == path.last()).unwrap_or(0);
            let mut cycle: Vec<NodeName> = path[cycle_start..path.len() - 1].to_vec();
            let smallest = (0..cycle.len()).min_by_key(|i| &cycle[*i]).unwrap_or(0);
            cycle.rotate_left(smallest);
            match loops.iter_mut().find(|(c, _, _)| *c == cycle) {
                Some((_, _, caught)) if !caught.contains(&destination) => caught.push(destination),
                Some(_) => {}
                None => loops.push((cycle, path, vec![destination])),
            }
        }
    }
    for (_, path, caught) in loops {
        let path: Vec<&str> = path.iter().map(NodeName::as_str).collect();
        let also = match &caught[1..] {
            [] => String::new(),
            more => format!(" (also {})", more.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(", ")),
        };
        problems.push(format!("routing loop for destination {}{also}: {}", caught[0], path.join(" -> ")));
    }
    problems
}

/// The hops from `start` towards `destination`, when they come back to a node on the way
/// (the path, ending with the node met again).
fn follow(
    nodes: &std::collections::BTreeMap<&NodeName, (&Config, Routing)>,
    start: &NodeName,
    destination: &NodeName,
) -> Option<Vec<NodeName>> {
    let mut path = vec![start.clone()];
    let mut current = start.clone();
    while let Some((_, routing)) = nodes.get(&current) {
        match routing.next_hop(destination) {
            Ok(Hop::Via(next)) => {
                let again = path.contains(&next);
                path.push(next.clone());
                if again {
                    return Some(path);
                }
                current = next;
            }
            Ok(Hop::Local) | Err(_) => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routing(yaml: &str) -> Routing {
        let config = crate::config::from_value(&crate::config::parse_yaml(yaml).unwrap()).unwrap();
        Routing::new(&config).unwrap()
    }

    fn name(s: &str) -> NodeName {
        NodeName::new(s).unwrap()
    }

    fn config(yaml: &str) -> Config {
        crate::config::from_value(&crate::config::parse_yaml(yaml).unwrap()).unwrap()
    }

    #[test]
    fn a_cluster_check_finds_loops_and_one_sided_links() {
        let node = |name: &str, peers: &[&str], routes: &str| {
            let peers: Vec<String> = peers.iter().map(|p| format!("{{ name: {p} }}")).collect();
            config(&format!(
                "node: {{ name: {name} }}\nsecurity: {{ insecure_plaintext: true }}\npeers: [ {} ]\nroutes: [ {routes} ]",
                peers.join(", ")
            ))
        };
        let a = node("A", &["B", "C"], "{ to: 'X*', via: B }");
        let b = node("B", &["A", "C"], "{ to: 'X*', via: C }");
        let c = node("C", &["A", "B"], "{ to: 'X?', via: A }");
        assert_eq!(
            check_cluster(&[a.clone(), b.clone(), c.clone()]),
            ["routing loop for destination Xx: A -> B -> C -> A"]
        );
        let fixed = node("C", &["A", "B"], "{ to: 'Y*', via: A }");
        assert!(check_cluster(&[a.clone(), b.clone(), fixed]).is_empty());
        let one_sided = node("C", &["B"], "");
        assert_eq!(
            check_cluster(&[a.clone(), b, one_sided]),
            ["node A lists peer C, but C's configuration does not list A"]
        );
        assert_eq!(check_cluster(&[a.clone(), a]), ["node A has two configurations"]);
        // Loops that need a name both nodes' patterns match, or a longer one than the
        // pattern's own example (which is a neighbour here).
        let a = node("A", &["B", "C"], "{ to: '?1', via: B }, { to: 'B*', via: C }");
        let b = node("B", &["A"], "{ to: 'C?', via: A }");
        let c = node("C", &["A"], "{ to: 'B*', via: A }");
        assert_eq!(
            check_cluster(&[a, b, c]),
            [
                "routing loop for destination B1 (also Bx, Bxx): A -> C -> A",
                "routing loop for destination C1: A -> B -> A"
            ]
        );
    }

    #[test]
    fn neighbours_win_over_routes_and_routes_reach_the_rest() {
        let r = routing(
            "node: { name: A }\nsecurity: { insecure_plaintext: true }\n\
             peers: [ { name: B, address: 127.0.0.1:1 }, { name: C1, address: 127.0.0.1:2 } ]\n\
             routes: [ { to: 'C*', via: B }, { to: 'D?', via: C1 } ]",
        );
        assert_eq!(r.next_hop(&name("A")), Ok(Hop::Local));
        assert_eq!(r.next_hop(&name("C1")), Ok(Hop::Via(name("C1"))), "a neighbour, though C* matches");
        assert_eq!(r.next_hop(&name("C2")), Ok(Hop::Via(name("B"))));
        assert_eq!(r.next_hop(&name("D7")), Ok(Hop::Via(name("C1"))));
        assert_eq!(r.next_hop(&name("E")), Err("no route to node 'E'".into()));
        assert_eq!(r.explain(&name("C1"))[0], "C1: next hop C1 (a direct neighbour)");
        assert_eq!(r.explain(&name("C1"))[1], "  route 1 'C*' via B lost: direct neighbours win over routes");
        assert_eq!(r.explain(&name("C2")), ["C2: next hop B, by route 1 'C*' via B"]);
        assert_eq!(r.explain(&name("E")), ["E: no route: no route matches 'E' (2 routes)"]);
    }

    #[test]
    fn answers_are_kept_until_the_router_is_replaced_and_stay_bounded() {
        let yaml = |routes: &str| {
            format!(
                "node: {{ name: A }}\nsecurity: {{ insecure_plaintext: true }}\n\
                 peers: [ {{ name: B, address: 127.0.0.1:1 }}, {{ name: C, address: 127.0.0.1:2 }} ]\n\
                 routes: [ {routes} ]"
            )
        };
        let r = routing(&yaml("{ to: 'X*', via: B }"));
        // Asked twice: the second answer is the one kept, and says the same.
        for _ in 0..2 {
            assert_eq!(r.next_hop(&name("X1")), Ok(Hop::Via(name("B"))));
            assert_eq!(r.next_hop(&name("Y")), Err("no route to node 'Y'".into()));
        }
        r.replace(build_router(&config(&yaml("{ to: 'X*', via: C }, { to: 'Y', via: B }"))).unwrap());
        assert_eq!(r.next_hop(&name("X1")), Ok(Hop::Via(name("C"))), "the new router decides");
        assert_eq!(r.next_hop(&name("Y")), Ok(Hop::Via(name("B"))));
        for n in 0..DECIDED_MAX + 10 {
            assert_eq!(r.next_hop(&name(&format!("X{n}"))), Ok(Hop::Via(name("C"))));
        }
        let kept = r.decided.read().unwrap().len();
        assert!((1..=DECIDED_MAX).contains(&kept), "{kept} answers kept");
    }
}
