//! Link security: the preamble every connection opens with, and the Noise channel
//! (`Noise_IKpsk2_25519_AESGCM_BLAKE2s` or `Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s`) that
//! carries the link frames.
//!
//! A connection starts with the dialer's 6-byte preamble: magic `LBUS`, preamble version,
//! and the security mode (0 = plaintext, 1 = Noise with ChaCha20-Poly1305, 2 = Noise with
//! AES-256-GCM). A node refuses a mode other than its own, so neither side can be talked
//! down to plaintext; a Noise listener takes either cipher (the dialer chooses, see
//! [`Cipher`]), and both ends bind the preamble into the handshake, so a changed mode byte
//! fails it. In Noise mode the dialer knows the listener's static key from its
//! configuration (the IK pattern); the listener learns the dialer's static key from the
//! first handshake message and must find it among its peers; both mix in the cluster's
//! pre-shared key. The first message carries the dialer's clock
//! reading, which the listener requires to grow per peer, so a recorded handshake cannot
//! be replayed. After the handshake, every Noise message on the wire is a 2-byte big-endian
//! length and at most 65,535 bytes of ciphertext; a message that fails to decrypt ends the
//! connection.
//!
//! Sans-io like the rest of this crate: bytes in through [`SecureChannel::handle_bytes`]
//! (or [`SecureChannel::handle_received`], which passes a plaintext channel's chunks on
//! without a copy, and decrypts a Noise channel's messages where they lie in the chunk),
//! plaintext out through [`SecureChannel::take_plaintext`], plaintext in
//! through [`SecureChannel::send`] (or `send_bytes` / `send_chunks`, likewise), bytes out
//! through [`SecureChannel::poll_transmit`] (one piece) or [`SecureChannel::take_transmit`]
//! (the pieces as they are).

use std::collections::VecDeque;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// First bytes of every connection.
pub const PREAMBLE_MAGIC: [u8; 4] = *b"LBUS";
/// Version of the preamble and handshake layout.
pub const PREAMBLE_VERSION: u8 = 1;
/// Bytes of the preamble.
pub const PREAMBLE_BYTES: usize = 6;
/// Bytes of a key (private, public, pre-shared).
pub const KEY_BYTES: usize = 32;
/// Largest Noise message.
const NOISE_MESSAGE_MAX: usize = 65_535;
/// Authentication tag Noise adds to each message.
const TAG_BYTES: usize = 16;
/// Largest plaintext in one Noise message. Smaller than Noise allows (65,519): a damaged
/// message costs the connection, and everything since the last whole message is lost with
/// it, so smaller messages keep a flaky link making progress; 18 bytes of framing and tag
/// per 16 KiB cost about 0.1 %.
const PLAINTEXT_CHUNK_MAX: usize = 16 * 1024;
const _: () = assert!(PLAINTEXT_CHUNK_MAX + TAG_BYTES <= NOISE_MESSAGE_MAX);

/// How a link is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No encryption, no authentication: only with `insecure_plaintext: true`.
    Plaintext,
    /// Noise IKpsk2: mutual authentication by static keys and the cluster key, encryption.
    Noise,
}

/// The cipher of a Noise link. The dialer chooses; a listener takes either. Both are
/// AEADs with 256-bit keys under the same handshake, so the choice is about speed only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cipher {
    /// ChaCha20-Poly1305: fast on any CPU, and constant-time without special instructions.
    ChaChaPoly,
    /// AES-256-GCM: about three times ChaCha20-Poly1305's speed on a CPU with AES and
    /// carry-less multiplication instructions, much slower on one without.
    AesGcm,
}

impl Cipher {
    /// Every cipher.
    pub const ALL: [Self; 2] = [Self::AesGcm, Self::ChaChaPoly];

    /// The names [`Cipher::from_name`] takes, for messages: `aes-256-gcm, chacha20-poly1305`.
    pub fn names() -> String {
        Self::ALL.map(Self::name).join(", ")
    }

