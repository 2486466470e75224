//! Decompression bombs: 2 GiB of zeros in a frame of tens of KiB, once with its size in the
//! frame header and once with the size hidden. Both stop at the cap, fast, and the output
//! never grows much past it.

mod common;

use std::io::Write;

use common::compressor;
use linkbus_plugin_api::{CodecError, Compressor};

const BOMB_BYTES: u64 = 2 << 30;
const CAP_BYTES: usize = 4 << 20;

/// 2 GiB of zeros, streamed 1 MiB at a time; the header states the size when `sized`.
fn bomb(sized: bool) -> Vec<u8> {
    let mut frame = Vec::new();
    let mut encoder = zstd::stream::write::Encoder::new(&mut frame, 3).unwrap();
    if sized {
        encoder.set_pledged_src_size(Some(BOMB_BYTES)).unwrap();
    } else {
        encoder.include_contentsize(false).unwrap();
    }
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..BOMB_BYTES >> 20 {
        encoder.write_all(&zeros).unwrap();
    }
    encoder.finish().unwrap();
    assert!(frame.len() < 1 << 20, "the bomb is small: {} bytes", frame.len());
    frame
}

fn defused(frame: &[u8]) {
    let zstd = compressor("kind: zstd\nrules: [{ to: '*' }]");
    let mut out = Vec::new();
    let error = zstd.decompress(&[], frame, &mut out, CAP_BYTES);
    assert_eq!(error, Err(CodecError::OutputTooLarge { limit: CAP_BYTES }));
    assert!(out.capacity() < 8 << 20, "the output grew to {} bytes", out.capacity());
}

#[test]
fn a_bomb_stating_its_size_is_refused_before_decoding() {
    let frame = bomb(true);
    assert!(matches!(zstd::zstd_safe::get_frame_content_size(&frame), Ok(Some(BOMB_BYTES))));
    defused(&frame);
}

#[test]
fn a_bomb_hiding_its_size_stops_at_the_cap() {
    let frame = bomb(false);
    assert!(matches!(zstd::zstd_safe::get_frame_content_size(&frame), Ok(None)));
    defused(&frame);
}
