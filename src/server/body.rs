//! Request bodies at the edge: read whole, bounded in size and in time, before any handler
//! runs. A `Content-Length` over `max_body_bytes` gets a 413 before a body byte is read; a
//! chunked body is counted as it arrives and cut at the limit; a body that has not arrived
//! within `body_read_timeout_ms` gets a 408. All three close the connection.
//!
//! Written here rather than with axum's `DefaultBodyLimit` alone, which only counts bytes
//! while a handler reads and has no clock: a body sent at a byte a second held its
//! connection and handler for as long as the client liked.

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
use bytes::BytesMut;
use futures::future::Either;
use futures::StreamExt;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::reply::{dialect_of, render, request_id, EdgeRefusal};

/// What a request body may be.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    pub max_bytes: usize,
    pub timeout: Duration,
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

    fn call(&mut self, request: Request) -> Self::Future {
        // No body to wait for: bodiless methods (a WebSocket upgrade, and HTTP/2's extended
        // CONNECT whose "body" is the socket) and empty bodies go straight on.
        let bodiless = matches!(
            *request.method(),
            Method::GET | Method::HEAD | Method::OPTIONS | Method::CONNECT | Method::TRACE
        );
        if bodiless || http_body::Body::is_end_stream(request.body()) {
            return Either::Left(self.routes.call(request));
        }
        Either::Right(Gathered::Reading {
            read: Box::pin(read(request, self.limits)),
            routes: self.routes.clone(),
        })
    }
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

async fn read(request: Request, limits: BodyLimits) -> Result<Request, Refused> {
    let (parts, body) = request.into_parts();
    let dialect = dialect_of(parts.uri.path());
    let refuse = |refusal| {
        (
            refusal,
            parts.uri.path().to_string(),
            request_id(&parts.headers, dialect),
        )
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let too_large = EdgeRefusal::TooLarge {
        limit: limits.max_bytes,
    };
    if declared.is_some_and(|n| n > limits.max_bytes as u64) {
        return Err(refuse(too_large));
    }
    let capacity = declared.map_or(0, |n| n as usize).min(limits.max_bytes);
    let mut whole = BytesMut::with_capacity(capacity);
    let mut chunks = body.into_data_stream();
    let gather = async {
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|_| EdgeRefusal::BodyUnreadable)?;
            if whole.len() + chunk.len() > limits.max_bytes {
                return Err(too_large);
            }
            whole.extend_from_slice(&chunk);
        }
        Ok(())
    };
    match tokio::time::timeout(limits.timeout, gather).await {
        Err(_) => Err(refuse(EdgeRefusal::BodyTimeout)),
        Ok(Err(refusal)) => Err(refuse(refusal)),
        Ok(Ok(())) => Ok(Request::from_parts(parts, Body::from(whole.freeze()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use std::task::Waker;

    #[tokio::test]
    async fn once_the_body_is_whole_only_the_handler_is_held() {
        let routes = Router::new().route(
            "/v1/chat/completions",
            post(|_: bytes::Bytes| std::future::pending::<&'static str>()),
        );
        let limits = BodyLimits {
            max_bytes: 1024,
            timeout: Duration::from_secs(5),
        };
        let mut reader = BodyReader::new(routes, limits);
        let request = axum::http::request::Builder::new()
            .method(Method::POST)
            .uri("/v1/chat/completions")
            .header(header::CONTENT_LENGTH, "2")
            .body(Body::from("{}"))
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
