//! What a node records of its transfers in its store, so that they resume after a restart:
//! at the origin each transfer's file, stamp and recipients (space `files.out`, key: the
//! transfer's sequence number), at a recipient how far each transfer is and a CRC-32C of
//! every chunk written (space `files.in`), and the transfers that ended there (space
//! `files.done`). Bytes of files are never stored: the files are.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use linkbus_plugin_api::file::{Digest, FileName, FileStamp};
use linkbus_plugin_api::{Address, Batch, NodeName, QueueName};

/// Space of the origin's records.
pub(crate) const OUT_SPACE: &str = "files.out";
/// Space of a recipient's records.
pub(crate) const IN_SPACE: &str = "files.in";
/// Space of the transfers that ended at a recipient.
pub(crate) const DONE_SPACE: &str = "files.done";

const VERSION: u8 = 1;

/// Where a recipient of a transfer stands, as its origin knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamState {
    /// Still going.
    Open,
    /// The recipient has the file.
    Delivered,
    /// It ended without the file there.
    Failed,
}

/// The origin's record of one transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutRecord {
    /// The transfer's sequence number (its id's).
    pub(crate) sequence: u64,
    /// When it was accepted, ms since the Unix epoch.
    pub(crate) created_unix_ms: u64,
    /// The file sent, under this node's files directory.
    pub(crate) source: FileName,
    /// The name it takes at its recipients.
    pub(crate) name: FileName,
    /// The source's stamp when the transfer began.
    pub(crate) stamp: FileStamp,
    /// Priority code of its chunks.
    pub(crate) priority: u8,
    /// When its lifetime ends, ms since the Unix epoch by this node's clock (0: never).
    pub(crate) deadline_unix_ms: u64,
    /// Remove the source once every recipient has it.
    pub(crate) delete_after: bool,
    /// Each recipient, its attempt and state.
    pub(crate) recipients: Vec<(Address, u32, StreamState)>,
}

fn put_text(out: &mut BytesMut, text: &str) {
    out.put_u16(text.len() as u16);
    out.put_slice(text.as_bytes());
}

struct Reader(Bytes);

type Read<T> = Result<T, String>;

impl Reader {
    fn need(&self, n: usize) -> Read<()> {
        if self.0.remaining() < n { Err("truncated".into()) } else { Ok(()) }
    }
    fn u8(&mut self) -> Read<u8> {
        self.need(1)?;
        Ok(self.0.get_u8())
    }
    fn u32(&mut self) -> Read<u32> {
        self.need(4)?;
        Ok(self.0.get_u32())
    }
    fn u64(&mut self) -> Read<u64> {
        self.need(8)?;
        Ok(self.0.get_u64())
    }
    fn text(&mut self) -> Read<String> {
        self.need(2)?;
        let len = usize::from(self.0.get_u16());
        self.need(len)?;
        String::from_utf8(self.0.split_to(len).to_vec()).map_err(|_| "not UTF-8".to_owned())
    }
    fn name(&mut self) -> Read<FileName> {
        FileName::new(&self.text()?).map_err(|e| e.to_string())
    }
    fn address(&mut self) -> Read<Address> {
        let node = NodeName::new(&self.text()?).map_err(|e| e.to_string())?;
        let queue = QueueName::new(&self.text()?).map_err(|e| e.to_string())?;
        Ok(Address::new(node, queue))
    }
    fn version(&mut self) -> Read<()> {
        match self.u8()? {
            VERSION => Ok(()),
            other => Err(format!("record version {other}; this node reads {VERSION}")),
        }
    }
}

fn put_address(out: &mut BytesMut, address: &Address) {
    put_text(out, address.node.as_str());
    put_text(out, address.queue.as_str());
}

impl OutRecord {
    pub(crate) fn key(sequence: u64) -> [u8; 8] {
        sequence.to_be_bytes()
    }

