//! Error classification: every upstream failure becomes a `ProviderError` with a class that
//! decides failover (rate_limited, unavailable, quota and not_found move on; bad_request,
//! auth and refusal do not) and the status a client gets.
//!
//! Layout: this file holds `ProviderError` (its class, `ErrorClass`, is a shared noun in
//! `types`, since the mux, health and the transports decide on it too); `classify`
//! reads upstream failures into them (a non-2xx answer, a transport failure, an error inside
//! a 200 stream) in tailcut's own words plus a bounded excerpt of the upstream's; `redact`
//! keeps credentials an upstream echoes (the configured route keys, registered at startup
//! with `register_secret`, and known key shapes) out of every message.

mod classify;
mod redact;

use std::time::Duration;

pub use crate::types::{Blame, ErrorClass};
pub use classify::{
    classify_body, classify_in_band, classify_response, classify_status, classify_transport, MAX_ERROR_BODY_BYTES,
};
pub(crate) use redact::{
    any_registered, continues_registered, ends_value, ends_with_registered, fragment_start_at_end, registered_end_in,
    registered_spans, replace_spans, rest_of_registered, FRAGMENT_CHARS, REDACTED,
};
pub use redact::{redact, register_secret, MIN_SECRET_CHARS};

/// A last bound on any message, whoever composed it (a failover summary names every
/// attempt): upstream text in it is already cut to `MAX_EXCERPT_CHARS` per quote.
const MAX_MESSAGE_CHARS: usize = 4096;

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
    /// The connection failed (refused, reset, a body cut): the upstream said nothing, so it
    /// is no overload signal, unlike a 5xx, a 529 or an in-band overload error.
    pub transport: bool,
}

impl ProviderError {
    /// A failure of `class`. The message is redacted (`redact`): upstream bodies and
    /// transport errors can echo our credentials. Then bounded (`MAX_MESSAGE_CHARS`).
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        let message = message.into();
        let mut message = match redact(&message) {
            std::borrow::Cow::Borrowed(_) => message,
            std::borrow::Cow::Owned(clean) => clean,
        };
        if let Some((cut, _)) = message.char_indices().nth(MAX_MESSAGE_CHARS) {
            message.truncate(cut);
            message.push('…');
        }
        ProviderError {
            class,
            status: None,
            message,
            retry_after: None,
            transport: false,
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

    const ALL: [ErrorClass; 16] = [
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
        ErrorClass::Unauthenticated,
        ErrorClass::Forbidden,
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

    #[test]
    fn registered_keys_are_redacted_and_messages_bounded_when_built() {
        assert!(register_secret("tc-mod-test-9f8e7d6c5b4a"), "registered");
        let e = ProviderError::new(
            ErrorClass::Protocol,
            "invalid type: string \"tc-mod-test-9f8e7d6c5b4a\"",
        );
        assert_eq!(e.message, "invalid type: string \"[redacted]\"");
        let long = ProviderError::new(ErrorClass::Unavailable, "é".repeat(MAX_MESSAGE_CHARS * 2));
        assert_eq!(
            long.message.chars().count(),
            MAX_MESSAGE_CHARS + 1,
            "bounded, with an ellipsis"
        );
    }
}
