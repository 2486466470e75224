//! One filter module, checked at load, and its long-lived instance: calls bounded by fuel,
//! an epoch deadline and a memory cap, every failure named by its kind.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use wasmtime::{
    Caller, Config, Engine, ExternType, Instance, Linker, Memory, Module, Store, StoreLimits,
    StoreLimitsBuilder, Trap, TypedFunc,
};

use crate::abi::{self, AbiHook};
use linkbus_plugin_api::Verdict;

/// Log lines kept from one call (or `linkbus_init`); more are dropped.
pub const LOG_LINES_PER_CALL: usize = 16;

/// How often the engine's epoch advances: the resolution of `time_per_call`.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// A filter's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Fuel for one call.
    pub fuel_per_call: u64,
    /// Wall-clock time for one call, in epoch ticks.
    pub ticks_per_call: u64,
    /// Largest guest memory, in bytes.
    pub memory_bytes_max: usize,
    /// Largest verdict buffer, in bytes.
    pub output_bytes_max: usize,
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// It ran out of fuel.
    Fuel,
    /// It ran past its time.
    Time,
    /// Its memory would pass its cap.
    Memory,
    /// It trapped (or its host call failed).
    Trap(String),
    /// What it wrote back is out of bounds or malformed.
    Output(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fuel => f.write_str("ran out of fuel (fuel_per_call)"),
            Self::Time => f.write_str("ran past its time (time_per_call_ms)"),
            Self::Memory => f.write_str("would grow its memory past memory_bytes_max"),
            Self::Trap(why) => write!(f, "trapped: {why}"),
            Self::Output(why) => write!(f, "wrote back bad verdicts: {why}"),
        }
    }
}

/// The engine filters share, the thread that advances its epoch, and the modules compiled
/// so far (by their SHA-256: a reload of an unchanged module, or a second filter of the same
/// module, compiles nothing).
pub struct Runtime {
    engine: Engine,
    stop: Arc<AtomicBool>,
    compiled: Mutex<HashMap<[u8; 32], Module>>,
}

/// The runtime of this process, made at the first filter.
///
/// # Errors
/// When wasmtime cannot make the engine.
pub fn shared() -> Result<&'static Runtime, String> {
    static SHARED: OnceLock<Result<Runtime, String>> = OnceLock::new();
    SHARED.get_or_init(Runtime::new).as_ref().map_err(Clone::clone)
}

