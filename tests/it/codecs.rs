//! Codec stages on real processes, A → B → C: zstd compression and end-to-end payload
//! encryption chosen at the origin per destination pattern, routed through a relay that
//! holds no key, opened at the destination only on a get. Also what must not open: a payload
//! or a header changed at the relay, a wrong key, a missing dictionary, a zstd bomb.

use std::path::Path;
use std::time::Duration;

use crate::support;
use support::cluster::Cluster;
use support::{Scratch, stderr, stdout};

const LINKS: [(&str, &str); 2] = [("A", "B"), ("B", "C")];

/// A payload key made with `linkbus keygen --payload`; returns its path.
fn payload_key(s: &Scratch, name: &str) -> String {
    let path = s.path().join(format!("{name}.pkey"));
    let path = path.to_str().expect("utf-8 path").to_owned();
    let out = s.run(&["keygen", "--payload", "--out", &path]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim().len(), 16, "the key id is printed: {}", stdout(&out));
    path
}

/// A's stages: zstd, then the payload cipher with `key`, both for `C:orders*`.
fn origin_stages(key: &str, more: &str) -> String {
    format!(
        "plugins:\n  stages:\n    - {{ kind: zstd, rules: [ {{ to: 'C:orders*', level: 3, min_bytes: 32 }} ] }}\n    \
         - {{ kind: chacha20poly1305, rules: [ {{ to: 'C:orders*', key: '{key}' }} ]{more} }}\n"
    )
}

/// C's stages: zstd to decompress, and the payload keys it opens with.
fn destination_stages(keys: &[&str]) -> String {
    let keys: Vec<String> = keys.iter().map(|k| format!("'{k}'")).collect();
    format!(
        "plugins:\n  stages:\n    - {{ kind: zstd }}\n    - {{ kind: chacha20poly1305, keys: [ {} ] }}\n",
        keys.join(", ")
    )
}

/// C's stages, `C:orders*` taking only payloads sealed under `key`.
fn requiring_stages(key: &str) -> String {
    format!(
        "plugins:\n  stages:\n    - {{ kind: zstd }}\n    - {{ kind: chacha20poly1305, require: [ {{ to: 'C:orders*', keys: [ '{key}' ] }} ] }}\n"
    )
}

/// The routes and queues of the chain.
fn chain(a: &str, c: &str) -> [(&'static str, String); 3] {
    [
        ("A", format!("routes: [ {{ to: C, via: B }} ]\n{a}")),
        ("B", String::new()),
        (
            "C",
            format!(
                "routes: [ {{ to: A, via: B }} ]\nqueues: [ {{ name: orders }}, {{ name: plain }} ]\n{c}"
            ),
        ),
    ]
}

fn extra<'a>(nodes: &'a [(&'static str, String); 3]) -> Vec<(&'static str, &'a str)> {
    nodes.iter().map(|(n, e)| (*n, e.as_str())).collect()
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_holding(&path, needle));
        } else if std::fs::read(&path).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)) {
            found.push(path.display().to_string());
        }
    }
    found
}

/// Puts `lines` (one message each) from A to `to`, persistent, waiting for their results;
/// returns the results (and, when one is not `delivered`, what the command said).
fn put_lines(s: &Scratch, to: &str, lines: &str) -> String {
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", to, "--persistent", "--wait-result", "20s", "-"],
        lines.as_bytes(),
        Duration::from_secs(60),
    );
    if put.status.success() { stdout(&put) } else { stdout(&put) + &stderr(&put) }
}

fn order(n: usize, marker: &str) -> String {
    format!(
        "{{\"order\":{n},\"customer\":\"{marker}-{n}\",\"lines\":[{{\"sku\":\"A-{}\",\"qty\":{}}},{{\"sku\":\"B-7\",\"qty\":1}}],\"currency\":\"EUR\",\"note\":\"deliver to the back door, ring twice\"}}",
        n % 17,
        n % 5 + 1
    )
}

