//! The `wasm` filter plugin: a filter entry of `plugins.filters` names a module file, its
//! limits and its configuration; the node runs one long-lived instance of it, rebuilt from
//! the compiled module after `traps_max` failed calls in a row.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use linkbus_plugin_api::registry::{BuildContext, Factory, PluginEntry};
use linkbus_plugin_api::{
    ConfigValue, Decision, FailureKind, Filter, FilterError, Hook, Message, PluginError, Section, Verdict,
};
use sha2::{Digest, Sha256};
use wasmtime::Module;

use crate::abi::AbiHook;
use crate::instance::{self, EPOCH_TICK, Failure, FilterInstance, Limits};

/// The plugin's registered name (`kind: wasm`, the default kind of a filter).
pub const PLUGIN_NAME: &str = "wasm";

/// Limits a filter gets unless its `limits:` say otherwise.
pub const LIMITS_DEFAULT: Limits = Limits {
    fuel_per_call: 50_000_000,
    ticks_per_call: 100,
    memory_bytes_max: 64 << 20,
    output_bytes_max: 16 << 20,
};

/// Failed calls in a row after which the instance is rebuilt.
pub const TRAPS_MAX_DEFAULT: u64 = 3;

/// Guest log lines written to the node's log per filter and minute; more are counted.
const LOG_LINES_PER_MINUTE: u32 = 120;

/// A filter entry's own keys, read.
#[derive(Debug, Clone, PartialEq)]
pub struct WasmSettings {
    /// The filter's name (in its log lines).
    pub name: String,
    /// The module file.
    pub module: PathBuf,
    /// The module's SHA-256 it must have, when pinned.
    pub sha256: Option<[u8; 32]>,
    /// Its limits.
    pub limits: Limits,
    /// Failed calls in a row before the instance is rebuilt.
    pub traps_max: u64,
    /// Its `config:` value as JSON, handed to `linkbus_init` once.
    pub config: String,
}

