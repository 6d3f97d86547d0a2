//! HTTP/2 upstream connections driven through the `h2` crate directly: per upstream a few
//! connections, one task per connection and none per request, so a stream waiting for its
//! first token costs its h2 stream state and the caller's own future only.
//!
//! Why by hand: hyper's HTTP/2 client spawns two tasks for every request (the wait for the
//! response and the body pipe) and hyper-util's pool boxes each request's checkout; at the
//! held-stream peak that was about 8.5 KiB per stream (DHAT, docs/perf/README.md), a third
//! of what a held stream cost. The `h2` crate is the protocol; it has no pool, and what a
//! pool needs here is small: pick a connection with room, connect when none has any, close
//! one that idles.
//!
//! How: a request takes the first connection with room under the peer's stream limit as h2
//! tracks it (every SETTINGS frame, not only the preface; until the first one, and when the
//! peer names none, `DEFAULT_STREAMS_PER_CONNECTION`); when every connection is full a new one
//! is opened, up to `MAX_CONNECTIONS`, then the least loaded takes it and h2 makes it wait for
//! a slot (logged once per upstream). A connection's task connects (the shared connector:
//! proxy tunnel, TLS, the connect bound), hands the handshake's sender to the requests waiting
//! on it, drives the connection, and lets it close after `POOL_IDLE_TIMEOUT` with no stream. A
//! request's body is in memory already, so it goes in one `send_data`: h2 frames it as the
//! peer's windows allow, with no pipe. A stream refused unprocessed (REFUSED_STREAM, above a
//! GOAWAY's last stream, or a connection that closed before it was sent) is sent again on
//! another connection, once, as hyper-util's pool retries a request that never reached a
//! reused connection.
//!
//! An https upstream that turns out not to negotiate h2 by ALPN is reported as such
//! (`Sending::NotH2`): the caller sends the request the pooled way.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use h2::Reason;
use http::header::{HeaderMap, HeaderValue, CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING, UPGRADE};
use http::{Method, Request, Response, Uri};
use hyper_util::client::legacy::connect::Connection;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;
use tower_service::Service;

use super::client::{Connector, RequestBody, POOL_IDLE_TIMEOUT};
use super::h2_body::H2Body;
use super::settings::DEFAULT_STREAMS_PER_CONNECTION;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Connections per upstream at most: at the default limit, 3,200 streams at once to one
/// upstream before any waits in h2 for a slot.
pub const MAX_CONNECTIONS: usize = 32;

/// A stream's receive window: what one stream's unread answer may hold in memory before the
/// peer must wait (an answer is read as its client reads it). 256 KiB is a 25 MB/s stream
/// at a 10 ms round trip, far above any model's pace.
const STREAM_WINDOW: u32 = 256 * 1024;

/// The connection's receive window: 64 streams' worth, so a few clients that stop reading
/// never stall the other streams on their connection.
const CONNECTION_WINDOW: u32 = 64 * STREAM_WINDOW;

/// The largest response head accepted (hyper's client default).
const MAX_HEADER_LIST: u32 = 16 * 1024;

/// Tries of one request at most: the first, and one more after an unprocessed refusal.
const TRIES: usize = 2;

/// One upstream's HTTP/2 connections.
pub(crate) struct H2Pool {
    /// Host and port, for log lines.
    upstream: String,
    /// `scheme://authority`, what the connector reaches.
    target: Uri,
    /// Every connection speaks HTTP/2 from its first byte (h2c); else only by ALPN.
    prior_knowledge: bool,
    connector: Connector,
    full_logged: AtomicBool,
    conns: Mutex<Vec<Arc<Conn>>>,
}

/// How a request fared.
pub(crate) enum Sending {
    Failed(BoxError),
    /// The upstream negotiated HTTP/1.1: the request, unsent, for the pooled client (boxed:
    /// once per upstream at most).
    NotH2(Box<Request<RequestBody>>),
}

/// A connection's state, as the requests waiting on it see it.
#[derive(Clone)]
enum State {
    Connecting,
    Ready(SendRequest<Bytes>),
    Failed(Arc<BoxError>),
    NotH2,
    /// Closed, or closing: no new stream.
    Closed,
}

