//! The HTTP server: builds the axum app, applies the edge limits, and drains gracefully.
//!
//! Layers, outermost first, and what each adds to a request:
//! 1. the accept loop (`serve`): a cap on open connections (`max_connections`; beyond it new
//!    connections wait in the kernel backlog), `TCP_NODELAY`;
//! 2. the connection (`conn`): a socket write timeout (`client_write_timeout_ms`: a client
//!    that takes no byte for that long is dropped) and a watchdog counting from accept
//!    (`header_read_timeout_ms` until the first request, `idle_timeout_ms` with none in
//!    flight after it); its first bytes are sniffed for the HTTP/2 preface (`sniff`) and each
//!    request head is copied out of hyper's read buffer (`head`), so an HTTP/1 connection
//!    keeps one 8 KiB read buffer;
//! 3. hyper-util's connection builder: HTTP/1's per-request header-read timeout (slowloris),
//!    a bounded header buffer and header count, HTTP/1.1 and HTTP/2, WebSocket upgrades;
//! 4. the edge's refusals (`app`, `reply`): a head over `max_header_bytes` gets a JSON 431
//!    (`head_limit`; hyper's and h2's own limits are set above it so the request gets this
//!    far), and a bare 404, 405 or 413 becomes JSON in the path's dialect, with
//!    `x-request-id`;
//! 5. on the chat and ops routes (not the two pages): the origin guard (`transport::cors`),
//!    which refuses a browser request from an origin not in `[server.cors] allowed_origins`
//!    (nor the server's own loopback origins) with a 403 before anything runs, then
//!    tower-http's CORS layer, which answers allowed preflights and adds
//!    `Access-Control-Allow-Origin` to allowed answers. Layers that refuse requests without
//!    credentials must sit inside these, or preflights (which carry none) would fail;
//! 6. the body reader (`body`): the whole body within `max_body_bytes` (413, at once for a
//!    larger `Content-Length`) and `body_read_timeout_ms` (408);
//! 7. the routes: chat transports (`transport::routes`) and ops (`transport::ops`).
//!    Each chat endpoint checks the caller's key or token first (`transport::auth`: 401,
//!    403, 429 by the key's limits); with `[auth]`, `/admin` and `/metrics` need the admin
//!    token. Each chat stream holds a slot at the stream gate (`max_streams`, batch at most
//!    `batch_max_share` of it; none left → 503), owned by the stream's pump
//!    (`transport::pump`) so it is released at `max_stream_ms` even if the client never reads.
//!    `GET /` (playground) and `GET /dashboard` serve `static/` pages embedded in the binary.
//!
//! Shutdown (SIGTERM, ctrl-c or `Running::shutdown`), in three steps:
//! 1. grace (`drain_grace_ms`): `/readyz` answers 503 at once and new chat requests get 503
//!    with `Retry-After: 1` (code `draining`), while the listener stays open, so a load
//!    balancer sees the instance fail its check before connections are refused;
//! 2. drain (`drain_ms`): the listener closes, idle connections close, HTTP/2 clients get
//!    GOAWAY, and in-flight streams may finish, a WebSocket's requests and resumable
//!    streams with no reader among them (the registry's running streams are waited for too);
//! 3. cut: streams still running end with an in-band `draining` error in their dialect,
//!    which gets up to `CUT_FLUSH` to reach the clients; then `serve` returns.
//!
//! The background breaker prober (`mux::probe`) runs beside the accept loop and stops with it.

mod app;
mod body;
mod conn;
mod head;
mod head_limit;
mod host;
mod reply;
mod sniff;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::config::Config;
use crate::gateway::{Gateway, StartError};
use crate::sim::SimHandle;

pub use crate::transport::AppState;
pub use app::{app, Edge};
pub use conn::{ConnHandle, ConnPermit};
pub use reply::{dialect_of, request_id, EdgeRefusal};

/// After the cut, how long the streams' in-band errors get to reach their clients before
/// `serve` returns (and the process exits). `fly.toml`'s `kill_timeout` counts it.
pub const CUT_FLUSH: Duration = Duration::from_secs(1);

