//! Micro-benchmarks of the byte-level codecs under a link: the message wire form
//! ([`linkbus_proto::wire`]), `Data` frames and the incremental frame decoder
//! ([`linkbus_proto::frame`]), and the Noise transport of [`linkbus_proto::secure`].
//!
//! Each runs over 64 B, 1 KiB and 64 KiB payloads and counts payload bytes (and frames or
//! messages where there are several), so results read as throughput.

use bytes::{Bytes, BytesMut};
use divan::Bencher;
use divan::counter::{BytesCount, ItemsCount};
use linkbus_plugin_api::{Content, Message, MessageId, NodeName};
use linkbus_proto::frame::{Frame, FrameDecoder, Packet};
use linkbus_proto::secure::{Cipher, KEY_BYTES, Keypair, SecureChannel};
use linkbus_proto::wire;

/// Payload sizes every codec is measured at.
const SIZES: [usize; 3] = [64, 1024, 64 * 1024];

/// The link's default frame limit (`links.frame_bytes_max`).
const FRAME_BYTES_MAX: usize = 1 << 20;

/// Bytes of the frame stream the decoder benchmarks decode per iteration.
const STREAM_BYTES: usize = 1 << 20;

/// Bytes the link reads from its socket at most at once: the decoder gets the stream in
/// chunks of this size, so frames that straddle two chunks are gathered as in the link.
const READ_BYTES: usize = 256 * 1024;

fn main() {
    divan::main();
}

/// A message as a client's put becomes one: one recipient, defaults elsewhere.
fn message(payload_bytes: usize) -> Message {
    Message {
        encoding: Default::default(),
        id: MessageId {
            source: NodeName::new("A").expect("valid name"),
            sequence: 1,
            created_unix_ms: 1_700_000_000_000,
        },
        hop_count: 0,
        redelivered: false,
        backout_count: 0,
        content: Box::new(Content::buf(
            "B:orders".parse().expect("valid address"),
            vec![0x5a; payload_bytes],
        )),
    }
}

/// `wire::message_bytes`: a message into a fresh buffer of its exact size.
#[divan::bench(args = SIZES)]
fn message_bytes(bencher: Bencher, size: usize) {
    let message = message(size);
    bencher.counter(BytesCount::new(size)).bench_local(|| wire::message_bytes(divan::black_box(&message)));
}

/// `wire::encode_message`: a message appended to a reused buffer.
#[divan::bench(args = SIZES)]
fn encode_message(bencher: Bencher, size: usize) {
    let message = message(size);
    let mut out = BytesMut::with_capacity(size + 256);
    bencher.counter(BytesCount::new(size)).bench_local(|| {
        out.clear();
        wire::encode_message(divan::black_box(&message), &mut out);
        divan::black_box(out.len());
    });
}

/// `wire::decode_message`: every name and limit validated; the payload is a slice.
#[divan::bench(args = SIZES)]
fn decode_message(bencher: Bencher, size: usize) {
    let bytes = wire::message_bytes(&message(size));
    bencher
        .counter(BytesCount::new(size))
        .bench_local(|| wire::decode_message(divan::black_box(bytes.clone())).expect("decodes"));
}

/// A packet holding a whole message of `size` bytes on channel 1.
fn packet(bytes: &[u8], sequence: u64) -> Packet<'_> {
    Packet {
        channel: 1,
        sequence,
        offset: 0,
        total: bytes.len() as u64,
        crc: linkbus_proto::crc::crc32c(bytes),
        bytes,
    }
}

/// A packet as the session writes it: `Frame::encode_data_header` (header CRC) and the
/// packet's bytes shared into a vectored write's chunks (copied when small).
#[divan::bench(args = SIZES)]
fn frame_encode_data(bencher: Bencher, size: usize) {
    let payload = Bytes::from(vec![0x5a; size]);
    let packet = packet(&payload, 1);
    let mut chunks = wire::Chunks::default();
    let mut out = Vec::new();
    bencher.counter(BytesCount::new(size)).bench_local(|| {
        Frame::encode_data_header(&divan::black_box(&packet).header(), chunks.buf());
        chunks.share(&payload);
        chunks.take(&mut out);
        divan::black_box(out.len());
        out.clear();
    });
}

