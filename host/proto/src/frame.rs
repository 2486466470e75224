//! Link frames and their codec.
//!
//! On the wire every frame is a 4-byte big-endian length `L` (the bytes that follow, at most
//! `frame_bytes_max`), a 1-byte frame type, a 4-byte CRC32C of the frame's header, and the
//! body. The header CRC covers the length, the type and the whole body, except for `Data`,
//! where it covers the length, the type and the packet header up to the message CRC (and is
//! checked as soon as those 38 bytes are here): the message has its own CRC, checked once
//! all its packets are assembled, so a damaged message is refused by number with a `Nak`
//! while a damaged header tears the connection down. The length is checked against the limit before anything is
//! allocated, so a peer cannot make us buffer more than one frame's worth; any byte sequence
//! either decodes, waits for more bytes, or fails with a [`FrameError`] — it never panics.
//!
//! | type | frame | body |
//! | --- | --- | --- |
//! | 1 | `Hello` | magic `LNKB`, protocol version u16, API version u32, from, to (u8-length names), incarnation u64, your-incarnation u64, run u64, frame bytes max u32, message bytes max u64, in-flight messages max u32, in-flight bytes max u64, retransmit timeout ms u32, flags u8, channel count u8, then per channel: expected u64, bytes held of that message u64, its CRC32C u32 |
//! | 2 | `Data` | one packet: channel u8, sequence u64, offset u64 of the packet in its message, message length u64, CRC32C u32 of the whole message, the packet's bytes (a message of length 0 is a skip: the sequence number is used, the message was dropped in transit) |
//! | 3 | `Ack` | channel u8, sequence u64: every message of that channel up to it is delivered |
//! | 4 | `Ping` | nonce u64 |
//! | 5 | `Pong` | nonce u64 |
//! | 6 | `Close` | code u16, reason (UTF-8, rest of the frame) |
//! | 7 | `Nak` | channel u8, sequence u64: that message arrived damaged, send it again |

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::reader::{ReadError, Reader};
use crate::wire::DETACH_BYTES_MAX;

/// The link protocol version this build speaks; a peer with another version is refused.
/// (5: a message for several nodes travels in one copy per next hop naming only the
/// recipients routed there, and nodes relay the recipients that are not theirs. 6: the
/// `Hello` carries the sender's window and retransmit timeout, which bound how long the
/// receiver lets an acknowledgement wait. 7: a message may carry an encoding after its
/// payload, the codecs its origin applied; a node of version 6 could not read it.)
pub const PROTOCOL_VERSION: u16 = 7;
/// First bytes of every `Hello`, so a stray client of another protocol is recognised at once.
pub const HELLO_MAGIC: [u8; 4] = *b"LNKB";
/// Bytes of the length prefix.
pub const LENGTH_BYTES: usize = 4;
/// Bytes of the frame header CRC.
pub const HEADER_CRC_BYTES: usize = 4;
/// Bytes a `Data` frame adds to its packet: length, type, header CRC, channel, sequence,
/// offset, message length and message CRC.
pub const DATA_OVERHEAD_BYTES: usize = DATA_HEADER_BYTES;
/// Smallest allowed `frame_bytes_max`: a `Hello` with two longest names must fit.
pub const FRAME_BYTES_MIN: usize = 1024;

const TYPE_HELLO: u8 = 1;
const TYPE_DATA: u8 = 2;
const TYPE_ACK: u8 = 3;
const TYPE_PING: u8 = 4;
const TYPE_PONG: u8 = 5;
const TYPE_CLOSE: u8 = 6;
const TYPE_NAK: u8 = 7;

/// `Hello.flags` bit: the sender's store is durable, so its sequence numbers survive restarts.
pub const HELLO_FLAG_DURABLE: u8 = 1;

