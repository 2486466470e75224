//! The byte movers of a connection: a reader task, and a writing side that the link task
//! writes to while the socket takes the bytes at once and a writer task finishes otherwise
//! (so reading never waits on writing); and refusing a connection with a `Close` frame.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Buf, Bytes, BytesMut};
use linkbus_plugin_api::Connection;
use linkbus_proto::frame::{CloseCode, Frame};
use linkbus_proto::secure::SecureChannel;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, mpsc};

/// What a connection's tasks report to the link task.
pub(crate) enum ConnEvent {
    /// Bytes read.
    Bytes(Bytes),
    /// The connection ended, and why.
    Closed(String),
}

/// Room for one read: large, so that most frames arrive whole in one chunk and pass on
/// as slices of it (a frame split between two reads is copied together).
const READ_BYTES: usize = 256 * 1024;

/// Reads until the connection ends, handing chunks to the link task (bounded channel, so
/// a slow link task slows the peer down through TCP).
pub(crate) async fn read_loop(
    mut reader: Box<dyn AsyncRead + Send + Unpin>,
    id: u64,
    events: mpsc::Sender<(u64, ConnEvent)>,
) {
    let mut buf = BytesMut::with_capacity(READ_BYTES);
    loop {
        if buf.capacity() < READ_BYTES / 4 {
            buf.reserve(READ_BYTES);
        }
        let event = match reader.read_buf(&mut buf).await {
            Ok(0) => ConnEvent::Closed("connection closed by peer".into()),
            Ok(_) => ConnEvent::Bytes(buf.split().freeze()),
            Err(e) => ConnEvent::Closed(format!("read failed: {e}")),
        };
        let last = matches!(event, ConnEvent::Closed(_));
        if events.send((id, event)).await.is_err() || last {
            return;
        }
    }
}

/// A connection's writing side, shared by the link task and a writer task. While nothing
/// waits, the link task writes straight into the socket (no hand-over, no wake-up); what
/// the socket does not take at once waits for the writer task, which writes it out in
/// vectored writes, in order, and everything sent meanwhile waits behind it.
pub(crate) struct Output {
    shared: Arc<Shared>,
}

struct Shared {
    state: std::sync::Mutex<OutputState>,
    /// Wakes the writer task: bytes wait, or the connection is done.
    work: Notify,
    /// Wakes a writer task stuck in a write: the connection is done.
    closed: Notify,
    /// Bytes waiting and not yet written (the link task stops producing above its limit).
    backlog: AtomicUsize,
}

struct OutputState {
    /// `None` while the writer task is writing with it.
    writer: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    /// Chunks the socket did not take yet, in order.
    waiting: Vec<Bytes>,
    /// The link is done with this connection: write what waits, then shut down.
    closing: bool,
    /// A write failed: the connection is dead and takes nothing more.
    failed: bool,
}

impl Output {
    /// Starts the writer task of a connection; it wakes `drained` as its backlog drains, and
    /// reports a failed write to the link task as `id`'s end.
    pub(crate) fn start(
        writer: Box<dyn AsyncWrite + Send + Unpin>,
        drained: Arc<Notify>,
        id: u64,
        events: mpsc::Sender<(u64, ConnEvent)>,
    ) -> Self {
        let shared = Arc::new(Shared {
            state: std::sync::Mutex::new(OutputState {
                writer: Some(writer),
                waiting: Vec::new(),
                closing: false,
                failed: false,
            }),
            work: Notify::new(),
            closed: Notify::new(),
            backlog: AtomicUsize::new(0),
        });
        tokio::spawn(write_loop(shared.clone(), drained, id, events));
        Self { shared }
    }

    /// Bytes waiting for the writer task.
    pub(crate) fn backlog(&self) -> usize {
        self.shared.backlog.load(Ordering::Relaxed)
    }

    /// Writes `chunks` (empty afterwards): as much as the socket takes now, when nothing
    /// waits before them; the rest goes to the writer task.
    ///
    /// # Errors
    /// The socket's error when writing now failed; the connection is dead then.
    pub(crate) fn send(&self, chunks: &mut Vec<Bytes>) -> std::io::Result<()> {
        chunks.retain(|chunk| !chunk.is_empty());
        if chunks.is_empty() {
            return Ok(());
        }
        let mut state = self.shared.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.failed {
            // The writer task reported the end already.
            chunks.clear();
            return Ok(());
        }
        if state.waiting.is_empty()
            && let Some(writer) = state.writer.as_mut()
            && let Err(e) = write_now(writer.as_mut(), chunks)
        {
            state.failed = true;
            chunks.clear();
            self.shared.work.notify_one();
            return Err(e);
        }
        if !chunks.is_empty() {
            let len: usize = chunks.iter().map(Bytes::len).sum();
            self.shared.backlog.fetch_add(len, Ordering::Relaxed);
            state.waiting.append(chunks);
            self.shared.work.notify_one();
        }
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.closing = true;
        self.shared.work.notify_one();
        self.shared.closed.notify_waiters();
    }
}