#[test]
fn sealed_messages_cross_the_relay_and_no_data_directory_holds_their_plaintext() {
    let s = Scratch::new();
    let key = payload_key(&s, "orders");
    let nodes = chain(&origin_stages(&key, ""), &destination_stages(&[&key]));
    let (_cluster, _nodes) = Cluster::up(&s, &LINKS, &extra(&nodes));
    let lines: String = (0..200).map(|n| order(n, "SECRET-MARKER") + "\n").collect();
    let results = put_lines(&s, "C:orders", &lines);
    assert_eq!(results.matches("C:orders delivered").count(), 200, "{results}");
    // The negative control: what no rule names travels as written, and is found.
    let plain: String = (0..20).map(|n| order(n, "PLAIN-MARKER") + "\n").collect();
    assert_eq!(put_lines(&s, "C:plain", &plain).matches("delivered").count(), 20);
    std::thread::sleep(Duration::from_millis(500));

    let data = s.path().join("linkbus-data");
    let sealed = files_holding(&data, b"SECRET-MARKER");
    assert!(sealed.is_empty(), "the plaintext is at rest in {sealed:?}");
    let control = files_holding(&data.join("C"), b"PLAIN-MARKER");
    assert!(!control.is_empty(), "the grep finds plaintext where there is some (store compression?)");

    let got = stdout(&s.run(&["get", "--node", "C", "orders", "--count", "1000", "--wait", "5s"]));
    assert_eq!(got, lines, "C opens every message, intact and in order");
    let reserved =
        s.run(&["put", "--node", "A", "--to", "C:orders", "--header", "linkbus.decoded=zstd", "x"]);
    assert!(
        !reserved.status.success() && stderr(&reserved).contains("written by nodes only"),
        "{}",
        stderr(&reserved)
    );
    assert!(files_holding(&data, b"SECRET-MARKER").is_empty(), "a get leaves no plaintext behind");
}

#[test]
fn a_message_changed_at_the_relay_is_dead_lettered_at_the_destination() {
    for (tamper, what) in
        [("payload", "a payload byte"), ("header", "the name"), ("strip", "the seal stripped")]
    {
        let s = Scratch::new();
        let key = payload_key(&s, "orders");
        let nodes = chain(&origin_stages(&key, ""), &requiring_stages(&key));
        let cluster = Cluster::write(&s, &LINKS, &extra(&nodes));
        let _a = cluster.start(&s, "A");
        let b = cluster.start_env(&s, "B", &[("LINKBUS_TEST_TAMPER_RELAYED", tamper)]);
        let _c = cluster.start(&s, "C");
        b.wait_for_log("Link up.", 2, Duration::from_secs(20));
        let results = put_lines(&s, "C:orders", &(order(1, "M") + "\n"));
        assert!(results.contains("C:orders failed decrypt_failed"), "{what}: {results}");
        let dlq = stdout(&s.run(&["dlq", "ls", "--node", "C"]));
        assert!(dlq.contains("decrypt_failed"), "{what}: {dlq}");
        let got = stdout(&s.run(&["get", "--node", "C", "orders", "--wait", "500ms"]));
        assert!(got.is_empty(), "{what}: nothing changed reaches the queue: {got}");
    }
}

#[test]
fn a_wrong_key_a_missing_dictionary_and_a_bomb_are_dead_lettered_with_their_reasons() {
    let s = Scratch::new();
    let key = payload_key(&s, "orders");
    let other = payload_key(&s, "other");
    let dict = s.path().join("orders.dict");
    let samples = s.write("samples.jsonl", &(0..2000).map(|n| order(n, "S") + "\n").collect::<String>());
    let train = s.run(&[
        "zstd",
        "train",
        "--lines",
        "--out",
        dict.to_str().expect("utf-8"),
        samples.to_str().expect("utf-8"),
    ]);
    assert!(train.status.success(), "{}", stderr(&train));
    let dict = dict.display().to_string();
    let a = format!(
        "messages: {{ message_bytes_max: 67108864 }}\nplugins:\n  stages:\n    - kind: zstd\n      \
         dictionaries: {{ orders: '{dict}' }}\n      rules:\n        - {{ to: 'C:orders.dict', dictionary: orders }}\n        \
         - {{ to: 'C:*' }}\n    - {{ kind: chacha20poly1305, rules: [ {{ to: 'C:orders', key: '{key}' }} ] }}\n"
    );
    let nodes = chain(&a, &destination_stages(&[&other]));
    let mut nodes = nodes;
    nodes[2].1 = nodes[2].1.replace("{ name: plain }", "{ name: plain }, { name: orders.dict }");
    nodes[1].1 = "messages: { message_bytes_max: 67108864 }\n".into();
    let (_cluster, _nodes) = Cluster::up(&s, &LINKS, &extra(&nodes));

    let wrong = put_lines(&s, "C:orders", &(order(1, "W") + "\n"));
    assert!(wrong.contains("C:orders failed decrypt_failed"), "a key C does not have: {wrong}");
    let missing = put_lines(&s, "C:orders.dict", &(order(2, "D") + "\n"));
    assert!(
        missing.contains("C:orders.dict failed decode_failed"),
        "a dictionary C does not have: {missing}"
    );
    // 32 MiB of zeros compress to a few KiB; C takes at most its 4 MiB default.
    let bomb = vec![b'a'; 32 << 20];
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "C:plain", "--persistent", "--wait-result", "20s", "-"],
        &bomb,
        Duration::from_secs(60),
    );
    assert!(stdout(&put).contains("C:plain failed too_large"), "{}{}", stdout(&put), stderr(&put));
    let dlq = stdout(&s.run(&["dlq", "ls", "--node", "C"]));
    for code in ["decrypt_failed", "decode_failed", "too_large"] {
        assert!(dlq.contains(code), "{code} in {dlq}");
    }
}