/// The opening frame each side sends on a new connection: who it is, who it expects, and
/// where its sequence numbers stand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The sender's link protocol version.
    pub protocol_version: u16,
    /// The sender's plugin API version.
    pub api_version: u32,
    /// The sender's node name (checked as a name by the session, not here).
    pub from: String,
    /// The node the sender believes it is talking to.
    pub to: String,
    /// Random id of the sender's state; changes when the sender lost its state.
    pub incarnation: u64,
    /// The receiver's incarnation that `channels` refers to (`0`: never met).
    pub your_incarnation: u64,
    /// Random id of the sender's process run: a new one means the sender restarted (its
    /// incarnation may be kept by a durable store), so an older connection from it is dead.
    pub run: u64,
    /// The longest frame the sender accepts; packets are cut to fit it.
    pub frame_bytes_max: u32,
    /// The longest message the sender accepts; longer ones are not sent to it.
    pub message_bytes_max: u64,
    /// Most messages the sender has in flight (sent, not acknowledged) on one channel.
    pub in_flight_messages_max: u32,
    /// Most bytes the sender has in flight on one channel.
    pub in_flight_bytes_max: u64,
    /// Time after which the sender writes again a message still unacknowledged.
    pub retransmit_timeout_ms: u32,
    /// `HELLO_FLAG_*` bits.
    pub flags: u8,
    /// Where the sender's receiving side stands, one entry per channel.
    pub channels: Vec<ChannelPosition>,
}

/// How far one channel's receiving side got, as told in a `Hello`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChannelPosition {
    /// The next sequence number expected on the channel.
    pub expected: u64,
    /// Bytes already held of message `expected` (resume from there; 0: from its start).
    pub held_bytes: u64,
    /// The whole-message CRC of the message those bytes belong to, so the sender resumes
    /// only the same bytes.
    pub held_crc: u32,
}

/// One decoded frame; bodies share the receive buffer (no copy), except the packet of a short
/// message that came whole in one, copied into a buffer of its own (see `short_data`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Connection opening.
    Hello(Hello),
    /// One packet of a sequenced message.
    Data {
        /// The channel the message travels on.
        channel: u8,
        /// The message's sequence number on its channel.
        sequence: u64,
        /// Where `bytes` start in the message.
        offset: u64,
        /// The message's length (0: a skip).
        total: u64,
        /// CRC32C of the whole message, checked by the session once assembled.
        crc: u32,
        /// This packet's part of the encoded message.
        bytes: Bytes,
    },
    /// Cumulative acknowledgement of one channel.
    Ack {
        /// The channel.
        channel: u8,
        /// Every message of the channel with a sequence number up to this one is delivered.
        sequence: u64,
    },
    /// The message with this number arrived with a bad CRC: send it again.
    Nak {
        /// Its channel.
        channel: u8,
        /// Its sequence number.
        sequence: u64,
    },
    /// Keepalive probe.
    Ping {
        /// Echoed in the `Pong`.
        nonce: u64,
    },
    /// Keepalive answer.
    Pong {
        /// The `Ping`'s nonce.
        nonce: u64,
    },
    /// The sender closes the connection, saying why.
    Close {
        /// A [`CloseCode`] value.
        code: u16,
        /// Human-readable reason.
        reason: String,
    },
}

/// Why a connection is closed, as sent in a `Close` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum CloseCode {
    /// Orderly shutdown.
    Shutdown = 0,
    /// The peer broke the protocol.
    ProtocolError = 1,
    /// The peer speaks another protocol version.
    VersionMismatch = 2,
    /// The peer is not who it should be, or is not configured here.
    UnknownPeer = 3,
    /// A second connection to the same peer; this one loses.
    Duplicate = 4,
    /// The node cannot take what the peer sends now (its store is nearly full): the peer
    /// keeps it and sends it again after reconnecting.
    Busy = 5,
}

/// Why bytes could not be decoded into a frame. The connection must be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The declared length is over `frame_bytes_max` (or zero).
    #[error("frame of {len} bytes is outside 1..={max}")]
    BadLength {
        /// The declared length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// An unknown frame type.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// A frame whose header CRC does not match: the stream cannot be trusted.
    #[error("frame header failed its CRC check")]
    BadHeaderCrc,
    /// A `Hello` without the magic bytes: not a linkbus peer.
    #[error("not a linkbus peer (bad magic)")]
    BadMagic,
    /// A body that does not match its frame type.
    #[error("malformed {frame} frame: {source}")]
    Malformed {
        /// Which frame.
        frame: &'static str,
        /// What was wrong.
        source: ReadError,
    },
}

