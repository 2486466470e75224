//! The plugin side of the ABI: what [`export_plugins!`](crate::export_plugins) expands to
//! call. A plugin library implements the same traits as a built-in plugin (`Store`,
//! `Compressor`, `Cipher`, `Filter`, each read through a `PluginEntry`), and this module carries them
//! across: sections arrive as JSON and are read with the plugin's own `check`, every call
//! runs under `catch_unwind`, and a plugin object that panicked once refuses every later
//! call.

use std::any::Any;
use std::ops::Bound;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::OnceLock;

use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{ROption, RResult, RSlice, RStr, RString, RVec};
use bytes::Bytes;
use linkbus_plugin_api::registry::{BuildContext, Factory, PluginEntry};
use linkbus_plugin_api::{
    Address, Batch, Cipher, CodecError, Compressor, ConfigValue, Content, Diagnostics, FailureKind, Filter,
    HeaderChange, Hook, Kind, Message, MessageId, NodeName, Priority, Reliability, Section, Step, Store,
    StoreError, Verdict,
};

use crate::abi::{
    NATIVE_ABI_VERSION, NativeBound, NativeCipher, NativeCipher_TO, NativeCipherBox, NativeCodecError,
    NativeCodecErrorKind, NativeCoded, NativeCompressor, NativeCompressor_TO, NativeCompressorBox,
    NativeContext, NativeCounter, NativeDecision, NativeEntry, NativeError, NativeErrorKind,
    NativeFailureKind, NativeFilter, NativeFilter_TO, NativeFilterBox, NativeFilterError, NativeHeader,
    NativeHeaderChange, NativeIssue, NativeMessage, NativeModule, NativeModuleRef, NativeOp,
    NativePluginInfo, NativeStore, NativeStore_TO, NativeStoreBox, NativeVerdict,
};

/// What a library exports, as [`export_plugins!`](crate::export_plugins) declares it.
pub trait Exports: 'static {
    /// The library's version.
    const VERSION: &'static str;
    /// Its plugins, each as a built-in plugin would register it.
    const PLUGINS: &'static [&'static PluginEntry];
}

/// The extension points this ABI version carries.
pub const KINDS: [&str; 4] = ["store", "compressor", "cipher", "filter"];

/// The root module of a library exporting `E` (made once, when the library is loaded).
pub fn module<E: Exports>() -> NativeModuleRef {
    NativeModule {
        abi_version: NATIVE_ABI_VERSION,
        version: version::<E>,
        plugins: plugins::<E>,
        check: check::<E>,
        make_store: make_store::<E>,
        make_compressor: make_compressor::<E>,
        make_cipher: make_cipher::<E>,
        make_filter: make_filter::<E>,
    }
    .leak_into_prefix()
}

/// Runs `call`, turning a panic into a [`NativeErrorKind::Panicked`] error of `op`.
fn caught<T>(op: &str, call: impl FnOnce() -> Result<T, NativeError>) -> Result<T, NativeError> {
    std::panic::catch_unwind(AssertUnwindSafe(call)).unwrap_or_else(|payload| {
        Err(NativeError::new(NativeErrorKind::Panicked, op, panic_message(&*payload)))
    })
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

fn failed(op: &str, reason: impl Into<String>) -> NativeError {
    NativeError::new(NativeErrorKind::Failed, op, reason)
}

extern "C" fn version<E: Exports>() -> RString {
    E::VERSION.into()
}

extern "C" fn plugins<E: Exports>() -> RVec<NativePluginInfo> {
    E::PLUGINS
        .iter()
        .filter(|entry| KINDS.contains(&entry.factory.kind()))
        .map(|entry| NativePluginInfo {
            kind: entry.factory.kind().into(),
            name: entry.name.into(),
            summary: entry.summary.into(),
        })
        .collect()
}

fn find<E: Exports>(kind: &str, name: &str) -> Option<&'static PluginEntry> {
    E::PLUGINS.iter().copied().find(|entry| entry.factory.kind() == kind && entry.name == name)
}

/// A section sent as JSON, read back as the host read it (JSON is YAML).
fn parse_section(op: &str, text: &str) -> Result<ConfigValue, NativeError> {
    serde_saphyr::from_str::<ConfigValue>(text).map_err(|e| failed(op, format!("unreadable section: {e}")))
}

