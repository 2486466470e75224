//! Micro-benchmarks of the `chacha20poly1305` payload cipher through the [`Cipher`] trait:
//! payloads of 1 KiB and 1 MiB sealed for one recipient and opened, in MB/s of plaintext
//! (each seal draws a fresh 192-bit nonce from the operating system).

use divan::Bencher;
use divan::counter::BytesCount;
use linkbus_encrypt_chacha::ChaChaCipher;
use linkbus_plugin_api::{Address, Cipher};

fn main() {
    divan::main();
}

/// A cipher sealing for every recipient under a fresh key in `dir`.
fn cipher(dir: &std::path::Path) -> ChaChaCipher {
    let key = dir.join("bench.pkey");
    linkbus_encrypt_chacha::write_new_key_file(&key).expect("a key file");
    let yaml = format!("kind: chacha20poly1305\nrules: [{{ to: '*', key: '{}' }}]", key.display());
    ChaChaCipher::from_config(&serde_saphyr::from_str(&yaml).expect("yaml")).expect("the cipher builds")
}

const AD: &[u8] = b"a message's id, kind, name and headers, as the host binds them";

#[divan::bench(args = [1024, 1 << 20])]
fn seal(bencher: Bencher, len: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (cipher, to, plaintext) =
        (cipher(dir.path()), ["C:orders".parse::<Address>().expect("address")], vec![7u8; len]);
    bencher.counter(BytesCount::new(len)).bench_local(|| {
        let mut out = Vec::with_capacity(len + 16);
        cipher.seal(&to, &plaintext, AD, &mut out).expect("seal").expect("a key");
        out
    });
}

#[divan::bench(args = [1024, 1 << 20])]
fn open(bencher: Bencher, len: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (cipher, to, plaintext) =
        (cipher(dir.path()), ["C:orders".parse::<Address>().expect("address")], vec![7u8; len]);
    let mut sealed = Vec::new();
    let param = cipher.seal(&to, &plaintext, AD, &mut sealed).expect("seal").expect("a key");
    bencher.counter(BytesCount::new(len)).bench_local(|| {
        let mut out = Vec::with_capacity(len);
        cipher.open(&to[0], &param, &sealed, AD, &mut out).expect("open");
        out
    });
}
