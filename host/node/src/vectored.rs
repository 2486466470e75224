//! Writing several buffers with one system call where the writer allows (a link's queued
//! output, a response with large payloads shared rather than copied in).

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use tokio::io::AsyncWrite;

/// Buffers given to one write at most (the kernel takes up to 1,024).
pub(crate) const WRITE_CHUNKS_MAX: usize = 64;

/// Writes every chunk, in order, with as few calls as the writer allows; `chunks` is empty
/// afterwards, also on an error.
///
/// # Errors
/// The writer's, or [`std::io::ErrorKind::WriteZero`] when it takes nothing.
pub(crate) async fn write_all<W: AsyncWrite + Unpin + ?Sized>(
    writer: &mut W,
    chunks: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    // An empty chunk would make a write of nothing look like a closed writer.
    chunks.retain(|chunk| !chunk.is_empty());
    let mut first = 0;
    let result = std::future::poll_fn(|context| {
        loop {
            match poll_write_some(&mut *writer, context, chunks, &mut first) {
                Poll::Ready(Ok(false)) => {}
                Poll::Ready(result) => return Poll::Ready(result.map(|_| ())),
                Poll::Pending => return Poll::Pending,
            }
        }
    })
    .await;
    chunks.clear();
    result
}

/// Writes what the writer takes at once of `chunks`, in order, without waiting (polled
/// with a waker that does nothing: nothing is woken later); what was written is removed
/// from `chunks`, the rest stays for a write that waits.
///
/// # Errors
/// The writer's, or [`std::io::ErrorKind::WriteZero`] when it takes nothing; `chunks` then
/// holds what was not written.
pub(crate) fn write_now<W: AsyncWrite + Unpin + ?Sized>(
    writer: &mut W,
    chunks: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    let mut context = Context::from_waker(Waker::noop());
    chunks.retain(|chunk| !chunk.is_empty());
    let mut first = 0;
    let result = loop {
        match poll_write_some(&mut *writer, &mut context, chunks, &mut first) {
            Poll::Ready(Ok(false)) => {}
            Poll::Ready(result) => break result.map(|_| ()),
            Poll::Pending => break Ok(()),
        }
    };
    chunks.drain(..first);
    result
}

/// One vectored write of the chunks from `first` on (non-empty ones); moves `first` past
/// the chunks written whole and advances a chunk written in part. Ready with `true` once
/// nothing is left.
fn poll_write_some<W: AsyncWrite + Unpin + ?Sized>(
    writer: &mut W,
    context: &mut Context<'_>,
    chunks: &mut [Bytes],
    first: &mut usize,
) -> Poll<std::io::Result<bool>> {
    let Some(rest) = chunks.get(*first..).filter(|r| !r.is_empty()) else { return Poll::Ready(Ok(true)) };
    let mut slices = [IoSlice::new(&[]); WRITE_CHUNKS_MAX];
    let count = rest.len().min(WRITE_CHUNKS_MAX);
    for (slice, chunk) in slices.iter_mut().zip(rest) {
        *slice = IoSlice::new(chunk);
    }
    let mut written =
        match Pin::new(writer).poll_write_vectored(context, slices.get(..count).unwrap_or_default()) {
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
    Poll::Ready(Ok(*first == chunks.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes at most `step` bytes per call, like a busy socket.
    struct Trickle {
        got: Vec<u8>,
        step: usize,
        /// Bytes it takes in all before it is full (pending).
        room: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.step).min(self.room);
            if n == 0 && !buf.is_empty() {
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

    /// A write that does not wait takes what fits, keeps the rest in order, and wakes nothing.
    #[test]
    fn a_write_now_takes_what_fits_and_leaves_the_rest_in_order() {
        let parts: Vec<Bytes> =
            (0..50u32).map(|i| Bytes::from(vec![i as u8; 1 + (i as usize * 5) % 17])).collect();
        let want: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        for (step, room) in [(3, 100), (64, 0), (1000, 37), (1000, want.len()), (1000, want.len() + 10)] {
            let mut writer = Trickle { got: Vec::new(), step, room };
            let mut chunks = parts.clone();
            write_now(&mut writer, &mut chunks).unwrap();
            assert_eq!(writer.got.len(), room.min(want.len()), "step {step} room {room}");
            let mut all = writer.got.clone();
            all.extend(chunks.iter().flat_map(|c| c.iter().copied()));
            assert_eq!(all, want, "written, then what is left, is everything in order");
        }
    }
}
