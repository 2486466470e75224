//! Buffers for encoded bytes: [`Chunks`] for a vectored write, [`Encoded`] for a message a
//! link keeps until acknowledged, and [`Heads`] for the heads of many such messages.

use bytes::{BufMut, Bytes, BytesMut};
use linkbus_plugin_api::Message;

#[cfg(doc)]
use super::encode_message;
use super::{
    encode_content_head, encode_encoding, encode_message_head, encoded_len, is_persistent, is_volatile, join,
    with_lifetime,
};

/// Output for a vectored write: encoded bytes with large payloads shared between them
/// instead of copied in.
///
/// Encoded bytes go into buffers of their own: one that has no room for the next piece goes
/// out as a chunk as it is and a fresh one begins, each twice the last, from 4 KiB up to
/// [`Chunks::BUFFER_BYTES`]. Bytes once written never move (a single buffer grown as
/// needed copies everything it holds at each growth).
#[derive(Debug)]
pub struct Chunks {
    done: Vec<Bytes>,
    /// Bytes in `done`.
    done_len: usize,
    current: BytesMut,
    /// The size of the buffer begun last (0 before the first).
    buffer_bytes: usize,
    /// Pieces this long or longer are shared, shorter ones copied.
    share_bytes_min: usize,
}

impl Default for Chunks {
    fn default() -> Self {
        Self::sharing_from(Self::SHARE_BYTES_MIN)
    }
}

impl Chunks {
    /// Payloads shorter than this are copied by default (an extra chunk costs more than the
    /// copy); a client's requests and the node's answers use it. A link's frames share from
    /// [`Chunks::LINK_SHARE_BYTES_MIN`].
    pub const SHARE_BYTES_MIN: usize = 4096;
    /// Payloads shorter than this are copied into a link's frames (and into the head of an
    /// [`Encoded`] message), longer ones shared. Perf (OPT-54): a link's sender copies no
    /// payload of 512 B or more itself. Client answers keep [`Chunks::SHARE_BYTES_MIN`]
    /// (OPT-55): an answer in thousands of small shared pieces delays urgent messages.
    pub const LINK_SHARE_BYTES_MIN: usize = 512;
    /// The largest buffer encoded bytes are written in.
    pub const BUFFER_BYTES: usize = 64 * 1024;
    /// The first buffer's size.
    const FIRST_BUFFER_BYTES: usize = 4 * 1024;
    /// Room [`Chunks::buf`] leaves for what is encoded there: enough for the usual header
    /// (a longer one still fits, its buffer grown by copying).
    const HEAD_ROOM_BYTES: usize = 1024;

    /// Empty, sharing pieces of `share_bytes_min` bytes or more.
    pub fn sharing_from(share_bytes_min: usize) -> Self {
        Self { done: Vec::new(), done_len: 0, current: BytesMut::new(), buffer_bytes: 0, share_bytes_min }
    }

    /// Where to encode the next bytes.
    pub fn buf(&mut self) -> &mut BytesMut {
        self.room(Self::HEAD_ROOM_BYTES);
        &mut self.current
    }

    /// Makes room for `len` more bytes in the current buffer without moving what it holds:
    /// a buffer without room goes out as it is, and a new one begins.
    fn room(&mut self, len: usize) {
        if self.current.capacity() - self.current.len() >= len {
            return;
        }
        self.finish_current();
        self.buffer_bytes = (2 * self.buffer_bytes).clamp(Self::FIRST_BUFFER_BYTES, Self::BUFFER_BYTES);
        self.current = BytesMut::with_capacity(len.max(self.buffer_bytes));
    }

    /// Moves what the current buffer holds to the chunks done (its room left for later).
    fn finish_current(&mut self) {
        if !self.current.is_empty() {
            self.done_len += self.current.len();
            self.done.push(self.current.split().freeze());
        }
    }

    /// Appends `bytes`: shared when large, else copied.
    pub fn share(&mut self, bytes: &Bytes) {
        self.share_range(bytes, 0, bytes.len());
    }

    /// Appends `bytes[from..to]`: shared when large, else copied (a short piece is never
    /// cut out as a shared slice of its own, which would cost an allocation for nothing).
    ///
    /// # Panics
    /// When the range is out of bounds.
    pub fn share_range(&mut self, bytes: &Bytes, from: usize, to: usize) {
        let piece = bytes.get(from..to).expect("a range within the bytes");
        if piece.len() < self.share_bytes_min {
            self.room(piece.len());
            self.current.put_slice(piece);
            return;
        }
        self.finish_current();
        self.done_len += piece.len();
        self.done.push(bytes.slice(from..to));
    }

    /// Bytes appended so far.
    pub fn len(&self) -> usize {
        self.done_len + self.current.len()
    }

    /// Whether nothing was appended.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops everything appended.
    pub fn clear(&mut self) {
        self.done.clear();
        self.done_len = 0;
        self.current.clear();
    }

    /// The chunks, in order, leaving this empty (its buffer kept for reuse).
    pub fn take(&mut self, into: &mut Vec<Bytes>) {
        self.finish_current();
        self.done_len = 0;
        into.append(&mut self.done);
    }
}

