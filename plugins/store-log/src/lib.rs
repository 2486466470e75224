//! The `log` store plugin: ordered key/value spaces kept as an append-only log on disk,
//! with every key's place in it held in memory.
//!
//! A batch is written once, as one frame (the length of its changes, their CRC32C, the
//! changes) appended to the active segment, a file `NNNNNNNNNNNNNNNN.log` (its number in
//! hex) in the store's directory. A write with `sync` returns after `fdatasync` of that
//! file; other writes reach the operating system's buffers at once and stable storage with
//! the next synced write or [`Store::sync`]. The index (per space, each key and where its
//! value lies) is in memory; values are read from the files, which a node does when it
//! starts. Nothing is written a second time except by compaction (below), unlike an LSM
//! tree, which writes every value again when it flushes its memory table.
//!
//! A segment is made at its full size, `segment_mib` MiB (a sparse file: a synced write
//! then changes no file size; zeros mark where the writes end), and closed (synced) once
//! the next write does not fit; the next one is started (its directory entry synced). Segments go oldest first: the oldest is deleted once none
//! of its puts is current (a delete's record only shadows puts in its own or older
//! segments, so none is needed once those are gone), after the writes that left nothing
//! current in it are synced; and while the log is larger than twice the current data plus
//! two segments, the oldest segment's current puts are written again at the end, synced,
//! and the segment deleted (one segment per write at most). Each deletion is synced
//! before the next, so a crash never brings back an older segment without the newer ones.
//!
//! Each frame's head records how far its segment was synced when it was written. At open
//! the segments are read in order. A frame in the last segment that is cut short or fails
//! its check, with no whole frame after it saying the segment was synced past it, was
//! never synced — a write the process did not finish, or after a power loss one whose
//! pages did not all reach the disk while later unsynced ones did — and the segment is cut
//! back to before it. Anything else that fails is damage, as is a missing segment, and the
//! store refuses to open, naming the file and the offset.
//!
//! A failed write or sync poisons the store: every later write fails with
//! [`StoreError::Poisoned`] (the node stops rather than acknowledge what it may have
//! lost); reads go on. A lock on the file `LOCK` in the directory keeps a second process
//! out.
//!
//! Configuration: `plugins: { store: { kind: log, path: DIR, segment_mib: 64 } }`; `path`
//! defaults to `log` inside the node's `data_dir`, `segment_mib` is 1..=1024.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::ops::Bound;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use linkbus_plugin_api::registry::{BuildContext, Factory, PluginEntry, PluginError};
use linkbus_plugin_api::{Batch, ConfigValue, Section, Store, StoreError, WriteOp};

/// Segment size unless configured.
pub const SEGMENT_MIB_DEFAULT: u64 = 64;
/// A frame's head, little-endian: the length of its body, how far its segment was synced
/// when it was written (`synced_to`), the body's CRC32C, and the CRC32C of those three.
const FRAME_HEAD: usize = 4 + 8 + 4 + 4;
const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
/// An op's head: its kind, and the lengths of its space, key and (puts) value.
const OP_HEAD: usize = 1 + 2 + 4 + 4;

/// A store in a directory of log segments; see the crate doc.
pub struct LogStore {
    path: PathBuf,
    inner: Mutex<Inner>,
    /// Held (locked) while the store is open.
    _lock: File,
}

impl std::fmt::Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").field("path", &self.path).finish_non_exhaustive()
    }
}

/// Where a current value lies: its segment, offset and length there, and how many bytes its
/// put takes in the log (what its segment counts as current).
#[derive(Debug, Clone, Copy)]
struct Loc {
    segment: u64,
    at: u64,
    len: u32,
    size: u32,
}

#[derive(Debug)]
struct Segment {
    file: File,
    /// Its length.
    bytes: u64,
    /// How much of it is known synced.
    synced: u64,
    /// Bytes of its puts that are current.
    live: u64,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    spaces: HashMap<String, BTreeMap<Bytes, Loc>>,
    segments: BTreeMap<u64, Segment>,
    /// The segment written to (the last one).
    active: u64,
    segment_bytes: u64,
    /// Why the store is poisoned, once a write or sync failed.
    poisoned: Option<String>,
}

