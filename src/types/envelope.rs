//! The envelope: which route served, at what level, whether it was hedged, and every failure.

use serde::{Deserialize, Serialize};

use super::{ErrorClass, MidStreamPolicy};

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
}

fn is_zero(n: &u32) -> bool {
    *n == 0
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
