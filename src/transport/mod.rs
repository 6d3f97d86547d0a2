//! Client-facing transports (placeholder until the dialects land).

pub mod ops;

use axum::Router;

use crate::server::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
}
