//! The `file` message handler plugin: reads files to send and writes files received under a
//! node's files directory (`node.files_dir`), never outside it.
//!
//! The directory is opened once as a capability (`cap_std::fs::Dir`): every later path is
//! looked up beneath that handle by the operating system, so a `..`, an absolute path or a
//! symbolic link leading outside the directory fails the lookup even if a name got past the
//! [`FileName`] rules. Files being received are written under [`PARTIAL_DIR`] and moved to
//! their name only when complete, with a hard link (which never replaces a file there) and
//! the removal of the partial name, each directory synced.
//!
//! Settings (`plugins.files`): `chunk_bytes` (bytes per chunk message, default 256 KiB),
//! `window_bytes` (bytes of one transfer travelling ahead of what its recipient confirmed,
//! default 16 MiB) and `in_flight_bytes` (of all the node's transfers together, default
//! 64 MiB, at least `window_bytes`).
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod dir;

use std::path::Path;

use linkbus_plugin_api::registry::{BuildContext, Factory, PluginEntry, PluginError};
use linkbus_plugin_api::{ConfigValue, FilesDir, HandlerError, Kind, MessageHandler, Section};

pub use crate::dir::CapFilesDir;

/// The name YAML selects it by.
pub const PLUGIN_NAME: &str = "file";
/// Default `chunk_bytes`.
pub const CHUNK_BYTES_DEFAULT: u64 = 256 << 10;
/// Smallest `chunk_bytes`.
pub const CHUNK_BYTES_MIN: u64 = 4 << 10;
/// Largest `chunk_bytes` (a chunk is one message, under the default message limit).
pub const CHUNK_BYTES_MAX: u64 = 2 << 20;
/// Default `window_bytes`.
pub const WINDOW_BYTES_DEFAULT: u64 = 16 << 20;
/// Largest `window_bytes`.
pub const WINDOW_BYTES_MAX: u64 = 1 << 30;
/// Default `in_flight_bytes`.
pub const IN_FLIGHT_BYTES_DEFAULT: u64 = 64 << 20;
/// Largest `in_flight_bytes`.
pub const IN_FLIGHT_BYTES_MAX: u64 = 4 << 30;

/// The handler: its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHandler {
    chunk_bytes: u64,
    window_bytes: u64,
    in_flight_bytes: u64,
}

impl Default for FileHandler {
    fn default() -> Self {
        Self {
            chunk_bytes: CHUNK_BYTES_DEFAULT,
            window_bytes: WINDOW_BYTES_DEFAULT,
            in_flight_bytes: IN_FLIGHT_BYTES_DEFAULT,
        }
    }
}

fn read(section: &Section<'_>) -> FileHandler {
    let chunk_bytes = section.number("chunk_bytes", CHUNK_BYTES_DEFAULT, CHUNK_BYTES_MIN, CHUNK_BYTES_MAX);
    let window_bytes =
        section.number("window_bytes", WINDOW_BYTES_DEFAULT, 2 * chunk_bytes, WINDOW_BYTES_MAX);
    let in_flight_bytes = section.number(
        "in_flight_bytes",
        IN_FLIGHT_BYTES_DEFAULT.max(window_bytes),
        window_bytes,
        IN_FLIGHT_BYTES_MAX,
    );
    FileHandler { chunk_bytes, window_bytes, in_flight_bytes }
}

fn check(section: &Section<'_>) {
    let _ = read(section);
}

fn build(config: &ConfigValue, _ctx: &BuildContext) -> Result<Box<dyn MessageHandler>, PluginError> {
    let handler = linkbus_plugin_api::read_plugin_section("plugins.files", config, read)
        .map_err(|e| PluginError { plugin: PLUGIN_NAME.into(), reason: e.to_string() })?;
    Ok(Box::new(handler))
}

impl MessageHandler for FileHandler {
    fn kind(&self) -> Kind {
        Kind::File
    }

    fn chunk_bytes(&self) -> usize {
        usize::try_from(self.chunk_bytes).unwrap_or(usize::MAX)
    }

    fn window_bytes(&self) -> u64 {
        self.window_bytes
    }

    fn in_flight_bytes(&self) -> u64 {
        self.in_flight_bytes
    }

    fn open(&self, root: &Path) -> Result<Box<dyn FilesDir>, HandlerError> {
        CapFilesDir::open(root)
            .map(|dir| Box::new(dir) as Box<dyn FilesDir>)
            .map_err(|e| HandlerError(format!("files directory {}: {e}", root.display())))
    }
}

/// The plugin's registration.
pub const FILE: PluginEntry = PluginEntry {
    name: PLUGIN_NAME,
    summary: "files sent and received under the node's files directory (node.files_dir), resumable",
    check,
    factory: Factory::Handler(build),
};

inventory::submit!(FILE);

#[cfg(test)]
mod tests {
    use linkbus_plugin_api::file::PARTIAL_DIR;

    use super::*;

    #[test]
    fn the_plugin_is_registered_as_a_handler_and_reads_its_section() {
        let entry = linkbus_plugin_api::registry::find("handler", "file").expect("registered");
        let section = ConfigValue::Map(vec![
            ("kind".into(), ConfigValue::Str("file".into())),
            ("chunk_bytes".into(), ConfigValue::Uint(65536)),
        ]);
        let ctx = BuildContext { node: "A".parse().expect("name"), data_dir: ".".into() };
        let Factory::Handler(build) = entry.factory else { panic!("not a handler") };
        let handler = build(&section, &ctx).expect("builds");
        assert_eq!((handler.chunk_bytes(), handler.window_bytes()), (65536, WINDOW_BYTES_DEFAULT));
        assert_eq!(handler.in_flight_bytes(), IN_FLIGHT_BYTES_DEFAULT);
        let small = ConfigValue::Map(vec![
            ("window_bytes".into(), ConfigValue::Uint(8 << 20)),
            ("in_flight_bytes".into(), ConfigValue::Uint(1 << 20)),
        ]);
        let error = build(&small, &ctx).err().expect("refused").to_string();
        assert!(error.contains("plugins.files.in_flight_bytes"), "{error}");
        let bad = ConfigValue::Map(vec![("chunk_bytes".into(), ConfigValue::Uint(1))]);
        let error = build(&bad, &ctx).err().expect("refused").to_string();
        assert!(error.contains("plugins.files.chunk_bytes"), "{error}");
        assert_eq!(PARTIAL_DIR, ".linkbus-partial");
    }
}
