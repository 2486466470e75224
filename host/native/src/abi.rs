//! The native plugin ABI, version [`NATIVE_ABI_VERSION`]: every type that crosses the
//! boundary between a node and a plugin library.
//!
//! Nothing here is a host type: `Bytes`, `String`, `Bound`, `Vec`, tokio handles and Rust
//! trait objects have no stable layout, so the store contract crosses as
//! [`NativeStore`] (an abi_stable trait object of slices, `RVec`s and `RString`s), a
//! configuration section as JSON text, and every failure (a panic included) as a
//! [`NativeError`]. abi_stable records the layout of each of these types in the library and
//! the loader compares it with its own before any plugin function runs.

use abi_stable::library::RootModule;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RBox, ROption, RResult, RSlice, RStr, RString, RVec};
use abi_stable::{StableAbi, declare_root_module_statics, package_version_strings, sabi_trait};

/// The version of this ABI. A library built against another version is refused before
/// anything in it runs; it changes whenever a type below changes in a way older plugins or
/// nodes cannot read. Separate from `linkbus_plugin_api::API_VERSION`, which nodes
/// exchange on their links.
pub const NATIVE_ABI_VERSION: u32 = 1;

/// The symbol every plugin library exports its [`AbiTag`] under.
pub const ABI_TAG_SYMBOL: &str = "linkbus_native_abi";

/// The first thing the loader reads from a library: a plain C struct at a fixed symbol, so
/// a library of another ABI version is named as such (expected and found) without reading
/// anything whose layout could have changed.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbiTag {
    /// [`AbiTag::MAGIC`].
    pub magic: [u8; 8],
    /// The [`NATIVE_ABI_VERSION`] the library was built against.
    pub abi_version: u32,
}

impl AbiTag {
    /// Marks a linkbus plugin library.
    pub const MAGIC: [u8; 8] = *b"linkbus\0";

    /// The tag of a library built against this crate.
    pub const CURRENT: Self = Self { magic: Self::MAGIC, abi_version: NATIVE_ABI_VERSION };
}

/// What kind of failure a [`NativeError`] reports.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeErrorKind {
    /// The plugin reported a failure.
    Failed,
    /// A store refuses writes after a failed sync.
    Poisoned,
    /// The plugin panicked; the panic was caught at the boundary. A store that panicked
    /// refuses every later call.
    Panicked,
}

/// A failure, across the boundary.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct NativeError {
    /// The kind.
    pub kind: NativeErrorKind,
    /// The operation that failed (`write`, `scan`, `make_store`, ...).
    pub op: RString,
    /// The plugin's explanation, or the panic's message.
    pub reason: RString,
}

impl NativeError {
    /// A failure of `op`.
    pub fn new(kind: NativeErrorKind, op: &str, reason: impl Into<String>) -> Self {
        Self { kind, op: op.into(), reason: RString::from(reason.into()) }
    }
}

/// One change of a store write (`linkbus_plugin_api::WriteOp`), borrowed from the host.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub enum NativeOp<'a> {
    /// Sets `key` in `space` to `value`.
    Put {
        /// The key space.
        space: RStr<'a>,
        /// The key.
        key: RSlice<'a, u8>,
        /// The value.
        value: RSlice<'a, u8>,
    },
    /// Removes `key` from `space`.
    Delete {
        /// The key space.
        space: RStr<'a>,
        /// The key.
        key: RSlice<'a, u8>,
    },
}

/// One end of a scan's range (`std::ops::Bound<&[u8]>`).
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub enum NativeBound<'a> {
    /// No limit.
    Unbounded,
    /// The key itself is in the range.
    Included(RSlice<'a, u8>),
    /// The range stops short of the key.
    Excluded(RSlice<'a, u8>),
}

/// A key and its value, from a scan.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct NativeEntry {
    /// The key.
    pub key: RVec<u8>,
    /// The value.
    pub value: RVec<u8>,
}

