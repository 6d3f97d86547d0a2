//! Request bodies at the edge: read whole, bounded in size and in time, before any handler
//! runs. A `Content-Length` over `max_body_bytes` gets a 413 before a body byte is read; a
//! chunked body is counted as it arrives and cut at the limit; a body that has not arrived
//! within `body_read_timeout_ms` gets a 408. All three close the connection.
//!
//! Written here rather than with axum's `DefaultBodyLimit` alone, which only counts bytes
//! while a handler reads and has no clock: a body sent at a byte a second held its
//! connection and handler for as long as the client liked.
//!
//! Bodies being gathered share one budget of bytes (`BodyLimits::buffered`, `BUFFERED_BODIES`
//! or four bodies at the limit, whichever is more): a read takes its share before it buffers
//! (its declared length, then as it grows) and gives it back when the body is whole. With no
//! share left a read waits, unread, so HTTP/2 flow control holds the sender back, and its
//! timeout still runs. Without it one HTTP/2 connection could have 200 streams of nearly
//! `max_body_bytes` each buffered at once (800 MiB at the defaults).
//!
//! A small body hyper already holds whole with its head (`AT_ONCE`) skips all of that: it is
//! handed to the routes at once, with no read task, timer or share.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::response::Response;
use axum::routing::future::RouteFuture;
use axum::Router;
use bytes::{Bytes, BytesMut};
use futures::future::Either;
use futures::StreamExt;
use http_body::Body as _;
use pin_project_lite::pin_project;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_service::Service;

use super::reply::{dialect_of, render, request_id, EdgeRefusal};

/// Bytes of request bodies being gathered at once, at least (the budget is four bodies at
/// `max_body_bytes` when that is more).
pub const BUFFERED_BODIES: usize = 64 * 1024 * 1024;

/// The budget's unit: shares are taken in KiB.
const UNIT: usize = 1024;

/// A body of at most this many bytes (by its `Content-Length`) that came whole with its head,
/// as a chat request usually does, goes to the routes at once: no read task, timer or budget
/// share for bytes hyper already holds. The bytes are bounded by this and by hyper's own read
/// buffer, so skipping the share leaves the budget's bound as it was.
const AT_ONCE: usize = 16 * 1024;

/// What a request body may be.
#[derive(Debug, Clone)]
pub struct BodyLimits {
    pub max_bytes: usize,
    pub timeout: Duration,
    /// The bytes all bodies being gathered may hold together, in `UNIT`s.
    pub buffered: Arc<Semaphore>,
}

impl BodyLimits {
    pub fn new(max_bytes: usize, timeout: Duration) -> Self {
        BodyLimits::with_budget(max_bytes, timeout, BUFFERED_BODIES.max(max_bytes.saturating_mul(4)))
    }

    pub fn with_budget(max_bytes: usize, timeout: Duration, budget: usize) -> Self {
        let units = budget.div_ceil(UNIT).min(Semaphore::MAX_PERMITS);
        BodyLimits {
            max_bytes,
            timeout,
            buffered: Arc::new(Semaphore::new(units)),
        }
    }
}

/// Units for `bytes`, as the semaphore counts them.
fn units(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX)
}

/// The routes behind the body reader: each request's body is replaced by the whole body,
/// read within `limits`, or the request is answered with the refusal in the path's dialect.
#[derive(Clone)]
pub struct BodyReader {
    routes: Router,
    limits: BodyLimits,
}

impl BodyReader {
    pub fn new(routes: Router, limits: BodyLimits) -> Self {
        BodyReader { routes, limits }
    }
}

impl Service<Request> for BodyReader {
    type Response = Response;
    type Error = Infallible;
    /// Straight to the routes when there is no body to wait for; else the read, then them.
    type Future = Either<RouteFuture<Infallible>, Gathered>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // A Router is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        // No body to wait for: bodiless methods (a WebSocket upgrade, and HTTP/2's extended
        // CONNECT whose "body" is the socket) and empty bodies go straight on.
        let bodiless = matches!(
            *request.method(),
            Method::GET | Method::HEAD | Method::OPTIONS | Method::CONNECT | Method::TRACE
        );
        if bodiless || http_body::Body::is_end_stream(request.body()) {
            return Either::Left(self.routes.call(request));
        }
        let first = match first_frame(&mut request, self.limits.max_bytes) {
            First::Whole(data) => {
                *request.body_mut() = Body::from(data);
                return Either::Left(self.routes.call(request));
            }
            First::Part(part) => Some(part),
            First::NotYet => None,
        };
        Either::Right(Gathered::Reading {
            read: Box::pin(read(request, self.limits.clone(), first)),
            routes: self.routes.clone(),
        })
    }
}

