//! The client protocol spoken over the node's Unix socket: strictly one response per
//! request, in order, on each connection — except `Consume`, after which the node answers
//! with `Messages` whenever the queue has some, until the connection closes or an error
//! ends it.
//!
//! Every frame is a 4-byte big-endian length, a 1-byte type and a body. Requests: `Put`
//! (a batch of contents, accepted in order), `Get` (wait up to a time for messages from a
//! queue, acknowledged at once or handed out pending), `Follow` (copies of what came into a
//! queue after a key, without taking it), `Consume` (a standing `Get`: each
//! batch pushed as it comes, acknowledged at once), `Ack` / `Backout` (settle pending
//! messages by tag), `Results` (of messages put with results wanted, waiting for the final
//! ones), `Subscribe` / `Unsubscribe` / `Subscriptions` (event copies to a queue), `Begin` /
//! `Commit` / `Rollback` (a transaction on the connection), `Status`, `Plugins`, and `LinkReset` (accept
//! a peer's sequence numbers), `Limits`. Responses: `PutOk` (the ids given), `Messages` (with tags when
//! pending), `Settled`, `Results`, `Status` text, `Limits`, or `Error` with a code, the number of puts
//! accepted before the error, and a message. The protocol is not versioned: a client and its
//! node come from the same build.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use linkbus_plugin_api::{Address, Content, Message, MessageId, NodeName, QueueName};
use linkbus_proto::frame::{LENGTH_BYTES, put_length_prefixed};
use linkbus_proto::reader::{ReadError, Reader};
use linkbus_proto::wire::{
    Chunks, content_encoded_len, decode_message, encode_content_chunks, encode_message_chunks, read_content,
};

use crate::results::{MessageResults, Outcome};

const PUT: u8 = 1;
const GET: u8 = 2;
const STATUS: u8 = 3;
const LINK_RESET: u8 = 4;
const ACK: u8 = 5;
const QUEUES: u8 = 7;
const BROWSE: u8 = 8;
const BACKOUT: u8 = 6;
const RESULTS: u8 = 9;
const SUBSCRIBE: u8 = 10;
const UNSUBSCRIBE: u8 = 11;
const SUBSCRIPTIONS: u8 = 12;
const BEGIN: u8 = 13;
const COMMIT: u8 = 14;
const ROLLBACK: u8 = 15;
const ROUTE_EXPLAIN: u8 = 16;
const RELOAD: u8 = 17;
const CONSUME: u8 = 18;
const LIMITS: u8 = 19;
const FOLLOW: u8 = 20;
const PLUGINS: u8 = 21;
const SEND_FILE: u8 = 22;
const FILES: u8 = 23;
const FILES_ANSWER: u8 = 107;
const LIMITS_ANSWER: u8 = 106;
const RESULTS_ANSWER: u8 = 105;
const SETTLED: u8 = 104;
const PUT_OK: u8 = 101;
const MESSAGES: u8 = 102;
const STATUS_TEXT: u8 = 103;
const ERROR: u8 = 100;

/// How a get hands out members of message groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum GetGroups {
    /// Messages in queue order; a group's members only once every member has arrived.
    #[default]
    Complete = 0,
    /// One whole group (the first in queue order) and nothing else; none when no group is
    /// complete.
    Whole = 1,
    /// As `Complete`, then members of groups still arriving, one by one in index order.
    Members = 2,
}

impl GetGroups {
    fn from_code(code: u8) -> Result<Self, ReadError> {
        match code {
            0 => Ok(Self::Complete),
            1 => Ok(Self::Whole),
            2 => Ok(Self::Members),
            other => Err(ReadError::Invalid { field: "get group mode", detail: other.to_string() }),
        }
    }
}

