//! Conformance kit (feature `testing`): the contracts of the extension points as code.
//! Every plugin's tests call the function for its kind.

use std::ops::Bound;

use crate::cipher::Cipher;
use crate::compressor::{CodecError, Compressor};
use crate::name::Address;
use crate::store::{Batch, SCAN_PAGE_KEYS, Store, scan_pages};

/// Checks the [`Store`] contract on a fresh, empty store: puts, deletes, key order, range and
/// limit of scans, batches applied whole and in order, space isolation, and sync.
///
/// # Panics
/// On the first violation, naming it.
pub fn check_store(store: &dyn Store) {
    assert!(store.spaces().expect("spaces").is_empty(), "a fresh store must be empty");
    let mut batch = Batch::new();
    for key in [3u8, 1, 2, 255, 0] {
        batch.put("a", vec![key], vec![key, key]);
    }
    batch.put("b", vec![1], "other space");
    batch.delete("a", vec![0]);
    batch.put("a", vec![2], "last write wins");
    store.write(batch, true).expect("write");

    let all = store.scan("a", Bound::Unbounded, Bound::Unbounded, usize::MAX).expect("scan");
    let keys: Vec<u8> = all.iter().map(|(k, _)| k[0]).collect();
    assert_eq!(keys, [1, 2, 3, 255], "scan must return keys in unsigned byte order");
    assert_eq!(&all[1].1[..], b"last write wins", "ops in a batch apply in order");
    assert_eq!(store.get("a", &[0]).expect("get"), None, "delete in the same batch");
    assert_eq!(store.get("b", &[1]).expect("get").as_deref(), Some(&b"other space"[..]));
    assert_eq!(store.get("c", &[1]).expect("get"), None, "unknown space reads as empty");

    let limited = store.scan("a", Bound::Included(&[2][..]), Bound::Excluded(&[255][..]), 1).expect("scan");
    assert_eq!(limited.len(), 1, "scan must honour its limit");
    assert_eq!(&limited[0].0[..], &[2], "scan must start at its lower bound");
    let ranged = store.scan("a", Bound::Excluded(&[1][..]), Bound::Included(&[3][..]), 10).expect("scan");
    assert_eq!(ranged.iter().map(|(k, _)| k[0]).collect::<Vec<_>>(), [2, 3]);
    let one = store.scan("a", Bound::Included(&[2][..]), Bound::Included(&[2][..]), 10).expect("scan");
    assert_eq!(one.len(), 1, "a range of one key included at both ends holds it");
    for (from, to) in [
        (Bound::Excluded(&[2][..]), Bound::Excluded(&[2][..])),
        (Bound::Included(&[2][..]), Bound::Excluded(&[2][..])),
        (Bound::Included(&[3][..]), Bound::Included(&[2][..])),
    ] {
        assert!(store.scan("a", from, to, 10).expect("scan").is_empty(), "{from:?}..{to:?} holds no key");
    }

    assert_eq!(store.spaces().expect("spaces"), ["a", "b"]);
    let mut clear = Batch::new();
    clear.delete("b", vec![1]);
    store.write(clear, false).expect("write");
    store.sync().expect("sync");
    assert_eq!(store.spaces().expect("spaces"), ["a"], "an emptied space disappears");
    check_scan_pages(store);
}

/// Recovery's whole-space reads: more keys than fit in two pages come back whole and in
/// order through [`scan_pages`], each page starting after the last key of the one before.
fn check_scan_pages(store: &dyn Store) {
    let count = 2 * SCAN_PAGE_KEYS as u32 + 3;
    let mut batch = Batch::new();
    for key in 0..count {
        batch.put("paged", key.to_be_bytes().to_vec(), key.to_le_bytes().to_vec());
    }
    store.write(batch, false).expect("write");
    let mut seen = 0u32;
    for entry in scan_pages(store, "paged") {
        let (key, value) = entry.expect("scan page");
        assert_eq!(&key[..], seen.to_be_bytes(), "pages must follow each other in key order");
        assert_eq!(&value[..], seen.to_le_bytes());
        seen += 1;
    }
    assert_eq!(seen, count, "paged scans must return every key once");
    let mut clear = Batch::new();
    for key in 0..count {
        clear.delete("paged", key.to_be_bytes().to_vec());
    }
    store.write(clear, true).expect("write");
}

