//! `ErrorClass`: what kind of failure ended an attempt or a request, and what follows from
//! it (failover, breaker, blame, the client's status). Every layer decides on it, so it lives
//! here; `provider::error` classifies upstream failures into it.

use std::fmt;

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
    /// The client's key or token is missing, wrong or expired (`[auth]`): 401.
    Unauthenticated,
    /// The client's key may not do this (another tenant, a model off its list): 403.
    Forbidden,
    /// tailcut is shutting down: the request was refused, or the answer was ended at the end
    /// of the drain. Retry on another instance.
    Draining,
    /// The client took nothing for `client_write_timeout_ms` while an answer waited for it
    /// (it stopped reading, or reads too slowly): the answer was dropped. The client's fault.
    ClientTooSlow,
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
            ErrorClass::Unauthenticated => "unauthenticated",
            ErrorClass::Forbidden => "forbidden",
            ErrorClass::Draining => "draining",
            ErrorClass::ClientTooSlow => "client_too_slow",
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
            ErrorClass::BadRequest
            | ErrorClass::ContextLength
            | ErrorClass::Unauthenticated
            | ErrorClass::Forbidden
            | ErrorClass::ClientTooSlow => Blame::Client,
            ErrorClass::Auth
            | ErrorClass::Quota
            | ErrorClass::NotFound
            | ErrorClass::Overloaded
            | ErrorClass::NoRoute
            | ErrorClass::Internal
            | ErrorClass::Draining => Blame::Gateway,
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
            ErrorClass::Overloaded | ErrorClass::Draining => 503,
            ErrorClass::Internal => 500,
            ErrorClass::Unauthenticated => 401,
            ErrorClass::Forbidden => 403,
            // Request Timeout: the server gave up on a client that would not take its answer.
            ErrorClass::ClientTooSlow => 408,
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