fn backend(op: &'static str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend { op, reason: e.to_string() }
}

fn segment_name(number: u64) -> String {
    format!("{number:016x}.log")
}

/// The number of a segment file's name, if it is one.
fn segment_number(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".log").filter(|h| h.len() == 16)?;
    u64::from_str_radix(hex, 16).ok()
}

impl LogStore {
    /// Opens (creating it if needed) the store in directory `path`, with segments of
    /// `segment_bytes`.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the directory cannot be made, read or locked (another
    /// process has it open), or a segment is damaged (named, with the offset).
    pub fn open(path: &Path, segment_bytes: u64) -> Result<Self, StoreError> {
        let at = |e: std::io::Error| backend("open", format!("{}: {e}", path.display()));
        std::fs::create_dir_all(path).map_err(at)?;
        // Its entry in its parent, should it be new.
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            File::open(parent).and_then(|dir| dir.sync_all()).map_err(at)?;
        }
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.join("LOCK"))
            .map_err(at)?;
        lock.try_lock().map_err(|e| {
            backend("open", format!("{}: {e} (is another node using this data directory?)", path.display()))
        })?;
        let mut numbers = Vec::new();
        for entry in std::fs::read_dir(path).map_err(at)? {
            if let Some(n) = entry.map_err(at)?.file_name().to_str().and_then(segment_number) {
                numbers.push(n);
            }
        }
        numbers.sort_unstable();
        // Segments go oldest first, so those left are consecutive: a gap is a lost file.
        if let Some(pair) = numbers.windows(2).find(|pair| pair[1] != pair[0] + 1) {
            return Err(backend(
                "open",
                format!(
                    "{}: segment {} is missing between {} and {} (the store is damaged)",
                    path.display(),
                    segment_name(pair[0] + 1),
                    segment_name(pair[0]),
                    segment_name(pair[1])
                ),
            ));
        }
        let mut inner = Inner {
            dir: path.to_owned(),
            spaces: HashMap::new(),
            segments: BTreeMap::new(),
            active: 0,
            segment_bytes: segment_bytes.max(FRAME_HEAD as u64),
            poisoned: None,
        };
        for (i, &number) in numbers.iter().enumerate() {
            inner.recover(number, i + 1 == numbers.len())?;
        }
        match numbers.last() {
            Some(&last) => inner.active = last,
            None => inner.start_segment(1).map_err(|e| backend("open", e))?,
        }
        Ok(Self { path: path.to_owned(), inner: Mutex::new(inner), _lock: lock })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A put's value in a frame: its offset from the frame's start, its length, and the bytes
/// its op takes.
type Place = (u64, u32, u32);

/// `batch` as a frame, with the place of each put's value (`None` for deletes).
fn encode(batch: &Batch) -> Result<(Vec<u8>, Vec<Option<Place>>), StoreError> {
    let too_long = |what: &str| backend("write", format!("{what} is too long for a log frame"));
    let body_len: usize = batch
        .ops
        .iter()
        .map(|op| match op {
            WriteOp::Put { space, key, value } => OP_HEAD + space.len() + key.len() + value.len(),
            WriteOp::Delete { space, key } => OP_HEAD + space.len() + key.len(),
        })
        .sum();
    let body_len_u32 = u32::try_from(body_len).map_err(|_| too_long("a batch"))?;
    let mut frame = Vec::with_capacity(FRAME_HEAD + body_len);
    frame.extend_from_slice(&body_len_u32.to_le_bytes());
    // `synced_to` and the head's check are sealed in where the frame is placed.
    frame.extend_from_slice(&[0; 16]);
    let mut places = Vec::with_capacity(batch.ops.len());
    for op in &batch.ops {
        let (kind, space, key, value) = match op {
            WriteOp::Put { space, key, value } => (OP_PUT, space, key, &value[..]),
            WriteOp::Delete { space, key } => (OP_DELETE, space, key, &[][..]),
        };
        let start = frame.len();
        frame.push(kind);
        frame.extend_from_slice(
            &u16::try_from(space.len()).map_err(|_| too_long("a space name"))?.to_le_bytes(),
        );
        frame.extend_from_slice(&u32::try_from(key.len()).map_err(|_| too_long("a key"))?.to_le_bytes());
        let value_len = u32::try_from(value.len()).map_err(|_| too_long("a value"))?;
        frame.extend_from_slice(&value_len.to_le_bytes());
        frame.extend_from_slice(space.as_bytes());
        frame.extend_from_slice(key);
        let value_at = frame.len() as u64;
        frame.extend_from_slice(value);
        let size = (frame.len() - start) as u32;
        places.push((kind == OP_PUT).then_some((value_at, value_len, size)));
    }
    let crc = crc_fast::crc32_iscsi(&frame[FRAME_HEAD..]);
    frame[12..16].copy_from_slice(&crc.to_le_bytes());
    Ok((frame, places))
}

