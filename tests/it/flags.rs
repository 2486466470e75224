//! Nodes started from flags alone, found by name through `LINKBUS_RUNTIME_DIR` or by
//! `--socket`.

use crate::support;

use std::time::Duration;

use support::{Scratch, stderr, stdout};

#[test]
fn nodes_run_from_flags_and_clients_find_them() {
    let s = Scratch::new();
    let b_data = s.path().join("b-data");
    let b = s.start_node(
        "B",
        &[
            "--name",
            "B",
            "--listen",
            "127.0.0.1:0",
            "--peer",
            "A",
            "--queue",
            "orders:fifo",
            "--data-dir",
            b_data.to_str().unwrap(),
            "--insecure-plaintext",
        ],
    );
    let a_data = s.path().join("a-data");
    let peer = format!("B={}", b.listen_address());
    let a = s.start_node(
        "A",
        &[
            "--name",
            "A",
            "--listen",
            "127.0.0.1:0",
            "--peer",
            &peer,
            "--queue",
            "orders",
            "--data-dir",
            a_data.to_str().unwrap(),
            "--insecure-plaintext",
        ],
    );
    a.wait_for_log("Link up.", 1, Duration::from_secs(10));
    assert!(s.runtime_dir().join("A.sock").exists(), "the socket is in the runtime directory");

    // A recipient list: one copy to B:orders, one to A's own orders queue.
    let put =
        s.run(&["put", "--node", "A", "--to", "B:orders", "--to", "A:orders", "--priority", "7", "fan-out"]);
    assert!(put.status.success(), "{}", stderr(&put));
    let socket = b.socket.to_str().unwrap().to_owned();
    let get_b = s.run(&["get", "--socket", &socket, "orders", "--wait", "5s"]);
    assert_eq!(stdout(&get_b), "fan-out\n", "{}", stderr(&get_b));
    let get_a = s.run(&["get", "--node", "A", "orders", "--wait", "5s"]);
    assert_eq!(stdout(&get_a), "fan-out\n", "{}", stderr(&get_a));
}

#[test]
fn a_client_names_a_node_that_is_not_running() {
    let s = Scratch::new();
    let out = s.run(&["put", "--node", "Nobody", "--to", "B:orders", "x"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("is node Nobody running?"), "{}", stderr(&out));
}
