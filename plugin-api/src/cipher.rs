//! The `Cipher` extension point: end-to-end payload encryption. The origin seals a payload
//! under a key its configuration names for the recipients; only a recipient's node opens it.
//!
//! What a relay needs to route stays readable, but the host binds the message's stable
//! fields as associated data (`linkbus_proto::wire::associated_data`), so a relay can neither
//! read the payload nor change those fields undetected. The cipher binds each recipient's
//! address itself: [`Cipher::open`] is asked for one recipient, and must fail for an address
//! the message was not sealed for.

use crate::compressor::CodecError;
use crate::name::Address;

/// Seals and opens payloads. Synchronous, free of I/O, and shared between tasks; keys come
/// from the plugin's own configuration section.
pub trait Cipher: Send + Sync {
    /// The id written in the message's encoding: `128..=255` (compressors have `1..=127`, so
    /// a node knows a step it cannot undo is a cipher's without knowing the cipher).
    fn id(&self) -> u8;

    /// Seals `plaintext`, a payload for `recipients`, into `output` (empty when called),
    /// binding `associated_data`, and returns the step's `param`; `Ok(None)` leaves the
    /// payload as it is (no rule names a key for any of these recipients).
    ///
    /// # Errors
    /// [`CodecError::Refused`] when some recipients have a key and others none.
    fn seal(
        &self,
        recipients: &[Address],
        plaintext: &[u8],
        associated_data: &[u8],
        output: &mut Vec<u8>,
    ) -> Result<Option<Vec<u8>>, CodecError>;

    /// Whether `recipient` takes only payloads this cipher sealed (its configuration says
    /// so): the destination dead-letters a message for it that arrives unsealed, so a relay
    /// cannot strip the seal and pass its own payload off. None, unless overridden.
    fn requires(&self, recipient: &Address) -> bool {
        let _ = recipient;
        false
    }

    /// Opens `sealed`, sealed with step record `param`, for `recipient` into `output` (empty
    /// when called), after checking it, `associated_data` and that it was sealed for
    /// `recipient`.
    ///
    /// # Errors
    /// [`CodecError::Corrupt`] when authentication fails, [`CodecError::Missing`] when the
    /// key it was sealed under is not here.
    fn open(
        &self,
        recipient: &Address,
        param: &[u8],
        sealed: &[u8],
        associated_data: &[u8],
        output: &mut Vec<u8>,
    ) -> Result<(), CodecError>;
}
