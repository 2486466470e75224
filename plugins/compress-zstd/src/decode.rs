//! Bounded decompression of one zstd frame: the compression-bomb guard.
//!
//! A frame whose header states a content size over the cap is refused before any work. Any
//! other frame is decoded by a streaming decoder into an output grown step by step, never
//! past the cap plus one byte (that byte tells "more than the cap" from "exactly the cap"),
//! and whose history window zstd refuses to make larger than the cap rounded up to a power
//! of two. So decoding allocates at most about three times the cap, whatever the frame says.

use std::sync::{Mutex, PoisonError};

use linkbus_plugin_api::CodecError;
use zstd::zstd_safe::zstd_sys::ZSTD_ErrorCode;
use zstd::zstd_safe::{DCtx, DParameter, InBuffer, OutBuffer, ResetDirective};

/// The four bytes every (non-legacy, non-skippable) zstd frame starts with.
const FRAME_MAGIC: [u8; 4] = 0xFD2F_B528_u32.to_le_bytes();
/// zstd's smallest window (`ZSTD_WINDOWLOG_MIN`).
const WINDOW_LOG_MIN: u32 = 10;
/// zstd's largest window (`ZSTD_WINDOWLOG_MAX_64`, `_32` on 32-bit targets).
const WINDOW_LOG_MAX: u32 = if usize::BITS >= 64 { 31 } else { 30 };
/// First output room for a frame that does not state its size (64 KiB), doubled as needed.
const OUTPUT_FIRST_BYTES: usize = 64 * 1024;
/// Idle decoding contexts kept per dictionary (more calls at once make more).
const CONTEXTS_IDLE_MAX: usize = 8;

/// Decoding contexts with one dictionary (or none) loaded, kept between calls: making a
/// context (and digesting a dictionary into it) costs more than decoding a small message.
pub(crate) struct Decoders {
    /// The dictionary each context has loaded (ZDICT bytes), if any.
    dictionary: Option<Vec<u8>>,
    idle: Mutex<Vec<DCtx<'static>>>,
}

impl Decoders {
    /// Contexts decoding with `dictionary` (ZDICT bytes), or with none.
    pub(crate) fn new(dictionary: Option<Vec<u8>>) -> Self {
        Self { dictionary, idle: Mutex::new(Vec::new()) }
    }

    /// A context ready for a frame: idle, or made (with the dictionary loaded).
    fn take(&self) -> Result<DCtx<'static>, CodecError> {
        if let Some(context) = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop() {
            return Ok(context);
        }
        let mut context =
            DCtx::try_create().ok_or_else(|| CodecError::Corrupt("zstd has no memory".into()))?;
        if let Some(dictionary) = &self.dictionary {
            context.load_dictionary(dictionary).map_err(|code| zstd_failed(code, 0))?;
        }
        Ok(context)
    }

    /// Keeps `context` for the next call (its session reset; the dictionary stays loaded).
    fn give_back(&self, mut context: DCtx<'static>) {
        if context.reset(ResetDirective::SessionOnly).is_err() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < CONTEXTS_IDLE_MAX {
            idle.push(context);
        }
    }
}

/// Decodes the one zstd frame `input` into `output`, at most `cap` bytes, with a context of
/// `decoders`.
pub(crate) fn decode(
    decoders: &Decoders,
    input: &[u8],
    output: &mut Vec<u8>,
    cap: usize,
) -> Result<(), CodecError> {
    output.clear();
    if !input.starts_with(&FRAME_MAGIC) {
        return Err(CodecError::Corrupt("not a zstd frame".into()));
    }
    let too_large = CodecError::OutputTooLarge { limit: cap };
    // Reading one byte past the cap tells a payload of exactly `cap` bytes from a larger one.
    let room_max = cap.saturating_add(1);
    let first_room = match zstd::zstd_safe::get_frame_content_size(input) {
        Err(_) => return Err(CodecError::Corrupt("bad zstd frame header".into())),
        Ok(Some(size)) if size > cap as u64 => return Err(too_large),
        // The stated size is checked by zstd as it decodes; room for one more byte lets a
        // lie show as that instead of a full buffer.
        Ok(Some(size)) => usize::try_from(size).map_or(room_max, |size| size.saturating_add(1)),
        Ok(None) => room_max.min(OUTPUT_FIRST_BYTES.max(input.len().saturating_mul(4))),
    };
    let mut context = decoders.take()?;
    let decoded = decode_with(&mut context, input, output, (cap, room_max, first_room));
    decoders.give_back(context);
    if decoded.is_err() {
        output.clear();
    }
    decoded
}

