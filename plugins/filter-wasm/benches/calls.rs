//! Micro-benchmarks of a call of the committed example filters through the `wasm` plugin, as
//! a node makes it: a batch of 256 messages of 1 KiB (JSON-like text) at `on_send`, counted
//! per message; and the same `drop_by_header` as a native plugin library, through the native
//! loader and ABI.

use std::path::PathBuf;

use divan::Bencher;
use divan::counter::ItemsCount;
use linkbus_filter_wasm::plugin::{LIMITS_DEFAULT, WasmFilter, WasmSettings};
use linkbus_plugin_api::{Content, Filter, Hook, Message, MessageId};

fn main() {
    divan::main();
}

const BATCH: usize = 256;

fn filter(name: &str, config: &str) -> WasmFilter {
    let module = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../wasm-plugins/built")
        .join(format!("{name}.wasm"));
    let settings = WasmSettings {
        name: name.into(),
        module,
        sha256: None,
        limits: LIMITS_DEFAULT,
        traps_max: 3,
        config: config.into(),
    };
    WasmFilter::new(settings).expect("the example loads")
}

/// 256 messages of 1 KiB of order records, each with a customer id.
fn batch() -> Vec<Message> {
    (0..BATCH as u64)
        .map(|n| {
            let mut text = String::new();
            while text.len() < 1024 {
                text.push_str(&format!(
                    "{{\"order\":{n},\"customer\":\"C-{:05}\",\"sku\":\"SKU-0042\",\"qty\":3,\"price\":19.90}}\n",
                    n * 7919 % 100_000
                ));
            }
            text.truncate(1024);
            let id = MessageId { source: "A".parse().expect("name"), sequence: n, created_unix_ms: 0 };
            Message::new(id, Content::buf("C:orders".parse().expect("address"), text))
        })
        .collect()
}

fn run(bencher: Bencher, filter: &dyn Filter) {
    let messages = batch();
    let shown: Vec<&Message> = messages.iter().collect();
    bencher
        .counter(ItemsCount::new(BATCH))
        .bench_local(|| filter.filter(Hook::OnSend, &shown).expect("a call"));
}

/// `drop_by_header` on a header no message has: every message passes.
#[divan::bench]
fn pass_through(bencher: Bencher) {
    run(bencher, &filter("drop_by_header", r#"{"key":"x-never","value":"set"}"#));
}

/// `redact_json` masking each payload's first customer id.
#[divan::bench]
fn redact(bencher: Bencher) {
    run(bencher, &filter("redact_json", r#"{"field":"customer","keep_last":0}"#));
}

/// `drop-by-header` of the native fixture library (the same filter, in Rust, through the
/// native ABI: each message's fields copied across, the verdicts back).
#[divan::bench]
fn native_pass_through(bencher: Bencher) {
    let exe = std::env::current_exe().expect("bench path");
    let library = exe.parent().expect("deps").join("liblinkbus_native_fixtures.so");
    let library = linkbus_native::load(&library, None).expect("the fixture library loads");
    let plugins = linkbus_native::plugins(&library);
    let plugin = plugins.iter().find(|p| p.name == "drop-by-header").expect("offered");
    let linkbus_plugin_api::Builder::Filter(build) = &plugin.builder else { panic!("a filter") };
    let section = linkbus_plugin_api::ConfigValue::Map(vec![
        ("key".into(), linkbus_plugin_api::ConfigValue::Str("x-never".into())),
        ("value".into(), linkbus_plugin_api::ConfigValue::Str("set".into())),
    ]);
    let context =
        linkbus_plugin_api::BuildContext { node: "A".parse().expect("name"), data_dir: std::env::temp_dir() };
    let filter = build(&section, &context).expect("builds");
    run(bencher, &*filter);
}
