//! `MidStreamPolicy`: what happens when a committed stream fails (restart, continue,
//! truncate). Chosen by config per response type, applied by the mux, told in the envelope.

use serde::{Deserialize, Serialize};

/// What happens when a stream fails after its first token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
