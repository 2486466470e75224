//! The `zstd` compressor plugin: zstd compression of payloads, chosen per destination by
//! rules, with dictionaries trained on the payloads of small messages, and bounded on
//! decompression whatever a frame says.
//!
//! Configuration (keys besides `kind`; any other key is an error):
//!
//! ```yaml
//! - kind: zstd
//!   dictionaries: { orders: dicts/orders.dict }  # local name -> file trained by `zstd --train`
//!   rules:
//!     - to: 'C:orders*'   # an address pattern, or a list of them
//!       level: 3          # 1..=19, default 3
//!       min_bytes: 64     # default 64: smaller payloads go as they are
//!       dictionary: orders  # optional: a name from `dictionaries`
//! ```
//!
//! - `dictionaries` maps local names to dictionary files (ZDICT format, with a dictionary id;
//!   paths relative to the working directory). Every one is loaded for decompression, so a
//!   node that only receives lists its dictionaries and no rules.
//! - `rules` are tried in the order written; the first whose `to` matches *every* recipient
//!   of the payload applies. When none does, the payload goes as it is, as it does when it is
//!   smaller than the rule's `min_bytes` or would not shrink.
//!
//! The step record (`param`) is empty for a frame made without a dictionary, else the
//! dictionary's id in 4 bytes, big-endian; the receiver decompresses with the dictionary it
//! loaded under that id, and says which is missing otherwise. Frames carry their content
//! size and a checksum. Decompression refuses a frame stating a size over the caller's
//! limit before decoding, and decodes any other within that limit (see the `decode` module).
//!
//! Modules:
//! - `compressor`: [`ZstdCompressor`], the rules and the dictionaries loaded.
//! - `settings`: reading the section, with every problem at its YAML path.
//! - `dictionary`: [`train`], [`dictionary_id`] and reading dictionary files.
//! - `pool`: compression contexts kept between calls, per rule.
//! - `decode`: bounded decompression of one frame, the bomb guard.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod compressor;
mod decode;
mod dictionary;
mod pool;
mod settings;

use linkbus_plugin_api::registry::{BuildContext, Factory, PluginEntry, PluginError};
use linkbus_plugin_api::{Compressor, ConfigValue, Section};

pub use crate::compressor::{COMPRESSOR_ID, ZstdCompressor};
pub use crate::dictionary::{DICTIONARY_BYTES_MAX, TRAIN_SAMPLES_MIN, dictionary_id, train};

/// The name the configuration selects this plugin by (`kind: zstd`).
pub const PLUGIN_NAME: &str = "zstd";

fn check(section: &Section<'_>) {
    let _ = settings::read(section);
}

fn build(config: &ConfigValue, _ctx: &BuildContext) -> Result<Box<dyn Compressor>, PluginError> {
    let compressor = ZstdCompressor::from_config(config)
        .map_err(|e| PluginError { plugin: PLUGIN_NAME.into(), reason: e.to_string() })?;
    Ok(Box::new(compressor))
}

/// The plugin's registration: submitted to the built-in registry here, and what a native
/// plugin library can export as it is (`linkbus_native::export_plugins!`).
pub const ZSTD: PluginEntry = PluginEntry {
    name: PLUGIN_NAME,
    summary: "zstd payload compression by destination rules, with trained dictionaries; bounded decompression",
    check,
    factory: Factory::Compressor(build),
};

inventory::submit!(ZSTD);

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> ConfigValue {
        serde_saphyr::from_str(text).unwrap()
    }

    fn check_issues(text: &str) -> Vec<String> {
        let read = linkbus_plugin_api::read_plugin_section("codecs[0]", &yaml(text), check);
        read.err().map(|e| e.0.iter().map(ToString::to_string).collect()).unwrap_or_default()
    }

    #[test]
    fn the_plugin_is_registered_as_a_compressor() {
        let entry = linkbus_plugin_api::registry::find("compressor", "zstd").expect("registered");
        let Factory::Compressor(build) = entry.factory else { panic!("not a compressor") };
        let ctx = BuildContext { node: "A".parse().unwrap(), data_dir: ".".into() };
        let compressor = build(&yaml("kind: zstd\nrules: [{ to: '*' }]"), &ctx).unwrap();
        assert_eq!(compressor.id(), 1);
        let error = build(&yaml("kind: zstd\nrules: [{ to: '*', level: 30 }]"), &ctx).err().unwrap();
        assert!(error.to_string().contains("rules[0].level"), "{error}");
    }

    #[test]
    fn check_reports_every_problem_at_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain.dict");
        std::fs::write(&plain, b"not a dictionary").unwrap();
        let issues = check_issues(&format!(
            "kind: zstd
dictionaries: {{ plain: '{}', gone: '{}' }}
rules:
  - {{ to: 'C:orders*', level: 0, dictionary: nothing }}
  - {{ to: ['B', '1x:y'], min_bytes: -1, dictionary: plain }}
  - {{ level: 3, typo: 1 }}
  - to: []
extra: 1",
            plain.display(),
            dir.path().join("gone.dict").display()
        ));
        let has = |path: &str, says: &str| {
            assert!(
                issues.iter().any(|i| i.starts_with(&format!("{path}: ")) && i.contains(says)),
                "no '{says}' at {path} in {issues:#?}"
            );
        };
        has("codecs[0].dictionaries.plain", "no dictionary id");
        has("codecs[0].dictionaries.gone", "cannot read dictionary file");
        has("codecs[0].rules[0].level", "out of range 1..=19");
        has("codecs[0].rules[0].dictionary", "no dictionary named 'nothing'");
        has("codecs[0].rules[1].to[1]", "must start with a letter");
        has("codecs[0].rules[1].min_bytes", "out of range");
        has("codecs[0].rules[2].to", "is required");
        has("codecs[0].rules[2].typo", "unknown key");
        has("codecs[0].rules[3].to", "is empty");
        has("codecs[0].extra", "unknown key");
        assert_eq!(issues.len(), 10, "{issues:#?}");
        assert!(check_issues("kind: zstd\nrules: [{ to: 'C:orders*', level: 19, min_bytes: 0 }]").is_empty());
    }
}
