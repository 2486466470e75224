//! A first end-to-end look at the filter ABI v1 (docs/filter-abi.md): the example filter
//! `drop-by-header`, built by Debian's rustc 1.63 from `wasm-plugins/`, loaded by wasmtime
//! under fuel, an epoch deadline and a memory cap, given its configuration and one batch.

use wasmtime::{Caller, Config, Engine, Linker, Module, Store, StoreLimits, StoreLimitsBuilder};

struct Host {
    limits: StoreLimits,
    log: Vec<String>,
    counters: Vec<(String, i64)>,
}

fn guest_bytes(caller: &mut Caller<'_, Host>, ptr: i32, len: i32) -> Option<Vec<u8>> {
    let memory = caller.get_export("memory")?.into_memory()?;
    let mut out = vec![0; usize::try_from(len).ok()?];
    memory.read(&caller, usize::try_from(ptr).ok()?, &mut out).ok()?;
    Some(out)
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s);
}

fn batch(headers: &[&[(&str, &str)]]) -> Vec<u8> {
    let mut out = (headers.len() as u32).to_le_bytes().to_vec();
    for (n, message) in headers.iter().enumerate() {
        out.extend_from_slice(&2u32.to_le_bytes());
        put_str(&mut out, b"A");
        out.extend_from_slice(&(n as u64).to_le_bytes());
        out.extend_from_slice(&4u32.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        put_str(&mut out, b"order");
        out.extend_from_slice(&1u32.to_le_bytes());
        put_str(&mut out, b"C:orders");
        out.extend_from_slice(&(message.len() as u32).to_le_bytes());
        for (k, v) in *message {
            put_str(&mut out, k.as_bytes());
            put_str(&mut out, v.as_bytes());
        }
        put_str(&mut out, b"{\"sku\":\"A-1\"}");
    }
    out
}

#[test]
fn the_example_filter_drops_by_header_through_the_abi() {
    let mut config = Config::new();
    config.consume_fuel(true).epoch_interruption(true);
    let engine = Engine::new(&config).unwrap();
    let module = Module::from_file(
        &engine,
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/drop_by_header.wasm"),
    )
    .unwrap();
    let mut linker = Linker::<Host>::new(&engine);
    linker
        .func_wrap("linkbus", "log", |mut caller: Caller<'_, Host>, _level: i32, ptr: i32, len: i32| {
            if let Some(bytes) = guest_bytes(&mut caller, ptr, len) {
                caller.data_mut().log.push(String::from_utf8_lossy(&bytes).into_owned());
            }
        })
        .unwrap();
    linker
        .func_wrap(
            "linkbus",
            "counter_add",
            |mut caller: Caller<'_, Host>, ptr: i32, len: i32, delta: i64| {
                if let Some(bytes) = guest_bytes(&mut caller, ptr, len) {
                    caller.data_mut().counters.push((String::from_utf8_lossy(&bytes).into_owned(), delta));
                }
            },
        )
        .unwrap();
    let limits = StoreLimitsBuilder::new().memory_size(4 << 20).build();
    let mut store = Store::new(&engine, Host { limits, log: Vec::new(), counters: Vec::new() });
    store.limiter(|host| &mut host.limits);
    store.set_fuel(10_000_000).unwrap();
    store.set_epoch_deadline(1_000);
    let instance = linker.instantiate(&mut store, &module).unwrap();
    let memory = instance.get_memory(&mut store, "memory").unwrap();
    println!("initial memory: {} pages", memory.size(&store));
    assert_eq!(
        instance
            .get_typed_func::<(), i32>(&mut store, "linkbus_abi_v1")
            .unwrap()
            .call(&mut store, ())
            .unwrap(),
        1
    );
    let alloc = instance.get_typed_func::<i32, i32>(&mut store, "linkbus_alloc").unwrap();
    let init = instance.get_typed_func::<(i32, i32), i32>(&mut store, "linkbus_init").unwrap();
    let filter = instance.get_typed_func::<(i32, i32, i32), i64>(&mut store, "linkbus_filter").unwrap();

    let config = br#"{"key": "kind", "value": "spam"}"#;
    let at = alloc.call(&mut store, config.len() as i32).unwrap();
    memory.write(&mut store, at as usize, config).unwrap();
    assert_eq!(init.call(&mut store, (at, config.len() as i32)).unwrap(), 0);

    let input = batch(&[&[("kind", "order")], &[("kind", "spam")], &[]]);
    let at = alloc.call(&mut store, input.len() as i32).unwrap();
    memory.write(&mut store, at as usize, &input).unwrap();
    let fuel = store.get_fuel().unwrap();
    let out = filter.call(&mut store, (0, at, input.len() as i32)).unwrap();
    println!("fuel for a batch of 3: {}", fuel - store.get_fuel().unwrap());
    let (ptr, len) = ((out >> 32) as usize, (out & 0xffff_ffff) as usize);
    let mut verdicts = vec![0; len];
    memory.read(&store, ptr, &mut verdicts).unwrap();
    assert_eq!(&verdicts[..4], &3u32.to_le_bytes());
    assert_eq!(verdicts[4], 0, "the first passes");
    assert_eq!(verdicts[5], 1, "the second is dropped");
    let reason_len = u32::from_le_bytes(verdicts[6..10].try_into().unwrap()) as usize;
    assert_eq!(&verdicts[10..10 + reason_len], b"header kind is spam");
    assert_eq!(verdicts[10 + reason_len], 0, "the third passes");
    assert_eq!(store.data().counters, [("dropped".to_owned(), 1)]);
}
