//! An error as a client will see it (status, class, message, retry hint, envelope), built
//! from gateway, stream and decoding failures and rendered by each dialect in its own format.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::gateway::GatewayError;
use crate::provider::ErrorClass;
use crate::types::{Envelope, ErrorEvent};

/// A request body the dialect could not turn into a `ChatRequest`. Always a 400.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct DecodeError {
    /// Says what is wrong and where, in words a client can act on.
    pub message: String,
    /// The request field at fault (OpenAI's `param`), when there is one.
    pub param: Option<String>,
}

impl DecodeError {
    pub fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        DecodeError {
            message: message.into(),
            param: Some(param.into()),
        }
    }

    pub fn body(message: impl Into<String>) -> Self {
        DecodeError {
            message: message.into(),
            param: None,
        }
    }

    /// A body that did not parse: JSON of the wrong shape, or not JSON at all.
    pub fn from_json(e: serde_json::Error) -> Self {
        match e.classify() {
            serde_json::error::Category::Data => DecodeError::body(format!("invalid request: {e}")),
            _ => DecodeError::body(format!("the request body is not valid JSON: {e}")),
        }
    }
}

/// Everything a dialect needs to render one error, before or after commit.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorReply {
    /// The HTTP status when nothing was committed yet.
    pub status: u16,
    pub class: ErrorClass,
    pub message: String,
    pub retry_after: Option<Duration>,
    /// The request field at fault (OpenAI's `param`).
    pub param: Option<String>,
    /// A code more specific than the class (OpenAI's `code`), e.g. `model_not_found`.
    pub code: Option<&'static str>,
    /// Boxed: an envelope is large and most errors have none.
    pub envelope: Option<Box<Envelope>>,
}

impl ErrorReply {
    fn new(status: u16, class: ErrorClass, message: impl Into<String>) -> Self {
        ErrorReply {
            status,
            class,
            message: message.into(),
            retry_after: None,
            param: None,
            code: None,
            envelope: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ErrorReply::new(400, ErrorClass::BadRequest, message)
    }

    /// Every chat-stream permit is taken.
    pub fn busy() -> Self {
        ErrorReply {
            retry_after: Some(Duration::from_secs(1)),
            ..ErrorReply::new(
                503,
                ErrorClass::Overloaded,
                "tailcut is at capacity (too many open streams); retry shortly",
            )
        }
    }

    pub fn from_gateway(e: &GatewayError) -> Self {
        let mut reply = ErrorReply::new(e.status(), e.class(), e.to_string());
        reply.retry_after = e.retry_after();
        if let GatewayError::UnknownModel { .. } = e {
            reply.param = Some("model".to_string());
            reply.code = Some("model_not_found");
        }
        reply
    }

    /// A terminal error from the event stream, rendered with the status the mux chose.
    pub fn from_event(e: ErrorEvent) -> Self {
        ErrorReply {
            status: e.status,
            class: e.class,
            message: e.message,
            retry_after: e.retry_after,
            param: None,
            code: None,
            envelope: Some(Box::new(e.envelope)),
        }
    }

    /// A terminal error that arrived after commit, for a reply that has not been sent yet
    /// (non-streaming): the answer broke midway, which is a bad gateway whatever the cause.
    pub fn after_commit(e: ErrorEvent) -> Self {
        ErrorReply {
            status: 502,
            ..ErrorReply::from_event(e)
        }
    }

    /// The `truncate` policy kept a partial answer, and this dialect has no finish reason
    /// that says so honestly.
    pub fn truncated(envelope: Envelope) -> Self {
        ErrorReply {
            code: Some("truncated"),
            envelope: Some(Box::new(envelope)),
            ..ErrorReply::new(
                502,
                ErrorClass::Unavailable,
                "the answer was cut short by a mid-stream failure; what was sent is incomplete",
            )
        }
    }

    /// The mux restarted the answer, and this dialect cannot take back text already sent.
    pub fn reset(reason: &str, envelope: Option<Envelope>) -> Self {
        ErrorReply {
            code: Some("restarted"),
            envelope: envelope.map(Box::new),
            ..ErrorReply::new(
                502,
                ErrorClass::Unavailable,
                format!("the answer had to be restarted ({reason}) after part of it was sent; discard it and retry"),
            )
        }
    }

    /// The event stream broke its contract (ended without a terminal event, or did not
    /// begin with `Start` or `Error`).
    pub fn broken_stream(what: &str, envelope: Option<Envelope>) -> Self {
        ErrorReply {
            envelope: envelope.map(Box::new),
            ..ErrorReply::new(500, ErrorClass::Internal, format!("the answer stream {what}"))
        }
    }

    /// Headers every error response carries: the request id and, when known, how long to
    /// wait (`retry-after` in whole seconds rounded up, and the precise `retry-after-ms`
    /// that the OpenAI and Anthropic SDKs read first).
    pub fn headers(&self, request_id: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        insert(&mut headers, "x-request-id", request_id);
        if let Some(wait) = self.retry_after {
            insert(&mut headers, "retry-after", &retry_after_secs(wait).to_string());
            insert(&mut headers, "retry-after-ms", &wait.as_millis().to_string());
        }
        headers
    }

    pub fn retry_after_ms(&self) -> Option<u64> {
        self.retry_after
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// `retry-after` is whole seconds; round up so a client never retries too early.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let whole = wait.as_secs();
    if wait.subsec_nanos() > 0 {
        whole.saturating_add(1)
    } else {
        whole
    }
}

/// Inserts a header, skipping values that are not valid header text (they can come from
/// configuration or a client's request id).
pub(crate) fn insert(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), value);
    }
}