impl Runtime {
    /// An engine with fuel and epoch interruption, and its ticker.
    ///
    /// # Errors
    /// When wasmtime cannot make the engine.
    pub fn new() -> Result<Self, String> {
        let mut config = Config::new();
        config.consume_fuel(true).epoch_interruption(true);
        let engine = Engine::new(&config).map_err(|e| format!("wasmtime: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (ticking, done) = (engine.clone(), stop.clone());
        std::thread::Builder::new()
            .name("linkbus-epoch".into())
            .spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    ticking.increment_epoch();
                }
            })
            .map_err(|e| format!("epoch thread: {e}"))?;
        Ok(Self { engine, stop, compiled: Mutex::default() })
    }

    /// [`Runtime::load`], or the module compiled before from the same bytes (`digest` is
    /// their SHA-256).
    ///
    /// # Errors
    /// As [`Runtime::load`].
    pub fn load_cached(&self, wasm: &[u8], digest: [u8; 32]) -> Result<Module, String> {
        let compiled = |c: &Mutex<HashMap<_, Module>>| {
            c.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&digest).cloned()
        };
        if let Some(module) = compiled(&self.compiled) {
            return Ok(module);
        }
        let module = self.load(wasm)?;
        let mut cache = self.compiled.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // A few modules per node: a bound against a reload loop of ever new ones.
        if cache.len() >= 64 {
            cache.clear();
        }
        cache.insert(digest, module.clone());
        Ok(module)
    }

    /// Compiles and checks `wasm`: the ABI v1 exports, and imports only from the allowlist.
    ///
    /// # Errors
    /// Why the module is refused, in words.
    pub fn load(&self, wasm: &[u8]) -> Result<Module, String> {
        let module = Module::new(&self.engine, wasm).map_err(|e| format!("not a valid module: {e}"))?;
        for import in module.imports() {
            let allowed = import.module() == "linkbus"
                && matches!(import.name(), "log" | "counter_add" | "config_read");
            if !allowed {
                return Err(format!(
                    "imports {}.{}, which filters may not (allowed: linkbus.log, linkbus.counter_add, linkbus.config_read)",
                    import.module(),
                    import.name()
                ));
            }
        }
        let export = |name: &str| module.get_export(name);
        if export("linkbus_abi_v1").is_none() {
            let other =
                module.exports().find(|e| e.name().starts_with("linkbus_abi_v")).map(|e| e.name().to_owned());
            return Err(match other {
                Some(other) => {
                    format!("exports {other}, an ABI this node does not speak (it speaks linkbus_abi_v1)")
                }
                None => "does not export linkbus_abi_v1: not a linkbus filter".to_owned(),
            });
        }
        for (name, want) in [("memory", "memory"), ("linkbus_alloc", "func"), ("linkbus_filter", "func")] {
            let kind = match export(name) {
                Some(ExternType::Memory(_)) => "memory",
                Some(ExternType::Func(_)) => "func",
                Some(_) => "other",
                None => return Err(format!("does not export {name}")),
            };
            if kind != want {
                return Err(format!("exports {name} as a {kind}, not a {want}"));
            }
        }
        Ok(module)
    }

    /// The host functions a guest may import (the allowlist), for one instance.
    fn linker(&self) -> Result<Linker<Host>, String> {
        let mut linker = Linker::<Host>::new(&self.engine);
        linker
            .func_wrap("linkbus", "log", |mut caller: Caller<'_, Host>, _level: i32, ptr: i32, len: i32| {
                charge(&mut caller)?;
                if let Some(line) = guest_bytes(&mut caller, ptr, len, 4096) {
                    let line = String::from_utf8_lossy(&line).into_owned();
                    let log = &mut caller.data_mut().log;
                    // Kept until the call returns; a guest that logs in a loop loses lines.
                    if log.len() < LOG_LINES_PER_CALL {
                        log.push(line);
                    }
                }
                wasmtime::Result::<()>::Ok(())
            })
            .map_err(|e| e.to_string())?;
        linker
            .func_wrap(
                "linkbus",
                "counter_add",
                |mut caller: Caller<'_, Host>, ptr: i32, len: i32, delta: i64| {
                    charge(&mut caller)?;
                    if let Some(name) = guest_bytes(&mut caller, ptr, len, 128) {
                        let name = String::from_utf8_lossy(&name).into_owned();
                        let counters = &mut caller.data_mut().counters;
                        if let Some((_, value)) = counters.iter_mut().find(|(n, _)| *n == name) {
                            *value = value.saturating_add(delta);
                        } else if counters.len() < 64 {
                            counters.push((name, delta));
                        }
                    }
                    wasmtime::Result::<()>::Ok(())
                },
            )
            .map_err(|e| e.to_string())?;
        linker
            .func_wrap("linkbus", "config_read", |mut caller: Caller<'_, Host>, ptr: i32, len: i32| {
                charge(&mut caller)?;
                let config = caller.data().config.clone();
                let n = usize::try_from(len).unwrap_or(0).min(config.len());
                let written = caller
                    .get_export("memory")
                    .and_then(wasmtime::Extern::into_memory)
                    .zip(usize::try_from(ptr).ok())
                    .is_some_and(|(memory, at)| memory.write(&mut caller, at, &config[..n]).is_ok());
                wasmtime::Result::<i32>::Ok(if written { len_i32(config.len()) } else { -1 })
            })
            .map_err(|e| e.to_string())?;
        Ok(linker)
    }

    /// A long-lived instance of `module` under `limits`, initialised with `config`.
    ///
    /// # Errors
    /// Why it could not start: wrong export types, a trap, or `linkbus_init` refusing.
    pub fn instantiate(
        &self,
        module: &Module,
        limits: Limits,
        config: &[u8],
    ) -> Result<FilterInstance, String> {
        let linker = self.linker()?;
        let host = Host {
            config: Arc::from(config),
            limits: StoreLimitsBuilder::new()
                .memory_size(limits.memory_bytes_max)
                .trap_on_grow_failure(true)
                .build(),
            log: Vec::new(),
            counters: Vec::new(),
        };
        let mut store = Store::new(&self.engine, host);
        store.limiter(|host| &mut host.limits);
        arm(&mut store, limits)?;
        let instance = linker.instantiate(&mut store, module).map_err(|e| describe(&e, &store))?;
        let memory = instance.get_memory(&mut store, "memory").ok_or("does not export memory")?;
        let typed = |store: &mut Store<Host>, name: &str| {
            instance.get_func(&mut *store, name).ok_or_else(|| format!("does not export {name}"))
        };
        let alloc = typed(&mut store, "linkbus_alloc")?
            .typed::<i32, i32>(&store)
            .map_err(|e| format!("linkbus_alloc: {e}"))?;
        let filter = typed(&mut store, "linkbus_filter")?
            .typed::<(i32, i32, i32), i64>(&store)
            .map_err(|e| format!("linkbus_filter: {e}"))?;
        let mut made =
            FilterInstance { store, memory, alloc, filter, limits, batch: Vec::new(), _instance: instance };
        if let Some(init) = made._instance.get_func(&mut made.store, "linkbus_init") {
            let init =
                init.typed::<(i32, i32), i32>(&made.store).map_err(|e| format!("linkbus_init: {e}"))?;
            let at = made.write(config).map_err(|f| f.to_string())?;
            arm(&mut made.store, limits)?;
            let refused = init
                .call(&mut made.store, (at, len_i32(config.len())))
                .map_err(|e| describe(&e, &made.store))?;
            if refused != 0 {
                let said = made.store.data().log.last().cloned().unwrap_or_default();
                return Err(format!("refused its configuration: {said}"));
            }
        }
        Ok(made)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What a store holds besides the instance.
struct Host {
    /// The filter's `config:` value, as JSON (`linkbus.config_read`).
    config: Arc<[u8]>,
    limits: StoreLimits,
    log: Vec<String>,
    counters: Vec<(String, i64)>,
}

/// Fuel a host call costs the guest (host calls run no guest instructions, so a guest that
/// only calls the host still runs out).
pub const HOST_CALL_FUEL: u64 = 1_000;

/// Takes [`HOST_CALL_FUEL`] from the caller: out of fuel, the call traps as out of fuel.
fn charge(caller: &mut Caller<'_, Host>) -> wasmtime::Result<()> {
    let left = caller.get_fuel()?;
    if left < HOST_CALL_FUEL {
        caller.set_fuel(0)?;
        return Err(wasmtime::Trap::OutOfFuel.into());
    }
    caller.set_fuel(left - HOST_CALL_FUEL)
}

/// At most `max` bytes at `ptr..ptr+len` of the caller's memory, if they are all there.
fn guest_bytes(caller: &mut Caller<'_, Host>, ptr: i32, len: i32, max: usize) -> Option<Vec<u8>> {
    let memory = caller.get_export("memory")?.into_memory()?;
    let (ptr, len) = (usize::try_from(ptr).ok()?, usize::try_from(len).ok()?.min(max));
    let mut out = vec![0; len];
    memory.read(&*caller, ptr, &mut out).ok()?;
    Some(out)
}

fn len_i32(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}

/// Gives the next call its fuel and deadline.
fn arm(store: &mut Store<Host>, limits: Limits) -> Result<(), String> {
    store.set_fuel(limits.fuel_per_call).map_err(|e| e.to_string())?;
    store.set_epoch_deadline(limits.ticks_per_call);
    Ok(())
}

/// The failure a wasmtime error stands for.
fn failure(error: &wasmtime::Error) -> Failure {
    match error.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => Failure::Fuel,
        Some(Trap::Interrupt) => Failure::Time,
        Some(trap) => Failure::Trap(trap.to_string()),
        None if format!("{error:#}").contains("memory") => Failure::Memory,
        None => Failure::Trap(error.root_cause().to_string()),
    }
}

