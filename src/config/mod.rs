//! Configuration: the TOML contract (`raw`), its validation with every problem reported at
//! once (`validate`), and the validated `Config` the rest of the server reads.

mod auth;
mod breaker;
mod env;
mod extends;
mod families;
mod raw;
mod routes;
mod routing;
mod sections;
mod server;
mod state;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

pub use crate::types::MidStreamPolicy;
pub use auth::{is_loopback, valid_key_name, AuthConfig, KeyConfig};
pub use breaker::{BreakerConfig, ProbeMode};
pub use env::{missing_env, Severity};
pub use families::{EvalConfig, Family, Rotation};
pub use sections::normalize_origin;
pub use server::{RequestLimits, ServerConfig, StreamsConfig};
pub use state::{redis_host, StateConfig};
pub use validate::{check_file, load_file, load_str, resolve_addr, ConfigError, ConfigProblem};

use crate::sim::Scenario;
use crate::types::Priority;
use crate::types::{Level, ModelRules, PrefillConvention, ResponseType};

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
    /// Per-route circuit breakers (one per route, all with these settings).
    pub breaker: BreakerConfig,
    /// Named tenants (header `x-tailcut-tenant`): residency, data terms and defaults.
    pub tenants: BTreeMap<String, TenantConfig>,
    pub ranking: RankingConfig,
    pub leases: LeaseConfig,
    pub cache: CacheConfig,
    pub sim: SimConfig,
    /// `[auth]`: client keys and browser tokens; `None`: no auth, loopback only.
    pub auth: Option<AuthConfig>,
    /// `[eval]`: measured scores loaded into the routes' quality.
    pub eval: EvalConfig,
    /// `[state]`: in memory, or shared through Redis.
    pub state: StateConfig,
}

impl Config {
    pub fn route(&self, name: &str) -> Option<&RouteConfig> {
        self.routes.iter().find(|r| r.name == name)
    }

    /// The hedge settings for a primary on `route`: `[hedge]` with the route's overrides.
    pub fn hedge_for(&self, route: &str) -> HedgeConfig {
        let mut h = self.hedge.clone();
        if let Some(r) = self.route(route) {
            h.percentile = r.hedge_percentile.unwrap_or(h.percentile);
            h.floor = r.hedge_floor.unwrap_or(h.floor);
            h.ceiling = r.hedge_ceiling.unwrap_or(h.ceiling);
        }
        h
    }

    pub fn tenant(&self, name: &str) -> Option<&TenantConfig> {
        self.tenants.get(name)
    }

    /// Does any route need the in-process simulated upstream?
    pub fn needs_sim(&self) -> bool {
        self.routes.iter().any(|r| r.provider == ProviderKind::Simulated)
    }
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
pub use crate::types::Wire;

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
    /// Reach a plain-http upstream over HTTP/2 from the first byte (h2c), many streams per
    /// connection; never set for an https one (ALPN decides there).
    pub http2_prior_knowledge: bool,
    pub model: String,
    pub api_key_env: Option<String>,
    pub region: String,
    pub data_terms: Vec<String>,
    pub level: Level,
    pub capabilities: Capabilities,
    /// How this route is asked to continue a partial answer (`capabilities.prefill` is
    /// true exactly when this is not `None`).
    pub prefill: PrefillConvention,
    pub context_window: u32,
    pub max_output: u32,
    pub cost_per_1k: f64,
    /// Simulated routes: the scenario name (a built-in profile or `[sim.scenarios.*]`).
    pub scenario: Option<String>,
    pub hedge: bool,
    /// A first token slower than this is a latency breach: the route's AIMD limit shrinks as
    /// on a 429. `None`: latency never shrinks it.
    pub latency_slo: Option<Duration>,
    /// An attempt with no first token for this long is failed over (hedging usually acts
    /// long before; this catches a route that accepts and then says nothing).
    pub first_token_timeout: Duration,
    /// Per-route overrides of `[hedge] percentile`, `floor_ms` and `ceiling_ms` for hedging
    /// a primary on this route.
    pub hedge_percentile: Option<f64>,
    pub hedge_floor: Option<Duration>,
    pub hedge_ceiling: Option<Duration>,
    /// Requests on this route have side effects: never hedged.
    pub side_effecting: bool,
    /// No token for this long after the first one is a stall (a mid-stream failure).
    pub stall_timeout: Duration,
    pub connect_timeout: Duration,
    /// Starting AIMD concurrency limit (it adapts between 1 and 16x this).
    pub concurrency: u32,
    /// Quality score (0..1) per task type, e.g. `chat`, `code`. A task without a score fails
    /// any quality floor.
    pub quality: BTreeMap<String, f64>,
    /// Which priority tiers may use this route.
    pub pools: Pools,
    /// How prompt tokens are counted for the context-window check.
    pub tokenizer: TokenizerChoice,
    /// An attempt is not started with less deadline left than this; `None` = the route's live
    /// p50 TTFT.
    pub min_useful: Option<Duration>,
    /// Its model's token parameter and the request fields it drops or refuses.
    pub rules: ModelRules,
}

