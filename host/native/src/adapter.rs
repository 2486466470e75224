//! The host side of a native plugin: its entries in the node's registry, and the adapters
//! that make a library's store, compressor, cipher and filter a `Store`, `Compressor`,
//! `Cipher` and `Filter`.

use std::ops::Bound;
use std::sync::{Arc, OnceLock};

use abi_stable::std_types::{RResult, RSlice, RString, RVec};
use bytes::Bytes;
use linkbus_plugin_api::registry::{Builder, Origin, Plugin, PluginError};
use linkbus_plugin_api::store::SCAN_PAGE_KEYS;
use linkbus_plugin_api::{
    Address, Batch, Cipher, CodecError, Compressor, ConfigValue, Decision, FailureKind, Filter, FilterError,
    HeaderChange, Hook, Message, Reliability, Section, Store, StoreError, Verdict, WriteOp,
};

use crate::abi::{
    NativeBound, NativeCipherBox, NativeCodecError, NativeCodecErrorKind, NativeCoded, NativeCompressorBox,
    NativeError, NativeErrorKind, NativeFailureKind, NativeFilterBox, NativeHeader, NativeHeaderChange,
    NativeMessage, NativeOp, NativeStoreBox, NativeVerdict,
};
use crate::loader::Library;

/// The keys of a plugin section the node reads itself: they select and pin the library,
/// and never reach the plugin.
pub const HOST_KEYS: [&str; 2] = ["library", "sha256"];

/// `section` without [`HOST_KEYS`]: what the plugin's check and builder see. A filter's
/// `name` is the node's too (a filter entry's other node keys are gone already).
pub fn plugin_section(section: &ConfigValue, kind: &str) -> ConfigValue {
    let hosts = |key: &str| HOST_KEYS.contains(&key) || (kind == "filter" && key == "name");
    match section {
        ConfigValue::Map(entries) => {
            ConfigValue::Map(entries.iter().filter(|(k, _)| !hosts(k)).cloned().collect())
        }
        other => other.clone(),
    }
}

/// The library's plugins as registry entries: each checks its section through the library
/// and builds through it.
pub fn plugins(library: &Arc<Library>) -> Vec<Plugin> {
    library
        .plugins()
        .iter()
        .filter(|info| crate::export::KINDS.contains(&info.kind.as_str()))
        .map(|info| {
            let (check_library, build_library) = (Arc::clone(library), Arc::clone(library));
            let (kind, name) = (info.kind.clone(), info.name.clone());
            let check_name = name.clone();
            Plugin {
                name: name.clone(),
                version: library.version().to_owned(),
                summary: info.summary.clone(),
                origin: Origin::Library { path: library.path().to_owned(), sha256: library.sha256_hex() },
                check: Arc::new(move |section: &Section<'_>| {
                    let value = plugin_section(&ConfigValue::Map(section.entries().to_vec()), &kind);
                    for issue in check_library.check(&kind, &check_name, &value) {
                        let path = match issue.path.as_str() {
                            "" => section.path().to_owned(),
                            inner => section.path_of(inner),
                        };
                        section.diagnostics().error(path, issue.message);
                    }
                }),
                builder: builder(&info.kind, build_library, name.clone()),
            }
        })
        .collect()
}

/// The builder of plugin `name` of `kind` (one of [`crate::export::KINDS`]) in `library`.
fn builder(kind: &str, library: Arc<Library>, name: String) -> Builder {
    match kind {
        "compressor" => Builder::Compressor(Arc::new(move |section, context| {
            Ok(Box::new(make_compressor(&library, &name, &plugin_section(section, "compressor"), context)?))
        })),
        "cipher" => Builder::Cipher(Arc::new(move |section, context| {
            Ok(Box::new(make_cipher(&library, &name, &plugin_section(section, "cipher"), context)?))
        })),
        "filter" => Builder::Filter(Arc::new(move |section, context| {
            Ok(Box::new(make_filter(&library, &name, &plugin_section(section, "filter"), context)?))
        })),
        _ => Builder::Store(Arc::new(move |section, context| {
            Ok(Box::new(make_store(&library, &name, &plugin_section(section, "store"), context)?))
        })),
    }
}

fn make_store(
    library: &Arc<Library>,
    name: &str,
    section: &ConfigValue,
    context: &linkbus_plugin_api::BuildContext,
) -> Result<NativeStoreAdapter, PluginError> {
    let json = linkbus_plugin_api::json::to_json(section);
    let store = made(
        library,
        name,
        library.module.make_store()(name.into(), json.as_str().into(), &Library::context(context)),
    )?;
    Ok(NativeStoreAdapter { store, library: Arc::clone(library), broken: OnceLock::new() })
}