/// Writes `synced_to` into `frame`'s head, and the head's check.
fn seal(frame: &mut [u8], synced_to: u64) {
    frame[4..12].copy_from_slice(&synced_to.to_le_bytes());
    let check = crc_fast::crc32_iscsi(&frame[..16]);
    frame[16..FRAME_HEAD].copy_from_slice(&check.to_le_bytes());
}

/// A frame read back: its changes, its length, and its `synced_to`.
type Decoded<'a> = (Vec<ReadOp<'a>>, usize, u64);

/// One change read back from a frame.
struct ReadOp<'a> {
    kind: u8,
    space: &'a str,
    key: &'a [u8],
    place: Place,
}

/// The changes of the frame at the start of `data` (at `offset` in its segment) and the
/// frame's length; why not, when it is cut short or fails its checks.
fn decode(data: &[u8], offset: u64) -> Result<Decoded<'_>, &'static str> {
    let head = data.get(..FRAME_HEAD).ok_or("a frame head cut short")?;
    let word = |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    // Checked first, so a search for frames in damaged bytes rejects most places at once.
    if crc_fast::crc32_iscsi(&head[..16]) != word(16) {
        return Err("a frame head failing its checksum");
    }
    let body_len = word(0) as usize;
    let synced_to = u64::from(word(4)) | (u64::from(word(8)) << 32);
    let crc = word(12);
    if body_len == 0 {
        // No batch is empty.
        return Err("an empty frame");
    }
    let body = data.get(FRAME_HEAD..FRAME_HEAD + body_len).ok_or("a frame cut short")?;
    if crc_fast::crc32_iscsi(body) != crc {
        return Err("a frame failing its checksum");
    }
    let mut ops = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let head = body.get(at..at + OP_HEAD).ok_or("a change cut short")?;
        let kind = head[0];
        let space_len = u16::from_le_bytes([head[1], head[2]]) as usize;
        let key_len = u32::from_le_bytes([head[3], head[4], head[5], head[6]]) as usize;
        let value_len = u32::from_le_bytes([head[7], head[8], head[9], head[10]]);
        let space_at = at + OP_HEAD;
        let value_at = space_at + space_len + key_len;
        let end = value_at + value_len as usize;
        if end > body.len() || !(kind == OP_PUT || (kind == OP_DELETE && value_len == 0)) {
            return Err("a malformed change");
        }
        let space = std::str::from_utf8(&body[space_at..space_at + space_len])
            .map_err(|_| "a space name that is not UTF-8")?;
        let key = &body[space_at + space_len..value_at];
        let place = (offset + (FRAME_HEAD + value_at) as u64, value_len, (end - at) as u32);
        ops.push(ReadOp { kind, space, key, place });
        at = end;
    }
    Ok((ops, FRAME_HEAD + body_len, synced_to))
}

/// Whether `data` is all zeros (compared a page at a time, which is quick in any build).
fn all_zeros(data: &[u8]) -> bool {
    const ZEROS: [u8; 4096] = [0; 4096];
    data.chunks(ZEROS.len()).all(|chunk| chunk == &ZEROS[..chunk.len()])
}

