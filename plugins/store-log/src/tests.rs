use super::*;

fn open(dir: &Path, segment_bytes: u64) -> LogStore {
    LogStore::open(dir, segment_bytes).unwrap()
}

fn segment_files(dir: &Path) -> Vec<u64> {
    let mut numbers: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str().and_then(segment_number))
        .collect();
    numbers.sort_unstable();
    numbers
}

fn put(store: &LogStore, space: &str, key: u32, value: &[u8], sync: bool) {
    let mut batch = Batch::new();
    batch.put(space, key.to_be_bytes().to_vec(), value.to_vec());
    store.write(batch, sync).unwrap();
}

fn delete(store: &LogStore, space: &str, key: u32) {
    let mut batch = Batch::new();
    batch.delete(space, key.to_be_bytes().to_vec());
    store.write(batch, false).unwrap();
}

#[test]
fn passes_the_conformance_kit() {
    let dir = tempfile::tempdir().unwrap();
    linkbus_plugin_api::testing::check_store(&open(dir.path(), 64 << 20));
    let small = tempfile::tempdir().unwrap();
    linkbus_plugin_api::testing::check_store(&open(small.path(), 64));
}

#[test]
fn synced_data_survives_a_reopen_and_a_second_process_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    linkbus_plugin_api::testing::check_store_reopens(&|| {
        Box::new(open(dir.path(), 64 << 20)) as Box<dyn Store>
    });
    let first = open(dir.path(), 64 << 20);
    let second = LogStore::open(dir.path(), 64 << 20).unwrap_err().to_string();
    assert!(second.contains("another node"), "{second}");
    drop(first);
}

/// Where the written part of segment `path` ends (the rest is zeros).
fn written(path: &Path) -> Vec<u8> {
    let mut data = std::fs::read(path).unwrap();
    let end = data.iter().rposition(|b| *b != 0).map_or(0, |at| at + 1);
    data.truncate(end);
    data
}

#[test]
fn a_torn_last_frame_is_cut_off_and_damage_elsewhere_refuses_to_open() {
    const SEGMENT: u64 = 4096;
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path(), SEGMENT);
        put(&store, "q", 1, b"one", true);
        put(&store, "q", 2, b"two", true);
    }
    let path = dir.path().join(segment_name(1));
    let two = written(&path);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), SEGMENT, "made at its full size");
    // A third write cut short, as a crash in the middle of it leaves it: its last bytes
    // never reached the file.
    {
        let store = open(dir.path(), SEGMENT);
        put(&store, "q", 3, &[9; 100], true);
    }
    let mut three = std::fs::read(&path).unwrap();
    let end = written(&path).len();
    three[end - 7..end].fill(0);
    std::fs::write(&path, &three).unwrap();
    {
        let store = open(dir.path(), SEGMENT);
        assert!(written(&path) == two, "cut back to the last whole frame");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), SEGMENT, "still at its full size");
        assert_eq!(store.get("q", &2u32.to_be_bytes()).unwrap().as_deref(), Some(&b"two"[..]));
        assert_eq!(store.get("q", &3u32.to_be_bytes()).unwrap(), None);
        put(&store, "q", 4, b"four", true);
        assert_eq!(store.get("q", &4u32.to_be_bytes()).unwrap().as_deref(), Some(&b"four"[..]));
    }
    {
        let store = open(dir.path(), SEGMENT);
        let keys: Vec<u8> = store
            .scan("q", Bound::Unbounded, Bound::Unbounded, 10)
            .unwrap()
            .iter()
            .map(|(k, _)| k[3])
            .collect();
        assert_eq!(keys, [1, 2, 4], "a write after the cut reads back after the next open");
    }
    // A flipped bit in a frame with whole frames after it is damage, not a torn write:
    // refused, named.
    let mut damaged = std::fs::read(&path).unwrap();
    damaged[FRAME_HEAD + OP_HEAD + 1] ^= 1;
    std::fs::write(&path, &damaged).unwrap();
    let refused = LogStore::open(dir.path(), SEGMENT).unwrap_err().to_string();
    assert!(refused.contains(&segment_name(1)) && refused.contains("offset 0"), "{refused}");
}

/// Offsets of the frames in the written part of segment `path`.
fn frames(path: &Path) -> Vec<usize> {
    let data = written(path);
    let mut at = 0;
    let mut starts = Vec::new();
    while at < data.len() {
        starts.push(at);
        at += decode(&data[at..], at as u64).unwrap().1;
    }
    starts
}