/// A library's store, seen by the node as any other.
pub struct NativeStoreAdapter {
    store: NativeStoreBox,
    /// Keeps the library's record alive with the store (libraries are never unloaded).
    library: Arc<Library>,
    /// Set when the plugin panicked or a sync failed: every later write and sync fails
    /// without reaching the plugin; after a panic, every read too.
    broken: OnceLock<(bool, String)>,
}

impl NativeStoreAdapter {
    fn refused(&self, read: bool) -> Option<StoreError> {
        match self.broken.get() {
            Some((true, reason)) => Some(StoreError::Poisoned(reason.clone())),
            Some((false, reason)) if !read => Some(StoreError::Poisoned(reason.clone())),
            _ => None,
        }
    }

    /// The plugin's answer in the node's terms; a panic, or a failure of a call that
    /// `syncs`, breaks the store.
    fn answer<T>(
        &self,
        op: &'static str,
        syncs: bool,
        answer: RResult<T, NativeError>,
    ) -> Result<T, StoreError> {
        let error = match answer {
            RResult::ROk(value) => return Ok(value),
            RResult::RErr(error) => error,
        };
        let library = self.library.path().display();
        match error.kind {
            NativeErrorKind::Panicked => {
                let reason = format!("the plugin panicked in {op} ({library}): {}", error.reason);
                let _ = self.broken.set((true, reason.clone()));
                Err(StoreError::Poisoned(reason))
            }
            NativeErrorKind::Poisoned => Err(StoreError::Poisoned(error.reason.into_string())),
            NativeErrorKind::Failed if syncs => {
                let _ = self.broken.set((false, error.reason.to_string()));
                Err(StoreError::Backend { op, reason: error.reason.into_string() })
            }
            NativeErrorKind::Failed => Err(StoreError::Backend { op, reason: error.reason.into_string() }),
        }
    }
}

fn native_bound(bound: Bound<&[u8]>) -> NativeBound<'_> {
    match bound {
        Bound::Unbounded => NativeBound::Unbounded,
        Bound::Included(key) => NativeBound::Included(key.into()),
        Bound::Excluded(key) => NativeBound::Excluded(key.into()),
    }
}

impl Store for NativeStoreAdapter {
    fn durable(&self) -> bool {
        self.store.durable()
    }

    fn write(&self, batch: Batch, sync: bool) -> Result<(), StoreError> {
        if let Some(refused) = self.refused(false) {
            return Err(refused);
        }
        let ops: Vec<NativeOp<'_>> = batch
            .ops
            .iter()
            .map(|op| match op {
                WriteOp::Put { space, key, value } => NativeOp::Put {
                    space: space.as_str().into(),
                    key: key[..].into(),
                    value: value[..].into(),
                },
                WriteOp::Delete { space, key } => {
                    NativeOp::Delete { space: space.as_str().into(), key: key[..].into() }
                }
            })
            .collect();
        let answer = self.store.write(RSlice::from_slice(&ops), sync);
        self.answer("write", sync, answer)
    }

    fn get(&self, space: &str, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        if let Some(refused) = self.refused(true) {
            return Err(refused);
        }
        let answer = self.store.get(space.into(), key.into());
        Ok(self.answer("get", false, answer)?.into_option().map(|value| Bytes::from(value.into_vec())))
    }

    /// Asks the plugin a page at a time: a larger `limit` is served by several calls, each
    /// starting after the last key of the one before.
    fn scan(
        &self,
        space: &str,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>, StoreError> {
        if let Some(refused) = self.refused(true) {
            return Err(refused);
        }
        let mut entries: Vec<(Bytes, Bytes)> = Vec::new();
        let mut after: Option<Bytes> = None;
        while entries.len() < limit {
            let page = (limit - entries.len()).min(SCAN_PAGE_KEYS);
            let start = after.as_deref().map_or(from, Bound::Excluded);
            let answer = self.store.scan(space.into(), native_bound(start), native_bound(to), page as u64);
            let got = self.answer("scan", false, answer)?;
            let short = got.len() < page;
            entries.extend(
                got.into_iter()
                    .take(page)
                    .map(|e| (Bytes::from(e.key.into_vec()), Bytes::from(e.value.into_vec()))),
            );
            if short {
                break;
            }
            after = entries.last().map(|(key, _)| key.clone());
        }
        Ok(entries)
    }

    fn spaces(&self) -> Result<Vec<String>, StoreError> {
        if let Some(refused) = self.refused(true) {
            return Err(refused);
        }
        let answer = self.store.spaces();
        Ok(self.answer("spaces", false, answer)?.into_iter().map(|s| s.into_string()).collect())
    }

    fn sync(&self) -> Result<(), StoreError> {
        if let Some(refused) = self.refused(false) {
            return Err(refused);
        }
        let answer = self.store.sync();
        self.answer("sync", true, answer)
    }
}

/// A library's compressor, seen by the node as any other.
pub struct NativeCompressorAdapter {
    compressor: NativeCompressorBox,
    id: u8,
}

/// A library's cipher, seen by the node as any other.
pub struct NativeCipherAdapter {
    cipher: NativeCipherBox,
    id: u8,
}

fn codec_answer<T>(answer: RResult<T, NativeCodecError>) -> Result<T, CodecError> {
    let error = match answer {
        RResult::ROk(value) => return Ok(value),
        RResult::RErr(error) => error,
    };
    let reason = error.reason.into_string();
    Err(match error.kind {
        NativeCodecErrorKind::OutputTooLarge => {
            CodecError::OutputTooLarge { limit: usize::try_from(error.limit).unwrap_or(usize::MAX) }
        }
        NativeCodecErrorKind::Corrupt => CodecError::Corrupt(reason),
        NativeCodecErrorKind::Missing => CodecError::Missing(reason),
        NativeCodecErrorKind::Refused | NativeCodecErrorKind::Panicked => CodecError::Refused(reason),
    })
}

fn texts(recipients: &[Address]) -> Vec<RString> {
    recipients.iter().map(|to| RString::from(to.to_string())).collect()
}

/// `coded`'s output appended to `output`; its parameter.
fn take_coded(coded: NativeCoded, output: &mut Vec<u8>) -> Option<Vec<u8>> {
    output.extend_from_slice(&coded.output);
    coded.param.into_option().map(RVec::into_vec)
}

impl Compressor for NativeCompressorAdapter {
    fn id(&self) -> u8 {
        self.id
    }

