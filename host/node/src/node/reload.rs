//! Reloading the configuration: routes, router and filters are taken up; other changes are
//! named as needing a restart.

use super::NodeState;
use crate::flow::{Refusal, RefusalCode};

/// Where a node's configuration came from: a file (or none) and command-line overrides.
#[derive(Debug, Clone)]
pub struct ReloadSource {
    /// The configuration file.
    pub path: Option<std::path::PathBuf>,
    /// The command-line overrides, applied again on every reload.
    pub overrides: crate::config::Overrides,
}

impl NodeState {
    /// Reads the configuration again (file and overrides) and takes up its routes and
    /// router; returns what changed. Everything else is left as it is: changes elsewhere
    /// are named as needing a restart.
    ///
    /// # Errors
    /// The node was not started from a configuration source, the new configuration is
    /// invalid (every problem, with its path), names another node, or routes through a
    /// node that is not a peer of the running node. The running configuration stays.
    pub fn reload(&self) -> Result<String, Refusal> {
        self.reload_text().map_err(|reason| Refusal::new(RefusalCode::Invalid, reason))
    }

    fn reload_text(&self) -> Result<String, String> {
        let source = self.reload_source.get().ok_or_else(|| {
            "this node was not started by `linkbus node run`; it has no configuration to read again"
                .to_owned()
        })?;
        // One reload at a time, so the file read last is the one applied.
        let _one = self.reloading.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let new = crate::config::load_file(source.path.as_deref(), &source.overrides)
            .map_err(|e| format!("the new configuration is refused (the running one stays):\n{e}"))?;
        if new.node.name != self.config.node.name {
            return Err(format!(
                "the new configuration is for node '{}', not '{}'; the running one stays",
                new.node.name,
                self.name()
            ));
        }
        if let Some(route) = new.routes.iter().find(|r| !self.links.contains_key(&r.via)) {
            return Err(format!(
                "route '{}' goes through '{}', which is not a peer of the running node (new peers need a restart); the running configuration stays",
                route.to, route.via
            ));
        }
        let router = crate::routing::build_router(&new)
            .map_err(|e| format!("{e}; the running configuration stays"))?;
        // Filters first: a module that does not load leaves everything as it runs.
        let filters = self
            .filters
            .reload(&new.plugins.filters, &new.plugins.registry)
            .map_err(|e| format!("{e}; the running filters and routes stay"))?;
        self.routing.replace(router);
        let mut text =
            format!("routes reloaded: {} route(s), router '{}'\n", new.routes.len(), new.plugins.router.kind);
        if let Some(filters) = filters {
            text.push_str(&filters);
            text.push('\n');
        }
        let old = &self.config;
        let restart: Vec<&str> = [
            ("node", new.node != old.node),
            ("peers", new.peers != old.peers),
            ("queues", new.queues != old.queues),
            ("messages", new.messages != old.messages),
            ("links", new.links != old.links),
            ("security", new.security != old.security),
            ("events", new.events != old.events),
            ("plugins.transport", new.plugins.transport != old.plugins.transport),
            ("plugins.store", new.plugins.store != old.plugins.store),
            ("plugins.stages", new.plugins.stages != old.plugins.stages),
        ]
        .into_iter()
        .filter_map(|(section, changed)| changed.then_some(section))
        .collect();
        if !restart.is_empty() {
            text.push_str(&format!(
                "changed, but taken up only at the next restart: {}\n",
                restart.join(", ")
            ));
        }
        tracing::info!(routes = new.routes.len(), "Routes reloaded.");
        Ok(text)
    }
}