/// Checks that a durable store keeps what was written — synced, or written and then synced
/// with [`Store::sync`] — after it is dropped and opened again with `open` (which must open
/// the same place each time, empty the first time).
///
/// # Panics
/// On the first violation, naming it.
pub fn check_store_reopens(open: &dyn Fn() -> Box<dyn Store>) {
    {
        let store = open();
        assert!(store.durable(), "a store checked for reopening must say it is durable");
        assert!(store.spaces().expect("spaces").is_empty(), "the first open must be empty");
        let mut batch = Batch::new();
        batch.put("q", vec![1], "one").put("q", vec![2], "two").put("meta", "key", "value");
        store.write(batch, true).expect("write");
        let mut later = Batch::new();
        later.delete("q", vec![1]).put("q", vec![3], "three");
        store.write(later, false).expect("write");
        store.sync().expect("sync");
    }
    let store = open();
    let q = store.scan("q", Bound::Unbounded, Bound::Unbounded, usize::MAX).expect("scan");
    let q: Vec<(u8, &[u8])> = q.iter().map(|(k, v)| (k[0], &v[..])).collect();
    assert_eq!(q, [(2, &b"two"[..]), (3, &b"three"[..])], "synced writes survive a reopen, in order");
    assert_eq!(store.get("meta", b"key").expect("get").as_deref(), Some(&b"value"[..]));
    assert_eq!(store.spaces().expect("spaces"), ["meta", "q"]);
}

/// Checks what a durable store does when its medium fails under it — here, when it runs out
/// of space: `open` opens the store on a medium small enough to fill with a few hundred
/// 64 KiB values (the same place each time, empty the first time), and `make_room` gives
/// the medium room again. The kit writes synced batches until one fails, then checks that
/// the store is poisoned (every later write and sync fails, so a host cannot acknowledge
/// what it may have lost), that what was synced before still reads back, and that after
/// `make_room` the reopened store holds every write it reported synced and takes writes
/// again. A store whose writes cannot fail (in memory) has nothing to check here.
///
/// # Panics
/// On the first violation, naming it; also when no write failed within 4,096 values.
pub fn check_store_fails_closed(open: &dyn Fn() -> Box<dyn Store>, make_room: &dyn Fn()) {
    const VALUE_BYTES: usize = 64 * 1024;
    // Incompressible values, so a compressing backend fills up too.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut value = || -> Vec<u8> {
        (0..VALUE_BYTES)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    };
    let mut synced: Vec<(u32, Vec<u8>)> = Vec::new();
    {
        let store = open();
        let mut failed = None;
        for key in 0..4096u32 {
            let v = value();
            let mut batch = Batch::new();
            batch.put("fill", key.to_be_bytes().to_vec(), v.clone());
            match store.write(batch, true) {
                Ok(()) => synced.push((key, v)),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let failure = failed.expect("no synced write failed: the medium given to the kit is too large");
        assert!(!synced.is_empty(), "the first write failed already ({failure}): give the medium some room");
        let mut later = Batch::new();
        later.put("fill", b"after".to_vec(), b"small".to_vec());
        assert!(store.write(later.clone(), false).is_err(), "a write after a failed sync must fail");
        assert!(store.write(later, true).is_err(), "a synced write after a failed sync must fail");
        assert!(store.sync().is_err(), "a sync after a failed sync must fail");
        let (first_key, first_value) = &synced[0];
        assert_eq!(
            store.get("fill", &first_key.to_be_bytes()).expect("reads go on after a failure").as_deref(),
            Some(&first_value[..]),
            "what was synced before the failure reads back"
        );
    }
    make_room();
    let store = open();
    for (key, v) in &synced {
        let got = store.get("fill", &key.to_be_bytes()).expect("get after reopening");
        assert!(got.as_deref() == Some(&v[..]), "synced write {key} lost or damaged after the failure");
    }
    let mut batch = Batch::new();
    batch.put("fill", b"after".to_vec(), b"room again".to_vec());
    store.write(batch, true).expect("a reopened store with room takes writes again");
    assert_eq!(store.get("fill", b"after").expect("get").as_deref(), Some(&b"room again"[..]));
}

/// [`check_store_fails_closed`] on a 4 MiB tmpfs mounted on the empty directory `dir`, grown
/// to 64 MiB to make room; `open` opens the store at the path it is given (inside the
/// tmpfs). Mounting needs root: elsewhere the check is skipped, saying so on standard
/// error. The tmpfs is unmounted afterwards, also when the check fails.
///
/// # Panics
/// As [`check_store_fails_closed`].
pub fn check_store_fails_closed_on_a_small_tmpfs(
    dir: &std::path::Path,
    open: &dyn Fn(&std::path::Path) -> Box<dyn Store>,
) {
    use std::process::Command;
    let mount = |options: &str| {
        let mut command = Command::new("mount");
        if !options.starts_with("remount") {
            command.args(["-t", "tmpfs", "tmpfs"]);
        }
        command.args(["-o", options]).arg(dir).status().is_ok_and(|s| s.success())
    };
    if !mount("size=4m") {
        eprintln!("SKIPPED: cannot mount a tmpfs here (the test needs root)");
        return;
    }
    let path = dir.join("store");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check_store_fails_closed(&|| open(&path), &|| {
            assert!(mount("remount,size=64m"), "cannot grow the tmpfs")
        });
    }));
    let _ = Command::new("umount").arg(dir).status();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// Payload sizes the codec kits try: empty, tiny, around small-message sizes, and large.
