//! The wire form of messages: [`Content`] (what a client sends) and [`Message`] (what
//! travels between nodes). Both are self-delimiting inside their frame; decoding validates
//! every name and limit, so a decoded value is always a valid one.
//!
//! Layout (big-endian): format u8; for a message, the id (source name u8-len, sequence u64,
//! created u64), hop count u8, flags u8 and backout count u16; then the content: kind u8, priority u8,
//! reliability u8 (0 volatile, 1 persistent, 2 as the queue's default), lifetime ms u64 (`0` = not set), content flags u8 (bit 0: results wanted), name (u32 len), recipients (u8 count, each
//! node and queue u8-len), headers (u8 count, key u16-len, value u16-len), group (present
//! flag u8, id u16-len, index u32, last u8), correlation id (present flag u8, u16-len),
//! payload (u32 len). A message whose flags have bit 1 set (its payload is encoded) ends
//! with its encoding: a step count u8 (1 to `ENCODING_STEPS_MAX`), each step a codec id u8
//! and a record u16-len. Nothing else may follow the payload.

use std::cell::RefCell;

use bytes::{BufMut, Bytes, BytesMut};
use linkbus_plugin_api::message::{
    CORRELATION_ID_BYTES_MAX, ENCODING_STEPS_MAX, GROUP_ID_BYTES_MAX, HEADER_KEY_BYTES_MAX,
    HEADER_VALUE_BYTES_MAX, HEADERS_MAX, MESSAGE_NAME_BYTES_MAX, RECIPIENTS_MAX, STEP_PARAM_BYTES_MAX,
};
use linkbus_plugin_api::{
    Address, Content, Encoding, Group, Kind, Lifetime, Message, MessageId, NodeName, Priority, QueueName,
    Recipients, Reliability, Step,
};

use crate::reader::{ReadError, Reader};

mod bound;
mod buffers;
pub use bound::{UNBOUND_HEADERS, associated_data};
pub use buffers::{Chunks, Encoded, Heads};

/// Version of the message layout.
pub const MESSAGE_FORMAT: u8 = 3;
const FLAG_REDELIVERED: u8 = 1;
const FLAG_ENCODED: u8 = 2;
const CONTENT_FLAG_RESULTS: u8 = 1;

fn len_u8(n: usize) -> u8 {
    u8::try_from(n).expect("validated length fits u8")
}
fn len_u16(n: usize) -> u16 {
    u16::try_from(n).expect("validated length fits u16")
}
fn len_u32(n: usize) -> u32 {
    u32::try_from(n).expect("validated length fits u32")
}

/// Appends the wire form of `content`.
///
/// # Panics
/// When a field is over its limit: call [`Content::validate`] first.
pub fn encode_content(content: &Content, out: &mut BytesMut) {
    out.reserve(content_encoded_len(content));
    encode_content_head(content, out);
    out.put_slice(&content.payload);
}

/// Appends `content` into `out`, its payload shared rather than copied when large.
///
/// # Panics
/// As [`encode_content`].
pub fn encode_content_chunks(content: &Content, out: &mut Chunks) {
    encode_content_head(content, out.buf());
    out.share(&content.payload);
}

/// Everything of [`encode_content`] before the payload's bytes.
fn encode_content_head(content: &Content, out: &mut BytesMut) {
    out.put_u8(content.kind.code());
    out.put_u8(content.priority.code());
    out.put_u8(match content.reliability {
        Reliability::Volatile => 0,
        Reliability::Persistent => 1,
        Reliability::AsQueue => 2,
    });
    out.put_u64(content.lifetime.map_or(0, Lifetime::as_ms));
    out.put_u8(if content.results { CONTENT_FLAG_RESULTS } else { 0 });
    out.put_u32(len_u32(content.name.len()));
    out.put_slice(content.name.as_bytes());
    out.put_u8(len_u8(content.recipients.len()));
    for to in &content.recipients {
        put_short(out, to.node.as_str().as_bytes());
        put_short(out, to.queue.as_str().as_bytes());
    }
    out.put_u8(len_u8(content.headers.len()));
    for (key, value) in &content.headers {
        out.put_u16(len_u16(key.len()));
        out.put_slice(key.as_bytes());
        out.put_u16(len_u16(value.len()));
        out.put_slice(value.as_bytes());
    }
    match &content.group {
        None => out.put_u8(0),
        Some(g) => {
            out.put_u8(1);
            out.put_u16(len_u16(g.id.len()));
            out.put_slice(g.id.as_bytes());
            out.put_u32(g.index);
            out.put_u8(u8::from(g.last));
        }
    }
    match &content.correlation_id {
        None => out.put_u8(0),
        Some(c) => {
            out.put_u8(1);
            out.put_u16(len_u16(c.len()));
            out.put_slice(c);
        }
    }
    out.put_u32(len_u32(content.payload.len()));
}

