//! HTTP/1.1 upstream connections of our own, driven through hyper's `client::conn::http1`:
//! one task per connection and none per request, and no per-request pool checkout.
//!
//! Why by hand: hyper-util's pooled client spawns a task for every HTTP/1.1 request whose
//! body is still streaming when its head arrives (every streamed answer), to put the
//! connection back once it is idle again; it also boxes each request's future and races a
//! lazy connect against each checkout. The spawn sits on the time to first token (scheduling
//! a task usually wakes the other worker), and the task lives as long as the answer. hyper's
//! `client::conn::http1` is the protocol; what a keep-alive pool needs beyond it is small:
//! take an idle connection that is ready, else connect; put it back when its answer's body
//! has ended; close one that idles.
//!
//! Which upstreams: plain `http://` ones reached directly (no proxy) without HTTP/2 prior
//! knowledge, which speak HTTP/1.1 from their first byte (`lanes`): local and LAN model
//! servers, the simulated upstream. https upstreams negotiate by ALPN and stay on the pooled
//! client; through a proxy a plain-http request goes in absolute form, which only it speaks.
//!
//! Keep-alive: a connection goes back to the idle list when its answer's body has ended; a
//! body dropped before its end (a hedge's loser, a client gone) closes its connection, since
//! HTTP/1.1 cannot abandon one answer and reuse the connection. A request takes the most
//! recently used idle connection that is ready, else opens one. A connection goes back as its
//! answer's body ends, a moment before hyper's task has read past that answer and marked it
//! ready: a request that finds only such a one waits for it (`READY_WAIT` at most, then it
//! closes it and connects), as hyper-util waited for the connection to be idle again. At most `POOL_MAX_IDLE_PER_HOST` are kept
//! idle (the oldest closes), each closed after `POOL_IDLE_TIMEOUT` unused. A request that a
//! reused connection refused before writing it (the peer closed the connection while it
//! idled) is sent once more on a new connection, as hyper-util does; one that was written is
//! never sent again (the peer may have processed it: a duplicate, billed call).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, HOST};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{Builder, Connection, SendRequest};
use parking_lot::Mutex;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::client::{Connector, RequestBody, POOL_IDLE_TIMEOUT, POOL_MAX_IDLE_PER_HOST};
use super::h2_pool::ConnectFailed;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

type Io = <Connector as Service<Uri>>::Response;

/// How long a request waits for an idle connection hyper has not yet marked ready (it is
/// finishing the last answer: microseconds, unless its exchange is stuck) before it connects.
const READY_WAIT: Duration = Duration::from_millis(250);

/// One upstream's HTTP/1.1 connections.
pub(crate) struct H1Pool {
    /// Host and port, for log lines.
    upstream: String,
    /// `http://authority/`, what the connector reaches.
    target: Uri,
    /// The `Host` header every request carries.
    host: HeaderValue,
    connector: Connector,
    /// Idle connections, the most recently used last.
    idle: Mutex<Vec<Idle>>,
    next_id: AtomicU64,
    /// Answers whose body holds their connection.
    answering: AtomicUsize,
}

struct Idle {
    conn: Leased,
    since: Instant,
}

/// A connection's sender, while one request is on it.
struct Leased {
    id: u64,
    send: SendRequest<RequestBody>,
    reused: bool,
}

impl H1Pool {
    /// A pool for the upstream at `target` (`http://authority/`); `None` when it names no
    /// host a `Host` header can carry.
    pub fn new(upstream: String, target: Uri, connector: Connector) -> Option<Self> {
        // As hyper-util writes it: the host, and the port unless it is http's default (never
        // a userinfo a base URL may carry).
        let host = match target.port_u16() {
            Some(port) if port != 80 => format!("{}:{port}", target.host()?),
            _ => target.host()?.to_string(),
        };
        let host = HeaderValue::from_str(&host).ok()?;
        Some(H1Pool {
            upstream,
            target,
            host,
            connector,
            idle: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
            answering: AtomicUsize::new(0),
        })
    }