/// A client request.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// Accept these contents, in order.
    Put {
        /// The contents.
        contents: Vec<Content>,
        /// How long a content may wait for room in a full queue (0: fail at once); never
        /// longer than the content's lifetime.
        timeout_ms: u64,
        /// A no-wait put: fails at once when a queue is full, and refuses persistent
        /// contents (nothing would vouch for them).
        no_wait: bool,
    },
    /// Take messages from a local queue.
    Get {
        /// The queue's name.
        queue: String,
        /// Most messages to return.
        count_max: u32,
        /// How long to wait for the first message, in milliseconds.
        wait_ms: u64,
        /// Largest encoded message the caller can take: a larger one at the head fails the
        /// get (it stays queued).
        bytes_max: u64,
        /// Hand the messages out pending: they leave the queue only when acknowledged, and
        /// come back if the connection ends first.
        pending: bool,
        /// How message groups are handed out.
        groups: GetGroups,
    },
    /// Take messages from a local queue as they come: the node answers with `Messages`
    /// (acknowledged at once) each time the queue has some, without further requests,
    /// until the connection closes; an `Error` (no such queue, a message over `bytes_max`)
    /// ends it, and the connection takes requests again. Not inside a transaction.
    Consume {
        /// The queue's name.
        queue: String,
        /// Most messages in one answer.
        count_max: u32,
        /// Largest encoded message the caller can take (as for `Get`).
        bytes_max: u64,
    },
    /// Describe the local queues (all, or the one named), answered with `Status` text.
    Queues {
        /// One queue's name, for its details; empty for a line per queue.
        name: String,
    },
    /// Copies of waiting messages, without taking them; answered with `Messages`.
    Browse {
        /// The queue.
        queue: String,
        /// Most messages.
        count_max: u32,
    },
    /// Copies of the messages that came into a queue after the one with key `after` (0:
    /// all), without taking them, waiting up to `wait_ms` for the first; answered with
    /// `Messages` whose tags are the messages' keys (the next `after`).
    Follow {
        /// The queue.
        queue: String,
        /// Key of the last message seen.
        after: u64,
        /// Most messages.
        count_max: u32,
        /// How long to wait for one.
        wait_ms: u64,
    },
    /// Acknowledge pending messages handed out on this connection.
    Ack {
        /// Their queue.
        queue: String,
        /// Their tags.
        tags: Vec<u64>,
    },
    /// Give pending messages handed out on this connection back to their queue.
    Backout {
        /// Their queue.
        queue: String,
        /// Their tags.
        tags: Vec<u64>,
    },
    /// What became of messages of this node put with results wanted, waiting up to
    /// `wait_ms` for their final results; answered with `Results`.
    Results {
        /// The node that accepted them (it keeps their results).
        source: String,
        /// Their sequence numbers.
        sequences: Vec<u64>,
        /// How long to wait for every final result, in milliseconds.
        wait_ms: u64,
    },
    /// Copy events of these kinds to a queue (replacing the kinds of an earlier client
    /// subscription of it); answered with `Status` text.
    Subscribe {
        /// The queue, `node:queue`.
        to: String,
        /// The kinds' names.
        kinds: Vec<String>,
    },
    /// End a client subscription; answered with `Status` text.
    Unsubscribe {
        /// The queue, `node:queue`.
        to: String,
    },
    /// List the subscriptions in force; answered with `Status` text.
    Subscriptions,
    /// Open a transaction on this connection: until `Commit` or `Rollback`, its puts are
    /// held and its gets taken pending; answered with `Settled(0)`.
    Begin,
    /// Queue the transaction's puts (all or none, waiting up to `timeout_ms` for room) and
    /// acknowledge its gets; answered with `Settled` (puts plus gets). A failed commit rolls
    /// the transaction back.
    Commit {
        /// How long to wait for room for all the puts together.
        timeout_ms: u64,
    },
    /// Drop the transaction's puts and give its gets back (redelivered, backout count
    /// raised); answered with `Settled` (puts plus gets).
    Rollback,
    /// Describe the node.
    Status,
    /// Accept the sequence numbers of a peer whose numbers went backwards, and restart a
    /// link stopped because of it. Answered with `Status` text.
    LinkReset {
        /// The peer's node name.
        peer: String,
    },
    /// How a message to `destination` would leave this node, and why. Answered with
    /// `Status` text.
    RouteExplain {
        /// The destination node's name.
        destination: String,
    },
    /// Read the configuration file again and take up its routes (a bad file is refused and
    /// the running configuration stays). Answered with `Status` text.
    Reload,
    /// List the plugins the node can select, where each comes from and which it uses
    /// (`Status` text).
    Plugins,
    /// Send a file from the node's files directory; answered with `PutOk` (the transfer's
    /// id).
    SendFile(crate::SendFile),
    /// The file transfers under way; answered with `Files`.
    Files,
    /// The node's size limits, so a client refuses what would be too large before sending
    /// it. Answered with `Limits`.
    Limits,
}

