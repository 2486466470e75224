//! The files directory as a capability: every path is looked up beneath its handle.

use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions};
use linkbus_plugin_api::file::PARTIAL_DIR;
use linkbus_plugin_api::{FileName, FileStamp, FilesDir, PartialFile, SourceFile};

/// A files directory opened by [`CapFilesDir::open`].
#[derive(Debug)]
pub struct CapFilesDir {
    root: Dir,
    partial: Dir,
}

impl CapFilesDir {
    /// Opens `root` (created if missing) and its partial-file directory.
    ///
    /// # Errors
    /// When either cannot be created or opened.
    pub fn open(root: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(root)?;
        let root = Dir::open_ambient_dir(root, ambient_authority())?;
        root.create_dir_all(PARTIAL_DIR)?;
        let partial = root.open_dir(PARTIAL_DIR)?;
        Ok(Self { root, partial })
    }
}

/// Refuses a partial id that is not a plain name the host made.
fn check_id(id: &str) -> io::Result<()> {
    let plain = !id.is_empty()
        && id.len() <= 200
        && !id.starts_with('.')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
    if plain {
        Ok(())
    } else {
        Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad partial id {id:?}")))
    }
}

/// Syncs a directory (a new or removed entry in it becomes durable).
fn sync_dir(dir: &Dir) -> io::Result<()> {
    // (A `Dir` handle may be open for lookups only; a read handle of it can be synced.)
    dir.open(".")?.sync_all()
}

fn not_regular(name: &FileName) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("'{name}' is not a regular file"))
}

impl FilesDir for CapFilesDir {
    fn open_source(&self, name: &FileName) -> io::Result<Box<dyn SourceFile>> {
        let file = self.root.open(name.as_str())?;
        if !file.metadata()?.is_file() {
            return Err(not_regular(name));
        }
        Ok(Box::new(Source(file.into_std())))
    }

    fn exists(&self, name: &FileName) -> io::Result<bool> {
        match self.root.symlink_metadata(name.as_str()) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn remove(&self, name: &FileName) -> io::Result<()> {
        self.root.remove_file(name.as_str())
    }

    fn partial(&self, id: &str, create: bool) -> io::Result<Box<dyn PartialFile>> {
        check_id(id)?;
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(create);
        // The new entry is not synced: a partial file lost in a crash is found missing
        // against its recorded chunks, and received again (a directory sync here would wait
        // for the file system's journal, on the receiving link's task).
        let file = self.partial.open_with(id, &options)?;
        Ok(Box::new(Partial(file.into_std())))
    }

    fn remove_partial(&self, id: &str) -> io::Result<()> {
        check_id(id)?;
        match self.partial.remove_file(id) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn publish(&self, id: &str, name: &FileName) -> io::Result<()> {
        check_id(id)?;
        let path = Path::new(name.as_str());
        let parent = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(parent) => {
                self.root.create_dir_all(parent)?;
                Some(self.root.open_dir(parent)?)
            }
            None => None,
        };
        let (dir, leaf) = match (&parent, path.file_name()) {
            (Some(dir), Some(leaf)) => (dir, leaf),
            (None, Some(leaf)) => (&self.root, leaf),
            (_, None) => return Err(io::Error::new(io::ErrorKind::InvalidInput, "no file name")),
        };
        // A hard link never replaces what is there (`AlreadyExists`), unlike a rename.
        self.partial.hard_link(id, dir, leaf)?;
        sync_dir(dir)?;
        self.partial.remove_file(id)?;
        sync_dir(&self.partial)
    }

    fn partials(&self) -> io::Result<Vec<String>> {
        let mut ids = Vec::new();
        for entry in self.partial.entries()? {
            if let Ok(id) = entry?.file_name().into_string() {
                ids.push(id);
            }
        }
        Ok(ids)
    }
}

struct Source(std::fs::File);

impl SourceFile for Source {
    fn stamp(&self) -> io::Result<FileStamp> {
        let meta = self.0.metadata()?;
        let modified_ns = meta
            .modified()?
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Ok(FileStamp { size: meta.len(), modified_ns })
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }

    fn read_into(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> io::Result<()> {
        // Read into `out`'s spare room (nothing zeroed first). The handle's position is
        // this source's alone: one task reads it at a time.
        let mut file = &self.0;
        file.seek(SeekFrom::Start(offset))?;
        out.reserve(len);
        file.take(len as u64).read_to_end(out)?;
        Ok(())
    }
}

struct Partial(std::fs::File);

impl PartialFile for Partial {
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_all_at(data, offset)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn sync(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn write_behind(&self, offset: u64, len: u64) -> io::Result<()> {
        // On Linux, `DONTNEED` starts the writeback of the range's dirty pages (not waiting
        // for it) and drops its clean ones.
        let Some(len) = std::num::NonZeroU64::new(len) else { return Ok(()) };
        rustix::fs::fadvise(&self.0, offset, Some(len), rustix::fs::Advice::DontNeed).map_err(io::Error::from)
    }
}
