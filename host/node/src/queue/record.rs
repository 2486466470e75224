//! Stored queue records: a format byte, a CRC32C of the rest, the wall-clock time the
//! message was (re)queued, then the message. Links keep the messages they spool in the same
//! form.

use bytes::{BufMut, Bytes, BytesMut};
use linkbus_plugin_api::Message;
use linkbus_proto::wire::{Encoded, decode_message, encode_message};

/// Version of a stored queue record.
pub(super) const RECORD_FORMAT: u8 = 1;
/// The same, of a group member free to hand out (its group completed here): read back, it
/// goes to its level rather than back into its group.
pub(super) const RECORD_FREE_MEMBER: u8 = 2;
/// Bytes before the message in a stored record: format, CRC32C, enqueue time.
pub(super) const RECORD_HEADER_BYTES: usize = 1 + 4 + 8;

/// A queue record: format u8, CRC32C (u32, of everything after it), the wall-clock time it
/// was (re)queued in milliseconds (u64), then the message (its remaining lifetime as of then).
pub(crate) fn encode_record(message: &Message) -> Bytes {
    encode_record_as(message, RECORD_FORMAT)
}

pub(super) fn encode_record_as(message: &Message, format: u8) -> Bytes {
    record_with(format, linkbus_proto::wire::encoded_len(message), |out| encode_message(message, out))
}

/// [`encode_record`] of a message already encoded (`message`, its wire form).
pub(crate) fn encode_record_of(message: &Encoded) -> Bytes {
    record_with(RECORD_FORMAT, message.len(), |out| {
        message.parts().iter().for_each(|part| out.put_slice(part))
    })
}

/// A record whose message (`len` bytes) `write` appends, straight into the record.
fn record_with(format: u8, len: usize, write: impl FnOnce(&mut BytesMut)) -> Bytes {
    let mut record = BytesMut::with_capacity(RECORD_HEADER_BYTES + len);
    record.put_u8(format);
    record.put_u32(0);
    record.put_u64(crate::clock::unix_ms());
    write(&mut record);
    let crc = linkbus_proto::crc::crc32c(&record[5..]);
    record[1..5].copy_from_slice(&crc.to_be_bytes());
    record.freeze()
}

/// [`encode_record`] of a message that stays in memory too: its payload becomes the
/// record's bytes that hold it (the last field of an encoded message but its encoding), so
/// the queue and the store's memory table hold one copy of it, not two, and a payload cut
/// out of a larger buffer no longer holds that buffer.
pub(crate) fn encode_record_sharing(message: &mut Message) -> Bytes {
    encode_record_sharing_as(message, RECORD_FORMAT)
}

pub(super) fn encode_record_sharing_as(message: &mut Message, format: u8) -> Bytes {
    let record = encode_record_as(message, format);
    let end = record.len() - linkbus_proto::wire::encoding_encoded_len(&message.encoding);
    let start = end - message.content.payload.len();
    debug_assert!(
        record.get(start..end) == Some(&message.content.payload[..]),
        "the payload is an encoded message's last field but its encoding"
    );
    message.content.payload = record.slice(start..end);
    record
}

/// The message and its enqueue time from a record written by [`encode_record`].
pub(crate) fn decode_record(record: Bytes) -> Result<(Message, u64), String> {
    decode_queue_record(record).map(|(message, at, _)| (message, at))
}

/// [`decode_record`], and whether a group member's record says it is free to hand out.
pub(super) fn decode_queue_record(record: Bytes) -> Result<(Message, u64, bool), String> {
    if record.len() < RECORD_HEADER_BYTES {
        return Err(format!("record of {} bytes is shorter than its header", record.len()));
    }
    let free = record[0] == RECORD_FREE_MEMBER;
    if record[0] != RECORD_FORMAT && !free {
        return Err(format!("unknown record format {}", record[0]));
    }
    let crc = u32::from_be_bytes([record[1], record[2], record[3], record[4]]);
    if linkbus_proto::crc::crc32c(&record[5..]) != crc {
        return Err("checksum mismatch".into());
    }
    let mut at = [0u8; 8];
    at.copy_from_slice(&record[5..13]);
    let message = decode_message(record.slice(RECORD_HEADER_BYTES..)).map_err(|e| e.to_string())?;
    Ok((message, u64::from_be_bytes(at), free))
}
