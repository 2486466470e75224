//! `plugins.filters:` — user filters, in the order they run. The node reads each entry's
//! name, hooks, patterns and policies; the filter plugin (`kind`, `wasm` unless named) reads
//! the rest (the module, its limits, its configuration) from the same mapping.

use linkbus_plugin_api::registry;
use linkbus_plugin_api::{AddressPattern, ConfigValue, Hook, Section};

/// The filter plugin an entry without `kind:` uses.
pub const FILTER_KIND_DEFAULT: &str = "wasm";

/// The keys of a filter entry only the node reads (the plugin gets the others, and `name`).
const NODE_KEYS: [&str; 5] = ["kind", "hooks", "to", "on_failure", "drops"];

/// What happens to the messages of a call that failed (a trap, a limit reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// They go on as they were.
    FailOpen,
    /// They do not go on: a put is refused; what arrived on a link is removed, and its
    /// origin hears `filter_dropped`.
    FailClosed,
    /// A put is refused; what arrived on a link goes to the dead-letter queue
    /// (`stage_failed`), to be replayed once the filter is fixed.
    DeadLetter,
}

impl FailurePolicy {
    /// The policy as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailOpen => "fail_open",
            Self::FailClosed => "fail_closed",
            Self::DeadLetter => "dead_letter",
        }
    }
}

/// Where the messages a filter drops go, when they arrived on a link (a put is refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropPolicy {
    /// Into the dead-letter queue (`filter_rejected`).
    DeadLetter,
    /// Nowhere: they are counted, and their origin hears `filter_dropped`.
    Discard,
}

/// One entry of `plugins.filters`.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterChoice {
    /// Its name, unique on the node (in `status`, logs, refusals and dead letters).
    pub name: String,
    /// The filter plugin (`wasm`).
    pub kind: String,
    /// The hooks it runs at, in the order written.
    pub hooks: Vec<Hook>,
    /// The recipients it applies to (a message with any recipient matching one); empty:
    /// every message.
    pub to: Vec<AddressPattern>,
    /// What happens to the messages of a call that failed.
    pub on_failure: FailurePolicy,
    /// Where dropped messages go.
    pub drops: DropPolicy,
    /// The native plugin library it comes from (`library:`), if not built in.
    pub library: Option<super::LibraryChoice>,
    /// The plugin's own keys (without the node's), handed to its `build`.
    pub section: ConfigValue,
}

impl FilterChoice {
    /// Whether it runs at `hook`.
    pub fn runs_at(&self, hook: Hook) -> bool {
        self.hooks.contains(&hook)
    }

    /// The canonical path of the library its plugin comes from, once loaded.
    pub fn library_path(&self) -> Option<&std::path::Path> {
        self.library.as_ref().and_then(|l| l.loaded.as_deref())
    }
}

/// Reads `plugins.filters`, each entry checked by its plugin too; names unique.
pub(super) fn read_filters(plugins: &Section<'_>) -> Vec<FilterChoice> {
    let diag = plugins.diagnostics();
    let mut filters: Vec<FilterChoice> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (path, value) in plugins.list("filters") {
        let Some(section) = Section::new(diag, path, value) else { continue };
        // Names are compared as written, those of entries with other errors too.
        if let Some(ConfigValue::Str(name)) = section.get("name") {
            if names.contains(name) {
                section.error("name", format!("filter '{name}' is named twice; names must be unique"));
            }
            names.push(name.clone());
        }
        let filter = read_filter(&section, value);
        // A native plugin's keys are its own check's to judge, once its library is loaded.
        if filter.as_ref().is_none_or(|f| f.library.is_none()) {
            section.finish();
        }
        filters.extend(filter);
    }
    filters
}

fn read_filter(section: &Section<'_>, value: &ConfigValue) -> Option<FilterChoice> {
    let name = section.required("name", Section::string);
    if let Some(name) = &name
        && (name.is_empty() || name.len() > 64 || name.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        section.error("name", "give 1 to 64 characters without spaces");
    }
    let kind = section.string("kind").unwrap_or_else(|| FILTER_KIND_DEFAULT.to_owned());
    let library = super::native::read_library(section, "filter");
    let entry = if library.is_some() { None } else { registry::find("filter", &kind) };
    if entry.is_none() && library.is_none() && section.get("library").is_none() {
        let known = registry::names("filter");
        let known = if known.is_empty() { "none in this build".to_owned() } else { known.join(", ") };
        section.error("kind", format!("no filter plugin named '{kind}'; available: {known}"));
    }
    let hooks = read_hooks(section);
    let to = section.get("to").is_some().then(|| section.address_patterns("to")).flatten();
    let on_failure = match section.string("on_failure").as_deref() {
        None | Some("dead_letter") => Some(FailurePolicy::DeadLetter),
        Some("fail_open") => Some(FailurePolicy::FailOpen),
        Some("fail_closed") => Some(FailurePolicy::FailClosed),
        Some(other) => {
            section.error("on_failure", format!("'{other}'; expected fail_open, fail_closed or dead_letter"));
            None
        }
    };
    let drops = match section.string("drops").as_deref() {
        None | Some("dead_letter") => Some(DropPolicy::DeadLetter),
        Some("discard") => Some(DropPolicy::Discard),
        Some(other) => {
            section.error("drops", format!("'{other}'; expected dead_letter or discard"));
            None
        }
    };
    if let Some(entry) = entry {
        (entry.check)(section);
    }
    Some(FilterChoice {
        name: name?,
        kind,
        hooks: hooks?,
        to: to.unwrap_or_default(),
        on_failure: on_failure?,
        drops: drops?,
        library,
        section: plugin_keys(value),
    })
}

/// `hooks:`: one or more hook names, none twice.
fn read_hooks(section: &Section<'_>) -> Option<Vec<Hook>> {
    let names = match section.required("hooks", |s, k| s.get(k))? {
        ConfigValue::Str(one) => vec![one.clone()],
        ConfigValue::Seq(items) => items
            .iter()
            .map(|item| match item {
                ConfigValue::Str(s) => Some(s.clone()),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    let hooks: Vec<Hook> = names.iter().filter_map(|n| Hook::parse(n)).collect();
    let valid = !names.is_empty() && hooks.len() == names.len();
    let unique = hooks.iter().enumerate().all(|(i, h)| !hooks[..i].contains(h));
    if !valid || !unique {
        section.error(
            "hooks",
            format!(
                "{names:?}: expected one or more of on_send, on_route, on_forward, on_deliver, each once"
            ),
        );
        return None;
    }
    Some(hooks)
}

/// The entry without the keys the node reads.
fn plugin_keys(value: &ConfigValue) -> ConfigValue {
    match value {
        ConfigValue::Map(entries) => ConfigValue::Map(
            entries.iter().filter(|(k, _)| !NODE_KEYS.contains(&k.as_str())).cloned().collect(),
        ),
        _ => ConfigValue::Map(Vec::new()),
    }
}
