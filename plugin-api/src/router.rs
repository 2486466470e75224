//! The `Router` extension point: which neighbour a message to a distant node goes through.
//!
//! Routers are pure functions of the destination and the node's topology: they do no I/O and
//! keep no per-message state, so they can be swapped or reloaded at any time.
//!
//! Routes name destinations by [`Pattern`]: node-name characters compared as they are, `?`
//! for any one character, and a final `*` for any rest (also none).

use std::fmt;

use crate::name::{Address, NODE_NAME_CHARS_MAX, NodeName};

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

/// A routing decision with its reasons, for people (`linkbus route explain`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// The neighbour chosen, or why there is none.
    pub next_hop: Result<NodeName, RouteError>,
    /// What decided it (the rule that matched), in words.
    pub chosen: String,
    /// Each other candidate and why it lost, in words.
    pub others: Vec<String>,
}

/// Chooses the next hop for a destination node that is not this node.
pub trait Router: Send + Sync {
    /// The neighbour to send through. Direct neighbours are resolved by the host before
    /// the router is asked.
    ///
    /// # Errors
    /// [`RouteError::NoRoute`] when nothing reaches `destination`.
    fn next_hop(&self, destination: &NodeName, topology: &Topology<'_>) -> Result<NodeName, RouteError>;

    /// The decision for `destination` with its reasons. The default says only what
    /// [`Router::next_hop`] decided.
    fn explain(&self, destination: &NodeName, topology: &Topology<'_>) -> Explanation {
        let next_hop = self.next_hop(destination, topology);
        let chosen = match &next_hop {
            Ok(via) => format!("the router sends it through {via}"),
            Err(e) => e.to_string(),
        };
        Explanation { next_hop, chosen, others: Vec::new() }
    }

    /// Patterns of the destinations this router has routes for (a cluster check tries a
    /// name matching each, so loops are found also for nodes no configuration names).
    fn patterns(&self) -> Vec<Pattern> {
        Vec::new()
    }
}

/// A destination pattern; see the module doc.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Pattern(String);

impl Pattern {
    /// Checks `text` and wraps it.
    ///
    /// # Errors
    /// What is wrong with it, in words.
    pub fn new(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("a route pattern is empty".into());
        }
        let body = text.strip_suffix('*').unwrap_or(text);
        if body.contains('*') {
            return Err(format!("route pattern '{text}': '*' may only end a pattern"));
        }
        if let Some(ch) = body.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '?')))
        {
            return Err(format!(
                "route pattern '{text}' contains '{ch}'; allowed are letters, digits, '.', '_', '?' and a final '*'"
            ));
        }
        if body.chars().next().is_some_and(|c| !(c.is_ascii_alphabetic() || c == '?')) {
            return Err(format!("route pattern '{text}' must start with a letter (node names do)"));
        }
        if body.chars().count() > NODE_NAME_CHARS_MAX {
            return Err(format!(
                "route pattern '{text}' is longer than a node name ({NODE_NAME_CHARS_MAX} characters) can be"
            ));
        }
        Ok(Self(text.to_owned()))
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `name` matches.
    pub fn matches(&self, name: &NodeName) -> bool {
        let (body, open) = match self.0.strip_suffix('*') {
            Some(body) => (body, true),
            None => (self.0.as_str(), false),
        };
        let name = name.as_str();
        let fits = if open { name.len() >= body.len() } else { name.len() == body.len() };
        fits && body.bytes().zip(name.bytes()).all(|(p, n)| p == b'?' || p == n)
    }

    /// How many wildcards (`?` and `*`) it has: fewer is more specific.
    pub fn wildcards(&self) -> usize {
        self.0.chars().filter(|c| matches!(c, '?' | '*')).count()
    }

    /// How many characters come before its first wildcard: more is more specific.
    pub fn literal_prefix(&self) -> usize {
        self.0.find(['?', '*']).unwrap_or(self.0.len())
    }

    /// A node name it matches, if one exists (`?` as `x`, `*` as nothing, or `x` when
    /// nothing would be left).
    pub fn example(&self) -> Option<NodeName> {
        let body: String =
            self.0.trim_end_matches('*').chars().map(|c| if c == '?' { 'x' } else { c }).collect();
        let name = if body.is_empty() { "x".to_owned() } else { body };
        NodeName::new(&name).ok().filter(|n| self.matches(n))
    }

    /// Names it matches, for checks that try them: its [`Pattern::example`], and for an
    /// open pattern one and two characters longer.
    pub fn examples(&self) -> Vec<NodeName> {
        let mut names: Vec<NodeName> = self.example().into_iter().collect();
        if self.0.ends_with('*') {
            let body: String =
                self.0.trim_end_matches('*').chars().map(|c| if c == '?' { 'x' } else { c }).collect();
            for more in ["x", "xx"] {
                names.extend(NodeName::new(&format!("{body}{more}")).ok().filter(|n| self.matches(n)));
            }
        }
        names
    }

    /// A node name both `self` and `other` match, if there is one.
    pub fn common_example(&self, other: &Pattern) -> Option<NodeName> {
        let split = |p: &Pattern| match p.0.strip_suffix('*') {
            Some(body) => (body.as_bytes().to_vec(), true),
            None => (p.0.as_bytes().to_vec(), false),
        };
        let ((a, a_open), (b, b_open)) = (split(self), split(other));
        let len = match (a_open, b_open) {
            (false, false) if a.len() == b.len() => a.len(),
            (false, true) if a.len() >= b.len() => a.len(),
            (true, false) if b.len() >= a.len() => b.len(),
            (true, true) => a.len().max(b.len()).max(1),
            _ => return None,
        };
        let mut name = String::with_capacity(len);
        for i in 0..len {
            let (x, y) = (a.get(i).copied().unwrap_or(b'?'), b.get(i).copied().unwrap_or(b'?'));
            name.push(char::from(match (x, y) {
                (b'?', b'?') => b'x',
                (b'?', c) | (c, b'?') => c,
                (c, d) if c == d => c,
                _ => return None,
            }));
        }
        NodeName::new(&name).ok().filter(|n| self.matches(n) && other.matches(n))
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A pattern of recipient addresses, `NODE[:QUEUE]`: each part matches as a [`Pattern`]
/// does (`?` any one character, a final `*` any rest), and a missing queue part matches every
/// queue (`B` is `B:*`). Codecs choose by it what they apply to which destinations
/// (`B:orders*`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AddressPattern {
    node: Pattern,
    queue: String,
}

