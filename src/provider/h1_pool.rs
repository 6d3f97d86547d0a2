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
//! recently used idle connection that is ready (one whose last answer hyper is still
//! finishing is left for later), else opens one. At most `POOL_MAX_IDLE_PER_HOST` are kept
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

use bytes::Bytes;
use http::header::{HeaderValue, HOST};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{Builder, Connection, SendRequest};
use parking_lot::Mutex;
use tokio::time::Instant;
use tower_service::Service;

use super::client::{Connector, RequestBody, POOL_IDLE_TIMEOUT, POOL_MAX_IDLE_PER_HOST};
use super::h2_pool::ConnectFailed;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

type Io = <Connector as Service<Uri>>::Response;

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
        let host = HeaderValue::from_str(target.authority()?.as_str()).ok()?;
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

    async fn send_from(
        self: Arc<Self>,
        first: Option<Leased>,
        mut request: Request<RequestBody>,
    ) -> Result<Response<H1Body>, BoxError> {
        self.origin_form(&mut request);
        let mut conn = match first {
            Some(conn) => conn,
            None => self.connect().await?,
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
                        conn = self.connect().await?;
                    }
                    _ => return Err(Box::new(e.into_error())),
                },
            }
        }
    }

    /// The request as HTTP/1.1 sends it to an origin server: the path alone, and `Host`.
    fn origin_form(&self, request: &mut Request<RequestBody>) {
        let path = request
            .uri()
            .path_and_query()
            .map_or_else(|| Uri::from_static("/"), |p| Uri::from(p.clone()));
        *request.uri_mut() = path;
        request.headers_mut().insert(HOST, self.host.clone());
    }

    /// The most recently used idle connection that is ready. Closed and expired ones are
    /// dropped; one whose last answer hyper is still finishing is left for a later request.
    fn checkout(&self) -> Option<Leased> {
        let now = Instant::now();
        let mut idle = self.idle.lock();
        idle.retain(|entry| !entry.conn.send.is_closed() && now < entry.since + POOL_IDLE_TIMEOUT);
        let ready = idle.iter().rposition(|entry| entry.conn.send.is_ready())?;
        let mut conn = idle.remove(ready).conn;
        conn.reused = true;
        Some(conn)
    }

    /// Puts a connection whose answer ended back in the idle list.
    fn put(&self, conn: Leased) {
        if conn.send.is_closed() {
            return;
        }
        let mut idle = self.idle.lock();
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
        tokio::spawn(drive(Arc::downgrade(self), id, connection));
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

/// A connection's life: driven until it closes; every `POOL_IDLE_TIMEOUT` it is taken out
/// of the idle list if it sat there that long (its sender dropped, hyper closes it).
async fn drive(pool: Weak<H1Pool>, id: u64, connection: Connection<Io, RequestBody>) {
    tokio::pin!(connection);
    loop {
        tokio::select! {
            ended = &mut connection => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "upstream HTTP/1.1 connection ended");
                }
                return;
            }
            () = tokio::time::sleep(POOL_IDLE_TIMEOUT) => {
                let Some(pool) = pool.upgrade() else { return };
                let now = Instant::now();
                pool.idle.lock().retain(|entry| entry.conn.id != id || now < entry.since + POOL_IDLE_TIMEOUT);
            }
        }
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
    /// Gives the connection back once the answer is whole (`ok` and at its end); a failed
    /// or unfinished one's connection is dropped (hyper closes it).
    fn release(&mut self, ok: bool) {
        let Some(conn) = self.conn.take() else { return };
        let Some(pool) = self.pool.upgrade() else { return };
        pool.answering.fetch_sub(1, Ordering::Relaxed);
        if ok && self.body.is_end_stream() {
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
        // A reader that stopped at `is_end_stream` without asking for the end.
        self.release(true);
    }
}

#[cfg(test)]
mod tests;
