//! Work in progress on branch `wasm-filters` (issue 34): the WebAssembly filter host.
#![forbid(unsafe_code)]

pub mod abi;
pub mod instance;

#[cfg(test)]
mod tests {
    use wasmtime::{Config, Engine, Instance, Module, Store};

    /// A first look at the limits: fuel stops a guest that never returns.
    #[test]
    fn fuel_stops_an_endless_loop() {
        let mut config = Config::new();
        config.consume_fuel(true).epoch_interruption(true);
        let engine = Engine::new(&config).unwrap();
        let module =
            Module::new(&engine, wat::parse_str(r#"(module (func (export "spin") (loop (br 0))))"#).unwrap())
                .unwrap();
        let mut store = Store::new(&engine, ());
        store.set_fuel(1_000_000).unwrap();
        store.set_epoch_deadline(1_000);
        let instance = Instance::new(&mut store, &module, &[]).unwrap();
        let spin = instance.get_typed_func::<(), ()>(&mut store, "spin").unwrap();
        let error = spin.call(&mut store, ()).unwrap_err();
        assert!(format!("{error:?}").contains("fuel"), "{error:?}");
    }
}
