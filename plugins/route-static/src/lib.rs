//! The `static` router plugin: a list of routes, each a destination [`Pattern`] and the
//! neighbour to send through, as written in the node's YAML (`routes:`) or given with
//! `--route PATTERN=VIA`.
//!
//! Direct neighbours win over routes (the host resolves them before it asks). Between
//! routes whose patterns match, the most specific wins: fewer wildcards first (`?` and `*`
//! count alike), then the longer literal prefix (the characters before the first
//! wildcard), then the one written first. So for `C12`, `C12` beats `C1?` and `C1*` (these
//! two rank by the order written), which beat `C*`, which beats `*`; and `C*` beats `C??`
//! (fewer wildcards).
//!
//! The host hands the plugin its section with the node's routes in it, as
//! `routes: [ { to: PATTERN, via: NEIGHBOUR } ]`.
#![forbid(unsafe_code)]

use std::cmp::Reverse;

use linkbus_plugin_api::registry::{BuildContext, Factory, PluginEntry, PluginError};
use linkbus_plugin_api::{
    ConfigValue, Explanation, NodeName, Pattern, RouteError, Router, Section, Topology,
};

/// One route: destinations matching `to` go through neighbour `via`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The destinations.
    pub to: Pattern,
    /// The neighbour they go through.
    pub via: NodeName,
}

/// See the crate doc.
#[derive(Debug, Clone, Default)]
pub struct StaticRouter {
    /// The routes in the order written.
    routes: Vec<Route>,
}

impl StaticRouter {
    /// A router over `routes`, in the order written.
    pub fn new(routes: Vec<Route>) -> Self {
        Self { routes }
    }

    /// The routes matching `destination`, best first, with their places in the list.
    fn candidates(&self, destination: &NodeName) -> Vec<(usize, &Route)> {
        let mut matching: Vec<(usize, &Route)> =
            self.routes.iter().enumerate().filter(|(_, r)| r.to.matches(destination)).collect();
        matching.sort_by_key(|(index, r)| (r.to.wildcards(), Reverse(r.to.literal_prefix()), *index));
        matching
    }
}

fn describe(index: usize, route: &Route) -> String {
    format!("route {} '{}' via {}", index + 1, route.to, route.via)
}

/// Why `loser` comes after `winner` (both match).
fn lost_because(winner: &Route, winner_index: usize, loser: &Route, loser_index: usize) -> String {
    let (w, l) = (&winner.to, &loser.to);
    if l.wildcards() != w.wildcards() {
        format!("more wildcards ({} against {})", l.wildcards(), w.wildcards())
    } else if l.literal_prefix() != w.literal_prefix() {
        format!("shorter literal prefix ({} against {} characters)", l.literal_prefix(), w.literal_prefix())
    } else {
        format!("written later (route {} against {})", loser_index + 1, winner_index + 1)
    }
}

impl Router for StaticRouter {
    fn next_hop(&self, destination: &NodeName, _topology: &Topology<'_>) -> Result<NodeName, RouteError> {
        self.candidates(destination)
            .first()
            .map(|(_, r)| r.via.clone())
            .ok_or_else(|| RouteError::NoRoute(destination.clone()))
    }

    fn explain(&self, destination: &NodeName, _topology: &Topology<'_>) -> Explanation {
        let candidates = self.candidates(destination);
        let Some(&(best_index, best)) = candidates.first() else {
            return Explanation {
                next_hop: Err(RouteError::NoRoute(destination.clone())),
                chosen: format!("no route matches '{destination}' ({} routes)", self.routes.len()),
                others: Vec::new(),
            };
        };
        let others = candidates
            .iter()
            .skip(1)
            .map(|&(index, route)| {
                format!("{} lost: {}", describe(index, route), lost_because(best, best_index, route, index))
            })
            .collect();
        Explanation { next_hop: Ok(best.via.clone()), chosen: describe(best_index, best), others }
    }

    fn patterns(&self) -> Vec<Pattern> {
        self.routes.iter().map(|r| r.to.clone()).collect()
    }
}

