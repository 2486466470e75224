//! Loading a plugin library: the file read once and pinned, its ABI tag and the layout of
//! every type that crosses the boundary checked before any function in it runs, and the
//! library kept for the life of the process.
//!
//! Libraries are never unloaded. A store, a vtable or a `'static` string a plugin handed
//! over points into the library's code and data; unloading it while any of them lives
//! would leave them dangling, and knowing that none does would take a count across every
//! thread of the node. A library whose file changes on disk is refused until the node
//! restarts, rather than loaded twice.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use abi_stable::library::{LibraryError, RawLibrary, lib_header_from_raw_library};
use abi_stable::std_types::RVec;
use linkbus_plugin_api::{ConfigIssue, ConfigValue, hex};
use sha2::{Digest, Sha256};

use crate::abi::{ABI_TAG_SYMBOL, AbiTag, NATIVE_ABI_VERSION, NativeContext, NativeIssue, NativeModuleRef};

/// Why a library was not loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The path as given.
        path: PathBuf,
        /// The system's explanation.
        reason: String,
    },
    /// The file's SHA-256 is not the pinned one.
    #[error("{path} has SHA-256 {found}, not the pinned {expected} (sha256:)")]
    Pin {
        /// The path.
        path: PathBuf,
        /// The pin.
        expected: String,
        /// The file's digest.
        found: String,
    },
    /// The file changed since this process loaded it.
    #[error(
        "{path} changed on disk since this process loaded it (SHA-256 {loaded}, now {found}); \
         libraries are never unloaded, so restart the node to load the new one"
    )]
    Changed {
        /// The path.
        path: PathBuf,
        /// The digest of the loaded library.
        loaded: String,
        /// The digest of the file now.
        found: String,
    },
    /// The system loader refused the file.
    #[error("{path} is not a loadable shared library: {reason}")]
    NotLibrary {
        /// The path.
        path: PathBuf,
        /// The system loader's explanation.
        reason: String,
    },
    /// The library exports no ABI tag.
    #[error("{path} is not a linkbus plugin library: it exports no `{ABI_TAG_SYMBOL}` symbol")]
    NoTag {
        /// The path.
        path: PathBuf,
    },
    /// The library was built against another ABI version.
    #[error(
        "{path} was built for native plugin ABI version {found}, and this node loads version {expected}: \
         rebuild the plugin against linkbus-native {crate_version}",
        crate_version = env!("CARGO_PKG_VERSION")
    )]
    AbiVersion {
        /// The path.
        path: PathBuf,
        /// [`NATIVE_ABI_VERSION`].
        expected: u32,
        /// The library's.
        found: u32,
    },
    /// The library has a tag but no root module.
    #[error("{path} has no plugin root module (is `export_plugins!` missing?): {reason}")]
    NoRoot {
        /// The path.
        path: PathBuf,
        /// abi_stable's explanation.
        reason: String,
    },
    /// The layout of a type crossing the boundary differs, or the root module failed.
    #[error("{path} does not match this node's plugin ABI: {reason}")]
    Incompatible {
        /// The path.
        path: PathBuf,
        /// abi_stable's explanation.
        reason: String,
    },
}

/// A plugin a library offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    /// The extension point (`store`).
    pub kind: String,
    /// The name YAML selects it by.
    pub name: String,
    /// One line.
    pub summary: String,
}

/// A loaded plugin library, kept until the process ends.
pub struct Library {
    path: PathBuf,
    sha256: [u8; 32],
    version: String,
    plugins: Vec<PluginInfo>,
    pub(crate) module: NativeModuleRef,
    /// The file the library was mapped from: kept open, so the number in its
    /// `/proc/self/fd` name is never given to another file.
    _file: &'static File,
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library")
            .field("path", &self.path)
            .field("sha256", &self.sha256_hex())
            .field("version", &self.version)
            .field("plugins", &self.plugins)
            .finish_non_exhaustive()
    }
}

/// Every library this process loaded, by canonical path.
static LOADED: Mutex<Vec<Arc<Library>>> = Mutex::new(Vec::new());

/// Loads the plugin library at `path` (or returns the one already loaded from it), its
/// bytes pinned to `pin` when given.
///
/// # Errors
/// [`LoadError`], naming the path and what was wrong.
pub fn load(path: &Path, pin: Option<[u8; 32]>) -> Result<Arc<Library>, LoadError> {
    let read_error = |e: std::io::Error| LoadError::Read { path: path.to_owned(), reason: e.to_string() };
    let canonical = path.canonicalize().map_err(read_error)?;
    let mut file = File::open(&canonical).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(read_error)?;
    let sha256: [u8; 32] = Sha256::digest(&bytes).into();
    if let Some(pin) = pin.filter(|pin| *pin != sha256) {
        return Err(LoadError::Pin {
            path: canonical,
            expected: hex::encode(&pin),
            found: hex::encode(&sha256),
        });
    }
    let mut loaded = LOADED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(library) = loaded.iter().find(|l| l.path == canonical) {
        if library.sha256 != sha256 {
            return Err(LoadError::Changed {
                path: canonical,
                loaded: library.sha256_hex(),
                found: hex::encode(&sha256),
            });
        }
        return Ok(Arc::clone(library));
    }
    let library = Arc::new(open(canonical, sha256, file)?);
    loaded.push(Arc::clone(&library));
    Ok(library)
}