/// What went wrong with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum ErrorCode {
    /// The request is malformed.
    BadRequest = 1,
    /// The destination queue does not exist.
    UnknownQueue = 2,
    /// A queue or transmission queue is full.
    Full = 3,
    /// No link reaches the destination node.
    NoRoute = 4,
    /// A message is over a size limit.
    TooLarge = 5,
    /// A message field is invalid.
    Invalid = 6,
    /// The node failed (store error, shutting down).
    Internal = 7,
    /// The node holds as much as it may of something other than queued messages (results
    /// waited for): try again later.
    Busy = 8,
    /// A queue that rejects puts when full (`when_full: reject`) is full.
    Rejected = 9,
}

impl ErrorCode {
    fn from_u16(code: u16) -> Self {
        match code {
            1 => Self::BadRequest,
            2 => Self::UnknownQueue,
            3 => Self::Full,
            4 => Self::NoRoute,
            5 => Self::TooLarge,
            6 => Self::Invalid,
            8 => Self::Busy,
            9 => Self::Rejected,
            _ => Self::Internal,
        }
    }
}

/// A node's response.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// Every content of a `Put` was accepted.
    PutOk {
        /// The accepting node (the source of the ids).
        source: NodeName,
        /// The ids' sequence numbers, in put order.
        sequences: Vec<u64>,
        /// The ids' creation time.
        created_unix_ms: u64,
    },
    /// Messages from a `Get` (possibly none, after the wait), with their tags when handed
    /// out pending (else no tags).
    Messages {
        /// The messages.
        messages: Vec<Message>,
        /// Their tags, for `Ack` / `Backout`.
        tags: Vec<u64>,
    },
    /// How many messages an `Ack` or `Backout` settled.
    Settled(u32),
    /// The results asked for, in order (`None`: not tracked, or forgotten).
    Results(Vec<Option<MessageResults>>),
    /// `Status` text.
    Status(String),
    /// The file transfers under way.
    Files(Vec<crate::FileTransfer>),
    /// The node's size limits.
    Limits {
        /// Largest payload the node accepts (`messages.message_bytes_max`).
        message_bytes_max: u64,
        /// Largest request frame it reads; a larger one is answered `TooLarge` and dropped.
        frame_bytes_max: u64,
    },
    /// The request failed.
    Error {
        /// The cause.
        code: ErrorCode,
        /// For a `Put`: how many contents were accepted before the failing one.
        accepted: u32,
        /// What went wrong, for people.
        message: String,
    },
}

/// What `encode` writes into `chunks`, appended to `out` in one piece.
fn join_chunks(out: &mut BytesMut, encode: impl FnOnce(&mut Chunks)) {
    let (mut chunks, mut parts) = (Chunks::default(), Vec::new());
    encode(&mut chunks);
    chunks.take(&mut parts);
    out.reserve(parts.iter().map(Bytes::len).sum());
    parts.iter().for_each(|part| out.extend_from_slice(part));
}

/// A frame or message length as written.
fn frame_len(len: usize) -> u32 {
    u32::try_from(len).expect("frames are bounded below 4 GiB")
}

fn frame(kind: u8, out: &mut BytesMut, body: impl FnOnce(&mut BytesMut)) {
    put_length_prefixed(out, |out| {
        out.put_u8(kind);
        body(out);
    });
}

