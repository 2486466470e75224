//! [`ChaChaCipher`]: the keys loaded, the rules that give each recipient its key, and sealing
//! and opening payloads (the record layout is in the crate doc).

use chacha20poly1305::aead::{Aead, AeadInPlace, KeyInit, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};
use linkbus_plugin_api::message::RECIPIENTS_MAX;
use linkbus_plugin_api::{
    Address, AddressPattern, Cipher, CodecError, ConfigErrors, ConfigValue, read_plugin_section,
};

use crate::key::{KEY_BYTES, KEY_ID_BYTES, hex, key_id};
use crate::record::{self, NONCE_BYTES, Record, WRAPPED_BYTES, Wrap};
use crate::settings::{self, Settings};

/// The id of this codec in a message's encoding.
pub const CIPHER_ID: u8 = 128;

/// What a wrap's associated data starts with, so a wrap can never pass for a payload.
const WRAP_CONTEXT: &[u8] = b"wrap";

/// XChaCha20-Poly1305 payload encryption with keys chosen per recipient; see the crate doc.
pub struct ChaChaCipher {
    /// Every key it opens with, each once.
    keys: Vec<PayloadKey>,
    /// In the order written: a recipient's key is its first matching rule's.
    rules: Vec<Rule>,
    /// Recipients that take only payloads sealed under one of their keys (indexes into
    /// `keys`); a recipient's entry is the first that matches it.
    require: Vec<(Vec<AddressPattern>, Vec<usize>)>,
}

/// A loaded key.
struct PayloadKey {
    /// Names the key in records and errors.
    id: [u8; KEY_ID_BYTES],
    /// The key, ready to seal and open.
    aead: XChaCha20Poly1305,
}

/// One rule.
#[derive(Debug)]
struct Rule {
    /// A recipient matches when any of these does.
    to: Vec<AddressPattern>,
    /// Index into `keys`.
    key: usize,
}

impl std::fmt::Debug for ChaChaCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<String> = self.keys.iter().map(|k| hex(&k.id)).collect();
        f.debug_struct("ChaChaCipher").field("keys", &keys).field("rules", &self.rules).finish()
    }
}

impl ChaChaCipher {
    /// Reads the stage's section (the keys besides `kind`; `kind` itself is ignored) and
    /// loads its key files (paths relative to the working directory).
    ///
    /// # Errors
    /// Every problem of the section, each with its YAML path, as `check` reports them.
    pub fn from_config(config: &ConfigValue) -> Result<Self, ConfigErrors> {
        read_plugin_section("", config, settings::read).map(Self::new)
    }

    fn new(settings: Settings) -> Self {
        let keys = settings
            .keys
            .iter()
            .map(|key| PayloadKey { id: key_id(key), aead: XChaCha20Poly1305::new(&Key::from(*key)) })
            .collect();
        let rules = settings.rules.into_iter().map(|r| Rule { to: r.to, key: r.key }).collect();
        let require = settings.require.into_iter().map(|r| (r.to, r.keys)).collect();
        Self { keys, rules, require }
    }

    /// The keys `recipient` takes payloads under, when a `require` entry names it.
    fn required_keys(&self, recipient: &Address) -> Option<&[usize]> {
        self.require.iter().find(|(to, _)| to.iter().any(|p| p.matches(recipient))).map(|(_, keys)| &keys[..])
    }

    /// The loaded key `id`, when `recipient` may take a payload sealed under it.
    fn key_opening(&self, recipient: &Address, id: &[u8; KEY_ID_BYTES]) -> Result<&PayloadKey, CodecError> {
        let key = self.key(id)?;
        match self.required_keys(recipient) {
            Some(allowed) if !allowed.iter().any(|i| self.keys.get(*i).is_some_and(|k| k.id == *id)) => {
                Err(CodecError::Corrupt(format!(
                    "sealed under payload key {}, which {recipient} does not take (its require names others)",
                    hex(id)
                )))
            }
            _ => Ok(key),
        }
    }

