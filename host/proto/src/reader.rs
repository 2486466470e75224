//! A bounds-checked reader over received bytes: every read either succeeds or returns a
//! [`ReadError`]; nothing indexes past the end, so peer bytes cannot cause a panic.

use bytes::{Buf, Bytes};

use crate::wire::DETACH_BYTES_MAX;

/// Why a field could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The input ended inside a field.
    #[error("truncated: needed {needed} more bytes, {left} left")]
    Truncated {
        /// Bytes the field needs.
        needed: usize,
        /// Bytes that were left.
        left: usize,
    },
    /// Bytes left over after the last field.
    #[error("{0} trailing bytes")]
    Trailing(usize),
    /// Text that is not UTF-8.
    #[error("text is not UTF-8")]
    Utf8,
    /// A value outside its allowed set.
    #[error("invalid {field}: {detail}")]
    Invalid {
        /// Which field.
        field: &'static str,
        /// Why.
        detail: String,
    },
}

/// Reads big-endian fields from a `Bytes`, sharing it for byte fields (or copying short
/// ones: [`Reader::detaching`]).
#[derive(Debug)]
pub struct Reader {
    bytes: Bytes,
    /// Byte fields shorter than [`DETACH_BYTES_MAX`] are copied into buffers of their own.
    detach: bool,
}

impl Reader {
    /// A reader over `bytes`.
    pub fn new(bytes: Bytes) -> Self {
        Self { bytes, detach: false }
    }

    /// A reader over `bytes` whose byte fields shorter than [`DETACH_BYTES_MAX`] are copied
    /// into buffers of their own (they are kept longer than `bytes` should be; copied
    /// straight from the input, they are never cut out of it first).
    pub fn detaching(bytes: Bytes) -> Self {
        Self { bytes, detach: true }
    }

    fn need(&self, n: usize) -> Result<(), ReadError> {
        if self.bytes.remaining() < n {
            return Err(ReadError::Truncated { needed: n, left: self.bytes.remaining() });
        }
        Ok(())
    }

    /// One byte.
    ///
    /// # Errors
    /// [`ReadError::Truncated`].
    pub fn u8(&mut self) -> Result<u8, ReadError> {
        self.need(1)?;
        Ok(self.bytes.get_u8())
    }

    /// A big-endian u16.
    ///
    /// # Errors
    /// [`ReadError::Truncated`].
    pub fn u16(&mut self) -> Result<u16, ReadError> {
        self.need(2)?;
        Ok(self.bytes.get_u16())
    }

    /// A big-endian u32.
    ///
    /// # Errors
    /// [`ReadError::Truncated`].
    pub fn u32(&mut self) -> Result<u32, ReadError> {
        self.need(4)?;
        Ok(self.bytes.get_u32())
    }

    /// A big-endian u64.
    ///
    /// # Errors
    /// [`ReadError::Truncated`].
    pub fn u64(&mut self) -> Result<u64, ReadError> {
        self.need(8)?;
        Ok(self.bytes.get_u64())
    }

    /// `n` bytes, shared with the input (copied when short and the reader is
    /// [`Reader::detaching`]).
    ///
    /// # Errors
    /// [`ReadError::Truncated`].
    pub fn bytes(&mut self, n: usize) -> Result<Bytes, ReadError> {
        self.need(n)?;
        if self.detach && n < DETACH_BYTES_MAX {
            let copy = Bytes::copy_from_slice(self.bytes.get(..n).unwrap_or_default());
            self.bytes.advance(n);
            return Ok(copy);
        }
        Ok(self.bytes.split_to(n))
    }

    /// Text of `n` bytes.
    ///
    /// # Errors
    /// [`ReadError::Truncated`] or [`ReadError::Utf8`].
    pub fn string(&mut self, n: usize) -> Result<String, ReadError> {
        self.str_at(n, str::to_owned)
    }

    /// Text with a u8 length prefix.
    ///
    /// # Errors
    /// [`ReadError`].
    pub fn short_string(&mut self) -> Result<String, ReadError> {
        let n = self.u8()? as usize;
        self.string(n)
    }

    /// Text with a u8 length prefix, handed to `f` where it lies (a name about to be
    /// checked or shared needs no copy of its own).
    ///
    /// # Errors
    /// [`ReadError`].
    pub fn short_str<T>(&mut self, f: impl FnOnce(&str) -> T) -> Result<T, ReadError> {
        let n = self.u8()? as usize;
        self.str_at(n, f)
    }

    /// Text of `n` bytes, handed to `f` where it lies.
    fn str_at<T>(&mut self, n: usize, f: impl FnOnce(&str) -> T) -> Result<T, ReadError> {
        self.need(n)?;
        let text =
            std::str::from_utf8(self.bytes.get(..n).unwrap_or_default()).map_err(|_| ReadError::Utf8)?;
        let out = f(text);
        self.bytes.advance(n);
        Ok(out)
    }

    /// The bytes not yet read, without reading them.
    pub fn ahead(&self) -> &[u8] {
        &self.bytes
    }

    /// Passes over `n` bytes.
    ///
    /// # Errors
    /// [`ReadError::Truncated`].
    pub fn skip(&mut self, n: usize) -> Result<(), ReadError> {
        self.need(n)?;
        self.bytes.advance(n);
        Ok(())
    }

    /// Reads an item of `len` bytes with `read`, its short byte fields copied as by a
    /// [`Reader::detaching`] over just those bytes, without cutting them out first (which
    /// moves a count of the input's owners up and down again for each item).
    ///
    /// # Errors
    /// What `read` returns, [`ReadError::Truncated`], or [`ReadError::Invalid`] when `read`
    /// took other than `len` bytes.
    pub fn detached_item<T>(
        &mut self,
        len: usize,
        read: impl FnOnce(&mut Self) -> Result<T, ReadError>,
    ) -> Result<T, ReadError> {
        self.need(len)?;
        let (detach, before) = (std::mem::replace(&mut self.detach, true), self.remaining());
        let item = read(self);
        self.detach = detach;
        let (item, took) = (item?, before - self.remaining());
        if took != len {
            let detail = format!("{len} bytes declared, {took} read");
            return Err(ReadError::Invalid { field: "item length", detail });
        }
        Ok(item)
    }

    /// Everything left.
    pub fn rest(&mut self) -> Bytes {
        self.bytes.split_off(0)
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.bytes.remaining()
    }

    /// Checks that nothing is left.
    ///
    /// # Errors
    /// [`ReadError::Trailing`].
    pub fn finish(&self) -> Result<(), ReadError> {
        match self.bytes.remaining() {
            0 => Ok(()),
            n => Err(ReadError::Trailing(n)),
        }
    }
}
