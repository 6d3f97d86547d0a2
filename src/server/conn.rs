//! One client connection: its socket with a write timeout, the requests it has in flight, and
//! the watchdog that closes it when it has been idle too long.
//!
//! hyper-util's auto builder starts HTTP/1's header timer only once it has seen which HTTP
//! version the client speaks, so a connection that sent nothing, only "P", or part of the
//! HTTP/2 preface was held forever; HTTP/2 has no idle timeout at all. The watchdog here
//! counts from accept instead: until the first request arrives the connection may sit for
//! `header_read_timeout`, and between requests (none in flight) for `idle_timeout`. Requests
//! are counted by the service (`Tracked`) from the moment hyper hands one over until its
//! response body is dropped, so a long stream is never idle.
//!
//! A client that stops reading is found by the socket's write timeout
//! (`client_write_timeout`, via `tokio-io-timeout`): once a write has waited that long without
//! a byte taken, the connection fails, hyper drops its responses, and with each its pump,
//! upstream and slot.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper_util::rt::TokioIo;
use pin_project_lite::pin_project;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};
use tokio_io_timeout::TimeoutStream;

use super::app::{Edge, EdgeFuture};
use super::head;
use super::sniff::Sniffed;

/// A client socket whose writes fail after `client_write_timeout` without progress, its first
/// bytes sniffed for the HTTP/2 preface (`sniff`).
pub type ClientIo = TokioIo<Sniffed<Pin<Box<TimeoutStream<TcpStream>>>>>;

pub fn client_io(stream: TcpStream, write_timeout: Duration) -> ClientIo {
    let mut io = TimeoutStream::new(stream);
    io.set_write_timeout(Some(write_timeout));
    TokioIo::new(Sniffed::new(Box::pin(io)))
}

/// How busy a connection is, and since when it has been idle.
#[derive(Debug, Clone, Copy)]
struct Load {
    in_flight: usize,
    idle_since: Instant,
    /// Has any request arrived yet? Until one has, the header timeout applies.
    served: bool,
    /// A stream on it was given up because its client stopped reading: close it now.
    abandoned: bool,
}

/// A connection's requests in flight, shared by its service and its watchdog.
#[derive(Debug, Clone)]
pub struct Activity {
    load: Arc<watch::Sender<Load>>,
}

impl Activity {
    /// A connection accepted now.
    pub fn new() -> Self {
        let (load, _) = watch::channel(Load {
            in_flight: 0,
            idle_since: Instant::now(),
            served: false,
            abandoned: false,
        });
        Activity { load: Arc::new(load) }
    }

    /// A request arrived; it counts until the returned guard is dropped.
    fn begin(&self) -> InFlight {
        self.load.send_modify(|l| {
            l.in_flight += 1;
            l.served = true;
        });
        InFlight(self.clone())
    }