    /// The key of `recipient`'s first matching rule.
    fn key_for(&self, recipient: &Address) -> Option<&PayloadKey> {
        let rule = self.rules.iter().find(|rule| rule.to.iter().any(|p| p.matches(recipient)))?;
        self.keys.get(rule.key)
    }

    /// The loaded key `id`.
    fn key(&self, id: &[u8; KEY_ID_BYTES]) -> Result<&PayloadKey, CodecError> {
        self.keys.iter().find(|k| k.id == *id).ok_or_else(|| {
            CodecError::Missing(format!(
                "payload key {} is not loaded here (add its file to the chacha20poly1305 stage's keys)",
                hex(id)
            ))
        })
    }

    /// Seals for one recipient under its key.
    fn seal_direct(
        key: &PayloadKey,
        recipient: &Address,
        plaintext: &[u8],
        associated_data: &[u8],
        output: &mut Vec<u8>,
    ) -> Result<Vec<u8>, CodecError> {
        let nonce = random::<NONCE_BYTES>()?;
        let aad = [associated_data, recipient.to_string().as_bytes()].concat();
        output.extend_from_slice(plaintext);
        key.aead.encrypt_in_place(&XNonce::from(nonce), &aad, output).map_err(|_| too_large())?;
        Ok(record::direct(&key.id, &nonce))
    }

    /// Seals for several recipients under a fresh data key wrapped for each.
    fn seal_wrapped(
        keys: &[(&Address, &PayloadKey)],
        plaintext: &[u8],
        associated_data: &[u8],
        output: &mut Vec<u8>,
    ) -> Result<Vec<u8>, CodecError> {
        let data_key = random::<KEY_BYTES>()?;
        let nonce = random::<NONCE_BYTES>()?;
        let addresses: Vec<String> = keys.iter().map(|(recipient, _)| recipient.to_string()).collect();
        let mut sealed_keys = Vec::with_capacity(keys.len());
        for ((_, key), address) in keys.iter().zip(&addresses) {
            let wrap_nonce = random::<NONCE_BYTES>()?;
            let aad = wrap_associated_data(associated_data, address.as_bytes());
            let wrapped = key
                .aead
                .encrypt(&XNonce::from(wrap_nonce), Payload { msg: &data_key, aad: &aad })
                .map_err(|_| too_large())?;
            let wrapped: [u8; WRAPPED_BYTES] = wrapped.try_into().map_err(|_| too_large())?;
            sealed_keys.push((key.id, wrap_nonce, wrapped));
        }
        let wraps: Vec<Wrap<'_>> = addresses
            .iter()
            .zip(&sealed_keys)
            .map(|(address, (key_id, nonce, wrapped))| Wrap {
                address: address.as_bytes(),
                key_id: *key_id,
                nonce: *nonce,
                wrapped,
            })
            .collect();
        let param = record::wrapped(&nonce, &wraps).ok_or_else(|| {
            CodecError::Refused(format!("a payload record holds at most 255 recipients, not {}", keys.len()))
        })?;
        let aad = [associated_data, &param].concat();
        output.extend_from_slice(plaintext);
        XChaCha20Poly1305::new(&Key::from(data_key))
            .encrypt_in_place(&XNonce::from(nonce), &aad, output)
            .map_err(|_| too_large())?;
        Ok(param)
    }