impl Request {
    /// Appends the encoded request into `out`, the payloads of large messages shared rather
    /// than copied (for a vectored write).
    pub fn encode_chunks(&self, out: &mut Chunks) {
        let Self::Put { contents, timeout_ms, no_wait } = self else { return self.encode(out.buf()) };
        let lens: usize = contents.iter().map(|c| LENGTH_BYTES + content_encoded_len(c)).sum();
        let head = out.buf();
        head.put_u32(frame_len(1 + 8 + 1 + 4 + lens));
        head.put_u8(PUT);
        head.put_u64(*timeout_ms);
        head.put_u8(u8::from(*no_wait));
        head.put_u32(contents.len() as u32);
        for c in contents {
            out.buf().put_u32(frame_len(content_encoded_len(c)));
            encode_content_chunks(c, out);
        }
    }

    /// Appends the encoded request.
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            // One layout, `encode_chunks`'s, joined.
            Self::Put { .. } => join_chunks(out, |chunks| self.encode_chunks(chunks)),
            Self::Get { queue, count_max, wait_ms, bytes_max, pending, groups } => frame(GET, out, |out| {
                put_name(out, queue);
                out.put_u32(*count_max);
                out.put_u64(*wait_ms);
                out.put_u64(*bytes_max);
                out.put_u8(u8::from(*pending));
                out.put_u8(*groups as u8);
            }),
            Self::Consume { queue, count_max, bytes_max } => frame(CONSUME, out, |out| {
                put_name(out, queue);
                out.put_u32(*count_max);
                out.put_u64(*bytes_max);
            }),
            Self::Ack { queue, tags } => frame(ACK, out, |out| put_tags(out, queue, tags)),
            Self::Queues { name } => frame(QUEUES, out, |out| put_name(out, name)),
            Self::Browse { queue, count_max } => frame(BROWSE, out, |out| {
                put_name(out, queue);
                out.put_u32(*count_max);
            }),
            Self::Follow { queue, after, count_max, wait_ms } => frame(FOLLOW, out, |out| {
                put_name(out, queue);
                out.put_u64(*after);
                out.put_u32(*count_max);
                out.put_u64(*wait_ms);
            }),
            Self::Backout { queue, tags } => frame(BACKOUT, out, |out| put_tags(out, queue, tags)),
            Self::Results { source, sequences, wait_ms } => frame(RESULTS, out, |out| {
                put_tags(out, source, sequences);
                out.put_u64(*wait_ms);
            }),
            Self::Subscribe { to, kinds } => frame(SUBSCRIBE, out, |out| {
                put_name(out, to);
                out.put_u8(kinds.len().min(255) as u8);
                kinds.iter().take(255).for_each(|k| put_name(out, k));
            }),
            Self::Unsubscribe { to } => frame(UNSUBSCRIBE, out, |out| put_name(out, to)),
            Self::Subscriptions => frame(SUBSCRIPTIONS, out, |_| {}),
            Self::Begin => frame(BEGIN, out, |_| {}),
            Self::Commit { timeout_ms } => frame(COMMIT, out, |out| out.put_u64(*timeout_ms)),
            Self::Rollback => frame(ROLLBACK, out, |_| {}),
            Self::Status => frame(STATUS, out, |_| {}),
            Self::LinkReset { peer } => frame(LINK_RESET, out, |out| put_name(out, peer)),
            Self::RouteExplain { destination } => frame(ROUTE_EXPLAIN, out, |out| put_name(out, destination)),
            Self::Reload => frame(RELOAD, out, |_| {}),
            Self::Plugins => frame(PLUGINS, out, |_| {}),
            Self::SendFile(send) => frame(SEND_FILE, out, |out| crate::files::put_send(out, send)),
            Self::Files => frame(FILES, out, |_| {}),
            Self::Limits => frame(LIMITS, out, |_| {}),
        }
    }

    /// Decodes a request body of type `kind`.
    ///
    /// # Errors
    /// [`ReadError`] for anything malformed.
    pub fn decode(kind: u8, body: Bytes) -> Result<Self, ReadError> {
        let mut r = Reader::new(body);
        let request = match kind {
            PUT => {
                let timeout_ms = r.u64()?;
                let no_wait = r.u8()? != 0;
                let count = r.u32()? as usize;
                // Each content takes at least 20 bytes, which bounds the allocation.
                let mut contents = Vec::with_capacity(count.min(r.remaining() / 20));
                for _ in 0..count {
                    let len = r.u32()? as usize;
                    // Kept in queues: short byte fields get buffers of their own, not
                    // slices of the request.
                    contents.push(r.detached_item(len, read_content)?);
                }
                Self::Put { contents, timeout_ms, no_wait }
            }
            GET => Self::Get {
                queue: r.short_string()?,
                count_max: r.u32()?,
                wait_ms: r.u64()?,
                bytes_max: r.u64()?,
                pending: r.u8()? != 0,
                // (Absent from a client older than groups: ordinary gets.)
                groups: if r.remaining() > 0 { GetGroups::from_code(r.u8()?)? } else { GetGroups::Complete },
            },
            CONSUME => Self::Consume { queue: r.short_string()?, count_max: r.u32()?, bytes_max: r.u64()? },
            QUEUES => Self::Queues { name: r.short_string()? },
            BROWSE => Self::Browse { queue: r.short_string()?, count_max: r.u32()? },
            FOLLOW => Self::Follow {
                queue: r.short_string()?,
                after: r.u64()?,
                count_max: r.u32()?,
                wait_ms: r.u64()?,
            },
            ACK => {
                let (queue, tags) = read_tags(&mut r)?;
                Self::Ack { queue, tags }
            }
            BACKOUT => {
                let (queue, tags) = read_tags(&mut r)?;
                Self::Backout { queue, tags }
            }
            RESULTS => {
                let (source, sequences) = read_tags(&mut r)?;
                Self::Results { source, sequences, wait_ms: r.u64()? }
            }
            SUBSCRIBE => {
                let to = r.short_string()?;
                let count = r.u8()?;
                let kinds = (0..count).map(|_| r.short_string()).collect::<Result<_, _>>()?;
                Self::Subscribe { to, kinds }
            }
            UNSUBSCRIBE => Self::Unsubscribe { to: r.short_string()? },
            SUBSCRIPTIONS => Self::Subscriptions,
            BEGIN => Self::Begin,
            COMMIT => Self::Commit { timeout_ms: r.u64()? },
            ROLLBACK => Self::Rollback,
            STATUS => Self::Status,
            LINK_RESET => Self::LinkReset { peer: r.short_string()? },
            ROUTE_EXPLAIN => Self::RouteExplain { destination: r.short_string()? },
            RELOAD => Self::Reload,
            PLUGINS => Self::Plugins,
            SEND_FILE => Self::SendFile(crate::files::read_send(&mut r)?),
            FILES => Self::Files,
            LIMITS => Self::Limits,
            other => return Err(ReadError::Invalid { field: "request type", detail: other.to_string() }),
        };
        r.finish()?;
        Ok(request)
    }
}

