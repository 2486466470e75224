//! Writing several buffers with one system call where the writer allows (a link's queued
//! output, a response with large payloads shared rather than copied in).

use std::io::IoSlice;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncWrite, AsyncWriteExt};

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
    let result = loop {
        let Some(rest) = chunks.get(first..).filter(|r| !r.is_empty()) else { break Ok(()) };
        let mut slices = [IoSlice::new(&[]); WRITE_CHUNKS_MAX];
        let count = rest.len().min(WRITE_CHUNKS_MAX);
        for (slice, chunk) in slices.iter_mut().zip(rest) {
            *slice = IoSlice::new(chunk);
        }
        let mut written = match writer.write_vectored(slices.get(..count).unwrap_or_default()).await {
            Ok(0) => break Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) => break Err(e),
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
    chunks.clear();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes at most `step` bytes per call, like a busy socket.
    struct Trickle {
        got: Vec<u8>,
        step: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.step);
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
            let mut writer = Trickle { got: Vec::new(), step };
            let mut chunks = parts.clone();
            write_all(&mut writer, &mut chunks).await.unwrap();
            assert_eq!(writer.got, want, "step {step}");
            assert!(chunks.is_empty());
        }
    }
}