impl Hello {
    /// A `Hello` from `from` to `to` in this build's protocol and plugin API versions, with
    /// no incarnation known of the receiver, run 1, limits of 1 MiB frames and messages, a
    /// window of 4096 messages and 64 MiB, a 10 s retransmit timeout, no flags, and every
    /// channel expecting its first message; change what differs with struct update syntax.
    pub fn new(from: &str, to: &str) -> Self {
        Self {
            protocol_version: PROTOCOL_VERSION,
            api_version: linkbus_plugin_api::API_VERSION,
            from: from.to_owned(),
            to: to.to_owned(),
            incarnation: 1,
            your_incarnation: 0,
            run: 1,
            frame_bytes_max: 1 << 20,
            message_bytes_max: 1 << 20,
            in_flight_messages_max: 4096,
            in_flight_bytes_max: 64 << 20,
            retransmit_timeout_ms: 10_000,
            flags: 0,
            channels: vec![ChannelPosition::default(); crate::channel::CHANNELS],
        }
    }
}

impl Frame {
    /// Appends the encoded frame to `out`.
    ///
    /// # Panics
    /// When a `Hello` name is longer than 255 bytes (names are validated long before).
    pub fn encode(&self, out: &mut BytesMut) {
        let start = out.len();
        put_length_prefixed(out, |out| {
            let body = out.len();
            self.encode_body(out);
            // Room for the header CRC right after the type byte.
            let rest = out.split_off(body + 1);
            out.put_u32(0);
            out.unsplit(rest);
        });
        let covered_end = match self {
            Self::Data { .. } => start + DATA_HEADER_BYTES,
            _ => out.len(),
        };
        let crc = header_crc(out.get(start..covered_end).unwrap_or_default());
        if let Some(slot) = out.get_mut(start + LENGTH_BYTES + 1..start + LENGTH_BYTES + 1 + HEADER_CRC_BYTES)
        {
            slot.copy_from_slice(&crc.to_be_bytes());
        }
    }

    fn encode_body(&self, out: &mut BytesMut) {
        match self {
            Self::Hello(h) => encode_hello(h, out),
            Self::Data { channel, sequence, offset, total, crc, bytes } => {
                out.put_u8(TYPE_DATA);
                out.put_u8(*channel);
                out.put_u64(*sequence);
                out.put_u64(*offset);
                out.put_u64(*total);
                out.put_u32(*crc);
                out.put_slice(bytes);
            }
            Self::Ack { channel, sequence } => {
                out.put_u8(TYPE_ACK);
                out.put_u8(*channel);
                out.put_u64(*sequence);
            }
            Self::Nak { channel, sequence } => {
                out.put_u8(TYPE_NAK);
                out.put_u8(*channel);
                out.put_u64(*sequence);
            }
            Self::Ping { nonce } => {
                out.put_u8(TYPE_PING);
                out.put_u64(*nonce);
            }
            Self::Pong { nonce } => {
                out.put_u8(TYPE_PONG);
                out.put_u64(*nonce);
            }
            Self::Close { code, reason } => {
                out.put_u8(TYPE_CLOSE);
                out.put_u16(*code);
                out.put_slice(reason.as_bytes());
            }
        }
    }

    /// Appends one `Data` frame (a packet of a message) without building a [`Frame`].
    ///
    /// # Panics
    /// When the packet is 4 GiB or more (packets are bounded by the frame limit).
    pub fn encode_data(packet: &Packet<'_>, out: &mut BytesMut) {
        out.reserve(DATA_HEADER_BYTES + packet.bytes.len());
        Self::encode_data_header(&packet.header(), out);
        out.put_slice(packet.bytes);
    }

