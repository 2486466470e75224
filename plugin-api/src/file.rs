//! File messages: the names a file goes by under a node's files directory, and the frames a
//! transfer is made of.
//!
//! A file is named relative to the files directory (`node.files_dir`) of the node that
//! sends it and of the node that receives it. A [`FileName`] is checked on creation, by
//! every node that reads one, against the rules below; each refusal names its rule.
//!
//! A transfer travels as messages of kind [`Kind::File`](crate::Kind::File) whose payload is
//! one [`Frame`]: chunks from the origin to a recipient, and a few small answers back. The
//! host drives the exchange; the [`MessageHandler`](crate::MessageHandler) plugin reads and
//! writes the bytes.

use std::fmt;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Longest file name, in bytes.
pub const FILE_NAME_BYTES_MAX: usize = 1024;
/// Longest directory or file component of a name, in bytes.
pub const FILE_NAME_COMPONENT_BYTES_MAX: usize = 255;
/// The directory under the files directory where files being received are written; no name
/// may start with it.
pub const PARTIAL_DIR: &str = ".linkbus-partial";

/// A file's name relative to a files directory: UTF-8, components separated by `/`, none
/// of them empty, `.` or `..`; no NUL, backslash or control character; not absolute; at
/// most [`FILE_NAME_BYTES_MAX`] bytes and [`FILE_NAME_COMPONENT_BYTES_MAX`] per component;
/// not under [`PARTIAL_DIR`]. Spaces and other characters are kept as they are.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileName(String);

/// Why a file name was refused: the rule it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileNameError {
    /// Nothing was named.
    #[error("the file name is empty")]
    Empty,
    /// Over [`FILE_NAME_BYTES_MAX`].
    #[error("the file name is {0} bytes long; at most {FILE_NAME_BYTES_MAX} are allowed")]
    TooLong(usize),
    /// A component over [`FILE_NAME_COMPONENT_BYTES_MAX`].
    #[error(
        "the file name has a component of {0} bytes; at most {FILE_NAME_COMPONENT_BYTES_MAX} are allowed"
    )]
    ComponentTooLong(usize),
    /// Starts with `/`.
    #[error("the file name '{0}' is absolute; name it relative to the files directory")]
    Absolute(String),
    /// Has a `..` component.
    #[error("the file name '{0}' has a '..' component; names stay inside the files directory")]
    Parent(String),
    /// Has an empty or `.` component (`a//b`, `./a`, `a/`).
    #[error("the file name '{0}' has an empty or '.' component")]
    EmptyComponent(String),
    /// Holds a NUL byte.
    #[error("the file name contains a NUL byte")]
    Nul,
    /// Holds a backslash.
    #[error("the file name '{0}' contains a backslash; separate directories with '/'")]
    Backslash(String),
    /// Holds a control character.
    #[error("the file name {0:?} contains a control character")]
    Control(String),
    /// Under [`PARTIAL_DIR`].
    #[error("the file name '{0}' is under '{PARTIAL_DIR}', which holds files being received")]
    Reserved(String),
    /// Not UTF-8 (read from the wire).
    #[error("the file name is not UTF-8")]
    NotUtf8,
}

