//! The `Compressor` extension point: payload compression at the origin, applied before
//! encryption and undone at the destination, bounded there by the receiver's size limits.
//!
//! A compressor decides itself, from its configuration, which recipients' messages it
//! compresses and how (a level, a dictionary, a size below which a payload goes as it is).
//! What it needs to undo it travels with the message as its [`Step`](crate::Step)'s `param`.

use crate::name::Address;

/// Why a codec failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// Decoding would produce more than the caller's limit (a compression bomb, or a
    /// message over `message_bytes_max`).
    #[error("output exceeds {limit} bytes")]
    OutputTooLarge {
        /// The limit that was hit.
        limit: usize,
    },
    /// The input is not valid for this codec, or authentication failed.
    #[error("corrupt input: {0}")]
    Corrupt(String),
    /// What decoding needs is not here: a key, a dictionary.
    #[error("{0}")]
    Missing(String),
    /// The codec does not encode this message, and it must not travel without it (payload
    /// keys that differ for its recipients while one of them has none).
    #[error("{0}")]
    Refused(String),
}

/// Compresses and decompresses payloads. Synchronous, free of I/O, and shared between
/// tasks.
pub trait Compressor: Send + Sync {
    /// The id written in the message's encoding, so the receiver picks the same codec:
    /// `1..=127` (ciphers have `128..=255`).
    fn id(&self) -> u8;

    /// Compresses `input`, a payload for `recipients`, into `output` (empty when called), and
    /// returns the step's `param`; `Ok(None)` leaves the payload as it is (no rule for these
    /// recipients, smaller than the configured minimum, or it would not shrink).
    ///
    /// # Errors
    /// [`CodecError`] when the codec fails.
    fn compress(
        &self,
        recipients: &[Address],
        input: &[u8],
        output: &mut Vec<u8>,
    ) -> Result<Option<Vec<u8>>, CodecError>;

    /// Decompresses `input`, compressed with step record `param`, into `output` (empty
    /// when called), never more than `output_bytes_max` bytes and never allocating for more.
    ///
    /// # Errors
    /// [`CodecError::OutputTooLarge`] past the limit, [`CodecError::Corrupt`] on bad input,
    /// [`CodecError::Missing`] when a dictionary it names is not loaded.
    fn decompress(
        &self,
        param: &[u8],
        input: &[u8],
        output: &mut Vec<u8>,
        output_bytes_max: usize,
    ) -> Result<(), CodecError>;
}