extern "C" fn check<E: Exports>(kind: RStr<'_>, name: RStr<'_>, section: RStr<'_>) -> RVec<NativeIssue> {
    let issue = |path: &str, message: String| NativeIssue { path: path.into(), message: message.into() };
    let checked = caught("check", || {
        let Some(entry) = find::<E>(kind.as_str(), name.as_str()) else {
            return Ok(vec![issue("kind", format!("the library has no {kind} plugin named '{name}'"))]);
        };
        let value = parse_section("check", section.as_str())?;
        let diag = Diagnostics::new();
        if let Some(section) = Section::new(&diag, "", &value) {
            let _ = section.get("kind");
            (entry.check)(&section);
            section.finish();
        }
        Ok(diag.finish().err().map(|errors| errors.0).unwrap_or_default())
            .map(|issues| issues.into_iter().map(|i| issue(&i.path, i.message)).collect())
    });
    match checked {
        Ok(issues) => issues.into(),
        Err(e) => vec![issue("", format!("the plugin's check failed: {}", e.reason))].into(),
    }
}

extern "C" fn make_store<E: Exports>(
    name: RStr<'_>,
    section: RStr<'_>,
    context: &NativeContext,
) -> RResult<NativeStoreBox, NativeError> {
    caught("make_store", || {
        let Some(Factory::Store(build)) = find::<E>("store", name.as_str()).map(|entry| entry.factory) else {
            return Err(failed("make_store", format!("the library has no store plugin named '{name}'")));
        };
        let value = parse_section("make_store", section.as_str())?;
        let store = build(&value, &build_context("make_store", context)?)
            .map_err(|e| failed("make_store", e.to_string()))?;
        Ok(NativeStore_TO::from_value(StoreShim { inner: store, panicked: OnceLock::new() }, TD_Opaque))
    })
    .into()
}

/// A plugin's store behind the boundary.
struct StoreShim {
    inner: Box<dyn Store>,
    /// The first panic's message: the store's state is unknown after it, so every later
    /// call fails (the host treats the store as poisoned).
    panicked: OnceLock<String>,
}

impl StoreShim {
    fn call<T>(
        &self,
        op: &str,
        call: impl FnOnce(&dyn Store) -> Result<T, StoreError>,
    ) -> RResult<T, NativeError> {
        if let Some(first) = self.panicked.get() {
            return RResult::RErr(NativeError::new(
                NativeErrorKind::Panicked,
                op,
                format!("the store panicked earlier: {first}"),
            ));
        }
        let result = caught(op, || call(&*self.inner).map_err(|e| store_error(op, e)));
        if let Err(NativeError { kind: NativeErrorKind::Panicked, reason, .. }) = &result {
            let _ = self.panicked.set(reason.to_string());
        }
        result.into()
    }
}

fn store_error(op: &str, error: StoreError) -> NativeError {
    match error {
        StoreError::Poisoned(reason) => NativeError::new(NativeErrorKind::Poisoned, op, reason),
        StoreError::Backend { reason, .. } => failed(op, reason),
        other => failed(op, other.to_string()),
    }
}

fn bound(bound: NativeBound<'_>) -> Bound<&[u8]> {
    match bound {
        NativeBound::Unbounded => Bound::Unbounded,
        NativeBound::Included(key) => Bound::Included(key.as_slice()),
        NativeBound::Excluded(key) => Bound::Excluded(key.as_slice()),
    }
}

impl NativeStore for StoreShim {
    fn durable(&self) -> bool {
        // A panic here is kept like any other; the store then says it is durable, so the
        // host does not take its data for gone, and fails every later call.
        self.call("durable", |store| Ok(store.durable())).unwrap_or(true)
    }

    fn write(&self, ops: RSlice<'_, NativeOp<'_>>, sync: bool) -> RResult<(), NativeError> {
        self.call("write", |store| {
            let mut batch = Batch { ops: Vec::with_capacity(ops.len()) };
            for op in ops.iter() {
                match *op {
                    NativeOp::Put { space, key, value } => {
                        batch.put(space.as_str(), key.to_vec(), value.to_vec());
                    }
                    NativeOp::Delete { space, key } => {
                        batch.delete(space.as_str(), key.to_vec());
                    }
                }
            }
            store.write(batch, sync)
        })
    }

    fn get(&self, space: RStr<'_>, key: RSlice<'_, u8>) -> RResult<ROption<RVec<u8>>, NativeError> {
        self.call("get", |store| {
            Ok(store.get(space.as_str(), key.as_slice())?.map(|value| RVec::from(Vec::from(value))).into())
        })
    }