/// [`decode`] with `context`, its output first given `first_room` and never more than
/// `room_max` bytes.
fn decode_with(
    context: &mut DCtx<'static>,
    input: &[u8],
    output: &mut Vec<u8>,
    (cap, room_max, first_room): (usize, usize, usize),
) -> Result<(), CodecError> {
    let too_large = CodecError::OutputTooLarge { limit: cap };
    context
        .set_parameter(DParameter::WindowLogMax(window_log_max(cap)))
        .map_err(|code| zstd_failed(code, cap))?;
    grow_to(output, first_room);
    let mut input_buffer = InBuffer::around(input);
    loop {
        if output.len() == output.capacity() {
            if output.capacity() >= room_max {
                return Err(too_large);
            }
            grow_to(output, room_max.min(output.capacity().saturating_mul(2)));
        }
        let left = {
            let at = output.len();
            let mut output_buffer = OutBuffer::around_pos(output, at);
            context
                .decompress_stream(&mut output_buffer, &mut input_buffer)
                .map_err(|code| zstd_failed(code, cap))?
        };
        if output.len() > cap {
            return Err(too_large);
        }
        if left == 0 {
            // The frame is complete: anything after it (another frame, garbage) is refused.
            if input_buffer.pos() < input.len() {
                return Err(CodecError::Corrupt("bytes follow the zstd frame".into()));
            }
            return Ok(());
        }
        // zstd flushes all it can: room left and no input left means the frame is cut short.
        if input_buffer.pos() == input.len() && output.len() < output.capacity() {
            return Err(CodecError::Corrupt("the zstd frame is truncated".into()));
        }
    }
}

/// The window (log2 bytes) a frame may use: the cap rounded up to a power of two, within
/// what zstd accepts. A frame we wrote never uses a window larger than its content.
fn window_log_max(cap: usize) -> u32 {
    let ceil_log2 = usize::BITS - cap.saturating_sub(1).leading_zeros();
    ceil_log2.clamp(WINDOW_LOG_MIN, WINDOW_LOG_MAX)
}

/// Grows `output`'s capacity to `room` bytes in all, exactly.
fn grow_to(output: &mut Vec<u8>, room: usize) {
    output.reserve_exact(room.saturating_sub(output.len()));
}

/// What a zstd error code means here: a window over the cap is the cap's limit, the rest
/// corrupt input (or a dictionary that is not the one the frame names).
fn zstd_failed(code: usize, cap: usize) -> CodecError {
    let window_too_large =
        0usize.wrapping_sub(ZSTD_ErrorCode::ZSTD_error_frameParameter_windowTooLarge as usize);
    if code == window_too_large {
        return CodecError::OutputTooLarge { limit: cap };
    }
    CodecError::Corrupt(format!("zstd: {}", zstd::zstd_safe::get_error_name(code)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_follows_the_cap_within_zstd_bounds() {
        assert_eq!(window_log_max(0), WINDOW_LOG_MIN);
        assert_eq!(window_log_max(4096), 12);
        assert_eq!(window_log_max(4097), 13);
        assert_eq!(window_log_max(4 << 20), 22);
        assert_eq!(window_log_max(usize::MAX), WINDOW_LOG_MAX);
    }

    #[test]
    fn one_frame_is_decoded_and_anything_after_it_refused() {
        let frame = zstd::bulk::compress(&[5u8; 10_000], 3).unwrap();
        let mut out = Vec::new();
        decode(&Decoders::new(None), &frame, &mut out, 10_000).unwrap();
        assert_eq!(out, vec![5u8; 10_000]);
        let twice = [frame.clone(), frame.clone()].concat();
        assert!(matches!(
            decode(&Decoders::new(None), &twice, &mut out, 1 << 20),
            Err(CodecError::Corrupt(_))
        ));
        let garbage = [frame.clone(), b"x".to_vec()].concat();
        assert!(matches!(
            decode(&Decoders::new(None), &garbage, &mut out, 1 << 20),
            Err(CodecError::Corrupt(_))
        ));
        assert!(matches!(
            decode(&Decoders::new(None), &frame[..frame.len() - 1], &mut out, 1 << 20),
            Err(CodecError::Corrupt(_))
        ));
        assert!(matches!(decode(&Decoders::new(None), b"", &mut out, 10), Err(CodecError::Corrupt(_))));
    }

    #[test]
    fn a_frame_without_its_size_stops_at_the_cap_exactly() {
        let mut frame = Vec::new();
        let mut encoder = zstd::stream::write::Encoder::new(&mut frame, 3).unwrap();
        encoder.include_contentsize(false).unwrap();
        // A window within the cap rounded up (2^19): larger ones are refused up front.
        encoder.window_log(18).unwrap();
        std::io::Write::write_all(&mut encoder, &[9u8; 300_000]).unwrap();
        encoder.finish().unwrap();
        assert!(matches!(zstd::zstd_safe::get_frame_content_size(&frame), Ok(None)));
        let mut out = Vec::new();
        decode(&Decoders::new(None), &frame, &mut out, 300_000).unwrap();
        assert_eq!(out.len(), 300_000);
        assert!(out.capacity() <= 300_001, "{}", out.capacity());
        let mut capped = Vec::new();
        assert_eq!(
            decode(&Decoders::new(None), &frame, &mut capped, 299_999),
            Err(CodecError::OutputTooLarge { limit: 299_999 })
        );
        assert!(capped.capacity() <= 300_000, "{}", capped.capacity());
    }

    #[test]
    fn a_window_larger_than_the_cap_allows_is_the_cap_s_limit() {
        let mut frame = Vec::new();
        let mut encoder = zstd::stream::write::Encoder::new(&mut frame, 19).unwrap();
        encoder.include_contentsize(false).unwrap();
        encoder.window_log(23).unwrap();
        std::io::Write::write_all(&mut encoder, &[1u8; 100]).unwrap();
        encoder.finish().unwrap();
        let mut out = Vec::new();
        assert_eq!(
            decode(&Decoders::new(None), &frame, &mut out, 1 << 20),
            Err(CodecError::OutputTooLarge { limit: 1 << 20 })
        );
    }
}