    /// The cipher's name in configuration and logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::ChaChaPoly => "chacha20-poly1305",
            Self::AesGcm => "aes-256-gcm",
        }
    }

    /// The cipher called `name` (see [`Cipher::names`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The faster cipher on this CPU: AES-256-GCM where it has instructions for it, else
    /// ChaCha20-Poly1305.
    pub fn fastest() -> Self {
        #[cfg(target_arch = "x86_64")]
        let hardware =
            std::arch::is_x86_feature_detected!("aes") && std::arch::is_x86_feature_detected!("pclmulqdq");
        #[cfg(target_arch = "aarch64")]
        let hardware = std::arch::is_aarch64_feature_detected!("aes");
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let hardware = false;
        if hardware { Self::AesGcm } else { Self::ChaChaPoly }
    }

    /// The Noise protocol name.
    pub fn protocol(self) -> &'static str {
        match self {
            Self::ChaChaPoly => "Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s",
            Self::AesGcm => "Noise_IKpsk2_25519_AESGCM_BLAKE2s",
        }
    }

    /// The preamble's mode byte.
    fn code(self) -> u8 {
        match self {
            Self::ChaChaPoly => 1,
            Self::AesGcm => 2,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.code() == code)
    }
}

/// Why the secure channel failed; the connection must be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecureError {
    /// The connection does not start with a linkbus preamble.
    #[error("not a linkbus connection (bad preamble)")]
    Preamble,
    /// The peer asks for another security mode.
    #[error("peer wants a {theirs} link, this node requires {ours}")]
    Mode {
        /// Ours.
        ours: &'static str,
        /// Theirs.
        theirs: &'static str,
    },
    /// The Noise handshake failed: wrong cluster key, wrong static key, or damaged bytes.
    #[error("handshake failed: {0}")]
    Handshake(String),
    /// Listener: the dialer's first handshake message did not decrypt, so the dialer does
    /// not hold this node's public key (or is not a linkbus node at all).
    #[error(
        "the first handshake message did not decrypt ({0}): the dialer's peers[].public_key for this node is \
         not this node's public key, or it is not a linkbus peer"
    )]
    FirstMessage(String),
    /// Dialer: the listener's handshake answer did not decrypt. The listener read the first
    /// message, so it holds the key the dialer expects: the cluster keys differ.
    #[error(
        "the peer's handshake answer did not decrypt ({0}): its cluster key differs from this node's \
         (security.psk_file on both nodes)"
    )]
    Answer(String),
    /// A Noise message failed to decrypt (tampered with, or out of order).
    #[error("a message failed to decrypt")]
    Decrypt,
    /// A key is not 32 bytes of hex.
    #[error("bad key: {0}")]
    Key(String),
}

fn mode_name(code: u8) -> &'static str {
    match code {
        PLAINTEXT_CODE => "plaintext",
        code if Cipher::from_code(code).is_some() => "Noise",
        _ => "unknown",
    }
}

/// The preamble's mode byte of a plaintext link.
const PLAINTEXT_CODE: u8 = 0;

/// A static key pair.
#[derive(Clone, PartialEq, Eq)]
pub struct Keypair {
    /// The private half (keep it secret: mode 0600 on disk).
    pub private: [u8; KEY_BYTES],
    /// The public half (goes into peers' configuration).
    pub public: [u8; KEY_BYTES],
}

impl std::fmt::Debug for Keypair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keypair").field("public", &hex(&self.public)).finish_non_exhaustive()
    }
}

fn params(cipher: Cipher) -> snow::params::NoiseParams {
    cipher.protocol().parse().expect("the protocol name is valid")
}

impl Keypair {
    /// A fresh random key pair.
    ///
    /// # Errors
    /// [`SecureError::Key`] when the system has no randomness.
    pub fn generate() -> Result<Self, SecureError> {
        // An X25519 pair: the same whichever cipher the links will use.
        let keys = snow::Builder::new(params(Cipher::ChaChaPoly))
            .generate_keypair()
            .map_err(|e| SecureError::Key(e.to_string()))?;
        Ok(Self { private: to_key(&keys.private)?, public: to_key(&keys.public)? })
    }

    /// The pair of a private key.
    ///
    /// # Errors
    /// [`SecureError::Key`] when the key cannot be used.
    pub fn from_private(private: [u8; KEY_BYTES]) -> Result<Self, SecureError> {
        use snow::resolvers::CryptoResolver;
        let mut dh = snow::resolvers::DefaultResolver
            .resolve_dh(&snow::params::DHChoice::Curve25519)
            .ok_or_else(|| SecureError::Key("no X25519 implementation".into()))?;
        dh.set(&private);
        Ok(Self { private, public: to_key(dh.pubkey())? })
    }
}