/// The store contract (`linkbus_plugin_api::Store`) across the boundary. Scans carry a limit
/// the host keeps to a page (`linkbus_plugin_api::store::SCAN_PAGE_KEYS`) and resume after
/// the last key they returned, so no call moves a whole space.
#[sabi_trait]
pub trait NativeStore: Send + Sync {
    /// Whether data survives the process.
    fn durable(&self) -> bool;

    /// Applies `ops` atomically; with `sync`, returns once they are on stable storage.
    fn write(&self, ops: RSlice<'_, NativeOp<'_>>, sync: bool) -> RResult<(), NativeError>;

    /// The value of `key` in `space`.
    fn get(&self, space: RStr<'_>, key: RSlice<'_, u8>) -> RResult<ROption<RVec<u8>>, NativeError>;

    /// Up to `limit` entries of `space` between `from` and `to`, in key order.
    fn scan(
        &self,
        space: RStr<'_>,
        from: NativeBound<'_>,
        to: NativeBound<'_>,
        limit: u64,
    ) -> RResult<RVec<NativeEntry>, NativeError>;

    /// Names of the spaces that hold at least one key, in order.
    fn spaces(&self) -> RResult<RVec<RString>, NativeError>;

    /// Makes every write so far durable.
    #[sabi(last_prefix_field)]
    fn sync(&self) -> RResult<(), NativeError>;
}

/// A store made by a plugin, owned by the host.
pub type NativeStoreBox = NativeStore_TO<'static, RBox<()>>;

/// What kind of failure a [`NativeCodecError`] reports (`linkbus_plugin_api::CodecError`).
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeCodecErrorKind {
    /// The output would pass its limit.
    OutputTooLarge,
    /// The input is damaged, or fails its authentication.
    Corrupt,
    /// Something it needs (a dictionary, a key) is not here.
    Missing,
    /// The codec refuses the call.
    Refused,
    /// The plugin panicked; the panic was caught at the boundary, and the codec refuses
    /// every later call.
    Panicked,
}

/// A codec's failure, across the boundary.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct NativeCodecError {
    /// The kind.
    pub kind: NativeCodecErrorKind,
    /// The limit passed ([`NativeCodecErrorKind::OutputTooLarge`]).
    pub limit: u64,
    /// The plugin's explanation.
    pub reason: RString,
}

/// What a codec made: the encoded bytes and the step's parameter (`None`: left as it was).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct NativeCoded {
    /// The output.
    pub output: RVec<u8>,
    /// The step's `param`; `None` leaves the payload as it is.
    pub param: ROption<RVec<u8>>,
}

/// The compressor contract (`linkbus_plugin_api::Compressor`) across the boundary.
/// Recipients cross as `node:queue` text; outputs come back whole (the two sides'
/// allocators differ, so the host copies them into its own buffers).
#[sabi_trait]
pub trait NativeCompressor: Send + Sync {
    /// Its codec id (`1..=127`).
    fn id(&self) -> u8;

    /// Compresses `input`, a payload for `recipients`.
    fn compress(
        &self,
        recipients: RSlice<'_, RString>,
        input: RSlice<'_, u8>,
    ) -> RResult<NativeCoded, NativeCodecError>;

    /// Decompresses `input`, made with `param`, into at most `output_bytes_max` bytes.
    #[sabi(last_prefix_field)]
    fn decompress(
        &self,
        param: RSlice<'_, u8>,
        input: RSlice<'_, u8>,
        output_bytes_max: u64,
    ) -> RResult<RVec<u8>, NativeCodecError>;
}

/// A compressor made by a plugin, owned by the host.
pub type NativeCompressorBox = NativeCompressor_TO<'static, RBox<()>>;

/// The cipher contract (`linkbus_plugin_api::Cipher`) across the boundary.
#[sabi_trait]
pub trait NativeCipher: Send + Sync {
    /// Its codec id (`128..=255`).
    fn id(&self) -> u8;

