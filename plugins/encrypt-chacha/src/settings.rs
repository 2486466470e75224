//! The stage's configuration section, read into [`Settings`] with every problem reported at
//! its YAML path; key files are read and checked here, so `check` finds a bad one.

use std::path::Path;

use linkbus_plugin_api::{AddressPattern, ConfigValue, Section};

use crate::key::{KEY_BYTES, read_key_file};

/// The whole section, as read.
#[derive(Default)]
pub(crate) struct Settings {
    /// Every key that loaded (from `keys` and from rules), each once.
    pub(crate) keys: Vec<[u8; KEY_BYTES]>,
    /// Rules in the order written: a recipient's key is its first matching rule's.
    pub(crate) rules: Vec<RuleSettings>,
    /// Recipients that take only payloads sealed under one of their keys, in the order
    /// written: a recipient's entry is the first that matches it.
    pub(crate) require: Vec<RequireSettings>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // (Never the keys themselves.)
        f.debug_struct("Settings")
            .field("keys", &self.keys.len())
            .field("rules", &self.rules)
            .field("require", &self.require)
            .finish()
    }
}

/// One entry of `require`.
#[derive(Debug)]
pub(crate) struct RequireSettings {
    /// Recipients it is for.
    pub(crate) to: Vec<AddressPattern>,
    /// Indexes into [`Settings::keys`] of the keys their payloads may be sealed under.
    pub(crate) keys: Vec<usize>,
}

/// One entry of `rules`.
#[derive(Debug)]
pub(crate) struct RuleSettings {
    /// Recipients the rule is for: a recipient matches when any pattern does.
    pub(crate) to: Vec<AddressPattern>,
    /// Index into [`Settings::keys`] of the key it seals with.
    pub(crate) key: usize,
}

/// Reads the section (keys besides `kind`), reporting every problem into its diagnostics.
/// What could not be read is left out of the result, so use it only when nothing was reported.
pub(crate) fn read(section: &Section<'_>) -> Settings {
    let diag = section.diagnostics();
    let mut settings = Settings::default();
    let mut declared = 0;
    for (path, value) in section.list("keys") {
        declared += 1;
        match value {
            ConfigValue::Str(file) => match read_key_file(Path::new(file)) {
                Ok(key) => {
                    settings.index_of(key);
                }
                Err(e) => diag.error(path, e),
            },
            other => {
                diag.error(path, format!("expected the path of a key file, found {}", other.type_name()))
            }
        }
    }
    for (path, value) in section.list("rules") {
        let Some(rule) = Section::new(diag, path, value) else { continue };
        let to = rule.required("to", Section::address_patterns);
        let key = rule.required("key", Section::string).and_then(|file| {
            declared += 1;
            read_key_file(Path::new(&file)).map_err(|e| rule.error("key", e)).ok()
        });
        rule.finish();
        if let (Some(to), Some(key)) = (to, key) {
            let key = settings.index_of(key);
            settings.rules.push(RuleSettings { to, key });
        }
    }
    for (path, value) in section.list("require") {
        let Some(entry) = Section::new(diag, path, value) else { continue };
        let to = entry.required("to", Section::address_patterns);
        let mut keys = Vec::new();
        for (path, value) in entry.list("keys") {
            match value {
                ConfigValue::Str(file) => match read_key_file(Path::new(file)) {
                    Ok(key) => keys.push(settings.index_of(key)),
                    Err(e) => diag.error(path, e),
                },
                other => {
                    diag.error(path, format!("expected the path of a key file, found {}", other.type_name()))
                }
            }
        }
        if keys.is_empty() {
            entry.error("keys", "name the key files payloads for these recipients may be sealed under");
        }
        declared += keys.len();
        entry.finish();
        if let Some(to) = to {
            settings.require.push(RequireSettings { to, keys });
        }
    }
    if declared == 0 {
        section.error("keys", "no payload key is configured: list key files in keys, or name them in rules");
    }
    settings
}

impl Settings {
    /// The index of `key` in [`Settings::keys`], added if it is not there yet.
    fn index_of(&mut self, key: [u8; KEY_BYTES]) -> usize {
        match self.keys.iter().position(|k| *k == key) {
            Some(index) => index,
            None => {
                self.keys.push(key);
                self.keys.len() - 1
            }
        }
    }
}
