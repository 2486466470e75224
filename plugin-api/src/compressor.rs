//! The `Compressor` extension point: payload compression applied before encryption.

/// Why a compressor failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// Decompression would produce more than the caller's limit (a compression bomb, or a
    /// message over `message_bytes_max`).
    #[error("output exceeds {limit} bytes")]
    OutputTooLarge {
        /// The limit that was hit.
        limit: usize,
    },
    /// The input is not valid for this codec, or authentication failed.
    #[error("corrupt input: {0}")]
    Corrupt(String),
}

/// Compresses and decompresses payloads. Synchronous and free of I/O.
pub trait Compressor: Send + Sync {
    /// The id written next to compressed payloads, so the receiver picks the same codec.
    fn id(&self) -> u8;

    /// Appends the compressed form of `input` to `output`.
    ///
    /// # Errors
    /// [`CodecError`] when the codec fails.
    fn compress(&self, input: &[u8], output: &mut Vec<u8>) -> Result<(), CodecError>;

    /// Appends the decompressed form of `input` to `output`, never more than
    /// `output_bytes_max` bytes.
    ///
    /// # Errors
    /// [`CodecError::OutputTooLarge`] past the limit, [`CodecError::Corrupt`] on bad input.
    fn decompress(
        &self,
        input: &[u8],
        output: &mut Vec<u8>,
        output_bytes_max: usize,
    ) -> Result<(), CodecError>;
}