impl Response {
    /// Appends the encoded response into `out`, the payloads of large messages shared
    /// rather than copied (for a vectored write).
    pub fn encode_chunks(&self, out: &mut Chunks) {
        let Self::Messages { messages, tags } = self else { return self.encode(out.buf()) };
        let len = linkbus_proto::wire::encoded_len;
        let lens: usize = messages.iter().map(|m| LENGTH_BYTES + len(m)).sum();
        let head = out.buf();
        head.put_u32(frame_len(1 + 4 + lens + 4 + 8 * tags.len()));
        head.put_u8(MESSAGES);
        head.put_u32(messages.len() as u32);
        for m in messages {
            out.buf().put_u32(frame_len(len(m)));
            encode_message_chunks(m, out);
        }
        let tail = out.buf();
        tail.put_u32(tags.len() as u32);
        tags.iter().for_each(|t| tail.put_u64(*t));
    }

    /// Appends the encoded response.
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            Self::PutOk { source, sequences, created_unix_ms } => frame(PUT_OK, out, |out| {
                out.put_u8(source.as_str().len() as u8);
                out.put_slice(source.as_str().as_bytes());
                out.put_u64(*created_unix_ms);
                out.put_u32(sequences.len() as u32);
                sequences.iter().for_each(|s| out.put_u64(*s));
            }),
            Self::Messages { .. } => join_chunks(out, |chunks| self.encode_chunks(chunks)),
            Self::Settled(count) => frame(SETTLED, out, |out| out.put_u32(*count)),
            Self::Results(results) => frame(RESULTS_ANSWER, out, |out| {
                out.put_u32(results.len() as u32);
                results.iter().for_each(|r| put_results(out, r.as_ref()));
            }),
            Self::Status(text) => frame(STATUS_TEXT, out, |out| out.put_slice(text.as_bytes())),
            Self::Files(all) => frame(FILES_ANSWER, out, |out| crate::files::put_transfers(out, all)),
            Self::Limits { message_bytes_max, frame_bytes_max } => frame(LIMITS_ANSWER, out, |out| {
                out.put_u64(*message_bytes_max);
                out.put_u64(*frame_bytes_max);
            }),
            Self::Error { code, accepted, message } => frame(ERROR, out, |out| {
                out.put_u16(*code as u16);
                out.put_u32(*accepted);
                out.put_slice(message.as_bytes());
            }),
        }
    }

    /// Decodes a response body of type `kind`.
    ///
    /// # Errors
    /// [`ReadError`] for anything malformed.
    pub fn decode(kind: u8, body: Bytes) -> Result<Self, ReadError> {
        let mut r = Reader::new(body);
        let response = match kind {
            PUT_OK => {
                let source = r
                    .short_str(NodeName::new)?
                    .map_err(|e| ReadError::Invalid { field: "source", detail: e.to_string() })?;
                let created_unix_ms = r.u64()?;
                let count = r.u32()? as usize;
                let mut sequences = Vec::with_capacity(count.min(r.remaining() / 8));
                for _ in 0..count {
                    sequences.push(r.u64()?);
                }
                Self::PutOk { source, sequences, created_unix_ms }
            }
            MESSAGES => {
                let count = r.u32()? as usize;
                let mut messages = Vec::with_capacity(count.min(r.remaining() / 20));
                for _ in 0..count {
                    let len = r.u32()? as usize;
                    messages.push(decode_message(r.bytes(len)?)?);
                }
                let count = r.u32()? as usize;
                let mut tags = Vec::with_capacity(count.min(r.remaining() / 8));
                for _ in 0..count {
                    tags.push(r.u64()?);
                }
                Self::Messages { messages, tags }
            }
            SETTLED => Self::Settled(r.u32()?),
            RESULTS_ANSWER => {
                let count = r.u32()? as usize;
                let mut results = Vec::with_capacity(count.min(r.remaining()));
                for _ in 0..count {
                    results.push(read_results(&mut r)?);
                }
                Self::Results(results)
            }
            STATUS_TEXT => Self::Status(String::from_utf8_lossy(&r.rest()).into_owned()),
            FILES_ANSWER => Self::Files(crate::files::read_transfers(&mut r)?),
            LIMITS_ANSWER => Self::Limits { message_bytes_max: r.u64()?, frame_bytes_max: r.u64()? },
            ERROR => {
                let code = ErrorCode::from_u16(r.u16()?);
                let accepted = r.u32()?;
                Self::Error { code, accepted, message: String::from_utf8_lossy(&r.rest()).into_owned() }
            }
            other => return Err(ReadError::Invalid { field: "response type", detail: other.to_string() }),
        };
        r.finish()?;
        Ok(response)
    }
}