const CODEC_SIZES: [usize; 9] = [0, 1, 17, 200, 800, 4096, 65_536, 300_000, 1 << 20];

/// Deterministic pseudo-random bytes (xorshift), so a failure repeats.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect()
}

/// Inputs of `len` bytes: zeros, text that repeats with variation (like JSON), and noise.
fn codec_inputs(len: usize) -> [Vec<u8>; 3] {
    let text: Vec<u8> = (0..)
        .flat_map(|i: u32| {
            format!("{{\"order\":{i},\"sku\":\"A-{}\",\"qty\":{}}},", i % 97, i % 13).into_bytes()
        })
        .take(len)
        .collect();
    [vec![0; len], text, noise(len as u64, len)]
}

/// Checks the [`Compressor`] contract for a compressor configured to compress messages to
/// `to`: round trips of zeros, text and noise of many sizes, output caps that hold without
/// allocating past them (a bomb stays small), corrupt and truncated input refused without a
/// panic, and a record it did not write refused.
///
/// # Panics
/// On the first violation, naming it.
pub fn check_compressor(compressor: &dyn Compressor, to: &[Address]) {
    let mut compressed_any = false;
    for len in CODEC_SIZES {
        for (n, input) in codec_inputs(len).iter().enumerate() {
            let mut packed = Vec::new();
            let Some(param) = compressor.compress(to, input, &mut packed).expect("compress") else {
                continue;
            };
            compressed_any = true;
            assert!(
                packed.len() < input.len(),
                "a compressed payload must be smaller ({len} bytes, input {n})"
            );
            let mut out = Vec::new();
            compressor.decompress(&param, &packed, &mut out, len).expect("decompress at the exact size");
            assert!(out == *input, "round trip of {len} bytes (input {n}) changed them");
            if len > 0 {
                let mut capped = Vec::new();
                let error = compressor.decompress(&param, &packed, &mut capped, len - 1);
                assert_eq!(
                    error,
                    Err(CodecError::OutputTooLarge { limit: len - 1 }),
                    "a cap one byte short must refuse {len} bytes"
                );
                assert!(
                    capped.capacity() <= (2 * len).max(128 * 1024),
                    "a refused output must not grow far past its cap ({} for {len})",
                    capped.capacity()
                );
            }
            if packed.len() > 8 {
                let mut out = Vec::new();
                let truncated = compressor.decompress(&param, &packed[..packed.len() / 2], &mut out, len);
                assert!(truncated.is_err(), "a truncated payload must be refused ({len} bytes, input {n})");
                for at in [0, packed.len() / 3, packed.len() - 1] {
                    let mut flipped = packed.clone();
                    flipped[at] ^= 0x5a;
                    let mut out = Vec::new();
                    // A flipped byte must be refused or decode within the cap; never panic.
                    if compressor.decompress(&param, &flipped, &mut out, len).is_ok() {
                        assert!(out.len() <= len, "a corrupt payload decoded past its cap");
                    }
                }
            }
        }
    }
    assert!(compressed_any, "the compressor compressed nothing for {to:?}");
    let zeros = vec![0u8; 8 << 20];
    let mut bomb = Vec::new();
    let param = compressor.compress(to, &zeros, &mut bomb).expect("compress").expect("8 MiB of zeros shrink");
    let mut out = Vec::new();
    let error = compressor.decompress(&param, &bomb, &mut out, 4096);
    assert_eq!(error, Err(CodecError::OutputTooLarge { limit: 4096 }), "a bomb must stop at its cap");
    assert!(out.capacity() <= 128 * 1024, "a bomb must not make a large allocation ({})", out.capacity());
    let mut out = Vec::new();
    assert!(
        compressor.decompress(&noise(7, 40), &bomb, &mut out, 1 << 20).is_err(),
        "a record it did not write must be refused"
    );
}