    /// Sends `request` on an idle connection that is ready, or a new one; resolves at the
    /// response's head.
    pub fn send(
        self: Arc<Self>,
        request: Request<RequestBody>,
    ) -> impl Future<Output = Result<Response<H1Body>, BoxError>> + Send + 'static {
        let first = self.checkout();
        self.send_from(first, request)
    }

    /// The connect is boxed where it is awaited: inline, its state (the connector's futures,
    /// the handshake) would size this future, which a request waiting for its answer's head
    /// keeps, though most requests never connect.
    async fn send_from(
        self: Arc<Self>,
        first: Option<Leased>,
        mut request: Request<RequestBody>,
    ) -> Result<Response<H1Body>, BoxError> {
        self.origin_form(&mut request);
        let mut conn = match first {
            Some(mut conn) if !conn.send.is_ready() => {
                let ready = tokio::time::timeout(READY_WAIT, conn.send.ready()).await;
                if matches!(ready, Ok(Ok(()))) {
                    conn
                } else {
                    Box::pin(self.connect()).await?
                }
            }
            Some(conn) => conn,
            None => Box::pin(self.connect()).await?,
        };
        loop {
            match conn.send.try_send_request(request).await {
                Ok(response) => {
                    self.answering.fetch_add(1, Ordering::Relaxed);
                    let pool = Arc::downgrade(&self);
                    return Ok(response.map(|body| H1Body {
                        body,
                        conn: Some(conn),
                        pool,
                    }));
                }
                Err(mut e) => match e.take_message() {
                    Some(unsent) if conn.reused => {
                        tracing::debug!(upstream = %self.upstream, error = %e.error(), "reused connection closed before the request was written; sending it on a new one");
                        request = unsent;
                        conn = Box::pin(self.connect()).await?;
                    }
                    _ => return Err(Box::new(e.into_error())),
                },
            }
        }
    }

    /// The request as HTTP/1.1 sends it to an origin server: the path alone, and `Host`
    /// unless the request names one.
    fn origin_form(&self, request: &mut Request<RequestBody>) {
        let path = request
            .uri()
            .path_and_query()
            .map_or_else(|| Uri::from_static("/"), |p| Uri::from(p.clone()));
        *request.uri_mut() = path;
        request.headers_mut().entry(HOST).or_insert_with(|| self.host.clone());
    }

    /// The most recently used idle connection that is ready, else the most recent one hyper
    /// is still finishing an answer on. Closed and expired ones are dropped.
    fn checkout(&self) -> Option<Leased> {
        let now = Instant::now();
        let mut idle = self.idle.lock();
        idle.retain(|entry| !entry.conn.send.is_closed() && now < entry.since + POOL_IDLE_TIMEOUT);
        let pick = idle
            .iter()
            .rposition(|entry| entry.conn.send.is_ready())
            .or_else(|| idle.len().checked_sub(1))?;
        let mut conn = idle.remove(pick).conn;
        conn.reused = true;
        Some(conn)
    }

    /// Puts a connection whose answer ended back in the idle list.
    fn put(&self, conn: Leased) {
        if conn.send.is_closed() {
            return;
        }
        let mut idle = self.idle.lock();
        idle.retain(|entry| !entry.conn.send.is_closed());
        if idle.len() >= POOL_MAX_IDLE_PER_HOST {
            // The oldest closes: dropping its sender lets hyper end the connection.
            idle.remove(0);
        }
        idle.push(Idle {
            conn,
            since: Instant::now(),
        });
    }

    /// A new connection (the shared connector: TCP_NODELAY, the connect bound), driven by a
    /// task of its own until it closes.
    async fn connect(self: &Arc<Self>) -> Result<Leased, BoxError> {
        let failed = |e: BoxError| -> BoxError { Box::new(ConnectFailed::new(e)) };
        let mut connector = self.connector.clone();
        futures::future::poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(failed)?;
        let io = connector.call(self.target.clone()).await.map_err(failed)?;
        let (send, connection) = Builder::new().handshake(io).await.map_err(|e| failed(Box::new(e)))?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(Drive::new(Arc::downgrade(self), id, connection));
        Ok(Leased {
            id,
            send,
            reused: false,
        })
    }

    /// Connections idle now, and answers holding theirs.
    #[cfg(test)]
    pub fn counts(&self) -> (usize, usize) {
        (self.idle.lock().len(), self.answering.load(Ordering::Relaxed))
    }
}