/// The priority tiers a route serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pools {
    pub interactive: bool,
    pub batch: bool,
}

impl Default for Pools {
    fn default() -> Self {
        Pools {
            interactive: true,
            batch: true,
        }
    }
}

impl Pools {
    pub fn admits(self, priority: Priority) -> bool {
        match priority {
            Priority::Interactive => self.interactive,
            Priority::Batch => self.batch,
        }
    }
}

/// The tokenizer used to count a prompt against a route's context window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TokenizerChoice {
    /// `o200k`/`cl100k` when the route's model names an OpenAI family, else `estimate`.
    #[default]
    Auto,
    O200k,
    Cl100k,
    /// About four bytes of text per token, plus a margin.
    Estimate,
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Every route of the model, in config order (the families' routes, family by family).
    pub routes: Vec<String>,
    /// The model's families in order (`routing::Family`); inferred from the routes' upstream
    /// model ids for the flat `routes = [...]` form.
    pub families: Vec<Family>,
    /// How the plan orders the families' routes.
    pub rotation: Rotation,
    pub hedge: bool,
    /// The task type assumed when neither the request nor its tenant names one.
    pub task: String,
    /// Minimum route quality per task type for this model; `"*"` applies to every task.
    pub quality_floor: BTreeMap<String, f64>,
}

/// Looks up a floor in a per-task table: the task's own entry, else the `"*"` entry.
pub fn floor_for(table: &BTreeMap<String, f64>, task: &str) -> Option<f64> {
    table.get(task).or_else(|| table.get("*")).copied()
}

/// A tenant (header `x-tailcut-tenant`). Region, data terms and the quality floor are rules
/// that only narrow what a request may use; the rest are defaults a request header overrides.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantConfig {
    pub name: String,
    /// Only routes in this region are eligible.
    pub region: Option<String>,
    /// Every term here must be among a route's `data_terms`.
    pub data_terms: Vec<String>,
    pub deadline: Option<Duration>,
    /// The highest tier this tenant's requests get (a header may only lower it).
    pub priority: Option<Priority>,
    /// `Some(false)`: never hedge this tenant's requests.
    pub hedge: Option<bool>,
    pub response_type: Option<ResponseType>,
    /// Default task type for the quality floor.
    pub task: Option<String>,
    /// Minimum route quality per task type; `"*"` applies to every task.
    pub quality_floor: BTreeMap<String, f64>,
}

/// Weights of the ranking score (lower is better), in seconds-equivalent of p95 TTFT.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankingConfig {
    /// Per second of live p95 TTFT.
    pub latency_weight: f64,
    /// Per unit of error rate (1.0 = every attempt failing).
    pub error_weight: f64,
    /// Per currency unit of `cost_per_1k`.
    pub cost_weight: f64,
}

impl Default for RankingConfig {
    fn default() -> Self {
        RankingConfig {
            latency_weight: 1.0,
            error_weight: 2.0,
            cost_weight: 10.0,
        }
    }
}

/// Route leases: a session keeps its route while it stays healthy and eligible.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeaseConfig {
    pub enabled: bool,
    /// A lease lapses this long after the session's last served request.
    pub ttl: Duration,
    /// Sessions remembered at once; the least recently served are forgotten first.
    pub max_sessions: usize,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            enabled: true,
            ttl: Duration::from_secs(600),
            max_sessions: 100_000,
        }
    }
}

/// The L3 answer cache: complete answers keyed by the normalised request, served only when
/// no generating route can answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheConfig {
    pub enabled: bool,
    pub max_entries: usize,
    pub ttl: Duration,
    /// Larger answers are not stored.
    pub max_answer_bytes: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            enabled: false,
            max_entries: 1_000,
            ttl: Duration::from_secs(300),
            max_answer_bytes: 65_536,
        }
    }
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
    /// Fleet-wide: retries plus hedges may be at most this share of requests over
    /// `retry_budget_window` ...
    pub retry_budget_ratio: f64,
    /// ... plus this many per second, whatever the ratio says.
    pub retry_budget_floor_per_sec: f64,
    pub retry_budget_window: Duration,
    /// Extra load any one route may take from failover, as a share of its normal load over
    /// `retry_budget_window` (0.5 = at most 50% more than it serves as a first choice) ...
    pub blast_radius: f64,
    /// ... plus this many failover attempts per second, so an idle route can still take over.
    pub blast_radius_floor_per_sec: f64,
    /// Share of committed requests also sent, in the background, to the next route of the
    /// plan (result discarded, never on the client's stream) so fallbacks are proven before
    /// an incident needs them.
    pub shadow_share: f64,
    /// Shadow requests running at once, at most.
    pub shadow_max_in_flight: usize,
}

#[derive(Debug, Clone, Default)]
pub struct SimConfig {
    /// Where the in-process simulator listens (port 0 = any free loopback port).
    pub listen: Option<SocketAddr>,
    pub scenarios: BTreeMap<String, Scenario>,
}