    fn scan(
        &self,
        space: RStr<'_>,
        from: NativeBound<'_>,
        to: NativeBound<'_>,
        limit: u64,
    ) -> RResult<RVec<NativeEntry>, NativeError> {
        self.call("scan", |store| {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            let entries = store.scan(space.as_str(), bound(from), bound(to), limit)?;
            Ok(entries
                .into_iter()
                .map(|(key, value)| NativeEntry {
                    key: Vec::from(key).into(),
                    value: Vec::from(value).into(),
                })
                .collect())
        })
    }

    fn spaces(&self) -> RResult<RVec<RString>, NativeError> {
        self.call("spaces", |store| Ok(store.spaces()?.into_iter().map(RString::from).collect()))
    }

    fn sync(&self) -> RResult<(), NativeError> {
        self.call("sync", |store| store.sync())
    }
}

extern "C" fn make_compressor<E: Exports>(
    name: RStr<'_>,
    section: RStr<'_>,
    context: &NativeContext,
) -> RResult<NativeCompressorBox, NativeError> {
    caught("make_compressor", || {
        let Some(Factory::Compressor(build)) =
            find::<E>("compressor", name.as_str()).map(|entry| entry.factory)
        else {
            return Err(failed(
                "make_compressor",
                format!("the library has no compressor plugin named '{name}'"),
            ));
        };
        let value = parse_section("make_compressor", section.as_str())?;
        let compressor = build(&value, &build_context("make_compressor", context)?)
            .map_err(|e| failed("make_compressor", e.to_string()))?;
        Ok(NativeCompressor_TO::from_value(
            CodecShim { inner: compressor, panicked: OnceLock::new() },
            TD_Opaque,
        ))
    })
    .into()
}

extern "C" fn make_cipher<E: Exports>(
    name: RStr<'_>,
    section: RStr<'_>,
    context: &NativeContext,
) -> RResult<NativeCipherBox, NativeError> {
    caught("make_cipher", || {
        let Some(Factory::Cipher(build)) = find::<E>("cipher", name.as_str()).map(|entry| entry.factory)
        else {
            return Err(failed("make_cipher", format!("the library has no cipher plugin named '{name}'")));
        };
        let value = parse_section("make_cipher", section.as_str())?;
        let cipher = build(&value, &build_context("make_cipher", context)?)
            .map_err(|e| failed("make_cipher", e.to_string()))?;
        Ok(NativeCipher_TO::from_value(CodecShim { inner: cipher, panicked: OnceLock::new() }, TD_Opaque))
    })
    .into()
}

fn build_context(op: &str, context: &NativeContext) -> Result<BuildContext, NativeError> {
    let node = NodeName::new(context.node.as_str()).map_err(|e| failed(op, e.to_string()))?;
    Ok(BuildContext { node, data_dir: PathBuf::from(context.data_dir.as_str()) })
}

/// A plugin's compressor or cipher behind the boundary; like [`StoreShim`], it refuses
/// every call after one panicked.
struct CodecShim<T: ?Sized> {
    inner: Box<T>,
    panicked: OnceLock<String>,
}

fn codec_error(error: CodecError) -> NativeCodecError {
    let (kind, limit, reason) = match error {
        CodecError::OutputTooLarge { limit } => {
            (NativeCodecErrorKind::OutputTooLarge, limit as u64, String::new())
        }
        CodecError::Corrupt(reason) => (NativeCodecErrorKind::Corrupt, 0, reason),
        CodecError::Missing(reason) => (NativeCodecErrorKind::Missing, 0, reason),
        CodecError::Refused(reason) => (NativeCodecErrorKind::Refused, 0, reason),
        other => (NativeCodecErrorKind::Refused, 0, other.to_string()),
    };
    NativeCodecError { kind, limit, reason: reason.into() }
}

fn addresses(recipients: RSlice<'_, RString>) -> Result<Vec<Address>, NativeCodecError> {
    recipients
        .iter()
        .map(|text| {
            text.as_str().parse::<Address>().map_err(|e| NativeCodecError {
                kind: NativeCodecErrorKind::Refused,
                limit: 0,
                reason: format!("recipient '{text}': {e}").into(),
            })
        })
        .collect()
}

fn coded(output: Vec<u8>, param: Option<Vec<u8>>) -> NativeCoded {
    NativeCoded { output: output.into(), param: param.map(RVec::from).into() }
}