impl FileName {
    /// Checks `name` against the rules (see [`FileName`]).
    ///
    /// # Errors
    /// The first rule `name` breaks.
    pub fn new(name: &str) -> Result<Self, FileNameError> {
        if name.is_empty() {
            return Err(FileNameError::Empty);
        }
        if name.contains('\0') {
            return Err(FileNameError::Nul);
        }
        if name.len() > FILE_NAME_BYTES_MAX {
            return Err(FileNameError::TooLong(name.len()));
        }
        let owned = || name.to_owned();
        if name.starts_with('/') {
            return Err(FileNameError::Absolute(owned()));
        }
        if name.contains('\\') {
            return Err(FileNameError::Backslash(owned()));
        }
        if name.chars().any(char::is_control) {
            return Err(FileNameError::Control(owned()));
        }
        for component in name.split('/') {
            match component {
                ".." => return Err(FileNameError::Parent(owned())),
                "" | "." => return Err(FileNameError::EmptyComponent(owned())),
                long if long.len() > FILE_NAME_COMPONENT_BYTES_MAX => {
                    return Err(FileNameError::ComponentTooLong(long.len()));
                }
                _ => {}
            }
        }
        if name.split('/').next() == Some(PARTIAL_DIR) {
            return Err(FileNameError::Reserved(owned()));
        }
        Ok(Self(name.to_owned()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its components, outermost first.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }
}

impl fmt::Display for FileName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for FileName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::str::FromStr for FileName {
    type Err = FileNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// A file's identity at its origin, checked before every read: a file whose size or
/// modification time changed is another file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileStamp {
    /// Its size in bytes.
    pub size: u64,
    /// Its modification time, nanoseconds since the Unix epoch.
    pub modified_ns: u64,
}

/// A BLAKE3 digest of a whole file.
pub type Digest = [u8; 32];

/// Why a recipient refused a file (the code part of the origin's failure result).
pub mod refused {
    /// A file of that name is already there.
    pub const EXISTS: &str = "file_exists";
    /// The name breaks a rule of the recipient.
    pub const BAD_NAME: &str = "file_bad_name";
    /// The recipient queue does not exist there.
    pub const NO_QUEUE: &str = "file_no_queue";
    /// The recipient could not write it.
    pub const WRITE_FAILED: &str = "file_write_failed";
    /// The origin cancelled it (its source changed, it expired, or it was cancelled).
    pub const CANCELLED: &str = "file_cancelled";
    /// The recipient is not set up for files.
    pub const NO_FILES: &str = "file_not_served";
}

/// One message of a transfer. The transfer is named by its origin's message id: the
/// message's own id for frames from the origin, [`Frame`]'s `transfer` for the answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Origin to recipient: bytes of the file at `offset`.
    Chunk(Chunk),
    /// Origin to recipient: say how far you are (after the origin restarted); answered by
    /// `Resume`.
    Query {
        /// The origin's attempt; chunks of older attempts are stale from now on.
        attempt: u32,
    },
    /// Origin to recipient: the transfer is off; remove what you have of it.
    Cancel {
        /// Why, for people.
        reason: String,
    },
    /// Recipient to origin: send from `from` on, as attempt `attempt`.
    Resume {
        /// The origin's transfer sequence.
        transfer: u64,
        /// The attempt the chunks from `from` must carry.
        attempt: u32,
        /// The first byte the recipient lacks.
        from: u64,
        /// Why, for people (empty when nothing went wrong).
        note: String,
    },
    /// Recipient to origin: everything before `verified` is written and checked.
    Progress {
        /// The origin's transfer sequence.
        transfer: u64,
        /// Bytes written and checked.
        verified: u64,
    },
    /// Recipient to origin: the file is complete, checked and in place.
    Done {
        /// The origin's transfer sequence.
        transfer: u64,
        /// Its BLAKE3 digest.
        digest: Digest,
    },
    /// Recipient to origin: the file will not be taken; stop.
    Refuse {
        /// The origin's transfer sequence.
        transfer: u64,
        /// One of [`refused`].
        code: String,
        /// Why, for people.
        reason: String,
    },
}

/// Bytes of a file at an offset, with what the recipient needs to start or check it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The attempt it belongs to (raised each time the transfer is resumed on request).
    pub attempt: u32,
    /// The name the file takes at the recipient.
    pub name: FileName,
    /// The whole file's size.
    pub size: u64,
    /// Where these bytes go.
    pub offset: u64,
    /// CRC-32C of `data`, as computed by the origin.
    pub crc: u32,
    /// Bytes after which the recipient confirms what it has (`Progress`): the origin sends
    /// at most a few times this ahead of what was confirmed.
    pub ack_every: u32,
    /// The whole file's BLAKE3 digest, on the last chunk.
    pub digest: Option<Digest>,
    /// The bytes.
    pub data: Bytes,
}

