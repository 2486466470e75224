//! Codecs on the message path: compressors and payload ciphers named in `plugins.stages`.
//!
//! - At the origin each is a stage, in the order configured: it encodes the payload of a
//!   put's messages (when its rules name their recipients) and records a [`Step`] in the
//!   message's encoding. A cipher binds [`associated_data`] of the message and the steps
//!   before its own.
//! - Relays never decode: they route by the fields that stay readable.
//! - At the destination, [`Codecs::check_arrivals`] undoes every step (in reverse) in memory,
//!   bounded by the receiving queue's size limit, before a message is queued; one that does
//!   not decode is dead-lettered (`decode_failed`, `decrypt_failed`, `too_large`) and its
//!   origin hears of it. The plaintext is dropped: the queue keeps the message as it came.
//! - A client's get opens it again ([`Codecs::open_for_client`]): only then, in memory, does
//!   the plaintext exist on the destination node, so no data directory ever holds it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use linkbus_plugin_api::message::{ENCODING_STEPS_MAX, STEP_PARAM_BYTES_MAX};
use linkbus_plugin_api::registry::{BuildContext, Builder};
use linkbus_plugin_api::{Address, Cipher, CodecError, Compressor, Message, PluginError, Step};
use linkbus_proto::wire::associated_data;

use super::refusal::{Refusal, RefusalCode};
use super::stages::{Site, Stage, StageBatch, StageContext, StageFactory};
use crate::config::Config;

/// Header with the size of an encoded message's payload as written (set by the origin,
/// checked and set again by the destination as it decodes it): what a get counts the message
/// as. Not bound by a cipher ([`linkbus_proto::wire::UNBOUND_HEADERS`]).
pub const PAYLOAD_BYTES_HEADER: &str = "linkbus.payload_bytes";

/// Bytes `message` takes when handed to a client: its wire form, with an encoded payload
/// counted at its size as written ([`PAYLOAD_BYTES_HEADER`]; without it, as `bytes_max`, the
/// most it can be), so a get of small compressed messages never opens into more than its
/// limits allow.
pub(crate) fn handed_out_len(message: &Message, bytes_max: usize) -> usize {
    let encoded = linkbus_proto::wire::encoded_len(message);
    if !message.is_encoded() {
        return encoded;
    }
    let written = written_len(message).unwrap_or(bytes_max);
    encoded.saturating_sub(message.content.payload.len()).saturating_add(written.min(bytes_max))
}

/// The size of `message`'s payload as its sender wrote it: its payload's, or for an
/// encoded one what [`PAYLOAD_BYTES_HEADER`] says (`None` without the mark).
pub(crate) fn written_len(message: &Message) -> Option<usize> {
    if !message.is_encoded() {
        return Some(message.content.payload.len());
    }
    message.content.header(PAYLOAD_BYTES_HEADER).and_then(|v| v.parse().ok())
}

/// Sets `message`'s [`PAYLOAD_BYTES_HEADER`] to `bytes` (when there is room for a header).
pub(crate) fn mark_payload_bytes(message: &mut Message, bytes: usize) {
    let headers = &mut message.content.headers;
    if let Some((_, value)) = headers.iter_mut().find(|(k, _)| k == PAYLOAD_BYTES_HEADER) {
        *value = bytes.to_string();
    } else if headers.len() < linkbus_plugin_api::message::HEADERS_MAX {
        headers.push((PAYLOAD_BYTES_HEADER.to_owned(), bytes.to_string()));
    }
}

/// Codec ids below this are compressors', the others ciphers' (so a node that has neither
/// configured still knows which failure a step it cannot undo is).
pub(crate) const CIPHER_IDS_FROM: u8 = 128;

/// One configured codec.
#[derive(Clone)]
enum Codec {
    Compressor(Arc<dyn Compressor>),
    Cipher(Arc<dyn Cipher>),
}

impl Codec {
    fn id(&self) -> u8 {
        match self {
            Self::Compressor(c) => c.id(),
            Self::Cipher(c) => c.id(),
        }
    }
}