/// About [`STREAM_BYTES`] of `Data` frames whose packets hold `size` bytes each, and how
/// many frames that is.
fn data_stream(size: usize) -> (Bytes, usize) {
    let payload = vec![0x5a; size];
    let mut out = BytesMut::with_capacity(STREAM_BYTES + size + 64);
    let mut frames = 0;
    while out.len() < STREAM_BYTES {
        frames += 1;
        Frame::encode_data(&packet(&payload, frames as u64), &mut out);
    }
    (out.freeze(), frames)
}

/// Decodes every frame of `stream`, fed in [`READ_BYTES`] chunks by `feed`.
fn decode_stream(stream: &Bytes, frames: usize, mut feed: impl FnMut(&mut FrameDecoder, Bytes)) {
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
    let mut decoded = 0;
    let mut at = 0;
    while at < stream.len() {
        let end = (at + READ_BYTES).min(stream.len());
        feed(&mut decoder, stream.slice(at..end));
        at = end;
        while let Some(frame) = decoder.decode().expect("a valid stream") {
            divan::black_box(frame);
            decoded += 1;
        }
    }
    assert_eq!(decoded, frames, "every frame decoded");
}

/// `FrameDecoder::extend`: each chunk copied into the decoder, then frames cut out.
#[divan::bench(args = SIZES)]
fn frame_decode_copied(bencher: Bencher, size: usize) {
    let (stream, frames) = data_stream(size);
    bencher
        .counter(BytesCount::new(stream.len()))
        .counter(ItemsCount::new(frames))
        .bench_local(|| decode_stream(&stream, frames, |decoder, chunk| decoder.extend(&chunk)));
}

/// `FrameDecoder::extend_bytes`: frames wholly inside a chunk are slices of it; only those
/// that straddle two chunks are gathered. (A short message whole in its packet — 64 B and
/// 1 KiB here — is copied out, OPT-37, so those two sizes are not comparable with figures
/// from before that change.)
#[divan::bench(args = SIZES)]
fn frame_decode_zero_copy(bencher: Bencher, size: usize) {
    let (stream, frames) = data_stream(size);
    bencher
        .counter(BytesCount::new(stream.len()))
        .counter(ItemsCount::new(frames))
        .bench_local(|| decode_stream(&stream, frames, FrameDecoder::extend_bytes));
}

/// A dialer and a listener whose Noise handshake with `cipher` completed, as a link's two
/// ends.
fn noise_pair(cipher: Cipher) -> (SecureChannel, SecureChannel) {
    let dialer_keys = Keypair::generate().expect("randomness");
    let listener_keys = Keypair::generate().expect("randomness");
    let psk = [7u8; KEY_BYTES];
    let mut dialer = SecureChannel::noise_dialer(cipher, &dialer_keys, &listener_keys.public, &psk, 1)
        .expect("usable keys");
    let mut listener = SecureChannel::listener(Some((&listener_keys, &psk)));
    let first = dialer.poll_transmit().expect("preamble and first handshake message");
    listener.handle_bytes(&first).expect("a valid first message");
    assert!(listener.identity().is_some(), "the listener identified the dialer");
    listener.accept().expect("the handshake completes");
    let second = listener.poll_transmit().expect("second handshake message");
    dialer.handle_bytes(&second).expect("a valid second message");
    assert!(dialer.is_established() && listener.is_established());
    (dialer, listener)
}

/// `SecureChannel::send` on one end, then `handle_received` and `take_plaintext` on the
/// other: one buffer encrypted (in 16 KiB Noise messages) and decrypted, with AES-256-GCM.
#[divan::bench(args = SIZES)]
fn noise_encrypt_decrypt(bencher: Bencher, size: usize) {
    encrypt_decrypt(bencher, Cipher::AesGcm, size);
}

/// [`noise_encrypt_decrypt`] with ChaCha20-Poly1305.
#[divan::bench(args = SIZES)]
fn noise_encrypt_decrypt_chacha(bencher: Bencher, size: usize) {
    encrypt_decrypt(bencher, Cipher::ChaChaPoly, size);
}

fn encrypt_decrypt(bencher: Bencher, cipher: Cipher, size: usize) {
    let (mut dialer, mut listener) = noise_pair(cipher);
    let plaintext = vec![0x5a; size];
    bencher.counter(BytesCount::new(size)).bench_local(|| {
        dialer.send(divan::black_box(&plaintext)).expect("established");
        let wire = dialer.poll_transmit().expect("ciphertext");
        listener.handle_received(wire).expect("decrypts");
        let received = listener.take_plaintext().expect("plaintext");
        assert_eq!(received.len(), size);
        received
    });
}