/// Reads `routes: [ { to, via } ]` from the section the host hands over.
fn routes_of(config: &ConfigValue) -> Result<Vec<Route>, String> {
    let ConfigValue::Map(entries) = config else { return Ok(Vec::new()) };
    let Some((_, ConfigValue::Seq(items))) = entries.iter().find(|(k, _)| k == "routes") else {
        return Ok(Vec::new());
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let field = |key: &str| match item {
                ConfigValue::Map(fields) => fields.iter().find_map(|(k, v)| match v {
                    ConfigValue::Str(s) if k == key => Some(s.clone()),
                    _ => None,
                }),
                _ => None,
            };
            let to = field("to").ok_or_else(|| format!("routes[{i}]: no 'to'"))?;
            let via = field("via").ok_or_else(|| format!("routes[{i}]: no 'via'"))?;
            Ok(Route {
                to: Pattern::new(&to).map_err(|e| format!("routes[{i}].to: {e}"))?,
                via: NodeName::new(&via).map_err(|e| format!("routes[{i}].via: {e}"))?,
            })
        })
        .collect()
}

fn check(_section: &Section<'_>) {}

fn build(config: &ConfigValue, _ctx: &BuildContext) -> Result<Box<dyn Router>, PluginError> {
    let routes = routes_of(config).map_err(|reason| PluginError { plugin: "static".into(), reason })?;
    Ok(Box::new(StaticRouter::new(routes)))
}

inventory::submit! {
    PluginEntry {
        name: "static",
        summary: "static routes: destination patterns with '?' and a final '*', each through a neighbour",
        check,
        factory: Factory::Router(build),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(routes: &[(&str, &str)]) -> StaticRouter {
        StaticRouter::new(
            routes
                .iter()
                .map(|(to, via)| Route { to: Pattern::new(to).unwrap(), via: NodeName::new(via).unwrap() })
                .collect(),
        )
    }

    fn hop(r: &StaticRouter, to: &str) -> Result<String, RouteError> {
        let local = NodeName::new("A").unwrap();
        let topology = Topology { local: &local, neighbours: &[] };
        r.next_hop(&NodeName::new(to).unwrap(), &topology).map(|n| n.to_string())
    }

    #[test]
    fn the_most_specific_route_wins_then_the_first_written() {
        let r =
            router(&[("*", "D"), ("C*", "B1"), ("C1?", "B2"), ("C12", "B3"), ("C1*", "B4"), ("C*", "B5")]);
        assert_eq!(hop(&r, "C12").unwrap(), "B3", "no wildcard");
        assert_eq!(hop(&r, "C13").unwrap(), "B2", "one wildcard, longest prefix, C1? written before C1*");
        assert_eq!(hop(&r, "C1").unwrap(), "B4", "C1? needs a third character");
        assert_eq!(hop(&r, "C7").unwrap(), "B1", "C* written before the other C*");
        assert_eq!(hop(&r, "Z").unwrap(), "D", "the default route");
        let none = router(&[("C*", "B")]);
        assert_eq!(hop(&none, "D1"), Err(RouteError::NoRoute(NodeName::new("D1").unwrap())));
    }

    #[test]
    fn explain_names_the_winner_and_why_each_other_lost() {
        let r = router(&[("*", "D"), ("C1*", "B"), ("C*", "E"), ("C1*", "F")]);
        let local = NodeName::new("A").unwrap();
        let topology = Topology { local: &local, neighbours: &[] };
        let e = r.explain(&NodeName::new("C12").unwrap(), &topology);
        assert_eq!(e.next_hop, Ok(NodeName::new("B").unwrap()));
        assert_eq!(e.chosen, "route 2 'C1*' via B");
        assert_eq!(
            e.others,
            [
                "route 4 'C1*' via F lost: written later (route 4 against 2)",
                "route 3 'C*' via E lost: shorter literal prefix (1 against 2 characters)",
                "route 1 '*' via D lost: shorter literal prefix (0 against 2 characters)",
            ]
        );
    }

    #[test]
    fn routes_come_from_the_section_the_host_hands_over() {
        let item = |to: &str, via: &str| {
            ConfigValue::Map(vec![
                ("to".into(), ConfigValue::Str(to.into())),
                ("via".into(), ConfigValue::Str(via.into())),
            ])
        };
        let section = ConfigValue::Map(vec![
            ("kind".into(), ConfigValue::Str("static".into())),
            ("routes".into(), ConfigValue::Seq(vec![item("C*", "B"), item("D?", "E")])),
        ]);
        let routes = routes_of(&section).unwrap();
        assert_eq!(routes.len(), 2);
        assert_eq!((routes[1].to.as_str(), routes[1].via.as_str()), ("D?", "E"));
        let bad = ConfigValue::Map(vec![("routes".into(), ConfigValue::Seq(vec![item("C*1", "B")]))]);
        assert!(routes_of(&bad).unwrap_err().contains("routes[0].to"));
    }
}