    /// The write recording it as it is now.
    pub(crate) fn write(&self, batch: &mut Batch) {
        let mut out = BytesMut::new();
        out.put_u8(VERSION);
        out.put_u64(self.created_unix_ms);
        put_text(&mut out, self.source.as_str());
        put_text(&mut out, self.name.as_str());
        out.put_u64(self.stamp.size);
        out.put_u64(self.stamp.modified_ns);
        out.put_u8(self.priority);
        out.put_u64(self.deadline_unix_ms);
        out.put_u8(u8::from(self.delete_after));
        out.put_u8(self.recipients.len() as u8);
        for (to, attempt, state) in &self.recipients {
            put_address(&mut out, to);
            out.put_u32(*attempt);
            out.put_u8(match state {
                StreamState::Open => 0,
                StreamState::Delivered => 1,
                StreamState::Failed => 2,
            });
        }
        batch.put(OUT_SPACE, Self::key(self.sequence).to_vec(), out.to_vec());
    }

    /// Reads a record stored under `key`.
    pub(crate) fn read(key: &[u8], value: Bytes) -> Read<Self> {
        let sequence = u64::from_be_bytes(key.try_into().map_err(|_| "bad key".to_owned())?);
        let mut r = Reader(value);
        r.version()?;
        let created_unix_ms = r.u64()?;
        let source = r.name()?;
        let name = r.name()?;
        let stamp = FileStamp { size: r.u64()?, modified_ns: r.u64()? };
        let priority = r.u8()?;
        let deadline_unix_ms = r.u64()?;
        let delete_after = r.u8()? != 0;
        let count = r.u8()?;
        let mut recipients = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let to = r.address()?;
            let attempt = r.u32()?;
            let state = match r.u8()? {
                0 => StreamState::Open,
                1 => StreamState::Delivered,
                _ => StreamState::Failed,
            };
            recipients.push((to, attempt, state));
        }
        Ok(Self {
            sequence,
            created_unix_ms,
            source,
            name,
            stamp,
            priority,
            deadline_unix_ms,
            delete_after,
            recipients,
        })
    }
}

/// Names one transfer at a recipient: its origin, its sequence there, the recipient queue.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct InKey {
    pub(crate) origin: NodeName,
    pub(crate) sequence: u64,
    pub(crate) queue: QueueName,
}

impl InKey {
    /// The store key (also the prefix of its chunks' CRC records).
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut key = Vec::with_capacity(64);
        key.extend_from_slice(self.origin.as_str().as_bytes());
        key.push(0);
        key.extend_from_slice(&self.sequence.to_be_bytes());
        key.extend_from_slice(self.queue.as_str().as_bytes());
        key.push(0);
        key
    }

    fn from_bytes(key: &[u8]) -> Read<(Self, Option<u64>)> {
        let bad = || format!("bad key {key:02x?}");
        let zero = key.iter().position(|&b| b == 0).ok_or_else(bad)?;
        let origin = std::str::from_utf8(&key[..zero]).map_err(|_| bad())?;
        let origin = NodeName::new(origin).map_err(|_| bad())?;
        let rest = &key[zero + 1..];
        let sequence = u64::from_be_bytes(rest.get(..8).ok_or_else(bad)?.try_into().map_err(|_| bad())?);
        let rest = &rest[8..];
        let end = rest.iter().position(|&b| b == 0).ok_or_else(bad)?;
        let queue = std::str::from_utf8(&rest[..end]).map_err(|_| bad())?;
        let queue = QueueName::new(queue).map_err(|_| bad())?;
        let chunk = match &rest[end + 1..] {
            [] => None,
            offset => Some(u64::from_be_bytes(offset.try_into().map_err(|_| bad())?)),
        };
        Ok((Self { origin, sequence, queue }, chunk))
    }

    /// The id of its partial file.
    pub(crate) fn partial_id(&self) -> String {
        format!("{}-{}-{}", self.origin, self.sequence, self.queue)
    }

    fn chunk_key(&self, offset: u64) -> Vec<u8> {
        let mut key = self.bytes();
        key.extend_from_slice(&offset.to_be_bytes());
        key
    }
}

