//! [`ZstdCompressor`]: the rules that choose how a payload is compressed, and the
//! dictionaries it decompresses with.

use linkbus_plugin_api::{
    Address, AddressPattern, CodecError, Compressor, ConfigErrors, ConfigValue, read_plugin_section,
};
use zstd::zstd_safe::zstd_sys::ZSTD_ErrorCode;

use crate::decode::{self, Decoders};
use crate::pool::ContextPool;
use crate::settings::{self, Settings};

/// The id of this codec in a message's encoding.
pub const COMPRESSOR_ID: u8 = 1;

/// zstd compression by destination rules; see the crate doc.
pub struct ZstdCompressor {
    /// In the order written: the first whose `to` matches every recipient applies.
    rules: Vec<Rule>,
    /// Decoding contexts with every configured dictionary loaded, by dictionary id.
    decoders: Vec<(u32, Decoders)>,
    /// Decoding contexts without a dictionary.
    plain: Decoders,
}

/// One rule, ready to compress.
#[derive(Debug)]
struct Rule {
    /// A recipient matches when any of these does.
    to: Vec<AddressPattern>,
    /// Payloads smaller than this go as they are.
    min_bytes: usize,
    /// The step record: empty, or the dictionary id (4 bytes, big-endian).
    param: Vec<u8>,
    /// Contexts at the rule's level, with its dictionary.
    contexts: ContextPool,
}

impl std::fmt::Debug for ZstdCompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dictionaries: Vec<u32> = self.decoders.iter().map(|(id, _)| *id).collect();
        f.debug_struct("ZstdCompressor")
            .field("rules", &self.rules)
            .field("dictionaries", &dictionaries)
            .finish()
    }
}

impl ZstdCompressor {
    /// Reads the stage's section (the keys besides `kind`; `kind` itself is ignored), loads
    /// its dictionaries (paths relative to the working directory) and prepares its rules.
    ///
    /// # Errors
    /// Every problem of the section, each with its YAML path, as `check` reports them.
    pub fn from_config(config: &ConfigValue) -> Result<Self, ConfigErrors> {
        let built = read_plugin_section("", config, |section| {
            let settings = settings::read(section);
            let diag = section.diagnostics();
            if diag.has_errors() {
                return None;
            }
            Self::new(settings).map_err(|e| diag.error("", e)).ok()
        })?;
        // (None only where an error was reported, so `read_plugin_section` returned it.)
        built.ok_or_else(|| ConfigErrors(Vec::new()))
    }

    fn new(settings: Settings) -> Result<Self, String> {
        let decoders = settings
            .dictionaries
            .iter()
            .map(|dictionary| (dictionary.id, Decoders::new(Some(dictionary.bytes.clone()))))
            .collect();
        let mut rules = Vec::new();
        for (i, rule) in settings.rules.into_iter().enumerate() {
            let dictionary = rule.dictionary.and_then(|d| settings.dictionaries.get(d));
            let contexts = ContextPool::new(rule.level, dictionary.map(|d| &d.bytes[..]))
                .map_err(|e| format!("rules[{i}]: zstd cannot prepare its contexts: {e}"))?;
            let param = dictionary.map(|d| d.id.to_be_bytes().to_vec()).unwrap_or_default();
            rules.push(Rule { to: rule.to, min_bytes: rule.min_bytes, param, contexts });
        }
        Ok(Self { rules, decoders, plain: Decoders::new(None) })
    }

    /// The rule for a payload to `recipients`: the first that matches every one of them.
    fn rule_for(&self, recipients: &[Address]) -> Option<&Rule> {
        if recipients.is_empty() {
            return None;
        }
        self.rules.iter().find(|rule| recipients.iter().all(|r| rule.to.iter().any(|p| p.matches(r))))
    }

    /// The decoding contexts for the dictionary the step record names (or none).
    fn decoders_for(&self, param: &[u8]) -> Result<&Decoders, CodecError> {
        let id = match <[u8; 4]>::try_from(param) {
            _ if param.is_empty() => return Ok(&self.plain),
            Ok(id) => u32::from_be_bytes(id),
            Err(_) => {
                return Err(CodecError::Corrupt(format!(
                    "a zstd record is empty or a 4-byte dictionary id, not {} bytes",
                    param.len()
                )));
            }
        };
        match self.decoders.iter().find(|(loaded, _)| *loaded == id) {
            Some((_, decoders)) => Ok(decoders),
            None => Err(CodecError::Missing(format!(
                "zstd dictionary {id} is not loaded here (add it to the zstd stage's dictionaries)"
            ))),
        }
    }
}

impl Compressor for ZstdCompressor {
    fn id(&self) -> u8 {
        COMPRESSOR_ID
    }

    fn compress(
        &self,
        recipients: &[Address],
        input: &[u8],
        output: &mut Vec<u8>,
    ) -> Result<Option<Vec<u8>>, CodecError> {
        let Some(rule) = self.rule_for(recipients) else { return Ok(None) };
        if input.len() < rule.min_bytes || input.is_empty() {
            return Ok(None);
        }
        output.clear();
        // Room for one byte less than the input: zstd stops when the frame would not shrink.
        output.reserve_exact(input.len() - 1);
        let written = rule
            .contexts
            .with(|context| context.compress_to_buffer(input, output))
            .and_then(|written| written);
        match written {
            Ok(written) if written < input.len() => Ok(Some(rule.param.clone())),
            Ok(_) => {
                output.clear();
                Ok(None)
            }
            Err(e) if is_dst_too_small(&e) => {
                output.clear();
                Ok(None)
            }
            Err(e) => {
                output.clear();
                Err(CodecError::Refused(format!("zstd could not compress the payload: {e}")))
            }
        }
    }

    fn decompress(
        &self,
        param: &[u8],
        input: &[u8],
        output: &mut Vec<u8>,
        output_bytes_max: usize,
    ) -> Result<(), CodecError> {
        decode::decode(self.decoders_for(param)?, input, output, output_bytes_max)
    }
}

/// Whether zstd failed because the frame would not fit the room given (not smaller).
fn is_dst_too_small(error: &std::io::Error) -> bool {
    let code = error.get_ref().and_then(|e| e.downcast_ref::<zstd::Error>());
    code.is_some_and(|c| c.is(ZSTD_ErrorCode::ZSTD_error_dstSize_tooSmall))
}
