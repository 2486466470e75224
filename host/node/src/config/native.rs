//! Native plugin libraries named in the configuration: `library:` (and an optional
//! `sha256:` pin) in a plugin's section selects the plugin `kind:` from that library.
//!
//! Reading the configuration only records them ([`read_library`]); loading is a step of its
//! own, [`Config::load_libraries`], which [`super::load_file`] and a node's start take. It
//! maps each library once per process (see `linkbus_native::loader`), adds its plugins to the
//! configuration's registry, and runs the plugin's own check of its section, whose problems
//! come back with their YAML paths like the node's own.

use std::fmt::Write;

use linkbus_plugin_api::{ConfigErrors, Diagnostics, Origin, Registry, Section};

use super::{Config, LibraryChoice, PluginChoice};

/// The extension points a native library can serve (native plugin ABI 1); `stage` is an
/// entry of `plugins.stages`, a compressor or a cipher; `filter` one of `plugins.filters`.
pub(super) const NATIVE_POINTS: [&str; 3] = ["store", "stage", "filter"];

/// The extension points a stage may serve.
const STAGE_POINTS: [&str; 2] = ["compressor", "cipher"];

/// `library:` and `sha256:` of a plugin section at extension point `point`, when it names a
/// library.
pub(super) fn read_library(section: &Section<'_>, point: &str) -> Option<LibraryChoice> {
    if section.get("library").is_none() {
        // A WebAssembly filter's `sha256` pins its module: that plugin reads it.
        if point != "filter" && section.get("sha256").is_some() {
            section.error("sha256", "pins a native library: set `library:` too");
        }
        return None;
    }
    let sha256 = section.string("sha256").and_then(|text| {
        let pin = linkbus_plugin_api::hex::decode::<32>(text.as_bytes()).ok();
        if pin.is_none() {
            section.error("sha256", "expected 64 hexadecimal digits (`sha256sum LIBRARY`)");
        }
        pin
    });
    let path = section.string("library")?;
    if !NATIVE_POINTS.contains(&point) {
        section.error(
            "library",
            format!(
                "a native library can serve a store, a stage (compressor, cipher) or a filter, not a {point} (native plugin ABI 1)"
            ),
        );
        return None;
    }
    Some(LibraryChoice { path: path.into(), sha256, loaded: None })
}

impl Config {
    /// Loads the native libraries the configuration names (each once per process), adds
    /// their plugins to `plugins.registry`, and checks each plugin's section with the
    /// plugin's own check. Libraries loaded already are skipped.
    ///
    /// # Errors
    /// A library that cannot be loaded (missing, not a library, another ABI version, a
    /// wrong pin), a plugin it does not offer, or problems its check found; each with its
    /// YAML path.
    pub fn load_libraries(&mut self) -> Result<(), ConfigErrors> {
        let diag = Diagnostics::new();
        let plugins = &mut self.plugins;
        load_choice(&diag, "plugins.store", &["store"], &mut plugins.store, &mut plugins.registry);
        let mut any_stage = false;
        for (i, stage) in plugins.stages.iter_mut().enumerate() {
            any_stage |= stage.library.is_some();
            load_choice(&diag, &format!("plugins.stages[{i}]"), &STAGE_POINTS, stage, &mut plugins.registry);
        }
        if any_stage && !diag.has_errors() {
            check_stage_order(&diag, &plugins.stages, &plugins.registry);
        }
        for (i, filter) in plugins.filters.iter_mut().enumerate() {
            let Some(library) = filter.library.as_mut() else { continue };
            let mut choice = PluginChoice {
                kind: filter.kind.clone(),
                library: Some(library.clone()),
                section: filter.section.clone(),
            };
            load_choice(
                &diag,
                &format!("plugins.filters[{i}]"),
                &["filter"],
                &mut choice,
                &mut plugins.registry,
            );
            *library = choice.library.unwrap_or_else(|| library.clone());
        }
        diag.finish()
    }
}