    /// The header of a `Data` frame, without the packet's bytes (which the caller appends,
    /// or shares into a vectored write, in as many parts as it has them).
    ///
    /// # Panics
    /// As [`Frame::encode_data`].
    pub fn encode_data_header(packet: &DataHeader, out: &mut BytesMut) {
        let len = u32::try_from(DATA_HEADER_BYTES - LENGTH_BYTES + packet.len)
            .expect("packets are bounded by the frame limit");
        let mut header = [0u8; DATA_HEADER_BYTES];
        header[..4].copy_from_slice(&len.to_be_bytes());
        header[4] = TYPE_DATA;
        header[9] = packet.channel;
        header[10..18].copy_from_slice(&packet.sequence.to_be_bytes());
        header[18..26].copy_from_slice(&packet.offset.to_be_bytes());
        header[26..34].copy_from_slice(&packet.total.to_be_bytes());
        header[34..].copy_from_slice(&packet.crc.to_be_bytes());
        let crc = header_crc(&header);
        header[5..9].copy_from_slice(&crc.to_be_bytes());
        out.put_slice(&header);
    }

    /// A short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Hello(_) => "hello",
            Self::Data { .. } => "data",
            Self::Ack { .. } => "ack",
            Self::Ping { .. } => "ping",
            Self::Pong { .. } => "pong",
            Self::Nak { .. } => "nak",
            Self::Close { .. } => "close",
        }
    }
}

/// The header of one `Data` frame, for [`Frame::encode_data_header`].
#[derive(Debug, Clone, Copy)]
pub struct DataHeader {
    /// The channel.
    pub channel: u8,
    /// The message's sequence number on the channel.
    pub sequence: u64,
    /// Where the packet's bytes start in the message.
    pub offset: u64,
    /// The message's length.
    pub total: u64,
    /// CRC32C of the whole message.
    pub crc: u32,
    /// The packet's length in bytes.
    pub len: usize,
}

/// One packet to write with [`Frame::encode_data`].
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    /// The channel.
    pub channel: u8,
    /// The message's sequence number on the channel.
    pub sequence: u64,
    /// Where `bytes` start in the message.
    pub offset: u64,
    /// The message's length.
    pub total: u64,
    /// CRC32C of the whole message.
    pub crc: u32,
    /// The packet's bytes.
    pub bytes: &'a [u8],
}

impl Packet<'_> {
    /// Its header.
    pub fn header(&self) -> DataHeader {
        let Self { channel, sequence, offset, total, crc, bytes } = *self;
        DataHeader { channel, sequence, offset, total, crc, len: bytes.len() }
    }
}

/// Appends what `body` writes, preceded by its length as a big-endian `u32` (the framing of
/// links and of the client protocol).
///
/// # Panics
/// When the body is 4 GiB or more (every caller writes bounded bodies).
pub fn put_length_prefixed(out: &mut BytesMut, body: impl FnOnce(&mut BytesMut)) {
    let start = out.len();
    out.put_u32(0);
    body(out);
    let len = u32::try_from(out.len() - start - LENGTH_BYTES).expect("bodies are bounded below 4 GiB");
    if let Some(prefix) = out.get_mut(start..start + LENGTH_BYTES) {
        prefix.copy_from_slice(&len.to_be_bytes());
    }
}

fn encode_hello(h: &Hello, out: &mut BytesMut) {
    out.put_u8(TYPE_HELLO);
    out.put_slice(&HELLO_MAGIC);
    out.put_u16(h.protocol_version);
    out.put_u32(h.api_version);
    for name in [&h.from, &h.to] {
        out.put_u8(u8::try_from(name.len()).expect("node names are short"));
        out.put_slice(name.as_bytes());
    }
    out.put_u64(h.incarnation);
    out.put_u64(h.your_incarnation);
    out.put_u64(h.run);
    out.put_u32(h.frame_bytes_max);
    out.put_u64(h.message_bytes_max);
    out.put_u32(h.in_flight_messages_max);
    out.put_u64(h.in_flight_bytes_max);
    out.put_u32(h.retransmit_timeout_ms);
    out.put_u8(h.flags);
    out.put_u8(u8::try_from(h.channels.len()).expect("channels are few"));
    for c in &h.channels {
        out.put_u64(c.expected);
        out.put_u64(c.held_bytes);
        out.put_u32(c.held_crc);
    }
}

