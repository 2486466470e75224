//! What the integration tests share: sample payloads, a trained dictionary, configurations
//! written as YAML, and addresses.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use linkbus_compress_zstd::ZstdCompressor;
use linkbus_plugin_api::{Address, ConfigValue};

/// Parses `text` as a configuration section.
pub(crate) fn yaml(text: &str) -> ConfigValue {
    serde_saphyr::from_str(text).unwrap()
}

/// A compressor configured by the YAML `text`.
pub(crate) fn compressor(text: &str) -> ZstdCompressor {
    ZstdCompressor::from_config(&yaml(text)).unwrap()
}

/// The address `text` (`NODE:QUEUE`).
pub(crate) fn address(text: &str) -> Address {
    text.parse().unwrap()
}

/// A deterministic generator (xorshift), so a failure repeats.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

/// `count` JSON order messages of 200 to 800 bytes, as a shop would send them.
pub(crate) fn orders(count: usize, seed: u64) -> Vec<Vec<u8>> {
    const CUSTOMERS: [&str; 8] =
        ["acme-gmbh", "globex", "initech", "umbrella", "hooli", "stark-ind", "wayne-ent", "soylent"];
    const CURRENCIES: [&str; 4] = ["EUR", "USD", "GBP", "CHF"];
    const STATES: [&str; 4] = ["new", "paid", "packed", "shipped"];
    let mut rng = Rng::new(seed);
    (0..count)
        .map(|n| {
            let lines: Vec<String> = (0..1 + rng.below(5))
                .map(|_| {
                    format!(
                        "{{\"sku\":\"SKU-{:05}\",\"qty\":{},\"price\":{}.{:02},\"currency\":\"{}\"}}",
                        rng.below(20_000),
                        1 + rng.below(40),
                        rng.below(900),
                        rng.below(100),
                        rng.pick(&CURRENCIES)
                    )
                })
                .collect();
            let order = format!(
                "{{\"id\":\"ord-{:08}\",\"customer\":\"{}\",\"status\":\"{}\",\"timestamp\":\"2026-0{}-{:02}T{:02}:{:02}:{:02}Z\",\
                 \"lines\":[{}],\"shipping\":{{\"method\":\"standard\",\"country\":\"DE\"}},\"note\":\"{}\"}}",
                1_000_000 + n as u64 * 7 + rng.below(7),
                rng.pick(&CUSTOMERS),
                rng.pick(&STATES),
                1 + rng.below(9),
                1 + rng.below(28),
                rng.below(24),
                rng.below(60),
                rng.below(60),
                lines.join(","),
                "x".repeat(rng.below(120) as usize),
            );
            let mut bytes = order.into_bytes();
            bytes.truncate(800);
            while bytes.len() < 200 {
                bytes.push(b' ');
            }
            bytes
        })
        .collect()
}

/// Trains a dictionary on generated orders and writes it to `dir/orders.dict`.
pub(crate) fn write_dictionary(dir: &Path) -> PathBuf {
    let dictionary = linkbus_compress_zstd::train(&orders(3000, 1), 16 * 1024).unwrap();
    let path = dir.join("orders.dict");
    std::fs::write(&path, dictionary).unwrap();
    path
}
