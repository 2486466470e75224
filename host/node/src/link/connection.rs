//! The link's connection: adopting one (dialed or accepted), its events, dropping it, and the
//! shutdown.

use super::*;

pub(super) struct Active {
    pub(super) id: u64,
    pub(super) dialed_by_us: bool,
    /// Encrypts what the session writes, decrypts what the reader reads.
    pub(super) secure: SecureChannel,
    /// The connection's writing half, written to directly while `backlog` is empty.
    pub(super) writer: io::SharedWriter,
    /// What waits for the writer task.
    pub(super) to_writer: mpsc::UnboundedSender<Vec<Bytes>>,
    /// Bytes sent to `to_writer` and not yet written.
    pub(super) backlog: Arc<AtomicUsize>,
    /// Read by the link task itself (one wake-up less per chunk than a reader task).
    pub(super) reader: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    /// Where reads land; each chunk read is split off it.
    pub(super) read_buf: bytes::BytesMut,
}

impl Active {
    /// Writes `chunks` to the socket at once when they are few ([`DIRECT_WRITE_BYTES_MAX`])
    /// and nothing waits for the writer task; hands the writer what is left in one go (one
    /// count, at most one wake-up), counted in the backlog until written.
    ///
    /// # Errors
    /// The socket's, from a write at once (the connection is then done for).
    pub(super) fn write(&self, mut chunks: Vec<Bytes>) -> std::io::Result<()> {
        let mut len: usize = chunks.iter().map(Bytes::len).sum();
        if len <= DIRECT_WRITE_BYTES_MAX
            && self.backlog.load(Ordering::Acquire) == 0
            && let Ok(mut writer) = self.writer.try_lock()
            && let Some(writer) = writer.as_mut()
        {
            linkbus_client::vectored::write_now(writer, &mut chunks)?;
            if chunks.is_empty() {
                return Ok(());
            }
            len = chunks.iter().map(Bytes::len).sum();
        }
        self.backlog.fetch_add(len, Ordering::Relaxed);
        if self.to_writer.send(chunks).is_err() {
            // The writer is gone (its connection failed): nothing will drain these bytes.
            self.backlog.fetch_sub(len, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl Link {
    /// Takes up an operator's reset of a stopped link: the next handshake takes the peer's
    /// numbers, and the link dials again at once. Returns why the link is still stopped, if
    /// it is.
    pub(super) fn apply_reset(&mut self) -> Option<String> {
        match self.handle.gate() {
            Gate::Open => None,
            Gate::Stopped(reason) => Some(reason),
            Gate::Reset => {
                warn!(
                    peer = self.peer(),
                    "Link reset by the operator: the next handshake takes the peer's numbers."
                );
                self.session.reset_numbers();
                self.backoff.reset();
                if self.handle.peer.address.is_some() {
                    self.next_dial = Some(tokio::time::Instant::now());
                }
                None
            }
        }
    }

    /// Takes a new connection, unless the link is stopped or the session prefers the
    /// current one.
    pub(super) fn adopt(&mut self, incoming: Incoming, dialed_by_us: bool) {
        if let Some(reason) = self.apply_reset() {
            let reason = format!(
                "the link is stopped on {} ({reason}); an operator must run `linkbus link reset {}` there",
                self.node.name(),
                self.peer()
            );
            refuse(incoming.connection, Some(incoming.secure), CloseCode::ProtocolError, &reason);
            return;
        }
        if let Some(current) = &self.active {
            let peer = incoming.hello.as_ref().map(|h| (h.incarnation, h.run));
            if !self.session.should_replace(current.dialed_by_us, dialed_by_us, peer) {
                debug!(peer = self.peer(), "Duplicate connection refused.");
                let reason = "a connection to this peer already exists";
                refuse(incoming.connection, Some(incoming.secure), CloseCode::Duplicate, reason);
                return;
            }
            debug!(peer = self.peer(), "Connection replaced by a newer one.");
            self.active = None;
            self.handle.up.store(false, Ordering::Relaxed);
            self.session.handle_disconnected();
        }
        let Incoming { connection, hello, leftover, secure } = incoming;
        let id = self.next_conn_id;
        self.next_conn_id += 1;
        debug!(peer = self.peer(), address = %connection.peer_address, dialed_by_us, "Connection open.");
        let (writer_tx, writer_rx) = mpsc::unbounded_channel();
        let backlog = Arc::new(AtomicUsize::new(0));
        let events = self.conn_tx.clone();
        let writer: io::SharedWriter = Arc::new(std::sync::Mutex::new(Some(connection.writer)));
        tokio::spawn(write_loop(
            writer.clone(),
            writer_rx,
            backlog.clone(),
            self.drained.clone(),
            id,
            events,
            io::LET_GO_WRITE_GRACE,
        ));
        self.active = Some(Active {
            id,
            dialed_by_us,
            secure,
            writer,
            to_writer: writer_tx,
            backlog,
            reader: connection.reader,
            read_buf: bytes::BytesMut::new(),
        });
        let now = Instant::now();
        self.session.handle_connected(now);
        if let Some(hello) = hello {
            self.session.handle_frame(Frame::Hello(hello), now);
        }
        if !leftover.is_empty() {
            self.session.handle_bytes(&leftover, now);
        }
    }

    pub(super) fn connection_event(&mut self, id: u64, event: ConnEvent) {
        if self.active.as_ref().is_none_or(|a| a.id != id) {
            return;
        }
        match event {
            ConnEvent::Bytes(bytes) => {
                let Some(active) = self.active.as_mut() else { return };
                if let Err(e) = active.secure.handle_received(bytes) {
                    if self.node.warnings().admit(reason::LINK_CLOSED) {
                        warn!(peer = self.peer(), error = %e, "Secure channel failed.");
                    }
                    return self.drop_connection(&e.to_string());
                }
                while let Some(plain) = self.active.as_mut().and_then(|a| a.secure.take_plaintext()) {
                    self.session.handle_received(plain, Instant::now());
                }
            }
            ConnEvent::Closed(reason) => self.drop_connection(&reason),
        }
    }

    pub(super) fn drop_connection(&mut self, reason: &str) {
        if self.active.take().is_none() {
            return;
        }
        self.handle.note_down();
        self.handle.note_error(reason);
        if self.handle.up.swap(false, Ordering::Relaxed) {
            info!(peer = self.peer(), reason, "Link down.");
            self.node.emit(
                Event::new(EventKind::LinkDown, format!("link to {} down: {reason}", self.peer()))
                    .with("peer", self.peer())
                    .with("reason", reason),
            );
        } else {
            debug!(peer = self.peer(), reason, "Connection closed.");
        }
        self.session.handle_disconnected();
        if self.handle.peer.address.is_some() {
            let after = tokio::time::Instant::now() + self.backoff.take();
            self.next_dial = Some(self.redial_not_before.take().map_or(after, |busy| busy.max(after)));
        }
    }

    /// Writes a `Close` frame on the connection, if there is one.
    pub(super) fn send_close(&mut self, code: CloseCode, reason: String) {
        let Some(active) = self.active.as_mut() else { return };
        let mut out = BytesMut::new();
        Frame::Close { code: code as u16, reason }.encode(&mut out);
        if active.secure.send(&out).is_ok()
            && let Some(bytes) = active.secure.poll_transmit()
        {
            let _ = active.write(vec![bytes]);
        }
    }

    pub(super) async fn shutdown(mut self) {
        // Acknowledgements waiting for company go first: the peer must not send again what
        // was delivered here (it would arrive twice after a restart).
        self.session.flush_acks();
        self.write_transmit();
        // Every number delivered here is recorded (the node syncs the store last), the
        // volatile messages' too: a clean restart expects exactly the next ones.
        self.recorded.batch_delivered(&self.node, &self.delivered_through);
        if self.active.is_some() {
            self.send_close(CloseCode::Shutdown, "node shutting down".into());
            self.active = None;
            // Give the writer a moment to send the close frame.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
