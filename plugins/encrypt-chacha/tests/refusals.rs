//! What the cipher refuses: a recipient set where only some have a key (none leave in the
//! clear by mistake), and any change to the record, the payload, the associated data or the
//! address a wrap is bound to.

mod common;

use common::{address, cipher, new_key, seal};
use linkbus_plugin_api::{Address, Cipher, CodecError};

fn two_key_cipher(dir: &std::path::Path) -> linkbus_encrypt_chacha::ChaChaCipher {
    let (orders, audit) = (new_key(dir, "orders.key"), new_key(dir, "audit.key"));
    cipher(&format!(
        "kind: chacha20poly1305\nrules:\n  - {{ to: 'B:orders', key: '{}' }}\n  - {{ to: 'C', key: '{}' }}",
        orders.display(),
        audit.display()
    ))
}

#[test]
fn some_recipients_without_a_key_refuse_the_whole_payload() {
    let dir = tempfile::tempdir().unwrap();
    let chacha = two_key_cipher(dir.path());
    let to: Vec<Address> = ["B:orders", "E:x", "C:q", "F:y"].iter().map(|a| address(a)).collect();
    let mut out = Vec::new();
    let error = chacha.seal(&to, b"payload", b"ad", &mut out).unwrap_err();
    let CodecError::Refused(message) = &error else { panic!("{error:?}") };
    assert!(message.contains("no payload key for E:x, F:y"), "{message}");
    assert!(message.contains("separately") && message.contains("rule"), "{message}");
    assert!(out.is_empty());
    let none: Vec<Address> = ["E:x", "B:audit"].iter().map(|a| address(a)).collect();
    assert_eq!(chacha.seal(&none, b"payload", b"ad", &mut out), Ok(None), "no key at all: as it is");
    assert_eq!(chacha.seal(&[], b"payload", b"ad", &mut out), Ok(None));
}

#[test]
fn a_changed_record_payload_or_address_never_opens() {
    let dir = tempfile::tempdir().unwrap();
    let chacha = two_key_cipher(dir.path());
    let ad = b"bound";
    let (param, sealed) = seal(&chacha, &["B:orders", "C:q"], b"for two", ad);
    let open = |recipient: &str, param: &[u8], sealed: &[u8]| {
        let mut out = Vec::new();
        chacha.open(&address(recipient), param, sealed, ad, &mut out).map(|()| out)
    };
    assert_eq!(open("C:q", &param, &sealed).unwrap(), b"for two");
    let refused = |what: &str, result: Result<Vec<u8>, CodecError>| {
        assert!(
            matches!(result, Err(CodecError::Corrupt(_)) | Err(CodecError::Missing(_))),
            "{what}: {result:?}"
        );
    };
    // Every single bit of the record and the payload, for both recipients.
    for recipient in ["B:orders", "C:q"] {
        for at in 0..param.len() * 8 {
            let mut bad = param.clone();
            bad[at / 8] ^= 1 << (at % 8);
            refused("a flipped record bit", open(recipient, &bad, &sealed));
        }
        for at in 0..sealed.len() * 8 {
            let mut bad = sealed.clone();
            bad[at / 8] ^= 1 << (at % 8);
            refused("a flipped payload bit", open(recipient, &param, &bad));
        }
    }
    // The wrap of C:q moved to the address of C:r (same length, same key by rule `C`).
    let moved: Vec<u8> = {
        let at = param.windows(3).position(|w| w == b"C:q").unwrap();
        let mut moved = param.clone();
        moved[at + 2] = b'r';
        moved
    };
    let error = open("C:r", &moved, &sealed).unwrap_err();
    assert_eq!(
        error,
        CodecError::Corrupt("authentication failed: the payload, its header or the key is wrong".into())
    );
    assert_eq!(open("C:r", &param, &sealed).unwrap_err(), CodecError::Corrupt("not sealed for C:r".into()));
    // A direct payload is bound to its one recipient too.
    let (param, sealed) = seal(&chacha, &["C:q"], b"for one", ad);
    assert_eq!(open("C:q", &param, &sealed).unwrap(), b"for one");
    refused("another recipient under the same key", open("C:r", &param, &sealed));
    for bad in [&[][..], &[1], &[1, 0], &[2, 0], &[1, 2], &param[..33]] {
        assert!(matches!(open("C:q", bad, &sealed), Err(CodecError::Corrupt(_))), "{bad:?}");
    }
}

/// A `require` entry ties a recipient to its keys: a payload sealed under another key the
/// node holds does not open for it, and the host learns which recipients take only sealed
/// payloads.
#[test]
fn a_required_recipient_opens_only_payloads_sealed_under_its_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (orders, audit) = (new_key(dir.path(), "orders.key"), new_key(dir.path(), "audit.key"));
    let origin = cipher(&format!(
        "kind: chacha20poly1305\nrules:\n  - {{ to: 'C:orders', key: '{}' }}\n  - {{ to: 'C:audit', key: '{}' }}",
        audit.display(),
        audit.display()
    ));
    let destination = cipher(&format!(
        "kind: chacha20poly1305\nkeys: ['{}']\nrequire: [ {{ to: 'C:orders*', keys: ['{}'] }} ]",
        audit.display(),
        orders.display()
    ));
    assert!(destination.requires(&address("C:orders")) && !destination.requires(&address("C:audit")));
    let (param, sealed) = seal(&origin, &["C:orders"], b"under the audit key", b"ad");
    let mut out = Vec::new();
    let error = destination.open(&address("C:orders"), &param, &sealed, b"ad", &mut out).unwrap_err();
    assert!(error.to_string().contains("does not take"), "{error}");
    let (param, sealed) = seal(&origin, &["C:audit"], b"for audit", b"ad");
    destination.open(&address("C:audit"), &param, &sealed, b"ad", &mut out).unwrap();
    assert_eq!(out, b"for audit");
    let without_keys =
        serde_saphyr::from_str("kind: chacha20poly1305\nrequire: [ { to: 'C:orders' } ]").unwrap();
    let error = linkbus_encrypt_chacha::ChaChaCipher::from_config(&without_keys).err().unwrap();
    assert!(format!("{error:?}").contains("name the key files"), "{error:?}");
}
