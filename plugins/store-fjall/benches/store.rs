//! Micro-benchmarks of the `fjall` store's batch write ([`linkbus_store_fjall::FjallStore`]
//! through the [`linkbus_plugin_api::Store`] trait): batches of 1, 64 and 256 records of
//! 1 KiB, written without a sync (into the journal and the operating system's buffers) and
//! with one (`fdatasync` of the journal), in a temporary directory on the machine's disk.
//!
//! Keys grow from batch to batch, as a queue's write-through keys do.

use bytes::Bytes;
use divan::Bencher;
use divan::counter::{BytesCount, ItemsCount};
use linkbus_plugin_api::{Batch, Store};
use linkbus_store_fjall::FjallStore;

/// Records per batch.
const RECORDS: [usize; 3] = [1, 64, 256];

/// Bytes of each record's value.
const RECORD_BYTES: usize = 1024;

/// The space written, named like a local queue's.
const SPACE: &str = "q.bench";

fn main() {
    divan::main();
}

/// Measures writing batches of `records` records, synced or not, to a fresh store.
fn bench_write(bencher: Bencher, records: usize, sync: bool) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = FjallStore::open(dir.path()).expect("the store opens");
    let value = Bytes::from(vec![0x5a; RECORD_BYTES]);
    // The space exists before the first measured write, as a running node's queues do.
    let mut first = Batch::new();
    first.put(SPACE, Bytes::copy_from_slice(&0u64.to_be_bytes()), value.clone());
    store.write(first, true).expect("the first write succeeds");
    let mut next_key = 0u64;
    bencher
        .counter(ItemsCount::new(records))
        .counter(BytesCount::new(records * RECORD_BYTES))
        .with_inputs(|| {
            let mut batch = Batch::new();
            for _ in 0..records {
                next_key += 1;
                batch.put(SPACE, Bytes::copy_from_slice(&next_key.to_be_bytes()), value.clone());
            }
            batch
        })
        .bench_local_values(|batch| store.write(batch, sync).expect("the write succeeds"));
}

/// `Store::write(batch, false)`.
#[divan::bench(args = RECORDS)]
fn write(bencher: Bencher, records: usize) {
    bench_write(bencher, records, false);
}

/// `Store::write(batch, true)`: returns once the journal is on stable storage.
#[divan::bench(args = RECORDS)]
fn write_synced(bencher: Bencher, records: usize) {
    bench_write(bencher, records, true);
}
