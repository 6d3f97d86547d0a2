//! The WebSocket transport, `GET /v1/ws`: checks the Origin, upgrades with bounded frame and
//! buffer sizes, and runs one session per socket (protocol in docs/ws-protocol.md).

mod protocol;
mod session;
mod streams;

use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{header, HeaderMap, Uri};
use axum::response::Response;
use futures::stream::SplitSink;
use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;

pub use protocol::{parse, ClientMessage, ProtocolError};
pub use session::{Session, MAX_REQUESTS_PER_SOCKET};

use super::error::ErrorReply;
use super::native::ServerMessage;
use super::sse_out::json_response;
use crate::transport::AppState;
use crate::types::{Dialect, RequestCtx};

/// How long a closing socket may take to deliver its close frame before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

pub async fn upgrade(State(state): State<AppState>, headers: HeaderMap, uri: Uri, ws: WebSocketUpgrade) -> Response {
    let origin = headers.get(header::ORIGIN).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()));
    let server = &state.config.server;
    if !origin_allowed(origin, host, &server.ws_allowed_origins) {
        let body = ServerMessage::Error {
            id: None,
            class: "forbidden".into(),
            message: "this Origin may not open a WebSocket here".into(),
            retry_after_ms: None,
            envelope: None,
        };
        return json_response(403, HeaderMap::new(), body.to_json().into_bytes());
    }
    let base = match RequestCtx::from_headers(&headers, Dialect::Native) {
        Ok(ctx) => ctx,
        Err(e) => {
            let body = ServerMessage::from_gateway(None, &e).to_json();
            return json_response(ErrorReply::from_gateway(&e).status, HeaderMap::new(), body.into_bytes());
        }
    };
    let max_message = server.ws_max_message_bytes;
    let buffer = server.ws_buffer_bytes;
    ws.max_message_size(max_message)
        .max_frame_size(max_message)
        .read_buffer_size(buffer)
        .write_buffer_size(buffer)
        // Only grows past write_buffer_size while the client is not reading; one large
        // outgoing message on top is the most it may hold.
        .max_write_buffer_size(buffer.saturating_add(max_message.max(1 << 20)))
        .on_upgrade(move |socket| serve(socket, state, base))
}

/// Runs one socket: the session loop and the writer are two futures of this one task, so
/// nothing outlives the connection.
async fn serve(socket: WebSocket, state: AppState, base: RequestCtx) {
    let server = &state.config.server;
    let (mut sink, incoming) = socket.split();
    // Capacity = how far a client may fall behind before it is closed as too slow.
    let (out, queued) = mpsc::channel(server.ws_send_queue.max(1));
    let gateway = state.gateway.clone();
    let session = Session::new(move |req, ctx| gateway.chat(req, ctx), base, state.streams.clone(), out);
    let close = {
        let writer = write_queued(&mut sink, queued);
        tokio::pin!(writer);
        tokio::select! {
            // The client is gone; dropping the session cancels every request.
            _ = &mut writer => return,
            close = session.run(incoming, server.ws_ping_interval) => close,
        }
    };
    // Queued messages are dropped: a slow client gets its close frame next, not later.
    let goodbye = async {
        match close {
            Some(frame) => sink.send(Message::Close(Some(frame))).await,
            None => sink.close().await,
        }
    };
    let _ = tokio::time::timeout(CLOSE_GRACE, goodbye).await;
}

async fn write_queued(sink: &mut SplitSink<WebSocket, Message>, mut queued: mpsc::Receiver<Message>) {
    while let Some(message) = queued.recv().await {
        if sink.send(message).await.is_err() {
            return;
        }
    }
}

/// Browsers send `Origin`; other clients usually do not. No Origin is allowed (not a
/// browser, so no cross-site risk); otherwise the origin must be this host, or listed.
pub fn origin_allowed(origin: Option<&str>, host: Option<&str>, allowed: &[String]) -> bool {
    let Some(origin) = origin.map(str::trim) else {
        return true;
    };
    let origin = origin.trim_end_matches('/').to_ascii_lowercase();
    if allowed
        .iter()
        .any(|a| a == "*" || a.trim().trim_end_matches('/').eq_ignore_ascii_case(&origin))
    {
        return true;
    }
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    let Some(host) = host.map(|h| h.trim().to_ascii_lowercase()) else {
        return false;
    };
    !authority.is_empty() && without_default_port(scheme, authority) == without_default_port(scheme, &host)
}

fn without_default_port<'a>(scheme: &str, authority: &'a str) -> &'a str {
    let default = match scheme {
        "http" | "ws" => ":80",
        "https" | "wss" => ":443",
        _ => return authority,
    };
    authority.strip_suffix(default).unwrap_or(authority)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn no_origin_is_allowed() {
        assert!(
            origin_allowed(None, Some("api.example.com"), &[]),
            "non-browser clients send no Origin"
        );
    }

    #[test]
    fn same_origin_is_allowed() {
        assert!(
            origin_allowed(Some("http://127.0.0.1:8080"), Some("127.0.0.1:8080"), &[]),
            "same host and port"
        );
        assert!(
            origin_allowed(Some("https://App.Example.com"), Some("app.example.com"), &[]),
            "case-insensitive"
        );
        assert!(
            origin_allowed(Some("https://app.example.com"), Some("app.example.com:443"), &[]),
            "default port"
        );
    }

    #[test]
    fn other_origins_are_refused_unless_listed() {
        assert!(
            !origin_allowed(Some("https://evil.example"), Some("app.example.com"), &[]),
            "cross-site refused"
        );
        assert!(
            !origin_allowed(Some("http://127.0.0.1:9999"), Some("127.0.0.1:8080"), &[]),
            "another port is another origin"
        );
        assert!(
            !origin_allowed(Some("null"), Some("app.example.com"), &[]),
            "opaque origin refused"
        );
        let list = allowed(&["https://chat.example.com/"]);
        assert!(
            origin_allowed(Some("https://chat.example.com"), Some("api.example.com"), &list),
            "listed origin"
        );
        assert!(
            origin_allowed(Some("https://anything.example"), None, &allowed(&["*"])),
            "wildcard allows all"
        );
    }

    #[test]
    fn an_origin_without_a_host_to_compare_is_refused() {
        assert!(
            !origin_allowed(Some("https://app.example.com"), None, &[]),
            "no Host, no same-origin"
        );
    }
}