impl<T: ?Sized> CodecShim<T> {
    fn call<R>(
        &self,
        op: &str,
        call: impl FnOnce(&T) -> Result<R, NativeCodecError>,
    ) -> RResult<R, NativeCodecError> {
        let refused = |reason: String| NativeCodecError {
            kind: NativeCodecErrorKind::Panicked,
            limit: 0,
            reason: reason.into(),
        };
        if let Some(first) = self.panicked.get() {
            return RResult::RErr(refused(format!("the codec panicked earlier: {first}")));
        }
        match std::panic::catch_unwind(AssertUnwindSafe(|| call(&self.inner))) {
            Ok(result) => result.into(),
            Err(payload) => {
                let message = panic_message(&*payload);
                let _ = self.panicked.set(message.clone());
                RResult::RErr(refused(format!("the plugin panicked in {op}: {message}")))
            }
        }
    }
}

impl NativeCompressor for CodecShim<dyn Compressor> {
    fn id(&self) -> u8 {
        self.inner.id()
    }

    fn compress(
        &self,
        recipients: RSlice<'_, RString>,
        input: RSlice<'_, u8>,
    ) -> RResult<NativeCoded, NativeCodecError> {
        self.call("compress", |compressor| {
            let recipients = addresses(recipients)?;
            let mut output = Vec::new();
            let param =
                compressor.compress(&recipients, input.as_slice(), &mut output).map_err(codec_error)?;
            Ok(coded(output, param))
        })
    }

    fn decompress(
        &self,
        param: RSlice<'_, u8>,
        input: RSlice<'_, u8>,
        output_bytes_max: u64,
    ) -> RResult<RVec<u8>, NativeCodecError> {
        self.call("decompress", |compressor| {
            let mut output = Vec::new();
            let max = usize::try_from(output_bytes_max).unwrap_or(usize::MAX);
            compressor
                .decompress(param.as_slice(), input.as_slice(), &mut output, max)
                .map_err(codec_error)?;
            Ok(output.into())
        })
    }
}

impl NativeCipher for CodecShim<dyn Cipher> {
    fn id(&self) -> u8 {
        self.inner.id()
    }

    fn seal(
        &self,
        recipients: RSlice<'_, RString>,
        plaintext: RSlice<'_, u8>,
        associated_data: RSlice<'_, u8>,
    ) -> RResult<NativeCoded, NativeCodecError> {
        self.call("seal", |cipher| {
            let recipients = addresses(recipients)?;
            let mut output = Vec::new();
            let param = cipher
                .seal(&recipients, plaintext.as_slice(), associated_data.as_slice(), &mut output)
                .map_err(codec_error)?;
            Ok(coded(output, param))
        })
    }

    fn requires(&self, recipient: RStr<'_>) -> bool {
        // A recipient the plugin cannot judge (a panic, an unreadable address) is held to
        // the seal: an unsealed message for it is dead-lettered rather than delivered.
        let answer = self.call("requires", |cipher| {
            let recipient = recipient
                .as_str()
                .parse::<Address>()
                .map_err(|e| codec_error(CodecError::Refused(e.to_string())))?;
            Ok(cipher.requires(&recipient))
        });
        answer.unwrap_or(true)
    }

    fn open(
        &self,
        recipient: RStr<'_>,
        param: RSlice<'_, u8>,
        sealed: RSlice<'_, u8>,
        associated_data: RSlice<'_, u8>,
    ) -> RResult<RVec<u8>, NativeCodecError> {
        self.call("open", |cipher| {
            let recipient = recipient
                .as_str()
                .parse::<Address>()
                .map_err(|e| codec_error(CodecError::Refused(e.to_string())))?;
            let mut output = Vec::new();
            cipher
                .open(
                    &recipient,
                    param.as_slice(),
                    sealed.as_slice(),
                    associated_data.as_slice(),
                    &mut output,
                )
                .map_err(codec_error)?;
            Ok(output.into())
        })
    }
}

extern "C" fn make_filter<E: Exports>(
    name: RStr<'_>,
    section: RStr<'_>,
    context: &NativeContext,
) -> RResult<NativeFilterBox, NativeError> {
    caught("make_filter", || {
        let Some(Factory::Filter(build)) = find::<E>("filter", name.as_str()).map(|entry| entry.factory)
        else {
            return Err(failed("make_filter", format!("the library has no filter plugin named '{name}'")));
        };
        let value = parse_section("make_filter", section.as_str())?;
        let filter = build(&value, &build_context("make_filter", context)?)
            .map_err(|e| failed("make_filter", e.to_string()))?;
        Ok(NativeFilter_TO::from_value(FilterShim(filter), TD_Opaque))
    })
    .into()
}

/// A plugin's filter behind the boundary. A panic fails the call (as a trap) and leaves the
/// filter in place: the node's failure policy for the filter (`on_failure`) decides.
struct FilterShim(Box<dyn Filter>);