/// Checks the [`Cipher`] contract for a cipher configured with keys for every address in
/// `to` (at least one; give two with different keys to check wrapped keys): round trips for
/// each recipient, fresh nonces, and refusal of a changed payload, record or associated data,
/// of a truncated payload, and of a recipient it was not sealed for (`stranger`).
///
/// # Panics
/// On the first violation, naming it.
pub fn check_cipher(cipher: &dyn Cipher, to: &[Address], stranger: &Address) {
    let ad = b"message id, kind, name: what the host binds";
    for len in CODEC_SIZES {
        let plaintext = noise(len as u64 + 3, len);
        let mut sealed = Vec::new();
        let param = cipher.seal(to, &plaintext, ad, &mut sealed).expect("seal").expect("keys for `to`");
        assert!(
            len < 32 || !sealed.windows(32).any(|w| plaintext.windows(32).next() == Some(w)),
            "plaintext shows"
        );
        let mut again = Vec::new();
        let param_again = cipher.seal(to, &plaintext, ad, &mut again).expect("seal").expect("keys");
        assert!(again != sealed || param_again != param, "two seals of one payload must differ (nonce)");
        for recipient in to {
            let mut out = Vec::new();
            cipher.open(recipient, &param, &sealed, ad, &mut out).expect("open for a recipient");
            assert!(out == plaintext, "round trip of {len} bytes for {recipient} changed them");
            let refused = |what: &str, param: &[u8], sealed: &[u8], ad: &[u8]| {
                let mut out = Vec::new();
                assert!(
                    cipher.open(recipient, param, sealed, ad, &mut out).is_err(),
                    "{what} must be refused"
                );
            };
            refused("other associated data", &param, &sealed, b"message id, kind, name: what the host bound");
            refused("a truncated payload", &param, &sealed[..sealed.len() / 2], ad);
            refused("an empty payload", &param, &[], ad);
            for at in [0, sealed.len() / 2, sealed.len().saturating_sub(1)] {
                let mut flipped = sealed.clone();
                if let Some(byte) = flipped.get_mut(at) {
                    *byte ^= 1;
                    refused("a flipped payload byte", &param, &flipped, ad);
                }
            }
            for at in [0, param.len() / 2, param.len().saturating_sub(1)] {
                let mut flipped = param.clone();
                if let Some(byte) = flipped.get_mut(at) {
                    *byte ^= 1;
                    refused("a flipped record byte", &flipped, &sealed, ad);
                }
            }
            refused("a truncated record", &param[..param.len() / 2], &sealed, ad);
        }
        let mut out = Vec::new();
        assert!(cipher.open(stranger, &param, &sealed, ad, &mut out).is_err(), "a stranger must not open it");
    }
}
