//! What a payload cipher binds of a message: the fields no node changes on the way.

use linkbus_plugin_api::{Message, Step};

use super::len_u8;

/// Headers nodes write on a message on its way, which [`associated_data`] leaves out: a
/// dead letter's marks and the size of a payload as written. Every other header is bound.
pub const UNBOUND_HEADERS: [&str; 4] = [
    "linkbus.dead_letter_code",
    "linkbus.dead_letter_reason",
    "linkbus.dead_letter_recipients",
    "linkbus.payload_bytes",
];

/// Appends what a payload cipher binds of `message` as associated data, for the steps
/// `before` the cipher's (which it binds too) and the cipher's own id `codec`: what no node
/// changes on the way.
///
/// Bound: the message id (source, sequence, creation time), kind, priority, whether results
/// are wanted, the name, the headers but [`UNBOUND_HEADERS`] (which nodes write on the way),
/// the group, the correlation id, and the codec steps. Not bound, as they change on the way: recipients (a relay splits a message per
/// next hop; the cipher binds each recipient's address itself), reliability (resolved by the
/// accepting node), the remaining lifetime and the hop count (every hop changes them), and a
/// consumer's redelivery marks.
pub fn associated_data(message: &Message, before: &[Step], codec: u8, out: &mut Vec<u8>) {
    let content = &message.content;
    let put_bytes = |out: &mut Vec<u8>, bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        out.extend_from_slice(bytes);
    };
    out.extend_from_slice(b"linkbus-ad-1");
    put_bytes(out, message.id.source.as_str().as_bytes());
    out.extend_from_slice(&message.id.sequence.to_be_bytes());
    out.extend_from_slice(&message.id.created_unix_ms.to_be_bytes());
    out.extend_from_slice(&[content.kind.code(), content.priority.code(), u8::from(content.results)]);
    put_bytes(out, content.name.as_bytes());
    let user = |(key, _): &&(String, String)| !UNBOUND_HEADERS.contains(&key.as_str());
    out.extend_from_slice(&(content.headers.iter().filter(user).count() as u64).to_be_bytes());
    for (key, value) in content.headers.iter().filter(user) {
        put_bytes(out, key.as_bytes());
        put_bytes(out, value.as_bytes());
    }
    match &content.group {
        None => out.push(0),
        Some(group) => {
            out.push(1);
            put_bytes(out, group.id.as_bytes());
            out.extend_from_slice(&group.index.to_be_bytes());
            out.push(u8::from(group.last));
        }
    }
    match &content.correlation_id {
        None => out.push(0),
        Some(id) => {
            out.push(1);
            put_bytes(out, id);
        }
    }
    out.push(len_u8(before.len()));
    for step in before {
        out.push(step.codec);
        put_bytes(out, &step.param);
    }
    out.push(codec);
}
