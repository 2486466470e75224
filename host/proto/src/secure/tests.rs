//! The secure channel: handshake, transport both ways, and every way it must refuse.

use super::*;

struct Ends {
    dialer: SecureChannel,
    listener: SecureChannel,
}

fn keys() -> (Keypair, Keypair, [u8; KEY_BYTES]) {
    (Keypair::generate().unwrap(), Keypair::generate().unwrap(), [7u8; KEY_BYTES])
}

/// Moves bytes both ways until nothing moves; the listener accepts whoever it identified.
fn pump(e: &mut Ends) -> Result<(), SecureError> {
    for _ in 0..20 {
        let mut moved = false;
        if let Some(bytes) = e.dialer.poll_transmit() {
            e.listener.handle_bytes(&bytes)?;
            moved = true;
        }
        if e.listener.identity().is_some() {
            e.listener.accept()?;
        }
        if let Some(bytes) = e.listener.poll_transmit() {
            e.dialer.handle_bytes(&bytes)?;
            moved = true;
        }
        if !moved {
            return Ok(());
        }
    }
    Ok(())
}

#[test]
fn noise_handshake_and_transport_both_ways_with_either_cipher() {
    for cipher in Cipher::ALL {
        let (a, b, psk) = keys();
        let dialer = SecureChannel::noise_dialer(cipher, &a, &b.public, &psk, 1_000).unwrap();
        let listener = SecureChannel::listener(Some((&b, &psk)));
        let mut e = Ends { dialer, listener };
        e.dialer.handle_bytes(&[]).unwrap();
        let first = e.dialer.poll_transmit().unwrap();
        assert_eq!(first[5], cipher.code(), "the preamble names the cipher");
        // The preamble alone, then the rest: the listener waits for the whole first message.
        e.listener.handle_bytes(&first[..PREAMBLE_BYTES + 1]).unwrap();
        assert_eq!(e.listener.identity(), None);
        e.listener.handle_bytes(&first[PREAMBLE_BYTES + 1..]).unwrap();
        assert_eq!(e.listener.identity(), Some((a.public, 1_000)), "the listener learns who dials, and when");
        assert_eq!(e.listener.cipher(), Some(cipher), "and with which cipher");
        e.listener.accept().unwrap();
        e.dialer.handle_bytes(&e.listener.poll_transmit().unwrap()).unwrap();
        assert!(e.dialer.is_established() && e.listener.is_established());
        assert_eq!(e.dialer.protection(), format!("Noise ({})", cipher.name()));

        let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        e.dialer.send(&big).unwrap();
        let wire = e.dialer.poll_transmit().unwrap();
        assert!(!wire.windows(64).any(|w| w == &big[1000..1064]), "the wire carries no plaintext");
        // Any split of the wire decrypts the same.
        for piece in wire.chunks(777) {
            e.listener.handle_bytes(piece).unwrap();
        }
        assert_eq!(e.listener.take_plaintext().unwrap(), big);
        e.listener.send(b"back").unwrap();
        e.dialer.handle_bytes(&e.listener.poll_transmit().unwrap()).unwrap();
        assert_eq!(&e.dialer.take_plaintext().unwrap()[..], b"back");
    }
}

#[test]
fn a_cipher_changed_on_the_way_fails_the_handshake() {
    let (a, b, psk) = keys();
    for (cipher, other) in [(Cipher::AesGcm, Cipher::ChaChaPoly), (Cipher::ChaChaPoly, Cipher::AesGcm)] {
        let mut dialer = SecureChannel::noise_dialer(cipher, &a, &b.public, &psk, 1).unwrap();
        let mut first = BytesMut::from(&dialer.poll_transmit().unwrap()[..]);
        first[5] = other.code();
        let mut listener = SecureChannel::listener(Some((&b, &psk)));
        assert!(matches!(listener.handle_bytes(&first), Err(SecureError::FirstMessage(_))), "{cipher:?}");
        assert_eq!(listener.identity(), None);
    }
    let mut listener = SecureChannel::listener(Some((&b, &psk)));
    assert_eq!(
        listener.handle_bytes(b"LBUS\x01\x07"),
        Err(SecureError::Mode { ours: "Noise", theirs: "unknown" })
    );
}

#[test]
fn cipher_names_read_back_and_the_fastest_is_one_of_them() {
    for cipher in Cipher::ALL {
        assert_eq!(Cipher::from_name(cipher.name()), Some(cipher));
        assert!(Cipher::names().contains(cipher.name()));
        assert!(cipher.protocol().parse::<snow::params::NoiseParams>().is_ok());
    }
    assert_eq!(Cipher::from_name("aes"), None);
    assert!(Cipher::from_name(Cipher::fastest().name()).is_some());
}