struct Conn {
    state: watch::Sender<State>,
    /// The streams it takes until the peer's SETTINGS say (h2 starts from it).
    assumed: usize,
    in_flight: AtomicUsize,
    /// When its last stream ended (its opening, before any).
    idle_since: Mutex<Instant>,
}

impl Conn {
    fn usable(&self) -> bool {
        matches!(*self.state.borrow(), State::Connecting | State::Ready(_))
    }

    /// Streams the peer allows on it now (h2 follows every SETTINGS frame).
    fn limit(&self) -> usize {
        match &*self.state.borrow() {
            State::Ready(send) => send.current_max_send_streams(),
            _ => self.assumed,
        }
    }

    /// Takes it out of use: it refused a stream or closed (a GOAWAY leaves h2's connection
    /// running until its open streams end, so its task has not marked it yet).
    fn retire(&self) {
        self.state.send_if_modified(|state| {
            let ready = matches!(state, State::Ready(_));
            if ready {
                *state = State::Closed;
            }
            ready
        });
    }

    fn has_room(&self) -> bool {
        self.usable() && self.in_flight.load(Ordering::Relaxed) < self.limit()
    }
}

/// A stream counted on its connection until this is dropped.
pub(crate) struct Taken(Arc<Conn>);

impl Drop for Taken {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            *self.0.idle_since.lock() = Instant::now();
        }
    }
}

impl fmt::Debug for Taken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Taken")
    }
}

/// A connection closed before the request could be sent on it.
#[derive(Debug, thiserror::Error)]
#[error("upstream connection closed")]
pub(crate) struct ConnectionClosed;

/// A connect (TCP, proxy tunnel, TLS or the h2 handshake) that failed, told to every
/// request that waited on it; the connect bound's `ConnectTimedOut`, the proxy's
/// `ProxyFailed` and rustls' errors are in its chain.
#[derive(Debug)]
pub(crate) struct ConnectFailed(Arc<BoxError>);

impl fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("could not connect")
    }
}

impl ConnectFailed {
    pub(crate) fn new(e: BoxError) -> Self {
        ConnectFailed(Arc::new(e))
    }
}

impl std::error::Error for ConnectFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // The connect's own error, so a classifier walking the chain sees it (the connect
        // bound's timeout, the proxy's or TLS' failure).
        Some(&**self.0)
    }
}

impl H2Pool {
    pub fn new(upstream: String, target: Uri, prior_knowledge: bool, connector: Connector) -> Self {
        H2Pool {
            upstream,
            target,
            prior_knowledge,
            connector,
            full_logged: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
        }
    }