#[test]
fn messages_sealed_under_a_rotated_key_still_open_and_none_is_lost() {
    let s = Scratch::new();
    let old = payload_key(&s, "old");
    let new = payload_key(&s, "new");
    let nodes = chain(&origin_stages(&old, ""), &destination_stages(&[&old, &new]));
    let cluster = Cluster::write(&s, &LINKS, &extra(&nodes));
    let mut a = cluster.start(&s, "A");
    let _b = cluster.start(&s, "B");
    // C is down: what A sends under the old key waits on the way.
    a.wait_for_log("Link up.", 1, Duration::from_secs(20));
    let first: String = (0..50).map(|n| order(n, "R") + "\n").collect();
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "C:orders", "--persistent", "-"],
        first.as_bytes(),
        Duration::from_secs(30),
    );
    assert!(put.status.success(), "{}", stderr(&put));
    // A takes up the new key at a restart (a reload says so), and C comes up holding both.
    let config = &cluster.configs["A"];
    let text = std::fs::read_to_string(config).expect("a.yaml").replace(&old, &new);
    std::fs::write(config, text).expect("a.yaml");
    let reload = stdout(&s.run(&["reload", "--node", "A"]));
    assert!(reload.contains("taken up only at the next restart: plugins.stages"), "{reload}");
    assert!(a.stop(), "A stops cleanly");
    let _a = cluster.start(&s, "A");
    let _c = cluster.start(&s, "C");
    let second: String = (50..100).map(|n| order(n, "R") + "\n").collect();
    let results = put_lines(&s, "C:orders", &second);
    assert_eq!(results.matches("delivered").count(), 50, "{results}");
    let got = stdout(&s.run(&["get", "--node", "C", "orders", "--count", "1000", "--wait", "5s"]));
    assert_eq!(got, first + &second, "both keys' messages open, in order, none lost");
}

#[test]
fn bad_stage_configurations_are_refused_with_their_paths() {
    let s = Scratch::new();
    let key = payload_key(&s, "k");
    let open = s.path().join("open.pkey");
    std::fs::copy(&key, &open).expect("copy");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    for (yaml, says) in [
        ("plugins: { stages: [ { kind: gzip } ] }", "no stage plugin named 'gzip'"),
        (
            &*format!(
                "plugins: {{ stages: [ {{ kind: chacha20poly1305, keys: ['{key}'] }}, {{ kind: zstd }} ] }}"
            ),
            "comes after cipher",
        ),
        (
            &*format!(
                "plugins: {{ stages: [ {{ kind: chacha20poly1305, keys: ['{}'] }} ] }}",
                open.display()
            ),
            "chmod 600",
        ),
        ("plugins: { stages: [ { kind: zstd, rules: [ { to: 'C:q*x' } ] } ] }", "may only end"),
        ("plugins: { stages: [ { kind: zstd, rules: [ { to: C, level: 40 } ] } ] }", "level"),
    ] {
        let file = s.write("bad.yaml", &format!("node: {{ name: A }}\n{yaml}\n"));
        let out = s.run(&["config", "check", file.to_str().expect("utf-8")]);
        assert!(!out.status.success(), "{yaml} was taken");
        let text = stderr(&out) + &stdout(&out);
        assert!(text.contains(says) && text.contains("plugins.stages["), "{yaml}: {text}");
    }
}