/// A server started by `start`: its address, its simulated upstream, and a way to stop it.
pub struct Running {
    pub addr: SocketAddr,
    pub sim: Option<SimHandle>,
    pub state: AppState,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Shuts down as on SIGTERM (grace, drain, cut; see the module doc) and waits for it:
    /// at most `drain_grace_ms + drain_ms + CUT_FLUSH`.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        if let Some(sim) = &self.sim {
            sim.shutdown();
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

/// Starts the simulated upstream when the config needs one, builds the gateway, and
/// serves on `listener` in a background task. Refuses a non-loopback `listener` when the
/// config has no `[auth]` (unless `server.allow_unauthenticated`).
pub async fn start(config: Config, listener: TcpListener) -> Result<Running, StartError> {
    // Safe by default: without [auth], only loopback (see `Config::refuses_listen`).
    let bound = listener.local_addr().map_err(StartError::Sim)?;
    if config.refuses_listen(bound) {
        return Err(StartError::Unauthenticated { addr: bound });
    }
    let sim = if config.needs_sim() {
        let listen = config.sim.listen.unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)));
        Some(
            SimHandle::start(listen, config.sim.scenarios.clone())
                .await
                .map_err(StartError::Sim)?,
        )
    } else {
        None
    };
    let config = Arc::new(config);
    let gateway = Arc::new(Gateway::new(Arc::clone(&config), sim.as_ref())?);
    let state = AppState::new(gateway);
    let addr = listener.local_addr().map_err(StartError::Sim)?;
    let (stop, mut stopped) = watch::channel(false);
    let task_state = state.clone();
    let task = tokio::spawn(async move {
        // Probes routes behind open breakers for as long as the server serves; dropped
        // (cancelled) when it is done.
        let _prober = crate::mux::probe::Prober::spawn(Arc::clone(task_state.gateway.mux()));
        serve(listener, task_state, async move {
            let _ = stopped.wait_for(|s| *s).await;
        })
        .await;
    });
    Ok(Running {
        addr,
        sim,
        state,
        stop,
        task,
    })
}

