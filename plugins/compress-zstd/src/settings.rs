//! The stage's configuration section, read into [`Settings`] with every problem reported at
//! its YAML path; dictionary files are read and checked here, so `check` finds a bad one.

use linkbus_plugin_api::{AddressPattern, ConfigValue, Section};

use crate::dictionary;

/// Default `level`: zstd's own default, fast and already good on message payloads.
pub(crate) const LEVEL_DEFAULT: u64 = 3;
/// Highest `level` accepted: zstd's 20..=22 need far more memory per context for little gain.
pub(crate) const LEVEL_MAX: u64 = 19;
/// Default `min_bytes`: below it the frame's own bytes (about a dozen) eat the saving.
pub(crate) const MIN_BYTES_DEFAULT: u64 = 64;
/// Highest `min_bytes` accepted (1 GiB), far above any message limit.
pub(crate) const MIN_BYTES_MAX: u64 = 1 << 30;

/// The whole section, as read.
#[derive(Debug, Default)]
pub(crate) struct Settings {
    /// Dictionaries that loaded, in the order written.
    pub(crate) dictionaries: Vec<DictionaryFile>,
    /// Rules in the order written: the first whose `to` matches every recipient applies.
    pub(crate) rules: Vec<RuleSettings>,
}

/// A dictionary named in `dictionaries`, with its bytes.
#[derive(Debug)]
pub(crate) struct DictionaryFile {
    /// Its local name, which rules refer to.
    pub(crate) name: String,
    /// The id zstd wrote into it, which travels in the step record.
    pub(crate) id: u32,
    /// The file's bytes (ZDICT format).
    pub(crate) bytes: Vec<u8>,
}

/// One entry of `rules`.
#[derive(Debug)]
pub(crate) struct RuleSettings {
    /// Recipients the rule is for: a recipient matches when any pattern does.
    pub(crate) to: Vec<AddressPattern>,
    /// zstd level, `1..=LEVEL_MAX`.
    pub(crate) level: i32,
    /// Payloads smaller than this go as they are.
    pub(crate) min_bytes: usize,
    /// Index into [`Settings::dictionaries`] of the dictionary it compresses with.
    pub(crate) dictionary: Option<usize>,
}

/// Reads the section (keys besides `kind`), reporting every problem into its diagnostics.
/// What could not be read is left out of the result, so use it only when nothing was reported.
pub(crate) fn read(section: &Section<'_>) -> Settings {
    let (declared, dictionaries) = read_dictionaries(section);
    let rules = section
        .list("rules")
        .into_iter()
        .filter_map(|(path, value)| read_rule(section, &path, value, &declared, &dictionaries))
        .collect();
    Settings { dictionaries, rules }
}

/// Reads `dictionaries: { NAME: FILE }`: every name declared (also those whose file failed),
/// and the dictionaries that loaded.
fn read_dictionaries(section: &Section<'_>) -> (Vec<String>, Vec<DictionaryFile>) {
    let diag = section.diagnostics();
    let (mut declared, mut loaded) = (Vec::new(), Vec::<DictionaryFile>::new());
    let entries = match section.get("dictionaries") {
        None => return (declared, loaded),
        Some(ConfigValue::Map(entries)) => entries,
        Some(other) => {
            let found = other.type_name();
            section.error(
                "dictionaries",
                format!("expected a mapping of names to dictionary files, found {found}"),
            );
            return (declared, loaded);
        }
    };
    for (name, value) in entries {
        let path = format!("{}.{name}", section.path_of("dictionaries"));
        declared.push(name.clone());
        let ConfigValue::Str(file) = value else {
            diag.error(path, format!("expected the path of a dictionary file, found {}", value.type_name()));
            continue;
        };
        let (id, bytes) = match dictionary::read_file(std::path::Path::new(file)) {
            Ok(read) => read,
            Err(e) => {
                diag.error(path, e);
                continue;
            }
        };
        if let Some(same) = loaded.iter().find(|d| d.id == id && d.bytes != bytes) {
            diag.error(
                path,
                format!(
                    "'{file}' has dictionary id {id}, as dictionary '{}' has: ids must tell them apart",
                    same.name
                ),
            );
            continue;
        }
        loaded.push(DictionaryFile { name: name.clone(), id, bytes });
    }
    (declared, loaded)
}

/// Reads one entry of `rules`; `None` when it is not a mapping or has no usable `to`.
fn read_rule(
    section: &Section<'_>,
    path: &str,
    value: &ConfigValue,
    declared: &[String],
    dictionaries: &[DictionaryFile],
) -> Option<RuleSettings> {
    let rule = Section::new(section.diagnostics(), path, value)?;
    let to = rule.required("to", Section::address_patterns);
    let level = rule.number("level", LEVEL_DEFAULT, 1, LEVEL_MAX);
    let min_bytes = rule.number("min_bytes", MIN_BYTES_DEFAULT, 0, MIN_BYTES_MAX);
    let dictionary = rule.string("dictionary").and_then(|name| {
        let found = dictionaries.iter().position(|d| d.name == name);
        if found.is_none() && !declared.contains(&name) {
            let known = if declared.is_empty() { "none".to_owned() } else { declared.join(", ") };
            rule.error(
                "dictionary",
                format!("no dictionary named '{name}' in dictionaries (declared: {known})"),
            );
        }
        found
    });
    rule.finish();
    Some(RuleSettings {
        to: to?,
        level: i32::try_from(level).ok()?,
        min_bytes: usize::try_from(min_bytes).ok()?,
        dictionary,
    })
}