pin_project_lite::pin_project! {
    /// A connection's life: driven until it closes. It is taken out of the idle list once it
    /// sat there `POOL_IDLE_TIMEOUT` (its sender dropped, hyper closes it): looked at when that
    /// much time has passed since it went idle, or since the last look while it was in use.
    /// A future of its own rather than an async fn, so the task holds the connection once
    /// (an async fn keeps its argument's slot beside the pinned local).
    struct Drive {
        #[pin]
        connection: Connection<Io, RequestBody>,
        #[pin]
        check: Sleep,
        pool: Weak<H1Pool>,
        id: u64,
    }
}

impl Drive {
    fn new(pool: Weak<H1Pool>, id: u64, connection: Connection<Io, RequestBody>) -> Self {
        Drive {
            connection,
            check: tokio::time::sleep(POOL_IDLE_TIMEOUT),
            pool,
            id,
        }
    }
}

impl Future for Drive {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        if let Poll::Ready(ended) = this.connection.poll(cx) {
            if let Err(e) = ended {
                tracing::debug!(error = %e, "upstream HTTP/1.1 connection ended");
            }
            return Poll::Ready(());
        }
        while this.check.as_mut().poll(cx).is_ready() {
            let Some(pool) = this.pool.upgrade() else {
                return Poll::Ready(());
            };
            let now = Instant::now();
            let mut idle = pool.idle.lock();
            let since = idle
                .iter()
                .find(|entry| entry.conn.id == *this.id)
                .map(|entry| entry.since);
            let next = match since {
                Some(since) if now >= since + POOL_IDLE_TIMEOUT => {
                    // Its sender dropped: hyper closes the connection, and `connection` ends.
                    idle.retain(|entry| entry.conn.id != *this.id);
                    now + POOL_IDLE_TIMEOUT
                }
                Some(since) => since + POOL_IDLE_TIMEOUT,
                None => now + POOL_IDLE_TIMEOUT,
            };
            this.check.as_mut().reset(next);
        }
        Poll::Pending
    }
}

/// An upstream response's body read from an HTTP/1.1 connection of the pool's; the
/// connection goes back to the pool when the body has ended.
pub struct H1Body {
    body: Incoming,
    /// Until the body ends, fails or is dropped.
    conn: Option<Leased>,
    pool: Weak<H1Pool>,
}

impl H1Body {
    /// Gives the connection back when the answer is whole (`whole`); a failed or unfinished
    /// one's connection is dropped (hyper closes it). One hyper will not reuse (the upstream
    /// said `Connection: close`) is never taken again: `put` and `checkout` skip it.
    fn release(&mut self, whole: bool) {
        let Some(conn) = self.conn.take() else { return };
        let Some(pool) = self.pool.upgrade() else { return };
        pool.answering.fetch_sub(1, Ordering::Relaxed);
        if whole {
            pool.put(conn);
        }
    }
}

impl fmt::Debug for H1Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("H1Body").field("body", &self.body).finish()
    }
}

impl Body for H1Body {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = ready!(Pin::new(&mut self.body).poll_frame(cx));
        match &polled {
            // The end of a chunked or a sized body alike (`is_end_stream` tells only a sized
            // body's end: a chunked one never says it).
            None => self.release(true),
            // Not reusable: hyper closes it.
            Some(Err(_)) => self.release(false),
            Some(Ok(_)) if self.body.is_end_stream() => self.release(true),
            Some(Ok(_)) => {}
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for H1Body {
    fn drop(&mut self) {
        // A reader that stopped at a sized body's `is_end_stream` without asking for the end.
        let whole = self.body.is_end_stream();
        self.release(whole);
    }
}

#[cfg(test)]
mod tests;
