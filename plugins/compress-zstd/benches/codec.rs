//! Micro-benchmarks of the `zstd` compressor through the [`Compressor`] trait, at level 3:
//! JSON-like order text of 1 KiB and 1 MiB compressed and decompressed, in MB/s of plaintext.

#[path = "../tests/common/mod.rs"]
mod common;

use divan::Bencher;
use divan::counter::BytesCount;
use linkbus_plugin_api::Compressor;

fn main() {
    divan::main();
}

/// Order text of `len` bytes: generated orders, one after another.
fn text(len: usize) -> Vec<u8> {
    let mut text: Vec<u8> = common::orders(len / 200 + 1, 7).concat();
    text.truncate(len);
    text
}

#[divan::bench(args = [1024, 1 << 20])]
fn compress(bencher: Bencher, len: usize) {
    let zstd = common::compressor("kind: zstd\nrules: [{ to: '*', level: 3 }]");
    let (to, input) = ([common::address("C:orders")], text(len));
    bencher.counter(BytesCount::new(len)).bench_local(|| {
        let mut out = Vec::with_capacity(len);
        zstd.compress(&to, &input, &mut out).expect("compress").expect("text shrinks");
        out
    });
}

#[divan::bench(args = [1024, 1 << 20])]
fn decompress(bencher: Bencher, len: usize) {
    let zstd = common::compressor("kind: zstd\nrules: [{ to: '*', level: 3 }]");
    let (to, input) = ([common::address("C:orders")], text(len));
    let mut packed = Vec::new();
    let param = zstd.compress(&to, &input, &mut packed).expect("compress").expect("text shrinks");
    bencher.counter(BytesCount::new(len)).bench_local(|| {
        let mut out = Vec::new();
        zstd.decompress(&param, &packed, &mut out, len).expect("decompress");
        out
    });
}