/// No compressor after a cipher (sealed bytes do not shrink), now that the native stages'
/// kinds are known (`read_stages` checked the built-in ones among themselves).
fn check_stage_order(diag: &Diagnostics, stages: &[PluginChoice], registry: &Registry) {
    let mut cipher_seen: Option<&PluginChoice> = None;
    for (i, stage) in stages.iter().enumerate() {
        let point =
            STAGE_POINTS.into_iter().find(|p| registry.find(p, &stage.kind, stage.library_path()).is_some());
        match (point, cipher_seen) {
            (Some("compressor"), Some(cipher)) if stage.library.is_some() || cipher.library.is_some() => diag
                .error(
                    format!("plugins.stages[{i}].kind"),
                    format!(
                        "compressor '{}' comes after cipher '{}': sealed bytes do not shrink, list it first",
                        stage.kind, cipher.kind
                    ),
                ),
            (Some("cipher"), _) => cipher_seen = Some(stage),
            _ => {}
        }
    }
}

fn load_choice(
    diag: &Diagnostics,
    path: &str,
    points: &[&str],
    choice: &mut PluginChoice,
    registry: &mut Registry,
) {
    let Some(library) = choice.library.as_mut().filter(|l| l.loaded.is_none()) else { return };
    let loaded = match linkbus_native::load(&library.path, library.sha256) {
        Ok(loaded) => loaded,
        Err(e) => return diag.error(format!("{path}.library"), e),
    };
    for plugin in linkbus_native::plugins(&loaded) {
        registry.add(plugin);
    }
    let found = points.iter().find_map(|point| registry.find(point, &choice.kind, Some(loaded.path())));
    let Some(plugin) = found else {
        let offered: Vec<&str> = loaded
            .plugins()
            .iter()
            .filter(|p| points.contains(&p.kind.as_str()))
            .map(|p| p.name.as_str())
            .collect();
        let offered = if offered.is_empty() { "none".to_owned() } else { offered.join(", ") };
        let point = points.join(" or ");
        return diag.error(
            format!("{path}.kind"),
            format!(
                "library {} offers no {point} plugin named '{}'; its {point} plugins: {offered}",
                loaded.path().display(),
                choice.kind
            ),
        );
    };
    if let Some(section) = Section::new(diag, path, &choice.section) {
        (plugin.check)(&section);
    }
    library.loaded = Some(loaded.path().to_owned());
}

/// The table `linkbus plugins` prints: every plugin `config` can select (built in, or from
/// the libraries it loaded), its version, whether the configuration uses it and where it
/// comes from; then each running filter (`filters`: name, plugin, code origin).
pub fn plugins_table(config: &Config, filters: &[(String, String, Origin)]) -> String {
    let p = &config.plugins;
    let used = |kind: &str, name: &str, library: Option<&std::path::Path>| {
        let is = |c: &PluginChoice| c.kind == name && c.library_path() == library;
        match kind {
            "transport" => is(&p.transport),
            "store" => is(&p.store),
            "router" => is(&p.router),
            "handler" => is(&p.files),
            "compressor" | "cipher" => p.stages.iter().any(is),
            "filter" => library.is_none() && p.filters.iter().any(|f| f.kind == name),
            _ => false,
        }
    };
    let mut rows = vec![["KIND".to_owned(), "NAME".into(), "VERSION".into(), "USED".into(), "ORIGIN".into()]];
    for plugin in p.registry.iter() {
        let used = if used(plugin.kind(), &plugin.name, plugin.library()) { "yes" } else { "-" };
        let origin = plugin.origin.to_string();
        rows.push([plugin.kind().into(), plugin.name.clone(), plugin.version.clone(), used.into(), origin]);
    }
    for (name, kind, origin) in filters {
        rows.push([
            "filter".into(),
            format!("{name} ({kind})"),
            "-".into(),
            "yes".into(),
            origin.to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..4).map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0)).collect();
    let mut text = String::new();
    for row in rows {
        for (cell, width) in row.iter().zip(&widths) {
            let _ = write!(text, "{cell:<width$}  ");
        }
        let _ = writeln!(text, "{}", row[4]);
    }
    text
}
