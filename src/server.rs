//! The HTTP server: builds the axum app, applies the edge limits, and drains gracefully.
//!
//! Layers, outermost first, and what each adds to a request:
//! 1. the accept loop: a cap on open connections (`max_connections`; beyond it new
//!    connections wait in the kernel backlog), `TCP_NODELAY`;
//! 2. hyper-util's connection builder: a header-read timeout (slowloris), a bounded header
//!    buffer and header count, HTTP/1.1 and HTTP/2, WebSocket upgrades;
//! 3. `DefaultBodyLimit`: request bodies over `max_body_bytes` get a 413;
//! 4. on the chat and ops routes (not the two pages): the origin guard (`transport::cors`),
//!    which refuses a browser request from an origin not in `[server.cors] allowed_origins`
//!    (nor the server's own loopback origins) with a 403 before anything runs, then
//!    tower-http's CORS layer, which answers allowed preflights and adds
//!    `Access-Control-Allow-Origin` to allowed answers. Layers that refuse requests without
//!    credentials must sit inside these, or preflights (which carry none) would fail;
//! 5. the routes: chat transports (`transport::routes`) and ops (`transport::ops`).
//!    Each chat endpoint checks the caller's key or token first (`transport::auth`: 401,
//!    403, 429 by the key's limits); with `[auth]`, `/admin` and `/metrics` need the admin
//!    token. Each chat stream holds a permit of `streams` (`max_streams`; none left → 503).
//!    `GET /` (playground) and `GET /dashboard` serve `static/` pages embedded in the binary.
//!
//! Shutdown (SIGTERM or ctrl-c): stop accepting, mark `/readyz` unready, let in-flight
//! streams finish for up to `drain`, then cut what is left. The background breaker prober
//! (`mux::probe`) runs beside the accept loop and stops with it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::config::Config;
use crate::gateway::{Gateway, StartError};
use crate::sim::SimHandle;
use crate::transport;

pub use crate::transport::AppState;

/// The axum app with every route and the body limit, for a server bound to `local` (its
/// loopback origins are allowed when it is on loopback).
pub fn app(state: AppState, local: SocketAddr) -> Router {
    let limit = state.config.server.max_body_bytes;
    let origins = transport::cors::Origins::new(&state.config.server.cors_allowed_origins, local);
    // Embedded so the binary serves them from any working directory; `no-cache` so a rebuilt
    // binary's pages are picked up without a stale copy.
    let page = |html: &'static str| {
        axum::routing::get(move || async move {
            (
                [
                    (axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8"),
                    (axum::http::header::CACHE_CONTROL, "no-cache"),
                ],
                html,
            )
        })
    };
    transport::cors::apply(transport::routes().merge(transport::ops::routes()), origins)
        .route("/", page(include_str!("../static/index.html")))
        .route("/dashboard", page(include_str!("../static/dashboard.html")))
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::map_response(move |r: Response| {
            too_large_as_json(r, limit)
        }))
        .with_state(state)
}

/// axum answers an oversized body with a plain-text 413; clients of every dialect parse JSON
/// errors, so say it in the OpenAI error shape (which the Anthropic SDK reads too).
async fn too_large_as_json(response: Response, limit: usize) -> Response {
    if response.status() != StatusCode::PAYLOAD_TOO_LARGE {
        return response;
    }
    let body = serde_json::json!({
        "type": "error",
        "error": {
            "message": format!("request body exceeds the {limit}-byte limit"),
            "type": "invalid_request_error",
            "code": "request_too_large",
        }
    });
    (StatusCode::PAYLOAD_TOO_LARGE, axum::Json(body)).into_response()
}

/// A server started by `start`: its address, its simulated upstream, and a way to stop it.
pub struct Running {
    pub addr: SocketAddr,
    pub sim: Option<SimHandle>,
    pub state: AppState,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Begins a graceful shutdown and waits for it (bounded by the drain time).
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

/// Serves `state` on `listener` until `shutdown` resolves, then drains.
pub async fn serve(listener: TcpListener, state: AppState, shutdown: impl Future<Output = ()>) {
    let server = &state.config.server;
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(server.header_read_timeout)
        .max_buf_size(server.max_header_bytes.max(8192))
        .max_headers(server.max_headers);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(server.max_header_bytes as u32)
        // Pings find HTTP/2 peers that vanished without closing, so their connection permit
        // and streams are released.
        .keep_alive_interval(Some(std::time::Duration::from_secs(20)))
        .keep_alive_timeout(std::time::Duration::from_secs(20));
    let connections = Arc::new(Semaphore::new(server.max_connections));
    let graceful = GracefulShutdown::new();
    // A bound listener always has its address; were it missing, port 0 is one no browser
    // origin names, so only the configured list would match.
    let local = listener.local_addr().unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
    let app = app(state.clone(), local);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&connections).acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    state.draining.store(true, Ordering::SeqCst);
    let drain = state.config.server.drain;
    tracing::info!(drain_ms = drain.as_millis() as u64, "draining in-flight streams");
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("drained"),
        _ = tokio::time::sleep(drain) => tracing::warn!("drain time over; cutting remaining streams"),
    }
}