impl WasmSettings {
    /// Reads the keys of a filter entry; problems are reported to the section.
    pub fn read(section: &Section<'_>) -> Option<Self> {
        let name = section.string("name").unwrap_or_else(|| "wasm".to_owned());
        let module = section.required("module", Section::string);
        let sha256 = section.string("sha256").and_then(|text| {
            let digest = linkbus_plugin_api::hex::decode(text.trim().as_bytes()).ok();
            if digest.is_none() {
                section.error("sha256", "expected 64 hexadecimal digits (`sha256sum FILE.wasm`)");
            }
            digest
        });
        let limits = section.section("limits").map_or(LIMITS_DEFAULT, |s| {
            let d = LIMITS_DEFAULT;
            let limits = Limits {
                fuel_per_call: s.number("fuel_per_call", d.fuel_per_call, 1_000, 1 << 40),
                ticks_per_call: s.number("time_per_call_ms", d.ticks_per_call, 1, 60_000),
                memory_bytes_max: to_usize(s.number(
                    "memory_bytes_max",
                    d.memory_bytes_max as u64,
                    1 << 16,
                    4 << 30,
                )),
                output_bytes_max: to_usize(s.number(
                    "output_bytes_max",
                    d.output_bytes_max as u64,
                    8,
                    1 << 30,
                )),
            };
            s.finish();
            limits
        });
        let traps_max = section.number("traps_max", TRAPS_MAX_DEFAULT, 1, 1_000_000);
        let config =
            section.get("config").map_or_else(|| "null".to_owned(), linkbus_plugin_api::json::to_json);
        Some(Self { name, module: PathBuf::from(module?), sha256, limits, traps_max, config })
    }
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

pub use linkbus_plugin_api::hex::encode as hex;

/// A module file's bytes and their SHA-256, checked against the pin.
///
/// # Errors
/// The file cannot be read, or its digest is not the pinned one.
pub fn read_module(path: &Path, pin: Option<[u8; 32]>) -> Result<(Vec<u8>, [u8; 32]), String> {
    let wasm = std::fs::read(path).map_err(|e| format!("module '{}': {e}", path.display()))?;
    let digest: [u8; 32] = Sha256::digest(&wasm).into();
    if let Some(pin) = pin
        && pin != digest
    {
        return Err(format!(
            "module '{}' has SHA-256 {}, not the pinned {} (sha256:)",
            path.display(),
            hex(&digest),
            hex(&pin)
        ));
    }
    Ok((wasm, digest))
}

/// Reads, pins, compiles (or finds compiled) and checks the module of `settings`.
///
/// # Errors
/// Why it is refused, naming the file.
pub fn load(settings: &WasmSettings) -> Result<(Module, [u8; 32]), String> {
    let (wasm, digest) = read_module(&settings.module, settings.sha256)?;
    let module = instance::shared()?
        .load_cached(&wasm, digest)
        .map_err(|e| format!("module '{}' {e}", settings.module.display()))?;
    Ok((module, digest))
}

/// Checks a filter entry: its keys, and its module (read, pinned, compiled and checked
/// against the ABI; the compiled module is kept for the build that follows).
fn check(section: &Section<'_>) {
    if let Some(settings) = WasmSettings::read(section)
        && let Err(e) = load(&settings)
    {
        section.error("module", e);
    }
}

fn build(config: &ConfigValue, _ctx: &BuildContext) -> Result<Box<dyn Filter>, PluginError> {
    let failed = |reason: String| PluginError { plugin: PLUGIN_NAME.into(), reason };
    let settings = linkbus_plugin_api::read_plugin_section("", config, WasmSettings::read)
        .map_err(|e| failed(e.to_string()))?
        .ok_or_else(|| failed("no settings".into()))?;
    Ok(Box::new(WasmFilter::new(settings).map_err(failed)?))
}

inventory::submit! {
    PluginEntry {
        name: PLUGIN_NAME,
        summary: "user filters as WebAssembly modules (ABI v1), under fuel, time and memory limits",
        check,
        factory: Factory::Filter(build),
    }
}

/// What changes between calls.
struct State {
    instance: Option<FilterInstance>,
    failures_in_row: u64,
    counters: Vec<(String, i64)>,
    log_minute: Instant,
    logged: u32,
}

/// A `wasm` filter: its module and its one instance.
pub struct WasmFilter {
    settings: WasmSettings,
    module: Module,
    digest: [u8; 32],
    state: Mutex<State>,
    rebuilds: AtomicU64,
}

impl WasmFilter {
    /// Loads the module and starts its instance (which runs `linkbus_init`).
    ///
    /// # Errors
    /// Why the module is refused or its instance does not start.
    pub fn new(settings: WasmSettings) -> Result<Self, String> {
        let (module, digest) = load(&settings)?;
        let filter = Self {
            settings,
            module,
            digest,
            state: Mutex::new(State {
                instance: None,
                failures_in_row: 0,
                counters: Vec::new(),
                log_minute: Instant::now(),
                logged: 0,
            }),
            rebuilds: AtomicU64::new(0),
        };
        let made = filter.instantiate()?;
        let mut state = filter.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.instance = Some(made);
        filter.drain(&mut state);
        drop(state);
        Ok(filter)
    }

    /// The SHA-256 of the module it runs.
    pub fn digest(&self) -> [u8; 32] {
        self.digest
    }

    fn instantiate(&self) -> Result<FilterInstance, String> {
        instance::shared()?
            .instantiate(&self.module, self.settings.limits, self.settings.config.as_bytes())
            .map_err(|e| format!("module '{}' does not start: {e}", self.settings.module.display()))
    }

