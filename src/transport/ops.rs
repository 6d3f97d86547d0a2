//! Operations endpoints: liveness, readiness, Prometheus metrics, and the admin view of routes
//! (live TTFT percentiles, breakers, hedge counters) with the breaker drill.
//!
//! Who may call them: `/healthz` and `/readyz` are always public. The drill always needs the
//! admin token. With `[auth]`, every `/admin` route needs it too (reads included), and so does
//! `/metrics` unless `server.metrics_public = true`; without `[auth]` (loopback only) reads
//! stay open.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::time::Instant;

use crate::transport::{auth, AppState};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/admin/routes", get(admin_routes))
        .route("/admin/routes/{name}/drill", post(drill))
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.drain.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response()
    } else {
        "ready".into_response()
    }
}

async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let private = state.access.is_on() && !state.config.server.metrics_public;
    if let Some(refused) = admin_gate(&state, &headers, private, "metrics") {
        return refused;
    }
    match &state.metrics {
        Some(handle) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle.render()).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "metrics recorder not installed").into_response(),
    }
}

async fn admin_routes(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(refused) = admin_gate(&state, &headers, state.access.is_on(), "admin reads") {
        return refused;
    }
    let now = Instant::now();
    let routes = state.gateway.health().snapshot(now, &state.config);
    Json(json!({ "routes": routes })).into_response()
}

/// `POST /admin/routes/{name}/drill`: opens the route's breaker on purpose, to prove the
/// fallbacks before an incident does. Needs `Authorization: Bearer <admin token>`.
async fn drill(State(state): State<AppState>, Path(name): Path<String>, headers: HeaderMap) -> Response {
    if let Some(refused) = admin_gate(&state, &headers, true, "admin writes") {
        return refused;
    }
    if state.gateway.health().force_open(&name, Instant::now()) {
        tracing::warn!(route = %name, "breaker opened by drill");
        Json(json!({"route": name, "breaker": "open", "reason": "drill"})).into_response()
    } else {
        (
            StatusCode::NOT_FOUND,
            Json(json!({"error": format!("no route named {name:?}")})),
        )
            .into_response()
    }
}

/// When `needed`, the request must carry `Authorization: Bearer <admin token>` (the value of
/// `server.admin_token_env`, compared in constant time). The refusal, if any: 403 when no
/// token is configured (`what` is off), 401 when it is missing or wrong.
fn admin_gate(state: &AppState, headers: &HeaderMap, needed: bool, what: &str) -> Option<Response> {
    if !needed {
        return None;
    }
    let Some(expected) = state
        .config
        .server
        .admin_token_env
        .as_deref()
        .and_then(|var| std::env::var(var).ok())
        .filter(|t| !t.is_empty())
    else {
        let hint = if what == "metrics" {
            " (or server.metrics_public = true)"
        } else {
            ""
        };
        return Some(
            (
                StatusCode::FORBIDDEN,
                Json(json!({"error": format!("{what} are off: set server.admin_token_env{hint}")})),
            )
                .into_response(),
        );
    };
    match auth::admin_bearer(headers) {
        Some(given) if auth::same_secret(given, &expected) => None,
        _ => Some(
            (
                StatusCode::UNAUTHORIZED,
                Json(json!({"error": "bad or missing admin token (Authorization: Bearer <token>)"})),
            )
                .into_response(),
        ),
    }
}