    /// Opens a payload sealed for several recipients, as `recipient`.
    fn open_wrapped(
        &self,
        recipient: &Address,
        (nonce, wraps): (&[u8; NONCE_BYTES], &[Wrap<'_>]),
        (param, sealed): (&[u8], &[u8]),
        associated_data: &[u8],
        output: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        let address = recipient.to_string();
        let wrap = wraps
            .iter()
            .find(|w| w.address == address.as_bytes())
            .ok_or_else(|| CodecError::Corrupt(format!("not sealed for {recipient}")))?;
        let key = self.key_opening(recipient, &wrap.key_id)?;
        let aad = wrap_associated_data(associated_data, address.as_bytes());
        let data_key = key
            .aead
            .decrypt(&XNonce::from(wrap.nonce), Payload { msg: wrap.wrapped, aad: &aad })
            .map_err(|_| failed())?;
        let data_key: [u8; KEY_BYTES] = data_key.try_into().map_err(|_| failed())?;
        // Invariant: the whole record is bound, so no wrap of another recipient can change.
        let aad = [associated_data, param].concat();
        output.extend_from_slice(sealed);
        XChaCha20Poly1305::new(&Key::from(data_key))
            .decrypt_in_place(&XNonce::from(*nonce), &aad, output)
            .map_err(|_| failed())
    }
}

impl Cipher for ChaChaCipher {
    fn id(&self) -> u8 {
        CIPHER_ID
    }

    fn seal(
        &self,
        recipients: &[Address],
        plaintext: &[u8],
        associated_data: &[u8],
        output: &mut Vec<u8>,
    ) -> Result<Option<Vec<u8>>, CodecError> {
        let keys: Vec<Option<&PayloadKey>> = recipients.iter().map(|r| self.key_for(r)).collect();
        if keys.iter().all(Option::is_none) {
            return Ok(None);
        }
        let without: Vec<String> =
            recipients.iter().zip(&keys).filter(|(_, k)| k.is_none()).map(|(r, _)| r.to_string()).collect();
        if !without.is_empty() {
            return Err(CodecError::Refused(format!(
                "no payload key for {} while the other recipients have one: send to them separately, or add a \
                 chacha20poly1305 rule that names a key for them",
                without.join(", ")
            )));
        }
        if recipients.len() > RECIPIENTS_MAX {
            return Err(CodecError::Refused(format!(
                "a sealed payload is for at most {RECIPIENTS_MAX} recipients, not {}",
                recipients.len()
            )));
        }
        let keys: Vec<(&Address, &PayloadKey)> =
            recipients.iter().zip(keys).filter_map(|(r, k)| Some((r, k?))).collect();
        output.clear();
        let sealed = match keys[..] {
            [(recipient, key)] => Self::seal_direct(key, recipient, plaintext, associated_data, output),
            _ => Self::seal_wrapped(&keys, plaintext, associated_data, output),
        };
        if sealed.is_err() {
            output.clear();
        }
        sealed.map(Some)
    }

    fn requires(&self, recipient: &Address) -> bool {
        self.required_keys(recipient).is_some()
    }

    fn open(
        &self,
        recipient: &Address,
        param: &[u8],
        sealed: &[u8],
        associated_data: &[u8],
        output: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        output.clear();
        let opened = match record::parse(param)? {
            Record::Direct { key_id, nonce } => self.key_opening(recipient, &key_id).and_then(|key| {
                let aad = [associated_data, recipient.to_string().as_bytes()].concat();
                output.extend_from_slice(sealed);
                key.aead.decrypt_in_place(&XNonce::from(nonce), &aad, output).map_err(|_| failed())
            }),
            Record::Wrapped { nonce, wraps } => {
                self.open_wrapped(recipient, (&nonce, &wraps), (param, sealed), associated_data, output)
            }
        };
        if opened.is_err() {
            output.clear();
        }
        opened
    }
}

/// What a wrap binds: that it is a wrap, the message's associated data, and its recipient.
fn wrap_associated_data(associated_data: &[u8], address: &[u8]) -> Vec<u8> {
    [WRAP_CONTEXT, associated_data, address].concat()
}

/// `N` bytes from the system's random source.
fn random<const N: usize>() -> Result<[u8; N], CodecError> {
    let mut bytes = [0; N];
    getrandom::fill(&mut bytes)
        .map_err(|e| CodecError::Refused(format!("no random bytes for a payload nonce or key: {e}")))?;
    Ok(bytes)
}

/// Why opening failed, whatever the cause (the AEAD cannot tell them apart).
fn failed() -> CodecError {
    CodecError::Corrupt("authentication failed: the payload, its header or the key is wrong".into())
}

/// XChaCha20-Poly1305 seals at most 256 GiB; nothing else makes sealing fail.
fn too_large() -> CodecError {
    CodecError::Refused("the payload is too large to seal".into())
}