/// Incremental frame decoder: feed bytes as they arrive, take frames as they complete.
///
/// Frames that arrive whole in a chunk given as [`Bytes`] ([`FrameDecoder::extend_bytes`])
/// are cut out of it without a copy; only a frame split across chunks is gathered. A short
/// message whole in one `Data` frame is the exception: its packet is copied out into a
/// buffer of its own (it would be copied before it is kept anyway).
#[derive(Debug)]
pub struct FrameDecoder {
    /// The start of a frame split across chunks (empty between frames).
    buf: BytesMut,
    /// Received bytes after `buf`, not yet looked at.
    whole: Bytes,
    frame_bytes_max: usize,
}

impl FrameDecoder {
    /// A decoder refusing frames longer than `frame_bytes_max`.
    pub fn new(frame_bytes_max: usize) -> Self {
        Self { buf: BytesMut::new(), whole: Bytes::new(), frame_bytes_max }
    }

    /// Buffers received bytes (copied).
    pub fn extend(&mut self, bytes: &[u8]) {
        self.gather_whole();
        self.buf.extend_from_slice(bytes);
    }

    /// Takes received bytes; frames wholly inside them are not copied (of a frame begun in
    /// an earlier chunk, only the rest is copied to it), short whole messages aside.
    pub fn extend_bytes(&mut self, bytes: Bytes) {
        if self.whole.is_empty() {
            self.whole = bytes;
        } else {
            self.gather_whole();
            self.buf.extend_from_slice(&bytes);
        }
    }

    /// Moves what is left of the last chunk into the buffer.
    fn gather_whole(&mut self) {
        if !self.whole.is_empty() {
            self.buf.extend_from_slice(&std::mem::take(&mut self.whole));
        }
    }

    /// Bytes buffered but not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len() + self.whole.len()
    }

    /// Takes the bytes buffered after the last decoded frame (to hand a connection over).
    pub fn take_buffered(&mut self) -> BytesMut {
        self.gather_whole();
        self.buf.split()
    }

    /// Drops everything buffered (a new connection starts clean).
    pub fn clear(&mut self) {
        self.buf.clear();
        self.whole = Bytes::new();
    }

    /// The whole length of the frame that `head` begins, once its length prefix is there;
    /// a length out of bounds, or (while the frame is incomplete) a data frame's header
    /// that fails its CRC, is an error — so a damaged length never makes us wait for (or
    /// reserve) bytes that belong to later frames.
    fn frame_len(&self, head: &[u8]) -> Result<Option<usize>, FrameError> {
        let Some(prefix) = head.get(..LENGTH_BYTES) else {
            return Ok(None);
        };
        let mut len_bytes = [0u8; LENGTH_BYTES];
        len_bytes.copy_from_slice(prefix);
        let len = u32::from_be_bytes(len_bytes) as usize;
        if len == 0 || len > self.frame_bytes_max {
            return Err(FrameError::BadLength { len, max: self.frame_bytes_max });
        }
        if head.len() < LENGTH_BYTES + len
            && let Some(header) = head.get(..DATA_HEADER_BYTES)
            && header.get(LENGTH_BYTES) == Some(&TYPE_DATA)
            && !header_crc_matches(header)
        {
            return Err(FrameError::BadHeaderCrc);
        }
        Ok(Some(LENGTH_BYTES + len))
    }

    /// The next complete frame: `Ok(None)` when more bytes are needed.
    ///
    /// # Errors
    /// [`FrameError`] for a corrupt stream; the connection must be closed.
    pub fn decode(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.is_empty() {
            let total = self.frame_len(&self.whole)?;
            if let Some(total) = total.filter(|t| *t <= self.whole.len()) {
                if let Some(frame) = short_data(self.whole.get(..total).unwrap_or_default()) {
                    // The chunk is let go with its last frame, as `split_to` would.
                    if total == self.whole.len() {
                        self.whole = Bytes::new();
                    } else {
                        self.whole.advance(total);
                    }
                    return frame.map(Some);
                }
                return decode_frame(self.whole.split_to(total)).map(Some);
            }
            // The chunk ends inside a frame: gather it from here.
            let rest = std::mem::take(&mut self.whole);
            self.buf.reserve(total.unwrap_or(LENGTH_BYTES).max(rest.len()));
            self.buf.extend_from_slice(&rest);
            return Ok(None);
        }
        // A frame begun in an earlier chunk: take from the new one only what completes it
        // (first the length, then the rest).
        loop {
            let total = self.frame_len(&self.buf)?;
            let want = total.unwrap_or(LENGTH_BYTES);
            if let Some(total) = total.filter(|t| *t <= self.buf.len()) {
                if let Some(frame) = short_data(self.buf.get(..total).unwrap_or_default()) {
                    self.buf.advance(total);
                    return frame.map(Some);
                }
                return decode_frame(self.buf.split_to(total).freeze()).map(Some);
            }
            if self.whole.is_empty() {
                self.buf.reserve(want - self.buf.len());
                return Ok(None);
            }
            let take = (want - self.buf.len()).min(self.whole.len());
            self.buf.extend_from_slice(&self.whole.split_to(take));
        }
    }
}