/// The head of a chunk frame, written before its data so that a sender can read the data
/// straight into the frame: [`ChunkHead::write`], then the data, then
/// [`ChunkHead::finish`] with the data's CRC-32C and, on the last chunk, the digest.
#[derive(Debug, Clone, Copy)]
pub struct ChunkHead<'a> {
    /// As [`Chunk::attempt`].
    pub attempt: u32,
    /// As [`Chunk::name`].
    pub name: &'a FileName,
    /// As [`Chunk::size`].
    pub size: u64,
    /// As [`Chunk::offset`].
    pub offset: u64,
    /// As [`Chunk::ack_every`].
    pub ack_every: u32,
}

/// Bytes of a chunk head after the name: size, offset, CRC, ack interval, digest flag and
/// digest (always there, zeros without the flag).
const CHUNK_TAIL_BYTES: usize = 8 + 8 + 4 + 4 + 1 + 32;

impl ChunkHead<'_> {
    /// Appends the head to `out` (CRC and digest left empty); returns where the data starts.
    pub fn write(&self, out: &mut Vec<u8>) -> usize {
        out.push(VERSION);
        out.push(CHUNK);
        out.extend_from_slice(&self.attempt.to_be_bytes());
        let name = self.name.as_str().as_bytes();
        out.extend_from_slice(&(name.len() as u16).to_be_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&self.offset.to_be_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.ack_every.to_be_bytes());
        out.extend_from_slice(&[0; 33]);
        out.len()
    }

    /// Fills in the CRC and the digest of a frame whose head is `frame[..head_len]`.
    pub fn finish(frame: &mut [u8], head_len: usize, crc: u32, digest: Option<&Digest>) {
        let at = head_len - CHUNK_TAIL_BYTES + 16;
        frame[at..at + 4].copy_from_slice(&crc.to_be_bytes());
        if let Some(digest) = digest {
            frame[at + 8] = 1;
            frame[at + 9..at + 41].copy_from_slice(digest);
        }
    }
}

/// Why a frame could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad file frame: {0}")]
pub struct FrameError(pub String);

const VERSION: u8 = 1;
const CHUNK: u8 = 1;
const QUERY: u8 = 2;
const CANCEL: u8 = 3;
const RESUME: u8 = 4;
const PROGRESS: u8 = 5;
const DONE: u8 = 6;
const REFUSE: u8 = 7;
/// Longest text in a frame (reasons, notes), in bytes; longer text is cut.
const TEXT_BYTES_MAX: usize = 1024;