/// Maps the library through the descriptor its bytes were read from (so the pinned bytes
/// are the ones mapped, whatever happens to the path meanwhile), then checks the ABI tag,
/// abi_stable's header and the root module's layout, in that order.
fn open(path: PathBuf, sha256: [u8; 32], file: File) -> Result<Library, LoadError> {
    let through = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    // SAFETY: mapping a library runs its initialisers. Only paths the node's configuration
    // names are loaded (the operator vouches for them, optionally by a pin), and a linkbus
    // plugin has no initialisers of its own. The handle is never closed (see the module
    // documentation), so nothing read from the library outlives it.
    let system = unsafe { libloading::Library::new(&through) }
        .map_err(|e| LoadError::NotLibrary { path: path.clone(), reason: error_chain(&e) })?;
    // Mapped now, so kept: the library, and the descriptor whose number names it (were it
    // closed, the system loader would take a later file with that number for this one).
    let file: &'static File = Box::leak(Box::new(file));
    let tag = read_tag(&system);
    std::mem::forget(system);
    let tag = tag.ok_or_else(|| LoadError::NoTag { path: path.clone() })?;
    if tag.magic != AbiTag::MAGIC {
        return Err(LoadError::NoTag { path });
    }
    if tag.abi_version != NATIVE_ABI_VERSION {
        return Err(LoadError::AbiVersion { path, expected: NATIVE_ABI_VERSION, found: tag.abi_version });
    }
    let raw = RawLibrary::load_at(&through)
        .map_err(|e| LoadError::NotLibrary { path: path.clone(), reason: e.to_string() })?;
    let raw: &'static RawLibrary = Box::leak(Box::new(raw));
    // SAFETY: the header is a `'static` in the library, which is never unloaded (`raw` is
    // leaked above).
    let header = unsafe { lib_header_from_raw_library(raw) }
        .map_err(|e| LoadError::NoRoot { path: path.clone(), reason: e.to_string() })?;
    // Checks abi_stable's version and the layout of the root module and of every type it
    // reaches, then runs the library's root module constructor.
    let module = header.init_root_module::<NativeModuleRef>().map_err(|e| match e {
        LibraryError::GetSymbolError { .. } => {
            LoadError::NoRoot { path: path.clone(), reason: e.to_string() }
        }
        e => LoadError::Incompatible { path: path.clone(), reason: e.to_string() },
    })?;
    if module.abi_version() != NATIVE_ABI_VERSION {
        return Err(LoadError::AbiVersion {
            path,
            expected: NATIVE_ABI_VERSION,
            found: module.abi_version(),
        });
    }
    let version = module.version()().into_string();
    let plugins = module.plugins()()
        .into_iter()
        .map(|p| PluginInfo {
            kind: p.kind.into_string(),
            name: p.name.into_string(),
            summary: p.summary.into_string(),
        })
        .collect();
    Ok(Library { path, sha256, version, plugins, module, _file: file })
}

/// The library's ABI tag, copied out.
fn read_tag(library: &libloading::Library) -> Option<AbiTag> {
    // SAFETY: the symbol, when present, is the `AbiTag` static `export_plugins!` defines; a
    // `#[repr(C)]` struct of plain integers, so any bytes there read as some tag, which is
    // then compared field by field.
    unsafe {
        let symbol = library.get::<*const AbiTag>(ABI_TAG_SYMBOL.as_bytes()).ok()?;
        Some(std::ptr::read_unaligned(*symbol))
    }
}

/// A system loader error with its causes.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl Library {
    /// The canonical path it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The SHA-256 of its bytes, as hexadecimal text.
    pub fn sha256_hex(&self) -> String {
        hex::encode(&self.sha256)
    }

    /// The version the library reports.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The plugins it offers (of the extension points this ABI carries).
    pub fn plugins(&self) -> &[PluginInfo] {
        &self.plugins
    }

    /// The problems the plugin's own check finds in `section` (the keys the node reads,
    /// `library` and `sha256`, already left out), with paths inside the section.
    pub fn check(&self, kind: &str, name: &str, section: &ConfigValue) -> Vec<ConfigIssue> {
        let json = linkbus_plugin_api::json::to_json(section);
        let issues: RVec<NativeIssue> = self.module.check()(kind.into(), name.into(), json.as_str().into());
        issues
            .into_iter()
            .map(|i| ConfigIssue { path: i.path.into_string(), message: i.message.into_string() })
            .collect()
    }

    pub(crate) fn context(context: &linkbus_plugin_api::BuildContext) -> NativeContext {
        NativeContext {
            node: context.node.as_str().into(),
            data_dir: context.data_dir.to_string_lossy().as_ref().into(),
        }
    }
}
