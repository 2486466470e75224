//! Key rotation: a payload sealed under the old key still opens on a node whose rule names
//! the new key and whose `keys` keep the old one, and one without the old key says which key
//! it lacks; new payloads go under the new key.

mod common;

use common::{address, cipher, new_key, seal};
use linkbus_encrypt_chacha::{key_id, read_key_file};
use linkbus_plugin_api::{Cipher, CodecError};

#[test]
fn old_payloads_open_while_the_old_key_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (new_key(dir.path(), "orders-1.key"), new_key(dir.path(), "orders-2.key"));
    let old_id = key_id(&read_key_file(&old).unwrap());
    let new_id = key_id(&read_key_file(&new).unwrap());
    let before =
        cipher(&format!("kind: chacha20poly1305\nrules: [{{ to: 'C:orders*', key: '{}' }}]", old.display()));
    let ad = b"what the host binds";
    let direct = seal(&before, &["C:orders"], b"sealed before the rotation", ad);
    let wrapped = seal(&before, &["C:orders", "C:orders.eu"], b"sealed for two before it", ad);
    assert_eq!(direct.0[2..10], old_id);

    let rotated = cipher(&format!(
        "kind: chacha20poly1305\nkeys: ['{}']\nrules: [{{ to: 'C:orders*', key: '{}' }}]",
        old.display(),
        new.display()
    ));
    let mut out = Vec::new();
    rotated.open(&address("C:orders"), &direct.0, &direct.1, ad, &mut out).unwrap();
    assert_eq!(out, b"sealed before the rotation");
    rotated.open(&address("C:orders.eu"), &wrapped.0, &wrapped.1, ad, &mut out).unwrap();
    assert_eq!(out, b"sealed for two before it");
    let after = seal(&rotated, &["C:orders"], b"sealed after", ad);
    assert_eq!(after.0[2..10], new_id, "new payloads go under the rule's key");

    let forgot =
        cipher(&format!("kind: chacha20poly1305\nrules: [{{ to: 'C:orders*', key: '{}' }}]", new.display()));
    let hex: String = old_id.iter().map(|b| format!("{b:02x}")).collect();
    for (param, sealed) in [&direct, &wrapped] {
        let error = forgot.open(&address("C:orders"), param, sealed, ad, &mut out).unwrap_err();
        let CodecError::Missing(message) = &error else { panic!("{error:?}") };
        assert!(message.starts_with(&format!("payload key {hex} is not loaded here")), "{message}");
        assert!(out.is_empty(), "nothing of a payload that did not open is left");
    }
}
