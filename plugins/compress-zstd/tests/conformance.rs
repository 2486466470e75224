//! The compressor passes the plugin API's conformance kit, with and without a dictionary:
//! round trips of many sizes, caps that hold without large allocations, corrupt and
//! truncated frames refused, and a record it did not write refused.

mod common;

use common::{address, compressor, write_dictionary};
use linkbus_plugin_api::testing::check_compressor;

#[test]
fn without_a_dictionary() {
    let zstd = compressor("kind: zstd\nrules: [{ to: '*' }]");
    check_compressor(&zstd, &[address("B:orders"), address("C:audit")]);
}

#[test]
fn with_a_dictionary() {
    let dir = tempfile::tempdir().unwrap();
    let dictionary = write_dictionary(dir.path());
    let zstd = compressor(&format!(
        "kind: zstd\ndictionaries: {{ orders: '{}' }}\nrules: [{{ to: '*', level: 9, dictionary: orders }}]",
        dictionary.display()
    ));
    check_compressor(&zstd, &[address("B:orders")]);
}
