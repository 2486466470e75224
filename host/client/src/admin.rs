//! The requests of a client that are not about messages: the node's queues, links and
//! routes, its configuration, results, transactions, event subscriptions, limits and status.

use std::time::Duration;

use linkbus_plugin_api::MessageId;

use crate::protocol::{ErrorCode, Request, Response};
use crate::results::MessageResults;
use crate::{Client, ClientError, NodeLimits, PUT_ANSWER_MARGIN};

impl Client {
    /// A table of the node's queues (`name` empty), or one queue's details: depth per
    /// priority, pending messages, age of the oldest.
    ///
    /// # Errors
    /// [`ClientError::Refused`] when the named queue does not exist.
    pub async fn queues(&mut self, name: &str) -> Result<String, ClientError> {
        self.text(Request::Queues { name: name.to_owned() }, "queues").await
    }

    /// Accepts the sequence numbers of `peer` as they are and restarts the link if it was
    /// stopped because they went backwards; returns the node's answer.
    ///
    /// # Errors
    /// [`ClientError::Refused`] when the node has no link to `peer`.
    pub async fn reset_link(&mut self, peer: &str) -> Result<String, ClientError> {
        self.text(Request::LinkReset { peer: peer.to_owned() }, "link reset").await
    }

    /// How a message to `destination` would leave the node, and why (lines for people).
    ///
    /// # Errors
    /// [`ClientError::Refused`] for a name that is not a node name.
    pub async fn explain_route(&mut self, destination: &str) -> Result<String, ClientError> {
        self.text(Request::RouteExplain { destination: destination.to_owned() }, "route explain").await
    }

    /// Makes the node read its configuration file again and take up the routes in it;
    /// returns what changed.
    ///
    /// # Errors
    /// [`ClientError::Refused`] when the file is bad (every problem is named) or the node
    /// was not started from a file; the running configuration stays.
    pub async fn reload(&mut self) -> Result<String, ClientError> {
        self.text(Request::Reload, "reload").await
    }

    /// The plugins the node can select (built in, or from the native libraries its
    /// configuration names), which it uses, and each running filter's module, as a table.
    ///
    /// # Errors
    /// [`ClientError`] when the node cannot be reached.
    pub async fn plugins(&mut self) -> Result<String, ClientError> {
        self.text(Request::Plugins, "plugins").await
    }

    /// What became of messages this node accepted with results wanted
    /// ([`Content::with_results`]), one entry per id in order: each recipient with its final
    /// outcome, or `None` while it is open. Waits up to `wait` for every outcome to be final
    /// (zero: answers at once). An entry is `None` when the node does not know the message
    /// (it wanted no results, or finished too long ago).
    ///
    /// # Errors
    /// [`ClientError::Refused`] when an id is not from this node (results are kept by the
    /// node that accepted the message), or (code `Internal`) when the node shuts down while
    /// the call waits.
    pub async fn results(
        &mut self,
        ids: &[MessageId],
        wait: Duration,
    ) -> Result<Vec<Option<MessageResults>>, ClientError> {
        const CHUNK: usize = 10_000;
        let deadline = tokio::time::Instant::now() + wait;
        let mut all = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(CHUNK) {
            let Some(first) = chunk.first() else { break };
            if let Some(other) = chunk.iter().find(|id| id.source != first.source) {
                return Err(ClientError::Refused {
                    code: ErrorCode::BadRequest,
                    accepted: 0,
                    message: format!(
                        "ids from {} and {} in one request: ask each node",
                        first.source, other.source
                    ),
                });
            }
            let wait_ms = deadline.saturating_duration_since(tokio::time::Instant::now()).as_millis() as u64;
            let request = Request::Results {
                source: first.source.to_string(),
                sequences: chunk.iter().map(|id| id.sequence).collect(),
                wait_ms,
            };
            match self.call(request).await? {
                Response::Results(results) if results.len() == chunk.len() => all.extend(results),
                other => {
                    return Err(ClientError::Protocol(format!("unexpected answer to results: {other:?}")));
                }
            }
        }
        Ok(all)
    }

    /// Opens a transaction on this connection (one at a time): until [`Client::commit`] or
    /// [`Client::rollback`], puts are checked and given ids but held, and gets take messages
    /// that leave their queue only at commit. Several queues, here and on peers, can take
    /// part. If the connection ends first, the transaction is rolled back.
    ///
    /// # Errors
    /// [`ClientError::Refused`] when a transaction is already open.
    pub async fn begin(&mut self) -> Result<(), ClientError> {
        self.settle(Request::Begin, "begin").await.map(|_| ())
    }