/// How far the segment `data` was known synced, by the whole frames found anywhere after
/// `offset` (`None`: no whole frame there). A frame that fails at `offset` when no later
/// frame says the segment was synced past it was never synced: a write the process did
/// not finish, or, after a power loss, one whose pages did not all reach the disk while
/// later unsynced ones did. Past that point it is damage.
fn synced_after(data: &[u8], offset: usize) -> Option<u64> {
    let mut synced: Option<u64> = None;
    let mut at = offset + 1;
    while at + FRAME_HEAD <= data.len() {
        // A frame's length is never 0: runs of zeros (the unwritten rest) are skipped.
        match data[at..].iter().position(|b| *b != 0) {
            None => break,
            Some(zeros) if zeros > 3 => at += zeros - 3,
            Some(_) => match decode(&data[at..], at as u64) {
                Ok((_, len, synced_to)) => {
                    synced = Some(synced.map_or(synced_to, |s| s.max(synced_to)));
                    at += len;
                }
                Err(_) => at += 1,
            },
        }
    }
    synced
}

impl Inner {
    fn check_poisoned(&self) -> Result<(), StoreError> {
        match &self.poisoned {
            Some(reason) => Err(StoreError::Poisoned(reason.clone())),
            None => Ok(()),
        }
    }

    /// Records a failed write or sync: from now on the store refuses writes.
    fn failed(&mut self, op: &'static str, e: impl std::fmt::Display) -> StoreError {
        let error = backend(op, e);
        self.poisoned.get_or_insert_with(|| error.to_string());
        error
    }

