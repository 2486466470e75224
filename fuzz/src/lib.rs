//! Fuzz targets for everything linkbus reads from outside, each a function that must never
//! panic (nor allocate without bound) whatever bytes it gets:
//! - [`link_frames`]: bytes from a peer's link, into a link session (frames, the handshake
//!   `Hello`, packets reassembled into messages, acknowledgements), and into the message
//!   decoder;
//! - [`handshake`]: bytes into the Noise handshake, on the listening and the dialing side;
//! - [`client_requests`]: bytes from a client of the node's socket, into requests (and, as a
//!   client reads them, responses);
//! - [`yaml_config`]: a configuration file, through the YAML loader and the reader.
//!
//! `cargo fuzz run --features libfuzzer TARGET` runs one under libFuzzer (see
//! `fuzz/README.md`); the tests below run every target over its committed corpus
//! (`corpus/TARGET/`) and over random and mutated inputs, in every `cargo test`.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use linkbus_client::protocol::{Request, Response, split_frame};
use linkbus_plugin_api::NodeName;
use linkbus_proto::secure::{Cipher, KEY_BYTES, Keypair, SecureChannel};
use linkbus_proto::session::peek_hello;
use linkbus_proto::{FrameDecoder, Session, SessionConfig};

/// A fuzz target: takes any bytes, must not panic.
pub type Target = fn(&[u8]);

/// The targets, by name (as `fuzz_targets/NAME.rs` and `corpus/NAME/`).
pub const TARGETS: [(&str, Target); 4] = [
    ("link_frames", link_frames),
    ("handshake", handshake),
    ("client_requests", client_requests),
    ("yaml_config", yaml_config),
];

/// Largest frame the targets' decoders take (as a node's default limit is larger, this
/// keeps each run fast without skipping any path).
const FRAME_BYTES_MAX: usize = 64 << 10;

/// The session of node B, talking to A, as a node configures one.
pub fn session_config(local: &str, peer: &str, incarnation: u64) -> SessionConfig {
    SessionConfig {
        local: NodeName::new(local).expect("valid name"),
        peer: NodeName::new(peer).expect("valid name"),
        incarnation,
        run: incarnation,
        durable: true,
        frame_bytes_max: FRAME_BYTES_MAX,
        message_bytes_max: FRAME_BYTES_MAX,
        packet_bytes_max: 4 << 10,
        channel_weights: linkbus_proto::channel::EQUAL_WEIGHTS,
        in_flight_messages_max: 16,
        in_flight_bytes_max: 1 << 20,
        reorder_messages_max: 16,
        reorder_bytes_max: 1 << 20,
        retransmit_timeout: Duration::from_secs(3),
        ping_interval: Duration::from_secs(1),
        pong_timeout: Duration::from_secs(2),
        handshake_timeout: Duration::from_secs(5),
        ack_delay: Duration::ZERO,
        recycler: std::sync::Arc::new(linkbus_proto::recycle::Recycler::new(0)),
    }
}

/// Bytes from peer A's link into node B's session, cut into pieces where the input says
/// (its first byte), with time passing between them; every message it hands over is
/// decoded again, and the whole input goes through the message decoder too.
pub fn link_frames(data: &[u8]) {
    let Some((&cut, rest)) = data.split_first() else { return };
    let now = Instant::now();
    let mut b = Session::new(session_config("B", "A", 22), now);
    b.handle_connected(now);
    let piece = usize::from(cut).max(1) * 7;
    for (i, chunk) in rest.chunks(piece).enumerate() {
        let at = now + Duration::from_millis(i as u64 * 10);
        b.handle_received(Bytes::copy_from_slice(chunk), at);
        b.handle_timeout(at);
        while let Some(event) = b.poll_event() {
            if let linkbus_proto::SessionEvent::Received { channel, sequence, .. } = event {
                b.handle_delivered(channel, sequence, at);
            }
        }
        let mut out = Vec::new();
        b.take_transmit(&mut out);
    }
    let _ = linkbus_proto::wire::decode_message(Bytes::copy_from_slice(rest));
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
    decoder.extend(rest);
    while let Ok(Some(_)) = decoder.decode() {}
}

/// The keys of the handshake targets: fixed, so a corpus entry stays meaningful.
pub fn keys() -> (Keypair, Keypair, [u8; KEY_BYTES]) {
    let listener = Keypair::from_private([1; KEY_BYTES]).expect("valid key");
    let dialer = Keypair::from_private([2; KEY_BYTES]).expect("valid key");
    (listener, dialer, [3; KEY_BYTES])
}