fn filter_error(kind: NativeFailureKind, reason: impl Into<String>) -> NativeFilterError {
    NativeFilterError { kind, reason: reason.into().into() }
}

/// The message a host showed, rebuilt for the plugin's `Filter`.
fn message(shown: &NativeMessage<'_>) -> Result<Message, NativeFilterError> {
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        filter_error(NativeFailureKind::Output, format!("{what}: {e}"))
    };
    let source = NodeName::new(shown.source.as_str()).map_err(|e| bad("source", &e))?;
    let recipients = shown
        .recipients
        .iter()
        .map(|to| to.as_str().parse::<Address>().map_err(|e| bad("recipient", &e)))
        .collect::<Result<_, _>>()?;
    let content = Content {
        kind: Kind::from_code(shown.kind).unwrap_or_default(),
        name: shown.name.to_string(),
        recipients,
        priority: Priority::from_code(shown.priority).unwrap_or(Priority::DEFAULT),
        reliability: if shown.persistent { Reliability::Persistent } else { Reliability::Volatile },
        results: shown.results,
        headers: shown.headers.iter().map(|h| (h.key.to_string(), h.value.to_string())).collect(),
        payload: Bytes::copy_from_slice(shown.payload.as_slice()),
        ..Content::default()
    };
    let id = MessageId { source, sequence: shown.sequence, created_unix_ms: shown.created_unix_ms };
    let mut message = Message::new(id, content);
    message.hop_count = shown.hop_count;
    if shown.encoded {
        // Marks the payload as encoded (`Message::is_encoded`); which codecs, the filter is
        // not told, as in the WebAssembly ABI.
        message.encoding.push(Step { codec: 0, param: Bytes::new() });
    }
    Ok(message)
}

fn native_verdict(verdict: Verdict) -> NativeVerdict {
    let header = |change: HeaderChange| match change {
        HeaderChange::Set(key, value) => {
            NativeHeaderChange::Set(NativeHeader { key: key.into(), value: value.into() })
        }
        HeaderChange::Remove(key) => NativeHeaderChange::Remove(key.into()),
    };
    match verdict {
        Verdict::Pass => NativeVerdict::Pass,
        Verdict::Drop { reason } => NativeVerdict::Drop(reason.into()),
        Verdict::Change { payload, headers } => NativeVerdict::Change {
            payload: payload.map(|p| RVec::from(Vec::from(p))).into(),
            headers: headers.into_iter().map(header).collect(),
        },
        Verdict::Route(to) => NativeVerdict::Route(to.iter().map(|a| RString::from(a.to_string())).collect()),
    }
}

fn native_failure(kind: FailureKind) -> NativeFailureKind {
    match kind {
        FailureKind::Fuel => NativeFailureKind::Fuel,
        FailureKind::Time => NativeFailureKind::Time,
        FailureKind::Memory => NativeFailureKind::Memory,
        FailureKind::Trap => NativeFailureKind::Trap,
        FailureKind::Output => NativeFailureKind::Output,
    }
}

impl NativeFilter for FilterShim {
    fn filter(
        &self,
        hook: u8,
        messages: RSlice<'_, NativeMessage<'_>>,
    ) -> RResult<NativeDecision, NativeFilterError> {
        let decided = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let hook = *Hook::ALL.get(usize::from(hook)).ok_or_else(|| {
                filter_error(NativeFailureKind::Output, format!("hook {hook} is not one this ABI numbers"))
            })?;
            let rebuilt = messages.iter().map(message).collect::<Result<Vec<_>, _>>()?;
            let shown: Vec<&Message> = rebuilt.iter().collect();
            let decision =
                self.0.filter(hook, &shown).map_err(|e| filter_error(native_failure(e.kind), e.reason))?;
            Ok(NativeDecision {
                verdicts: decision.verdicts.into_iter().map(native_verdict).collect(),
                fuel: decision.fuel,
            })
        }));
        decided
            .unwrap_or_else(|payload| {
                Err(filter_error(
                    NativeFailureKind::Trap,
                    format!("the plugin panicked: {}", panic_message(&*payload)),
                ))
            })
            .into()
    }

    fn counters(&self) -> RVec<NativeCounter> {
        std::panic::catch_unwind(AssertUnwindSafe(|| self.0.counters()))
            .unwrap_or_default()
            .into_iter()
            .map(|(name, value)| NativeCounter { name: name.into(), value })
            .collect()
    }

    fn is_current(&self) -> bool {
        std::panic::catch_unwind(AssertUnwindSafe(|| self.0.is_current())).unwrap_or(false)
    }
}