    /// Calls the instance (made first when there is none).
    fn call(
        &self,
        state: &mut State,
        hook: Hook,
        messages: &[&Message],
    ) -> Result<(Vec<Verdict>, u64), Failure> {
        if state.instance.is_none() {
            state.instance = Some(self.instantiate().map_err(Failure::Trap)?);
        }
        let instance = state.instance.as_mut().ok_or_else(|| Failure::Trap("no instance".into()))?;
        let result = instance.call(abi_hook(hook), messages, self.settings.limits.output_bytes_max);
        self.drain(state);
        result
    }

    /// Writes what the instance logged to the node's log (within the rate) and adds up its
    /// counters.
    fn drain(&self, state: &mut State) {
        let Some(instance) = state.instance.as_mut() else { return };
        let (lines, counters) = instance.take_log();
        for (name, delta) in counters {
            if let Some((_, value)) = state.counters.iter_mut().find(|(n, _)| *n == name) {
                *value = value.saturating_add(delta);
            } else if state.counters.len() < 64 {
                state.counters.push((name, delta));
            }
        }
        if state.log_minute.elapsed() > Duration::from_secs(60) {
            state.log_minute = Instant::now();
            state.logged = 0;
        }
        for line in lines {
            state.logged = state.logged.saturating_add(1);
            if state.logged <= LOG_LINES_PER_MINUTE {
                tracing::info!(filter = %self.settings.name, "{line}");
            }
        }
    }

    /// The failure in words, naming the limit and its value.
    fn describe(&self, failure: &Failure) -> FilterError {
        let l = &self.settings.limits;
        match failure {
            Failure::Fuel => FilterError::new(
                FailureKind::Fuel,
                format!("ran out of fuel (limits.fuel_per_call: {})", l.fuel_per_call),
            ),
            Failure::Time => FilterError::new(
                FailureKind::Time,
                format!(
                    "ran past its time (limits.time_per_call_ms: {})",
                    l.ticks_per_call * EPOCH_TICK.as_millis() as u64
                ),
            ),
            Failure::Memory => FilterError::new(
                FailureKind::Memory,
                format!("would grow its memory past limits.memory_bytes_max ({} bytes)", l.memory_bytes_max),
            ),
            Failure::Trap(why) => FilterError::new(FailureKind::Trap, format!("trapped: {why}")),
            Failure::Output(why) => {
                FilterError::new(FailureKind::Output, format!("wrote back bad verdicts: {why}"))
            }
        }
    }
}

fn abi_hook(hook: Hook) -> AbiHook {
    match hook {
        Hook::OnSend => AbiHook::OnSend,
        Hook::OnRoute => AbiHook::OnRoute,
        Hook::OnForward => AbiHook::OnForward,
        Hook::OnDeliver => AbiHook::OnDeliver,
    }
}

impl Filter for WasmFilter {
    fn filter(&self, hook: Hook, messages: &[&Message]) -> Result<Decision, FilterError> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match self.call(&mut state, hook, messages) {
            Ok((verdicts, fuel)) => {
                state.failures_in_row = 0;
                Ok(Decision { verdicts, fuel })
            }
            Err(failure) => {
                state.failures_in_row += 1;
                if state.failures_in_row >= self.settings.traps_max {
                    // Made again from the compiled module at the next call: fresh memory.
                    state.instance = None;
                    state.failures_in_row = 0;
                    self.rebuilds.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        filter = %self.settings.name,
                        traps_max = self.settings.traps_max,
                        "Filter failed traps_max calls in a row; its instance is rebuilt."
                    );
                }
                Err(self.describe(&failure))
            }
        }
    }

    fn counters(&self) -> Vec<(String, i64)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).counters.clone()
    }

    fn rebuilds(&self) -> u64 {
        self.rebuilds.load(Ordering::Relaxed)
    }

    fn is_current(&self) -> bool {
        read_module(&self.settings.module, None).is_ok_and(|(_, digest)| digest == self.digest)
    }

    fn origin(&self) -> linkbus_plugin_api::Origin {
        linkbus_plugin_api::Origin::Module {
            path: self.settings.module.clone(),
            sha256: linkbus_plugin_api::hex::encode(&self.digest),
        }
    }
}