/// Bytes into the Noise handshake. The first byte chooses: even, the bytes go to a listener
/// (which answers a first message that decrypts, then reads a `Hello` from what follows);
/// odd, a dialer's first message is made and the bytes are its answer and what follows.
pub fn handshake(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let (listener_keys, dialer_keys, psk) = keys();
    let piece = usize::from(mode >> 1).max(1) * 5;
    if mode % 2 == 0 {
        let mut listener = SecureChannel::listener(Some((&listener_keys, &psk)));
        let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
        for chunk in rest.chunks(piece) {
            if listener.handle_bytes(chunk).is_err() {
                return;
            }
            if listener.identity().is_some() && listener.accept().is_err() {
                return;
            }
            let _ = listener.poll_transmit();
            if let Some(plain) = listener.take_plaintext() {
                decoder.extend(&plain);
                let _ = peek_hello(&mut decoder);
            }
        }
    } else {
        let cipher = if mode & 2 == 0 { Cipher::AesGcm } else { Cipher::ChaChaPoly };
        let Ok(mut dialer) =
            SecureChannel::noise_dialer(cipher, &dialer_keys, &listener_keys.public, &psk, 1)
        else {
            return;
        };
        let _ = dialer.poll_transmit();
        for chunk in rest.chunks(piece) {
            if dialer.handle_bytes(chunk).is_err() {
                return;
            }
            let _ = dialer.take_plaintext();
        }
    }
}

/// Bytes from a client into the node's request frames and decoder; the same bytes as
/// responses, as a client reads them.
pub fn client_requests(data: &[u8]) {
    for responses in [false, true] {
        let mut buf = BytesMut::from(data);
        while let Ok(Some((kind, body))) = split_frame(&mut buf, FRAME_BYTES_MAX) {
            if responses {
                let _ = Response::decode(kind, body);
            } else {
                let _ = Request::decode(kind, body);
            }
        }
    }
}

/// A configuration file through the YAML loader and the reader (which checks every key,
/// the relations between them and the addresses).
pub fn yaml_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(tree) = linkbus_host::config::parse_yaml(text) {
        let _ = linkbus_host::config::from_value(&tree);
    }
}

/// Inputs worth starting from, per target: real traffic and real files, made by the code
/// itself (`corpus/` holds them; `cargo run -p linkbus-fuzz --example write_seeds` writes
/// them again).
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut seeds = Vec::new();
    for (name, bytes) in link_seeds() {
        seeds.push(("link_frames", name, bytes));
    }
    for (name, bytes) in handshake_seeds() {
        seeds.push(("handshake", name, bytes));
    }
    for (name, bytes) in client_seeds() {
        seeds.push(("client_requests", name, bytes));
    }
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/config");
    if let Ok(dir) = std::fs::read_dir(examples) {
        let mut files: Vec<_> = dir.flatten().map(|e| e.path()).collect();
        files.sort();
        for path in files {
            let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            if let Ok(bytes) = std::fs::read(&path) {
                seeds.push(("yaml_config", format!("example-{name}"), bytes));
            }
        }
    }
    seeds.push(("yaml_config", "errors".into(), seed_yaml_with_errors().into_bytes()));
    seeds
}

/// What A writes to B over a link that comes up and carries three messages on two channels,
/// and a piece of the same traffic with a bad header CRC.
fn link_seeds() -> Vec<(String, Vec<u8>)> {
    let now = Instant::now();
    let mut a = Session::new(session_config("A", "B", 11), now);
    let mut b = Session::new(session_config("B", "A", 22), now);
    a.handle_connected(now);
    b.handle_connected(now);
    let mut wire = Vec::new();
    for n in 0..3u64 {
        let message = linkbus_proto::wire::message_bytes(&linkbus_plugin_api::Message {
            encoding: Default::default(),
            id: linkbus_plugin_api::MessageId {
                source: NodeName::new("A").expect("valid"),
                sequence: n,
                created_unix_ms: 0,
            },
            hop_count: 0,
            redelivered: false,
            backout_count: 0,
            content: Box::new(linkbus_plugin_api::Content::buf(
                "B:q".parse().expect("valid address"),
                "x".repeat(usize::try_from(n).unwrap_or(0) * 3000),
            )),
        });
        let _ = a.send(u8::try_from(n % 2).unwrap_or(0) + 1, message, None, now);
    }
    for _ in 0..20 {
        a.write_pending(now, usize::MAX);
        b.write_pending(now, usize::MAX);
        if let Some(bytes) = a.poll_transmit() {
            wire.extend_from_slice(&bytes);
            b.handle_bytes(&bytes, now);
        }
        if let Some(bytes) = b.poll_transmit() {
            a.handle_bytes(&bytes, now);
        }
        while let Some(event) = b.poll_event() {
            if let linkbus_proto::SessionEvent::Received { channel, sequence, .. } = event {
                b.handle_delivered(channel, sequence, now);
            }
        }
        while a.poll_event().is_some() {}
    }
    let mut damaged = wire.clone();
    if let Some(byte) = damaged.get_mut(6) {
        *byte ^= 1;
    }
    let seed = |cut: u8, bytes: &[u8]| [&[cut][..], bytes].concat();
    vec![
        ("link-up-three-messages".into(), seed(200, &wire)),
        ("link-up-in-small-pieces".into(), seed(1, &wire)),
        ("bad-header-crc".into(), seed(200, &damaged)),
    ]
}