fn put_results(out: &mut BytesMut, results: Option<&MessageResults>) {
    let Some(results) = results else { return out.put_u8(0) };
    out.put_u8(1);
    put_name(out, results.id.source.as_str());
    out.put_u64(results.id.sequence);
    out.put_u64(results.id.created_unix_ms);
    out.put_u8(results.recipients.len() as u8);
    for (to, outcome) in &results.recipients {
        put_name(out, to.node.as_str());
        put_name(out, to.queue.as_str());
        out.put_u8(match outcome {
            None => 0,
            Some(Outcome::Delivered) => 1,
            Some(Outcome::Expired) => 2,
            Some(Outcome::Failed { .. }) => 3,
            Some(Outcome::TimedOut) => 4,
        });
        if let Some(Outcome::Failed { code, reason }) = outcome {
            put_name(out, code);
            let reason = &reason.as_bytes()[..reason.len().min(usize::from(u16::MAX))];
            out.put_u16(reason.len() as u16);
            out.put_slice(reason);
        }
    }
}

fn read_results(r: &mut Reader) -> Result<Option<MessageResults>, ReadError> {
    let invalid = |field, detail: String| ReadError::Invalid { field, detail };
    if r.u8()? == 0 {
        return Ok(None);
    }
    let source = r.short_str(NodeName::new)?.map_err(|e| invalid("source", e.to_string()))?;
    let id = MessageId { source, sequence: r.u64()?, created_unix_ms: r.u64()? };
    let count = r.u8()?;
    let mut recipients = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let node = r.short_str(NodeName::new)?.map_err(|e| invalid("node", e.to_string()))?;
        let queue = r.short_str(QueueName::new)?.map_err(|e| invalid("queue", e.to_string()))?;
        let outcome = match r.u8()? {
            0 => None,
            1 => Some(Outcome::Delivered),
            2 => Some(Outcome::Expired),
            3 => {
                let code = r.short_string()?;
                let len = usize::from(r.u16()?);
                Some(Outcome::Failed { code, reason: String::from_utf8_lossy(&r.bytes(len)?).into_owned() })
            }
            4 => Some(Outcome::TimedOut),
            other => return Err(invalid("outcome", other.to_string())),
        };
        recipients.push((Address::new(node, queue), outcome));
    }
    Ok(Some(MessageResults { id, recipients }))
}

