//! The byte movers of a connection: the link task's reads, a writer task for what the
//! socket does not take at once (so reading never waits on writing), and refusing a
//! connection with a `Close` frame.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use linkbus_plugin_api::Connection;
use linkbus_proto::frame::{CloseCode, Frame};
use linkbus_proto::secure::SecureChannel;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, mpsc};

/// A connection's writing half: the link task writes to it directly while nothing waits for
/// the writer task, which takes it out while it writes.
pub(crate) type SharedWriter = Arc<std::sync::Mutex<Option<Box<dyn AsyncWrite + Send + Unpin>>>>;

/// What happened on a connection: read by the link task, or reported by the writer task.
pub(crate) enum ConnEvent {
    /// Bytes read.
    Bytes(Bytes),
    /// The connection ended, and why.
    Closed(String),
}

/// How long a write may still take once the link let go of its connection (dropped its
/// sending side), give or take a fifth (how often a write that takes long checks whether
/// the link let go): a peer that reads nothing (or too little) does not keep the task and
/// its socket.
pub(crate) const LET_GO_WRITE_GRACE: Duration = Duration::from_secs(5);

/// Room for one read: large, so that most frames arrive whole in one chunk and pass on
/// as slices of it (a frame split between two reads is copied together; a short message
/// is copied out into a buffer of its own).
const READ_BYTES: usize = 256 * 1024;

/// Reads the next chunk of `active`'s connection (never, while there is none), with the
/// connection's id. Cancel-safe: a read that has not finished has taken nothing.
pub(crate) async fn read_chunk(active: &mut Option<super::Active>) -> (u64, ConnEvent) {
    let Some(active) = active else { return std::future::pending().await };
    if active.read_buf.capacity() < READ_BYTES / 4 {
        active.read_buf.reserve(READ_BYTES);
    }
    let event = match active.reader.read_buf(&mut active.read_buf).await {
        Ok(0) => ConnEvent::Closed("connection closed by peer".into()),
        Ok(_) => ConnEvent::Bytes(active.read_buf.split().freeze()),
        Err(e) => ConnEvent::Closed(format!("read failed: {e}")),
    };
    (active.id, event)
}

/// Writes what the link task sends, counting the bytes not yet written in `backlog` (the
/// link task stops producing above its limit) and waking the link task as it drains. The
/// chunks waiting at a time go out together, in vectored writes. A write still unfinished
/// `let_go_grace` ([`LET_GO_WRITE_GRACE`]) after the link let go of the connection is
/// given up, and the socket closed.
pub(crate) async fn write_loop(
    shared: SharedWriter,
    mut rx: mpsc::UnboundedReceiver<Vec<Bytes>>,
    backlog: Arc<AtomicUsize>,
    wake: Arc<Notify>,
    id: u64,
    events: mpsc::Sender<(u64, ConnEvent)>,
    let_go_grace: Duration,
) {
    let mut chunks: Vec<Bytes> = Vec::new();
    while let Some(mut first) = rx.recv().await {
        chunks.append(&mut first);
        while chunks.len() < linkbus_client::vectored::WRITE_CHUNKS_MAX {
            let Ok(mut more) = rx.try_recv() else { break };
            chunks.append(&mut more);
        }
        let len: usize = chunks.iter().map(Bytes::len).sum();
        let result = write_batch(&shared, &mut chunks, &rx, let_go_grace).await;
        backlog.fetch_sub(len, Ordering::Release);
        if let Err(e) = result {
            // Nothing queued behind the failed write will be written: uncount it, so the
            // link task reads again and sees this connection's end.
            rx.close();
            while let Ok(rest) = rx.try_recv() {
                backlog.fetch_sub(rest.iter().map(Bytes::len).sum(), Ordering::Relaxed);
            }
            wake.notify_one();
            let _ = events.send((id, ConnEvent::Closed(format!("write failed: {e}")))).await;
            return;
        }
        wake.notify_one();
    }
    let writer = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    if let Some(mut writer) = writer {
        let _ = writer.shutdown().await;
    }
}

