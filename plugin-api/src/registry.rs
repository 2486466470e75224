//! The plugin registry: built-in plugins register with `inventory` and are selected by name
//! from the `plugins` section of the YAML configuration.
//!
//! A registration is a [`PluginEntry`]: a name, a one-line summary, a `check` that validates
//! the plugin's own configuration section without side effects, and a `build` per kind that
//! makes the runtime instance. `inventory` registrations do not survive the linker unless the
//! binary references the plugin crate, so the host names every built-in crate explicitly and
//! a test asserts they are all present.

use std::path::PathBuf;

use crate::cipher::Cipher;
use crate::compressor::Compressor;
use crate::config::{ConfigValue, Section};
use crate::filter::Filter;
use crate::handler::MessageHandler;
use crate::name::NodeName;
use crate::router::Router;
use crate::store::Store;
use crate::transport::Transport;

/// What a plugin's `build` may need from the node.
#[derive(Debug, Clone)]
pub struct BuildContext {
    /// The node the plugin runs in.
    pub node: NodeName,
    /// The node's data directory (stores keep their files under it unless told otherwise).
    pub data_dir: PathBuf,
}

/// Why a plugin could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugin '{plugin}': {reason}")]
pub struct PluginError {
    /// The plugin's registered name.
    pub plugin: String,
    /// What went wrong.
    pub reason: String,
}

/// Builds a runtime instance from the plugin's (already checked) configuration section.
pub type BuildFn<T> = fn(&ConfigValue, &BuildContext) -> Result<Box<T>, PluginError>;

/// The kind of extension point a plugin serves, with its builder.
#[derive(Clone, Copy)]
pub enum Factory {
    /// A [`Transport`].
    Transport(BuildFn<dyn Transport>),
    /// A [`Store`].
    Store(BuildFn<dyn Store>),
    /// A [`Router`].
    Router(BuildFn<dyn Router>),
    /// A [`Compressor`].
    Compressor(BuildFn<dyn Compressor>),
    /// A [`Cipher`].
    Cipher(BuildFn<dyn Cipher>),
    /// A [`MessageHandler`].
    Handler(BuildFn<dyn MessageHandler>),
    /// A [`Filter`] (`plugins.filters`: its section holds the plugin's own keys only; the
    /// node reads the hooks, patterns and policies).
    Filter(BuildFn<dyn Filter>),
}

impl Factory {
    /// The extension point's name as written in YAML (`transport`, `store`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Transport(_) => "transport",
            Self::Store(_) => "store",
            Self::Router(_) => "router",
            Self::Compressor(_) => "compressor",
            Self::Cipher(_) => "cipher",
            Self::Handler(_) => "handler",
            Self::Filter(_) => "filter",
        }
    }
}

impl std::fmt::Debug for Factory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind())
    }
}

/// One built-in plugin, submitted with `inventory::submit!`.
#[derive(Debug)]
pub struct PluginEntry {
    /// The name YAML selects it by (`kind: tcp`).
    pub name: &'static str,
    /// One line for `linkbus plugin list` and error messages.
    pub summary: &'static str,
    /// Validates the plugin's section (keys other than `kind`), reporting into the section's
    /// diagnostics; opens nothing.
    pub check: fn(&Section<'_>),
    /// The extension point and its builder.
    pub factory: Factory,
}

inventory::collect!(PluginEntry);

/// Every registered built-in plugin, in no particular order.
pub fn plugins() -> impl Iterator<Item = &'static PluginEntry> {
    inventory::iter::<PluginEntry>.into_iter()
}

/// The plugin registered as `name` for extension point `kind`.
pub fn find(kind: &str, name: &str) -> Option<&'static PluginEntry> {
    plugins().find(|p| p.factory.kind() == kind && p.name == name)
}

/// Names registered for extension point `kind`, sorted, for error messages.
pub fn names(kind: &str) -> Vec<&'static str> {
    let mut names: Vec<_> = plugins().filter(|p| p.factory.kind() == kind).map(|p| p.name).collect();
    names.sort_unstable();
    names
}
