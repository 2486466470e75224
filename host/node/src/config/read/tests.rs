//! The configuration reader: defaults, the commented example, overrides, and every kind of
//! bad input reported at once with its path.

use super::*;

fn load(text: &str) -> Result<Config, ConfigErrors> {
    from_value(&parse_yaml(text)?)
}

fn messages(text: &str) -> Vec<String> {
    load(text).unwrap_err().0.iter().map(ToString::to_string).collect()
}

#[test]
fn the_commented_example_equals_the_defaults() {
    let text = include_str!("../../../../../examples/config/node.yaml");
    let example = load(text).unwrap();
    assert_eq!(example, Config::defaults_for(NodeName::new("A").unwrap()));
}

#[test]
fn a_name_is_all_a_node_needs() {
    let config = load("node: { name: A }").unwrap();
    assert_eq!(config, Config::defaults_for(NodeName::new("A").unwrap()));
}

#[test]
fn every_error_is_reported_at_once_with_its_path() {
    let errors = messages(
        "
node: { name: 1bad, listen: 'localhost' }
peers:
  - { name: B, address: 'nope' }
  - { name: B, address: 127.0.0.1:1 }
queues:
  - { name: a }
  - { name: b, order: lifo }
  - { name: a, colour: red }
links: { ping_interval_ms: 0 }
security: { cipher: rot13 }
typo: 1
",
    );
    let expected = [
        "node.name: node name '1bad' must start with a letter",
        "peers[1].name: peer 'B' is listed twice",
        "queues[1].order: unknown order 'lifo'; expected fifo or priority",
        "queues[2].colour: unknown key",
        "queues[2].name: queue 'a' is declared twice",
        "links.ping_interval_ms: 0 is out of range",
        "security.cipher: unknown cipher 'rot13'; expected auto, aes-256-gcm, chacha20-poly1305",
        "typo: unknown key",
    ];
    for e in expected {
        assert!(errors.iter().any(|m| m.starts_with(e)), "missing '{e}' in {errors:#?}");
    }
}

#[test]
fn addresses_and_relations_are_checked() {
    let errors = messages(
        "
node: { name: A, listen: 'localhost' }
peers: [ { name: B, address: 'nope' }, { name: A } ]
links: { packet_bytes_max: 2000000 }
",
    );
    for e in [
        "peers[0].address: bad address 'nope'",
        "peers[1].name: 'A' is this node's own name",
        "links.frame_bytes_max: 1048576 is too small",
        "node.listen: bad address 'localhost'",
    ] {
        assert!(errors.iter().any(|m| m.starts_with(e)), "missing '{e}' in {errors:#?}");
    }
}

#[test]
fn bad_yaml_and_wrong_types_are_explained() {
    let syntax = messages("node: { name: [unclosed");
    assert!(syntax[0].contains("line"), "{syntax:?}");
    let strict = messages(&format!(
        "node: {{ name: A }}\npeers: [ {{ name: B, permanent: yes, public_key: {} }} ]",
        "ab".repeat(32)
    ));
    assert_eq!(strict, ["peers[0].permanent: expected true or false, found a string"]);
    let types = messages("node: []\nqueues: 3");
    assert!(types.contains(&"node: expected a mapping, found a list".to_owned()), "{types:?}");
    assert!(types.contains(&"queues: expected a list, found an integer".to_owned()), "{types:?}");
    assert_eq!(messages("node: { name: A }\nnode: { name: B }").len(), 1, "duplicate keys are refused");
    assert_eq!(messages(""), ["node.name: is required"]);
}

#[test]
fn unknown_plugins_are_named_with_the_alternatives() {
    let errors = messages("node: { name: A }\nplugins: { store: { kind: rocks } }");
    assert_eq!(
        errors,
        [
            "plugins.store.kind: no store plugin named 'rocks'; available: fjall, log, memory (or a native library's: `library:`)"
        ]
    );
    let errors = messages("node: { name: A }\nplugins: { transport: { kind: tcp, nagle: on } }");
    assert!(errors[0].starts_with("plugins.transport.nagle: unknown key"), "{errors:?}");
}

#[test]
fn reserved_queue_names_are_refused() {
    assert_eq!(
        messages("node: { name: A }\nqueues: [ { name: DLQ } ]"),
        ["queues[0].name: queue name 'DLQ' is reserved for the node"]
    );
}

#[test]
fn overrides_build_a_config_without_a_file() {
    let overrides = Overrides {
        name: Some("A".into()),
        listen: Some("127.0.0.1:7401".into()),
        peers: vec!["B=127.0.0.1:7402".into(), "C".into()],
        queues: vec!["orders".into(), "audit:fifo".into()],
        data_dir: Some("/var/lib/x".into()),
        insecure_plaintext: true,
        ..Overrides::default()
    };
    let mut tree = ConfigValue::Null;
    apply_overrides(&mut tree, &overrides);
    let c = from_value(&tree).unwrap();
    assert_eq!(c.node.listen.as_deref(), Some("127.0.0.1:7401"));
    assert_eq!(c.peers.len(), 2);
    assert_eq!(c.peers[0].address.as_deref(), Some("127.0.0.1:7402"));
    assert_eq!(c.peers[1].address, None);
    assert_eq!(c.queues[1].order, QueueOrder::Fifo);
    assert_eq!(c.node.data_dir, PathBuf::from("/var/lib/x"));
}