/// An encoded message as a link keeps it until acknowledged: everything before the
/// payload's bytes, then the payload shared with the message rather than copied behind
/// them (a payload under [`Chunks::LINK_SHARE_BYTES_MIN`] is copied into the head; a message
/// made from one buffer has it all in the head).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoded {
    head: Bytes,
    payload: Bytes,
}

impl Encoded {
    /// The wire form of `message`, its large payload shared.
    ///
    /// # Panics
    /// As [`encode_message`].
    pub fn of(message: &Message) -> Self {
        Self::placed(message, written)
    }

    /// Like [`Encoded::of`], its head written in `heads`'s current buffer.
    ///
    /// # Panics
    /// As [`encode_message`].
    pub fn of_in(message: &Message, heads: &mut Heads) -> Self {
        Self::placed(message, |len, write| heads.write(len, write))
    }

    /// `message` encoded, its head written where `place` puts its length's worth.
    fn placed(message: &Message, place: impl FnOnce(usize, &mut dyn FnMut(&mut BytesMut)) -> Bytes) -> Self {
        let payload = &message.content.payload;
        // (An encoded payload has its encoding after it, in the head's buffer too.)
        let share = payload.len() >= Chunks::LINK_SHARE_BYTES_MIN && message.encoding.is_empty();
        let len = encoded_len(message);
        let head = place(if share { len - payload.len() } else { len }, &mut |head| {
            encode_message_head(message, head);
            encode_content_head(&message.content, head);
            if !share {
                head.put_slice(payload);
                encode_encoding(&message.encoding, head);
            }
        });
        Self { head, payload: if share { payload.clone() } else { Bytes::new() } }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }

    /// Whether it has no bytes (a message dropped in transit).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its bytes in order, in one or two parts (the second may be empty).
    pub fn parts(&self) -> [&[u8]; 2] {
        [&self.head, &self.payload]
    }

    /// Appends bytes `start..end` of it to `out` (see [`Chunks::share_range`]).
    ///
    /// # Panics
    /// When the range is out of bounds.
    pub fn append_to(&self, start: usize, end: usize, out: &mut Chunks) {
        let cut = self.head.len();
        out.share_range(&self.head, start.min(cut), end.min(cut));
        out.share_range(&self.payload, start.max(cut) - cut, end.max(cut) - cut);
    }

    /// CRC32C of all its bytes.
    pub fn crc(&self) -> u32 {
        crate::crc::crc32c_append(crate::crc::crc32c(&self.head), &self.payload)
    }

    /// All of it in one buffer (copied only when it is in two parts).
    pub fn to_bytes(&self) -> Bytes {
        if self.payload.is_empty() {
            self.head.clone()
        } else {
            join(&[self.head.clone(), self.payload.clone()])
        }
    }

    /// Whether the message is volatile (see [`is_volatile`]).
    pub fn is_volatile(&self) -> bool {
        is_volatile(&self.head)
    }

    /// Whether the message is persistent (see [`is_persistent`]).
    pub fn is_persistent(&self) -> bool {
        is_persistent(&self.head)
    }

    /// The same message with its lifetime field set to `lifetime_ms` (the payload still
    /// shared); `None` when the bytes are not an encoded message.
    pub fn with_lifetime(&self, lifetime_ms: u64) -> Option<Self> {
        Some(Self { head: with_lifetime(&self.head, lifetime_ms)?, payload: self.payload.clone() })
    }
}

/// The `len` bytes `write` puts in a buffer of their own.
fn written(len: usize, write: &mut dyn FnMut(&mut BytesMut)) -> Bytes {
    let mut own = BytesMut::with_capacity(len);
    write(&mut own);
    own.freeze()
}

/// Buffers that the heads of many [`Encoded`] messages are written in one after another,
/// each head a slice of its buffer: a link encoding the messages it keeps until they are
/// acknowledged allocates once per [`Heads::BUFFER_BYTES`] instead of once per message.
/// A buffer goes when the last of its heads is dropped: one `Heads` per stream whose
/// messages are let go in order (a link's channel, acknowledged in order), so that the
/// heads of a buffer go at about the same time.
#[derive(Debug, Default)]
pub struct Heads {
    /// The rest of the current buffer (empty, with the room left as its capacity).
    rest: BytesMut,
}

impl Heads {
    /// The size of each buffer.
    pub const BUFFER_BYTES: usize = 64 * 1024;
    /// A head this long or longer gets a buffer of its own (a large one would keep its
    /// buffer's other heads' bytes alive, or leave much of the buffer unused).
    pub const OWN_BYTES_MIN: usize = 8 * 1024;

    /// The `len` bytes `write` puts in the buffer given to it, as a buffer of their own or
    /// a slice of the current shared one.
    fn write(&mut self, len: usize, write: &mut dyn FnMut(&mut BytesMut)) -> Bytes {
        if len >= Self::OWN_BYTES_MIN {
            return written(len, write);
        }
        if self.rest.capacity() < len {
            self.rest = BytesMut::with_capacity(Self::BUFFER_BYTES);
        }
        write(&mut self.rest);
        self.rest.split().freeze()
    }
}

impl From<Bytes> for Encoded {
    fn from(bytes: Bytes) -> Self {
        Self { head: bytes, payload: Bytes::new() }
    }
}