/// Bytes of a `Data` frame before its packet: length, type, header CRC, channel,
/// sequence, offset, message length, message CRC.
const DATA_HEADER_BYTES: usize = LENGTH_BYTES + 1 + HEADER_CRC_BYTES + 1 + 8 + 8 + 8 + 4;

/// The header CRC of a frame whose covered bytes are `covered` (length, type, a zeroed CRC
/// slot, and the covered fields): the CRC slot itself is skipped.
fn header_crc(covered: &[u8]) -> u32 {
    let head = covered.get(..LENGTH_BYTES + 1).unwrap_or_default();
    let rest = covered.get(LENGTH_BYTES + 1 + HEADER_CRC_BYTES..).unwrap_or_default();
    crate::crc::crc32c_append(crate::crc::crc32c(head), rest)
}

fn header_crc_matches(covered: &[u8]) -> bool {
    let stored = covered
        .get(LENGTH_BYTES + 1..LENGTH_BYTES + 1 + HEADER_CRC_BYTES)
        .and_then(|b| <[u8; 4]>::try_from(b).ok());
    stored.is_some_and(|b| u32::from_be_bytes(b) == header_crc(covered))
}

/// A `Data` frame carrying a whole message shorter than [`DETACH_BYTES_MAX`] in one packet,
/// read in place from `frame` (all of it, from its length prefix) with its packet copied
/// into a buffer of its own; `None` for any other frame (cut out of the chunk as it is).
///
/// Such a message would be copied later all the same (a short message kept in a queue must
/// not hold the whole read chunk in memory): copied here, it is never cut out of the chunk
/// first, which counted the chunk's handles up and down twice per message. A part of a
/// longer message is not copied: it is gathered into the message's own buffer.
fn short_data(frame: &[u8]) -> Option<Result<Frame, FrameError>> {
    let (header, packet) = frame.split_at_checked(DATA_HEADER_BYTES)?;
    if header.get(LENGTH_BYTES) != Some(&TYPE_DATA) || packet.len() >= DETACH_BYTES_MAX {
        return None;
    }
    if !header_crc_matches(header) {
        return Some(Err(FrameError::BadHeaderCrc));
    }
    // Length, type and header CRC, then the fields.
    let fields = header.get(LENGTH_BYTES + 1 + HEADER_CRC_BYTES..)?;
    let u64_at = |at: usize| fields.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes);
    let (offset, total) = (u64_at(9)?, u64_at(17)?);
    if offset != 0 || total != packet.len() as u64 {
        return None;
    }
    let crc = fields.get(25..29).and_then(|b| b.try_into().ok()).map(u32::from_be_bytes)?;
    Some(Ok(Frame::Data {
        channel: *fields.first()?,
        sequence: u64_at(1)?,
        offset,
        total,
        crc,
        bytes: Bytes::copy_from_slice(packet),
    }))
}

