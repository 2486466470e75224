//! Native plugins of linkbus: plugins built as shared libraries and loaded by path from a
//! node's configuration, through a checked ABI.
//!
//! - [`abi`]: every type that crosses the boundary, and the ABI's own version;
//! - [`loader`]: a library read, pinned, checked and kept for the life of the process;
//! - [`adapter`]: a library's plugins as registry entries, its store as a `Store`;
//! - [`export`] and [`export_plugins!`]: the plugin side, for the library's own crate.
//!
//! This is the only crate of linkbus with `unsafe` code: loading a library, reading its
//! ABI tag, and the static the export macro writes into a plugin. abi_stable checks the
//! layouts; it stays behind this crate's types so it can be replaced.

pub mod abi;
pub mod adapter;
pub mod export;
pub mod loader;

pub use abi::NATIVE_ABI_VERSION;
pub use adapter::{NativeStoreAdapter, plugins};
pub use loader::{Library, LoadError, PluginInfo, load};

/// The crate the export macro's expansion names.
#[doc(hidden)]
pub use abi_stable;
/// The plugin API a library implements, for the export macro's expansion.
#[doc(hidden)]
pub use linkbus_plugin_api;

/// Exports a plugin library's plugins: `version` and a list of `PluginEntry` statics, each
/// written as for a built-in plugin (its `inventory::submit!` left out). Use it once, in a
/// crate built as a `cdylib`; this ABI version carries stores.
///
/// ```ignore
/// pub static SQLITE: PluginEntry = PluginEntry { name: "sqlite", summary: "...", check, factory: Factory::Store(build) };
/// linkbus_native::export_plugins!(version: env!("CARGO_PKG_VERSION"), plugins: [SQLITE]);
/// ```
#[macro_export]
macro_rules! export_plugins {
    (version: $version:expr, plugins: [$($entry:path),+ $(,)?] $(,)?) => {
        #[doc(hidden)]
        pub struct LinkbusNativeExports;

        impl $crate::export::Exports for LinkbusNativeExports {
            const VERSION: &'static str = $version;
            const PLUGINS: &'static [&'static $crate::linkbus_plugin_api::PluginEntry] = &[$(&$entry),+];
        }

        /// The library's ABI tag, read before anything else in it.
        #[doc(hidden)]
        // SAFETY: a symbol name only linkbus plugins export, once per library (this macro
        // is used once), so it clashes with nothing the process links.
        #[unsafe(export_name = "linkbus_native_abi")]
        pub static LINKBUS_NATIVE_ABI: $crate::abi::AbiTag = $crate::abi::AbiTag::CURRENT;

        /// abi_stable's library header (the name is abi_stable's root module symbol).
        #[doc(hidden)]
        // SAFETY: abi_stable's root module symbol (a test checks the name), defined once per
        // library, as `#[export_root_module]` would define it.
        #[unsafe(export_name = "_1as_0lib_1header_0root_bmodule_bloader")]
        pub static LINKBUS_NATIVE_ROOT: $crate::abi_stable::library::LibHeader = {
            extern "C" fn root() -> $crate::abi_stable::library::RootModuleResult {
                $crate::abi_stable::library::__call_root_module_loader(
                    $crate::export::module::<LinkbusNativeExports>,
                )
            }
            // SAFETY: `root` returns the prefix reference of a `NativeModuleRef`, the type
            // the header is made for.
            unsafe {
                $crate::abi_stable::library::LibHeader::from_constructor::<$crate::abi::NativeModuleRef>(
                    root,
                    $crate::abi_stable::library::CheckTypeLayout::Yes,
                )
            }
        };
    };
}

/// Exports only an ABI tag of `version`: for the loader's tests, which need libraries
/// of another ABI version and libraries without a root module.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_abi_tag_only {
    ($version:expr) => {
        /// A tag with no root module behind it.
        // SAFETY: as in `export_plugins!`; a test library uses one or the other, never both.
        #[unsafe(export_name = "linkbus_native_abi")]
        pub static LINKBUS_NATIVE_ABI: $crate::abi::AbiTag =
            $crate::abi::AbiTag { magic: $crate::abi::AbiTag::MAGIC, abi_version: $version };
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_export_macro_names_abi_stables_root_symbol() {
        assert_eq!(abi_stable::library::ROOT_MODULE_LOADER_NAME, "_1as_0lib_1header_0root_bmodule_bloader");
    }
}
