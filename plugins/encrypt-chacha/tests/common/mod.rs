//! What the integration tests share: key files, configurations written as YAML, addresses.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use linkbus_encrypt_chacha::{ChaChaCipher, write_new_key_file};
use linkbus_plugin_api::{Address, Cipher};

/// A cipher configured by the YAML `text`.
pub(crate) fn cipher(text: &str) -> ChaChaCipher {
    ChaChaCipher::from_config(&serde_saphyr::from_str(text).unwrap()).unwrap()
}

/// The address `text` (`NODE:QUEUE`).
pub(crate) fn address(text: &str) -> Address {
    text.parse().unwrap()
}

/// A new key file `dir/name`.
pub(crate) fn new_key(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    write_new_key_file(&path).unwrap();
    path
}

/// `plaintext` sealed for `to` with associated data `ad`: the record and the sealed bytes.
pub(crate) fn seal(cipher: &dyn Cipher, to: &[&str], plaintext: &[u8], ad: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let to: Vec<Address> = to.iter().map(|a| address(a)).collect();
    let mut sealed = Vec::new();
    let param = cipher.seal(&to, plaintext, ad, &mut sealed).unwrap().expect("keys for every recipient");
    (param, sealed)
}
