//! Operations endpoints: liveness, readiness, Prometheus metrics, and the admin view of routes
//! (live TTFT percentiles, breakers, hedge counters) with the breaker drill.

use std::sync::atomic::Ordering;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::time::Instant;

use crate::transport::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/admin/routes", get(admin_routes))
        .route("/admin/routes/{name}/drill", post(drill))
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.draining.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response()
    } else {
        "ready".into_response()
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    match &state.metrics {
        Some(handle) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle.render()).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "metrics recorder not installed").into_response(),
    }
}

async fn admin_routes(State(state): State<AppState>) -> Json<serde_json::Value> {
    let now = Instant::now();
    let routes = state.gateway.health().snapshot(now, &state.config);
    Json(json!({ "routes": routes }))
}

/// `POST /admin/routes/{name}/drill`: opens the route's breaker on purpose, to prove the
/// fallbacks before an incident does. Needs `Authorization: Bearer <admin token>`.
async fn drill(State(state): State<AppState>, Path(name): Path<String>, headers: HeaderMap) -> Response {
    let Some(expected) = state
        .config
        .server
        .admin_token_env
        .as_deref()
        .and_then(|var| std::env::var(var).ok())
        .filter(|t| !t.is_empty())
    else {
        return (
            StatusCode::FORBIDDEN,
            Json(json!({"error": "admin writes are off: set server.admin_token_env"})),
        )
            .into_response();
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given != Some(expected.as_str()) {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "bad or missing admin token"})),
        )
            .into_response();
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