/// Writes what `writer` takes without waiting, dropping it from the front of `chunks`.
fn write_now(writer: &mut (dyn AsyncWrite + Send + Unpin), chunks: &mut Vec<Bytes>) -> std::io::Result<()> {
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    let mut first = 0;
    let result = loop {
        let Some(rest) = chunks.get(first..).filter(|r| !r.is_empty()) else { break Ok(()) };
        let mut slices = [std::io::IoSlice::new(&[]); crate::vectored::WRITE_CHUNKS_MAX];
        let count = rest.len().min(crate::vectored::WRITE_CHUNKS_MAX);
        for (slice, chunk) in slices.iter_mut().zip(rest) {
            *slice = std::io::IoSlice::new(chunk);
        }
        let slices = slices.get(..count).unwrap_or_default();
        let mut written = match std::pin::Pin::new(&mut *writer).poll_write_vectored(&mut context, slices) {
            std::task::Poll::Pending => break Ok(()),
            std::task::Poll::Ready(Ok(0)) => break Err(std::io::ErrorKind::WriteZero.into()),
            std::task::Poll::Ready(Ok(n)) => n,
            std::task::Poll::Ready(Err(e)) => break Err(e),
        };
        while let Some(chunk) = chunks.get_mut(first) {
            if written < chunk.len() {
                chunk.advance(written);
                break;
            }
            written -= chunk.len();
            first += 1;
        }
    };
    chunks.drain(..first);
    result
}

/// How long a writer task still tries to write after the link let its connection go (a
/// peer that reads nothing would otherwise keep the task and its socket forever).
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// The writer task: writes what waits whenever the link task leaves some, at most
/// [`crate::vectored::WRITE_CHUNKS_MAX`] chunks a round (so the backlog falls and `drained`
/// wakes the link task as it goes); at the connection's end, writes what still waits and
/// shuts the writer down.
async fn write_loop(
    shared: Arc<Shared>,
    drained: Arc<Notify>,
    id: u64,
    events: mpsc::Sender<(u64, ConnEvent)>,
) {
    loop {
        shared.work.notified().await;
        loop {
            let (mut writer, mut chunks, last) = {
                let mut state = shared.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if state.failed {
                    return;
                }
                if state.waiting.is_empty() && !state.closing {
                    break;
                }
                let Some(writer) = state.writer.take() else { return };
                let count = state.waiting.len().min(crate::vectored::WRITE_CHUNKS_MAX);
                let chunks: Vec<Bytes> = state.waiting.drain(..count).collect();
                (writer, chunks, state.closing && state.waiting.is_empty())
            };
            let len: usize = chunks.iter().map(Bytes::len).sum();
            let result = tokio::select! {
                result = crate::vectored::write_all(&mut writer, &mut chunks) => result,
                () = abandoned(&shared) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the peer read nothing for a while after the link let the connection go",
                )),
            };
            shared.backlog.fetch_sub(len, Ordering::Relaxed);
            if let Err(e) = result {
                // Nothing waiting behind the failed write will be written: uncount it, so
                // the link task reads again and sees this connection's end.
                {
                    let mut state = shared.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    state.failed = true;
                    let rest: usize = state.waiting.drain(..).map(|chunk| chunk.len()).sum();
                    shared.backlog.fetch_sub(rest, Ordering::Relaxed);
                }
                drained.notify_one();
                let _ = events.send((id, ConnEvent::Closed(format!("write failed: {e}")))).await;
                return;
            }
            drained.notify_one();
            if last {
                // The link task is done with the connection: nothing comes after these.
                let _ = tokio::time::timeout(CLOSE_GRACE, writer.shutdown()).await;
                return;
            }
            shared.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).writer = Some(writer);
        }
    }
}

/// Ends [`CLOSE_GRACE`] after the link let the connection go (never before).
async fn abandoned(shared: &Shared) {
    loop {
        let closed = shared.closed.notified();
        if shared.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).closing {
            tokio::time::sleep(CLOSE_GRACE).await;
            return;
        }
        closed.await;
    }
}