fn put_text(out: &mut BytesMut, text: &str) {
    let mut end = text.len().min(TEXT_BYTES_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    out.put_u16(end as u16);
    out.put_slice(&text.as_bytes()[..end]);
}

struct Reader(Bytes);

impl Reader {
    fn need(&self, n: usize, what: &str) -> Result<(), FrameError> {
        if self.0.remaining() < n {
            return Err(FrameError(format!("truncated at {what}")));
        }
        Ok(())
    }

    fn u8(&mut self, what: &str) -> Result<u8, FrameError> {
        self.need(1, what)?;
        Ok(self.0.get_u8())
    }

    fn u32(&mut self, what: &str) -> Result<u32, FrameError> {
        self.need(4, what)?;
        Ok(self.0.get_u32())
    }

    fn u64(&mut self, what: &str) -> Result<u64, FrameError> {
        self.need(8, what)?;
        Ok(self.0.get_u64())
    }

    fn text(&mut self, what: &str) -> Result<String, FrameError> {
        self.need(2, what)?;
        let len = usize::from(self.0.get_u16());
        self.need(len, what)?;
        let bytes = self.0.split_to(len);
        String::from_utf8(bytes.to_vec()).map_err(|_| FrameError(format!("{what} is not UTF-8")))
    }

    fn digest(&mut self, what: &str) -> Result<Digest, FrameError> {
        self.need(32, what)?;
        let mut digest = [0; 32];
        self.0.copy_to_slice(&mut digest);
        Ok(digest)
    }
}

impl Frame {
    /// The frame as a message payload.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        out.put_u8(VERSION);
        match self {
            Self::Chunk(c) => {
                let mut frame = Vec::with_capacity(64 + c.name.as_str().len() + c.data.len());
                let head = ChunkHead {
                    attempt: c.attempt,
                    name: &c.name,
                    size: c.size,
                    offset: c.offset,
                    ack_every: c.ack_every,
                };
                let head_len = head.write(&mut frame);
                frame.extend_from_slice(&c.data);
                ChunkHead::finish(&mut frame, head_len, c.crc, c.digest.as_ref());
                return Bytes::from(frame);
            }
            Self::Query { attempt } => {
                out.put_u8(QUERY);
                out.put_u32(*attempt);
            }
            Self::Cancel { reason } => {
                out.put_u8(CANCEL);
                put_text(&mut out, reason);
            }
            Self::Resume { transfer, attempt, from, note } => {
                out.put_u8(RESUME);
                out.put_u64(*transfer);
                out.put_u32(*attempt);
                out.put_u64(*from);
                put_text(&mut out, note);
            }
            Self::Progress { transfer, verified } => {
                out.put_u8(PROGRESS);
                out.put_u64(*transfer);
                out.put_u64(*verified);
            }
            Self::Done { transfer, digest } => {
                out.put_u8(DONE);
                out.put_u64(*transfer);
                out.put_slice(digest);
            }
            Self::Refuse { transfer, code, reason } => {
                out.put_u8(REFUSE);
                out.put_u64(*transfer);
                put_text(&mut out, code);
                put_text(&mut out, reason);
            }
        }
        out.freeze()
    }

    /// Reads a frame from a message payload (a chunk's data is shared, not copied).
    ///
    /// # Errors
    /// A payload that is not a frame of this version, named.
    pub fn decode(payload: Bytes) -> Result<Self, FrameError> {
        let mut r = Reader(payload);
        let version = r.u8("version")?;
        if version != VERSION {
            return Err(FrameError(format!("version {version}; this node reads version {VERSION}")));
        }
        let frame = match r.u8("type")? {
            CHUNK => {
                let attempt = r.u32("attempt")?;
                let name = r.text("name")?;
                let name = FileName::new(&name).map_err(|e| FrameError(e.to_string()))?;
                let size = r.u64("size")?;
                let offset = r.u64("offset")?;
                let crc = r.u32("crc")?;
                let ack_every = r.u32("ack_every")?;
                let flag = r.u8("digest flag")?;
                let digest = r.digest("digest")?;
                let digest = match flag {
                    0 => None,
                    1 => Some(digest),
                    other => return Err(FrameError(format!("digest flag {other}"))),
                };
                let data = std::mem::take(&mut r.0);
                if offset.checked_add(data.len() as u64).is_none_or(|end| end > size) {
                    return Err(FrameError(format!(
                        "a chunk of {} bytes at {offset} runs past the file's size {size}",
                        data.len()
                    )));
                }
                return Ok(Self::Chunk(Chunk { attempt, name, size, offset, crc, ack_every, digest, data }));
            }
            QUERY => Self::Query { attempt: r.u32("attempt")? },
            CANCEL => Self::Cancel { reason: r.text("reason")? },
            RESUME => Self::Resume {
                transfer: r.u64("transfer")?,
                attempt: r.u32("attempt")?,
                from: r.u64("from")?,
                note: r.text("note")?,
            },
            PROGRESS => Self::Progress { transfer: r.u64("transfer")?, verified: r.u64("verified")? },
            DONE => Self::Done { transfer: r.u64("transfer")?, digest: r.digest("digest")? },
            REFUSE => Self::Refuse {
                transfer: r.u64("transfer")?,
                code: r.text("code")?,
                reason: r.text("reason")?,
            },
            other => return Err(FrameError(format!("unknown frame type {other}"))),
        };
        if r.0.has_remaining() {
            return Err(FrameError(format!("{} bytes after the frame", r.0.remaining())));
        }
        Ok(frame)
    }
}

#[cfg(test)]
mod tests;
