//! The WebSocket transport, `GET /v1/ws`: checks the Origin against the CORS allowlist,
//! upgrades with bounded frame and buffer sizes, and runs one session per socket (protocol in
//! docs/ws-protocol.md).

mod controls;
mod history;
mod outbox;
mod protocol;
mod render;
mod session;
mod streams;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Uri};
use axum::response::Response;
use axum::Extension;
use futures::SinkExt;

pub use protocol::{parse, ClientMessage, ProtocolError};
pub use session::{End, RouteWindow, Session, MAX_REQUESTS_PER_SOCKET};

use super::cors::Origins;
use super::error::ErrorReply;
use super::native::ServerMessage;
use super::sse_out::json_response;
use crate::transport::AppState;
use crate::types::{ChatRequest, Dialect, EventStream, RequestCtx};

/// How long a closing socket may take to deliver its close frame before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

pub async fn upgrade(
    State(state): State<AppState>,
    Extension(origins): Extension<Arc<Origins>>,
    conn: Option<Extension<crate::server::ConnPermit>>,
    headers: HeaderMap,
    uri: Uri,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let ws = match ws {
        Ok(ws) => ws,
        Err(rejection) => return handshake_refused(&rejection),
    };
    let origin = headers.get(header::ORIGIN).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let server = &state.config.server;
    if !origin_allowed(origin, &origins) {
        let body = ServerMessage::Error {
            id: None,
            class: "forbidden".into(),
            message: "this Origin may not open a WebSocket here".into(),
            retry_after_ms: None,
            envelope: None,
            code: None,
            first_seq: None,
            stream: None,
        };
        return json_response(403, HeaderMap::new(), body.to_json().into_bytes());
    }
    if let Some(refused) = super::chat::unreadable_header(&headers) {
        let body = ServerMessage::from_reply(None, &refused).to_json();
        return json_response(refused.status, HeaderMap::new(), body.into_bytes());
    }
    let mut base = match RequestCtx::from_headers(&headers, Dialect::Native) {
        Ok(ctx) => ctx,
        Err(e) => {
            let body = ServerMessage::from_gateway(None, &e).to_json();
            return json_response(ErrorReply::from_gateway(&e).status, HeaderMap::new(), body.into_bytes());
        }
    };
    // The key or token (`?token=` from browsers) is checked once here; each request on the
    // socket is then admitted against the key's models and limits (`Caller::gated`).
    let query_token = super::auth::query_token(&uri);
    let caller = match state.access.authorize(&headers, query_token.as_deref(), &mut base) {
        Ok(caller) => caller,
        Err(refusal) => return super::native_sse::error_response(&refusal.reply(), &base.request_id),
    };
    let gateway = state.gateway.clone();
    let caller_for_slots = caller.clone();
    let chat = caller.gated(move |req, ctx| gateway.chat(req, ctx));
    // Boxed, and the task holds only the box: a future keeps what it was called with beside
    // what it moved that into, so handing over the parts took their room twice per socket.
    let session = Box::new(
        Session::new(chat, base, slots(&state, caller_for_slots), state.resumable.clone())
            .with_windows(Arc::clone(&state.ws_windows))
            .with_limits(server.request_limits),
    );
    let (ping_every, queue) = (server.ws_ping_interval, server.ws_send_queue);
    let max_message = server.ws_max_message_bytes;
    let buffer = server.ws_buffer_bytes;
    ws.max_message_size(max_message)
        .max_frame_size(max_message)
        .read_buffer_size(buffer)
        .write_buffer_size(buffer)
        // Only grows past write_buffer_size while the client is not reading; one large
        // outgoing message on top is the most it may hold.
        .max_write_buffer_size(buffer.saturating_add(max_message.max(1 << 20)))
        .on_upgrade(move |socket| serve(socket, session, ping_every, queue, conn))
}

/// Runs one socket: its session reads and writes it from this one task, with at most
/// `queue` messages waiting for a client that is behind (how far it may fall behind before it
/// is closed as too slow). The socket's requests run in the stream registry and outlive it,
/// detached, until resumed, cancelled or `detached_cancel_ms` pass.
///
/// A plain fn returning an `async move` block that uses its captures in place: an `async fn`
/// moves each argument into a local of its own, which holds the socket's room twice.
#[allow(clippy::manual_async_fn)]
fn serve<F>(
    mut socket: WebSocket,
    mut session: Box<Session<F>>,
    ping_every: Duration,
    queue: usize,
    conn: Option<Extension<crate::server::ConnPermit>>,
) -> impl Future<Output = ()> + Send
where
    F: FnMut(ChatRequest, RequestCtx) -> Result<EventStream, ErrorReply> + Send,
{
    async move {
        // The socket keeps its connection's place under max_connections until it closes.
        let _conn = conn;
        let end = session.run(&mut socket, ping_every, queue).await;
        // Detaches the socket's requests now, not after the goodbye.
        drop(session);
        let close = match end {
            // The client is gone: nobody to tell.
            End::Gone => return,
            End::Close(close) => close,
        };
        // Messages still waiting were dropped: a slow client gets its close frame next.
        let goodbye = async {
            match close {
                Some(frame) => socket.send(Message::Close(Some(frame))).await,
                None => socket.close().await,
            }
        };
        let _ = tokio::time::timeout(CLOSE_GRACE, goodbye).await;
    }
}

/// Per client-facing model, its routes' context windows (`windows`).
pub type Windows = HashMap<String, Vec<RouteWindow>>;

