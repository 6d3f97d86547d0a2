//! The envelope: which route served, at what level, whether it was hedged, every failure,
//! every route change and the layer it moved, the repair attempt, the state hash, and which
//! turns of a WebSocket session's history were projected into the request.

use serde::{Deserialize, Serialize};

use super::{ErrorClass, MidStreamPolicy, Usage};

/// The degradation ladder. L4 is an honest failure and never has a route.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Level {
    #[default]
    L0,
    L1,
    L2,
    L3,
    L4,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::L0 => "L0",
            Level::L1 => "L1",
            Level::L2 => "L2",
            Level::L3 => "L3",
            Level::L4 => "L4",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "L0" => Some(Level::L0),
            "L1" => Some(Level::L1),
            "L2" => Some(Level::L2),
            "L3" => Some(Level::L3),
            "L4" => Some(Level::L4),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// The route that served (or is serving) the answer; `None` before commit and at L4.
    pub route: Option<String>,
    /// The upstream model id that produced the answer.
    pub model: Option<String>,
    pub level: Level,
    pub hedged: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hedge: Option<HedgeInfo>,
    pub fell_back_from: Vec<FailedAttempt>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<MidStreamPolicy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<u64>,
    pub attempts: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub resets: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub route_switches: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseInfo>,
    pub request_id: String,
    /// The family of the route that served (`[models.*] families`, or the route's upstream
    /// model id for the flat form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<Box<str>>,
    /// Every move from one route to another within this request, in order, with the layer
    /// that moved (`provider_switch` or `model_switch`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub route_changes: Vec<RouteChange>,
    /// The one repair attempt, when an answer failed its quality gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<Box<RepairInfo>>,
    /// A stable hash of the canonical request history (`types::state_hash`): the same
    /// whichever route serves, and the same for the same history.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub state_hash: Box<str>,
    /// On a WebSocket `session`: which turns of its kept history the request carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Box<HistoryInfo>>,
    /// The client's fields the serving route, of another wire, did not receive (they change
    /// no answer's meaning: `router::fidelity`), in the client's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<Box<str>>,
    /// After a mid-stream recovery, the tokens every attempt that streamed was billed, in
    /// order; the client's `usage` is the sum of those `in_answer` (docs/dialects.md, "Usage
    /// that adds up"). Empty for an answer one attempt wrote.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempt_usage: Vec<AttemptUsage>,
}

/// The tokens one attempt that streamed was billed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptUsage {
    pub route: String,
    pub usage: Usage,
    /// The route was cut before it reported its usage: the prompt and the output the client
    /// received, counted by the route's tokenizer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
    /// The client's answer holds this attempt's output (an attempt a continuation carried on,
    /// or the one that finished); not one a restart replaced.
    pub in_answer: bool,
}

/// The history a WebSocket session projected into one request (docs/ws-protocol.md).
/// Turns are numbered from 1 in the order the session kept them; one turn is the messages a
/// client sent in one `chat` and the answer it got.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HistoryInfo {
    pub session: String,
    /// The first and last turn carried (inclusive), `None` when none was.
    pub turns_included: Option<TurnRange>,
    /// Kept turns left out, oldest first, so the prompt fits the model's context window.
    pub dropped_for_budget: u32,
    /// Turns the session no longer keeps (past its turn or byte limit), since it began.
    pub dropped_for_limit: u64,
    /// This request's own turn number (its answer is kept under it).
    pub turn: u64,
}

/// An inclusive range of turn numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnRange {
    pub from: u64,
    pub to: u64,
}

/// Which layer moved when a request went from one route to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwitchLayer {
    /// Another provider endpoint of the same model family.
    ProviderSwitch,
    /// Another model family.
    ModelSwitch,
}

impl SwitchLayer {
    pub fn as_str(self) -> &'static str {
        match self {
            SwitchLayer::ProviderSwitch => "provider_switch",
            SwitchLayer::ModelSwitch => "model_switch",
        }
    }
}

/// One move from a failed route to the next one tried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteChange {
    pub from: String,
    pub to: String,
    pub layer: SwitchLayer,
    /// `failover` before the first token, `recovery` after it.
    pub phase: String,
}

/// The repair attempt: the route asked to correct an answer that failed its quality gate,
/// what the gate said, and how the repair ended (`repaired` or `failed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RepairInfo {
    pub route: String,
    pub error: String,
    pub outcome: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_empty(s: &str) -> bool {
    s.is_empty()
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HedgeInfo {
    pub fired_after_ms: u64,
    pub primary: String,
    pub hedge_route: String,
    /// The route whose first token arrived first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub winner: Option<String>,
    /// Time from the winner's first token to the loser being dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loser_cancelled_ms: Option<f64>,
}

/// One attempt that did not serve the answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedAttempt {
    pub route: String,
    pub class: ErrorClass,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    pub message: String,
    /// Milliseconds from the request's start to the failure.
    pub after_ms: u64,
    /// Content tokens the attempt had produced before it failed (mid-stream failures).
    #[serde(skip_serializing_if = "is_zero")]
    pub after_tokens: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseInfo {
    pub route: String,
    /// `kept`, `new` or `revoked`.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
