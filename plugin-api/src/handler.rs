//! The `MessageHandler` extension point: what file messages are read from and written to.
//!
//! The host drives a transfer (chunks, resume, results, records in its store); the handler
//! owns the bytes: it opens a node's files directory ([`MessageHandler::open`]) and, through
//! the [`FilesDir`] it returns, reads files at their origin, writes partial files at their
//! recipient and moves a complete one into place. Every name it is given is a checked
//! [`FileName`]; a handler must still never reach outside its root (through a symbolic link,
//! for instance).

use std::io;
use std::path::Path;

use crate::file::{FileName, FileStamp};
use crate::message::Kind;

/// Why a handler refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("handler failed: {0}")]
pub struct HandlerError(pub String);

/// Serves one message kind at the edges of the bus (the `file` plugin serves files).
pub trait MessageHandler: Send + Sync {
    /// The kind this handler serves.
    fn kind(&self) -> Kind;

    /// Bytes of a file each chunk message carries.
    fn chunk_bytes(&self) -> usize;

    /// Bytes of one transfer the origin lets travel ahead of what the recipient confirmed.
    fn window_bytes(&self) -> u64;

    /// Bytes of all the node's transfers together travelling ahead of what their recipients
    /// confirmed (at least [`window_bytes`](Self::window_bytes)): what many transfers at
    /// once hold in memory at their origin.
    fn in_flight_bytes(&self) -> u64 {
        self.window_bytes().saturating_mul(4)
    }

    /// Opens (creating it if needed) the files directory at `root`.
    ///
    /// # Errors
    /// When it cannot be created or opened.
    fn open(&self, root: &Path) -> Result<Box<dyn FilesDir>, HandlerError>;
}

/// A node's files directory, as a handler serves it.
pub trait FilesDir: Send + Sync {
    /// Opens a file to send.
    ///
    /// # Errors
    /// It does not exist, is not a regular file, or is outside the directory.
    fn open_source(&self, name: &FileName) -> io::Result<Box<dyn SourceFile>>;

    /// Whether a file (or anything else) is there under `name`.
    ///
    /// # Errors
    /// When it cannot be told.
    fn exists(&self, name: &FileName) -> io::Result<bool>;

    /// Removes a file that was sent (delete after send).
    ///
    /// # Errors
    /// When it cannot be removed.
    fn remove(&self, name: &FileName) -> io::Result<()>;

    /// Opens the partial file `id` (a name the host makes, letters, digits, `-` and `.`),
    /// creating an empty one when `create`.
    ///
    /// # Errors
    /// It cannot be opened or created (`NotFound` when absent and not `create`).
    fn partial(&self, id: &str, create: bool) -> io::Result<Box<dyn PartialFile>>;

    /// Removes the partial file `id`, if there.
    ///
    /// # Errors
    /// When it cannot be removed.
    fn remove_partial(&self, id: &str) -> io::Result<()>;

    /// Moves the complete partial file `id` to `name` (creating its directories), durably,
    /// never replacing anything there: `AlreadyExists` then, and the partial stays.
    ///
    /// # Errors
    /// As said, or when it cannot be moved.
    fn publish(&self, id: &str, name: &FileName) -> io::Result<()>;

    /// The ids of the partial files there.
    ///
    /// # Errors
    /// When they cannot be listed.
    fn partials(&self) -> io::Result<Vec<String>>;
}

/// A file being sent.
pub trait SourceFile: Send {
    /// Its size and modification time now.
    ///
    /// # Errors
    /// When they cannot be read.
    fn stamp(&self) -> io::Result<FileStamp>;

    /// Reads up to `buf.len()` bytes at `offset`; returns how many (0 at the end).
    ///
    /// # Errors
    /// When it cannot be read.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;

    /// Appends `len` bytes read at `offset` to `out` (fewer at the end of the file). The
    /// default fills zeroed room through [`SourceFile::read_at`]; a handler that can read
    /// into `out`'s spare room directly saves that.
    ///
    /// # Errors
    /// When it cannot be read.
    fn read_into(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> io::Result<()> {
        let start = out.len();
        out.resize(start + len, 0);
        let mut done = 0;
        while done < len {
            match self.read_at(offset + done as u64, &mut out[start + done..]) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    out.truncate(start);
                    return Err(e);
                }
            }
        }
        out.truncate(start + done);
        Ok(())
    }
}

/// A file being received.
pub trait PartialFile: Send {
    /// Writes all of `data` at `offset`.
    ///
    /// # Errors
    /// When it cannot be written (a full disk: `StorageFull`).
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;

    /// Reads up to `buf.len()` bytes at `offset`; returns how many.
    ///
    /// # Errors
    /// When it cannot be read.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;

    /// Cuts it to `len` bytes.
    ///
    /// # Errors
    /// When it cannot be cut.
    fn truncate(&self, len: u64) -> io::Result<()>;

    /// Makes what was written durable.
    ///
    /// # Errors
    /// When it cannot be synced.
    fn sync(&self) -> io::Result<()>;

    /// Starts writing `len` bytes at `offset` to the disk without waiting for it, and lets
    /// the memory of those already written go. Called a few MiB behind the writes: a large
    /// file then never fills memory with pages waiting for the disk, and its final
    /// [`sync`](Self::sync) is short. (Doing nothing is correct, only slower.)
    ///
    /// # Errors
    /// When the advice is refused.
    fn write_behind(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
}
