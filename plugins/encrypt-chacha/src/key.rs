//! Payload key files and key ids: reading a key file (64 hex digits, readable by its owner
//! only), writing a new one, and the id that names a key in a step record.

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use blake2::{Blake2s256, Digest};

/// Bytes of a payload key.
pub const KEY_BYTES: usize = 32;
/// Bytes of a key id.
pub const KEY_ID_BYTES: usize = 8;
/// Largest key file read (64 hex digits and a line ending fit well within it).
const KEY_FILE_BYTES_MAX: u64 = 256;
/// What a key id hashes before the key, so the id of a payload key is no hash of it used
/// elsewhere.
const KEY_ID_CONTEXT: &[u8] = b"linkbus payload key id v1";

/// The id of `key`: the first 8 bytes of BLAKE2s-256 over `"linkbus payload key id v1"` and
/// the key. It names the key in step records and in errors without revealing it.
pub fn key_id(key: &[u8; KEY_BYTES]) -> [u8; KEY_ID_BYTES] {
    let digest = Blake2s256::new().chain_update(KEY_ID_CONTEXT).chain_update(key).finalize();
    let mut id = [0; KEY_ID_BYTES];
    id.copy_from_slice(&digest[..KEY_ID_BYTES]);
    id
}

pub(crate) use linkbus_plugin_api::hex::encode as hex;

/// Reads the payload key in file `path`: 64 hex digits, a line ending allowed after them.
/// The file must not be readable or writable by group or others.
///
/// # Errors
/// In words, naming the file: it cannot be read, its mode lets others at it (saying to
/// `chmod 600` it), or its content is not a key.
pub fn read_key_file(path: &Path) -> Result<[u8; KEY_BYTES], String> {
    let shown = path.display();
    let unreadable = |e: std::io::Error| format!("cannot read payload key file {shown}: {e}");
    // The mode of the file opened, not of a path that could change between two looks.
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    if !meta.is_file() {
        return Err(format!("payload key file {shown} is not a regular file"));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "payload key file {shown} has mode {mode:03o}, which lets others at the key; run chmod 600 {shown}"
        ));
    }
    let mut text = Vec::new();
    file.take(KEY_FILE_BYTES_MAX).read_to_end(&mut text).map_err(unreadable)?;
    parse_key(&text).map_err(|e| format!("payload key file {shown}: {e}"))
}

/// The key in a key file's `text`.
fn parse_key(text: &[u8]) -> Result<[u8; KEY_BYTES], String> {
    let digits = text.strip_suffix(b"\n").map_or(text, |t| t.strip_suffix(b"\r").unwrap_or(t));
    linkbus_plugin_api::hex::decode(digits).map_err(|e| format!("{e} (a line ending may follow)"))
}

/// Writes a new random payload key to `path` with mode 0600, creating its directory, and
/// returns its id. An existing file is never overwritten.
///
/// # Errors
/// The I/O error (`AlreadyExists` when the file exists), or the system's random source
/// failing.
pub fn write_new_key_file(path: &Path) -> std::io::Result<[u8; KEY_ID_BYTES]> {
    let mut key = [0; KEY_BYTES];
    getrandom::fill(&mut key).map_err(std::io::Error::other)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    writeln!(file, "{}", hex(&key))?;
    file.sync_all()?;
    Ok(key_id(&key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_file_reads_back_with_its_id_and_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/orders-1.key");
        let id = write_new_key_file(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let key = read_key_file(&path).unwrap();
        assert_eq!(key_id(&key), id);
        let again = write_new_key_file(&path).unwrap_err();
        assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(read_key_file(&path).unwrap(), key, "the first key stays");
    }

    #[test]
    fn a_key_file_open_to_others_is_refused_saying_how_to_fix_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("open.key");
        std::fs::write(&path, format!("{}\n", "ab".repeat(32))).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = read_key_file(&path).unwrap_err();
        assert!(
            error.contains("open.key") && error.contains("644") && error.contains("chmod 600"),
            "{error}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_key_file(&path).unwrap(), [0xab; 32]);
    }

    #[test]
    fn only_64_hex_digits_and_a_line_ending_are_a_key() {
        let digits = "0123456789abcdefABCDEF0123456789".repeat(2);
        assert!(parse_key(digits.as_bytes()).is_ok());
        assert!(parse_key(format!("{digits}\n").as_bytes()).is_ok());
        assert!(parse_key(format!("{digits}\r\n").as_bytes()).is_ok());
        for bad in [
            format!("{digits}\n\n"),
            format!(" {digits}"),
            digits[..62].to_owned(),
            format!("{}zz", &digits[..62]),
            format!("{}+f", &digits[..62]),
        ] {
            assert!(parse_key(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert!(parse_key("é".repeat(32).as_bytes()).is_err());
    }

    #[test]
    fn key_ids_are_fixed_by_the_key() {
        // BLAKE2s-256("linkbus payload key id v1" || 32 zero bytes), first 8 bytes.
        let zero = key_id(&[0; 32]);
        assert_eq!(zero, key_id(&[0; 32]));
        assert_ne!(zero, key_id(&[1; 32]));
        let mut hasher = Blake2s256::new();
        hasher.update(b"linkbus payload key id v1");
        hasher.update([0u8; 32]);
        assert_eq!(zero[..], hasher.finalize()[..8]);
    }
}