/// What hyper already holds of a small body.
enum First {
    /// The whole body.
    Whole(Bytes),
    /// Its first frame, not the whole of it (or its read's failure): the read goes on from it.
    Part(Result<Bytes, axum::Error>),
    /// Nothing yet, or a body too large (or of no declared length) to look at here.
    NotYet,
}

/// Takes the body's first frame if hyper holds it already and the body declares at most
/// `AT_ONCE` bytes (and no more than `max_bytes`); it is the whole body when it is as long as
/// declared.
fn first_frame(request: &mut Request, max_bytes: usize) -> First {
    let declared = declared_length(request.headers()).and_then(|n| usize::try_from(n).ok());
    let Some(length) = declared.filter(|&n| n <= AT_ONCE.min(max_bytes)) else {
        return First::NotYet;
    };
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    match Pin::new(request.body_mut()).poll_frame(&mut cx) {
        Poll::Pending => First::NotYet,
        Poll::Ready(None) => First::Part(Ok(Bytes::new())),
        Poll::Ready(Some(Err(e))) => First::Part(Err(e)),
        Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
            // Copied out, as the read copies each frame: the frame is a view of the
            // connection's read buffer, and a handler holding it (a stream waiting for its
            // first token holds its request) would keep the whole 8 KiB buffer alive while
            // hyper allocates the connection another.
            Ok(data) if data.len() == length => First::Whole(Bytes::copy_from_slice(&data)),
            Ok(data) => First::Part(Ok(data)),
            // Trailers before any data: an empty body, as the read would have made it.
            Err(_) => First::Part(Ok(Bytes::new())),
        },
    }
}

/// The `Content-Length` a request declares, if any readable one.
fn declared_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

type Refused = (EdgeRefusal, String, String);

type ReadState = Pin<Box<dyn Future<Output = Result<Request, Refused>> + Send>>;

pin_project! {
    /// A request whose body is being read, then the routes' answer to it. The read's state
    /// (the incoming body, its buffer, its timer) is its own allocation, freed once the body
    /// is whole, rather than held beside the handler for as long as the handler runs.
    #[project = GatheredProj]
    pub enum Gathered {
        Reading { read: ReadState, routes: Router },
        Routing {
            #[pin]
            future: RouteFuture<Infallible>,
        },
        /// Refused, and polled again (a caller's bug).
        Answered,
    }
}

impl Future for Gathered {
    type Output = Result<Response, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project() {
                GatheredProj::Reading { read, routes } => match ready!(read.as_mut().poll(cx)) {
                    Ok(request) => {
                        let future = routes.call(request);
                        self.set(Gathered::Routing { future });
                    }
                    Err((refusal, path, id)) => {
                        self.set(Gathered::Answered);
                        return Poll::Ready(Ok(render(refusal, dialect_of(&path), &id)));
                    }
                },
                GatheredProj::Routing { future } => return future.poll(cx),
                GatheredProj::Answered => {
                    let mut response = Response::default();
                    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    return Poll::Ready(Ok(response));
                }
            }
        }
    }
}

