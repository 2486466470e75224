//! Conformance kit (feature `testing`): the contracts of the extension points as code.
//! Every plugin's tests call the function for its kind.

use std::ops::Bound;

use crate::store::{Batch, Store};

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

    assert_eq!(store.spaces().expect("spaces"), ["a", "b"]);
    let mut clear = Batch::new();
    clear.delete("b", vec![1]);
    store.write(clear, false).expect("write");
    store.sync().expect("sync");
    assert_eq!(store.spaces().expect("spaces"), ["a"], "an emptied space disappears");
}