    /// Sends `request` on a connection with room, counted on it from now; resolves at the
    /// response's head.
    pub fn send(
        self: Arc<Self>,
        request: Request<RequestBody>,
    ) -> impl Future<Output = Result<Response<H2Body>, Sending>> + Send + 'static {
        let first = self.take();
        self.send_from(first, request)
    }

    async fn send_from(
        self: Arc<Self>,
        first: Taken,
        request: Request<RequestBody>,
    ) -> Result<Response<H2Body>, Sending> {
        let (parts, body) = request.into_parts();
        let body = body_bytes(body);
        let mut last = None;
        let mut first = Some(first);
        for _ in 0..TRIES {
            let taken = first.take().unwrap_or_else(|| self.take());
            let send = match wait_ready(&taken.0).await {
                Ok(send) => send,
                Err(Waited::NotH2) => {
                    let request = Request::from_parts(parts, RequestBody::new(body));
                    return Err(Sending::NotH2(Box::new(request)));
                }
                Err(Waited::Failed(e)) => return Err(Sending::Failed(e)),
                Err(Waited::Closed) => {
                    last = Some(Box::new(ConnectionClosed) as BoxError);
                    continue;
                }
            };
            let head = head(&parts.method, &parts.uri, &parts.headers, body.len());
            match open(send, head, body.clone()).await {
                Ok(response) => return Ok(response.map(|recv| H2Body::new(recv, taken))),
                Err(Opened::NotSent(e)) => {
                    taken.0.retire();
                    tracing::debug!(upstream = %self.upstream, error = %e, "connection gone before the stream was sent; sending it on another");
                    last = Some(Box::new(e));
                }
                Err(Opened::Failed(e)) if unprocessed(&e) => {
                    taken.0.retire();
                    tracing::debug!(upstream = %self.upstream, error = %e, "stream refused unprocessed; sending it again");
                    last = Some(Box::new(e));
                }
                Err(Opened::Failed(e)) => return Err(Sending::Failed(Box::new(e))),
            }
        }
        Err(Sending::Failed(last.unwrap_or_else(|| Box::new(ConnectionClosed))))
    }

    /// A connection for one more stream, counted on it.
    fn take(self: &Arc<Self>) -> Taken {
        let mut conns = self.conns.lock();
        conns.retain(|conn| conn.usable());
        let pick = match conns.iter().find(|conn| conn.has_room()) {
            Some(conn) => Arc::clone(conn),
            None if conns.len() < MAX_CONNECTIONS => self.open_connection(&mut conns),
            None => {
                if !self.full_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        upstream = %self.upstream,
                        connections = MAX_CONNECTIONS,
                        "every connection to the upstream is at its stream limit; further requests wait for a stream to end"
                    );
                }
                match conns.iter().min_by_key(|conn| conn.in_flight.load(Ordering::Relaxed)) {
                    Some(conn) => Arc::clone(conn),
                    None => self.open_connection(&mut conns),
                }
            }
        };
        pick.in_flight.fetch_add(1, Ordering::Relaxed);
        Taken(pick)
    }

    /// A new connection, assuming the smallest limit its siblings know of the same peer (the
    /// default when it has none): a peer that allows one stream per connection would
    /// otherwise see a burst queue on the new connection until its SETTINGS came.
    fn open_connection(self: &Arc<Self>, conns: &mut Vec<Arc<Conn>>) -> Arc<Conn> {
        let assumed = conns
            .iter()
            .map(|conn| conn.limit())
            .min()
            .unwrap_or(DEFAULT_STREAMS_PER_CONNECTION)
            .max(1);
        let conn = Arc::new(Conn {
            state: watch::Sender::new(State::Connecting),
            assumed,
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        });
        conns.push(Arc::clone(&conn));
        tokio::spawn(drive(Arc::clone(self), Arc::clone(&conn)));
        conn
    }

    /// Connections open or opening, and streams in flight on them.
    #[cfg(test)]
    pub fn counts(&self) -> (usize, usize) {
        let conns = self.conns.lock();
        let open: Vec<_> = conns.iter().filter(|conn| conn.usable()).collect();
        let in_flight = open.iter().map(|conn| conn.in_flight.load(Ordering::Relaxed)).sum();
        (open.len(), in_flight)
    }
}

/// A connection's life: connect, hand out its sender, drive it, close it when idle.
async fn drive(pool: Arc<H2Pool>, conn: Arc<Conn>) {
    let mut connector = pool.connector.clone();
    let connecting = async {
        futures::future::poll_fn(|cx| connector.poll_ready(cx)).await?;
        connector.call(pool.target.clone()).await
    };
    let io = match connecting.await {
        Ok(io) => io,
        Err(e) => {
            conn.state.send_replace(State::Failed(Arc::new(e)));
            return;
        }
    };
    if !pool.prior_knowledge && !io.connected().is_negotiated_h2() {
        conn.state.send_replace(State::NotH2);
        return;
    }
    let handshake = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_header_list_size(MAX_HEADER_LIST)
        .initial_max_send_streams(conn.assumed)
        .enable_push(false)
        .handshake::<_, Bytes>(TokioIo::new(io));
    let (send, connection) = match handshake.await {
        Ok(pair) => pair,
        Err(e) => {
            conn.state.send_replace(State::Failed(Arc::new(Box::new(e))));
            return;
        }
    };
    conn.state.send_replace(State::Ready(send));
    tokio::pin!(connection);
    let mut check = Instant::now() + POOL_IDLE_TIMEOUT;
    loop {
        tokio::select! {
            ended = &mut connection => {
                if let Err(e) = ended {
                    tracing::debug!(upstream = %pool.upstream, error = %e, "upstream HTTP/2 connection ended");
                }
                break;
            }
            () = tokio::time::sleep_until(check) => {
                // Under the pool's lock, so no request takes it between the check and the close.
                let _conns = pool.conns.lock();
                let idle_since = *conn.idle_since.lock();
                if conn.in_flight.load(Ordering::Relaxed) == 0 && idle_since + POOL_IDLE_TIMEOUT <= Instant::now() {
                    // Dropping the last sender lets h2 close the connection once its streams end.
                    conn.state.send_replace(State::Closed);
                    check = Instant::now() + Duration::from_secs(24 * 3600);
                } else {
                    check = idle_since.max(Instant::now()) + POOL_IDLE_TIMEOUT;
                }
            }
        }
    }
    conn.state.send_replace(State::Closed);
}

