//! The step record (`param`) of a sealed payload: written by `seal`, parsed strictly by
//! `open`. The layout is in the crate doc.

use linkbus_plugin_api::CodecError;
use linkbus_plugin_api::name::{NODE_NAME_CHARS_MAX, QUEUE_NAME_CHARS_MAX};

use crate::key::KEY_ID_BYTES;

/// The record format this crate writes and reads.
pub(crate) const FORMAT: u8 = 1;
/// Bytes of an XChaCha20 nonce.
pub(crate) const NONCE_BYTES: usize = 24;
/// Bytes of a wrapped data key: the key and the Poly1305 tag.
pub(crate) const WRAPPED_BYTES: usize = 32 + 16;
/// Longest `node:queue` address.
const ADDRESS_BYTES_MAX: usize = NODE_NAME_CHARS_MAX + 1 + QUEUE_NAME_CHARS_MAX;
/// Mode byte: one recipient, the payload sealed under its key.
const MODE_DIRECT: u8 = 0;
/// Mode byte: several recipients, the payload sealed under a data key wrapped for each.
const MODE_WRAPPED: u8 = 1;

/// A parsed record.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Record<'a> {
    /// One recipient: the payload is sealed under key `key_id` with `nonce`.
    Direct {
        /// The recipient's key.
        key_id: [u8; KEY_ID_BYTES],
        /// The payload's nonce.
        nonce: [u8; NONCE_BYTES],
    },
    /// Several recipients: the payload is sealed under a data key with `nonce`, and the data
    /// key wrapped for each recipient.
    Wrapped {
        /// The payload's nonce.
        nonce: [u8; NONCE_BYTES],
        /// One per recipient, in the order sealed.
        wraps: Vec<Wrap<'a>>,
    },
}

/// The data key wrapped for one recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wrap<'a> {
    /// The recipient's `node:queue`, bound into the wrap.
    pub(crate) address: &'a [u8],
    /// The recipient's key.
    pub(crate) key_id: [u8; KEY_ID_BYTES],
    /// The wrap's nonce.
    pub(crate) nonce: [u8; NONCE_BYTES],
    /// The data key sealed under the recipient's key.
    pub(crate) wrapped: &'a [u8; WRAPPED_BYTES],
}

/// Writes a direct record.
pub(crate) fn direct(key_id: &[u8; KEY_ID_BYTES], nonce: &[u8; NONCE_BYTES]) -> Vec<u8> {
    let mut record = Vec::with_capacity(2 + KEY_ID_BYTES + NONCE_BYTES);
    record.extend_from_slice(&[FORMAT, MODE_DIRECT]);
    record.extend_from_slice(key_id);
    record.extend_from_slice(nonce);
    record
}

/// Writes a wrapped record; `None` when the wraps do not fit its counts (more than 255, or
/// an address longer than an address can be).
pub(crate) fn wrapped(nonce: &[u8; NONCE_BYTES], wraps: &[Wrap<'_>]) -> Option<Vec<u8>> {
    let mut record = Vec::with_capacity(3 + NONCE_BYTES + wraps.len() * 150);
    record.extend_from_slice(&[FORMAT, MODE_WRAPPED]);
    record.extend_from_slice(nonce);
    record.push(u8::try_from(wraps.len()).ok()?);
    for wrap in wraps {
        if wrap.address.len() > ADDRESS_BYTES_MAX {
            return None;
        }
        record.push(u8::try_from(wrap.address.len()).ok()?);
        record.extend_from_slice(wrap.address);
        record.extend_from_slice(&wrap.key_id);
        record.extend_from_slice(&wrap.nonce);
        record.extend_from_slice(wrap.wrapped);
    }
    Some(record)
}

/// Reads `param` as a record: every field where the layout puts it, nothing after the last.
pub(crate) fn parse(param: &[u8]) -> Result<Record<'_>, CodecError> {
    let mut r = Reader(param);
    let format = r.byte()?;
    if format != FORMAT {
        return Err(corrupt(format!("unknown payload record format {format}")));
    }
    let record = match r.byte()? {
        MODE_DIRECT => Record::Direct { key_id: r.array()?, nonce: r.array()? },
        MODE_WRAPPED => {
            let nonce = r.array()?;
            let count = r.byte()?;
            if count == 0 {
                return Err(corrupt("a wrapped payload record for no recipient"));
            }
            let wraps = (0..count).map(|_| r.wrap()).collect::<Result<_, _>>()?;
            Record::Wrapped { nonce, wraps }
        }
        mode => return Err(corrupt(format!("unknown payload record mode {mode}"))),
    };
    if !r.0.is_empty() {
        return Err(corrupt("bytes follow the payload record"));
    }
    Ok(record)
}

fn corrupt(what: impl Into<String>) -> CodecError {
    CodecError::Corrupt(what.into())
}

/// The part of a record not read yet.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if self.0.len() < n {
            return Err(corrupt("the payload record is cut short"));
        }
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(taken)
    }

    fn byte(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        Ok(*self.array_ref()?)
    }

    fn array_ref<const N: usize>(&mut self) -> Result<&'a [u8; N], CodecError> {
        self.take(N)?.try_into().map_err(|_| corrupt("the payload record is cut short"))
    }

    fn wrap(&mut self) -> Result<Wrap<'a>, CodecError> {
        let len = usize::from(self.byte()?);
        if len == 0 || len > ADDRESS_BYTES_MAX {
            return Err(corrupt(format!("a recipient address of {len} bytes in the payload record")));
        }
        let address = self.take(len)?;
        Ok(Wrap { address, key_id: self.array()?, nonce: self.array()?, wrapped: self.array_ref()? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrap(address: &[u8]) -> Wrap<'_> {
        Wrap { address, key_id: [7; 8], nonce: [9; 24], wrapped: &[5; 48] }
    }

    #[test]
    fn records_read_back_as_written() {
        let record = direct(&[1; 8], &[2; 24]);
        assert_eq!(record.len(), 34);
        assert_eq!(parse(&record), Ok(Record::Direct { key_id: [1; 8], nonce: [2; 24] }));
        let wraps = [wrap(b"B:orders"), wrap(b"C:q")];
        let record = wrapped(&[3; 24], &wraps).unwrap();
        assert_eq!(record.len(), 2 + 24 + 1 + (1 + 8 + 8 + 24 + 48) + (1 + 3 + 8 + 24 + 48));
        assert_eq!(parse(&record), Ok(Record::Wrapped { nonce: [3; 24], wraps: wraps.to_vec() }));
    }

    #[test]
    fn every_bad_layout_is_corrupt_and_never_a_panic() {
        let good = wrapped(&[3; 24], &[wrap(b"B:orders"), wrap(b"C:q")]).unwrap();
        for len in 0..good.len() {
            assert!(matches!(parse(&good[..len]), Err(CodecError::Corrupt(_))), "cut at {len}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(matches!(parse(&longer), Err(CodecError::Corrupt(_))));
        for (at, value) in [(0, 2), (1, 2), (26, 0), (26, 3), (27, 0), (27, 200)] {
            let mut bad = good.clone();
            bad[at] = value;
            assert!(matches!(parse(&bad), Err(CodecError::Corrupt(_))), "byte {at} = {value}");
        }
        let mut direct_longer = direct(&[1; 8], &[2; 24]);
        direct_longer.push(0);
        assert!(matches!(parse(&direct_longer), Err(CodecError::Corrupt(_))));
        assert_eq!(wrapped(&[0; 24], &[wrap(&[b'a'; 70])]), None);
        assert_eq!(wrapped(&[0; 24], &vec![wrap(b"B:q"); 256]), None);
    }
}