#[test]
fn after_a_power_loss_an_unsynced_frame_lost_before_later_ones_is_cut_with_them() {
    const SEGMENT: u64 = 4096;
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path(), SEGMENT);
        put(&store, "q", 1, b"synced", true);
        put(&store, "q", 2, b"not synced", false);
        put(&store, "q", 3, b"not synced either", false);
    }
    let path = dir.path().join(segment_name(1));
    let starts = frames(&path);
    assert_eq!(starts.len(), 3);
    // The second frame's page never reached the disk; the third's did.
    let mut data = std::fs::read(&path).unwrap();
    data[starts[1]..starts[2]].fill(0);
    std::fs::write(&path, &data).unwrap();
    let store = open(dir.path(), SEGMENT);
    let keys: Vec<u8> =
        store.scan("q", Bound::Unbounded, Bound::Unbounded, 10).unwrap().iter().map(|(k, _)| k[3]).collect();
    assert_eq!(keys, [1], "the synced write stays; the unsynced ones after the hole go");
    assert_eq!(frames(&path), [0], "cut back to the synced frame");
}

#[test]
fn a_segment_goes_only_after_the_writes_that_emptied_it_are_synced() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 4096);
    put(&store, "q", 1, &[1; 1000], true);
    for key in 2..8 {
        put(&store, "other", key, &[2; 1000], true);
        delete(&store, "other", key);
    }
    assert!(segment_files(dir.path()).contains(&1), "segment 1 still holds key 1");
    // A delete that is not synced by its caller empties segment 1.
    delete(&store, "q", 1);
    assert!(!segment_files(dir.path()).contains(&1), "segment 1 is gone");
    let inner = store.lock();
    let active = &inner.segments[&inner.active];
    assert_eq!(active.synced, active.bytes, "the delete was synced before the segment went");
}

#[test]
fn a_missing_segment_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path(), 4096);
        for key in 0..20 {
            put(&store, "q", key, &[3; 1000], false);
        }
    }
    let files = segment_files(dir.path());
    assert!(files.len() >= 3, "{files:?}");
    std::fs::remove_file(dir.path().join(segment_name(files[1]))).unwrap();
    let refused = LogStore::open(dir.path(), 4096).unwrap_err().to_string();
    assert!(refused.contains(&format!("segment {} is missing", segment_name(files[1]))), "{refused}");
}

#[test]
fn segments_roll_over_and_go_once_nothing_current_is_left_in_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 4096);
    // A queue that is read as fast as it is written: each put deleted soon after.
    for key in 0..2000u32 {
        put(&store, "q", key, &[key as u8; 200], key % 50 == 0);
        if key >= 10 {
            delete(&store, "q", key - 10);
        }
    }
    store.sync().unwrap();
    let files = segment_files(dir.path());
    assert!(files.len() <= 4, "old segments are deleted: {files:?}");
    assert!(*files.first().unwrap() > 100, "the early ones are gone: {files:?}");
    drop(store);
    let store = open(dir.path(), 4096);
    let left = store.scan("q", Bound::Unbounded, Bound::Unbounded, usize::MAX).unwrap();
    let keys: Vec<u32> = left.iter().map(|(k, _)| u32::from_be_bytes(k[..].try_into().unwrap())).collect();
    assert_eq!(keys, (1990..2000).collect::<Vec<_>>());
    assert!(left.iter().all(|(k, v)| v[..] == [k[3]; 200]));
}

#[test]
fn a_long_lived_value_is_moved_forward_so_the_log_stays_small() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 4096);
    put(&store, "keep", 7, b"stays for good", true);
    for key in 0..3000u32 {
        put(&store, "q", key, &[1; 300], false);
        delete(&store, "q", key);
    }
    store.sync().unwrap();
    let files = segment_files(dir.path());
    assert!(files.len() <= 6, "compaction keeps the log near its current data: {files:?}");
    assert!(!files.contains(&1), "the first segment, holding the long-lived value, was compacted");
    drop(store);
    let store = open(dir.path(), 4096);
    assert_eq!(store.get("keep", &7u32.to_be_bytes()).unwrap().as_deref(), Some(&b"stays for good"[..]));
    assert_eq!(store.spaces().unwrap(), ["keep"]);
}

/// The kit's failure case on a 4 MiB tmpfs (mounted when the tests run as root; skipped,
/// saying so, elsewhere).
#[test]
fn a_full_disk_poisons_the_store_and_loses_no_synced_write() {
    let dir = tempfile::tempdir().unwrap();
    linkbus_plugin_api::testing::check_store_fails_closed_on_a_small_tmpfs(dir.path(), &|path| {
        Box::new(open(path, 8 << 20)) as Box<dyn Store>
    });
}