#[test]
fn overrides_replace_values_from_the_file() {
    let mut tree = parse_yaml(
        "node: { name: A, listen: 127.0.0.1:1 }\npeers: [ { name: B, address: 127.0.0.1:2 } ]\nqueues: [ { name: q, order: fifo } ]\nsecurity: { insecure_plaintext: true }",
    )
    .unwrap();
    let overrides = Overrides {
        listen: Some("127.0.0.1:3".into()),
        peers: vec!["B=127.0.0.1:4".into()],
        queues: vec!["q:priority".into()],
        ..Overrides::default()
    };
    apply_overrides(&mut tree, &overrides);
    let c = from_value(&tree).unwrap();
    assert_eq!(c.node.listen.as_deref(), Some("127.0.0.1:3"));
    assert_eq!(c.peers.len(), 1);
    assert_eq!(c.peers[0].address.as_deref(), Some("127.0.0.1:4"));
    assert_eq!(c.queues[0].order, QueueOrder::Priority);
}

#[test]
fn a_bad_override_is_reported_like_a_bad_key() {
    let mut tree = ConfigValue::Null;
    apply_overrides(
        &mut tree,
        &Overrides {
            name: Some("A".into()),
            peers: vec!["B=x:y".into()],
            insecure_plaintext: true,
            ..Overrides::default()
        },
    );
    let errors = from_value(&tree).unwrap_err();
    assert_eq!(errors.0[0].path, "peers[0].address");
}

fn tree() -> impl proptest::strategy::Strategy<Value = ConfigValue> {
    use proptest::prelude::*;
    let keys = prop_oneof![
        Just("node".to_owned()),
        Just("name".to_owned()),
        Just("peers".to_owned()),
        Just("queues".to_owned()),
        Just("links".to_owned()),
        Just("plugins".to_owned()),
        Just("kind".to_owned()),
        Just("address".to_owned()),
        "[a-z_]{1,12}",
    ];
    let leaf = prop_oneof![
        Just(ConfigValue::Null),
        any::<bool>().prop_map(ConfigValue::Bool),
        any::<u64>().prop_map(ConfigValue::Uint),
        any::<i64>().prop_map(ConfigValue::Int),
        "[ -~]{0,24}".prop_map(ConfigValue::Str),
    ];
    leaf.prop_recursive(4, 64, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(ConfigValue::Seq),
            proptest::collection::vec((keys.clone(), inner), 0..6).prop_map(|mut entries| {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                entries.dedup_by(|a, b| a.0 == b.0);
                ConfigValue::Map(entries)
            }),
        ]
    })
}

proptest::proptest! {
    /// Any document, however wrong, is read without a panic: a configuration or a list of
    /// errors, each with a path.
    #[test]
    fn any_tree_reads_without_panicking(tree in tree()) {
        if let Err(errors) = from_value(&tree) {
            proptest::prop_assert!(!errors.0.is_empty());
        }
    }
}

#[test]
fn priority_quotas_are_ten_positive_integers() {
    let good =
        load("node: { name: A }\nlinks: { priority_quotas: [1, 1, 1, 1, 1, 1, 1, 1, 1, 50], file_quota: 2 }");
    let links = good.unwrap().links;
    assert_eq!(links.priority_quotas[9], 50);
    assert_eq!(links.file_quota, 2);
    let short = messages("node: { name: A }\nlinks: { priority_quotas: [1, 2, 3] }");
    assert!(short.iter().any(|m| m.starts_with("links.priority_quotas: expected 10 quotas")), "{short:?}");
    let zero = messages("node: { name: A }\nlinks: { priority_quotas: [0, 1, 1, 1, 1, 1, 1, 1, 1, x] }");
    for e in
        ["links.priority_quotas[0]: expected an integer in 1..=1000, found 0", "links.priority_quotas[9]:"]
    {
        assert!(zero.iter().any(|m| m.starts_with(e)), "missing '{e}' in {zero:?}");
    }
}

#[test]
fn event_subscriptions_name_known_kinds_and_reachable_queues() {
    let good = load(
        "node: { name: A }\nqueues: [ { name: ops } ]\npeers: [ { name: B, public_key: '0000000000000000000000000000000000000000000000000000000000000000' } ]\n\
         events: { subscriptions: [ { kinds: [all], to: 'A:ops' }, { kinds: [link_up], to: 'B:x' } ] }",
    );
    let events = good.unwrap().events;
    assert_eq!(events.subscriptions[0].kinds.len(), crate::events::EventKind::ALL.len());
    let bad = messages(
        "node: { name: A }\nevents: { subscriptions: [ { kinds: [link_flap], to: 'A:nope' }, { kinds: [link_up], to: 'Z:q' }, { to: 'A:DLQ' } ] }",
    );
    for e in [
        "events.subscriptions[0].kinds[0]: unknown event kind 'link_flap'",
        "events.subscriptions[0].to: queue 'nope' is not declared on this node",
        "events.subscriptions[1].to: node 'Z' is not a peer",
        "events.subscriptions[2].kinds: is required",
    ] {
        assert!(bad.iter().any(|m| m.starts_with(e)), "missing '{e}' in {bad:#?}");
    }
}

