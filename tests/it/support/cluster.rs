//! Clusters of more than two nodes for routing tests: each node listens on its own fixed
//! loopback port, links are Noise links between the pairs named (the first of a pair dials
//! the second), and each node's configuration gets its own extra YAML (routes, queues).

use std::collections::BTreeMap;
use std::time::Duration;

use super::{NodeProcess, Scratch, free_port};

/// The configuration files of a cluster, by node name.
pub struct Cluster {
    /// Path of each node's configuration.
    pub configs: BTreeMap<String, String>,
    /// Each node's link address.
    pub addresses: BTreeMap<String, String>,
}

impl Cluster {
    /// Writes the configurations: `links` as (dialer, listener) pairs, `extra` YAML per
    /// node (top-level keys; nodes without an entry get none).
    pub fn write(s: &Scratch, links: &[(&str, &str)], extra: &[(&str, &str)]) -> Self {
        let mut names: Vec<&str> = links.iter().flat_map(|(a, b)| [*a, *b]).collect();
        names.sort_unstable();
        names.dedup();
        let keys: BTreeMap<&str, String> = names.iter().map(|n| (*n, s.keys(n))).collect();
        let addresses: BTreeMap<String, String> =
            names.iter().map(|n| ((*n).to_owned(), format!("127.0.0.1:{}", free_port()))).collect();
        let mut configs = BTreeMap::new();
        for name in &names {
            let mut peers = Vec::new();
            for (a, b) in links {
                let (other, dials) = match (*a == *name, *b == *name) {
                    (true, _) => (*b, true),
                    (_, true) => (*a, false),
                    _ => continue,
                };
                let address =
                    if dials { format!(", address: '{}'", addresses[other]) } else { String::new() };
                peers.push(format!("{{ name: {other}, public_key: '{}'{address} }}", keys[other]));
            }
            let extra = extra.iter().find(|(n, _)| n == name).map_or("", |(_, e)| e);
            // Fast reconnects, unless the node's extra YAML sets its own links.
            let links = if extra.contains("links:") {
                ""
            } else {
                "links: { reconnect_backoff_min_ms: 20, reconnect_backoff_max_ms: 200 }\n"
            };
            let yaml = format!(
                "node: {{ name: {name}, listen: '{}' }}\npeers: [ {} ]\n{}\n{links}{extra}\n",
                addresses[*name],
                peers.join(", "),
                s.security_yaml(name)
            );
            let path = s.write(&format!("{}.yaml", name.to_lowercase()), &yaml);
            configs.insert((*name).to_owned(), path.to_str().expect("utf-8 path").to_owned());
        }
        Self { configs, addresses }
    }

    /// Writes the configurations ([`Cluster::write`]) and starts every node
    /// ([`Cluster::start_all`]).
    pub fn up(
        s: &Scratch,
        links: &[(&str, &str)],
        extra: &[(&str, &str)],
    ) -> (Self, BTreeMap<String, NodeProcess>) {
        let cluster = Self::write(s, links, extra);
        let nodes = cluster.start_all(s, links);
        (cluster, nodes)
    }

    /// Starts node `name`.
    pub fn start(&self, s: &Scratch, name: &str) -> NodeProcess {
        s.start_node(name, &["-c", &self.configs[name]])
    }

    /// Starts node `name` with extra environment variables.
    pub fn start_env(&self, s: &Scratch, name: &str, env: &[(&str, &str)]) -> NodeProcess {
        s.start_node_env(name, &["-c", &self.configs[name]], env)
    }

    /// Starts every node, and waits until each has as many links up as `links` gives it.
    pub fn start_all(&self, s: &Scratch, links: &[(&str, &str)]) -> BTreeMap<String, NodeProcess> {
        let nodes: BTreeMap<String, NodeProcess> =
            self.configs.keys().map(|name| (name.clone(), self.start(s, name))).collect();
        for (name, node) in &nodes {
            let count = links.iter().filter(|(a, b)| a == name || b == name).count();
            node.wait_for_log("Link up.", count, Duration::from_secs(20));
        }
        nodes
    }
}