/// What one codec's origin stage did since the node started.
#[derive(Debug, Default)]
pub struct CodecCounts {
    /// Messages it encoded.
    pub messages: AtomicU64,
    /// Their payload bytes before.
    pub bytes_in: AtomicU64,
    /// Their payload bytes after.
    pub bytes_out: AtomicU64,
}

/// What a codec's origin stage did: its name and counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecStats {
    /// The codec's name (`zstd`).
    pub name: Arc<str>,
    /// Messages it encoded.
    pub messages: u64,
    /// Their payload bytes before.
    pub bytes_in: u64,
    /// Their payload bytes after.
    pub bytes_out: u64,
}

/// One configured codec: its registered name, the plugin, and what its stage did.
#[derive(Clone)]
struct Configured {
    name: Arc<str>,
    codec: Codec,
    counts: Arc<CodecCounts>,
}

/// The node's codecs, in configured order (a handful: found by id in a short scan).
#[derive(Default, Clone)]
pub(crate) struct Codecs {
    chain: Vec<Configured>,
}

impl std::fmt::Debug for Codecs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.chain.iter().map(|c| &c.name)).finish()
    }
}

/// Why a message that arrived does not decode here: the dead-letter code's refusal.
fn undecodable(step: &Step, error: &CodecError, name: Option<&str>) -> Refusal {
    let what = name.map_or_else(|| format!("codec {}", step.codec), |n| format!("codec '{n}'"));
    let code = match error {
        CodecError::OutputTooLarge { .. } => RefusalCode::TooLarge,
        _ if step.codec >= CIPHER_IDS_FROM => RefusalCode::DecryptFailed,
        _ => RefusalCode::DecodeFailed,
    };
    Refusal::new(code, format!("{what} cannot undo its step: {error}"))
}

impl Codecs {
    /// The codecs of `config.plugins.stages`, built from the registry.
    ///
    /// # Errors
    /// A plugin that fails to build, an id outside its kind's range, or one used twice.
    pub(crate) fn build(config: &Config) -> Result<Self, PluginError> {
        let ctx = BuildContext { node: config.node.name.clone(), data_dir: config.node.data_dir.clone() };
        let mut codecs = Self::default();
        for choice in &config.plugins.stages {
            let failed = |reason: String| PluginError { plugin: choice.kind.clone(), reason };
            let registry = &config.plugins.registry;
            let entry = ["compressor", "cipher"]
                .into_iter()
                .find_map(|point| registry.find(point, &choice.kind, choice.library_path()))
                .ok_or_else(|| failed("no such compressor or cipher".into()))?;
            let codec = match &entry.builder {
                Builder::Compressor(build) => Codec::Compressor(Arc::from(build(&choice.section, &ctx)?)),
                Builder::Cipher(build) => Codec::Cipher(Arc::from(build(&choice.section, &ctx)?)),
                other => return Err(failed(format!("is a {} plugin, not a stage", other.kind()))),
            };
            let id = codec.id();
            let cipher = matches!(codec, Codec::Cipher(_));
            if id == 0 || cipher != (id >= CIPHER_IDS_FROM) {
                return Err(failed(format!(
                    "codec id {id} is outside its range (compressors 1..{CIPHER_IDS_FROM}, ciphers {CIPHER_IDS_FROM}..=255)"
                )));
            }
            if let Some(other) = codecs.find(id) {
                return Err(failed(format!("codec id {id} is also '{}''s", other.name)));
            }
            codecs.chain.push(Configured { name: entry.name.clone().into(), codec, counts: Arc::default() });
        }
        Ok(codecs)
    }

    /// The codec with `id`, if one is configured.
    fn find(&self, id: u8) -> Option<&Configured> {
        self.chain.iter().find(|c| c.codec.id() == id)
    }

    /// The stage of each codec, in configured order.
    pub(crate) fn stages(&self) -> Vec<Arc<dyn StageFactory>> {
        self.chain.iter().map(|c| Arc::new(CodecStage(c.clone())) as _).collect()
    }

