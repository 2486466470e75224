//! Misbehaving filters (`.wat` fixtures): each is stopped, or refused at load, with a message
//! naming the limit; the well-behaved example keeps working beside them.

use linkbus_filter_wasm::abi::{AbiHook, GuestVerdict};
use linkbus_filter_wasm::instance::{Failure, Limits, Runtime};
use linkbus_plugin_api::{Content, Message, MessageId};

const LIMITS: Limits = Limits {
    fuel_per_call: 5_000_000,
    ticks_per_call: 50,
    memory_bytes_max: 1 << 20,
    output_bytes_max: 1 << 16,
};

/// The ABI's exports around `filter_body` (the body of `linkbus_filter`, returning i64).
fn module(filter_body: &str) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(module
            (memory (export "memory") 1)
            (func (export "linkbus_abi_v1") (result i32) i32.const 1)
            (func (export "linkbus_alloc") (param i32) (result i32) i32.const 1024)
            (func $rec (param i32) (result i32) local.get 0 call $rec)
            (func (export "linkbus_filter") (param i32 i32 i32) (result i64) {filter_body}))"#
    ))
    .unwrap()
}

fn message() -> Message {
    let id = MessageId { source: "A".parse().unwrap(), sequence: 1, created_unix_ms: 0 };
    Message::new(id, Content::buf("C:q".parse().unwrap(), "hello"))
}

fn call(runtime: &Runtime, wasm: &[u8]) -> Result<Vec<GuestVerdict>, Failure> {
    let module = runtime.load(wasm).unwrap();
    let mut instance = runtime.instantiate(&module, LIMITS, b"{}").unwrap();
    let m = message();
    instance.call(AbiHook::OnDeliver, &[&m], 1 << 20)
}

#[test]
fn each_misbehaviour_is_stopped_and_named() {
    let runtime = Runtime::new().unwrap();
    assert_eq!(call(&runtime, &module("(loop (br 0)) i64.const -1")), Err(Failure::Fuel), "an endless loop");
    let grow = module("(loop (drop (memory.grow (i32.const 1))) (br 0)) i64.const -1");
    assert!(matches!(call(&runtime, &grow), Err(Failure::Trap(_) | Failure::Memory)), "memory growth");
    let recursion = module("i32.const 0 call $rec drop i64.const -1");
    let stopped = call(&runtime, &recursion);
    assert!(matches!(&stopped, Err(Failure::Trap(why)) if why.contains("stack")), "recursion: {stopped:?}");
    assert!(matches!(call(&runtime, &module("unreachable")), Err(Failure::Trap(_))), "a trap");
    let outside = module("i64.const 0x7fff000000000010");
    assert!(
        matches!(call(&runtime, &outside), Err(Failure::Output(why)) if why.contains("outside")),
        "a bad pointer"
    );
    let huge = module("i64.const 0x00000000ffffffff");
    assert!(matches!(call(&runtime, &huge), Err(Failure::Output(why)) if why.contains("output_bytes_max")));
    assert_eq!(call(&runtime, &module("i64.const -1")), Ok(vec![GuestVerdict::Pass]), "all pass");
}

#[test]
fn a_call_past_its_time_is_stopped_by_the_epoch_deadline() {
    let runtime = Runtime::new().unwrap();
    let module = runtime.load(&module("(loop (br 0)) i64.const -1")).unwrap();
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
    let refused = |wat: &str| runtime.load(&wat::parse_str(wat).unwrap()).err().unwrap();
    assert!(refused("(module)").contains("does not export linkbus_abi_v1"));
    assert!(
        refused(r#"(module (func (export "linkbus_abi_v2")))"#)
            .contains("linkbus_abi_v2, an ABI this node does not speak")
    );
    assert!(refused(r#"(module (import "wasi_snapshot_preview1" "fd_write" (func)))"#).contains("may not"));
    assert!(
        refused(r#"(module (func (export "linkbus_abi_v1")) (memory (export "memory") 1))"#)
            .contains("does not export linkbus_alloc")
    );
    assert!(runtime.load(b"not wasm").unwrap_err().contains("not a valid module"));
}