impl AddressPattern {
    /// Checks `text` and wraps it.
    ///
    /// # Errors
    /// What is wrong with it, in words.
    pub fn new(text: &str) -> Result<Self, String> {
        let (node, queue) = text.split_once(':').unwrap_or((text, "*"));
        let node = Pattern::new(node).map_err(|e| format!("address pattern '{text}': {e}"))?;
        if queue.is_empty() {
            return Err(format!("address pattern '{text}': the queue part after ':' is empty"));
        }
        let body = queue.strip_suffix('*').unwrap_or(queue);
        if body.contains('*') {
            return Err(format!("address pattern '{text}': '*' may only end the queue part"));
        }
        if let Some(ch) =
            body.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '?')))
        {
            return Err(format!(
                "address pattern '{text}' contains '{ch}'; a queue part allows letters, digits, '.', '_', '-', \
                 '?' and a final '*'"
            ));
        }
        Ok(Self { node, queue: queue.to_owned() })
    }

    /// Whether `address` matches.
    pub fn matches(&self, address: &Address) -> bool {
        if !self.node.matches(&address.node) {
            return false;
        }
        let (body, open) = match self.queue.strip_suffix('*') {
            Some(body) => (body, true),
            None => (self.queue.as_str(), false),
        };
        let queue = address.queue.as_str();
        let fits = if open { queue.len() >= body.len() } else { queue.len() == body.len() };
        fits && body.bytes().zip(queue.bytes()).all(|(p, q)| p == b'?' || p == q)
    }
}

impl fmt::Display for AddressPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.node, self.queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> NodeName {
        NodeName::new(s).unwrap()
    }

    #[test]
    fn patterns_match_by_their_wildcards() {
        let p = |s: &str| Pattern::new(s).unwrap();
        assert!(p("C1").matches(&name("C1")) && !p("C1").matches(&name("C12")));
        assert!(
            p("C*").matches(&name("C")) && p("C*").matches(&name("C12")) && !p("C*").matches(&name("D1"))
        );
        assert!(
            p("C?").matches(&name("C1")) && !p("C?").matches(&name("C")) && !p("C?").matches(&name("C12"))
        );
        assert!(
            p("?1*").matches(&name("A1")) && p("?1*").matches(&name("B12")) && !p("?1*").matches(&name("B2"))
        );
        assert!(p("*").matches(&name("anything")));
        assert_eq!((p("C?*").wildcards(), p("C?*").literal_prefix()), (2, 1));
        assert_eq!((p("EAST1").wildcards(), p("EAST1").literal_prefix()), (0, 5));
        assert_eq!(p("C?*").example(), Some(name("Cx")));
        assert_eq!(p("*").example(), Some(name("x")));
        assert_eq!(p("B*").examples(), [name("B"), name("Bx"), name("Bxx")]);
        assert_eq!(p("?1").common_example(&p("C?")), Some(name("C1")));
        assert_eq!(p("C*").common_example(&p("?12")), Some(name("C12")));
        assert_eq!(p("C*").common_example(&p("D*")), None);
        assert_eq!(p("C1").common_example(&p("C?2")), None);
    }

    #[test]
    fn address_patterns_match_node_and_queue() {
        let p = |s: &str| AddressPattern::new(s).unwrap();
        let a = |s: &str| s.parse::<Address>().unwrap();
        assert!(p("B:orders*").matches(&a("B:orders")) && p("B:orders*").matches(&a("B:orders.eu")));
        assert!(!p("B:orders*").matches(&a("B:audit")) && !p("B:orders*").matches(&a("C:orders")));
        assert!(
            p("B").matches(&a("B:anything")) && p("*").matches(&a("Z:q")) && p("?:q?").matches(&a("C:q1"))
        );
        assert_eq!(p("B").to_string(), "B:*");
        for (text, says) in
            [("B:", "empty"), ("B:q*x", "may only end"), ("B:q/x", "contains '/'"), ("1:q", "letter")]
        {
            let error = AddressPattern::new(text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
    }

    #[test]
    fn bad_patterns_are_explained() {
        for (text, says) in [
            ("", "empty"),
            ("C*1", "may only end"),
            ("C-1", "contains '-'"),
            ("1C", "must start with a letter"),
            ("ABCDEFGHIJKLMNOPQRSTU", "longer than a node name"),
        ] {
            let error = Pattern::new(text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
    }
}