#[test]
fn a_wrong_cluster_key_or_an_unexpected_static_key_never_gets_through() {
    let (a, b, psk) = keys();
    let mut e = Ends {
        dialer: SecureChannel::noise_dialer(Cipher::AesGcm, &a, &b.public, &[8u8; KEY_BYTES], 1).unwrap(),
        listener: SecureChannel::listener(Some((&b, &psk))),
    };
    assert!(
        matches!(pump(&mut e), Err(SecureError::Answer(_))),
        "wrong PSK: the dialer cannot read the answer"
    );
    assert!(e.listener.take_plaintext().is_none());

    let c = Keypair::generate().unwrap();
    let mut e = Ends {
        dialer: SecureChannel::noise_dialer(Cipher::AesGcm, &a, &c.public, &psk, 1).unwrap(),
        listener: SecureChannel::listener(Some((&b, &psk))),
    };
    assert!(
        matches!(pump(&mut e), Err(SecureError::FirstMessage(_))),
        "the dialer expected another listener, which cannot read its first message"
    );
}

#[test]
fn tampering_after_the_handshake_ends_the_connection() {
    let mut e = ends(Cipher::AesGcm);
    pump(&mut e).unwrap();
    e.dialer.send(b"hello").unwrap();
    let mut wire = BytesMut::from(&e.dialer.poll_transmit().unwrap()[..]);
    let last = wire.len() - 1;
    wire[last] ^= 1;
    assert_eq!(e.listener.handle_bytes(&wire), Err(SecureError::Decrypt));
    assert!(e.listener.take_plaintext().is_none());
    e.dialer.send(b"again").unwrap();
    assert!(
        e.listener.handle_bytes(&e.dialer.poll_transmit().unwrap()).is_err(),
        "a failed channel stays failed"
    );
}

#[test]
fn modes_must_match_and_strangers_are_refused() {
    let (a, b, psk) = keys();
    let mut downgrade = Ends {
        dialer: SecureChannel::plaintext_dialer(),
        listener: SecureChannel::listener(Some((&b, &psk))),
    };
    assert_eq!(pump(&mut downgrade), Err(SecureError::Mode { ours: "Noise", theirs: "plaintext" }));
    let mut upgrade = Ends {
        dialer: SecureChannel::noise_dialer(Cipher::AesGcm, &a, &b.public, &psk, 1).unwrap(),
        listener: SecureChannel::listener(None),
    };
    assert_eq!(pump(&mut upgrade), Err(SecureError::Mode { ours: "plaintext", theirs: "Noise" }));
    let mut stranger = SecureChannel::listener(None);
    assert_eq!(stranger.handle_bytes(b"GET / HTTP/1.1\r\n"), Err(SecureError::Preamble));

    let mut plain =
        Ends { dialer: SecureChannel::plaintext_dialer(), listener: SecureChannel::listener(None) };
    pump(&mut plain).unwrap();
    plain.dialer.send(b"clear").unwrap();
    plain.listener.handle_bytes(&plain.dialer.poll_transmit().unwrap()).unwrap();
    assert_eq!(&plain.listener.take_plaintext().unwrap()[..], b"clear");
}

#[test]
fn keys_round_trip_through_hex_and_derive_their_public_half() {
    let k = Keypair::generate().unwrap();
    assert_eq!(parse_key(&hex(&k.private)).unwrap(), k.private);
    assert_eq!(Keypair::from_private(k.private).unwrap(), k);
    assert!(parse_key("xyz").is_err());
    assert!(parse_key(&"0".repeat(63)).is_err());
}

/// Sends `parts` through `from` by every way there is (copied, shared, several at once),
/// carries the wire to `to` by both ways of feeding it, and returns what `to` hands on.
fn carry_mixed(from: &mut SecureChannel, to: &mut SecureChannel, parts: &[Bytes]) -> Vec<u8> {
    for (i, part) in parts.iter().enumerate() {
        match i % 3 {
            0 => from.send(part).unwrap(),
            1 => from.send_bytes(part.clone()).unwrap(),
            _ => from
                .send_chunks(&mut vec![part.slice(..part.len() / 2), part.slice(part.len() / 2..)])
                .unwrap(),
        }
    }
    let mut wire = Vec::new();
    from.take_transmit(&mut wire);
    for (i, chunk) in wire.into_iter().enumerate() {
        if i % 2 == 0 { to.handle_received(chunk).unwrap() } else { to.handle_bytes(&chunk).unwrap() }
    }
    let mut got = Vec::new();
    while let Some(plain) = to.take_plaintext() {
        got.extend_from_slice(&plain);
    }
    got
}

