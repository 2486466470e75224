//! Which payloads a rule compresses, and what the record says: the first rule matching every
//! recipient applies, small payloads and mixed recipients go as they are, and a receiver
//! without the dictionary a frame needs says which one to add.

mod common;

use common::{address, compressor, orders, write_dictionary};
use linkbus_plugin_api::{Address, CodecError, Compressor};

fn packed(zstd: &dyn Compressor, to: &[&str], payload: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let to: Vec<Address> = to.iter().map(|a| address(a)).collect();
    let mut out = Vec::new();
    let param = zstd.compress(&to, payload, &mut out).unwrap()?;
    Some((param, out))
}

#[test]
fn the_first_rule_matching_every_recipient_applies() {
    let zstd = compressor(
        "kind: zstd
rules:
  - { to: 'C:orders*', min_bytes: 1000 }
  - { to: ['B:orders', 'D*'], level: 1 }",
    );
    let text = orders(10, 3).concat();
    assert!(text.len() > 1000);
    let (param, frame) = packed(&zstd, &["C:orders.eu", "C:orders"], &text).expect("rule 1 applies");
    assert!(param.is_empty(), "no dictionary, empty record");
    let mut out = Vec::new();
    zstd.decompress(&param, &frame, &mut out, text.len()).unwrap();
    assert_eq!(out, text);
    assert!(packed(&zstd, &["B:orders", "D1:x", "Dz:y"], &text).is_some(), "rule 2 matches all three");
    assert!(packed(&zstd, &["C:orders", "B:orders"], &text).is_none(), "no one rule matches both");
    assert!(packed(&zstd, &["C:orders", "C:audit"], &text).is_none(), "C:audit matches no rule");
    assert!(packed(&zstd, &["E:orders"], &text).is_none(), "no rule at all");
    assert!(packed(&zstd, &[], &text).is_none(), "no recipient, no rule");
    // Below `min_bytes` (1000 for rule 1, the default 64 for rule 2) payloads go as they are.
    assert!(packed(&zstd, &["C:orders"], &text[..999]).is_none());
    assert!(packed(&zstd, &["C:orders"], &text[..1000]).is_some());
    assert!(packed(&zstd, &["B:orders"], &[b'a'; 63]).is_none());
    assert!(packed(&zstd, &["B:orders"], &[b'a'; 64]).is_some());
    // Noise does not shrink: it goes as it is.
    let mut rng = common::Rng::new(5);
    let noise: Vec<u8> = (0..4096).map(|_| rng.below(256) as u8).collect();
    let mut out = vec![1, 2, 3];
    assert_eq!(zstd.compress(&[address("B:orders")], &noise, &mut out), Ok(None));
}

#[test]
fn a_frame_needs_its_dictionary_and_a_receiver_needs_no_rule() {
    let dir = tempfile::tempdir().unwrap();
    let dictionary = write_dictionary(dir.path());
    let sender = compressor(&format!(
        "kind: zstd\ndictionaries: {{ orders: '{}' }}\nrules: [{{ to: '*', dictionary: orders }}]",
        dictionary.display()
    ));
    let payload = &orders(1, 99)[0];
    let (param, frame) = packed(&sender, &["B:orders"], payload).unwrap();
    let id = linkbus_compress_zstd::dictionary_id(&std::fs::read(&dictionary).unwrap()).unwrap();
    assert_eq!(param, id.to_be_bytes(), "the record is the dictionary id");

    let receiver = compressor(&format!("kind: zstd\ndictionaries: {{ here: '{}' }}", dictionary.display()));
    let mut out = Vec::new();
    receiver.decompress(&param, &frame, &mut out, payload.len()).unwrap();
    assert_eq!(&out, payload);

    let without = compressor("kind: zstd\nrules: [{ to: '*' }]");
    let error = without.decompress(&param, &frame, &mut out, 1 << 20).unwrap_err();
    assert_eq!(
        error,
        CodecError::Missing(format!(
            "zstd dictionary {id} is not loaded here (add it to the zstd stage's dictionaries)"
        ))
    );
    // A frame made with the dictionary, given a record without it, is refused too.
    assert!(matches!(receiver.decompress(&[], &frame, &mut out, 1 << 20), Err(CodecError::Corrupt(_))));
    for bad in [&[1u8][..], &[0, 0, 1], &[0, 0, 0, 0, 1]] {
        assert!(matches!(receiver.decompress(bad, &frame, &mut out, 1 << 20), Err(CodecError::Corrupt(_))));
    }
}