enum Waited {
    NotH2,
    Failed(BoxError),
    Closed,
}

/// The connection's sender once its handshake is done.
async fn wait_ready(conn: &Conn) -> Result<SendRequest<Bytes>, Waited> {
    let mut state = conn.state.subscribe();
    loop {
        let now = state.borrow_and_update().clone();
        match now {
            State::Ready(send) => return Ok(send),
            State::NotH2 => return Err(Waited::NotH2),
            State::Failed(e) => return Err(Waited::Failed(Box::new(ConnectFailed(e)))),
            State::Closed => return Err(Waited::Closed),
            State::Connecting => {}
        }
        if state.changed().await.is_err() {
            return Err(Waited::Closed);
        }
    }
}

/// Why a stream got no response head.
enum Opened {
    /// The connection closed before the stream went out: nothing reached the peer.
    NotSent(h2::Error),
    Failed(h2::Error),
}

/// Opens the stream, sends the whole body, and waits for the response's head.
async fn open(send: SendRequest<Bytes>, head: Request<()>, body: Bytes) -> Result<Response<h2::RecvStream>, Opened> {
    let mut send = send.ready().await.map_err(Opened::NotSent)?;
    let (response, mut body_tx) = send.send_request(head, body.is_empty()).map_err(|e| {
        if e.is_io() || e.is_go_away() {
            Opened::NotSent(e)
        } else {
            Opened::Failed(e)
        }
    })?;
    if !body.is_empty() {
        body_tx.send_data(body, true).map_err(Opened::Failed)?;
    }
    response.await.map_err(Opened::Failed)
}

/// The request's head as h2 takes it: no connection-specific header (RFC 9113 §8.2.2), no
/// `Host` (the URI's authority is `:authority`), and the body's length.
fn head(method: &Method, uri: &Uri, headers: &HeaderMap, len: usize) -> Request<()> {
    let mut head = Request::new(());
    *head.method_mut() = method.clone();
    *head.uri_mut() = uri.clone();
    let mut headers = headers.clone();
    for name in [CONNECTION, HOST, TRANSFER_ENCODING, UPGRADE] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
    if !headers.contains_key(CONTENT_LENGTH) && (len > 0 || method == Method::POST) {
        headers.insert(CONTENT_LENGTH, HeaderValue::from(len));
    }
    *head.headers_mut() = headers;
    head
}

/// Whether the peer refused the stream before processing it (RFC 9113 §8.7): it may be
/// sent again on another connection. An I/O error after the stream went out is not: the
/// peer may have processed it.
fn unprocessed(e: &h2::Error) -> bool {
    // A graceful GOAWAY errors only the streams above its last stream id; an error GOAWAY
    // may end processed ones too, so only the first is taken for a refusal.
    e.is_remote()
        && (e.reason() == Some(Reason::REFUSED_STREAM) || e.is_go_away() && e.reason() == Some(Reason::NO_ERROR))
}

/// The bytes of a request body (`Full` holds them whole; it yields them at once).
fn body_bytes(body: RequestBody) -> Bytes {
    use http_body::Body;
    let mut body = std::pin::pin!(body);
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    match body.as_mut().poll_frame(&mut cx) {
        std::task::Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => Bytes::new(),
    }
}

#[cfg(test)]
mod tests;
