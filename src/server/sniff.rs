//! A client socket's first bytes: whether they are the HTTP/2 preface is decided here, so an
//! HTTP/1 connection's read buffer takes the request head in one read and stays 8 KiB.
//!
//! hyper-util's auto builder reads up to 24 bytes looking for the preface and hands what it
//! read to hyper's HTTP/1 connection as a prefix, which hyper takes in a read of its own: 24
//! bytes in its 8 KiB buffer, the head still incomplete. Its next read reserves another 8 KiB
//! on top of those bytes, so the buffer (a `Vec` underneath the `BytesMut`) doubles to 16 KiB,
//! and keeps that size for the connection's life (a held stream or an idle keep-alive
//! connection paid 8 KiB more than a plain hyper server). Neither hyper nor hyper-util lets
//! a caller choose the version without losing upgrades, so the socket is sniffed here:
//! - the preface (all 24 bytes): passed through unchanged, and the builder serves HTTP/2;
//! - anything else: the builder's first read gets no bytes (it takes an empty first read for
//!   HTTP/1 with no prefix), and hyper's first read gets the sniffed bytes followed, in the
//!   same read, by whatever else the socket already has: the whole head, for most requests;
//! - an end of stream inside the preface: what arrived is passed through, as before.
//!
//! Written by hand because no crate offers it. It depends on how the builder reads, which the
//! suites check through it: HTTP/1 everywhere, WebSocket upgrades (`tests/ws_session.rs`),
//! prior-knowledge HTTP/2 (`tests/hostile.rs`), silent and partial prefaces (`tests/hygiene.rs`).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a client opening an HTTP/2 connection without an upgrade sends first (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading until the bytes stop matching the preface, or it is whole.
    Sniffing,
    /// Not HTTP/2: the next read is answered with no bytes (the builder's choice of HTTP/1).
    Http1Told,
    /// Handing out `head[at..len]`; after the HTTP/1 choice, followed by a read of the socket.
    Replay { then_read: bool },
    /// Plain reads of the socket.
    Through,
}

/// `inner` with its first bytes sniffed for the HTTP/2 preface (see the module doc).
#[derive(Debug)]
pub struct Sniffed<T> {
    inner: T,
    head: [u8; 24],
    len: usize,
    at: usize,
    phase: Phase,
}

impl<T> Sniffed<T> {
    pub fn new(inner: T) -> Self {
        Sniffed {
            inner,
            head: [0; 24],
            len: 0,
            at: 0,
            phase: Phase::Sniffing,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Sniffed<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            match this.phase {
                Phase::Sniffing => {
                    let mut into = ReadBuf::new(&mut this.head[this.len..]);
                    ready!(Pin::new(&mut this.inner).poll_read(cx, &mut into))?;
                    let n = into.filled().len();
                    if n == 0 {
                        // The client closed inside the preface (or before a byte).
                        this.phase = Phase::Replay { then_read: false };
                        continue;
                    }
                    this.len += n;
                    if this.head[..this.len] != H2_PREFACE[..this.len] {
                        this.phase = Phase::Http1Told;
                    } else if this.len == H2_PREFACE.len() {
                        this.phase = Phase::Replay { then_read: false };
                    }
                }
                Phase::Http1Told => {
                    this.phase = Phase::Replay { then_read: true };
                    return Poll::Ready(Ok(()));
                }
                Phase::Replay { then_read } => {
                    let n = (this.len - this.at).min(buf.remaining());
                    buf.put_slice(&this.head[this.at..this.at + n]);
                    this.at += n;
                    if this.at < this.len {
                        return Poll::Ready(Ok(()));
                    }
                    this.phase = Phase::Through;
                    if n == 0 {
                        continue;
                    }
                    if then_read && buf.remaining() > 0 {
                        // The rest of the head, if it is here, in the same read. A socket
                        // error surfaces on the next read, after these bytes.
                        let _ = Pin::new(&mut this.inner).poll_read(cx, buf);
                    }
                    return Poll::Ready(Ok(()));
                }
                Phase::Through => return Pin::new(&mut this.inner).poll_read(cx, buf),
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Sniffed<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Reads of `io` into a buffer of `size`, until the end, each read's bytes.
    async fn reads(io: &mut Sniffed<script::Io>, size: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let mut buf = vec![0; size];
            let n = io.read(&mut buf).await.expect("read");
            out.push(buf[..n].to_vec());
            if n == 0 && out.len() > 1 {
                return out;
            }
        }
    }

    mod script {
        //! A reader that yields scripted chunks, one per read, then the end.
        use std::collections::VecDeque;
        use std::io;
        use std::pin::Pin;
        use std::task::{Context, Poll};

        use tokio::io::{AsyncRead, ReadBuf};

        pub struct Io(pub VecDeque<Vec<u8>>);

        impl AsyncRead for Io {
            fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
                if let Some(mut chunk) = self.0.pop_front() {
                    let n = chunk.len().min(buf.remaining());
                    buf.put_slice(&chunk[..n]);
                    if n < chunk.len() {
                        self.0.push_front(chunk.split_off(n));
                    }
                }
                Poll::Ready(Ok(()))
            }
        }
    }

    fn sniffed(chunks: &[&[u8]]) -> Sniffed<script::Io> {
        Sniffed::new(script::Io(chunks.iter().map(|c| c.to_vec()).collect()))
    }

    #[tokio::test]
    async fn http1_gets_an_empty_first_read_then_its_head_in_one_read() {
        let head: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n\r\n";
        // The socket delivers the head in two pieces; both are in its buffer by now.
        let mut io = sniffed(&[&head[..24], &head[24..]]);
        let got = reads(&mut io, 8192).await;
        assert_eq!(got[0], b"", "the builder's read: HTTP/1, no prefix");
        assert_eq!(
            got[1], head,
            "hyper's first read: the sniffed bytes and the rest together"
        );
    }

    #[tokio::test]
    async fn the_http2_preface_passes_through_unchanged() {
        let mut io = sniffed(&[b"PRI * HTTP/2.0\r\n", b"\r\nSM\r\n\r\n", b"frames"]);
        let got = reads(&mut io, 24).await;
        assert_eq!(got[0], H2_PREFACE, "the builder sees the whole preface");
        assert_eq!(got[1], b"frames", "then the socket");
    }

    #[tokio::test]
    async fn a_client_that_closes_inside_the_preface_is_passed_what_it_sent() {
        let mut io = sniffed(&[b"PRI"]);
        let got = reads(&mut io, 24).await;
        assert_eq!(got, vec![b"PRI".to_vec(), Vec::new()], "its bytes, then the end");
    }

    #[tokio::test]
    async fn a_mismatch_late_in_the_preface_is_http1_with_every_byte_kept() {
        let mut io = sniffed(&[b"PRI * HTTP/1.1\r\n", b"more"]);
        let got = reads(&mut io, 8192).await;
        assert_eq!(got[0], b"", "HTTP/1");
        assert_eq!(got[1], b"PRI * HTTP/1.1\r\nmore", "nothing lost");
    }

    #[tokio::test]
    async fn a_small_reader_buffer_gets_the_sniffed_bytes_over_several_reads() {
        let mut io = sniffed(&[b"GET / HTTP/1.1\r\n\r\n"]);
        let got = reads(&mut io, 4).await;
        let joined: Vec<u8> = got.concat();
        assert_eq!(got[0], b"", "HTTP/1");
        assert_eq!(joined, b"GET / HTTP/1.1\r\n\r\n", "every byte, in order");
    }
}