fn describe(error: &wasmtime::Error, _store: &Store<Host>) -> String {
    failure(error).to_string()
}

/// A filter's instance: kept for many calls, never made per message.
pub struct FilterInstance {
    store: Store<Host>,
    memory: Memory,
    alloc: TypedFunc<i32, i32>,
    filter: TypedFunc<(i32, i32, i32), i64>,
    limits: Limits,
    /// The last batch's bytes, kept for the next (up to [`BATCH_BUFFER_KEPT`]).
    batch: Vec<u8>,
    _instance: Instance,
}

/// Largest batch buffer an instance keeps between calls.
const BATCH_BUFFER_KEPT: usize = 4 << 20;

impl FilterInstance {
    /// Writes `bytes` into a block the guest allocates; its address.
    fn write(&mut self, bytes: &[u8]) -> Result<i32, Failure> {
        arm(&mut self.store, self.limits).map_err(Failure::Trap)?;
        let at = self.alloc.call(&mut self.store, len_i32(bytes.len())).map_err(|e| failure(&e))?;
        let start = usize::try_from(at).map_err(|_| Failure::Output(format!("linkbus_alloc gave {at}")))?;
        if at == 0 && !bytes.is_empty() {
            return Err(Failure::Memory);
        }
        self.memory
            .write(&mut self.store, start, bytes)
            .map_err(|_| Failure::Output(format!("linkbus_alloc gave {at}, out of its memory")))?;
        Ok(at)
    }