/// A dialer's real first message (both ciphers) with a sealed `Hello` after it, and a
/// listener's real answer. (Each run draws new ephemeral keys, so what follows the first
/// message, or the answer, decrypts only in the run that made it: these reach the
/// transport's refusal of what does not decrypt; `link_frames` covers what a decrypted
/// link carries.)
fn handshake_seeds() -> Vec<(String, Vec<u8>)> {
    let (listener_keys, dialer_keys, psk) = keys();
    let mut seeds = Vec::new();
    // First bytes: even for the listener (in pieces of 5 or 100 bytes), odd for the dialer
    // (bit 1 chooses the cipher).
    for (listening_mode, dialing_mode, cipher) in [(0u8, 1u8, Cipher::AesGcm), (40, 3, Cipher::ChaChaPoly)] {
        let Ok(mut dialer) =
            SecureChannel::noise_dialer(cipher, &dialer_keys, &listener_keys.public, &psk, 1)
        else {
            continue;
        };
        let first = dialer.poll_transmit().map(|b| b.to_vec()).unwrap_or_default();
        let mut listener = SecureChannel::listener(Some((&listener_keys, &psk)));
        let answered = listener.handle_bytes(&first).is_ok()
            && listener.identity().is_some()
            && listener.accept().is_ok();
        let answer = listener.poll_transmit().map(|b| b.to_vec()).unwrap_or_default();
        if !answered || dialer.handle_bytes(&answer).is_err() {
            continue;
        }
        let mut hello = BytesMut::new();
        linkbus_proto::Frame::Hello(linkbus_proto::Hello {
            in_flight_messages_max: 16,
            in_flight_bytes_max: 1 << 20,
            ..linkbus_proto::Hello::new("A", "B")
        })
        .encode(&mut hello);
        let sealed = dialer.send(&hello).ok().and_then(|()| dialer.poll_transmit()).map(|b| b.to_vec());
        let listening = [&[listening_mode][..], &first, &sealed.unwrap_or_default()].concat();
        seeds.push((format!("listener-{}", cipher.name()), listening));
        seeds.push((format!("dialer-{}", cipher.name()), [&[dialing_mode][..], &answer].concat()));
    }
    seeds.push(("plaintext-preamble".into(), b"\x00LBUS\x01\x00".to_vec()));
    seeds
}

/// Every kind of request, and some responses, as a client and a node write them.
fn client_seeds() -> Vec<(String, Vec<u8>)> {
    let content = linkbus_plugin_api::Content::buf("B:q".parse().expect("valid address"), "hello");
    let requests = [
        Request::Put { contents: vec![content.clone(), content], timeout_ms: 10, no_wait: false },
        Request::Get {
            queue: "q".into(),
            count_max: 10,
            wait_ms: 100,
            bytes_max: 1 << 20,
            pending: true,
            groups: linkbus_client::protocol::GetGroups::Whole,
        },
        Request::Consume { queue: "q".into(), count_max: 10, bytes_max: 1 << 20 },
        Request::Follow { queue: "EVENT".into(), after: 3, count_max: 10, wait_ms: 5 },
        Request::Ack { queue: "q".into(), tags: vec![1, 2] },
        Request::Browse { queue: "DLQ".into(), count_max: 5 },
        Request::Results { source: "A".into(), sequences: vec![1], wait_ms: 0 },
        Request::Subscribe { to: "B:ops".into(), kinds: vec!["all".into()] },
        Request::Begin,
        Request::Commit { timeout_ms: 10 },
        Request::Status,
        Request::Limits,
    ];
    let mut all = BytesMut::new();
    let mut seeds = Vec::new();
    for (i, request) in requests.iter().enumerate() {
        let mut out = BytesMut::new();
        request.encode(&mut out);
        all.extend_from_slice(&out);
        seeds.push((format!("request-{i}"), out.to_vec()));
    }
    seeds.push(("all-requests".into(), all.to_vec()));
    let mut out = BytesMut::new();
    Response::Limits { message_bytes_max: 1, frame_bytes_max: 2 }.encode(&mut out);
    Response::Error {
        code: linkbus_client::protocol::ErrorCode::Full,
        accepted: 3,
        message: "queue full".into(),
    }
    .encode(&mut out);
    seeds.push(("responses".into(), out.to_vec()));
    seeds
}

