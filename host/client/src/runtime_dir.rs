//! Where clients find a local node: `NAME.sock` in the runtime directory.
//!
//! The runtime directory is `$LINKBUS_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/linkbus`, else
//! `linkbus-$USER` in the system's temporary directory.

use std::path::PathBuf;

/// The environment variable that names the runtime directory.
pub const RUNTIME_DIR_ENV: &str = "LINKBUS_RUNTIME_DIR";

/// The runtime directory, as described in the module doc.
pub fn runtime_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(RUNTIME_DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("linkbus");
    }
    let user = std::env::var("USER").unwrap_or_else(|_| "user".into());
    std::env::temp_dir().join(format!("linkbus-{user}"))
}

/// The client socket of the node called `name` in the runtime directory.
pub fn socket_for(name: &str) -> PathBuf {
    runtime_dir().join(format!("{name}.sock"))
}
