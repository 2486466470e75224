//! The plugin registry: built-in plugins register with `inventory` and are selected by name
//! from the `plugins` section of the YAML configuration.
//!
//! A registration is a [`PluginEntry`]: a name, a one-line summary, a `check` that validates
//! the plugin's own configuration section without side effects, and a `build` per kind that
//! makes the runtime instance. `inventory` registrations do not survive the linker unless the
//! binary references the plugin crate, so the host names every built-in crate explicitly and
//! a test asserts they are all present.
//!
//! A node sees its plugins through a [`Registry`] value: the built-in entries, plus the
//! plugins of the native libraries its configuration names (`library:`), each with its
//! origin, so `linkbus plugins` can say where every plugin came from.

use std::path::PathBuf;
use std::sync::Arc;

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

/// Where a plugin in a [`Registry`] comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Compiled into this binary.
    BuiltIn,
    /// A native plugin library loaded from `path` (canonical), whose bytes have `sha256`.
    Library {
        /// The library's canonical path.
        path: PathBuf,
        /// Its SHA-256, as hexadecimal text.
        sha256: String,
    },
    /// A module a plugin runs (a WebAssembly filter's), loaded from `path`.
    Module {
        /// The module file, as configured.
        path: PathBuf,
        /// Its SHA-256, as hexadecimal text.
        sha256: String,
    },
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::BuiltIn => f.write_str("built in"),
            Self::Library { path, sha256 } => write!(f, "library {} sha256 {sha256}", path.display()),
            Self::Module { path, sha256 } => write!(f, "module {} sha256 {sha256}", path.display()),
        }
    }
}

/// Checks a plugin's section (see [`PluginEntry::check`]).
pub type CheckFn = Arc<dyn Fn(&Section<'_>) + Send + Sync>;

/// Builds a runtime instance from a plugin's section (see [`BuildFn`]).
pub type Build<T> = Arc<dyn Fn(&ConfigValue, &BuildContext) -> Result<Box<T>, PluginError> + Send + Sync>;

/// The kind of extension point a [`Plugin`] serves, with its builder.
#[derive(Clone)]
pub enum Builder {
    /// A [`Transport`].
    Transport(Build<dyn Transport>),
    /// A [`Store`].
    Store(Build<dyn Store>),
    /// A [`Router`].
    Router(Build<dyn Router>),
    /// A [`Compressor`].
    Compressor(Build<dyn Compressor>),
    /// A [`Cipher`].
    Cipher(Build<dyn Cipher>),
    /// A [`MessageHandler`].
    Handler(Build<dyn MessageHandler>),
    /// A [`Filter`].
    Filter(Build<dyn Filter>),
}

impl Builder {
    /// The extension point's name as written in YAML.
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

impl From<Factory> for Builder {
    fn from(factory: Factory) -> Self {
        match factory {
            Factory::Transport(build) => Self::Transport(Arc::new(build)),
            Factory::Store(build) => Self::Store(Arc::new(build)),
            Factory::Router(build) => Self::Router(Arc::new(build)),
            Factory::Compressor(build) => Self::Compressor(Arc::new(build)),
            Factory::Cipher(build) => Self::Cipher(Arc::new(build)),
            Factory::Handler(build) => Self::Handler(Arc::new(build)),
            Factory::Filter(build) => Self::Filter(Arc::new(build)),
        }
    }
}

/// One plugin a node can select: built in, or from a native library.
#[derive(Clone)]
pub struct Plugin {
    /// The name YAML selects it by (`kind:`).
    pub name: String,
    /// Its version (a built-in plugin's is linkbus's own).
    pub version: String,
    /// One line for listings and error messages.
    pub summary: String,
    /// Where it comes from.
    pub origin: Origin,
    /// Validates its section, reporting into the section's diagnostics; opens nothing.
    pub check: CheckFn,
    /// The extension point and its builder.
    pub builder: Builder,
}

impl Plugin {
    /// The extension point it serves.
    pub fn kind(&self) -> &'static str {
        self.builder.kind()
    }

    /// The library it comes from, if any.
    pub fn library(&self) -> Option<&std::path::Path> {
        match &self.origin {
            Origin::Library { path, .. } => Some(path),
            Origin::BuiltIn | Origin::Module { .. } => None,
        }
    }
}

impl From<&'static PluginEntry> for Plugin {
    fn from(entry: &'static PluginEntry) -> Self {
        Self {
            name: entry.name.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            summary: entry.summary.to_owned(),
            origin: Origin::BuiltIn,
            check: Arc::new(entry.check),
            builder: entry.factory.into(),
        }
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("kind", &self.kind())
            .field("name", &self.name)
            .field("version", &self.version)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// The plugins a node can select: the built-in ones and those of the native libraries its
/// configuration loaded.
#[derive(Clone, Debug)]
pub struct Registry {
    plugins: Vec<Plugin>,
}

impl Registry {
    /// The built-in plugins, sorted by kind and name.
    pub fn built_in() -> Self {
        let mut plugins: Vec<Plugin> = self::plugins().map(Plugin::from).collect();
        plugins.sort_by(|a, b| (a.kind(), &a.name).cmp(&(b.kind(), &b.name)));
        Self { plugins }
    }

    /// Adds `plugin`; one of the same kind and name from the same origin is replaced.
    pub fn add(&mut self, plugin: Plugin) {
        self.plugins
            .retain(|p| (p.kind(), &p.name, &p.origin) != (plugin.kind(), &plugin.name, &plugin.origin));
        self.plugins.push(plugin);
    }

    /// The plugin named `name` for extension point `kind`: a built-in one, or with
    /// `library`, the one from the library loaded from that (canonical) path.
    pub fn find(&self, kind: &str, name: &str, library: Option<&std::path::Path>) -> Option<&Plugin> {
        self.plugins.iter().find(|p| p.kind() == kind && p.name == name && p.library() == library)
    }

    /// Names of built-in plugins for extension point `kind`, sorted, for error messages.
    pub fn names(&self, kind: &str) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .plugins
            .iter()
            .filter(|p| p.kind() == kind && p.origin == Origin::BuiltIn)
            .map(|p| p.name.as_str())
            .collect();
        names.sort_unstable();
        names
    }

    /// Every plugin: the built-in ones first, then those of libraries in loading order.
    pub fn iter(&self) -> impl Iterator<Item = &Plugin> {
        self.plugins.iter()
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self::built_in()
    }
}

impl PartialEq for Registry {
    fn eq(&self, other: &Self) -> bool {
        let key = |p: &Plugin| (p.kind(), p.name.clone(), p.origin.clone());
        self.plugins.iter().map(key).eq(other.plugins.iter().map(key))
    }
}
