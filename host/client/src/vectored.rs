//! Writing several buffers with one system call where the writer allows (a link's queued
//! output, a response with large payloads shared rather than copied in).

use std::io::IoSlice;

use bytes::{Buf, Bytes};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;

/// Buffers given to one write at most (the kernel takes up to 1,024).
pub const WRITE_CHUNKS_MAX: usize = 64;

/// Writes every chunk, in order, with as few calls as the writer allows; `chunks` is empty
/// afterwards, also on an error.
///
/// # Errors
/// The writer's, or [`std::io::ErrorKind::WriteZero`] when it takes nothing.
pub async fn write_all<W: AsyncWrite + Unpin + ?Sized>(
    writer: &mut W,
    chunks: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    // An empty chunk would make a write of nothing look like a closed writer.
    chunks.retain(|chunk| !chunk.is_empty());
    let mut first = 0;
    let result = std::future::poll_fn(|cx| poll_write_from(writer, cx, chunks, &mut first)).await;
    chunks.clear();
    result
}

/// Writes what `writer` takes without waiting, in as few calls as it allows, and removes
/// what was written from `chunks` (the first chunk left may have lost its first bytes);
/// `chunks` is empty after an error.
///
/// # Errors
/// The writer's, or [`std::io::ErrorKind::WriteZero`] when it takes nothing.
pub fn write_now<W: AsyncWrite + Unpin + ?Sized>(
    writer: &mut W,
    chunks: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    chunks.retain(|chunk| !chunk.is_empty());
    let mut first = 0;
    let mut context = Context::from_waker(std::task::Waker::noop());
    match poll_write_from(writer, &mut context, chunks, &mut first) {
        Poll::Pending | Poll::Ready(Ok(())) => {
            chunks.drain(..first);
            Ok(())
        }
        Poll::Ready(Err(e)) => {
            chunks.clear();
            Err(e)
        }
    }
}

/// Writes `chunks` from `first` on until all are written, the writer would wait, or it
/// fails; `first` and the first chunk left move past what was written.
fn poll_write_from<W: AsyncWrite + Unpin + ?Sized>(
    writer: &mut W,
    cx: &mut Context<'_>,
    chunks: &mut [Bytes],
    first: &mut usize,
) -> Poll<std::io::Result<()>> {
    loop {
        let Some(rest) = chunks.get(*first..).filter(|r| !r.is_empty()) else { return Poll::Ready(Ok(())) };
        let mut slices = [IoSlice::new(&[]); WRITE_CHUNKS_MAX];
        let count = rest.len().min(WRITE_CHUNKS_MAX);
        for (slice, chunk) in slices.iter_mut().zip(rest) {
            *slice = IoSlice::new(chunk);
        }
        let mut written = match std::pin::Pin::new(&mut *writer)
            .poll_write_vectored(cx, slices.get(..count).unwrap_or_default())
        {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(0)) => return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into())),
            Poll::Ready(Ok(n)) => n,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
        };
        while let Some(chunk) = chunks.get_mut(*first) {
            if written < chunk.len() {
                chunk.advance(written);
                break;
            }
            written -= chunk.len();
            *first += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes at most `step` bytes per call, like a busy socket.
    struct Trickle {
        got: Vec<u8>,
        step: usize,
        /// Bytes taken before it would wait (as a socket whose buffer is full).
        room: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.step).min(self.room);
            if n == 0 {
                return std::task::Poll::Pending;
            }
            self.room -= n;
            self.got.extend_from_slice(&buf[..n]);
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

    #[tokio::test]
    async fn every_byte_goes_out_in_order_however_little_each_call_takes() {
        let parts: Vec<Bytes> =
            (0..200u32).map(|i| Bytes::from(vec![i as u8; (i as usize * 7) % 23])).collect();
        let want: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        for step in [1, 5, 64, 10_000] {
            let mut writer = Trickle { got: Vec::new(), step, room: usize::MAX };
            let mut chunks = parts.clone();
            write_all(&mut writer, &mut chunks).await.unwrap();
            assert_eq!(writer.got, want, "step {step}");
            assert!(chunks.is_empty());
        }
    }

    /// A write that must not wait takes what the writer has room for and leaves the rest,
    /// in order, for a write that may.
    #[tokio::test]
    async fn a_write_now_leaves_what_the_writer_has_no_room_for() {
        let parts: Vec<Bytes> =
            (0..200u32).map(|i| Bytes::from(vec![i as u8; (i as usize * 7) % 23])).collect();
        let want: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        for (step, room) in [(1, 0), (5, 7), (64, 1_000), (10_000, 1_500), (10_000, usize::MAX)] {
            let mut writer = Trickle { got: Vec::new(), step, room };
            let mut chunks = parts.clone();
            write_now(&mut writer, &mut chunks).unwrap();
            assert_eq!(writer.got.len(), want.len().min(room), "step {step}, room {room}");
            assert_eq!(chunks.is_empty(), room >= want.len());
            writer.room = usize::MAX;
            write_all(&mut writer, &mut chunks).await.unwrap();
            assert!(writer.got == want, "step {step}, room {room}: the rest follows in order");
        }
    }
}