/// A recipient's record of one transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InRecord {
    /// The origin's id of it: creation time (the rest is in the key).
    pub(crate) created_unix_ms: u64,
    /// The name it takes here.
    pub(crate) name: FileName,
    /// The whole file's size.
    pub(crate) size: u64,
    /// The attempt its chunks carry.
    pub(crate) attempt: u32,
    /// Bytes written and checked.
    pub(crate) expected: u64,
    /// When its lifetime ends, ms since the Unix epoch by this node's clock (0: never).
    pub(crate) deadline_unix_ms: u64,
}

impl InRecord {
    /// The write recording it.
    pub(crate) fn write(&self, key: &InKey, batch: &mut Batch) {
        let mut out = BytesMut::new();
        out.put_u8(VERSION);
        out.put_u64(self.created_unix_ms);
        put_text(&mut out, self.name.as_str());
        out.put_u64(self.size);
        out.put_u32(self.attempt);
        out.put_u64(self.expected);
        out.put_u64(self.deadline_unix_ms);
        batch.put(IN_SPACE, key.bytes(), out.to_vec());
    }

    fn read(value: Bytes) -> Read<Self> {
        let mut r = Reader(value);
        r.version()?;
        Ok(Self {
            created_unix_ms: r.u64()?,
            name: r.name()?,
            size: r.u64()?,
            attempt: r.u32()?,
            expected: r.u64()?,
            deadline_unix_ms: r.u64()?,
        })
    }
}

/// The write recording a chunk of `len` bytes at `offset` with CRC-32C `crc`.
pub(crate) fn write_chunk(key: &InKey, offset: u64, len: u32, crc: u32, batch: &mut Batch) {
    let mut value = Vec::with_capacity(8);
    value.extend_from_slice(&crc.to_be_bytes());
    value.extend_from_slice(&len.to_be_bytes());
    batch.put(IN_SPACE, key.chunk_key(offset), value);
}

/// The writes forgetting a transfer's record and its chunks' (`chunks`: their offsets).
pub(crate) fn forget(key: &InKey, chunks: impl IntoIterator<Item = u64>, batch: &mut Batch) {
    batch.delete(IN_SPACE, key.bytes());
    forget_chunks(key, chunks, batch);
}

/// The writes forgetting some of a transfer's chunks (their offsets), its record kept.
pub(crate) fn forget_chunks(key: &InKey, chunks: impl IntoIterator<Item = u64>, batch: &mut Batch) {
    for offset in chunks {
        batch.delete(IN_SPACE, key.chunk_key(offset));
    }
}

/// A transfer read back at a recipient: its record and its chunks (offset, length, CRC), in
/// offset order.
pub(crate) struct Recovered {
    pub(crate) key: InKey,
    pub(crate) record: InRecord,
    pub(crate) chunks: Vec<(u64, u32, u32)>,
}

/// Reads every transfer recorded at a recipient.
///
/// # Errors
/// A record that cannot be read, named.
pub(crate) fn load_incoming(store: &dyn linkbus_plugin_api::Store) -> Read<Vec<Recovered>> {
    let mut all: Vec<Recovered> = Vec::new();
    let mut chunks: Vec<(InKey, u64, u32, u32)> = Vec::new();
    for entry in linkbus_plugin_api::store::scan_pages(store, IN_SPACE) {
        let (key, value) = entry.map_err(|e| format!("{IN_SPACE}: {e}"))?;
        let (in_key, chunk) = InKey::from_bytes(&key).map_err(|e| format!("{IN_SPACE}: {e}"))?;
        match chunk {
            None => {
                let record = InRecord::read(value).map_err(|e| format!("{IN_SPACE}: {e}"))?;
                all.push(Recovered { key: in_key, record, chunks: Vec::new() });
            }
            Some(offset) => {
                let mut v = value;
                if v.len() != 8 {
                    return Err(format!("{IN_SPACE}: damaged chunk record"));
                }
                let (crc, len) = (v.get_u32(), v.get_u32());
                chunks.push((in_key, offset, len, crc));
            }
        }
    }
    for (key, offset, len, crc) in chunks {
        if let Some(t) = all.iter_mut().find(|t| t.key == key) {
            t.chunks.push((offset, len, crc));
        }
    }
    for t in &mut all {
        t.chunks.sort_unstable();
    }
    Ok(all)
}