/// Per client-facing model, each route's context window and output reserve: a session's
/// history is projected to fit the route most able to take it. Built once per server
/// (`AppState::ws_windows`), shared by every socket.
pub fn windows(config: &crate::config::Config) -> Arc<Windows> {
    use crate::config::Wire;
    let windows = config
        .models
        .iter()
        .map(|(name, model)| {
            let routes = config
                .routes
                .iter()
                .filter(|r| model.routes.contains(&r.name))
                .map(|r| RouteWindow {
                    window: u64::from(r.context_window),
                    max_output: r.max_output,
                    // What the router reserves for the answer when the request sets no max_tokens.
                    default_reserve: match r.wire {
                        Wire::Anthropic => crate::provider::anthropic::DEFAULT_MAX_TOKENS,
                        Wire::OpenAi => crate::router::DEFAULT_OUTPUT_RESERVE,
                    },
                })
                .collect();
            (name.clone(), routes)
        })
        .collect();
    Arc::new(windows)
}

/// A request's place at the stream gate, as the HTTP endpoints take it: refused while
/// draining, and for the priority the key and the tenant cap it to.
fn slots(state: &AppState, caller: super::auth::Caller) -> session::Slots {
    let state = state.clone();
    Box::new(move |ctx| {
        if state.drain.is_draining() {
            return Err(super::chat::draining());
        }
        let mut ctx = ctx.clone();
        caller.bind(&mut ctx).map_err(|refusal| refusal.reply())?;
        state
            .gate
            .try_enter(super::chat::gate_priority(&state, &ctx))
            .map(|slot| Box::new(slot) as Box<dyn Send>)
            .ok_or_else(ErrorReply::busy)
    })
}

/// Browsers always send `Origin` on an upgrade; other clients usually do not. No Origin is
/// allowed (not a browser, so no cross-site risk); otherwise it must be in the same allowlist
/// as HTTP (`cors::Origins`). It is never compared with `Host`, which a DNS-rebinding page
/// controls as well as its Origin.
pub fn origin_allowed(origin: Option<&str>, origins: &Origins) -> bool {
    origin.is_none_or(|o| origins.allows(o))
}

/// A request to the socket's path that is not a WebSocket handshake we take, as the native
/// dialect's JSON error (axum's own answer is plain text). A version other than 13 is a
/// 426 naming the one spoken (RFC 6455 §4.4).
fn handshake_refused(rejection: &WebSocketUpgradeRejection) -> Response {
    let mut headers = HeaderMap::new();
    let mut status = rejection.status().as_u16();
    if matches!(rejection, WebSocketUpgradeRejection::InvalidWebSocketVersionHeader(_)) {
        status = 426;
        headers.insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
    }
    let reply = ErrorReply {
        status,
        code: Some("not_a_websocket_handshake"),
        ..ErrorReply::bad_request(format!("not a WebSocket handshake: {}", rejection.body_text()))
    };
    let body = ServerMessage::from_reply(None, &reply).to_json();
    json_response(status, headers, body.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of what `f` returns, without calling it.
    fn returned_size<A, B, C, D, E, R>(_: fn(A, B, C, D, E) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    type Chat = fn(ChatRequest, RequestCtx) -> Result<EventStream, ErrorReply>;

    #[test]
    fn an_idle_sockets_task_stays_small() {
        // 792 bytes on x86_64 when written: the socket (368) and the session loop; 1168 as
        // an `async fn`, 2224 with the session built inside it beside a send queue's writer.
        let size = returned_size(serve::<Chat>);
        assert!(size <= 900, "the socket's task holds {size} bytes");
    }

    fn origins(listed: &[&str], local: &str) -> Origins {
        let listed: Vec<String> = listed.iter().map(|s| s.to_string()).collect();
        Origins::new(&listed, local.parse().expect("address"))
    }

    #[test]
    fn no_origin_is_allowed() {
        assert!(
            origin_allowed(None, &origins(&[], "10.0.0.5:8080")),
            "non-browser clients send no Origin"
        );
    }

    #[test]
    fn the_servers_own_loopback_origin_is_allowed() {
        let o = origins(&[], "127.0.0.1:8080");
        assert!(
            origin_allowed(Some("http://127.0.0.1:8080"), &o),
            "the playground's origin"
        );
        assert!(origin_allowed(Some("http://localhost:8080"), &o), "localhost");
        assert!(
            !origin_allowed(Some("http://127.0.0.1:9999"), &o),
            "another port is another origin"
        );
    }

    #[test]
    fn a_dns_rebinding_origin_is_refused() {
        // evil.example resolves to 127.0.0.1: the browser sends Host: evil.example:8080 and
        // Origin: http://evil.example:8080. The old Origin == Host check let it in.
        let o = origins(&[], "127.0.0.1:8080");
        assert!(
            !origin_allowed(Some("http://evil.example:8080"), &o),
            "a rebound name is not this server's origin"
        );
    }

    #[test]
    fn other_origins_are_refused_unless_listed() {
        let o = origins(&["https://chat.example.com"], "10.0.0.5:8080");
        assert!(origin_allowed(Some("https://chat.example.com"), &o), "listed origin");
        assert!(!origin_allowed(Some("https://evil.example"), &o), "cross-site refused");
        assert!(!origin_allowed(Some("null"), &o), "opaque origin refused");
        assert!(
            !origin_allowed(Some("http://10.0.0.5:8080"), &o),
            "the server's own public origin must be listed: Host cannot prove it"
        );
    }
}
