//! `AppState`: what every handler shares (the gateway, the config, the stream permits, the
//! client keys and their limits, the metrics handle, the draining flag). The server builds
//! it; the transports read it.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::Semaphore;

use crate::config::Config;
use crate::gateway::Gateway;
use crate::transport::auth::Access;
use crate::transport::streams::Registry;

/// Shared state every handler gets.
#[derive(Clone)]
pub struct AppState {
    pub gateway: Arc<Gateway>,
    pub config: Arc<Config>,
    /// One permit per open chat stream; none left → 503.
    pub streams: Arc<Semaphore>,
    /// `[auth]`: the client keys, their live limits, the token signer.
    pub access: Arc<Access>,
    pub metrics: Option<PrometheusHandle>,
    /// Set once shutdown began: `/readyz` answers 503.
    pub draining: Arc<AtomicBool>,
    /// Resumable streams (`POST /v1/streams`, WebSocket requests); `cut_all` at drain's end.
    pub resumable: Arc<Registry>,
}

impl AppState {
    pub fn new(gateway: Arc<Gateway>) -> Self {
        let config = Arc::clone(gateway.config());
        let resumable = Arc::new(Registry::new(config.server.streams.clone()));
        AppState {
            streams: Arc::new(Semaphore::new(config.server.max_streams)),
            access: Arc::new(Access::new(&config)),
            gateway,
            config,
            metrics: crate::telemetry::install(),
            draining: Arc::new(AtomicBool::new(false)),
            resumable,
        }
    }
}
