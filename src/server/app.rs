//! The axum app: every route, the body reader, the origin guard and CORS, and the edge's
//! own refusals as JSON in the caller's dialect.

use std::net::SocketAddr;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::Response;
use axum::Router;

use super::body::{read_whole_body, BodyLimits};
use super::reply::{dialect_of, render, request_id, EdgeRefusal};
use crate::transport::{self, AppState};

/// The axum app with every route and the body limits, for a server bound to `local` (its
/// loopback origins are allowed when it is on loopback).
pub fn app(state: AppState, local: SocketAddr) -> Router {
    let server = &state.config.server;
    let limits = BodyLimits {
        max_bytes: server.max_body_bytes,
        timeout: server.body_read_timeout,
    };
    let origins = transport::cors::Origins::new(&server.cors_allowed_origins, local);
    // Embedded so the binary serves them from any working directory; `no-cache` so a rebuilt
    // binary's pages are picked up without a stale copy.
    let page = |html: &'static str| {
        axum::routing::get(move || async move {
            (
                [
                    (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                    (header::CACHE_CONTROL, "no-cache"),
                ],
                html,
            )
        })
    };
    // The body is read inside the origin guard, so a refused origin's body is never read.
    let api = transport::routes()
        .merge(transport::ops::routes())
        .layer(from_fn_with_state(limits, read_whole_body))
        // The reader above already bounds the body; this keeps axum's extractors agreeing.
        .layer(DefaultBodyLimit::max(limits.max_bytes));
    transport::cors::apply(api, origins)
        .route("/", page(include_str!("../../static/index.html")))
        .route("/dashboard", page(include_str!("../../static/dashboard.html")))
        .layer(from_fn_with_state(limits.max_bytes, edge_refusals_as_json))
        .with_state(state)
}

/// axum answers an unknown path (404), a wrong method (405) and an over-limit body (413) with
/// an empty or plain-text body; clients of every dialect parse JSON errors, so those become
/// JSON in the path's dialect, with `x-request-id`. Answers a handler wrote as JSON (e.g. a
/// drill on an unknown route) pass through untouched.
async fn edge_refusals_as_json(State(max_bytes): State<usize>, request: Request, next: Next) -> Response {
    let dialect = dialect_of(request.uri().path());
    let id = request_id(request.headers(), dialect);
    let response = next.run(request).await;
    let refusal = match response.status() {
        StatusCode::NOT_FOUND => EdgeRefusal::NotFound,
        StatusCode::METHOD_NOT_ALLOWED => EdgeRefusal::MethodNotAllowed,
        StatusCode::PAYLOAD_TOO_LARGE => EdgeRefusal::TooLarge { limit: max_bytes },
        _ => return response,
    };
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return response;
    }
    let mut json = render(refusal, dialect, &id);
    // Keep what the original said besides its body: `allow` on a 405, CORS headers.
    for (name, value) in response.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH && !json.headers().contains_key(name) {
            json.headers_mut().insert(name.clone(), value.clone());
        }
    }
    json
}