/// The README's end-to-end example as written (`examples/config/e2e/`), with keys made by
/// `linkbus keygen` and free ports: what A sends to C:orders arrives compressed, sealed,
/// and opened only by C's get; B held it sealed.
#[test]
fn the_end_to_end_example_runs_as_written() {
    let s = Scratch::new();
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/config/e2e");
    let keys: Vec<(String, String)> = ["A", "B", "C"].iter().map(|n| (n.to_string(), s.keys(n))).collect();
    let dir = s.path().display().to_string();
    let out = s.run(&["keygen", "--payload", "--out", &format!("{dir}/orders.pkey")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let ports: Vec<String> = (0..3).map(|_| support::free_port().to_string()).collect();
    let mut configs = Vec::new();
    for name in ["a", "b", "c"] {
        let mut text = std::fs::read_to_string(format!("{examples}/{name}.yaml")).expect("example");
        for (node, key) in &keys {
            text = text.replace(&format!("PUBLIC_KEY_OF_{node}"), key);
        }
        for (default, port) in ["7501", "7502", "7503"].iter().zip(&ports) {
            text = text.replace(&format!("127.0.0.1:{default}"), &format!("127.0.0.1:{port}"));
        }
        configs.push(s.write(&format!("{name}.yaml"), &text.replace("KEYS_DIR", &dir)));
    }
    let paths: Vec<&str> = configs.iter().map(|p| p.to_str().expect("utf-8")).collect();
    let check = s.run(&["config", "check", paths[0], paths[1], paths[2]]);
    assert!(check.status.success(), "{}{}", stdout(&check), stderr(&check));
    // B first: A and C dial it.
    let b = s.start_node("B", &["-c", paths[1]]);
    let _ends = [s.start_node("A", &["-c", paths[0]]), s.start_node("C", &["-c", paths[2]])];
    b.wait_for_log("Link up.", 2, Duration::from_secs(20));
    let lines: String = (0..20).map(|n| order(n, "EXAMPLE-MARKER") + "\n").collect();
    assert_eq!(put_lines(&s, "C:orders", &lines).matches("C:orders delivered").count(), 20);
    let status = stdout(&s.run(&["status", "--node", "A"]));
    assert!(
        status.contains("zstd: 20 messages") && status.contains("chacha20poly1305: 20 messages"),
        "{status}"
    );
    assert!(files_holding(&s.path().join("linkbus-data"), b"EXAMPLE-MARKER").is_empty());
    let got = stdout(&s.run(&["get", "--node", "C", "orders", "--count", "100", "--wait", "5s"]));
    assert_eq!(got, lines);
}

/// A sealed message for a queue on the relay, which cannot open it, and for C: the relay
/// dead-letters its own copy and still relays C's, which C opens.
#[test]
fn a_recipient_that_cannot_open_fails_alone() {
    let s = Scratch::new();
    let key = payload_key(&s, "orders");
    let a = format!(
        "plugins:\n  stages:\n    - {{ kind: chacha20poly1305, rules: [ {{ to: ['C:orders*', 'B:q'], key: '{key}' }} ] }}\n"
    );
    let mut nodes = chain(&a, &destination_stages(&[&key]));
    nodes[1].1 = "queues: [ { name: q } ]\n".into();
    let (_cluster, _nodes) = Cluster::up(&s, &LINKS, &extra(&nodes));
    let put = s.run(&[
        "put",
        "--node",
        "A",
        "--to",
        "C:orders",
        "--to",
        "B:q",
        "--persistent",
        "--wait-result",
        "20s",
        "for both",
    ]);
    let out = stdout(&put);
    assert!(
        out.contains("C:orders delivered") && out.contains("B:q failed decrypt_failed"),
        "{out}{}",
        stderr(&put)
    );
    assert_eq!(stdout(&s.run(&["get", "--node", "C", "orders", "--wait", "5s"])), "for both\n");
    assert!(stdout(&s.run(&["dlq", "ls", "--node", "B"])).contains("decrypt_failed  to B:q"));
}

/// The same chain with A's stages from a native library (the fixture library exports the
/// `zstd` and `chacha20poly1305` plugins): what A compresses and seals through the library,
/// C's built-in stages open, and `linkbus plugins` says where A's stages came from.
#[test]
fn stages_from_a_native_library_interoperate_with_the_built_in_ones() {
    let s = Scratch::new();
    let key = payload_key(&s, "orders");
    let library = crate::native::built_library("liblinkbus_native_fixtures.so");
    let library = library.display();
    let origin = format!(
        "plugins:\n  stages:\n    - {{ kind: zstd, library: '{library}', rules: [ {{ to: 'C:orders*', min_bytes: 32 }} ] }}\n    \
         - {{ kind: chacha20poly1305, library: '{library}', rules: [ {{ to: 'C:orders*', key: '{key}' }} ] }}\n"
    );
    let nodes = chain(&origin, &requiring_stages(&key));
    let (_cluster, _nodes) = Cluster::up(&s, &LINKS, &extra(&nodes));
    let lines: String = (0..100).map(|n| order(n, "NATIVE-MARKER") + "\n").collect();
    let results = put_lines(&s, "C:orders", &lines);
    assert_eq!(results.matches("C:orders delivered").count(), 100, "{results}");
    std::thread::sleep(Duration::from_millis(500));
    let at_rest = files_holding(&s.path().join("linkbus-data"), b"NATIVE-MARKER");
    assert!(at_rest.is_empty(), "the plaintext is at rest in {at_rest:?}");
    let got = stdout(&s.run(&["get", "--node", "C", "orders", "--count", "1000", "--wait", "5s"]));
    assert_eq!(got, lines, "C's built-in stages open what the library's sealed");
    let plugins = stdout(&s.run(&["plugins", "--node", "A"]));
    for kind in ["compressor", "cipher"] {
        let from_library =
            plugins.lines().any(|l| l.starts_with(kind) && l.contains(" yes ") && l.contains("library "));
        assert!(from_library, "A's {kind} comes from the library: {plugins}");
    }
    let status = stdout(&s.run(&["status", "--node", "A"]));
    assert!(status.contains("zstd") && status.contains("chacha20poly1305"), "{status}");
}
