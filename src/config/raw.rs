//! The TOML contract as a serde mirror: every key optional here, defaults and meaning applied
//! in `validate`. Unknown keys are collected (not ignored) so `check-config` can name them.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
pub struct RawServer {
    pub listen: Option<String>,
    pub drain_ms: Option<u64>,
    pub header_read_timeout_ms: Option<u64>,
    pub idle_timeout_ms: Option<u64>,
    pub body_read_timeout_ms: Option<u64>,
    pub client_write_timeout_ms: Option<u64>,
    pub drain_grace_ms: Option<u64>,
    pub batch_max_share: Option<f64>,
    pub max_header_bytes: Option<usize>,
    pub max_headers: Option<usize>,
    pub max_body_bytes: Option<usize>,
    pub max_answer_bytes: Option<usize>,
    pub max_connections: Option<usize>,
    pub max_streams: Option<usize>,
    pub sse_keepalive_ms: Option<u64>,
    pub deadline_ms: Option<u64>,
    pub max_stream_ms: Option<u64>,
    pub admin_token_env: Option<String>,
    pub allow_unauthenticated: Option<bool>,
    pub metrics_public: Option<bool>,
    pub max_messages: Option<usize>,
    pub max_decoded_bytes: Option<usize>,
    pub ws: Option<RawWs>,
    pub cors: Option<RawCors>,
    pub streams: Option<RawStreams>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawCors {
    pub allowed_origins: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawWs {
    /// Moved to `[server.cors]`; read only to say so.
    pub allowed_origins: Option<Vec<String>>,
    pub max_message_bytes: Option<usize>,
    pub buffer_bytes: Option<usize>,
    pub send_queue: Option<usize>,
    pub ping_interval_ms: Option<u64>,
}

/// `[server.streams]`: resumable streams (`POST /v1/streams`, WebSocket resume).
#[derive(Debug, Default, Deserialize)]
pub struct RawStreams {
    pub max_open: Option<usize>,
    pub max_events: Option<usize>,
    pub max_bytes: Option<usize>,
    pub keep_after_done_ms: Option<u64>,
    pub detached_cancel_ms: Option<u64>,
    pub retry_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawRoute {
    pub name: Option<String>,
    pub provider: Option<String>,
    pub wire: Option<String>,
    pub base_url: Option<String>,
    pub http2_prior_knowledge: Option<bool>,
    pub model: Option<String>,
    pub api_key_env: Option<String>,
    pub region: Option<String>,
    pub data_terms: Option<Vec<String>>,
    pub level: Option<String>,
    pub capabilities: Option<Vec<String>>,
    pub prefill: Option<String>,
    pub context_window: Option<u32>,
    pub max_output: Option<u32>,
    pub cost_per_1k: Option<f64>,
    pub scenario: Option<String>,
    pub hedge: Option<bool>,
    pub side_effecting: Option<bool>,
    pub stall_timeout_ms: Option<u64>,
    pub connect_timeout_ms: Option<u64>,
    pub concurrency: Option<u32>,
    pub latency_slo_ms: Option<u64>,
    pub first_token_timeout_ms: Option<u64>,
    pub hedge_percentile: Option<f64>,
    pub hedge_floor_ms: Option<u64>,
    pub hedge_ceiling_ms: Option<u64>,
    pub quality: Option<BTreeMap<String, f64>>,
    pub pools: Option<Vec<String>>,
    pub tokenizer: Option<String>,
    pub min_useful_ms: Option<u64>,
    /// `max_tokens` or `max_completion_tokens`: overrides the model family's default.
    pub token_parameter: Option<String>,
    /// Request fields the model refuses and the answer does not depend on: dropped, noted.
    pub drop_params: Option<Vec<String>>,
    /// Request fields the model refuses and the answer depends on: such requests go elsewhere.
    pub refuse_params: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawModel {
    pub routes: Option<Vec<String>>,
    /// `[{ name, routes }, …]`: validated in `routing` (`Validator::families`).
    pub families: Option<Vec<super::families::RawFamily>>,
    pub rotation: Option<String>,
    pub hedge: Option<bool>,
    pub task: Option<String>,
    pub quality_floor: Option<RawFloor>,
}

/// `quality_floor = 0.7` (every task) or `quality_floor = { code = 0.8, "*" = 0.6 }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawFloor {
    All(f64),
    PerTask(BTreeMap<String, f64>),
}

#[derive(Debug, Default, Deserialize)]
pub struct RawTenant {
    pub region: Option<String>,
    pub data_terms: Option<Vec<String>>,
    pub deadline_ms: Option<u64>,
    pub priority: Option<String>,
    pub hedge: Option<bool>,
    pub response_type: Option<String>,
    pub task: Option<String>,
    pub quality_floor: Option<RawFloor>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawRanking {
    pub latency_weight: Option<f64>,
    pub error_weight: Option<f64>,
    pub cost_weight: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawLeases {
    pub enabled: Option<bool>,
    pub ttl_secs: Option<u64>,
    pub max_sessions: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawCache {
    pub enabled: Option<bool>,
    pub max_entries: Option<usize>,
    pub ttl_secs: Option<u64>,
    pub max_answer_bytes: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawHedge {
    pub enabled: Option<bool>,
    pub percentile: Option<f64>,
    pub floor_ms: Option<u64>,
    pub ceiling_ms: Option<u64>,
    pub default_delay_ms: Option<u64>,
    pub min_samples: Option<u64>,
    pub window_secs: Option<u64>,
    pub budget_ratio: Option<f64>,
    pub budget_floor_per_sec: Option<f64>,
    pub budget_window_secs: Option<u64>,
    pub max_concurrent_attempts: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawLimits {
    pub max_attempts: Option<u32>,
    pub max_midstream_recoveries: Option<u32>,
    pub retry_budget_ratio: Option<f64>,
    pub retry_budget_floor_per_sec: Option<f64>,
    pub retry_budget_window_secs: Option<u64>,
    pub blast_radius: Option<f64>,
    pub blast_radius_floor_per_sec: Option<f64>,
    pub shadow_share: Option<f64>,
    pub shadow_max_in_flight: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawBreaker {
    pub window_secs: Option<u64>,
    pub min_volume: Option<u32>,
    pub error_rate: Option<f64>,
    pub consecutive_failures: Option<u32>,
    pub cooldown_ms: Option<u64>,
    pub max_cooldown_ms: Option<u64>,
    pub half_open_probes: Option<u32>,
    pub probe: Option<String>,
    pub quota_cooldown_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawSim {
    pub listen: Option<String>,
    pub scenarios: Option<BTreeMap<String, toml::Value>>,
}

/// `[auth]`: client keys (by SHA-256) and the browser tokens' secret. The keys are read one
/// by one (as `RawKey`) so each problem is reported at `auth.keys[i]`.
#[derive(Debug, Default, Deserialize)]
pub struct RawAuth {
    pub token_secret_env: Option<String>,
    pub keys: Option<Vec<toml::Value>>,
}

/// One `[[auth.keys]]` entry.
#[derive(Debug, Default, Deserialize)]
pub struct RawKey {
    pub name: Option<String>,
    pub sha256: Option<String>,
    pub tenant: Option<String>,
    pub models: Option<Vec<String>>,
    pub rpm: Option<u32>,
    pub tpm: Option<u32>,
    pub max_streams: Option<u32>,
    pub priority: Option<String>,
}