    /// Seals `plaintext`, a payload for `recipients`, binding `associated_data`.
    fn seal(
        &self,
        recipients: RSlice<'_, RString>,
        plaintext: RSlice<'_, u8>,
        associated_data: RSlice<'_, u8>,
    ) -> RResult<NativeCoded, NativeCodecError>;

    /// Whether `recipient` takes only payloads this cipher sealed.
    fn requires(&self, recipient: RStr<'_>) -> bool;

    /// Opens `sealed`, made with `param`, for `recipient`, checking `associated_data`.
    #[sabi(last_prefix_field)]
    fn open(
        &self,
        recipient: RStr<'_>,
        param: RSlice<'_, u8>,
        sealed: RSlice<'_, u8>,
        associated_data: RSlice<'_, u8>,
    ) -> RResult<RVec<u8>, NativeCodecError>;
}

/// A cipher made by a plugin, owned by the host.
pub type NativeCipherBox = NativeCipher_TO<'static, RBox<()>>;

/// A message shown to a filter (`linkbus_plugin_api::Message`), its payload borrowed from
/// the host; an encoded (sealed or compressed) message is shown with an empty payload.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct NativeMessage<'a> {
    /// The accepting node.
    pub source: RStr<'a>,
    /// Its sequence number there.
    pub sequence: u64,
    /// When it was accepted, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Relays crossed.
    pub hop_count: u8,
    /// `Kind::code`.
    pub kind: u8,
    /// `Priority::code`.
    pub priority: u8,
    /// Persistent rather than volatile.
    pub persistent: bool,
    /// Whether the origin wants results.
    pub results: bool,
    /// Whether the payload is encoded (and so not shown).
    pub encoded: bool,
    /// The user label.
    pub name: RStr<'a>,
    /// `node:queue` of each recipient.
    pub recipients: RVec<RString>,
    /// Key and value of each header.
    pub headers: RVec<NativeHeader>,
    /// The payload as written (empty when `encoded`).
    pub payload: RSlice<'a, u8>,
}

/// A header.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct NativeHeader {
    /// The key.
    pub key: RString,
    /// The value.
    pub value: RString,
}

/// A header change of a verdict (`linkbus_plugin_api::HeaderChange`).
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub enum NativeHeaderChange {
    /// Sets a header.
    Set(NativeHeader),
    /// Removes a header.
    Remove(RString),
}

/// A filter's verdict on one message (`linkbus_plugin_api::Verdict`).
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub enum NativeVerdict {
    /// Let it pass.
    Pass,
    /// Drop it, with a reason.
    Drop(RString),
    /// A new payload and header changes.
    Change {
        /// The new payload, if any.
        payload: ROption<RVec<u8>>,
        /// The header changes, in order.
        headers: RVec<NativeHeaderChange>,
    },
    /// New recipients, as `node:queue` text.
    Route(RVec<RString>),
}

/// How a filter call failed (`linkbus_plugin_api::FailureKind`).
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeFailureKind {
    /// Out of fuel.
    Fuel,
    /// Out of time.
    Time,
    /// Out of memory.
    Memory,
    /// A trap, or a panic caught at the boundary.
    Trap,
    /// Bad verdicts.
    Output,
}

/// A filter call's failure.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct NativeFilterError {
    /// The kind.
    pub kind: NativeFailureKind,
    /// The explanation.
    pub reason: RString,
}

/// A filter's answer for a batch.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct NativeDecision {
    /// One verdict per message, in order.
    pub verdicts: RVec<NativeVerdict>,
    /// The work it reports (a native filter has no fuel; it may count what it likes).
    pub fuel: u64,
}

/// A filter's own counter.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct NativeCounter {
    /// Its name.
    pub name: RString,
    /// Its value.
    pub value: i64,
}