/// Writes one batch with the writer taken out of `shared` (the link task writes only while
/// nothing is counted in the backlog, so it is there), and puts it back after a write that
/// went well; after a failed one the connection gets no more bytes, from either task. A
/// write still unfinished `let_go_grace` after the link let go of the connection fails.
async fn write_batch(
    shared: &SharedWriter,
    chunks: &mut Vec<Bytes>,
    rx: &mpsc::UnboundedReceiver<Vec<Bytes>>,
    let_go_grace: Duration,
) -> std::io::Result<()> {
    let taken = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    let Some(mut writer) = taken else {
        return Err(std::io::Error::other("the connection's writer is gone"));
    };
    let write = linkbus_client::vectored::write_all(&mut writer, chunks);
    let let_go = async {
        while !rx.is_closed() {
            tokio::time::sleep(let_go_grace / 5).await;
        }
        tokio::time::sleep(let_go_grace).await;
    };
    // The write first: one that finishes at once never arms a timer.
    let result = tokio::select! {
        biased;
        result = write => result,
        () = let_go => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the write was unfinished {let_go_grace:?} after the link let go of the connection"),
        )),
    };
    if result.is_ok() {
        *shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(writer);
    }
    result
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer task on one end of an in-memory pipe of `capacity` bytes, as the link
    /// starts one, with `counted` bytes in its backlog.
    struct Writer {
        to_writer: mpsc::UnboundedSender<Vec<Bytes>>,
        events: mpsc::Receiver<(u64, ConnEvent)>,
        backlog: Arc<AtomicUsize>,
        shared: SharedWriter,
        task: tokio::task::JoinHandle<()>,
        theirs: tokio::io::DuplexStream,
    }

    fn writer(capacity: usize, counted: usize, grace: Duration) -> Writer {
        let (ours, theirs) = tokio::io::duplex(capacity);
        let (to_writer, rx) = mpsc::unbounded_channel();
        let (events_tx, events) = mpsc::channel(4);
        let backlog = Arc::new(AtomicUsize::new(counted));
        let shared: SharedWriter = Arc::new(std::sync::Mutex::new(Some(Box::new(ours))));
        let task = tokio::spawn(write_loop(
            shared.clone(),
            rx,
            backlog.clone(),
            Arc::default(),
            7,
            events_tx,
            grace,
        ));
        Writer { to_writer, events, backlog, shared, task, theirs }
    }

    /// A writer whose peer reads nothing is given up once the link lets go of it (and only
    /// then), so its task and socket do not stay.
    #[tokio::test]
    async fn a_write_the_peer_never_reads_is_given_up_after_the_link_lets_go() {
        let grace = Duration::from_millis(200);
        let Writer { to_writer: tx, mut events, backlog, shared, task, mut theirs } = writer(64, 1000, grace);
        tx.send(vec![Bytes::from(vec![1u8; 1000])]).unwrap();
        tokio::time::sleep(3 * grace).await;
        assert!(!task.is_finished(), "a slow peer is waited for while the link holds the connection");
        // The peer reads a little: the write goes on.
        let mut some = [0u8; 64];
        theirs.read_exact(&mut some).await.unwrap();
        drop(tx);
        let started = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(30), task).await.expect("given up").unwrap();
        assert!(started.elapsed() >= grace, "not before the grace");
        let (id, event) = events.recv().await.unwrap();
        assert!(id == 7 && matches!(&event, ConnEvent::Closed(r) if r.contains("after the link let go")));
        assert_eq!(backlog.load(Ordering::Relaxed), 0, "what was not written is uncounted");
        assert!(shared.lock().unwrap().is_none(), "after a failed write, no task writes to it again");
        // The socket is closed: the peer reads what was written, then the end.
        let mut rest = Vec::new();
        theirs.read_to_end(&mut rest).await.unwrap();
        assert!(rest.len() < 1000 - 64);
    }

    /// The writer task writes what the link task hands it and puts the writing half back
    /// for the link task's own writes; once the link lets go, it closes the connection.
    #[tokio::test]
    async fn the_writer_task_gives_the_writing_half_back_after_each_write() {
        let Writer { to_writer: tx, backlog, shared, task, mut theirs, .. } =
            writer(1 << 16, 5, LET_GO_WRITE_GRACE);
        tx.send(vec![Bytes::from_static(b"hello")]).unwrap();
        let mut got = [0u8; 5];
        theirs.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        let drained = async {
            while backlog.load(Ordering::Acquire) != 0 {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), drained).await.expect("the write is uncounted");
        let mut writer = shared.lock().unwrap().take().expect("given back once the backlog is empty");
        let mut direct = vec![Bytes::from_static(b" world")];
        linkbus_client::vectored::write_now(&mut writer, &mut direct).unwrap();
        assert!(direct.is_empty());
        *shared.lock().unwrap() = Some(writer);
        drop(tx);
        tokio::time::timeout(Duration::from_secs(30), task).await.expect("ends").unwrap();
        let mut rest = Vec::new();
        theirs.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b" world", "then the end: the link let go");
    }
}