#[test]
fn routes_name_a_pattern_and_a_peer_and_come_also_from_the_command_line() {
    let mut tree = parse_yaml(
        "node: { name: A }\npeers: [ { name: B, address: 127.0.0.1:2 } ]\nsecurity: { insecure_plaintext: true }\n\
         routes: [ { to: 'C*', via: B } ]",
    )
    .unwrap();
    apply_overrides(&mut tree, &Overrides { routes: vec!["D?=B".into()], ..Overrides::default() });
    let c = from_value(&tree).unwrap();
    let routes: Vec<(&str, &str)> = c.routes.iter().map(|r| (r.to.as_str(), r.via.as_str())).collect();
    assert_eq!(routes, [("C*", "B"), ("D?", "B")], "the command line's come after the file's");

    let errors = messages(
        "node: { name: A }\npeers: [ { name: B, address: 127.0.0.1:2 } ]\nsecurity: { insecure_plaintext: true }\n\
         routes: [ { to: 'C*1', via: B }, { to: 'D', via: Z }, { via: B }, { to: E, via: B, colour: red } ]",
    );
    assert_eq!(
        errors,
        [
            "routes[0].to: route pattern 'C*1': '*' may only end a pattern",
            "routes[1].via: 'Z' is not a peer of this node",
            "routes[2].to: is required",
            "routes[3].colour: unknown key; expected one of: to, via",
        ],
        "{errors:#?}"
    );
}

#[test]
fn the_pace_bound_of_puts_is_read_and_zero_turns_it_off() {
    assert_eq!(load("node: { name: A }").unwrap().links.queue_pace_bytes, 4 << 20, "the default");
    let config = load("node: { name: A }\nlinks: { queue_pace_bytes: 0 }").unwrap();
    assert_eq!(config.links.queue_pace_bytes, 0, "0: puts are never held back");
    let config = load("node: { name: A }\nlinks: { queue_pace_bytes: 1048576 }").unwrap();
    assert_eq!(config.links.queue_pace_bytes, 1 << 20);
    let errors = messages("node: { name: A }\nlinks: { queue_pace_bytes: -1 }");
    assert!(errors.iter().any(|m| m.starts_with("links.queue_pace_bytes:")), "{errors:#?}");
}

#[test]
fn the_acknowledgement_delay_is_zero_to_a_second() {
    let config = load("node: { name: A }\nlinks: { ack_delay_ms: 0 }").unwrap();
    assert_eq!(config.links.ack_delay_ms, 0, "0: every acknowledgement is written at once");
    assert_eq!(load("node: { name: A }\nlinks: { ack_delay_ms: 1000 }").unwrap().links.ack_delay_ms, 1000);
    let errors = messages("node: { name: A }\nlinks: { ack_delay_ms: 1001 }");
    assert!(errors.iter().any(|m| m.starts_with("links.ack_delay_ms: 1001 is out of range")), "{errors:#?}");
    let errors = messages("node: { name: A }\nlinks: { ack_delay_ms: 50, retransmit_timeout_ms: 50 }");
    let want = "links.ack_delay_ms: must be less than links.retransmit_timeout_ms";
    assert!(errors.iter().any(|m| m.starts_with(want)), "{errors:#?}");
}

#[test]
fn a_backout_queue_must_be_another_queue_here_and_needs_a_threshold() {
    let config = load(
        "node: { name: A }\nqueues: [ { name: q, backout_threshold: 3, backout_queue: poison }, { name: poison } ]",
    )
    .unwrap();
    assert_eq!(config.queues[0].backout_threshold, Some(3));
    assert_eq!(config.queues[0].backout_queue.as_ref().map(QueueName::as_str), Some("poison"));
    assert_eq!(config.queues[1].backout_threshold, None);
    let errors = messages(
        "node: { name: A }\nqueues: [ { name: q, backout_threshold: 3, backout_queue: nowhere }, \
         { name: r, backout_threshold: 1, backout_queue: r }, { name: s, backout_queue: q }, \
         { name: t, backout_threshold: 0 } ]",
    )
    .join("\n");
    assert!(errors.contains("queues[0].backout_queue: no queue 'nowhere' on this node"), "{errors}");
    assert!(errors.contains("queues[1].backout_queue: 'r' is this queue itself"), "{errors}");
    assert!(errors.contains("queues[2].backout_queue: needs backout_threshold"), "{errors}");
    assert!(errors.contains("queues[3].backout_threshold: 0 is out of range"), "{errors}");
}