/// How a transfer ended at a recipient, kept for answering its origin again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The file is in place, with this digest.
    Delivered(Digest),
    /// Refused or cancelled: code and reason.
    Refused(String, String),
}

impl Ended {
    pub(crate) fn write(&self, key: &InKey, batch: &mut Batch) {
        let mut out = BytesMut::new();
        out.put_u8(VERSION);
        out.put_u64(crate::clock::unix_ms());
        match self {
            Self::Delivered(digest) => {
                out.put_u8(1);
                out.put_slice(digest);
            }
            Self::Refused(code, reason) => {
                out.put_u8(2);
                put_text(&mut out, code);
                put_text(&mut out, &reason.chars().take(1000).collect::<String>());
            }
        }
        batch.put(DONE_SPACE, key.bytes(), out.to_vec());
    }

    /// Reads every ended transfer, with when it ended (ms since the Unix epoch).
    pub(crate) fn load(store: &dyn linkbus_plugin_api::Store) -> Read<Vec<(InKey, u64, Self)>> {
        let mut all = Vec::new();
        for entry in linkbus_plugin_api::store::scan_pages(store, DONE_SPACE) {
            let (key, value) = entry.map_err(|e| format!("{DONE_SPACE}: {e}"))?;
            let (in_key, _) = InKey::from_bytes(&key).map_err(|e| format!("{DONE_SPACE}: {e}"))?;
            let mut r = Reader(value);
            r.version()?;
            let at = r.u64()?;
            let ended = match r.u8()? {
                1 => {
                    r.need(32)?;
                    let mut digest = [0; 32];
                    r.0.copy_to_slice(&mut digest);
                    Self::Delivered(digest)
                }
                _ => Self::Refused(r.text()?, r.text()?),
            };
            all.push((in_key, at, ended));
        }
        Ok(all)
    }
}

/// Reads every transfer recorded at the origin.
///
/// # Errors
/// A record that cannot be read, named.
pub(crate) fn load_outgoing(store: &dyn linkbus_plugin_api::Store) -> Read<Vec<OutRecord>> {
    let mut all = Vec::new();
    for entry in linkbus_plugin_api::store::scan_pages(store, OUT_SPACE) {
        let (key, value) = entry.map_err(|e| format!("{OUT_SPACE}: {e}"))?;
        all.push(OutRecord::read(&key, value).map_err(|e| format!("{OUT_SPACE}: {e}"))?);
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_as_written() {
        let to = Address::new(NodeName::new("C").expect("node"), QueueName::new("in-box").expect("queue"));
        let out = OutRecord {
            sequence: 77,
            created_unix_ms: 5,
            source: FileName::new("a/b c.pdf").expect("name"),
            name: FileName::new("x.pdf").expect("name"),
            stamp: FileStamp { size: 1 << 30, modified_ns: 9 },
            priority: 4,
            deadline_unix_ms: 0,
            delete_after: true,
            recipients: vec![(to.clone(), 3, StreamState::Delivered), (to, 0, StreamState::Open)],
        };
        let mut batch = Batch::new();
        out.write(&mut batch);
        let linkbus_plugin_api::WriteOp::Put { key, value, .. } = &batch.ops[0] else { panic!("a put") };
        assert_eq!(OutRecord::read(key, value.clone()).expect("reads"), out);
        let key = InKey {
            origin: NodeName::new("A").expect("node"),
            sequence: 9,
            queue: QueueName::new("q").expect("q"),
        };
        assert_eq!(InKey::from_bytes(&key.bytes()).expect("key"), (key.clone(), None));
        assert_eq!(InKey::from_bytes(&key.chunk_key(4096)).expect("key"), (key, Some(4096)));
    }
}