    /// What each codec's origin stage did, in configured order.
    pub(crate) fn stats(&self) -> Vec<CodecStats> {
        self.chain
            .iter()
            .map(|c| CodecStats {
                name: c.name.clone(),
                messages: c.counts.messages.load(Ordering::Relaxed),
                bytes_in: c.counts.bytes_in.load(Ordering::Relaxed),
                bytes_out: c.counts.bytes_out.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Whether a cipher is configured (which may require messages to arrive sealed).
    pub(crate) fn has_cipher(&self) -> bool {
        self.chain.iter().any(|c| matches!(c.codec, Codec::Cipher(_)))
    }

    /// Checks that `message`, arriving for `recipient`, was sealed last by each configured
    /// cipher that requires it ([`Cipher::requires`]).
    ///
    /// # Errors
    /// The `decrypt_failed` refusal naming the cipher and what arrived.
    pub(crate) fn check_required(&self, message: &Message, recipient: &Address) -> Result<(), Refusal> {
        for Configured { name, codec, .. } in &self.chain {
            let Codec::Cipher(cipher) = codec else { continue };
            if !cipher.requires(recipient) || message.encoding.last().is_some_and(|s| s.codec == cipher.id())
            {
                continue;
            }
            let how = if message.is_encoded() { "not sealed by it last" } else { "unsealed" };
            return Err(Refusal::new(
                RefusalCode::DecryptFailed,
                format!(
                    "{recipient} takes only messages sealed by '{name}' (its require), and this one arrived {how}"
                ),
            ));
        }
        Ok(())
    }

    /// The plaintext of `message`'s payload for `recipient`, never more than `bytes_max`.
    ///
    /// # Errors
    /// The refusal (with its dead-letter code) of the first step that does not undo.
    pub(crate) fn decode(
        &self,
        message: &Message,
        recipient: &Address,
        bytes_max: usize,
    ) -> Result<Bytes, Refusal> {
        let mut payload = message.content.payload.clone();
        let mut ad = Vec::new();
        for (at, step) in message.encoding.iter().enumerate().rev() {
            let Some(Configured { name, codec, .. }) = self.find(step.codec) else {
                let kind = if step.codec >= CIPHER_IDS_FROM { "cipher" } else { "compressor" };
                let error = CodecError::Missing(format!(
                    "no {kind} with id {} is configured on this node (plugins.stages)",
                    step.codec
                ));
                return Err(undecodable(step, &error, None));
            };
            let mut out = Vec::new();
            let done = match codec {
                Codec::Compressor(c) => c.decompress(&step.param, &payload, &mut out, bytes_max),
                Codec::Cipher(c) => {
                    ad.clear();
                    associated_data(message, &message.encoding[..at], step.codec, &mut ad);
                    c.open(recipient, &step.param, &payload, &ad, &mut out)
                }
            };
            done.map_err(|e| undecodable(step, &e, Some(name)))?;
            payload = Bytes::from(out);
        }
        if payload.len() > bytes_max {
            let error = CodecError::OutputTooLarge { limit: bytes_max };
            return Err(Refusal::new(RefusalCode::TooLarge, format!("decoded payload: {error}")));
        }
        Ok(payload)
    }
}

/// A codec as a stage: at the origin it encodes; it acts nowhere else (decoding follows
/// the message's own record, not the chain).
struct CodecStage(Configured);

impl StageFactory for CodecStage {
    fn name(&self) -> &str {
        &self.0.name
    }

    fn build(&self, context: &StageContext<'_>) -> Option<Box<dyn Stage>> {
        (context.site == Site::Origin)
            .then(|| Box::new(Encode { codec: self.0.codec.clone(), counts: self.0.counts.clone() }) as _)
    }
}

/// A codec's origin stage.
struct Encode {
    codec: Codec,
    counts: Arc<CodecCounts>,
}

impl Stage for Encode {
    fn run(&mut self, batch: &mut StageBatch<'_, '_>) {
        let (mut messages, mut bytes_in, mut bytes_out) = (0, 0, 0);
        let mut ad = Vec::new();
        for index in 0..batch.messages().len() {
            let message = &mut *batch.messages()[index];
            let recipients = &message.content.recipients;
            let mut out = Vec::new();
            let done = match &self.codec {
                Codec::Compressor(c) => c.compress(recipients, &message.content.payload, &mut out),
                Codec::Cipher(c) => {
                    ad.clear();
                    associated_data(message, &message.encoding, c.id(), &mut ad);
                    c.seal(recipients, &message.content.payload, &ad, &mut out)
                }
            };
            match done {
                Ok(None) => {}
                Ok(Some(param))
                    if param.len() > STEP_PARAM_BYTES_MAX || message.encoding.len() >= ENCODING_STEPS_MAX =>
                {
                    let reason = format!(
                        "its record of {} bytes, or its step after {} others, is over the limits ({STEP_PARAM_BYTES_MAX} bytes, {ENCODING_STEPS_MAX} steps)",
                        param.len(),
                        message.encoding.len()
                    );
                    batch.refuse(index, reason);
                }
                Ok(Some(param)) => {
                    messages += 1;
                    bytes_in += message.content.payload.len() as u64;
                    bytes_out += out.len() as u64;
                    if !message.is_encoded() {
                        let written = message.content.payload.len();
                        mark_payload_bytes(message, written);
                    }
                    message.content.payload = Bytes::from(out);
                    message.encoding.push(Step { codec: self.codec.id(), param: Bytes::from(param) });
                }
                Err(e) => batch.refuse(index, e.to_string()),
            }
        }
        if messages > 0 {
            self.counts.messages.fetch_add(messages, Ordering::Relaxed);
            self.counts.bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
            self.counts.bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
        }
    }
}

/// `messages` as a client gets them, when one of them is encoded (`None` otherwise): each
/// encoded one opened, in memory, for a recipient of it on this node, with a
/// [`DECODED_HEADER`] naming the codecs undone. One that does not open (its key or dictionary
/// was removed since it arrived) is handed out as stored, its encoding showing, with a
/// warning: never as if it were plaintext. Messages of the dead-letter queue (`dead_letters`)
/// are handed out as stored: they were not delivered, and a dead letter's plaintext never
/// leaves the node.
pub(crate) fn open_for_client(
    node: &crate::node::NodeState,
    messages: &[Message],
    dead_letters: bool,
) -> Option<Vec<Message>> {
    if dead_letters || !messages.iter().any(Message::is_encoded) {
        return None;
    }
    let bytes_max = usize::try_from(node.config().messages.message_bytes_max).unwrap_or(usize::MAX);
    let opened = messages
        .iter()
        .map(|message| {
            if !message.is_encoded() {
                return message.clone();
            }
            let mut last = None;
            for to in message.content.recipients.iter().filter(|to| &to.node == node.name()) {
                match node.codecs().decode(message, to, bytes_max) {
                    Ok(payload) => return opened(node.codecs(), message, payload),
                    Err(refusal) => last = Some(refusal),
                }
            }
            if node.warnings().admit(crate::warnings::reason::UNDECODABLE) {
                let why = last.map_or_else(|| "no recipient of it is on this node".to_owned(), |r| r.reason);
                tracing::warn!(id = %message.id, %why, "A message does not open here; it is handed out as stored.");
            }
            message.clone()
        })
        .collect();
    Some(opened)
}

/// Header of a message handed to a client opened: the codecs undone, in the order applied
/// (`zstd,chacha20poly1305`). A payload a cipher opened is one a relay could not have
/// changed; one without the header arrived as its sender wrote it.
pub const DECODED_HEADER: &str = "linkbus.decoded";

/// Headers a client may not put: the node's marks of encoded messages.
pub(crate) const RESERVED_HEADERS: [&str; 2] = [PAYLOAD_BYTES_HEADER, DECODED_HEADER];

/// `message` with `payload`, its encoding undone, and marked so ([`DECODED_HEADER`]).
fn opened(codecs: &Codecs, message: &Message, payload: Bytes) -> Message {
    let mut opened = message.clone();
    opened.content.payload = payload;
    let names: Vec<&str> =
        message.encoding.iter().map(|s| codecs.find(s.codec).map_or("?", |c| &*c.name)).collect();
    opened.content.headers.retain(|(k, _)| k != PAYLOAD_BYTES_HEADER && k != DECODED_HEADER);
    if opened.content.headers.len() < linkbus_plugin_api::message::HEADERS_MAX {
        opened.content.headers.push((DECODED_HEADER.to_owned(), names.join(",")));
    }
    opened.encoding.clear();
    opened
}
