//! Misbehaving filters (the `.wat` fixtures in `fixtures/`): each is stopped, or refused at
//! load, with a message naming the limit; the well-behaved example keeps working beside them.

use std::path::Path;

use linkbus_filter_wasm::abi::AbiHook;
use linkbus_filter_wasm::instance::{Failure, Limits, Runtime};
use linkbus_plugin_api::{Content, Message, MessageId, Verdict};

const LIMITS: Limits = Limits {
    fuel_per_call: 5_000_000,
    ticks_per_call: 50,
    memory_bytes_max: 1 << 20,
    output_bytes_max: 1 << 16,
};

/// The fixture `name` (`fixtures/NAME.wat`), assembled.
fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(format!("{name}.wat"));
    wat::parse_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn message() -> Message {
    let id = MessageId { source: "A".parse().unwrap(), sequence: 1, created_unix_ms: 0 };
    Message::new(id, Content::buf("C:q".parse().unwrap(), "hello"))
}

fn call_with(runtime: &Runtime, wasm: &[u8], limits: Limits) -> Result<Vec<Verdict>, Failure> {
    let module = runtime.load(wasm).unwrap();
    let mut instance = runtime.instantiate(&module, limits, b"{}").unwrap();
    let m = message();
    instance.call(AbiHook::OnDeliver, &[&m], 1 << 20).map(|(verdicts, _)| verdicts)
}

fn call(runtime: &Runtime, name: &str) -> Result<Vec<Verdict>, Failure> {
    call_with(runtime, &fixture(name), LIMITS)
}

#[test]
fn each_misbehaviour_is_stopped_and_named() {
    let runtime = Runtime::new().unwrap();
    assert_eq!(call(&runtime, "loop"), Err(Failure::Fuel), "an endless loop");
    assert_eq!(call(&runtime, "host_call_loop"), Err(Failure::Fuel), "an endless loop of host calls");
    assert!(matches!(call(&runtime, "grow"), Err(Failure::Trap(_) | Failure::Memory)), "memory growth");
    let stopped = call(&runtime, "recursion");
    assert!(matches!(&stopped, Err(Failure::Trap(why)) if why.contains("stack")), "recursion: {stopped:?}");
    assert!(matches!(call(&runtime, "trap"), Err(Failure::Trap(_))), "a trap");
    assert!(
        matches!(call(&runtime, "bad_pointer"), Err(Failure::Output(why)) if why.contains("outside")),
        "a bad pointer"
    );
    let tight = Limits { output_bytes_max: 8, ..LIMITS };
    let said = call_with(&runtime, &fixture("rewrite_all"), tight);
    assert!(matches!(&said, Err(Failure::Output(why)) if why.contains("output_bytes_max")), "{said:?}");
    assert_eq!(
        call(&runtime, "rewrite_all"),
        Ok(vec![Verdict::Change { payload: Some(bytes::Bytes::from_static(b"X")), headers: Vec::new() }])
    );
}

#[test]
fn a_call_past_its_time_is_stopped_by_the_epoch_deadline() {
    let runtime = Runtime::new().unwrap();
    let module = runtime.load(&fixture("loop")).unwrap();
    let limits = Limits { fuel_per_call: u64::MAX / 2, ticks_per_call: 20, ..LIMITS };
    let mut instance = runtime.instantiate(&module, limits, b"{}").unwrap();
    let m = message();
    let started = std::time::Instant::now();
    assert_eq!(instance.call(AbiHook::OnDeliver, &[&m], 1 << 20), Err(Failure::Time));
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
    // The instance takes the next call (a stateful filter keeps its state).
    assert_eq!(instance.call(AbiHook::OnDeliver, &[&m], 1 << 20), Err(Failure::Time));
}

#[test]
fn modules_that_are_not_filters_are_refused_at_load() {
    let runtime = Runtime::new().unwrap();
    let refused = |name: &str| runtime.load(&fixture(name)).err().unwrap();
    assert!(refused("missing_exports").contains("does not export linkbus_filter"));
    assert!(refused("abi_v2").contains("linkbus_abi_v2, an ABI this node does not speak"));
    let wasi = refused("wasi");
    assert!(wasi.contains("wasi_snapshot_preview1.fd_write, which filters may not"), "{wasi}");
    assert!(
        runtime
            .load(&wat::parse_str("(module)").unwrap())
            .unwrap_err()
            .contains("does not export linkbus_abi_v1")
    );
    assert!(runtime.load(b"not wasm").unwrap_err().contains("not a valid module"));
    let module = runtime.load(&fixture("wrong_export_type")).unwrap();
    let error = runtime.instantiate(&module, LIMITS, b"{}").err().unwrap();
    assert!(error.contains("linkbus_filter"), "{error}");
}

#[test]
fn a_guest_reads_its_configuration_through_the_host() {
    let runtime = Runtime::new().unwrap();
    let module = runtime.load(&fixture("config_echo")).unwrap();
    let mut instance = runtime.instantiate(&module, LIMITS, br#"{"key":"kind"}"#).unwrap();
    let m = message();
    let (verdicts, fuel) = instance.call(AbiHook::OnDeliver, &[&m], 1 << 20).unwrap();
    assert_eq!(verdicts, [Verdict::Drop { reason: r#"{"key":"kind"}"#.into() }]);
    assert!(fuel >= 1_000, "the host call costs fuel: {fuel}");
}