fn to_key(bytes: &[u8]) -> Result<[u8; KEY_BYTES], SecureError> {
    bytes.try_into().map_err(|_| SecureError::Key(format!("{} bytes, expected {KEY_BYTES}", bytes.len())))
}

pub use linkbus_plugin_api::hex::encode as hex;

/// Parses 64 hex digits into a key.
///
/// # Errors
/// [`SecureError::Key`] naming what is wrong.
pub fn parse_key(text: &str) -> Result<[u8; KEY_BYTES], SecureError> {
    linkbus_plugin_api::hex::decode(text.trim().as_bytes()).map_err(SecureError::Key)
}

/// What a Noise listener answers with, once the preamble named the cipher.
struct ListenerKeys {
    keys: Keypair,
    psk: [u8; KEY_BYTES],
}

enum State {
    /// Listener: waiting for the preamble (in Noise mode with the keys to answer with).
    Listening(Option<Box<ListenerKeys>>),
    /// Listener, Noise: read the preamble, waiting for the first handshake message.
    Greeted(Box<snow::HandshakeState>),
    /// Listener: read the first message; the host checks who it is, then accepts.
    Identified(Box<snow::HandshakeState>),
    /// Dialer: sent the first message, waiting for the second.
    Dialing(Box<snow::HandshakeState>),
    /// Noise transport.
    Secure(Box<snow::TransportState>),
    /// Plaintext after the preamble.
    Plain,
    /// Failed; nothing more passes.
    Failed,
}

/// One connection's security layer; see the module doc.
pub struct SecureChannel {
    mode: Mode,
    /// A Noise link's cipher: the dialer's choice, known to the listener from the preamble.
    cipher: Option<Cipher>,
    state: State,
    /// Bytes from the wire not yet processed.
    inbound: BytesMut,
    /// Decrypted bytes for the link session.
    plaintext: BytesMut,
    /// Plaintext-mode chunks passed through as received, before `plaintext`.
    passed_in: VecDeque<Bytes>,
    /// Bytes for the wire.
    outbound: BytesMut,
    /// Plaintext-mode chunks passed through as given, before `outbound`.
    passed_out: VecDeque<Bytes>,
    /// Plaintext of several chunks gathered into one Noise message (reused).
    gather: Vec<u8>,
    /// The dialer's static key and clock reading, once the listener read them.
    identity: Option<([u8; KEY_BYTES], u64)>,
}

impl std::fmt::Debug for SecureChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecureChannel")
            .field("mode", &self.mode)
            .field("cipher", &self.cipher)
            .finish_non_exhaustive()
    }
}

/// The protocol label both ends bind into the handshake, followed by the preamble (`LBUS`,
/// version, mode), so a handshake for another protocol, version, mode or cipher never
/// completes.
const PROLOGUE_LABEL: &[u8; 15] = b"linkbus link v1";

/// The prologue of a Noise link with `cipher`.
fn prologue(cipher: Cipher) -> [u8; PROLOGUE_LABEL.len() + PREAMBLE_BYTES] {
    let mut prologue = [0u8; PROLOGUE_LABEL.len() + PREAMBLE_BYTES];
    let mut out = &mut prologue[..];
    out.put_slice(PROLOGUE_LABEL);
    preamble(cipher.code(), &mut out);
    prologue
}

fn builder<'a>(
    cipher: Cipher,
    prologue: &'a [u8],
    keys: &'a Keypair,
    psk: &'a [u8; KEY_BYTES],
) -> Result<snow::Builder<'a>, SecureError> {
    let handshake = |e: snow::Error| SecureError::Handshake(e.to_string());
    snow::Builder::new(params(cipher))
        .prologue(prologue)
        .map_err(handshake)?
        .local_private_key(&keys.private)
        .map_err(handshake)?
        .psk(2, psk)
        .map_err(handshake)
}

fn preamble(code: u8, out: &mut impl BufMut) {
    out.put_slice(&PREAMBLE_MAGIC);
    out.put_u8(PREAMBLE_VERSION);
    out.put_u8(code);
}

impl SecureChannel {
    /// The dialer's side of a plaintext link: sends the preamble, then passes bytes through.
    pub fn plaintext_dialer() -> Self {
        let mut channel = Self::new(Mode::Plaintext, State::Plain);
        preamble(PLAINTEXT_CODE, &mut channel.outbound);
        channel
    }