    fn compress(
        &self,
        recipients: &[Address],
        input: &[u8],
        output: &mut Vec<u8>,
    ) -> Result<Option<Vec<u8>>, CodecError> {
        let recipients = texts(recipients);
        let coded = codec_answer(self.compressor.compress(RSlice::from_slice(&recipients), input.into()))?;
        Ok(take_coded(coded, output))
    }

    fn decompress(
        &self,
        param: &[u8],
        input: &[u8],
        output: &mut Vec<u8>,
        output_bytes_max: usize,
    ) -> Result<(), CodecError> {
        let made =
            codec_answer(self.compressor.decompress(param.into(), input.into(), output_bytes_max as u64))?;
        if made.len() > output_bytes_max {
            return Err(CodecError::OutputTooLarge { limit: output_bytes_max });
        }
        output.extend_from_slice(&made);
        Ok(())
    }
}

impl Cipher for NativeCipherAdapter {
    fn id(&self) -> u8 {
        self.id
    }

    fn seal(
        &self,
        recipients: &[Address],
        plaintext: &[u8],
        associated_data: &[u8],
        output: &mut Vec<u8>,
    ) -> Result<Option<Vec<u8>>, CodecError> {
        let recipients = texts(recipients);
        let coded = codec_answer(self.cipher.seal(
            RSlice::from_slice(&recipients),
            plaintext.into(),
            associated_data.into(),
        ))?;
        Ok(take_coded(coded, output))
    }

    fn requires(&self, recipient: &Address) -> bool {
        self.cipher.requires(recipient.to_string().as_str().into())
    }

