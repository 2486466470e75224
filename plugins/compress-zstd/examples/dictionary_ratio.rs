//! The compression ratio of 10,000 generated JSON order messages of 200 to 800 bytes, each
//! compressed on its own as a bus sends them, without a dictionary and with one trained
//! (`linkbus zstd train`'s way) on 3,000 other orders:
//! `cargo run --release -p linkbus-compress-zstd --example dictionary_ratio`.

#[path = "../tests/common/mod.rs"]
mod common;

use linkbus_plugin_api::Compressor;

/// Compressed bytes of `payloads` one by one (a payload that does not shrink counts as it
/// is), and how many did not shrink.
fn packed(zstd: &dyn Compressor, payloads: &[Vec<u8>]) -> (usize, usize) {
    let to = [common::address("C:orders")];
    let (mut bytes, mut kept) = (0, 0);
    for payload in payloads {
        let mut frame = Vec::new();
        match zstd.compress(&to, payload, &mut frame).expect("compress") {
            Some(_) => bytes += frame.len(),
            None => {
                bytes += payload.len();
                kept += 1;
            }
        }
    }
    (bytes, kept)
}

fn main() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let dictionary = common::write_dictionary(dir.path());
    let dictionary_bytes = std::fs::metadata(&dictionary).map(|m| m.len()).unwrap_or(0);
    let messages = common::orders(10_000, 42);
    let raw: usize = messages.iter().map(Vec::len).sum();
    println!("{} messages, {raw} bytes (200 to 800 each)", messages.len());
    for level in [1, 3, 9] {
        let without =
            common::compressor(&format!("kind: zstd\nrules: [{{ to: '*', level: {level}, min_bytes: 1 }}]"));
        let with = common::compressor(&format!(
            "kind: zstd\ndictionaries: {{ orders: '{}' }}\nrules: [{{ to: '*', level: {level}, min_bytes: 1, dictionary: orders }}]",
            dictionary.display()
        ));
        let ((plain, plain_kept), (trained, trained_kept)) =
            (packed(&without, &messages), packed(&with, &messages));
        println!(
            "level {level}: without a dictionary {plain} bytes, ratio {:.2} ({plain_kept} kept as they were); \
             with a {dictionary_bytes}-byte dictionary {trained} bytes, ratio {:.2} ({trained_kept} kept)",
            raw as f64 / plain as f64,
            raw as f64 / trained as f64
        );
    }
}
