//! Configuration: the TOML contract (`raw`), its validation with every problem reported at
//! once (`validate`), and the validated `Config` the rest of the server reads.

mod raw;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

pub use validate::{load_file, load_str, ConfigError, ConfigProblem};

use crate::sim::Scenario;
use crate::types::{Level, ResponseType};

/// The configuration embedded in the binary: simulated routes, no keys needed.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub routes: Vec<RouteConfig>,
    /// Client-facing model names and the routes behind each, in preference order.
    pub models: BTreeMap<String, ModelConfig>,
    pub hedge: HedgeConfig,
    pub policies: PolicyConfig,
    pub limits: LimitsConfig,
    pub sim: SimConfig,
}

impl Config {
    pub fn route(&self, name: &str) -> Option<&RouteConfig> {
        self.routes.iter().find(|r| r.name == name)
    }

    /// Does any route need the in-process simulated upstream?
    pub fn needs_sim(&self) -> bool {
        self.routes.iter().any(|r| r.provider == ProviderKind::Simulated)
    }
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// How long in-flight streams may run after SIGTERM before they are cut.
    pub drain: Duration,
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub max_body_bytes: usize,
    pub max_connections: usize,
    pub max_streams: usize,
    /// SSE `: ping` comment interval.
    pub sse_keepalive: Duration,
    /// Origins allowed to open a WebSocket besides same-origin ones.
    pub ws_allowed_origins: Vec<String>,
    pub ws_max_message_bytes: usize,
    pub ws_buffer_bytes: usize,
    /// Outgoing WS messages queued per socket before a non-reading client is disconnected.
    pub ws_send_queue: usize,
    pub ws_ping_interval: Duration,
    /// Name of the env var holding the bearer token for `/admin` writes.
    pub admin_token_env: Option<String>,
    /// Default deadline per logical request.
    pub deadline: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    OpenAi,
    Anthropic,
    Simulated,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Simulated => "simulated",
        }
    }
}

/// Which wire format a route speaks (simulated routes choose one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    OpenAi,
    Anthropic,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub tools: bool,
    pub vision: bool,
    pub json_schema: bool,
    /// Can continue from a partial assistant message (the `continue` policy).
    pub prefill: bool,
    pub streaming: bool,
}

#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub name: String,
    pub provider: ProviderKind,
    pub wire: Wire,
    /// Upstream base URL. OpenAI's includes `/v1`; Anthropic's is the host root. For simulated
    /// routes it is filled in at startup from the in-process simulator's address.
    pub base_url: Option<String>,
    pub model: String,
    pub api_key_env: Option<String>,
    pub region: String,
    pub data_terms: Vec<String>,
    pub level: Level,
    pub capabilities: Capabilities,
    pub context_window: u32,
    pub max_output: u32,
    pub cost_per_1k: f64,
    /// Simulated routes: the scenario name (a built-in profile or `[sim.scenarios.*]`).
    pub scenario: Option<String>,
    pub hedge: bool,
    /// Requests on this route have side effects: never hedged.
    pub side_effecting: bool,
    /// No token for this long after the first one is a stall (a mid-stream failure).
    pub stall_timeout: Duration,
    pub connect_timeout: Duration,
    /// Starting AIMD concurrency limit (it adapts between 1 and 16x this).
    pub concurrency: u32,
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub routes: Vec<String>,
    pub hedge: bool,
}

#[derive(Debug, Clone)]
pub struct HedgeConfig {
    pub enabled: bool,
    /// The TTFT percentile that sets the hedge delay (0.95 by default).
    pub percentile: f64,
    pub floor: Duration,
    pub ceiling: Duration,
    /// Delay used until a route has `min_samples` first tokens in its window.
    pub default_delay: Duration,
    pub min_samples: u64,
    /// Length of the rolling TTFT window.
    pub window: Duration,
    /// Hedges allowed as a share of requests over `budget_window`.
    pub budget_ratio: f64,
    /// Hedges always allowed per second, whatever the ratio says.
    pub budget_floor_per_sec: f64,
    pub budget_window: Duration,
    pub max_concurrent_attempts: usize,
}

/// What happens when a stream fails after its first token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MidStreamPolicy {
    Restart,
    Continue,
    Truncate,
}

impl MidStreamPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            MidStreamPolicy::Restart => "restart",
            MidStreamPolicy::Continue => "continue",
            MidStreamPolicy::Truncate => "truncate",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "restart" => Some(MidStreamPolicy::Restart),
            "continue" => Some(MidStreamPolicy::Continue),
            "truncate" => Some(MidStreamPolicy::Truncate),
            _ => None,
        }
    }
}

/// Per response type: the policy to try first and the one to fall back to.
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    pub by_type: BTreeMap<&'static str, (MidStreamPolicy, MidStreamPolicy)>,
}

impl PolicyConfig {
    pub fn for_type(&self, t: ResponseType) -> (MidStreamPolicy, MidStreamPolicy) {
        self.by_type
            .get(t.as_str())
            .copied()
            .unwrap_or((MidStreamPolicy::Restart, MidStreamPolicy::Truncate))
    }
}

#[derive(Debug, Clone)]
pub struct LimitsConfig {
    pub max_attempts: u32,
    /// Restarts/continues allowed after commit, per request.
    pub max_midstream_recoveries: u32,
}

#[derive(Debug, Clone, Default)]
pub struct SimConfig {
    /// Where the in-process simulator listens (port 0 = any free loopback port).
    pub listen: Option<SocketAddr>,
    pub scenarios: BTreeMap<String, Scenario>,
}
