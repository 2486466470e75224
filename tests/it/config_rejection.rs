//! `linkbus config check` reports every error of a file at once, each with its YAML path,
//! and `linkbus node run` refuses to start with the same report.

use crate::support;

use support::{Scratch, stderr, stdout};

const BAD: &str = "
node: { name: this_name_is_far_too_long, listen: 127.0.0.1:0 }
peers:
  - { name: B, address: 'not an address' }
queues:
  - { name: orders }
  - { name: orders, order: sideways }
  - { nmae: typo }
colour: blue
";

#[test]
fn every_error_is_reported_and_the_node_refuses_to_start() {
    let s = Scratch::new();
    let bad = s.write("bad.yaml", BAD);
    let check = s.run(&["config", "check", bad.to_str().unwrap()]);
    assert!(!check.status.success(), "config check fails");
    let report = stdout(&check);
    for expected in [
        "node.name: node name 'this_name_is_far_too_long' is 25 characters long, at most 20 are allowed",
        "peers[0].address: bad address 'not an address'",
        "queues[1].order: unknown order 'sideways'",
        "queues[1].name: queue 'orders' is declared twice",
        "queues[2].nmae: unknown key",
        "queues[2].name: is required",
        "colour: unknown key",
    ] {
        assert!(report.contains(expected), "missing '{expected}' in:\n{report}");
    }
    let run = s.run(&["node", "run", "-c", bad.to_str().unwrap()]);
    assert!(!run.status.success(), "the node refuses to start");
    for line in report.lines().skip(1) {
        assert!(stderr(&run).contains(line.trim()), "node run reports '{line}':\n{}", stderr(&run));
    }
}

#[test]
fn a_good_file_passes_and_syntax_errors_name_the_line() {
    let s = Scratch::new();
    let good = s.write("good.yaml", "node: { name: A }\nqueues: [ { name: orders } ]\n");
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/config");
    // The quick-start pair is a template: keys made with `linkbus keygen` go in.
    let (a_key, b_key) = (s.keys("A"), s.keys("B"));
    let dir = s.path().display().to_string();
    let fill = |file: &str| {
        let text = std::fs::read_to_string(format!("{examples}/{file}")).unwrap();
        let text = text
            .replace("PUBLIC_KEY_OF_A", &a_key)
            .replace("PUBLIC_KEY_OF_B", &b_key)
            .replace("KEYS_DIR", &dir);
        s.write(file, &text).to_str().unwrap().to_owned()
    };
    let (a, b) = (fill("a.yaml"), fill("b.yaml"));
    let node = format!("{examples}/node.yaml");
    let check = s.run(&["config", "check", good.to_str().unwrap(), &node, &a, &b]);
    assert!(check.status.success(), "{}", stdout(&check));
    assert!(stdout(&check).contains("ok (node A, 0 peers, 0 routes, 1 queues)"), "{}", stdout(&check));

    let broken = s.write("broken.yaml", "node:\n  name: A\n  listen: [unclosed\n");
    let check = s.run(&["config", "check", broken.to_str().unwrap()]);
    assert!(!check.status.success());
    assert!(stdout(&check).contains("line 3"), "{}", stdout(&check));

    let missing = s.run(&["config", "check", "/nonexistent/linkbus.yaml"]);
    assert!(!missing.status.success());
    assert!(stdout(&missing).contains("cannot read"), "{}", stdout(&missing));
}

/// Checked together, a cluster's files must agree on keys: a peer's public key that is not
/// the key in that node's key file, or two different cluster keys, are named with the key
/// to fix; the same files with the right keys pass.
#[test]
fn config_check_finds_a_peer_key_that_does_not_match_the_other_nodes_key_file() {
    let s = Scratch::new();
    let cluster = support::cluster::Cluster::write(&s, &[("A", "B")], &[]);
    let files = |c: &support::cluster::Cluster| -> Vec<String> { c.configs.values().cloned().collect() };
    let check = |files: &[String]| {
        let args: Vec<&str> =
            ["config", "check"].into_iter().chain(files.iter().map(String::as_str)).collect();
        s.run(&args)
    };
    let good = check(&files(&cluster));
    assert!(good.status.success(), "{}", stdout(&good));
    assert!(stdout(&good).contains("cluster: ok"), "{}", stdout(&good));

    // B gets a new key file; A still lists the old key.
    let b_key = s.path().join("B.key");
    std::fs::remove_file(&b_key).unwrap();
    let new_key = s.keys("B");
    let report = check(&files(&cluster));
    assert!(!report.status.success());
    let text = stdout(&report);
    assert!(
        text.contains("cluster: node A's peers[B].public_key is")
            && text.contains(&format!("but B's key file ({}) holds the key of {new_key}", b_key.display())),
        "{text}"
    );

    // And a second cluster key for A.
    let other_psk = s.path().join("other.psk");
    assert!(s.run(&["keygen", "--psk", "--out", other_psk.to_str().unwrap()]).status.success());
    let a_yaml = std::fs::read_to_string(&cluster.configs["A"]).unwrap();
    std::fs::write(&cluster.configs["A"], a_yaml.replace("cluster.psk", "other.psk")).unwrap();
    let text = stdout(&check(&files(&cluster)));
    assert!(
        text.contains(
            "cluster: nodes A and B link to each other but hold different cluster keys (security.psk_file)"
        ),
        "{text}"
    );
}
