//! A dictionary trained on order messages makes small order messages much smaller: the
//! reason the plugin takes dictionaries.

mod common;

use common::{address, compressor, orders, write_dictionary};
use linkbus_plugin_api::Compressor;

/// Total compressed bytes of `payloads` (each must shrink), checking each round trip.
fn packed_bytes(zstd: &dyn Compressor, payloads: &[Vec<u8>]) -> usize {
    let to = [address("C:orders")];
    payloads
        .iter()
        .map(|payload| {
            let mut frame = Vec::new();
            let param = zstd.compress(&to, payload, &mut frame).unwrap().expect("an order shrinks");
            let mut out = Vec::new();
            zstd.decompress(&param, &frame, &mut out, payload.len()).unwrap();
            assert_eq!(&out, payload);
            frame.len()
        })
        .sum()
}

#[test]
fn small_messages_compress_much_better_with_a_trained_dictionary() {
    let dir = tempfile::tempdir().unwrap();
    let dictionary = write_dictionary(dir.path());
    let with = compressor(&format!(
        "kind: zstd\ndictionaries: {{ orders: '{}' }}\nrules: [{{ to: 'C:orders*', dictionary: orders }}]",
        dictionary.display()
    ));
    let without = compressor("kind: zstd\nrules: [{ to: 'C:orders*' }]");
    // Orders the dictionary was not trained on.
    let fresh = orders(200, 42);
    let raw: usize = fresh.iter().map(Vec::len).sum();
    let (plain, trained) = (packed_bytes(&without, &fresh), packed_bytes(&with, &fresh));
    println!("{raw} bytes: {plain} without a dictionary, {trained} with");
    assert!(trained * 2 < plain, "the dictionary should at least halve them: {trained} against {plain}");
}
