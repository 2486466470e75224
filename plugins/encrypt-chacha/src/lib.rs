//! The `chacha20poly1305` cipher plugin: end-to-end payload encryption with
//! XChaCha20-Poly1305 (random 192-bit nonces), under keys chosen per recipient by rules.
//!
//! Configuration (keys besides `kind`; any other key is an error):
//!
//! ```yaml
//! - kind: chacha20poly1305
//!   keys: [keys/orders-1.key]     # more keys it opens with (old keys kept after a rotation)
//!   rules:                        # per recipient: the first rule whose `to` matches names its key
//!     - { to: 'C:orders*', key: keys/orders-2.key }
//!   require:                      # at a destination: these recipients take only payloads
//!     - { to: 'C:orders*', keys: [keys/orders-2.key, keys/orders-1.key] }  # sealed under these
//! ```
//!
//! A recipient a `require` entry names takes only messages this cipher sealed last, under
//! one of the entry's keys: the host dead-letters one that arrives unsealed
//! ([`Cipher::requires`](linkbus_plugin_api::Cipher::requires)), and opening refuses one
//! sealed under another key the node holds. Without it, any key the node holds opens a
//! payload for any of its queues, and a relay could pass an unsealed message off.
//!
//! A key file holds 64 hex digits (a line ending may follow) and must be readable by its
//! owner only (`chmod 600`); [`write_new_key_file`] makes one. Keys named by rules are loaded
//! for opening too, and at least one key must be configured. A key is named by its id,
//! [`key_id`]: 8 bytes of BLAKE2s-256 over `"linkbus payload key id v1"` and the key. To
//! rotate a key, point the rule at the new file and move the old one to `keys` until
//! nothing sealed under it is still on its way.
//!
//! A payload is sealed when every recipient has a key, and left as it is when none has one;
//! when only some have one it is refused, so no recipient gets it in the clear by mistake.
//! The step record (`param`), format 1, is one of:
//!
//! - direct, for one recipient: `[1, 0, key id (8), nonce (24)]`; the payload is sealed under
//!   the recipient's key with associated data = the host's associated data followed by the
//!   recipient's `node:queue`.
//! - wrapped, for several (under the same key or different ones): `[1, 1, nonce (24), count
//!   (u8)]`, then per recipient `[address length (u8), node:queue, key id (8), wrap nonce
//!   (24), wrapped data key (48)]`. A fresh random 32-byte data key seals the payload with
//!   associated data = the host's associated data followed by the whole record, so no part of
//!   the record can change unnoticed; each wrap seals the data key under the recipient's key
//!   with associated data = `"wrap"`, the host's associated data and the recipient's address.
//!
//! So a payload opens only for an address it was sealed for: a wrap moved to another address
//! fails, as does a direct payload opened for another recipient.
//!
//! Modules:
//! - `cipher`: [`ChaChaCipher`], sealing and opening.
//! - `record`: writing and strictly parsing the step record.
//! - `key`: key files and key ids.
//! - `settings`: reading the section, with every problem at its YAML path.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod cipher;
mod key;
mod record;
mod settings;

use linkbus_plugin_api::registry::{BuildContext, Factory, PluginEntry, PluginError};
use linkbus_plugin_api::{Cipher, ConfigValue, Section};

pub use crate::cipher::{CIPHER_ID, ChaChaCipher};
pub use crate::key::{KEY_BYTES, KEY_ID_BYTES, key_id, read_key_file, write_new_key_file};

/// The name the configuration selects this plugin by (`kind: chacha20poly1305`).
pub const PLUGIN_NAME: &str = "chacha20poly1305";

fn check(section: &Section<'_>) {
    let _ = settings::read(section);
}

fn build(config: &ConfigValue, _ctx: &BuildContext) -> Result<Box<dyn Cipher>, PluginError> {
    let cipher = ChaChaCipher::from_config(config)
        .map_err(|e| PluginError { plugin: PLUGIN_NAME.into(), reason: e.to_string() })?;
    Ok(Box::new(cipher))
}

/// The plugin's registration: submitted to the built-in registry here, and what a native
/// plugin library can export as it is (`linkbus_native::export_plugins!`).
pub const CHACHA: PluginEntry = PluginEntry {
    name: PLUGIN_NAME,
    summary: "end-to-end payload encryption (XChaCha20-Poly1305) under keys chosen per recipient",
    check,
    factory: Factory::Cipher(build),
};

inventory::submit!(CHACHA);

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn yaml(text: &str) -> ConfigValue {
        serde_saphyr::from_str(text).unwrap()
    }

    fn check_issues(text: &str) -> Vec<String> {
        let read = linkbus_plugin_api::read_plugin_section("codecs[1]", &yaml(text), check);
        read.err().map(|e| e.0.iter().map(ToString::to_string).collect()).unwrap_or_default()
    }

    #[test]
    fn the_plugin_is_registered_as_a_cipher() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("a.key");
        write_new_key_file(&key).unwrap();
        let entry = linkbus_plugin_api::registry::find("cipher", "chacha20poly1305").expect("registered");
        let Factory::Cipher(build) = entry.factory else { panic!("not a cipher") };
        let ctx = BuildContext { node: "A".parse().unwrap(), data_dir: ".".into() };
        let config = format!("kind: chacha20poly1305\nrules: [{{ to: '*', key: '{}' }}]", key.display());
        assert_eq!(build(&yaml(&config), &ctx).unwrap().id(), crate::CIPHER_ID);
        let error = build(&yaml("kind: chacha20poly1305"), &ctx).err().unwrap();
        assert!(error.to_string().contains("no payload key is configured"), "{error}");
    }

    #[test]
    fn check_reports_every_problem_at_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open.key");
        std::fs::write(&open, "00".repeat(32)).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        let short = dir.path().join("short.key");
        std::fs::write(&short, "00").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        let good = dir.path().join("good.key");
        write_new_key_file(&good).unwrap();
        let issues = check_issues(&format!(
            "kind: chacha20poly1305
keys: ['{open}', '{gone}', 7]
rules:
  - {{ to: 'C:orders*', key: '{short}' }}
  - {{ to: ['B', 'C:q/x'], key: '{good}' }}
  - {{ to: 'D', typo: 1 }}
extra: true",
            open = open.display(),
            gone = dir.path().join("gone.key").display(),
            short = short.display(),
            good = good.display(),
        ));
        let has = |path: &str, says: &str| {
            assert!(
                issues.iter().any(|i| i.starts_with(&format!("{path}: ")) && i.contains(says)),
                "no '{says}' at {path} in {issues:#?}"
            );
        };
        has("codecs[1].keys[0]", "chmod 600");
        has("codecs[1].keys[1]", "cannot read payload key file");
        has("codecs[1].keys[2]", "expected the path of a key file");
        has("codecs[1].rules[0].key", "expected 64 hex digits");
        has("codecs[1].rules[1].to[1]", "contains '/'");
        has("codecs[1].rules[2].key", "is required");
        has("codecs[1].rules[2].typo", "unknown key");
        has("codecs[1].extra", "unknown key");
        assert_eq!(issues.len(), 8, "{issues:#?}");
        assert!(check_issues(&format!("kind: chacha20poly1305\nkeys: ['{}']", good.display())).is_empty());
        assert_eq!(
            check_issues("kind: chacha20poly1305\nkeys: []\nrules: []"),
            ["codecs[1].keys: no payload key is configured: list key files in keys, or name them in rules"]
        );
    }
}
