//! The committed example filters (`wasm-plugins/built/`), run through the `wasm` plugin as a
//! node runs them: each verdict they give, their state, their counters, and a module pin.

use std::path::PathBuf;

use linkbus_filter_wasm::plugin::{LIMITS_DEFAULT, WasmFilter, WasmSettings, hex};
use linkbus_plugin_api::{Content, Filter, HeaderChange, Hook, Message, MessageId, Verdict};

fn built(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../wasm-plugins/built").join(format!("{name}.wasm"))
}

fn filter(name: &str, config: &str) -> WasmFilter {
    WasmFilter::new(settings(name, config)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn settings(name: &str, config: &str) -> WasmSettings {
    WasmSettings {
        name: name.into(),
        module: built(name),
        sha256: None,
        limits: LIMITS_DEFAULT,
        traps_max: 3,
        config: config.into(),
    }
}

fn message(sequence: u64, payload: &str, headers: &[(&str, &str)]) -> Message {
    let id = MessageId { source: "A".parse().unwrap(), sequence, created_unix_ms: 0 };
    let mut content = Content::buf("C:orders".parse().unwrap(), payload.to_owned());
    content.headers = headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    Message::new(id, content)
}

fn verdicts(filter: &WasmFilter, hook: Hook, messages: &[Message]) -> Vec<Verdict> {
    let shown: Vec<&Message> = messages.iter().collect();
    filter.filter(hook, &shown).unwrap().verdicts
}

#[test]
fn drop_by_header_drops_what_its_header_names() {
    let f = filter("drop_by_header", r#"{"key":"kind","value":"spam"}"#);
    let got = verdicts(&f, Hook::OnDeliver, &[message(1, "a", &[("kind", "spam")]), message(2, "b", &[])]);
    assert_eq!(got, [Verdict::Drop { reason: "header kind is spam".into() }, Verdict::Pass]);
    assert_eq!(f.counters(), [("dropped".to_owned(), 1)]);
    let refused = WasmFilter::new(settings("drop_by_header", "{}")).err().unwrap();
    assert!(refused.contains("configuration needs \"key\""), "{refused}");
}

#[test]
fn redact_json_masks_the_field_but_its_last_digits() {
    let f = filter("redact_json", r#"{"field":"card_number","keep_last":4}"#);
    let got = verdicts(
        &f,
        Hook::OnSend,
        &[message(1, r#"{"id":7,"card_number":"4111 1111 1111 1234"}"#, &[]), message(2, r#"{"id":8}"#, &[])],
    );
    assert_eq!(
        got,
        [
            Verdict::Change {
                payload: Some(r#"{"id":7,"card_number":"**** **** **** 1234"}"#.into()),
                headers: vec![HeaderChange::Set("redacted".into(), "card_number".into())],
            },
            Verdict::Pass
        ]
    );
}

#[test]
fn route_by_amount_adds_the_audit_queue_at_on_route_only() {
    let f = filter("route_by_amount", r#"{"field":"amount","at_least":1000,"copy_to":"AUDIT:review"}"#);
    let batch = [message(1, r#"{"amount": 2500.5}"#, &[]), message(2, r#"{"amount": 999}"#, &[])];
    let routed = vec!["C:orders".parse().unwrap(), "AUDIT:review".parse().unwrap()];
    assert_eq!(verdicts(&f, Hook::OnRoute, &batch), [Verdict::Route(routed), Verdict::Pass]);
    assert_eq!(verdicts(&f, Hook::OnSend, &batch), [Verdict::Pass, Verdict::Pass]);
}

#[test]
fn drop_duplicates_keeps_its_state_between_calls() {
    let f = filter("drop_duplicates", r#"{"key":"msg-id","window":2}"#);
    let m = |n: u64, id: &str| message(n, "x", &[("msg-id", id)]);
    assert_eq!(verdicts(&f, Hook::OnDeliver, &[m(1, "a"), m(2, "b")]), [Verdict::Pass, Verdict::Pass]);
    let again = verdicts(&f, Hook::OnDeliver, &[m(3, "a"), m(4, "c"), m(5, "a")]);
    assert!(
        matches!(&again[0], Verdict::Drop { reason } if reason.contains("msg-id a was seen")),
        "{again:?}"
    );
    // "c" pushed "a" out of the window of 2.
    assert_eq!(again[1..], [Verdict::Pass, Verdict::Pass]);
    assert_eq!(f.counters(), [("unique".to_owned(), 4), ("duplicates".to_owned(), 1)]);
}

#[test]
fn the_c_filter_speaks_the_same_abi() {
    let f = filter("tag_or_drop_empty", "null");
    let got = verdicts(&f, Hook::OnForward, &[message(1, "", &[]), message(2, "b", &[])]);
    assert_eq!(
        got,
        [
            Verdict::Drop { reason: "empty payload".into() },
            Verdict::Change {
                payload: None,
                headers: vec![HeaderChange::Set("x-filter".into(), "c".into())]
            }
        ]
    );
}

#[test]
fn a_pinned_module_must_have_its_digest() {
    let wrong =
        WasmSettings { sha256: Some([7; 32]), ..settings("drop_by_header", r#"{"key":"k","value":"v"}"#) };
    let refused = WasmFilter::new(wrong).err().unwrap();
    assert!(refused.contains("not the pinned 0707"), "{refused}");
    let f = filter("drop_by_header", r#"{"key":"k","value":"v"}"#);
    let pinned =
        WasmSettings { sha256: Some(f.digest()), ..settings("drop_by_header", r#"{"key":"k","value":"v"}"#) };
    assert!(WasmFilter::new(pinned).is_ok(), "pinned to {}", hex(&f.digest()));
}