/// Writes [`seeds`] into `root/TARGET/seed-NAME`; returns how many.
///
/// # Errors
/// When a directory or file cannot be written.
pub fn write_seeds(root: &std::path::Path) -> std::io::Result<usize> {
    let seeds = seeds();
    for (target, name, bytes) in &seeds {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("seed-{name}")), bytes)?;
    }
    Ok(seeds.len())
}

fn seed_yaml_with_errors() -> String {
    "node: { name: 1bad, listen: 'localhost' }\npeers:\n  - { name: B, address: 'nope' }\n\
     queues:\n  - { name: a }\n  - { name: a, order: lifo }\nlinks: { ping_interval_ms: 0 }\n\
     anchors: &x [ *x ]\ntypo: 1\n"
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn corpus(target: &str) -> Vec<Vec<u8>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
        let mut inputs: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .filter_map(|e| std::fs::read(e.path()).ok())
            .collect();
        inputs.sort();
        inputs
    }

    /// Every committed corpus input (the seeds and what fuzzing runs added) runs cleanly.
    #[test]
    fn every_corpus_input_runs_cleanly() {
        for (target, run) in TARGETS {
            let inputs = corpus(target);
            assert!(!inputs.is_empty(), "{target} has a corpus");
            for input in inputs {
                run(&input);
            }
        }
    }

    /// The seeds are what the code makes today, so the corpus starts from real traffic: the
    /// link seed brings a session up and hands it its messages, the handshake seeds
    /// complete a handshake on both sides.
    #[test]
    fn the_seeds_reach_deep() {
        let (listener_keys, _, psk) = keys();
        for (name, seed) in handshake_seeds().into_iter().filter(|(n, _)| n.starts_with("listener")) {
            let mut listener = SecureChannel::listener(Some((&listener_keys, &psk)));
            listener.handle_bytes(seed.get(1..).unwrap_or_default()).unwrap();
            assert!(listener.identity().is_some(), "{name}: the first message names the dialer");
        }
        // The link seed brings B's session up and hands it the three messages.
        let (_, wire) = link_seeds().into_iter().next().expect("a seed");
        let now = Instant::now();
        let mut b = Session::new(session_config("B", "A", 22), now);
        b.handle_connected(now);
        b.handle_bytes(wire.get(1..).unwrap_or_default(), now);
        let mut received = 0;
        while let Some(event) = b.poll_event() {
            received += usize::from(matches!(event, linkbus_proto::SessionEvent::Received { .. }));
        }
        assert_eq!(received, 3);
        assert!(b.is_established());
    }

    /// Every seed the code makes has its file in the corpus, so the corpus starts from the
    /// formats as they are (`cargo run -p linkbus-fuzz --example write_seeds` writes them
    /// again when a format changes).
    #[test]
    fn every_seed_is_in_the_corpus() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        for (target, name, _) in seeds() {
            let path = root.join(target).join(format!("seed-{name}"));
            assert!(path.exists(), "{} is missing: run the write_seeds example", path.display());
        }
    }

    fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
        (
            0..seeds.len(),
            any::<u64>(),
            proptest::collection::vec((any::<u16>(), any::<u8>()), 0..8),
            any::<u16>(),
        )
            .prop_map(move |(i, _, flips, cut)| {
                let mut input = seeds.get(i).cloned().unwrap_or_default();
                for (at, bits) in flips {
                    let len = input.len().max(1);
                    if let Some(byte) = input.get_mut(usize::from(at) % len) {
                        *byte ^= bits;
                    }
                }
                let keep = input.len().saturating_sub(usize::from(cut) % 64);
                input.truncate(keep.max(1));
                input
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn random_bytes_never_panic(target in 0..TARGETS.len(), data in proptest::collection::vec(any::<u8>(), 0..2048)) {
            (TARGETS[target].1)(&data);
        }

        #[test]
        fn mutated_link_traffic_never_panics(data in mutated(link_seeds().into_iter().map(|s| s.1).collect())) {
            link_frames(&data);
        }

        #[test]
        fn mutated_handshakes_never_panic(data in mutated(handshake_seeds().into_iter().map(|s| s.1).collect())) {
            handshake(&data);
        }

        #[test]
        fn mutated_requests_never_panic(data in mutated(client_seeds().into_iter().map(|s| s.1).collect())) {
            client_requests(&data);
        }
    }
}