    /// The dialer's side of a Noise link with `cipher` to the node whose static key is
    /// `remote`: sends the preamble and the first handshake message (carrying `unix_ms`).
    ///
    /// # Errors
    /// [`SecureError::Handshake`] when a key cannot be used.
    pub fn noise_dialer(
        cipher: Cipher,
        keys: &Keypair,
        remote: &[u8; KEY_BYTES],
        psk: &[u8; KEY_BYTES],
        unix_ms: u64,
    ) -> Result<Self, SecureError> {
        let handshake = |e: snow::Error| SecureError::Handshake(e.to_string());
        let prologue = prologue(cipher);
        let mut hs = builder(cipher, &prologue, keys, psk)?
            .remote_public_key(remote)
            .map_err(handshake)?
            .build_initiator()
            .map_err(handshake)?;
        let mut message = vec![0u8; NOISE_MESSAGE_MAX];
        let len = hs.write_message(&unix_ms.to_be_bytes(), &mut message).map_err(handshake)?;
        let mut channel = Self::new(Mode::Noise, State::Dialing(Box::new(hs)));
        channel.cipher = Some(cipher);
        preamble(cipher.code(), &mut channel.outbound);
        put_message(&mut channel.outbound, message.get(..len).unwrap_or_default());
        Ok(channel)
    }

    /// The listener's side: `keys` and `psk` for Noise (with the cipher the dialer names),
    /// `None` for plaintext.
    pub fn listener(noise: Option<(&Keypair, &[u8; KEY_BYTES])>) -> Self {
        match noise {
            None => Self::new(Mode::Plaintext, State::Listening(None)),
            Some((keys, psk)) => {
                let keys = ListenerKeys { keys: keys.clone(), psk: *psk };
                Self::new(Mode::Noise, State::Listening(Some(Box::new(keys))))
            }
        }
    }

    fn new(mode: Mode, state: State) -> Self {
        Self {
            mode,
            cipher: None,
            state,
            inbound: BytesMut::new(),
            plaintext: BytesMut::new(),
            passed_in: VecDeque::new(),
            outbound: BytesMut::new(),
            passed_out: VecDeque::new(),
            gather: Vec::new(),
            identity: None,
        }
    }

    /// The security mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// A Noise link's cipher (a listener's once it read the preamble).
    pub fn cipher(&self) -> Option<Cipher> {
        self.cipher
    }

    /// How the link is protected, for logs: `plaintext` or `Noise (CIPHER)`.
    pub fn protection(&self) -> String {
        match (self.mode, self.cipher) {
            (Mode::Plaintext, _) => "plaintext".to_owned(),
            (Mode::Noise, Some(cipher)) => format!("Noise ({})", cipher.name()),
            (Mode::Noise, None) => "Noise".to_owned(),
        }
    }