fn put_short(out: &mut BytesMut, bytes: &[u8]) {
    out.put_u8(len_u8(bytes.len()));
    out.put_slice(bytes);
}

/// Bytes `recipients` take in an encoded content (after their count).
pub fn recipients_encoded_len(recipients: &[Address]) -> usize {
    recipients.iter().map(address_encoded_len).sum()
}

/// Bytes one recipient takes in an encoded content.
pub fn address_encoded_len(address: &Address) -> usize {
    2 + address.node.as_str().len() + address.queue.as_str().len()
}

/// Bytes [`encode_content`] writes for `content`.
pub fn content_encoded_len(content: &Content) -> usize {
    let recipients = recipients_encoded_len(&content.recipients);
    let headers: usize = content.headers.iter().map(|(k, v)| 4 + k.len() + v.len()).sum();
    let group = content.group.as_ref().map_or(0, |g| 2 + g.id.len() + 4 + 1);
    let correlation = content.correlation_id.as_ref().map_or(0, |c| 2 + c.len());
    3 + 8
        + 1
        + 4
        + content.name.len()
        + 1
        + recipients
        + 1
        + headers
        + 1
        + group
        + 1
        + correlation
        + 4
        + content.payload.len()
}

/// Bytes [`encode_message`] writes for a message with `content` from a source whose name has
/// `source_name_len` bytes.
pub fn message_encoded_len(source_name_len: usize, content: &Content) -> usize {
    1 + 1 + source_name_len + 8 + 8 + 1 + 1 + 2 + content_encoded_len(content)
}

/// Bytes an encoding takes after the payload (none when it is empty).
pub fn encoding_encoded_len(encoding: &Encoding) -> usize {
    if encoding.is_empty() { 0 } else { 1 + encoding.iter().map(|s| 3 + s.param.len()).sum::<usize>() }
}

/// Bytes [`encode_message`] writes for `message`.
pub fn encoded_len(message: &Message) -> usize {
    message_encoded_len(message.id.source.as_str().len(), &message.content)
        + encoding_encoded_len(&message.encoding)
}

/// Bytes [`encode_message`] writes for `message` without its recipients: what a copy of it
/// for some of them takes is this plus [`recipients_encoded_len`] of those.
pub fn encoded_len_without_recipients(message: &Message) -> usize {
    encoded_len(message) - recipients_encoded_len(&message.content.recipients)
}

/// Appends the wire form of `message`.
///
/// # Panics
/// When a field is over its limit (accepted messages are validated).
pub fn encode_message(message: &Message, out: &mut BytesMut) {
    encode_message_head(message, out);
    encode_content(&message.content, out);
    encode_encoding(&message.encoding, out);
}

/// Appends `message` into `out`, its payload shared rather than copied when large.
///
/// # Panics
/// As [`encode_message`].
pub fn encode_message_chunks(message: &Message, out: &mut Chunks) {
    encode_message_head(message, out.buf());
    encode_content_chunks(&message.content, out);
    encode_encoding(&message.encoding, out.buf());
}

