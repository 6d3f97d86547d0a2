//! The plan the router hands the mux: candidates in order with the reason for each position,
//! every exclusion with its codes, and what should happen to the session's lease.
//!
//! These are shared nouns: the router makes them, the mux reads them, the decision record
//! serializes them. Nothing here decides anything.

use std::time::Duration;

use serde::Serialize;

use super::{LeaseInfo, Level};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub model: String,
    /// How the candidates' families were ordered: `provider-only-before-model-change` or
    /// `ladder`.
    pub rotation: &'static str,
    /// The task type the quality floor was checked for.
    pub task: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality_floor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// In preference order: available routes by rung, lease and score; then routes that are
    /// cooling or behind an open breaker (tried only if they recover in time).
    pub candidates: Vec<Candidate>,
    /// Why each candidate sits where it does, in the same order as `candidates`.
    pub ranking: Vec<CandidateScore>,
    pub excluded: Vec<Exclusion>,
    /// The session's lease as planning found it: `kept` (its route leads its rung) or
    /// `revoked` with a reason. `None` without a session or lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseInfo>,
    /// What the lease table should do about it (planning itself changes nothing); `lease`
    /// above is the same decision as the envelope shows it.
    #[serde(skip)]
    pub lease_update: LeaseUpdate,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    pub route: String,
    pub level: Level,
}

/// One candidate's position explained, and the least deadline worth starting it with.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CandidateScore {
    pub route: String,
    /// Do not start an attempt here with less deadline left than this: the route's
    /// `min_useful_ms`, else its live p50 TTFT; `None` when neither is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_useful_ms: Option<u64>,
    /// The model family the route serves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
    pub score: ScoreBreakdown,
}

impl Plan {
    /// The least remaining deadline worth starting an attempt on `route` with.
    pub fn min_useful(&self, route: &str) -> Option<Duration> {
        self.score(route)
            .and_then(|s| s.min_useful_ms)
            .map(Duration::from_millis)
    }

    pub fn score(&self, route: &str) -> Option<&CandidateScore> {
        self.ranking.iter().find(|s| s.route == route)
    }
}

/// Can the route take traffic now?
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteStatus {
    Available,
    BreakerOpen,
    Cooling,
}

impl RouteStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RouteStatus::Available => "available",
            RouteStatus::BreakerOpen => "breaker_open",
            RouteStatus::Cooling => "cooling",
        }
    }
}

/// Why a candidate sits where it does in the plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScoreBreakdown {
    pub status: RouteStatus,
    pub level: Level,
    /// The session's lease points at this route (first within its rung).
    pub leased: bool,
    /// Live p95 TTFT; `None` when the window has too few samples.
    pub ttft_p95_ms: Option<f64>,
    /// The p95 the latency term used: the live one, or the plan's neutral mean.
    pub ttft_used_ms: f64,
    pub latency: f64,
    pub error_rate: f64,
    /// Attempts behind `error_rate`; below the ranking's minimum volume the error term is 0.
    pub error_volume: u64,
    pub errors: f64,
    pub cost_per_1k: f64,
    pub cost: f64,
    /// Lower is better.
    pub total: f64,
    /// For routes that are not available: when they may take traffic again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovers_in_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Exclusion {
    pub route: String,
    /// Every reason, joined for people.
    pub reason: String,
    /// Every reason's code, for metrics and tests.
    pub codes: Vec<ExclusionCode>,
}

/// Why a route was excluded, as a stable code for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExclusionCode {
    /// Not in the region the request or its tenant requires.
    Region,
    /// Lacks a data term the request or its tenant requires (e.g. `no_retention`).
    DataTerms,
    /// Does not serve the request's priority tier.
    Pool,
    /// Lacks tools, vision or native JSON schema output.
    Capability,
    /// The client's `max_tokens` exceeds what the route can produce.
    MaxOutput,
    /// Prompt plus reserved output exceed the context window.
    ContextLength,
    /// Below the quality floor for the request's task.
    QualityFloor,
    /// Speaks another wire than the client's, which cannot carry something the answer
    /// depends on (logprobs, signed thinking, documents, audio: `router::fidelity`).
    Fidelity,
}

impl ExclusionCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ExclusionCode::Region => "region",
            ExclusionCode::DataTerms => "data_terms",
            ExclusionCode::Pool => "pool",
            ExclusionCode::Capability => "capability",
            ExclusionCode::MaxOutput => "max_output",
            ExclusionCode::ContextLength => "context_length",
            ExclusionCode::QualityFloor => "quality_floor",
            ExclusionCode::Fidelity => "fidelity",
        }
    }
}

/// What planning decided about the session's lease, as data: the planner never touches the
/// lease table; whoever holds it applies this (`health::lease::LeaseTable::apply`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum LeaseUpdate {
    /// No session, no lease, or leases are off.
    #[default]
    None,
    /// The lease stands and its route leads its rung; the mux refreshes it at commit.
    Keep { route: String },
    /// Forget the lease. `generation` names the recording of it planning saw, so a lease
    /// recorded again since (a concurrent request of the session committed) is left alone.
    Revoke {
        route: String,
        reason: RevokeReason,
        generation: u64,
    },
}

impl LeaseUpdate {
    /// The route the session should prefer: its leased route, when the lease stands.
    pub fn preferred(&self) -> Option<&str> {
        match self {
            LeaseUpdate::Keep { route } => Some(route),
            LeaseUpdate::None | LeaseUpdate::Revoke { .. } => None,
        }
    }

    /// The decision as the envelope and the decision record show it.
    pub fn info(&self) -> Option<LeaseInfo> {
        let (route, state, reason) = match self {
            LeaseUpdate::None => return None,
            LeaseUpdate::Keep { route } => (route, LeaseState::Kept, None),
            LeaseUpdate::Revoke { route, reason, .. } => (route, LeaseState::Revoked, Some(reason.as_str())),
        };
        Some(LeaseInfo {
            route: route.clone(),
            state: state.as_str().to_string(),
            reason: reason.map(str::to_string),
        })
    }
}

/// `LeaseInfo::state`: what happened to a session's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Planning kept it, or the mux served the session from its route again.
    Kept,
    /// The mux started one (first commit of the session, or another route served).
    New,
    /// Planning revoked it.
    Revoked,
}

impl LeaseState {
    pub const fn as_str(self) -> &'static str {
        match self {
            LeaseState::Kept => "kept",
            LeaseState::New => "new",
            LeaseState::Revoked => "revoked",
        }
    }
}

/// Why planning revoked a lease (`LeaseInfo::reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RevokeReason {
    /// The leased route's breaker is open.
    BreakerOpen,
    /// The leased route is cooling after a rate limit.
    Cooling,
    /// The leased route is not eligible for this request (region, terms, capability, size,
    /// quality floor, or no longer behind the model: a policy change).
    Ineligible,
    /// The session was idle for longer than the TTL.
    Expired,
    /// A route on a better rung of the ladder is available again.
    HigherRung,
}

impl RevokeReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            RevokeReason::BreakerOpen => "breaker_open",
            RevokeReason::Cooling => "cooling",
            RevokeReason::Ineligible => "ineligible",
            RevokeReason::Expired => "expired",
            RevokeReason::HigherRung => "higher_rung_available",
        }
    }
}