    /// Resolves when the connection has had no request in flight for its limit: `first`
    /// before any request arrived (counted from accept), `idle` after one.
    pub async fn idle_past(&self, first: Duration, idle: Duration) {
        let mut changes = self.load.subscribe();
        loop {
            let load = *changes.borrow_and_update();
            if load.abandoned {
                return;
            }
            if load.in_flight == 0 {
                let limit = if load.served { idle } else { first };
                tokio::select! {
                    _ = sleep_until(load.idle_since + limit) => return,
                    _ = changes.changed() => {}
                }
            } else if changes.changed().await.is_err() {
                // Unreachable while `self` holds the sender; never close on it.
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Default for Activity {
    fn default() -> Self {
        Activity::new()
    }
}

/// The connection a request came on, in the request's extensions: `abandon` closes it at
/// once. For a stream whose client took no event for `client_write_timeout_ms`: over HTTP/2 a
/// client can keep its connection alive (reading other streams, answering pings) while never
/// opening one stream's window, and hyper then never polls that stream's body again, so the
/// stream and its body would be held for as long as the connection lives. Closing the
/// connection is what the socket's write timeout does over HTTP/1.1 for a client that stops
/// reading.
#[derive(Debug, Clone)]
pub struct ConnHandle(Activity);

impl ConnHandle {
    /// Closes the connection (its watchdog drops it, with every stream on it).
    pub fn abandon(&self) {
        self.0.load.send_modify(|l| l.abandoned = true);
    }
}

/// One request in flight; dropped with its response body.
#[derive(Debug)]
struct InFlight(Activity);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.load.send_modify(|l| {
            l.in_flight = l.in_flight.saturating_sub(1);
            if l.in_flight == 0 {
                l.idle_since = Instant::now();
            }
        });
    }
}

/// The app as one connection's service: each request counts as in flight until its response
/// body is dropped.
#[derive(Clone)]
pub struct Tracked {
    app: Edge,
    activity: Activity,
    permit: ConnPermit,
}

impl Tracked {
    pub fn new(app: Edge, activity: Activity, permit: ConnPermit) -> Self {
        Tracked { app, activity, permit }
    }
}

/// The connection's place under `max_connections`, shared: the connection holds it, and so
/// does a WebSocket upgraded from it (given to the upgrade request as an extension), so a
/// socket that outlives its HTTP connection still counts until it closes.
#[derive(Clone)]
pub struct ConnPermit(
    /// Held, never read: the place is given back when the last holder drops it.
    #[allow(dead_code)]
    Arc<tokio::sync::OwnedSemaphorePermit>,
);

impl ConnPermit {
    pub fn new(permit: tokio::sync::OwnedSemaphorePermit) -> Self {
        ConnPermit(Arc::new(permit))
    }
}

impl<B> tower_service::Service<axum::http::Request<B>> for Tracked
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = TrackedFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The edge service is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<B>) -> TrackedFuture {
        let in_flight = self.activity.begin();
        let (mut parts, body) = request.into_parts();
        head::unshare(&mut parts);
        // Only an upgrade (HTTP/1.1 `Upgrade`, HTTP/2's extended CONNECT) can outlive the
        // connection; other requests never see the permit.
        if parts.headers.contains_key(http::header::UPGRADE) || parts.method == http::Method::CONNECT {
            parts.extensions.insert(self.permit.clone());
        }
        parts.extensions.insert(ConnHandle(self.activity.clone()));
        let request = Request::from_parts(parts, Body::new(body));
        TrackedFuture {
            answer: self.app.call(request),
            in_flight: Some(in_flight),
        }
    }
}

pin_project! {
    /// The answer to one request through `Tracked`: the edge's answer held inline (hyper
    /// already boxes the service future), its body counted in flight once it arrives.
    pub struct TrackedFuture {
        #[pin]
        answer: EdgeFuture,
        in_flight: Option<InFlight>,
    }
}

impl Future for TrackedFuture {
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Ok(response) = ready!(this.answer.poll(cx));
        Poll::Ready(Ok(match this.in_flight.take() {
            Some(in_flight) => response.map(|body| {
                Body::new(Counted {
                    body,
                    _in_flight: in_flight,
                })
            }),
            // Polled again after it answered: the edge future's own answer to that (a 500).
            None => response,
        }))
    }
}

/// A response body that keeps its request counted as in flight until it is dropped.
struct Counted {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_sends_a_request_is_idle_after_the_header_timeout() {
        let activity = Activity::new();
        let start = Instant::now();
        activity
            .idle_past(Duration::from_secs(10), Duration::from_secs(60))
            .await;
        assert_eq!(start.elapsed(), Duration::from_secs(10), "counted from accept");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_is_never_idle_and_idleness_counts_from_its_end() {
        let activity = Activity::new();
        let request = activity.begin();
        let start = Instant::now();
        let watchdog = {
            let activity = activity.clone();
            tokio::spawn(async move { activity.idle_past(Duration::from_secs(1), Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(!watchdog.is_finished(), "a long request keeps the connection");
        drop(request);
        watchdog.await.expect("watchdog ends");
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(105),
            "the idle timeout runs from the end of the last request"
        );
    }
}
