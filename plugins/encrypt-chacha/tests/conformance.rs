//! The cipher passes the plugin API's conformance kit: two recipients under different keys
//! (a wrapped data key), two under the same key, and one recipient alone (sealed directly);
//! in each case a stranger with no wrap, or with a key but another address, cannot open it.

mod common;

use common::{address, cipher, new_key};
use linkbus_plugin_api::testing::check_cipher;

#[test]
fn passes_the_kit_for_wrapped_and_direct_records() {
    let dir = tempfile::tempdir().unwrap();
    let (orders, audit) = (new_key(dir.path(), "orders.key"), new_key(dir.path(), "audit.key"));
    let chacha = cipher(&format!(
        "kind: chacha20poly1305
rules:
  - {{ to: 'B:orders*', key: '{}' }}
  - {{ to: ['C:audit', 'D'], key: '{}' }}",
        orders.display(),
        audit.display()
    ));
    // The stranger matches a rule, so holds a key, but nothing was sealed for it.
    let stranger = address("D:other");
    check_cipher(&chacha, &[address("B:orders"), address("C:audit")], &stranger);
    check_cipher(&chacha, &[address("C:audit"), address("D:x"), address("B:orders.eu")], &stranger);
    check_cipher(&chacha, &[address("C:audit"), address("D:x")], &stranger);
    check_cipher(&chacha, &[address("B:orders")], &stranger);
    check_cipher(&chacha, &[address("D:x")], &address("E:x"));
}