/// The encoding after the payload (nothing when it is empty).
fn encode_encoding(encoding: &Encoding, out: &mut BytesMut) {
    if encoding.is_empty() {
        return;
    }
    out.put_u8(len_u8(encoding.len()));
    for step in encoding {
        out.put_u8(step.codec);
        out.put_u16(len_u16(step.param.len()));
        out.put_slice(&step.param);
    }
}

/// Everything of [`encode_message`] before its content.
fn encode_message_head(message: &Message, out: &mut BytesMut) {
    out.put_u8(MESSAGE_FORMAT);
    put_short(out, message.id.source.as_str().as_bytes());
    out.put_u64(message.id.sequence);
    out.put_u64(message.id.created_unix_ms);
    out.put_u8(message.hop_count);
    let encoded = if message.encoding.is_empty() { 0 } else { FLAG_ENCODED };
    out.put_u8(if message.redelivered { FLAG_REDELIVERED } else { 0 } | encoded);
    out.put_u16(message.backout_count);
}

/// Messages shorter than this are copied out of the buffer they arrived in (a connection's
/// read chunk, by the frame decoder; a client's request, by a [`Reader::detaching`]) before
/// they are kept: a small message shared with a large buffer would hold all of it in memory
/// for as long as it waits in a queue.
pub const DETACH_BYTES_MAX: usize = 32 * 1024;

/// `parts` joined in one buffer, sized once.
pub fn join(parts: &[Bytes]) -> Bytes {
    let mut all = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
    parts.iter().for_each(|part| all.extend_from_slice(part));
    all.freeze()
}

/// A copy of the encoded `message` with its remaining lifetime set to `lifetime_ms`, or
/// `None` when the bytes are not an encoded message.
pub fn with_lifetime(message: &Bytes, lifetime_ms: u64) -> Option<Bytes> {
    let source_len = *message.get(1)? as usize;
    // format, name length, name, sequence, created, hop count, flags, backout count, kind,
    // priority, reliability
    let at = 2 + source_len + 8 + 8 + 1 + 1 + 2 + 3;
    let mut copy = BytesMut::from(&message[..]);
    copy.get_mut(at..at + 8)?.copy_from_slice(&lifetime_ms.max(1).to_be_bytes());
    Some(copy.freeze())
}

/// Whether the encoded `message` is volatile (`false` for persistent, for "as the queue's
/// default", and for bytes that are not an encoded message).
fn is_volatile(message: &[u8]) -> bool {
    reliability_code(message) == Some(0)
}

/// Whether the encoded `message` is persistent (`false` for bytes that are not an encoded
/// message).
fn is_persistent(message: &[u8]) -> bool {
    reliability_code(message) == Some(1)
}

/// The reliability byte of an encoded message.
fn reliability_code(message: &[u8]) -> Option<u8> {
    let &source_len = message.get(1)?;
    // format, name length, name, sequence, created, hop count, flags, backout count, kind,
    // priority
    let at = 2 + source_len as usize + 8 + 8 + 1 + 1 + 2 + 2;
    (message.first() == Some(&MESSAGE_FORMAT)).then(|| message.get(at).copied()).flatten()
}

/// The wire form of `message` as one buffer.
pub fn message_bytes(message: &Message) -> Bytes {
    let mut out = BytesMut::with_capacity(encoded_len(message));
    encode_message(message, &mut out);
    out.freeze()
}

fn invalid(field: &'static str, detail: impl ToString) -> ReadError {
    ReadError::Invalid { field, detail: detail.to_string() }
}

fn bounded(field: &'static str, len: usize, max: usize) -> Result<usize, ReadError> {
    if len > max {
        return Err(invalid(field, format!("{len} is over the limit {max}")));
    }
    Ok(len)
}

fn node_name(r: &mut Reader) -> Result<NodeName, ReadError> {
    r.short_str(NodeName::new)?.map_err(|e| invalid("node name", e))
}

/// The source and the recipients this thread decoded last. Messages come in runs from one
/// source to the same recipients (a batch, a link's stream), so names whose bytes are those
/// of the last ones are cloned instead of read and checked again: a name is valid by its
/// bytes alone (a clone copies a name held inline, and counts a longer queue name's
/// shared string).
struct LastDecoded {
    source: Option<NodeName>,
    /// The recipients as encoded (after their count), and what they decoded to.
    recipients: Option<(Vec<u8>, Recipients)>,
}