/// Reads the rest of the body after `first` (what `first_frame` took of it, if anything).
async fn read(
    request: Request,
    limits: BodyLimits,
    first: Option<Result<Bytes, axum::Error>>,
) -> Result<Request, Refused> {
    let (parts, body) = request.into_parts();
    let dialect = dialect_of(parts.uri.path());
    let refuse = |refusal| {
        (
            refusal,
            parts.uri.path().to_string(),
            request_id(&parts.headers, dialect),
        )
    };
    let declared = declared_length(&parts.headers);
    let too_large = EdgeRefusal::TooLarge {
        limit: limits.max_bytes,
    };
    if declared.is_some_and(|n| n > limits.max_bytes as u64) {
        return Err(refuse(too_large));
    }
    let capacity = declared.map_or(0, |n| n as usize).min(limits.max_bytes);
    let mut whole = BytesMut::new();
    let mut chunks = futures::stream::iter(first).chain(body.into_data_stream());
    let budget = Arc::clone(&limits.buffered);
    let gather = async {
        // The declared length's share first, so the buffer is only allocated once held.
        let mut share: Option<OwnedSemaphorePermit> = None;
        take_share(&budget, &mut share, capacity).await;
        whole.reserve(capacity);
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|_| EdgeRefusal::BodyUnreadable)?;
            let len = whole.len() + chunk.len();
            if len > limits.max_bytes {
                return Err(too_large);
            }
            take_share(&budget, &mut share, len).await;
            whole.extend_from_slice(&chunk);
        }
        // Given back now: the whole body goes to a handler, bounded by its own limits.
        drop(share);
        Ok(())
    };
    match tokio::time::timeout(limits.timeout, gather).await {
        Err(_) => Err(refuse(EdgeRefusal::BodyTimeout)),
        Ok(Err(refusal)) => Err(refuse(refusal)),
        Ok(Ok(())) => Ok(Request::from_parts(parts, Body::from(whole.freeze()))),
    }
}

