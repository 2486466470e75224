//! File messages from a client's side: sending a file from the node's files directory and
//! listing the transfers under way.

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use linkbus_plugin_api::{MessageId, NodeName};
use linkbus_proto::reader::{ReadError, Reader};

use crate::protocol::{Request, Response};
use crate::results::MessageResults;
use crate::{Client, ClientError};

/// A file to send: `source` under the node's files directory, to queues `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendFile {
    /// The file, relative to the sending node's files directory.
    pub source: String,
    /// The name it takes at the recipients (relative to their files directory); `None`
    /// keeps `source`.
    pub name: Option<String>,
    /// The recipient queues, `node:queue`.
    pub to: Vec<String>,
    /// Priority level of its chunks, 0..=9.
    pub priority: u8,
    /// Its lifetime in milliseconds, covering the whole transfer; `None` takes the node's
    /// default.
    pub lifetime_ms: Option<u64>,
    /// Remove the source once every recipient confirmed it has the whole file.
    pub delete_after: bool,
}

impl SendFile {
    /// `source` to `to`, with the defaults: the same name, priority 4, the node's lifetime,
    /// the source kept.
    pub fn new(source: impl Into<String>, to: impl Into<String>) -> Self {
        Self {
            source: source.into(),
            name: None,
            to: vec![to.into()],
            priority: 4,
            lifetime_ms: None,
            delete_after: false,
        }
    }
}

/// Which way a transfer goes, seen from the node asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileDirection {
    /// This node sends it.
    Out,
    /// This node receives it.
    In,
}

/// One transfer under way (for each recipient, at the origin).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileTransfer {
    /// The transfer's id (its origin's).
    pub id: MessageId,
    /// Out or in.
    pub direction: FileDirection,
    /// Out: the recipient, `node:queue`; in: the queue it is for.
    pub peer: String,
    /// The name it takes at the recipient.
    pub name: String,
    /// Its size.
    pub size: u64,
    /// Out: bytes the recipient confirmed; in: bytes written and checked.
    pub done_bytes: u64,
    /// Why it waits, if it does (a full disk at the recipient).
    pub note: String,
}

fn put_text(out: &mut BytesMut, text: &str) {
    let bytes = text.as_bytes().get(..u16::MAX as usize).unwrap_or(text.as_bytes());
    out.put_u16(bytes.len() as u16);
    out.put_slice(bytes);
}

fn read_text(r: &mut Reader) -> Result<String, ReadError> {
    let len = r.u16()? as usize;
    r.string(len)
}

pub(crate) fn put_send(out: &mut BytesMut, send: &SendFile) {
    put_text(out, &send.source);
    put_text(out, send.name.as_deref().unwrap_or(""));
    out.put_u8(send.to.len().min(255) as u8);
    send.to.iter().take(255).for_each(|to| put_text(out, to));
    out.put_u8(send.priority);
    out.put_u64(send.lifetime_ms.unwrap_or(u64::MAX));
    out.put_u8(u8::from(send.delete_after));
}

pub(crate) fn read_send(r: &mut Reader) -> Result<SendFile, ReadError> {
    let source = read_text(r)?;
    let name = Some(read_text(r)?).filter(|n| !n.is_empty());
    let count = r.u8()?;
    let to = (0..count).map(|_| read_text(r)).collect::<Result<_, _>>()?;
    let priority = r.u8()?;
    let lifetime_ms = Some(r.u64()?).filter(|l| *l != u64::MAX);
    let delete_after = r.u8()? != 0;
    Ok(SendFile { source, name, to, priority, lifetime_ms, delete_after })
}

pub(crate) fn put_transfers(out: &mut BytesMut, all: &[FileTransfer]) {
    out.put_u32(all.len() as u32);
    for t in all {
        put_text(out, t.id.source.as_str());
        out.put_u64(t.id.sequence);
        out.put_u64(t.id.created_unix_ms);
        out.put_u8(u8::from(t.direction == FileDirection::In));
        put_text(out, &t.peer);
        put_text(out, &t.name);
        out.put_u64(t.size);
        out.put_u64(t.done_bytes);
        put_text(out, &t.note);
    }
}

pub(crate) fn read_transfers(r: &mut Reader) -> Result<Vec<FileTransfer>, ReadError> {
    let count = r.u32()? as usize;
    let mut all = Vec::with_capacity(count.min(r.remaining() / 40));
    for _ in 0..count {
        let source = read_text(r)?;
        let source = NodeName::new(&source)
            .map_err(|e| ReadError::Invalid { field: "source", detail: e.to_string() })?;
        let id = MessageId { source, sequence: r.u64()?, created_unix_ms: r.u64()? };
        let direction = if r.u8()? == 0 { FileDirection::Out } else { FileDirection::In };
        all.push(FileTransfer {
            id,
            direction,
            peer: read_text(r)?,
            name: read_text(r)?,
            size: r.u64()?,
            done_bytes: r.u64()?,
            note: read_text(r)?,
        });
    }
    Ok(all)
}

impl Client {
    /// Sends a file from the node's files directory (see [`SendFile`]): answered once the
    /// transfer is recorded, with its id. Its results (one per recipient: delivered, or
    /// failed with the reason) come as a message's do: [`Client::results`] waits for them,
    /// and [`Client::file_transfers`] shows the progress meanwhile.
    ///
    /// # Errors
    /// [`ClientError::Refused`]: a name breaking a rule, a file that cannot be read, a
    /// recipient without a way there.
    pub async fn send_file(&mut self, send: SendFile) -> Result<MessageId, ClientError> {
        match self.call(Request::SendFile(send)).await? {
            Response::PutOk { source, sequences, created_unix_ms } if sequences.len() == 1 => {
                Ok(MessageId { source, sequence: sequences[0], created_unix_ms })
            }
            other => Err(ClientError::Protocol(format!("unexpected answer to send file: {other:?}"))),
        }
    }

    /// The transfers under way at the node, both ways.
    ///
    /// # Errors
    /// As any request.
    pub async fn file_transfers(&mut self) -> Result<Vec<FileTransfer>, ClientError> {
        match self.call(Request::Files).await? {
            Response::Files(all) => Ok(all),
            other => Err(ClientError::Protocol(format!("unexpected answer to files: {other:?}"))),
        }
    }

    /// Sends a file and waits up to `wait` for every recipient's result.
    ///
    /// # Errors
    /// As [`Client::send_file`] and [`Client::results`].
    pub async fn send_file_and_wait(
        &mut self,
        send: SendFile,
        wait: Duration,
    ) -> Result<(MessageId, Option<MessageResults>), ClientError> {
        let id = self.send_file(send).await?;
        let results = self.results(std::slice::from_ref(&id), wait).await?.pop().flatten();
        Ok((id, results))
    }
}