thread_local! {
    static LAST_DECODED: RefCell<LastDecoded> =
        const { RefCell::new(LastDecoded { source: None, recipients: None }) };
}

/// A message's source node name (as [`node_name`]).
fn source_name(r: &mut Reader) -> Result<NodeName, ReadError> {
    let last = LAST_DECODED.with_borrow(|last| {
        let source = last.source.as_ref()?;
        let name = source.as_str().as_bytes();
        let ahead = r.ahead();
        let same = ahead.first().is_some_and(|n| usize::from(*n) == name.len())
            && ahead.get(1..=name.len()) == Some(name);
        same.then(|| source.clone())
    });
    if let Some(source) = last {
        r.skip(1 + source.as_str().len())?;
        return Ok(source);
    }
    let source = node_name(r)?;
    LAST_DECODED.with_borrow_mut(|last| last.source = Some(source.clone()));
    Ok(source)
}

/// Bytes that `count` recipients take at the head of `ahead` (two names each, each with its
/// u8 length), if they are all there.
fn recipients_span(ahead: &[u8], count: usize) -> Option<usize> {
    let mut at = 0;
    for _ in 0..count * 2 {
        at += 1 + usize::from(*ahead.get(at)?);
    }
    (at <= ahead.len()).then_some(at)
}

/// `count` recipients, each a node and a queue name.
fn read_recipients(r: &mut Reader, count: usize) -> Result<Recipients, ReadError> {
    let span = recipients_span(r.ahead(), count);
    let encoded = span.and_then(|span| r.ahead().get(..span)).unwrap_or_default();
    let last = LAST_DECODED.with_borrow(|last| {
        // The same bytes for the same count (each name carries its length): the same names.
        let (bytes, recipients) = last.recipients.as_ref().filter(|(b, _)| b[..] == *encoded)?;
        // (One, the common case, made in place: collecting it moves it through the stack.)
        let same = match &recipients[..] {
            [one] => Recipients::from_buf([Address::new(one.node.clone(), one.queue.clone())]),
            more => more.iter().cloned().collect(),
        };
        Some((bytes.len(), same))
    });
    if let Some((span, recipients)) = last {
        r.skip(span)?;
        return Ok(recipients);
    }
    // The bytes are kept first (in the buffer of the last ones), as reading moves past
    // them; the names follow once read, or nothing is kept.
    let keep = !encoded.is_empty();
    if keep {
        LAST_DECODED.with_borrow_mut(|last| {
            let (bytes, _) = last.recipients.get_or_insert_default();
            bytes.clear();
            bytes.extend_from_slice(encoded);
        });
    }
    let read = (0..count)
        .map(|_| {
            let node = node_name(r)?;
            let queue = r.short_str(QueueName::new)?.map_err(|e| invalid("queue name", e))?;
            Ok(Address::new(node, queue))
        })
        .collect::<Result<Recipients, ReadError>>();
    if keep {
        LAST_DECODED.with_borrow_mut(|last| match (&read, last.recipients.as_mut()) {
            (Ok(recipients), Some((_, kept))) => kept.clone_from(recipients),
            _ => last.recipients = None,
        });
    }
    read
}