    fn sync_dir(&self) -> std::io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }

    /// Creates segment `number` (its directory entry synced) and makes it the active one.
    fn start_segment(&mut self, number: u64) -> std::io::Result<()> {
        let file = OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(self.dir.join(segment_name(number)))?;
        // Its full length at once (a sparse file; zeros mark where the writes end): a synced
        // write then does not change the file's size as well.
        file.set_len(self.segment_bytes)?;
        self.sync_dir()?;
        self.segments.insert(number, Segment { file, bytes: 0, synced: 0, live: 0 });
        self.active = number;
        Ok(())
    }

    /// Reads segment `number` into the index; cuts a torn last frame off the `last` segment.
    fn recover(&mut self, number: u64, last: bool) -> Result<(), StoreError> {
        let path = self.dir.join(segment_name(number));
        let at = |e: std::io::Error| backend("open", format!("{}: {e}", path.display()));
        let file = OpenOptions::new().read(true).write(true).open(&path).map_err(at)?;
        let data = std::fs::read(&path).map_err(at)?;
        self.segments.insert(number, Segment { file, bytes: 0, synced: 0, live: 0 });
        let mut offset = 0;
        while offset < data.len() {
            // The unwritten rest of a segment made at its full length.
            if all_zeros(&data[offset..]) {
                break;
            }
            match decode(&data[offset..], offset as u64) {
                Ok((ops, len, _)) => {
                    for op in ops {
                        let key = Bytes::copy_from_slice(op.key);
                        if op.kind == OP_PUT {
                            self.index_put(op.space, key, number, op.place);
                        } else {
                            self.index_delete(op.space, &key);
                        }
                    }
                    offset += len;
                }
                // A write that never completed, the last thing in the log: cut off.
                Err(_) if last && synced_after(&data, offset).is_none_or(|s| s <= offset as u64) => {
                    // Zeros from here on, as in a segment never written this far.
                    let segment = self.segments.get_mut(&number).expect("inserted above");
                    segment.file.set_len(offset as u64).map_err(at)?;
                    segment.file.set_len(self.segment_bytes.max(offset as u64)).map_err(at)?;
                    segment.file.sync_all().map_err(at)?;
                    break;
                }
                Err(why) => {
                    return Err(backend(
                        "open",
                        format!("{}: {why} at offset {offset} (the store is damaged)", path.display()),
                    ));
                }
            }
        }
        let segment = self.segments.get_mut(&number).expect("inserted above");
        (segment.bytes, segment.synced) = (offset as u64, offset as u64);
        Ok(())
    }

    fn forget(&mut self, old: Option<Loc>) {
        if let Some(old) = old
            && let Some(segment) = self.segments.get_mut(&old.segment)
        {
            segment.live -= u64::from(old.size);
        }
    }

    fn index_put(&mut self, space: &str, key: Bytes, segment: u64, (at, len, size): Place) {
        let loc = Loc { segment, at, len, size };
        let old = match self.spaces.get_mut(space) {
            Some(keys) => keys.insert(key, loc),
            None => {
                self.spaces.insert(space.to_owned(), BTreeMap::from([(key, loc)]));
                None
            }
        };
        self.forget(old);
        if let Some(s) = self.segments.get_mut(&segment) {
            s.live += u64::from(size);
        }
    }

    fn index_delete(&mut self, space: &str, key: &[u8]) {
        let Some(keys) = self.spaces.get_mut(space) else { return };
        let old = keys.remove(key);
        if keys.is_empty() {
            self.spaces.remove(space);
        }
        self.forget(old);
    }

    /// Appends `frame` to the active segment (starting the next one first when it would pass
    /// the segment size); its offset there.
    fn append(&mut self, frame: &mut [u8]) -> Result<u64, StoreError> {
        let full = self
            .segments
            .get(&self.active)
            .is_some_and(|s| s.bytes > 0 && s.bytes + frame.len() as u64 > self.segment_bytes);
        if full {
            self.sync()?;
            if let Err(e) = self.start_segment(self.active + 1) {
                return Err(self.failed("write", e));
            }
        }
        let segment = self.segments.get_mut(&self.active).expect("the active segment is open");
        let offset = segment.bytes;
        seal(frame, segment.synced);
        if let Err(e) = segment.file.write_all_at(frame, offset) {
            return Err(self.failed("write", e));
        }
        segment.bytes += frame.len() as u64;
        Ok(offset)
    }

    /// Writes `batch` (already checked) and indexes it.
    fn write(&mut self, batch: Batch) -> Result<(), StoreError> {
        let (mut frame, places) = encode(&batch)?;
        let offset = self.append(&mut frame)?;
        let segment = self.active;
        for (op, place) in batch.ops.into_iter().zip(places) {
            match (op, place) {
                (WriteOp::Put { space, key, .. }, Some((at, len, size))) => {
                    self.index_put(&space, key, segment, (offset + at, len, size));
                }
                (WriteOp::Delete { space, key }, _) => self.index_delete(&space, &key),
                (WriteOp::Put { .. }, None) => unreachable!("every put has a place"),
            }
        }
        Ok(())
    }

    /// Syncs the active segment, if it holds anything not yet synced.
    fn sync(&mut self) -> Result<(), StoreError> {
        let Some(segment) = self.segments.get_mut(&self.active) else { return Ok(()) };
        if segment.synced == segment.bytes {
            return Ok(());
        }
        match segment.file.sync_data() {
            Ok(()) => {
                segment.synced = segment.bytes;
                Ok(())
            }
            Err(e) => Err(self.failed("sync", e)),
        }
    }

    /// Deletes the oldest segments while none of their puts is current, and compacts the
    /// oldest while the log is larger than twice the current data plus two segments.
    fn collect(&mut self) -> Result<(), StoreError> {
        let mut compacted = false;
        for _ in 0..=self.segments.len() {
            let Some((&oldest, segment)) = self.segments.first_key_value() else { break };
            if oldest == self.active {
                break;
            }
            if segment.live == 0 {
                // The writes that left nothing current in it must not be lost with it.
                self.sync()?;
                let removed =
                    std::fs::remove_file(self.dir.join(segment_name(oldest))).and_then(|()| self.sync_dir());
                if let Err(e) = removed {
                    return Err(self.failed("write", e));
                }
                self.segments.remove(&oldest);
                continue;
            }
            // One segment compacted per write at most, so no write waits long for it.
            if compacted {
                break;
            }
            let (disk, live) = self.segments.values().fold((0, 0), |(d, l), s| (d + s.bytes, l + s.live));
            if disk <= 2 * live + 2 * self.segment_bytes {
                break;
            }
            self.compact(oldest)?;
            compacted = true;
        }
        Ok(())
    }

    /// Writes the current puts of segment `number` again at the end of the log, synced.
    fn compact(&mut self, number: u64) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        for (space, keys) in &self.spaces {
            for (key, loc) in keys.iter().filter(|(_, loc)| loc.segment == number) {
                match self.read(*loc) {
                    Ok(value) => {
                        batch.ops.push(WriteOp::Put { space: space.clone(), key: key.clone(), value })
                    }
                    // The store cannot read back what it holds: it takes no more writes.
                    Err(e) => return Err(self.failed("compact", e)),
                }
            }
        }
        self.write(batch)?;
        self.sync()
    }

    fn read(&self, loc: Loc) -> std::io::Result<Bytes> {
        let segment = self.segments.get(&loc.segment).ok_or_else(|| std::io::Error::other("segment gone"))?;
        let mut value = vec![0; loc.len as usize];
        segment.file.read_exact_at(&mut value, loc.at)?;
        Ok(Bytes::from(value))
    }
}

