//! Configuration values and the reader that turns them into typed settings.
//!
//! The host parses YAML into a [`ConfigValue`] tree, then reads it through [`Section`]s:
//! each read names its key, so every problem is reported with its full YAML path
//! (`queues[2].name: ...`), every problem is collected instead of stopping at the first, and
//! keys nobody asked for are reported as unknown. Plugins read their own section the same
//! way, so their errors look like the host's.

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A parsed configuration document, before any typing.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigValue {
    /// `~`, `null` or an empty value.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A negative integer.
    Int(i64),
    /// A non-negative integer.
    Uint(u64),
    /// A number with a fraction.
    Float(f64),
    /// Text.
    Str(String),
    /// A list.
    Seq(Vec<ConfigValue>),
    /// A mapping, in document order.
    Map(Vec<(String, ConfigValue)>),
}

impl ConfigValue {
    /// A short description of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Bool(_) => "a boolean",
            Self::Int(_) | Self::Uint(_) => "an integer",
            Self::Float(_) => "a number",
            Self::Str(_) => "a string",
            Self::Seq(_) => "a list",
            Self::Map(_) => "a mapping",
        }
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = ConfigValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<ConfigValue, E> {
        Ok(ConfigValue::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<ConfigValue, E> {
        Ok(u64::try_from(v).map_or(ConfigValue::Int(v), ConfigValue::Uint))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<ConfigValue, E> {
        Ok(ConfigValue::Uint(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<ConfigValue, E> {
        Ok(ConfigValue::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<ConfigValue, E> {
        Ok(ConfigValue::Str(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<ConfigValue, E> {
        Ok(ConfigValue::Str(v))
    }
    fn visit_none<E: de::Error>(self) -> Result<ConfigValue, E> {
        Ok(ConfigValue::Null)
    }
    fn visit_unit<E: de::Error>(self) -> Result<ConfigValue, E> {
        Ok(ConfigValue::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<ConfigValue, D::Error> {
        ConfigValue::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ConfigValue, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(ConfigValue::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ConfigValue, A::Error> {
        let mut entries: Vec<(String, ConfigValue)> = Vec::new();
        while let Some(key) = map.next_key::<ConfigValue>()? {
            let key = match key {
                ConfigValue::Str(s) => s,
                ConfigValue::Uint(n) => n.to_string(),
                ConfigValue::Int(n) => n.to_string(),
                ConfigValue::Bool(b) => b.to_string(),
                other => {
                    return Err(de::Error::custom(format!(
                        "mapping keys must be strings, found {}",
                        other.type_name()
                    )));
                }
            };
            if entries.iter().any(|(k, _)| *k == key) {
                return Err(de::Error::custom(format!("duplicate key '{key}'")));
            }
            entries.push((key, map.next_value()?));
        }
        Ok(ConfigValue::Map(entries))
    }
}

impl<'de> Deserialize<'de> for ConfigValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

/// One configuration problem, with the YAML path it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Dotted YAML path, `queues[2].name`; empty for the document itself.
    pub path: String,
    /// What is wrong, lower-case.
    pub message: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in one configuration, in document order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigIssue>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(f, "{n} configuration error{}", if n == 1 { "" } else { "s" })?;
        for issue in &self.0 {
            write!(f, "\n  {issue}")?;
        }
        Ok(())
    }
}

/// Collects problems while a configuration is read.
#[derive(Debug, Default)]
pub struct Diagnostics {
    issues: RefCell<Vec<ConfigIssue>>,
}

impl Diagnostics {
    /// An empty collection.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a problem at `path`.
    pub fn error(&self, path: impl Into<String>, message: impl fmt::Display) {
        self.issues.borrow_mut().push(ConfigIssue { path: path.into(), message: message.to_string() });
    }

    /// Whether any problem was recorded.
    pub fn has_errors(&self) -> bool {
        !self.issues.borrow().is_empty()
    }

    /// `Ok` when nothing was recorded, else every problem.
    ///
    /// # Errors
    /// [`ConfigErrors`] holding every recorded issue.
    pub fn finish(self) -> Result<(), ConfigErrors> {
        let issues = self.issues.into_inner();
        if issues.is_empty() { Ok(()) } else { Err(ConfigErrors(issues)) }
    }
}

/// A mapping being read: each accessor names a key, reports problems with the key's path,
/// and marks the key as known; [`Section::finish`] reports the keys nobody asked for.
#[derive(Debug)]
pub struct Section<'a> {
    diag: &'a Diagnostics,
    path: String,
    entries: &'a [(String, ConfigValue)],
    known: RefCell<Vec<&'static str>>,
}

/// Reads a plugin's whole section `config` (at YAML path `path`) with `read`, its `kind`
/// key taken as read: what `read` made, or every problem it and the section reported.
///
/// # Errors
/// Every problem, each with its YAML path.
pub fn read_plugin_section<T>(
    path: &str,
    config: &ConfigValue,
    read: impl FnOnce(&Section<'_>) -> T,
) -> Result<T, ConfigErrors> {
    let diag = Diagnostics::new();
    let made = Section::new(&diag, path, config).map(|section| {
        let _ = section.get("kind");
        let made = read(&section);
        section.finish();
        made
    });
    // `Section::new` reports why it gave no section, so no result means an error is there.
    diag.finish().and_then(|()| made.ok_or_else(|| ConfigErrors(Vec::new())))
}

impl<'a> Section<'a> {
    /// Reads `value` at `path` as a mapping; `null` reads as an empty mapping. Anything else
    /// is reported and gives `None`.
    pub fn new(diag: &'a Diagnostics, path: impl Into<String>, value: &'a ConfigValue) -> Option<Self> {
        let path = path.into();
        let entries: &[(String, ConfigValue)] = match value {
            ConfigValue::Map(entries) => entries,
            ConfigValue::Null => &[],
            other => {
                diag.error(path, format!("expected a mapping, found {}", other.type_name()));
                return None;
            }
        };
        Some(Self { diag, path, entries, known: RefCell::new(Vec::new()) })
    }

    /// This section's own path (empty for the document).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Every entry of the section, read or not: for a section whose keys are read elsewhere
    /// (a native plugin reads its own across the library boundary).
    pub fn entries(&self) -> &'a [(String, ConfigValue)] {
        self.entries
    }

    /// The path of `key` inside this section.
    pub fn path_of(&self, key: &str) -> String {
        if self.path.is_empty() { key.to_owned() } else { format!("{}.{key}", self.path) }
    }

    /// The diagnostics this section reports to.
    pub fn diagnostics(&self) -> &'a Diagnostics {
        self.diag
    }

    /// Records a problem about `key`.
    pub fn error(&self, key: &str, message: impl fmt::Display) {
        self.diag.error(self.path_of(key), message);
    }

    /// The raw value of `key`; `null` counts as absent.
    pub fn get(&self, key: &'static str) -> Option<&'a ConfigValue> {
        self.known.borrow_mut().push(key);
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v).filter(|v| **v != ConfigValue::Null)
    }

    /// A nested mapping; an absent key reads as an empty mapping.
    pub fn section(&self, key: &'static str) -> Option<Section<'a>> {
        static NULL: ConfigValue = ConfigValue::Null;
        Section::new(self.diag, self.path_of(key), self.get(key).unwrap_or(&NULL))
    }

    /// A list, each item with its path; absent reads as empty.
    pub fn list(&self, key: &'static str) -> Vec<(String, &'a ConfigValue)> {
        match self.get(key) {
            None => Vec::new(),
            Some(ConfigValue::Seq(items)) => {
                items.iter().enumerate().map(|(i, v)| (format!("{}[{i}]", self.path_of(key)), v)).collect()
            }
            Some(other) => {
                self.error(key, format!("expected a list, found {}", other.type_name()));
                Vec::new()
            }
        }
    }

    /// A string, if present and a string.
    pub fn string(&self, key: &'static str) -> Option<String> {
        match self.get(key)? {
            ConfigValue::Str(s) => Some(s.clone()),
            other => {
                self.error(key, format!("expected a string, found {}", other.type_name()));
                None
            }
        }
    }

    /// A string parsed with `FromStr`, if present and valid.
    pub fn parsed<T: FromStr>(&self, key: &'static str) -> Option<T>
    where
        T::Err: fmt::Display,
    {
        let text = self.string(key)?;
        text.parse().map_err(|e| self.error(key, e)).ok()
    }

    /// A required value read by `read`: absence is reported.
    pub fn required<T>(
        &self,
        key: &'static str,
        read: impl FnOnce(&Self, &'static str) -> Option<T>,
    ) -> Option<T> {
        if self.get(key).is_none() {
            self.error(key, "is required");
            return None;
        }
        read(self, key)
    }

    /// A boolean, `default` when absent.
    pub fn bool(&self, key: &'static str, default: bool) -> bool {
        match self.get(key) {
            None => default,
            Some(ConfigValue::Bool(b)) => *b,
            Some(other) => {
                self.error(key, format!("expected true or false, found {}", other.type_name()));
                default
            }
        }
    }

    /// An integer in `min..=max`, `default` when absent.
    pub fn number(&self, key: &'static str, default: u64, min: u64, max: u64) -> u64 {
        match self.get(key) {
            None => default,
            Some(ConfigValue::Uint(n)) if (min..=max).contains(n) => *n,
            Some(ConfigValue::Uint(n)) => {
                self.error(key, format!("{n} is out of range {min}..={max}"));
                default
            }
            Some(ConfigValue::Int(n)) => {
                self.error(key, format!("{n} is out of range {min}..={max}"));
                default
            }
            Some(other) => {
                self.error(key, format!("expected an integer, found {}", other.type_name()));
                default
            }
        }
    }

    /// The address pattern at `key`, or the non-empty list of them there (how codec rules
    /// name their recipients, `to: 'C:orders*'`), each error reported at its path.
    pub fn address_patterns(&self, key: &'static str) -> Option<Vec<crate::router::AddressPattern>> {
        let parse = |path: String, value: &ConfigValue| match value {
            ConfigValue::Str(text) => {
                crate::router::AddressPattern::new(text).map_err(|e| self.diagnostics().error(path, e)).ok()
            }
            other => {
                self.diagnostics()
                    .error(path, format!("expected an address pattern, found {}", other.type_name()));
                None
            }
        };
        match self.get(key)? {
            ConfigValue::Seq(items) if items.is_empty() => {
                self.error(key, "is empty: name at least one address pattern");
                None
            }
            ConfigValue::Seq(items) => {
                let patterns: Vec<_> = items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| parse(format!("{}[{i}]", self.path_of(key)), item))
                    .collect();
                patterns.into_iter().collect()
            }
            value => parse(self.path_of(key), value).map(|p| vec![p]),
        }
    }

    /// Reports every key that no accessor asked for.
    pub fn finish(self) {
        let known = self.known.borrow().clone();
        for (key, _) in self.entries {
            if !known.contains(&key.as_str()) {
                let mut expected: Vec<&str> = known.clone();
                expected.sort_unstable();
                expected.dedup();
                self.diag.error(
                    self.path_of(key),
                    format!("unknown key; expected one of: {}", expected.join(", ")),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: &[(&str, ConfigValue)]) -> ConfigValue {
        ConfigValue::Map(entries.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect())
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let doc = map(&[
            ("a", ConfigValue::Uint(5)),
            ("b", ConfigValue::Str("x".into())),
            ("typo", ConfigValue::Bool(true)),
            ("inner", map(&[("n", ConfigValue::Int(-1))])),
        ]);
        let diag = Diagnostics::new();
        let s = Section::new(&diag, "", &doc).unwrap();
        assert_eq!(s.number("a", 1, 0, 3), 1);
        assert!(!s.bool("b", false));
        let inner = s.section("inner").unwrap();
        assert_eq!(inner.number("n", 7, 0, 10), 7);
        inner.finish();
        s.finish();
        let errors = diag.finish().unwrap_err();
        let paths: Vec<&str> = errors.0.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(paths, ["a", "b", "inner.n", "typo"]);
        assert!(errors.0[3].message.contains("unknown key"));
    }
}
