//! The peer's stream limit on an HTTP/2 connection: its SETTINGS_MAX_CONCURRENT_STREAMS, read
//! from the first frame the upstream sends (RFC 9113 §3.4: a server's connection preface is a
//! SETTINGS frame), by a connector whose connections pass every byte through unchanged.
//!
//! Written by hand because neither hyper-util's pooled client nor the `h2` crate under it
//! tells its user the peer's settings (hyper's own `SendRequest::current_max_send_streams` is
//! out of reach behind the pool). Only the preface is read: a later SETTINGS frame that
//! changes the limit is not seen (rare; the lane then over- or under-fills one connection,
//! and hyper still never exceeds the peer's limit, it queues instead).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The streams a peer is assumed to allow until its SETTINGS say otherwise, and when they
/// name no limit: hyper's initial value for a client (what it enforces before the peer's
/// settings arrive, and after settings that name none) and RFC 9113's recommended minimum.
pub const DEFAULT_STREAMS_PER_CONNECTION: usize = 100;

/// The largest SETTINGS payload read (a peer sends a handful of 6-byte settings); a larger
/// one is passed through unread and the limit stays as it was.
const MAX_SETTINGS_PAYLOAD: usize = 6 * 32;

const FRAME_HEADER: usize = 9;
const SETTINGS: u8 = 0x4;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;

/// Wraps a connector: each HTTP/2 connection it makes (negotiated by ALPN, or every one when
/// `prior_knowledge`) writes the peer's stream limit into `limit` once its preface arrives.
#[derive(Clone)]
pub(crate) struct ReadsStreamLimit<C> {
    pub inner: C,
    pub limit: Arc<AtomicUsize>,
    pub prior_knowledge: bool,
}

type Connecting<T> = Pin<Box<dyn Future<Output = Result<Watched<T>, BoxError>> + Send>>;

impl<C> Service<Uri> for ReadsStreamLimit<C>
where
    C: Service<Uri, Error = BoxError>,
    C::Future: Send + 'static,
    C::Response: Connection + Send + 'static,
{
    type Response = Watched<C::Response>;
    type Error = BoxError;
    type Future = Connecting<C::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let connecting = self.inner.call(dst);
        let (limit, prior_knowledge) = (Arc::clone(&self.limit), self.prior_knowledge);
        Box::pin(async move {
            let io = connecting.await?;
            let h2 = prior_knowledge || io.connected().is_negotiated_h2();
            Ok(Watched {
                io,
                preface: h2.then(|| Box::new(Preface::new(limit))),
            })
        })
    }
}

/// A connection whose first frame from the peer is read on the way through, if HTTP/2.
pub(crate) struct Watched<T> {
    io: T,
    /// Until the preface has been read (or found unreadable); boxed, so a connection past
    /// it carries a pointer, not the buffer.
    preface: Option<Box<Preface>>,
}

/// The peer's first frame as it arrives, across reads.
struct Preface {
    limit: Arc<AtomicUsize>,
    seen: [u8; FRAME_HEADER + MAX_SETTINGS_PAYLOAD],
    have: usize,
}

impl Preface {
    fn new(limit: Arc<AtomicUsize>) -> Self {
        Preface {
            limit,
            seen: [0; FRAME_HEADER + MAX_SETTINGS_PAYLOAD],
            have: 0,
        }
    }

