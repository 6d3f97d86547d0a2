//! `MuxError`: the mux's own reasons to end an attempt or an answer (a stall, the request's
//! deadline, the stream cap, an attempt that ended without an outcome, a hidden restart that
//! diverged), each classifying itself.

use std::time::Duration;

use crate::provider::ProviderError;
use crate::types::{Blame, ErrorClass};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MuxError {
    /// No token for the route's inter-token limit after commit.
    #[error("stalled: no token for {} ms", .0.as_millis())]
    Stalled(Duration),
    /// No first token within the route's first-token timeout.
    #[error("no first token within {} ms", .0.as_millis())]
    FirstTokenTimeout(Duration),
    /// The request's deadline passed before a first token (never the route's fault).
    #[error("request deadline exceeded before the first token")]
    Deadline,
    /// The answer ran past `server.max_stream_ms` (our cap, never the route's fault).
    #[error("answer exceeded the maximum stream duration")]
    StreamCap,
    /// The attempt's stream ended without a finish or a failure.
    #[error("attempt ended without an outcome")]
    NoOutcome,
    /// A restart the client could not be told about produced a different answer.
    #[error(
        "the answer was interrupted and its retry on {route} diverged from the text already sent; the response is incomplete"
    )]
    Diverged { route: String },
    /// The committed answer broke and no policy of its type could carry it on (its
    /// recoveries were spent, or it is too long to continue or compare).
    #[error("the answer broke mid-stream and could not be carried on: {0}; the response is incomplete")]
    Unrecoverable(&'static str),
}

impl MuxError {
    pub fn class(&self) -> ErrorClass {
        match self {
            MuxError::Stalled(_) | MuxError::FirstTokenTimeout(_) | MuxError::Deadline | MuxError::StreamCap => {
                ErrorClass::Timeout
            }
            MuxError::NoOutcome => ErrorClass::Protocol,
            MuxError::Diverged { .. } | MuxError::Unrecoverable(_) => ErrorClass::Unavailable,
        }
    }

    /// Is this the failing route's fault (held against its health)?
    pub fn blames_route(&self) -> bool {
        !matches!(
            self,
            MuxError::Deadline | MuxError::StreamCap | MuxError::Unrecoverable(_)
        )
    }

    pub fn blame(&self) -> Blame {
        if self.blames_route() {
            Blame::Upstream
        } else {
            Blame::Gateway
        }
    }

    pub fn metric_label(&self) -> &'static str {
        match self {
            MuxError::Stalled(_) => "stalled",
            MuxError::FirstTokenTimeout(_) => "first_token_timeout",
            MuxError::Deadline => "deadline",
            MuxError::StreamCap => "stream_cap",
            MuxError::NoOutcome => "no_outcome",
            MuxError::Diverged { .. } => "diverged",
            MuxError::Unrecoverable(_) => "unrecoverable",
        }
    }
}

/// Where an attempt's failure is recorded (its route's health, the envelope), a mux error is
/// one more classified failure of that attempt.
impl From<MuxError> for ProviderError {
    fn from(e: MuxError) -> Self {
        ProviderError::new(e.class(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_limits_never_blame_the_route() {
        assert!(!MuxError::Deadline.blames_route());
        assert!(!MuxError::StreamCap.blames_route());
        assert!(MuxError::Stalled(Duration::from_secs(5)).blames_route());
        let e = ProviderError::from(MuxError::Stalled(Duration::from_millis(5000)));
        assert_eq!(e.class, ErrorClass::Timeout);
        assert_eq!(e.message, "stalled: no token for 5000 ms");
    }
}
