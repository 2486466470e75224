//! A consumer the node pushes a queue's messages to as they come ([`Client::consume`]).

use std::time::Duration;

use bytes::BytesMut;
use linkbus_plugin_api::Message;
use tokio::net::UnixStream;

use super::{Client, ClientError, To, read_response, send};
use crate::protocol::{GetGroups, Request, Response};

/// How long an in-process consumer's get waits before it asks again.
const IN_PROCESS_WAIT: Duration = Duration::from_secs(1);

/// Takes the messages of one local queue as they come: over the socket, the node pushes
/// each batch without being asked again, so a message waiting for a consumer costs no
/// request and no round trip. Made by [`Client::consume`]; the connection is the
/// consumer's until it drops.
///
/// As with [`Client::get`], messages leave the queue as they are handed out (automatic
/// acknowledgement): those the node has written to a consumer that then ends are gone —
/// at most what the socket holds and one batch, as the node writes a batch only once the
/// one before is in the socket. For messages that must survive their consumer, take them
/// with [`Client::get_pending`] and acknowledge them.
#[derive(Debug)]
pub struct Consumer {
    to: Pushed,
    /// An error ended the consumer: it takes nothing more.
    ended: bool,
}

#[derive(Debug)]
enum Pushed {
    /// The node pushes answers on the socket.
    Socket { stream: UnixStream, buf: BytesMut },
    /// An in-process client waits for each batch instead (no socket to push on).
    InProcess { client: Box<Client>, queue: String, count_max: u32, bytes_max: u64 },
}

impl Client {
    /// Turns this connection into a [`Consumer`] of the local queue `queue`: batches of up
    /// to `count_max` messages as they come, none encoded over `bytes_max` (a larger one at
    /// the head ends the consumer with [`ClientError::Refused`], code `TooLarge`, and
    /// stays in the queue).
    ///
    /// # Errors
    /// [`ClientError::Protocol`] when puts made with [`Client::put_async`] were not
    /// flushed (their outcomes would be lost); [`ClientError::Broken`] or
    /// [`ClientError::Io`] for the connection. A queue that does not exist fails the
    /// consumer's first [`Consumer::next`].
    pub async fn consume(
        mut self,
        queue: &str,
        count_max: u32,
        bytes_max: u64,
    ) -> Result<Consumer, ClientError> {
        // (A transaction guard dropped without commit is rolled back first.)
        if !self.broken {
            self.settle_rollback().await?;
        }
        if self.broken {
            return Err(ClientError::Broken);
        }
        if self.unanswered > 0 || !self.outcomes.is_empty() {
            return Err(ClientError::Protocol(
                "flush the puts made with put_async before consuming on their connection".into(),
            ));
        }
        let to = match self.to {
            To::Socket { mut stream, buf, mut out, mut parts } => {
                let request = Request::Consume { queue: queue.to_owned(), count_max, bytes_max };
                send(&mut stream, &mut out, &mut parts, &request).await?;
                Pushed::Socket { stream, buf }
            }
            to @ To::InProcess(..) => {
                let client = Box::new(Client { to, ..self });
                Pushed::InProcess { client, queue: queue.to_owned(), count_max, bytes_max }
            }
        };
        Ok(Consumer { to, ended: false })
    }
}

impl Consumer {
    /// The next batch of messages, waiting for as long as it takes (never empty).
    ///
    /// Over the socket it is cancel-safe (a batch half read stays for the next call); an
    /// in-process consumer's call must not be abandoned, as a `get`'s must not, and ends
    /// with [`ClientError::Refused`] once its node shuts down.
    ///
    /// # Errors
    /// [`ClientError::Refused`] when the queue does not exist, a message is over the
    /// consumer's `bytes_max` or (code `Internal`) the node shuts down,
    /// [`ClientError::Io`] or [`ClientError::Protocol`] for the
    /// connection: each ends the consumer, and later calls fail with
    /// [`ClientError::Ended`].
    pub async fn next(&mut self) -> Result<Vec<Message>, ClientError> {
        if self.ended {
            return Err(ClientError::Ended);
        }
        let next = match &mut self.to {
            Pushed::Socket { stream, buf } => loop {
                match read_response(stream, buf).await {
                    Ok(Response::Messages { messages, .. }) if messages.is_empty() => {}
                    Ok(Response::Messages { messages, .. }) => break Ok(messages),
                    Ok(Response::Error { code, accepted, message }) => {
                        break Err(ClientError::Refused { code, accepted, message });
                    }
                    Ok(other) => {
                        break Err(ClientError::Protocol(format!("unexpected answer to consume: {other:?}")));
                    }
                    Err(e) => break Err(e),
                }
            },
            // A second at a time, so a node that shuts down ends it (its calls are refused).
            Pushed::InProcess { client, queue, count_max, bytes_max } => {
                let wait = IN_PROCESS_WAIT;
                loop {
                    match client
                        .get_request(queue, *count_max, wait, *bytes_max, false, GetGroups::Complete)
                        .await
                    {
                        Ok((messages, _)) if messages.is_empty() => {}
                        Ok((messages, _)) => break Ok(messages),
                        Err(e) => break Err(e),
                    }
                }
            }
        };
        self.ended = next.is_err();
        next
    }
}