/// Reads a [`Content`] from `r`, leaving the reader after the payload.
///
/// # Errors
/// [`ReadError`] for anything truncated, over a limit, or invalid.
pub fn read_content(r: &mut Reader) -> Result<Content, ReadError> {
    let kind = r.u8()?;
    let kind = Kind::from_code(kind).ok_or_else(|| invalid("kind", kind))?;
    let priority = r.u8()?;
    let priority = Priority::from_code(priority).ok_or_else(|| invalid("priority", priority))?;
    let reliability = match r.u8()? {
        0 => Reliability::Volatile,
        1 => Reliability::Persistent,
        2 => Reliability::AsQueue,
        other => return Err(invalid("reliability", other)),
    };
    let lifetime = Some(r.u64()?).filter(|ms| *ms != 0).map(Lifetime::from_ms);
    let flags = r.u8()?;
    if flags & !CONTENT_FLAG_RESULTS != 0 {
        return Err(invalid("content flags", flags));
    }
    let results = flags & CONTENT_FLAG_RESULTS != 0;
    let name_len = bounded("name", r.u32()? as usize, MESSAGE_NAME_BYTES_MAX)?;
    let name = r.string(name_len)?;
    let count = bounded("recipients", r.u8()? as usize, RECIPIENTS_MAX)?;
    if count == 0 {
        return Err(invalid("recipients", "none"));
    }
    let recipients = read_recipients(r, count)?;
    let count = bounded("headers", r.u8()? as usize, HEADERS_MAX)?;
    let mut headers = Vec::with_capacity(count);
    for _ in 0..count {
        let key_len = bounded("header key", r.u16()? as usize, HEADER_KEY_BYTES_MAX)?;
        let key = r.string(key_len)?;
        let value_len = bounded("header value", r.u16()? as usize, HEADER_VALUE_BYTES_MAX)?;
        headers.push((key, r.string(value_len)?));
    }
    let group = match r.u8()? {
        0 => None,
        1 => {
            let id_len = bounded("group id", r.u16()? as usize, GROUP_ID_BYTES_MAX)?;
            let id = r.string(id_len)?;
            Some(Group { id, index: r.u32()?, last: r.u8()? != 0 })
        }
        other => return Err(invalid("group flag", other)),
    };
    let correlation_id = match r.u8()? {
        0 => None,
        1 => {
            let len = bounded("correlation id", r.u16()? as usize, CORRELATION_ID_BYTES_MAX)?;
            Some(r.bytes(len)?)
        }
        other => return Err(invalid("correlation flag", other)),
    };
    let payload_len = r.u32()? as usize;
    let payload = r.bytes(payload_len)?;
    let content = Content {
        kind,
        name,
        recipients,
        priority,
        lifetime,
        reliability,
        results,
        headers,
        group,
        correlation_id,
        payload,
    };
    content.validate().map_err(|e| invalid("content", e))?;
    Ok(content)
}

/// Decodes one [`Message`] that fills `bytes` exactly.
///
/// # Errors
/// [`ReadError`] for anything truncated, over a limit, invalid, or trailing.
pub fn decode_message(bytes: Bytes) -> Result<Message, ReadError> {
    let mut r = Reader::new(bytes);
    let format = r.u8()?;
    if format != MESSAGE_FORMAT {
        return Err(invalid("message format", format));
    }
    let source = source_name(&mut r)?;
    let id = MessageId { source, sequence: r.u64()?, created_unix_ms: r.u64()? };
    let hop_count = r.u8()?;
    let flags = r.u8()?;
    if flags & !(FLAG_REDELIVERED | FLAG_ENCODED) != 0 {
        return Err(invalid("message flags", flags));
    }
    let backout_count = r.u16()?;
    let content = Box::new(read_content(&mut r)?);
    let encoding = if flags & FLAG_ENCODED != 0 { read_encoding(&mut r)? } else { Encoding::new() };
    r.finish()?;
    Ok(Message {
        id,
        hop_count,
        redelivered: flags & FLAG_REDELIVERED != 0,
        backout_count,
        content,
        encoding,
    })
}

/// Reads a message's encoding (after its payload).
fn read_encoding(r: &mut Reader) -> Result<Encoding, ReadError> {
    let count = bounded("encoding steps", r.u8()? as usize, ENCODING_STEPS_MAX)?;
    if count == 0 {
        return Err(invalid("encoding steps", "none, though the message says it is encoded"));
    }
    (0..count)
        .map(|_| {
            let codec = r.u8()?;
            let len = bounded("encoding step record", r.u16()? as usize, STEP_PARAM_BYTES_MAX)?;
            Ok(Step { codec, param: r.bytes(len)? })
        })
        .collect()
}

#[cfg(test)]
mod tests;