/// Holds `share` at `bytes` or more, waiting for the budget when it is spent.
async fn take_share(budget: &Arc<Semaphore>, share: &mut Option<OwnedSemaphorePermit>, bytes: usize) {
    let held = share.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
    let want = units(bytes) as usize;
    if want <= held {
        return;
    }
    let more = u32::try_from(want - held).unwrap_or(u32::MAX);
    // The semaphore is never closed.
    let Ok(permit) = Arc::clone(budget).acquire_many_owned(more).await else {
        return;
    };
    match share {
        Some(held) => held.merge(permit),
        None => *share = Some(permit),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use std::task::Waker;

    fn chunked(chunk: usize, then_wait: bool) -> Request {
        let first = futures::stream::iter([Ok::<_, Infallible>(bytes::Bytes::from(vec![b' '; chunk]))]);
        let body = if then_wait {
            Body::from_stream(first.chain(futures::stream::pending()))
        } else {
            Body::from_stream(first)
        };
        axum::http::request::Builder::new()
            .method(Method::POST)
            .uri("/v1/chat/completions")
            .body(body)
            .expect("a valid request")
    }

    #[tokio::test(start_paused = true)]
    async fn bodies_being_gathered_share_one_budget_of_bytes() {
        let routes = Router::new().route(
            "/v1/chat/completions",
            post(|b: bytes::Bytes| async move { b.len().to_string() }),
        );
        // Room for 2 KiB of bodies at once; each may be 2 KiB.
        let mut reader = BodyReader::new(routes, BodyLimits::with_budget(2048, Duration::from_secs(5), 2048));
        // A holds the whole budget and sends no more.
        let mut a = std::pin::pin!(reader.call(chunked(2048, true)));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(a.as_mut().poll(&mut cx).is_pending());
        // B waits for a share it cannot get, unread, until its timeout.
        let b = reader.call(chunked(1024, false)).await.expect("an answer");
        assert_eq!(
            b.status(),
            StatusCode::REQUEST_TIMEOUT,
            "no share while A holds the budget"
        );
        // A's timeout gives its share back; C then goes through.
        let a = a.await.expect("an answer");
        assert_eq!(a.status(), StatusCode::REQUEST_TIMEOUT);
        let c = reader.call(chunked(1024, false)).await.expect("an answer");
        assert_eq!(c.status(), StatusCode::OK, "the budget is free again");
    }

    /// Routes whose chat handler answers with the body it got.
    fn echo() -> Router {
        Router::new().route(
            "/v1/chat/completions",
            post(|b: bytes::Bytes| async move { String::from_utf8_lossy(&b).into_owned() }),
        )
    }

    /// An answer's whole body.
    async fn text(answer: Response) -> bytes::Bytes {
        http_body_util::BodyExt::collect(answer.into_body())
            .await
            .expect("body")
            .to_bytes()
    }

    fn with_length(body: Body, length: usize) -> Request {
        axum::http::request::Builder::new()
            .method(Method::POST)
            .uri("/v1/chat/completions")
            .header(header::CONTENT_LENGTH, length.to_string())
            .body(body)
            .expect("a valid request")
    }

    #[tokio::test(start_paused = true)]
    async fn a_small_body_that_came_whole_goes_to_the_routes_at_once() {
        let routes = echo();
        // No budget at all: a body read the long way would wait for a share until its timeout.
        let mut reader = BodyReader::new(routes, BodyLimits::with_budget(64 * 1024, Duration::from_secs(5), 0));
        let whole = reader.call(with_length(Body::from("{\"a\":1}"), 7));
        assert!(
            matches!(whole, Either::Left(_)),
            "straight to the routes: no read, timer or share"
        );
        let answer = whole.await.expect("an answer");
        assert_eq!(answer.status(), StatusCode::OK);
        let text = text(answer).await;
        assert_eq!(&text[..], b"{\"a\":1}", "the handler got the whole body");
        // Past AT_ONCE, or in more than one frame, it is read and needs its share.
        let big = vec![b' '; AT_ONCE + 1];
        let len = big.len();
        let read = reader.call(with_length(Body::from(big), len)).await.expect("an answer");
        assert_eq!(
            read.status(),
            StatusCode::REQUEST_TIMEOUT,
            "read the long way: no share"
        );
        let frames = futures::stream::iter(["{", "}"].map(|s| Ok::<_, Infallible>(bytes::Bytes::from(s))));
        let split = reader
            .call(with_length(Body::from_stream(frames), 2))
            .await
            .expect("an answer");
        assert_eq!(
            split.status(),
            StatusCode::REQUEST_TIMEOUT,
            "the first frame taken, the rest read"
        );
    }

    #[tokio::test]
    async fn a_body_taken_at_once_does_not_keep_the_connections_read_buffer() {
        // A handler that holds its body, as a stream waiting for its first token does.
        let routes = Router::new().route(
            "/v1/chat/completions",
            post(|body: bytes::Bytes| async move {
                let _held = body;
                std::future::pending::<&'static str>().await
            }),
        );
        let mut reader = BodyReader::new(routes, BodyLimits::new(1024, Duration::from_secs(5)));
        // The frame is a view of a larger buffer, as hyper's frames are of its read buffer.
        let mut buffer = b"{\"a\":1}".to_vec();
        buffer.resize(8192, b' ');
        let buffer = bytes::Bytes::from(buffer);
        let answer = reader.call(with_length(Body::from(buffer.slice(..7)), 7));
        let mut answer = std::pin::pin!(answer);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(
            answer.as_mut().poll(&mut cx).is_pending(),
            "the handler holds its request"
        );
        assert!(
            buffer.is_unique(),
            "the handler holds a copy of its body, not a view that pins the whole buffer"
        );
    }

    #[tokio::test]
    async fn a_body_split_in_frames_is_read_whole_after_its_first_frame() {
        let routes = echo();
        let mut reader = BodyReader::new(routes, BodyLimits::new(1024, Duration::from_secs(5)));
        let frames = futures::stream::iter(["{\"a\"", ":1}"].map(|s| Ok::<_, Infallible>(bytes::Bytes::from(s))));
        let answer = reader
            .call(with_length(Body::from_stream(frames), 7))
            .await
            .expect("an answer");
        assert_eq!(answer.status(), StatusCode::OK);
        let text = text(answer).await;
        assert_eq!(&text[..], b"{\"a\":1}", "the first frame and the rest, in order");
    }

    #[tokio::test]
    async fn once_the_body_is_whole_only_the_handler_is_held() {
        let routes = Router::new().route(
            "/v1/chat/completions",
            post(|_: bytes::Bytes| std::future::pending::<&'static str>()),
        );
        let limits = BodyLimits::new(1024, Duration::from_secs(5));
        let mut reader = BodyReader::new(routes, limits);
        // In two frames, so it is read, not taken at once.
        let frames = futures::stream::iter(["{", "}"].map(|s| Ok::<_, Infallible>(bytes::Bytes::from(s))));
        let request = axum::http::request::Builder::new()
            .method(Method::POST)
            .uri("/v1/chat/completions")
            .header(header::CONTENT_LENGTH, "2")
            .body(Body::from_stream(frames))
            .expect("a valid request");
        let mut answer = std::pin::pin!(reader.call(request));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(answer.as_mut().poll(&mut cx).is_pending(), "the handler never answers");
        assert!(
            matches!(&*answer, Either::Right(Gathered::Routing { .. })),
            "the read (body, buffer, timer) is released once the body is whole"
        );
    }
}