    /// Commits the open transaction: all its puts are queued (waiting up to the put timeout
    /// for room for all of them together; their lifetimes count from now) and its gets are
    /// acknowledged. Returns how many messages it put and got.
    ///
    /// With no transaction open it does nothing and returns 0 (as MQ's MQCMIT does), so
    /// check the count after a commit that might repeat one already ended.
    ///
    /// # Errors
    /// [`ClientError::Refused`] when the puts could not all be queued: the transaction is
    /// then rolled back (nothing put, the gets given back).
    pub async fn commit(&mut self) -> Result<u32, ClientError> {
        let timeout_ms = self.put_timeout.as_millis() as u64;
        let limit = self.put_timeout + PUT_ANSWER_MARGIN;
        self.settle_unanswered(0).await?;
        let Ok(answer) = tokio::time::timeout(limit, self.call(Request::Commit { timeout_ms })).await else {
            return Err(ClientError::OutcomeUnknown(limit));
        };
        match answer? {
            Response::Settled(count) => Ok(count),
            other => Err(ClientError::Protocol(format!("unexpected answer to commit: {other:?}"))),
        }
    }

    /// Rolls the open transaction back: its puts are dropped, its gets go back to their
    /// queues (marked redelivered, backout count raised). Returns how many messages it held.
    ///
    /// With no transaction open it does nothing and returns 0.
    ///
    /// # Errors
    /// [`ClientError`] when the call fails.
    pub async fn rollback(&mut self) -> Result<u32, ClientError> {
        self.settle(Request::Rollback, "rollback").await
    }

    /// Copies events of `kinds` (names such as `link_down`, `result`, or `all`) to queue
    /// `to` (`node:queue`, here or on a peer) from now on, replacing the kinds of an earlier
    /// client subscription of that queue. The node keeps it in its store.
    ///
    /// # Errors
    /// [`ClientError::Refused`] for an unknown kind, a queue that does not exist or is not
    /// reachable, or one the configuration subscribes.
    pub async fn subscribe(&mut self, to: &str, kinds: &[&str]) -> Result<String, ClientError> {
        let request =
            Request::Subscribe { to: to.to_owned(), kinds: kinds.iter().map(|k| (*k).to_owned()).collect() };
        self.text(request, "subscribe").await
    }

    /// Ends the client subscription of queue `to`.
    ///
    /// # Errors
    /// [`ClientError::Refused`] when it has none (or the configuration declares it).
    pub async fn unsubscribe(&mut self, to: &str) -> Result<String, ClientError> {
        self.text(Request::Unsubscribe { to: to.to_owned() }, "unsubscribe").await
    }

    /// The subscriptions in force, one line each: queue, kinds, and whether the
    /// configuration or a client made it.
    ///
    /// # Errors
    /// [`ClientError`] when the call fails.
    pub async fn subscriptions(&mut self) -> Result<String, ClientError> {
        self.text(Request::Subscriptions, "subscriptions").await
    }

    async fn text(&mut self, request: Request, what: &str) -> Result<String, ClientError> {
        match self.call(request).await? {
            Response::Status(text) => Ok(text),
            other => Err(ClientError::Protocol(format!("unexpected answer to {what}: {other:?}"))),
        }
    }

    /// The node's size limits (asked once per connection).
    ///
    /// # Errors
    /// [`ClientError`] when the call fails.
    pub async fn limits(&mut self) -> Result<NodeLimits, ClientError> {
        if let Some(limits) = self.limits {
            return Ok(limits);
        }
        let limits = match self.call(Request::Limits).await? {
            Response::Limits { message_bytes_max, frame_bytes_max } => {
                NodeLimits { message_bytes_max, frame_bytes_max }
            }
            other => return Err(ClientError::Protocol(format!("unexpected answer to limits: {other:?}"))),
        };
        self.limits = Some(limits);
        Ok(limits)
    }

    /// The node's status: links, queues, store.
    ///
    /// # Errors
    /// [`ClientError`] when the call fails.
    pub async fn status(&mut self) -> Result<String, ClientError> {
        self.text(Request::Status, "status").await
    }
}