impl From<DecodeError> for ErrorReply {
    fn from(e: DecodeError) -> Self {
        ErrorReply {
            param: e.param,
            ..ErrorReply::bad_request(e.message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(
            retry_after_secs(Duration::from_millis(200)),
            1,
            "a fraction waits a whole second"
        );
        assert_eq!(
            retry_after_secs(Duration::from_secs(3)),
            3,
            "whole seconds stay as they are"
        );
        assert_eq!(
            retry_after_secs(Duration::from_millis(2001)),
            3,
            "2.001 s rounds up to 3"
        );
        assert_eq!(retry_after_secs(Duration::ZERO), 0, "no wait is 0");
    }

    #[test]
    fn error_headers_carry_request_id_and_both_retry_hints() {
        let reply = ErrorReply::busy();
        let h = reply.headers("req_1");
        assert_eq!(
            h.get("x-request-id").map(|v| v.as_bytes()),
            Some(&b"req_1"[..]),
            "request id header"
        );
        assert_eq!(
            h.get("retry-after").map(|v| v.as_bytes()),
            Some(&b"1"[..]),
            "busy says retry after 1 s"
        );
        assert_eq!(
            h.get("retry-after-ms").map(|v| v.as_bytes()),
            Some(&b"1000"[..]),
            "precise hint"
        );
    }

    #[test]
    fn no_retry_header_without_a_retry_hint() {
        let h = ErrorReply::bad_request("nope").headers("req_1");
        assert!(h.get("retry-after").is_none(), "a 400 has no retry-after");
    }

    #[test]
    fn unknown_model_is_a_400_with_model_not_found_code() {
        let e = GatewayError::UnknownModel {
            model: "gpt-9".into(),
            known: vec!["chat".into(), "fast".into()],
        };
        let reply = ErrorReply::from_gateway(&e);
        assert_eq!(reply.status, 400, "unknown model is a client error");
        assert_eq!(reply.code, Some("model_not_found"), "OpenAI's code for it");
        assert!(
            reply.message.contains("chat, fast"),
            "message lists known models: {}",
            reply.message
        );
    }

    #[test]
    fn an_error_after_commit_is_a_bad_gateway_for_non_streaming_replies() {
        let e = ErrorEvent {
            class: ErrorClass::RateLimited,
            status: 429,
            message: "slow down".into(),
            retry_after: None,
            envelope: Envelope::default(),
        };
        assert_eq!(ErrorReply::after_commit(e).status, 502, "a broken answer is a 502");
    }
}
