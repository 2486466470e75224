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

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use linkbus_plugin_api::registry::{self, BuildContext, Factory};
use linkbus_plugin_api::{Address, Cipher, CodecError, Compressor, Message, PluginError, Step};
use linkbus_proto::wire::associated_data;

use super::refusal::{Refusal, RefusalCode};
use super::stages::{Site, Stage, StageBatch, StageContext, StageFactory};
use crate::config::Config;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodecStats {
    /// The codec's name (`zstd`).
    pub name: &'static str,
    /// Messages it encoded.
    pub messages: u64,
    /// Their payload bytes before.
    pub bytes_in: u64,
    /// Their payload bytes after.
    pub bytes_out: u64,
}

/// The node's codecs, by id, and their stages in configured order.
#[derive(Default, Clone)]
pub(crate) struct Codecs {
    by_id: HashMap<u8, (String, Codec)>,
    order: Vec<u8>,
    counts: HashMap<u8, Arc<CodecCounts>>,
}

impl std::fmt::Debug for Codecs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.order.iter().filter_map(|id| self.by_id.get(id).map(|(n, _)| n))).finish()
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
            let entry = ["compressor", "cipher"]
                .iter()
                .find_map(|point| registry::find(point, &choice.kind))
                .ok_or_else(|| failed("no such compressor or cipher".into()))?;
            let codec = match entry.factory {
                Factory::Compressor(build) => Codec::Compressor(Arc::from(build(&choice.section, &ctx)?)),
                Factory::Cipher(build) => Codec::Cipher(Arc::from(build(&choice.section, &ctx)?)),
                other => return Err(failed(format!("is a {} plugin, not a stage", other.kind()))),
            };
            let id = codec.id();
            let cipher = matches!(codec, Codec::Cipher(_));
            if id == 0 || cipher != (id >= CIPHER_IDS_FROM) {
                return Err(failed(format!(
                    "codec id {id} is outside its range (compressors 1..{CIPHER_IDS_FROM}, ciphers {CIPHER_IDS_FROM}..=255)"
                )));
            }
            if let Some((other, _)) = codecs.by_id.get(&id) {
                return Err(failed(format!("codec id {id} is also '{other}''s")));
            }
            codecs.by_id.insert(id, (choice.kind.clone(), codec));
            codecs.order.push(id);
            codecs.counts.insert(id, Arc::default());
        }
        Ok(codecs)
    }

    /// The stage of each codec, in configured order.
    pub(crate) fn stages(&self) -> Vec<Arc<dyn StageFactory>> {
        self.order
            .iter()
            .filter_map(|id| Some((self.by_id.get(id)?, self.counts.get(id)?)))
            .map(|((name, codec), counts)| {
                Arc::new(CodecStage { name: name.clone(), codec: codec.clone(), counts: counts.clone() }) as _
            })
            .collect()
    }

    /// What each codec's origin stage did, in configured order.
    pub(crate) fn stats(&self) -> Vec<CodecStats> {
        self.order
            .iter()
            .filter_map(|id| {
                let (name, _) = self.by_id.get(id)?;
                let counts = self.counts.get(id)?;
                let name = registry::plugins().find(|p| p.name == name)?.name;
                Some(CodecStats {
                    name,
                    messages: counts.messages.load(Ordering::Relaxed),
                    bytes_in: counts.bytes_in.load(Ordering::Relaxed),
                    bytes_out: counts.bytes_out.load(Ordering::Relaxed),
                })
            })
            .collect()
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
            let Some((name, codec)) = self.by_id.get(&step.codec) else {
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
struct CodecStage {
    name: String,
    codec: Codec,
    counts: Arc<CodecCounts>,
}

impl StageFactory for CodecStage {
    fn name(&self) -> &str {
        &self.name
    }

    fn build(&self, context: &StageContext<'_>) -> Option<Box<dyn Stage>> {
        (context.site == Site::Origin)
            .then(|| Box::new(Encode { codec: self.codec.clone(), counts: self.counts.clone() }) as _)
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
                Ok(Some(param)) => {
                    messages += 1;
                    bytes_in += message.content.payload.len() as u64;
                    bytes_out += out.len() as u64;
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
/// encoded one opened, in memory, for a recipient of it on this node. One that does not open
/// (its key or dictionary was removed since it arrived) is handed out as stored, its encoding
/// showing, with a warning: never as if it were plaintext. Dead letters are handed out as
/// stored (they were not delivered; a dead letter's plaintext never leaves the node).
pub(crate) fn open_for_client(node: &crate::node::NodeState, messages: &[Message]) -> Option<Vec<Message>> {
    if !messages.iter().any(Message::is_encoded) {
        return None;
    }
    let bytes_max = usize::try_from(node.config().messages.message_bytes_max).unwrap_or(usize::MAX);
    let opened = messages
        .iter()
        .map(|message| {
            if !message.is_encoded() || message.content.header(super::dead_letter::DEAD_LETTER_CODE_HEADER).is_some() {
                return message.clone();
            }
            let mut last = None;
            for to in message.content.recipients.iter().filter(|to| &to.node == node.name()) {
                match node.codecs().decode(message, to, bytes_max) {
                    Ok(payload) => {
                        let mut opened = message.clone();
                        opened.content.payload = payload;
                        opened.encoding.clear();
                        return opened;
                    }
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