#[test]
fn passing_through_and_copying_keep_the_order_in_both_modes() {
    let parts: Vec<Bytes> = (0..9u8).map(|i| Bytes::from(vec![i; 1 + usize::from(i) * 5000])).collect();
    let want: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();

    let mut plain =
        Ends { dialer: SecureChannel::plaintext_dialer(), listener: SecureChannel::listener(None) };
    // The preamble still waits in the dialer: it must go out first, before passed-through bytes.
    assert_eq!(carry_mixed(&mut plain.dialer, &mut plain.listener, &parts), want);
    assert_eq!(carry_mixed(&mut plain.listener, &mut plain.dialer, &parts), want);
    let shared = parts[8].clone();
    plain.dialer.send_bytes(shared.clone()).unwrap();
    let mut wire = Vec::new();
    plain.dialer.take_transmit(&mut wire);
    assert!(wire.iter().any(|w| w.as_ptr() == shared.as_ptr()), "plaintext passes through without a copy");

    let (a, b, psk) = keys();
    let mut noise = Ends {
        dialer: SecureChannel::noise_dialer(Cipher::AesGcm, &a, &b.public, &psk, 1).unwrap(),
        listener: SecureChannel::listener(Some((&b, &psk))),
    };
    noise.dialer.handle_bytes(&[]).unwrap();
    pump(&mut noise).unwrap();
    assert_eq!(carry_mixed(&mut noise.dialer, &mut noise.listener, &parts), want);
    assert_eq!(carry_mixed(&mut noise.listener, &mut noise.dialer, &parts), want);
}

/// A Noise dialer and a listener that knows it, with `cipher`, before the handshake.
fn ends(cipher: Cipher) -> Ends {
    let (a, b, psk) = keys();
    Ends {
        dialer: SecureChannel::noise_dialer(cipher, &a, &b.public, &psk, 1).unwrap(),
        listener: SecureChannel::listener(Some((&b, &psk))),
    }
}

/// An established Noise pair with `cipher`.
fn noise_pair(cipher: Cipher) -> Ends {
    let mut e = ends(cipher);
    e.dialer.handle_bytes(&[]).unwrap();
    pump(&mut e).unwrap();
    assert!(e.dialer.is_established() && e.listener.is_established());
    e
}

#[test]
fn noise_messages_cut_anywhere_between_chunks_decrypt_alike() {
    // Messages of many lengths, one of several Noise messages among them.
    let parts: Vec<Vec<u8>> =
        [1usize, 17, 300, 16 * 1024, 40_000, 5].iter().map(|&n| vec![n as u8; n]).collect();
    let want: Vec<u8> = parts.concat();
    // Chunks of every size from 1 byte (a length cut in half) to all of it at once, as the
    // link reads it.
    for step in [1usize, 2, 3, 7, 18, 19, 1000, 16 * 1024 + 17, 16 * 1024 + 18, usize::MAX] {
        let mut e = noise_pair(Cipher::ChaChaPoly);
        for part in &parts {
            e.dialer.send(part).unwrap();
        }
        let wire = e.dialer.poll_transmit().unwrap();
        let mut got = Vec::new();
        for chunk in wire.chunks(step) {
            e.listener.handle_received(Bytes::copy_from_slice(chunk)).unwrap();
            while let Some(plain) = e.listener.take_plaintext() {
                got.extend_from_slice(&plain);
            }
        }
        assert!(got == want, "chunks of {step}: {} bytes of {}", got.len(), want.len());
    }
}

#[test]
fn a_tampered_message_read_in_place_ends_the_connection() {
    let mut e = noise_pair(Cipher::AesGcm);
    e.dialer.send(b"first").unwrap();
    e.dialer.send(b"second").unwrap();
    let mut wire = BytesMut::from(&e.dialer.poll_transmit().unwrap()[..]);
    let last = wire.len() - 1;
    wire[last] ^= 1;
    // The first message decrypts; the second, damaged, fails the channel.
    assert_eq!(e.listener.handle_received(wire.freeze()), Err(SecureError::Decrypt));
    e.dialer.send(b"again").unwrap();
    assert_eq!(e.listener.handle_received(e.dialer.poll_transmit().unwrap()), Err(SecureError::Decrypt));
}

#[test]
fn a_message_begun_behind_the_handshake_is_completed_in_place() {
    let mut e = ends(Cipher::AesGcm);
    e.dialer.handle_bytes(&[]).unwrap();
    e.listener.handle_bytes(&e.dialer.poll_transmit().unwrap()).unwrap();
    e.listener.accept().unwrap();
    // The listener's answer and its first transport message leave together.
    e.listener.send(b"right behind the handshake").unwrap();
    let wire = e.listener.poll_transmit().unwrap();
    let answer = message_len(&wire);
    // The answer and part of the message, the general way; the rest in place.
    e.dialer.handle_bytes(&wire[..answer + 5]).unwrap();
    assert!(e.dialer.is_established());
    assert!(e.dialer.take_plaintext().is_none(), "nothing whole yet");
    e.dialer.handle_received(wire.slice(answer + 5..)).unwrap();
    assert_eq!(e.dialer.take_plaintext().unwrap(), &b"right behind the handshake"[..]);
    // An empty chunk changes nothing; a message too short to hold a tag fails the channel.
    e.dialer.handle_received(Bytes::new()).unwrap();
    assert!(e.dialer.take_plaintext().is_none());
    assert_eq!(e.dialer.handle_received(Bytes::from_static(&[0, 0])), Err(SecureError::Decrypt));
}
