//! Error classification: every upstream failure becomes a `ProviderError` with a class that
//! decides failover (rate_limited, unavailable, quota and not_found move on; bad_request,
//! auth and refusal do not) and the status a client gets.
//!
//! Layout: this file holds the nouns (`ErrorClass`, `Blame`, `ProviderError`); `classify`
//! reads upstream failures into them (a non-2xx answer, a transport failure, an error inside
//! a 200 stream); `redact` keeps credentials an upstream echoes out of every message.

mod classify;
mod redact;

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use classify::{classify_in_band, classify_response, classify_status, classify_transport, MAX_ERROR_BODY_BYTES};
pub use redact::redact;

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
    /// The route's account is out of credit or quota (`insufficient_quota`, billing): a
    /// configuration fault, not load. Cool the route for long, alert, fail over.
    Quota,
    /// The route's model or URL does not exist upstream (404): a gateway configuration
    /// fault. Fail over, alert, count it against the route.
    NotFound,
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
            ErrorClass::Quota => "quota",
            ErrorClass::NotFound => "not_found",
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
                | ErrorClass::Quota
                | ErrorClass::NotFound
        )
    }

    /// Does this failure say something about the route's health (breaker, error rate)?
    /// A 429 does not: it cools the route for its Retry-After and shrinks its admission
    /// limit, but a rate-limited route is not a broken one.
    pub fn counts_against_route(self) -> bool {
        matches!(
            self,
            ErrorClass::Unavailable
                | ErrorClass::Timeout
                | ErrorClass::Protocol
                | ErrorClass::InvalidOutput
                | ErrorClass::NotFound
        )
    }

    pub fn blame(self) -> Blame {
        match self {
            ErrorClass::BadRequest | ErrorClass::ContextLength => Blame::Client,
            ErrorClass::Auth
            | ErrorClass::Quota
            | ErrorClass::NotFound
            | ErrorClass::Overloaded
            | ErrorClass::NoRoute
            | ErrorClass::Internal => Blame::Gateway,
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
            ErrorClass::Auth | ErrorClass::Quota | ErrorClass::NotFound => 502,
            ErrorClass::Refusal => 422,
            // No route fits the request as asked (region, window, capability): the gateway
            // answers it with a 400 before any stream exists; retrying the same request
            // cannot help, so it is not a 503.
            ErrorClass::NoRoute => 400,
            ErrorClass::Overloaded => 503,
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
    /// Reaches clients (the error body, the envelope's failed attempts) and logs: built by
    /// `new`, which redacts any credential in it.
    pub message: String,
    /// How long the upstream asked us to wait (Retry-After and friends).
    pub retry_after: Option<Duration>,
}

impl ProviderError {
    /// A failure of `class`. The message is redacted (`redact`): upstream bodies and
    /// transport errors can echo our credentials.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        let message = message.into();
        let message = match redact(&message) {
            std::borrow::Cow::Borrowed(_) => message,
            std::borrow::Cow::Owned(clean) => clean,
        };
        ProviderError {
            class,
            status: None,
            message,
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

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [ErrorClass; 14] = [
        ErrorClass::RateLimited,
        ErrorClass::Unavailable,
        ErrorClass::Timeout,
        ErrorClass::Protocol,
        ErrorClass::BadRequest,
        ErrorClass::Auth,
        ErrorClass::Refusal,
        ErrorClass::InvalidOutput,
        ErrorClass::ContextLength,
        ErrorClass::Quota,
        ErrorClass::NotFound,
        ErrorClass::Overloaded,
        ErrorClass::NoRoute,
        ErrorClass::Internal,
    ];

    #[test]
    fn no_route_is_a_400_like_the_gateway_answers_it() {
        assert_eq!(
            ErrorClass::NoRoute.http_status(),
            400,
            "gateway.rs answers a plan with no eligible route with 400"
        );
        assert!(
            !ErrorClass::NoRoute.is_retryable(),
            "the same request cannot find a route later"
        );
    }

    #[test]
    fn configuration_faults_fail_over_and_answer_502() {
        for class in [ErrorClass::NotFound, ErrorClass::Quota] {
            assert!(class.is_retryable(), "{class} fails over");
            assert_eq!(class.blame(), Blame::Gateway, "{class} is our configuration");
            assert_eq!(class.http_status(), 502, "{class}: the client's request was fine");
        }
        assert!(ErrorClass::NotFound.counts_against_route(), "a 404 route is broken");
        assert!(
            !ErrorClass::Quota.counts_against_route(),
            "quota cools the route in health, it is not an outage"
        );
    }

    #[test]
    fn every_status_is_an_error_status_and_labels_are_distinct() {
        let mut labels: Vec<&str> = ALL.iter().map(|c| c.metric_label()).collect();
        for class in ALL {
            assert!((400..600).contains(&class.http_status()), "{class}");
        }
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), ALL.len(), "one label per class");
    }

    #[test]
    fn messages_are_redacted_when_built() {
        let e = ProviderError::new(
            ErrorClass::BadRequest,
            "header was authorization: Bearer sk-proj-abcdef1234567890",
        );
        assert_eq!(e.message, "header was authorization: Bearer [redacted]");
        assert!(!e.to_string().contains("sk-proj"), "Display too: {e}");
    }
}