/// The filter contract (`linkbus_plugin_api::Filter`) across the boundary. `hook` is
/// `Hook` as numbered in `Hook::ALL` (`on_send` 0 .. `on_deliver` 3).
#[sabi_trait]
pub trait NativeFilter: Send + Sync {
    /// Decides on a batch at `hook`.
    fn filter(
        &self,
        hook: u8,
        messages: RSlice<'_, NativeMessage<'_>>,
    ) -> RResult<NativeDecision, NativeFilterError>;

    /// Its counters.
    fn counters(&self) -> RVec<NativeCounter>;

    /// Whether what it was built from is unchanged.
    #[sabi(last_prefix_field)]
    fn is_current(&self) -> bool;
}

/// A filter made by a plugin, owned by the host.
pub type NativeFilterBox = NativeFilter_TO<'static, RBox<()>>;

/// A plugin a library offers, as the loader lists it.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct NativePluginInfo {
    /// The extension point (`store`, ...), as in `linkbus_plugin_api::Factory::kind`.
    pub kind: RString,
    /// The name YAML selects it by.
    pub name: RString,
    /// One line for listings and error messages.
    pub summary: RString,
}

/// One problem `check` found in a plugin's section.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct NativeIssue {
    /// The key's path inside the section (`journal.size`), empty for the section itself.
    pub path: RString,
    /// What is wrong.
    pub message: RString,
}

/// What a plugin's builder may need from the node (`linkbus_plugin_api::BuildContext`).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct NativeContext {
    /// The node's name.
    pub node: RString,
    /// The node's data directory, as UTF-8 text.
    pub data_dir: RString,
}

/// The root module a plugin library exports: its ABI version, what it offers, and the
/// functions the host calls. A prefix type, so later fields can be added without breaking
/// libraries that lack them.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = NativeModuleRef)))]
#[sabi(missing_field(panic))]
pub struct NativeModule {
    /// [`NATIVE_ABI_VERSION`] as the library knows it (also in its [`AbiTag`]).
    pub abi_version: u32,
    /// The library's own version, for `linkbus plugins`.
    pub version: extern "C" fn() -> RString,
    /// The plugins the library offers.
    pub plugins: extern "C" fn() -> RVec<NativePluginInfo>,
    /// Checks plugin `name` of `kind`'s section (JSON text) without side effects.
    pub check: extern "C" fn(kind: RStr<'_>, name: RStr<'_>, section: RStr<'_>) -> RVec<NativeIssue>,
    /// Makes store `name` from its section (JSON text).
    #[sabi(last_prefix_field)]
    pub make_store: extern "C" fn(
        name: RStr<'_>,
        section: RStr<'_>,
        context: &NativeContext,
    ) -> RResult<NativeStoreBox, NativeError>,
    /// Makes compressor `name` from its section (JSON text). Fields from here on may be
    /// missing in a library built before they were added: their accessors return `None`.
    #[sabi(missing_field(option))]
    pub make_compressor: extern "C" fn(
        name: RStr<'_>,
        section: RStr<'_>,
        context: &NativeContext,
    ) -> RResult<NativeCompressorBox, NativeError>,
    /// Makes cipher `name` from its section (JSON text).
    #[sabi(missing_field(option))]
    pub make_cipher: extern "C" fn(
        name: RStr<'_>,
        section: RStr<'_>,
        context: &NativeContext,
    ) -> RResult<NativeCipherBox, NativeError>,
    /// Makes filter `name` from its section (JSON text).
    #[sabi(missing_field(option))]
    pub make_filter: extern "C" fn(
        name: RStr<'_>,
        section: RStr<'_>,
        context: &NativeContext,
    ) -> RResult<NativeFilterBox, NativeError>,
}

impl RootModule for NativeModuleRef {
    declare_root_module_statics! {NativeModuleRef}
    const BASE_NAME: &'static str = "linkbus_plugin";
    const NAME: &'static str = "linkbus native plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}