    /// Runs the filter on `messages` at `hook`: its verdict for each, in order, and the fuel
    /// the call used.
    ///
    /// # Errors
    /// The [`Failure`], the instance left as it is (the caller decides whether to rebuild).
    pub fn call(
        &mut self,
        hook: AbiHook,
        messages: &[&linkbus_plugin_api::Message],
        payload_bytes_max: usize,
    ) -> Result<(Vec<Verdict>, u64), Failure> {
        // Kept between calls: a batch of large messages allocates (and faults in) nothing new.
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        abi::encode_batch(messages, &mut batch);
        let (written, batch_len) = (self.write(&batch), batch.len());
        if batch.capacity() <= BATCH_BUFFER_KEPT {
            self.batch = batch;
        }
        let at = written?;
        arm(&mut self.store, self.limits).map_err(Failure::Trap)?;
        let out = self
            .filter
            .call(&mut self.store, (hook as i32, at, len_i32(batch_len)))
            .map_err(|e| failure(&e))?;
        let fuel = self.limits.fuel_per_call.saturating_sub(self.store.get_fuel().unwrap_or(0));
        if out == -1 {
            return Ok((vec![Verdict::Pass; messages.len()], fuel));
        }
        let (ptr, len) = ((out >> 32) as u32 as usize, (out & 0xffff_ffff) as usize);
        if out < 0 || len > self.limits.output_bytes_max {
            return Err(Failure::Output(format!(
                "{len} bytes at {ptr} (code {out}; at most output_bytes_max)"
            )));
        }
        // Read where they are (bounds-checked), copying only what is kept.
        let bytes = ptr
            .checked_add(len)
            .and_then(|end| self.memory.data(&self.store).get(ptr..end))
            .ok_or_else(|| Failure::Output(format!("{len} bytes at {ptr} are outside its memory")))?;
        let verdicts =
            abi::decode_verdicts(bytes, messages.len(), hook, payload_bytes_max).map_err(Failure::Output)?;
        Ok((verdicts, fuel))
    }

    /// What the filter logged since the last look, and what it added to its counters.
    pub fn take_log(&mut self) -> (Vec<String>, Vec<(String, i64)>) {
        let host = self.store.data_mut();
        (std::mem::take(&mut host.log), std::mem::take(&mut host.counters))
    }
}