    /// Takes bytes the peer sent; true once there is nothing more to learn.
    fn feed(&mut self, bytes: &[u8]) -> bool {
        let room = self.seen.len() - self.have;
        let n = bytes.len().min(room);
        self.seen[self.have..self.have + n].copy_from_slice(&bytes[..n]);
        self.have += n;
        match stream_limit(&self.seen[..self.have]) {
            Found::More => bytes.is_empty(),
            Found::Limit(limit) => {
                self.limit.store(limit, Ordering::Relaxed);
                true
            }
            Found::Unreadable => true,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Found {
    More,
    Limit(usize),
    Unreadable,
}

/// The stream limit a peer's first frame sets, if `seen` (its first bytes) holds all of it.
fn stream_limit(seen: &[u8]) -> Found {
    let Some(header) = seen.get(..FRAME_HEADER) else {
        return Found::More;
    };
    let length = (usize::from(header[0]) << 16) | (usize::from(header[1]) << 8) | usize::from(header[2]);
    if header[3] != SETTINGS || length > MAX_SETTINGS_PAYLOAD || length % 6 != 0 {
        return Found::Unreadable;
    }
    let Some(payload) = seen.get(FRAME_HEADER..FRAME_HEADER + length) else {
        return Found::More;
    };
    let named = payload
        .chunks_exact(6)
        .filter(|s| u16::from_be_bytes([s[0], s[1]]) == SETTINGS_MAX_CONCURRENT_STREAMS)
        .map(|s| u32::from_be_bytes([s[2], s[3], s[4], s[5]]))
        .next_back();
    // No limit named: hyper keeps its initial one.
    Found::Limit(named.map_or(DEFAULT_STREAMS_PER_CONNECTION, |v| {
        usize::try_from(v).unwrap_or(usize::MAX)
    }))
}

impl<T: Connection> Connection for Watched<T> {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

/// Bytes read per call while the preface is awaited (it is a few dozen bytes).
const PREFACE_READ: usize = 512;

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let want = buf.remaining().min(PREFACE_READ);
        let Some(preface) = this.preface.as_mut().filter(|_| want > 0) else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        let mut scratch = [0u8; PREFACE_READ];
        let mut read = hyper::rt::ReadBuf::new(&mut scratch[..want]);
        ready!(Pin::new(&mut this.io).poll_read(cx, read.unfilled()))?;
        let got = read.filled();
        buf.put_slice(got);
        if preface.feed(got) {
            this.preface = None;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for Watched<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(u16, u32)]) -> Vec<u8> {
        let len = pairs.len() * 6;
        let mut frame = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, SETTINGS, 0, 0, 0, 0, 0];
        for (id, value) in pairs {
            frame.extend_from_slice(&id.to_be_bytes());
            frame.extend_from_slice(&value.to_be_bytes());
        }
        frame
    }

    #[test]
    fn the_limit_is_read_from_the_first_settings_frame() {
        let frame = settings(&[(0x1, 4096), (0x3, 2), (0x4, 65_535)]);
        assert_eq!(stream_limit(&frame), Found::Limit(2));
        // A frame after it changes nothing.
        let mut more = frame.clone();
        more.extend_from_slice(&settings(&[(0x3, 7)]));
        assert_eq!(stream_limit(&more), Found::Limit(2));
    }

    #[test]
    fn settings_that_name_no_limit_leave_the_default() {
        assert_eq!(
            stream_limit(&settings(&[(0x4, 65_535)])),
            Found::Limit(DEFAULT_STREAMS_PER_CONNECTION)
        );
        assert_eq!(
            stream_limit(&settings(&[])),
            Found::Limit(DEFAULT_STREAMS_PER_CONNECTION)
        );
    }

    #[test]
    fn a_first_frame_that_is_not_settings_is_unreadable() {
        let mut frame = settings(&[(0x3, 2)]);
        frame[3] = 0x0;
        assert_eq!(stream_limit(&frame), Found::Unreadable);
        let mut odd = settings(&[(0x3, 2)]);
        odd[2] = 5;
        assert_eq!(stream_limit(&odd), Found::Unreadable);
    }

    #[test]
    fn a_preface_split_across_reads_is_read_whole() {
        let frame = settings(&[(0x1, 4096), (0x3, 250)]);
        let limit = Arc::new(AtomicUsize::new(DEFAULT_STREAMS_PER_CONNECTION));
        let mut preface = Preface::new(Arc::clone(&limit));
        for byte in &frame[..frame.len() - 1] {
            assert!(!preface.feed(std::slice::from_ref(byte)), "not whole yet");
        }
        assert_eq!(limit.load(Ordering::Relaxed), DEFAULT_STREAMS_PER_CONNECTION);
        assert!(preface.feed(&frame[frame.len() - 1..]));
        assert_eq!(limit.load(Ordering::Relaxed), 250);
    }

    #[test]
    fn an_end_before_the_preface_stops_the_reading() {
        let limit = Arc::new(AtomicUsize::new(DEFAULT_STREAMS_PER_CONNECTION));
        let mut preface = Preface::new(Arc::clone(&limit));
        assert!(!preface.feed(&[0, 0]));
        assert!(preface.feed(&[]), "EOF");
        assert_eq!(limit.load(Ordering::Relaxed), DEFAULT_STREAMS_PER_CONNECTION);
    }
}