    fn open(
        &self,
        recipient: &Address,
        param: &[u8],
        sealed: &[u8],
        associated_data: &[u8],
        output: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        let recipient = recipient.to_string();
        let opened = codec_answer(self.cipher.open(
            recipient.as_str().into(),
            param.into(),
            sealed.into(),
            associated_data.into(),
        ))?;
        output.extend_from_slice(&opened);
        Ok(())
    }
}

/// Why a library cannot make a plugin of a kind its root module has no maker for.
fn no_maker(library: &Library, name: &str, kind: &str) -> PluginError {
    PluginError {
        plugin: name.to_owned(),
        reason: format!(
            "{} was built without {kind} plugins (an older ABI 1 library)",
            library.path().display()
        ),
    }
}

fn made<T>(library: &Library, name: &str, made: RResult<T, NativeError>) -> Result<T, PluginError> {
    match made {
        RResult::ROk(value) => Ok(value),
        RResult::RErr(e) => Err(PluginError {
            plugin: name.to_owned(),
            reason: format!("{} ({})", e.reason, library.path().display()),
        }),
    }
}

fn make_compressor(
    library: &Library,
    name: &str,
    section: &ConfigValue,
    context: &linkbus_plugin_api::BuildContext,
) -> Result<NativeCompressorAdapter, PluginError> {
    let maker = library.module.make_compressor().ok_or_else(|| no_maker(library, name, "compressor"))?;
    let json = linkbus_plugin_api::json::to_json(section);
    let compressor =
        made(library, name, maker(name.into(), json.as_str().into(), &Library::context(context)))?;
    let id = compressor.id();
    Ok(NativeCompressorAdapter { compressor, id })
}

fn make_cipher(
    library: &Library,
    name: &str,
    section: &ConfigValue,
    context: &linkbus_plugin_api::BuildContext,
) -> Result<NativeCipherAdapter, PluginError> {
    let maker = library.module.make_cipher().ok_or_else(|| no_maker(library, name, "cipher"))?;
    let json = linkbus_plugin_api::json::to_json(section);
    let cipher = made(library, name, maker(name.into(), json.as_str().into(), &Library::context(context)))?;
    let id = cipher.id();
    Ok(NativeCipherAdapter { cipher, id })
}

/// A library's filter, seen by the node as any other.
pub struct NativeFilterAdapter {
    filter: NativeFilterBox,
    origin: Origin,
}

fn make_filter(
    library: &Library,
    name: &str,
    section: &ConfigValue,
    context: &linkbus_plugin_api::BuildContext,
) -> Result<NativeFilterAdapter, PluginError> {
    let maker = library.module.make_filter().ok_or_else(|| no_maker(library, name, "filter"))?;
    let json = linkbus_plugin_api::json::to_json(section);
    let filter = made(library, name, maker(name.into(), json.as_str().into(), &Library::context(context)))?;
    let origin = Origin::Library { path: library.path().to_owned(), sha256: library.sha256_hex() };
    Ok(NativeFilterAdapter { filter, origin })
}

/// `message` as a filter is shown it: an encoded payload is not shown.
fn shown(message: &Message) -> NativeMessage<'_> {
    let content = &message.content;
    let encoded = message.is_encoded();
    NativeMessage {
        source: message.id.source.as_str().into(),
        sequence: message.id.sequence,
        created_unix_ms: message.id.created_unix_ms,
        hop_count: message.hop_count,
        kind: content.kind.code(),
        priority: content.priority.code(),
        persistent: content.reliability == Reliability::Persistent,
        results: content.results,
        encoded,
        name: content.name.as_str().into(),
        recipients: content.recipients.iter().map(|to| RString::from(to.to_string())).collect(),
        headers: content
            .headers
            .iter()
            .map(|(key, value)| NativeHeader { key: key.as_str().into(), value: value.as_str().into() })
            .collect(),
        payload: if encoded { RSlice::EMPTY } else { content.payload[..].into() },
    }
}

fn verdict(native: NativeVerdict) -> Result<Verdict, FilterError> {
    Ok(match native {
        NativeVerdict::Pass => Verdict::Pass,
        NativeVerdict::Drop(reason) => Verdict::Drop { reason: reason.into_string() },
        NativeVerdict::Change { payload, headers } => Verdict::Change {
            payload: payload.into_option().map(|p| Bytes::from(p.into_vec())),
            headers: headers
                .into_iter()
                .map(|change| match change {
                    NativeHeaderChange::Set(h) => {
                        HeaderChange::Set(h.key.into_string(), h.value.into_string())
                    }
                    NativeHeaderChange::Remove(key) => HeaderChange::Remove(key.into_string()),
                })
                .collect(),
        },
        NativeVerdict::Route(to) => Verdict::Route(
            to.iter()
                .map(|text| {
                    text.as_str()
                        .parse::<Address>()
                        .map_err(|e| FilterError::new(FailureKind::Output, format!("route to '{text}': {e}")))
                })
                .collect::<Result<_, _>>()?,
        ),
    })
}

fn failure(kind: NativeFailureKind) -> FailureKind {
    match kind {
        NativeFailureKind::Fuel => FailureKind::Fuel,
        NativeFailureKind::Time => FailureKind::Time,
        NativeFailureKind::Memory => FailureKind::Memory,
        NativeFailureKind::Trap => FailureKind::Trap,
        NativeFailureKind::Output => FailureKind::Output,
    }
}

impl Filter for NativeFilterAdapter {
    fn filter(&self, hook: Hook, messages: &[&Message]) -> Result<Decision, FilterError> {
        let number = Hook::ALL.iter().position(|h| *h == hook).unwrap_or_default() as u8;
        let batch: Vec<NativeMessage<'_>> = messages.iter().map(|m| shown(m)).collect();
        match self.filter.filter(number, RSlice::from_slice(&batch)) {
            RResult::ROk(decision) => Ok(Decision {
                verdicts: decision.verdicts.into_iter().map(verdict).collect::<Result<_, _>>()?,
                fuel: decision.fuel,
            }),
            RResult::RErr(e) => Err(FilterError::new(failure(e.kind), e.reason.into_string())),
        }
    }

    fn counters(&self) -> Vec<(String, i64)> {
        self.filter.counters().into_iter().map(|c| (c.name.into_string(), c.value)).collect()
    }

    fn is_current(&self) -> bool {
        self.filter.is_current()
    }

    fn origin(&self) -> Origin {
        self.origin.clone()
    }
}
