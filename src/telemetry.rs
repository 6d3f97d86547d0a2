//! Metric names and the Prometheus recorder. Names follow `tailcut_<thing>_<unit>`; labels
//! stay low-cardinality (route names come from config, never from clients).

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub mod handles;
mod help;
pub mod rotation;

pub const REQUESTS_TOTAL: &str = "tailcut_requests_total";
pub const ACTIVE_STREAMS: &str = "tailcut_active_streams";
pub const TTFT_SECONDS: &str = "tailcut_ttft_seconds";
pub const CLIENT_TTFT_SECONDS: &str = "tailcut_client_ttft_seconds";
pub const HEDGES_TOTAL: &str = "tailcut_hedges_total";
pub const HEDGE_SKIPPED_TOTAL: &str = "tailcut_hedge_skipped_total";
pub const ATTEMPTS_TOTAL: &str = "tailcut_attempts_total";
pub const UPSTREAM_ERRORS_TOTAL: &str = "tailcut_upstream_errors_total";
pub const CANCELLED_TOTAL: &str = "tailcut_cancelled_attempts_total";
pub const MIDSTREAM_TOTAL: &str = "tailcut_midstream_failures_total";
pub const AUTH_ERRORS_TOTAL: &str = "tailcut_upstream_auth_errors_total";
pub const BUDGET_DENIED_TOTAL: &str = "tailcut_budget_denied_total";
pub const SHADOW_TOTAL: &str = "tailcut_shadow_requests_total";
/// Continuations judged at the seam, by verdict (continued, restart_matched, restart_diverged).
pub const SEAMS_TOTAL: &str = "tailcut_continuation_seams_total";
/// Upstream faults that are tailcut's configuration (404 model/URL, quota), by route.
pub const CONFIG_ERRORS_TOTAL: &str = "tailcut_upstream_config_errors_total";

const LATENCY_BUCKETS: &[f64] = &[
    0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 30.0,
];

/// Installs the global Prometheus recorder once; later calls return a fresh handle that
/// renders nothing (tests build many servers in one process).
pub fn install() -> Option<PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<Option<PrometheusHandle>> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".to_string()), LATENCY_BUCKETS)
                .ok()?
                .install_recorder()
                .ok()?;
            help::describe_all();
            rotation::describe();
            Some(handle)
        })
        .clone()
}
