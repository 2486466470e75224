//! The `wasm` filter plugin of linkbus: user filters as WebAssembly core modules, run by
//! wasmtime under hard limits (fuel, an epoch deadline, a memory cap, an output cap), through
//! the filter ABI v1 (`docs/filter-abi.md`).
//!
//! - [`abi`]: the batch written for a guest and its verdicts read back, every length checked;
//! - [`instance`]: the engine, modules checked at load, long-lived instances and their calls;
//! - [`plugin`]: the registered `wasm` filter: a `plugins.filters` entry's settings, its
//!   module pinned and compiled once, its instance rebuilt after repeated failures.
//!
//! Only this crate (and the binary that links it) builds wasmtime.
#![forbid(unsafe_code)]

pub mod abi;
pub mod instance;
pub mod plugin;

pub use plugin::{WasmFilter, WasmSettings};