/// Writes a `Close` frame on a connection that will not be used (through its secure
/// channel when that is established, else in plaintext), then drops it.
pub(crate) fn refuse(connection: Connection, secure: Option<SecureChannel>, code: CloseCode, reason: &str) {
    let mut frame = BytesMut::new();
    Frame::Close { code: code as u16, reason: reason.to_owned() }.encode(&mut frame);
    let out = match secure {
        Some(mut channel) if channel.is_established() => {
            let _ = channel.send(&frame);
            channel.poll_transmit().map(BytesMut::from).unwrap_or_default()
        }
        _ => frame,
    };
    let mut writer = connection.writer;
    tokio::spawn(async move {
        let _ = writer.write_all(&out).await;
        let _ = writer.shutdown().await;
    });
}

/// Dialer: runs the secure channel's handshake on a fresh connection; returns the channel
/// and any plaintext that arrived with the last handshake bytes.
///
/// # Errors
/// A message when the handshake fails, the peer closes, or `timeout` passes.
pub(crate) async fn secure_dial(
    connection: &mut Connection,
    mut channel: SecureChannel,
    timeout: std::time::Duration,
) -> Result<(SecureChannel, BytesMut), String> {
    let handshake = async {
        if let Some(bytes) = channel.poll_transmit() {
            connection.writer.write_all(&bytes).await.map_err(|e| format!("write failed: {e}"))?;
        }
        let mut buf = vec![0u8; 16 * 1024];
        while !channel.is_established() {
            let n = connection.reader.read(&mut buf).await.map_err(|e| format!("read failed: {e}"))?;
            if n == 0 {
                return Err("the peer closed the connection during the handshake".to_owned());
            }
            channel.handle_bytes(buf.get(..n).unwrap_or_default()).map_err(|e| e.to_string())?;
        }
        let leftover = channel.take_plaintext().map(BytesMut::from).unwrap_or_default();
        Ok((channel, leftover))
    };
    tokio::time::timeout(timeout, handshake).await.map_err(|_| "the handshake timed out".to_owned())?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbered(count: u32) -> Vec<Bytes> {
        (0..count).map(|i| Bytes::from(format!("chunk {i};").repeat(1 + i as usize % 7))).collect()
    }

    /// Bytes the socket does not take at once wait for the writer task, and what is sent
    /// meanwhile goes out behind them: the reader gets everything once, in order, and the
    /// backlog drains to zero; dropping the output shuts the writer down.
    #[tokio::test]
    async fn what_the_socket_does_not_take_at_once_goes_out_later_in_order() {
        let (writer, mut reader) = tokio::io::duplex(64);
        let (events_tx, _events_rx) = mpsc::channel(1);
        let drained = Arc::new(Notify::new());
        let output = Output::start(Box::new(writer), drained.clone(), 1, events_tx);
        let chunks = numbered(500);
        let expected: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let reading = tokio::spawn(async move {
            let mut got = Vec::new();
            reader.read_to_end(&mut got).await.map(|_| got)
        });
        let mut waited = 0;
        for group in chunks.chunks(3) {
            let mut out = group.to_vec();
            output.send(&mut out).unwrap();
            assert!(out.is_empty());
            waited += usize::from(output.backlog() > 0);
            tokio::task::yield_now().await;
        }
        assert!(waited > 10, "the socket took everything at once: the test tests nothing");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while output.backlog() > 0 {
            tokio::time::timeout_at(deadline, drained.notified()).await.expect("the backlog drains");
        }
        drop(output);
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), reading).await.unwrap().unwrap();
        assert_eq!(got.unwrap(), expected);
    }

    /// Accepts `left` bytes, then fails every write.
    struct Breaking {
        left: usize,
    }

    impl AsyncWrite for Breaking {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            if self.left == 0 {
                return std::task::Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
            }
            let n = buf.len().min(self.left);
            self.left -= n;
            std::task::Poll::Ready(Ok(n))
        }

        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// A write that fails while the link task writes is its error; afterwards the output
    /// takes nothing more (and counts nothing).
    #[tokio::test]
    async fn a_failed_write_is_reported_and_the_output_takes_nothing_more() {
        let (events_tx, _events_rx) = mpsc::channel(1);
        let output = Output::start(Box::new(Breaking { left: 10 }), Arc::new(Notify::new()), 7, events_tx);
        let error = output.send(&mut numbered(3)).expect_err("the write fails");
        assert_eq!(error.kind(), std::io::ErrorKind::BrokenPipe);
        let mut more = numbered(3);
        output.send(&mut more).unwrap();
        assert!(more.is_empty());
        assert_eq!(output.backlog(), 0);
    }
}
