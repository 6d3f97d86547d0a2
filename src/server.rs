//! The HTTP server: builds the axum app, applies the edge limits, and drains gracefully.

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::config::Config;
use crate::gateway::Gateway;

/// Shared state every handler gets.
#[derive(Clone)]
pub struct AppState {
    pub gateway: Arc<Gateway>,
    pub config: Arc<Config>,
    /// One permit per open chat stream; none left → 503.
    pub streams: Arc<Semaphore>,
}