    /// Whether link frames can flow.
    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Secure(_) | State::Plain)
    }

    /// Listener, Noise: the dialer's static key and clock reading, once its first message
    /// was read; the host checks them, then calls [`SecureChannel::accept`].
    pub fn identity(&self) -> Option<([u8; KEY_BYTES], u64)> {
        matches!(self.state, State::Identified(_)).then_some(self.identity).flatten()
    }

    /// Listener, Noise: answers the identified dialer and starts the transport.
    ///
    /// # Errors
    /// [`SecureError::Handshake`] when not identified or the handshake fails.
    pub fn accept(&mut self) -> Result<(), SecureError> {
        let State::Identified(mut hs) = std::mem::replace(&mut self.state, State::Failed) else {
            return Err(SecureError::Handshake("nothing to accept".into()));
        };
        let handshake = |e: snow::Error| SecureError::Handshake(e.to_string());
        let mut message = vec![0u8; NOISE_MESSAGE_MAX];
        let len = hs.write_message(&[], &mut message).map_err(handshake)?;
        put_message(&mut self.outbound, message.get(..len).unwrap_or_default());
        self.state = State::Secure(Box::new(hs.into_transport_mode().map_err(handshake)?));
        self.drain()
    }

    /// Feeds bytes from the wire.
    ///
    /// # Errors
    /// [`SecureError`] for a bad preamble, another mode, a failed handshake or a message that
    /// does not decrypt; the connection must be closed.
    pub fn handle_bytes(&mut self, bytes: &[u8]) -> Result<(), SecureError> {
        self.inbound.extend_from_slice(bytes);
        let result = self.drain();
        if result.is_err() {
            self.state = State::Failed;
        }
        result
    }

    /// Like [`SecureChannel::handle_bytes`], passing the chunk through without a copy once
    /// a plaintext channel is established, and decrypting a Noise transport's messages
    /// where they lie in it.
    ///
    /// # Errors
    /// As [`SecureChannel::handle_bytes`].
    pub fn handle_received(&mut self, bytes: Bytes) -> Result<(), SecureError> {
        if matches!(self.state, State::Secure(_)) {
            let result = self.open_all(&bytes);
            if result.is_err() {
                self.state = State::Failed;
            }
            return result;
        }
        if !matches!(self.state, State::Plain) || !self.inbound.is_empty() {
            return self.handle_bytes(&bytes);
        }
        if !self.plaintext.is_empty() {
            self.passed_in.push_back(self.plaintext.split().freeze());
        }
        self.passed_in.push_back(bytes);
        Ok(())
    }

    /// Noise transport: decrypts every whole Noise message in what was held and `bytes`,
    /// reading them from `bytes` where they lie (only a message begun in an earlier chunk is
    /// completed in `inbound`, and only the incomplete one at the end is kept there), into
    /// `plaintext` sized once for all of them.
    fn open_all(&mut self, mut bytes: &[u8]) -> Result<(), SecureError> {
        if self.inbound.len() >= message_len(&self.inbound) {
            // A whole message already held (the handshake's reading leaves none): read it
            // all the general way.
            self.inbound.extend_from_slice(bytes);
            return self.drain();
        }
        // The plaintext is shorter than the messages it comes from.
        self.plaintext.reserve(self.inbound.len() + bytes.len());
        if !self.inbound.is_empty() {
            // Take from `bytes` only what completes the held message (its length, then the
            // rest): at most one round per byte taken, and one more.
            loop {
                let want = message_len(&self.inbound);
                let (now, later) = bytes.split_at(want.saturating_sub(self.inbound.len()).min(bytes.len()));
                self.inbound.extend_from_slice(now);
                bytes = later;
                if self.inbound.len() == message_len(&self.inbound) {
                    break;
                }
                if bytes.is_empty() {
                    return Ok(());
                }
            }
            let held = self.inbound.split();
            self.read_message(held.get(2..).unwrap_or_default())?;
        }
        while let Some((message, rest)) = bytes.split_at_checked(message_len(bytes)) {
            self.read_message(message.get(2..).unwrap_or_default())?;
            bytes = rest;
        }
        self.inbound.extend_from_slice(bytes);
        Ok(())
    }

    fn drain(&mut self) -> Result<(), SecureError> {
        loop {
            match &mut self.state {
                State::Failed => return Err(SecureError::Decrypt),
                State::Plain => {
                    let bytes = self.inbound.split();
                    self.plaintext.unsplit(bytes);
                    return Ok(());
                }
                State::Listening(_) => {
                    if !self.read_preamble()? {
                        return Ok(());
                    }
                }
                State::Greeted(_) => {
                    if !self.read_first_message()? {
                        return Ok(());
                    }
                }
                State::Identified(_) => return Ok(()),
                State::Dialing(_) | State::Secure(_) => {
                    let Some(message) = take_message(&mut self.inbound) else { return Ok(()) };
                    self.read_message(&message)?;
                }
            }
        }
    }

    /// Listener: reads the preamble; returns whether the state moved on.
    fn read_preamble(&mut self) -> Result<bool, SecureError> {
        let State::Listening(keys) = &self.state else { return Ok(false) };
        let Some(head) = self.inbound.get(..PREAMBLE_BYTES) else { return Ok(false) };
        if head.get(..4) != Some(&PREAMBLE_MAGIC[..]) || head.get(4) != Some(&PREAMBLE_VERSION) {
            return Err(SecureError::Preamble);
        }
        let theirs = head.get(5).copied().unwrap_or(u8::MAX);
        let cipher = Cipher::from_code(theirs);
        let state = match (keys, cipher) {
            (None, None) if theirs == PLAINTEXT_CODE => State::Plain,
            (Some(keys), Some(cipher)) => {
                let prologue = prologue(cipher);
                let hs = builder(cipher, &prologue, &keys.keys, &keys.psk)?
                    .build_responder()
                    .map_err(|e| SecureError::Handshake(e.to_string()))?;
                self.cipher = Some(cipher);
                State::Greeted(Box::new(hs))
            }
            (keys, _) => {
                let ours = if keys.is_some() { "Noise" } else { "plaintext" };
                return Err(SecureError::Mode { ours, theirs: mode_name(theirs) });
            }
        };
        self.inbound.advance(PREAMBLE_BYTES);
        self.state = state;
        Ok(true)
    }

    /// Listener, Noise: reads the first handshake message; returns whether the state moved
    /// on.
    fn read_first_message(&mut self) -> Result<bool, SecureError> {
        if !matches!(self.state, State::Greeted(_)) {
            return Ok(false);
        }
        let Some(message) = take_message(&mut self.inbound) else { return Ok(false) };
        let State::Greeted(mut hs) = std::mem::replace(&mut self.state, State::Failed) else {
            return Ok(false);
        };
        let mut payload = vec![0u8; NOISE_MESSAGE_MAX];
        let len =
            hs.read_message(&message, &mut payload).map_err(|e| SecureError::FirstMessage(e.to_string()))?;
        let stamp = payload.get(..len).and_then(|p| <[u8; 8]>::try_from(p).ok()).map(u64::from_be_bytes);
        let remote = hs.get_remote_static().map(to_key).transpose()?;
        let (Some(stamp), Some(remote)) = (stamp, remote) else {
            return Err(SecureError::Handshake("first message without identity".into()));
        };
        self.identity = Some((remote, stamp));
        self.state = State::Identified(hs);
        Ok(true)
    }

    fn read_message(&mut self, message: &[u8]) -> Result<(), SecureError> {
        if let State::Secure(transport) = &mut self.state {
            // Decrypted straight into what the session takes.
            let start = self.plaintext.len();
            self.plaintext.resize(start + message.len(), 0);
            let into = self.plaintext.get_mut(start..).unwrap_or_default();
            return match transport.read_message(message, into) {
                Ok(len) => {
                    self.plaintext.truncate(start + len);
                    Ok(())
                }
                Err(_) => {
                    self.plaintext.truncate(start);
                    Err(SecureError::Decrypt)
                }
            };
        }
        // The dialer's handshake reply: once per connection.
        let mut out = vec![0u8; NOISE_MESSAGE_MAX];
        self.read_message_into(message, &mut out)
    }

    fn read_message_into(&mut self, message: &[u8], out: &mut [u8]) -> Result<(), SecureError> {
        match std::mem::replace(&mut self.state, State::Failed) {
            State::Dialing(mut hs) => {
                let handshake = |e: snow::Error| SecureError::Handshake(e.to_string());
                hs.read_message(message, out).map_err(|e| SecureError::Answer(e.to_string()))?;
                self.state = State::Secure(Box::new(hs.into_transport_mode().map_err(handshake)?));
            }
            // (Transport messages are read in `read_message`.)
            other => self.state = other,
        }
        Ok(())
    }

    /// Decrypted bytes for the link session, if any.
    pub fn take_plaintext(&mut self) -> Option<Bytes> {
        self.passed_in
            .pop_front()
            .or_else(|| (!self.plaintext.is_empty()).then(|| self.plaintext.split().freeze()))
    }

    /// Encrypts link frames for the wire (in Noise messages of at most 64 KiB).
    ///
    /// # Errors
    /// [`SecureError::Handshake`] before the channel is established.
    pub fn send(&mut self, plaintext: &[u8]) -> Result<(), SecureError> {
        match &mut self.state {
            State::Plain => {
                self.outbound.extend_from_slice(plaintext);
                Ok(())
            }
            State::Secure(transport) => {
                // Room for all of it at once (growing as it goes would copy it again).
                self.outbound.reserve(sealed_len(plaintext.len()));
                for chunk in plaintext.chunks(PLAINTEXT_CHUNK_MAX) {
                    // Encrypted straight into the output, after room for its length.
                    let start = self.outbound.len();
                    self.outbound.resize(start + 2 + chunk.len() + TAG_BYTES, 0);
                    let into = self.outbound.get_mut(start + 2..).unwrap_or_default();
                    let Ok(len) = transport.write_message(chunk, into) else {
                        self.outbound.truncate(start);
                        return Err(SecureError::Decrypt);
                    };
                    self.outbound.truncate(start + 2 + len);
                    let prefix = u16::try_from(len).expect("noise messages are at most 65535 bytes");
                    if let Some(at) = self.outbound.get_mut(start..start + 2) {
                        at.copy_from_slice(&prefix.to_be_bytes());
                    }
                }
                Ok(())
            }
            _ => Err(SecureError::Handshake("not established".into())),
        }
    }

    /// Like [`SecureChannel::send`], passing the bytes through without a copy on a
    /// plaintext channel.
    ///
    /// # Errors
    /// As [`SecureChannel::send`].
    pub fn send_bytes(&mut self, plaintext: Bytes) -> Result<(), SecureError> {
        if !matches!(self.state, State::Plain) {
            return self.send(&plaintext);
        }
        if !self.outbound.is_empty() {
            self.passed_out.push_back(self.outbound.split().freeze());
        }
        self.passed_out.push_back(plaintext);
        Ok(())
    }

    /// Like [`SecureChannel::send_bytes`] for several chunks in order, leaving `chunks`
    /// empty: passed through on a plaintext channel; under Noise cut into full Noise
    /// messages, small chunks (packet headers) gathered through one reused buffer so they do
    /// not each become a Noise message, whole messages' worth of a large chunk encrypted
    /// straight from it.
    ///
    /// # Errors
    /// As [`SecureChannel::send`].
    pub fn send_chunks(&mut self, chunks: &mut Vec<Bytes>) -> Result<(), SecureError> {
        if matches!(self.state, State::Plain) {
            return chunks.drain(..).try_for_each(|chunk| self.send_bytes(chunk));
        }
        if let [one] = chunks.as_slice() {
            let result = self.send(one);
            chunks.clear();
            return result;
        }
        if matches!(self.state, State::Secure(_)) {
            self.outbound.reserve(sealed_len(chunks.iter().map(Bytes::len).sum()));
        }
        let mut gather = std::mem::take(&mut self.gather);
        let mut result = Ok(());
        for chunk in chunks.drain(..) {
            let mut rest: &[u8] = &chunk;
            while !rest.is_empty() && result.is_ok() {
                let whole = rest.len() / PLAINTEXT_CHUNK_MAX * PLAINTEXT_CHUNK_MAX;
                if gather.is_empty() && whole > 0 {
                    let (now, later) = rest.split_at(whole);
                    result = self.send(now);
                    rest = later;
                    continue;
                }
                let (now, later) = rest.split_at(rest.len().min(PLAINTEXT_CHUNK_MAX - gather.len()));
                gather.extend_from_slice(now);
                rest = later;
                if gather.len() == PLAINTEXT_CHUNK_MAX {
                    result = self.send(&gather);
                    gather.clear();
                }
            }
        }
        if result.is_ok() && !gather.is_empty() {
            result = self.send(&gather);
        }
        gather.clear();
        self.gather = gather;
        result
    }

    /// Bytes for the wire, if any, in one piece.
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        if self.passed_out.is_empty() {
            return (!self.outbound.is_empty()).then(|| self.outbound.split().freeze());
        }
        let mut parts = Vec::new();
        self.take_transmit(&mut parts);
        Some(crate::wire::join(&parts))
    }

    /// Bytes for the wire, in order, as they are (no copy to join them).
    pub fn take_transmit(&mut self, out: &mut Vec<Bytes>) {
        out.extend(self.passed_out.drain(..));
        if !self.outbound.is_empty() {
            out.push(self.outbound.split().freeze());
        }
    }
}

fn put_message(out: &mut BytesMut, message: &[u8]) {
    out.put_u16(u16::try_from(message.len()).expect("noise messages are at most 65535 bytes"));
    out.put_slice(message);
}

/// The whole length (with its 2-byte length) of the Noise message `head` begins: 2 while
/// the length itself is not all there.
fn message_len(head: &[u8]) -> usize {
    head.get(..2)
        .and_then(|h| <[u8; 2]>::try_from(h).ok())
        .map_or(2, |h| 2 + usize::from(u16::from_be_bytes(h)))
}

/// What `plaintext_len` bytes take on the wire sealed: each Noise message of up to
/// [`PLAINTEXT_CHUNK_MAX`] bytes gets a 2-byte length and a tag.
fn sealed_len(plaintext_len: usize) -> usize {
    plaintext_len + plaintext_len.div_ceil(PLAINTEXT_CHUNK_MAX) * (2 + TAG_BYTES)
}

fn take_message(buf: &mut BytesMut) -> Option<Bytes> {
    let len = message_len(buf);
    if buf.len() < len {
        return None;
    }
    buf.advance(2);
    Some(buf.split_to(len - 2).freeze())
}

#[cfg(test)]
mod tests;
