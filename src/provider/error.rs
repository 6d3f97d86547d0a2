//! Error classification: every upstream failure becomes a `ProviderError` with a class that
//! decides failover (rate_limited and unavailable move on; bad_request, auth and refusal do not).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What kind of failure this is; decides whether another route may be tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// 429 or a provider rate-limit signal: cool the route, try another.
    RateLimited,
    /// 5xx, 529, connection reset, in-band overload: count toward the breaker, fail over.
    Unavailable,
    /// No answer within the time allowed (deadline, stall, connect timeout).
    Timeout,
    /// The upstream broke its wire format (malformed event, EOF before the terminal signal).
    Protocol,
    /// 400: our bug or the client's. Never fail over.
    BadRequest,
    /// 401/403: gateway configuration. Never fail over; surface loudly.
    Auth,
    /// The model refused. Return it; never shop for a model that complies.
    Refusal,
    /// The answer did not parse or match its schema (e.g. tool-call arguments).
    InvalidOutput,
    /// The prompt does not fit this route's window: try a bigger one.
    ContextLength,
    /// The gateway itself is full (admission / connection caps).
    Overloaded,
    /// No route is eligible for this request.
    NoRoute,
    /// A bug in tailcut.
    Internal,
}

/// Who is at fault, for logs and alerting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    Client,
    Upstream,
    Gateway,
}

impl ErrorClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::RateLimited => "rate_limited",
            ErrorClass::Unavailable => "unavailable",
            ErrorClass::Timeout => "timeout",
            ErrorClass::Protocol => "protocol",
            ErrorClass::BadRequest => "bad_request",
            ErrorClass::Auth => "auth",
            ErrorClass::Refusal => "refusal",
            ErrorClass::InvalidOutput => "invalid_output",
            ErrorClass::ContextLength => "context_length",
            ErrorClass::Overloaded => "overloaded",
            ErrorClass::NoRoute => "no_route",
            ErrorClass::Internal => "internal",
        }
    }

    /// May another route (or the same one later) be tried after this failure?
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorClass::RateLimited
                | ErrorClass::Unavailable
                | ErrorClass::Timeout
                | ErrorClass::Protocol
                | ErrorClass::InvalidOutput
                | ErrorClass::ContextLength
        )
    }

    /// Does this failure say something about the route's health (breaker, error rate)?
    pub fn counts_against_route(self) -> bool {
        matches!(
            self,
            ErrorClass::RateLimited
                | ErrorClass::Unavailable
                | ErrorClass::Timeout
                | ErrorClass::Protocol
        )
    }

    pub fn blame(self) -> Blame {
        match self {
            ErrorClass::BadRequest | ErrorClass::ContextLength => Blame::Client,
            ErrorClass::Auth | ErrorClass::Overloaded | ErrorClass::NoRoute | ErrorClass::Internal => {
                Blame::Gateway
            }
            _ => Blame::Upstream,
        }
    }

    /// The HTTP status a client gets when this ends a request before commit.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorClass::RateLimited => 429,
            ErrorClass::Unavailable | ErrorClass::Protocol | ErrorClass::InvalidOutput => 502,
            ErrorClass::Timeout => 504,
            ErrorClass::BadRequest | ErrorClass::ContextLength => 400,
            // The client's credentials are fine; ours are not. Never pass a 401 through.
            ErrorClass::Auth => 502,
            ErrorClass::Refusal => 422,
            ErrorClass::Overloaded | ErrorClass::NoRoute => 503,
            ErrorClass::Internal => 500,
        }
    }

    pub fn metric_label(self) -> &'static str {
        self.as_str()
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One classified upstream failure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{class}: {message}")]
pub struct ProviderError {
    pub class: ErrorClass,
    /// The upstream's HTTP status, when there was one.
    pub status: Option<u16>,
    pub message: String,
    /// How long the upstream asked us to wait (Retry-After and friends).
    pub retry_after: Option<Duration>,
}

impl ProviderError {
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        ProviderError {
            class,
            status: None,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    pub fn with_retry_after(mut self, retry_after: Option<Duration>) -> Self {
        self.retry_after = retry_after;
        self
    }

    pub fn class(&self) -> ErrorClass {
        self.class
    }

    pub fn is_retryable(&self) -> bool {
        self.class.is_retryable()
    }

    pub fn blame(&self) -> Blame {
        self.class.blame()
    }

    pub fn metric_label(&self) -> &'static str {
        self.class.metric_label()
    }
}
