//! The `Cipher` extension point: end-to-end payload encryption with per-queue keys.
//!
//! The message header is authenticated as associated data but stays readable, so relays
//! route without decrypting.

use crate::compressor::CodecError;

/// Seals and opens payloads. Synchronous and free of I/O; keys come from the plugin's own
/// configuration section.
pub trait Cipher: Send + Sync {
    /// The id written next to sealed payloads.
    fn id(&self) -> u8;

    /// Appends the sealed form of `plaintext` to `output`, binding `associated_data`.
    ///
    /// # Errors
    /// [`CodecError`] when sealing fails.
    fn seal(&self, plaintext: &[u8], associated_data: &[u8], output: &mut Vec<u8>) -> Result<(), CodecError>;

    /// Appends the plaintext of `sealed` to `output` after checking it and
    /// `associated_data`.
    ///
    /// # Errors
    /// [`CodecError::Corrupt`] when authentication fails.
    fn open(&self, sealed: &[u8], associated_data: &[u8], output: &mut Vec<u8>) -> Result<(), CodecError>;
}