impl Store for LogStore {
    fn durable(&self) -> bool {
        true
    }

    fn write(&self, batch: Batch, sync: bool) -> Result<(), StoreError> {
        let mut inner = self.lock();
        inner.check_poisoned()?;
        if !batch.is_empty() {
            inner.write(batch)?;
        }
        if sync {
            inner.sync()?;
        }
        inner.collect()
    }

    fn get(&self, space: &str, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        let inner = self.lock();
        let Some(loc) = inner.spaces.get(space).and_then(|keys| keys.get(key)) else { return Ok(None) };
        inner.read(*loc).map(Some).map_err(|e| backend("get", e))
    }

    fn scan(
        &self,
        space: &str,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>, StoreError> {
        let inner = self.lock();
        let Some(keys) = inner.spaces.get(space) else { return Ok(Vec::new()) };
        if linkbus_plugin_api::store::is_empty_range(from, to) {
            return Ok(Vec::new());
        }
        let mut entries = Vec::new();
        for (key, loc) in keys.range::<[u8], _>((from, to)).take(limit) {
            entries.push((key.clone(), inner.read(*loc).map_err(|e| backend("scan", e))?));
        }
        Ok(entries)
    }

    fn spaces(&self) -> Result<Vec<String>, StoreError> {
        let mut names: Vec<String> = self.lock().spaces.keys().cloned().collect();
        names.sort();
        Ok(names)
    }

    fn sync(&self) -> Result<(), StoreError> {
        let mut inner = self.lock();
        inner.check_poisoned()?;
        inner.sync()
    }
}

fn check(section: &Section<'_>) {
    let _ = section.string("path");
    let _ = section.number("segment_mib", SEGMENT_MIB_DEFAULT, 1, 1024);
}

fn build(config: &ConfigValue, ctx: &BuildContext) -> Result<Box<dyn Store>, PluginError> {
    let entry = |name: &str| match config {
        ConfigValue::Map(entries) => entries.iter().find(|(k, _)| k == name).map(|(_, v)| v),
        _ => None,
    };
    let path = match entry("path") {
        Some(ConfigValue::Str(s)) => PathBuf::from(s),
        _ => ctx.data_dir.join("log"),
    };
    let mib = match entry("segment_mib") {
        Some(ConfigValue::Uint(n)) => *n,
        _ => SEGMENT_MIB_DEFAULT,
    };
    let store = LogStore::open(&path, mib << 20)
        .map_err(|e| PluginError { plugin: "log".into(), reason: e.to_string() })?;
    Ok(Box::new(store))
}

inventory::submit! {
    PluginEntry {
        name: "log",
        summary: "persistent store on disk (an append-only log of batches indexed in memory; each value written once; synced writes are fdatasync'ed)",
        check,
        factory: Factory::Store(build),
    }
}

#[cfg(test)]
mod tests;