fn decode_frame(bytes: Bytes) -> Result<Frame, FrameError> {
    let mut r = Reader::new(bytes.slice(LENGTH_BYTES..));
    let kind = r.u8().map_err(|source| FrameError::Malformed { frame: "any", source })?;
    // The stored header CRC, checked against the covered bytes below.
    r.u32().map_err(|source| FrameError::Malformed { frame: "any", source })?;
    let frame = match kind {
        TYPE_HELLO => "hello",
        TYPE_DATA => "data",
        TYPE_ACK => "ack",
        TYPE_NAK => "nak",
        TYPE_PING => "ping",
        TYPE_PONG => "pong",
        TYPE_CLOSE => "close",
        other => return Err(FrameError::UnknownType(other)),
    };
    let malformed = |source| FrameError::Malformed { frame, source };
    let decoded = match kind {
        TYPE_HELLO => decode_hello(&mut r)?,
        TYPE_DATA => Frame::Data {
            channel: r.u8().map_err(malformed)?,
            sequence: r.u64().map_err(malformed)?,
            offset: r.u64().map_err(malformed)?,
            total: r.u64().map_err(malformed)?,
            crc: r.u32().map_err(malformed)?,
            bytes: r.rest(),
        },
        TYPE_ACK => Frame::Ack { channel: r.u8().map_err(malformed)?, sequence: r.u64().map_err(malformed)? },
        TYPE_NAK => Frame::Nak { channel: r.u8().map_err(malformed)?, sequence: r.u64().map_err(malformed)? },
        TYPE_PING => Frame::Ping { nonce: r.u64().map_err(malformed)? },
        TYPE_PONG => Frame::Pong { nonce: r.u64().map_err(malformed)? },
        _ => {
            let code = r.u16().map_err(malformed)?;
            let reason = String::from_utf8_lossy(&r.rest()).into_owned();
            Frame::Close { code, reason }
        }
    };
    r.finish().map_err(malformed)?;
    // Fields are checked first, so a stranger is told it is not a peer (bad magic) rather
    // than that its frame is damaged.
    let covered_end = if kind == TYPE_DATA { DATA_HEADER_BYTES } else { bytes.len() };
    if !header_crc_matches(bytes.get(..covered_end).unwrap_or_default()) {
        return Err(FrameError::BadHeaderCrc);
    }
    Ok(decoded)
}

fn decode_hello(r: &mut Reader) -> Result<Frame, FrameError> {
    let malformed = |source| FrameError::Malformed { frame: "hello", source };
    if r.bytes(HELLO_MAGIC.len()).map_err(malformed)? != HELLO_MAGIC[..] {
        return Err(FrameError::BadMagic);
    }
    let hello = Hello {
        protocol_version: r.u16().map_err(malformed)?,
        api_version: r.u32().map_err(malformed)?,
        from: r.short_string().map_err(malformed)?,
        to: r.short_string().map_err(malformed)?,
        incarnation: r.u64().map_err(malformed)?,
        your_incarnation: r.u64().map_err(malformed)?,
        run: r.u64().map_err(malformed)?,
        frame_bytes_max: r.u32().map_err(malformed)?,
        message_bytes_max: r.u64().map_err(malformed)?,
        in_flight_messages_max: r.u32().map_err(malformed)?,
        in_flight_bytes_max: r.u64().map_err(malformed)?,
        retransmit_timeout_ms: r.u32().map_err(malformed)?,
        flags: r.u8().map_err(malformed)?,
        channels: Vec::new(),
    };
    let mut hello = hello;
    for _ in 0..r.u8().map_err(malformed)? {
        hello.channels.push(ChannelPosition {
            expected: r.u64().map_err(malformed)?,
            held_bytes: r.u64().map_err(malformed)?,
            held_crc: r.u32().map_err(malformed)?,
        });
    }
    r.finish().map_err(malformed)?;
    Ok(Frame::Hello(hello))
}

#[cfg(test)]
mod tests;