/// Serves `state` on `listener` until `shutdown` resolves, then drains (see the module doc).
pub async fn serve(listener: TcpListener, state: AppState, shutdown: impl Future<Output = ()>) {
    let server = &state.config.server;
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(server.header_read_timeout)
        // Above `max_header_bytes`, so the edge can refuse a head just over it with the JSON
        // 431 (`head_limit`); hyper's own bare 431 is left for heads far over it.
        .max_buf_size(head_limit::protocol_limit(server.max_header_bytes, server.max_headers).max(8192))
        // Half-close stays off (hyper's default): the end of the read side is taken for a
        // client gone, so an answer abandoned before its first byte releases its slot and
        // upstream at once. With it on, such a client was noticed only by a failed write:
        // never, while an answer waits for its first token (in `hold`, the server kept
        // 53 MB more once the clients of 1000 held streams had closed). The cost: a client
        // that shuts its write side after its request gets no answer (README, "Limits and
        // drain").
        .max_headers(server.max_headers);
    builder
        .http2()
        .timer(TokioTimer::new())
        // As for HTTP/1: headroom, so h2 does not reset the stream before the edge answers.
        .max_header_list_size(
            u32::try_from(head_limit::protocol_limit(server.max_header_bytes, server.max_headers)).unwrap_or(u32::MAX),
        )
        // Pings find HTTP/2 peers that vanished without closing, so their connection permit
        // and streams are released.
        .keep_alive_interval(Some(Duration::from_secs(20)))
        .keep_alive_timeout(Duration::from_secs(20));
    // A bound listener always has its address; were it missing, port 0 is one no browser
    // origin names, so only the configured list would match.
    let local = listener.local_addr().unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
    let acceptor = Acceptor {
        listener,
        builder,
        app: app(state.clone(), local),
        connections: Arc::new(Semaphore::new(server.max_connections)),
        graceful: GracefulShutdown::new(),
        timeouts: conn_timeouts(&state),
    };
    acceptor.accept_until(shutdown).await;

    // 1. Grace: unready and refusing new chats, still accepting.
    state.drain.begin();
    let (grace, drain) = (server.drain_grace, server.drain);
    tracing::info!(
        grace_ms = grace.as_millis() as u64,
        drain_ms = drain.as_millis() as u64,
        "shutdown: /readyz is 503, new chat requests are refused"
    );
    acceptor.accept_until(tokio::time::sleep(grace)).await;

    // 2. Drain: no new connections; in-flight streams may finish.
    let Acceptor { listener, graceful, .. } = acceptor;
    drop(listener);
    let all_closed = graceful.shutdown();
    tokio::pin!(all_closed);
    // Hyper's connections, and the resumable streams (every WebSocket request is one; a
    // socket stops being a connection of hyper's at its upgrade), all get the drain.
    // Whether `all_closed` has resolved: it may be polled again only if not.
    let mut closed = false;
    let drained = async {
        (&mut all_closed).await;
        closed = true;
        streams_ended(&state).await;
    };
    tokio::select! {
        _ = drained => {
            tracing::info!("drained");
            return;
        }
        _ = tokio::time::sleep(drain) => {}
    }

    // 3. Cut: what still runs ends with an in-band `draining` error.
    tracing::warn!("drain time over; ending the remaining streams with a draining error");
    // Resumable streams (SSE and WebSocket requests alike) end with a `draining` error that
    // names the stream, so a client knows what to resume or retry elsewhere.
    let cut = state.resumable.cut_all("tailcut is shutting down");
    state.drain.cut();
    tracing::info!(resumable = cut, "cut the remaining streams");
    let flushed = async {
        if !closed {
            (&mut all_closed).await;
        }
        // A WebSocket's cut request has its error written by the socket's own task, which
        // nothing here can wait for: it gets the flush's time.
        if cut > 0 {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = flushed => tracing::info!("remaining streams ended"),
        _ = tokio::time::sleep(CUT_FLUSH) => tracing::warn!("closing connections whose clients did not take the error"),
    }
}

/// Resolves once no resumable stream's answer is running (checked every 50 ms: only while
/// the server drains).
async fn streams_ended(state: &AppState) {
    while state.resumable.running() > 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Per-connection limits, from `[server]`.
#[derive(Debug, Clone, Copy)]
struct ConnTimeouts {
    first_request: Duration,
    idle: Duration,
    write: Duration,
}

fn conn_timeouts(state: &AppState) -> ConnTimeouts {
    let server = &state.config.server;
    ConnTimeouts {
        first_request: server.header_read_timeout,
        idle: server.idle_timeout,
        write: server.client_write_timeout,
    }
}

/// The listener and what every accepted connection gets.
struct Acceptor {
    listener: TcpListener,
    builder: Builder<TokioExecutor>,
    app: app::Edge,
    connections: Arc<Semaphore>,
    graceful: GracefulShutdown,
    timeouts: ConnTimeouts,
}

impl Acceptor {
    /// Accepts and serves connections until `stop` resolves.
    async fn accept_until(&self, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            let permit = tokio::select! {
                permit = Arc::clone(&self.connections).acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => return,
                },
                _ = &mut stop => return,
            };
            let (stream, peer) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = &mut stop => return,
            };
            let _ = stream.set_nodelay(true);
            let activity = conn::Activity::new();
            let permit = conn::ConnPermit::new(permit);
            let service =
                TowerToHyperService::new(conn::Tracked::new(self.app.clone(), activity.clone(), permit.clone()));
            let io = conn::client_io(stream, self.timeouts.write);
            let connection = self.builder.serve_connection_with_upgrades(io, service);
            let connection = self.graceful.watch(connection.into_owned());
            let ConnTimeouts {
                first_request, idle, ..
            } = self.timeouts;
            tokio::spawn(async move {
                tokio::select! {
                    ended = connection => if let Err(e) = ended {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    },
                    _ = activity.idle_past(first_request, idle) => {
                        tracing::debug!(%peer, "closed an idle connection");
                    }
                }
                drop(permit);
            });
        }
    }
}