fn put_name(out: &mut BytesMut, name: &str) {
    let bytes = name.as_bytes().get(..255).unwrap_or(name.as_bytes());
    out.put_u8(bytes.len() as u8);
    out.put_slice(bytes);
}

fn put_tags(out: &mut BytesMut, queue: &str, tags: &[u64]) {
    put_name(out, queue);
    out.put_u32(tags.len() as u32);
    tags.iter().for_each(|t| out.put_u64(*t));
}

fn read_tags(r: &mut Reader) -> Result<(String, Vec<u64>), ReadError> {
    let queue = r.short_string()?;
    let count = r.u32()? as usize;
    let mut tags = Vec::with_capacity(count.min(r.remaining() / 8));
    for _ in 0..count {
        tags.push(r.u64()?);
    }
    Ok((queue, tags))
}

/// Splits the next `(type, body)` frame off `buf`: `Ok(None)` when more bytes are needed.
///
/// # Errors
/// A message naming the declared length when it is zero or over `frame_bytes_max`.
pub fn split_frame(buf: &mut BytesMut, frame_bytes_max: usize) -> Result<Option<(u8, Bytes)>, String> {
    let Some(prefix) = buf.get(..4) else { return Ok(None) };
    let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
    if len == 0 || len > frame_bytes_max {
        return Err(format!("frame of {len} bytes is outside 1..={frame_bytes_max}"));
    }
    if buf.len() < 4 + len {
        buf.reserve(4 + len - buf.len());
        return Ok(None);
    }
    buf.advance(4);
    let mut body = buf.split_to(len).freeze();
    let kind = body.get_u8();
    Ok(Some((kind, body)))
}

#[cfg(test)]
mod tests;
