//! An error as a client will see it (status, class, message, retry hint, envelope), built
//! from gateway, stream and decoding failures and rendered by each dialect in its own format.
//!
//! Upstream text reaches a client only through a stream's `ErrorEvent`: its message and the
//! envelope's `fell_back_from[].message` are tailcut's own words with a bounded, redacted
//! excerpt (built so in `provider::error`), and are redacted once more here, the last step
//! before any dialect renders them.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::decode_error::DecodeError;
use crate::gateway::GatewayError;
use crate::provider::redact;
use crate::types::{Envelope, ErrorClass, ErrorEvent};

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

    /// The body is not declared as JSON (`content-type` other than `application/json` or
    /// `application/*+json`): 415, so a form post is never parsed as a chat request.
    pub fn unsupported_media_type(found: Option<&str>) -> Self {
        let found = found.map_or_else(|| "no content-type".to_string(), |t| format!("content-type {t:?}"));
        ErrorReply {
            code: Some("unsupported_media_type"),
            param: Some("content-type".to_string()),
            ..ErrorReply::new(
                415,
                ErrorClass::BadRequest,
                format!("the request body must be JSON (content-type: application/json), not {found}"),
            )
        }
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
        match e {
            GatewayError::UnknownModel { .. } => {
                reply.param = Some("model".to_string());
                reply.code = Some("model_not_found");
            }
            GatewayError::InvalidSchema(refusal) => {
                reply.param = Some(refusal.param.clone());
                reply.code = Some(refusal.code);
            }
            GatewayError::BadHeader { header, .. } => reply.param = Some((*header).to_string()),
            _ => {}
        }
        reply
    }

    /// A terminal error from the event stream, rendered with the status the mux chose. A
    /// retry hint is passed on only where waiting helps (`waiting_helps`): SDKs honour
    /// Retry-After, and a hint on a timeout or a 400 only makes them retry in vain.
    pub fn from_event(e: ErrorEvent) -> Self {
        let mut envelope = e.envelope;
        for failed in &mut envelope.fell_back_from {
            redact_in_place(&mut failed.message);
        }
        let mut message = e.message;
        redact_in_place(&mut message);
        ErrorReply {
            status: e.status,
            class: e.class,
            message,
            retry_after: e.retry_after.filter(|_| waiting_helps(e.class)),
            param: None,
            code: e.code,
            envelope: Some(Box::new(envelope)),
        }
    }

    /// A terminal error that arrived after commit, for a reply that has not been sent yet
    /// (non-streaming): the answer broke midway, which is a bad gateway, unless the request
    /// itself was at fault (its `max_tokens` cut a tool call): that keeps its 4xx, so an SDK
    /// does not retry it in vain. The drain's cut keeps its 503 and `Retry-After`: the
    /// instance is going away, and the same request succeeds on another.
    pub fn after_commit(e: ErrorEvent) -> Self {
        let status = if e.class.blame() == crate::types::Blame::Client || e.class == ErrorClass::Draining {
            e.status
        } else {
            502
        };
        ErrorReply {
            status,
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

    /// A non-streaming answer the `truncate` policy cut: the whole answer was to be sent at
    /// its end, so nothing of it was, and the partial is not passed off as an answer.
    pub fn truncated_whole(envelope: Envelope) -> Self {
        ErrorReply {
            message: "the route failed mid-answer and the request's mid-stream policy (truncate) \
                      ends it there; a non-streaming request gets no partial answer, so nothing \
                      was sent (the envelope's fell_back_from says which route failed)"
                .into(),
            ..ErrorReply::truncated(envelope)
        }
    }

    /// A non-streaming answer grew past `server.max_answer_bytes` (an upstream that ignores
    /// `max_tokens`); it was cut there and nothing of it is sent.
    pub fn answer_too_large(limit: usize, envelope: Envelope) -> Self {
        ErrorReply {
            code: Some("answer_too_large"),
            envelope: Some(Box::new(envelope)),
            ..ErrorReply::new(
                502,
                ErrorClass::InvalidOutput,
                format!("the upstream's answer exceeds the {limit}-byte limit for a non-streaming answer (server.max_answer_bytes); ask with stream: true or a lower max_tokens"),
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

/// Can the same request succeed if the client waits? Only when the failure was load: a
/// rate limit, a full gateway, an upstream outage. A timeout (the deadline was too short
/// for any route), a request no route fits, or our configuration fault will not go away.
fn waiting_helps(class: ErrorClass) -> bool {
    matches!(
        class,
        ErrorClass::RateLimited | ErrorClass::Overloaded | ErrorClass::Unavailable | ErrorClass::Draining
    )
}

/// Messages are redacted when built; this pass (idempotent, allocating only when it finds
/// something) keeps a message composed elsewhere from being the one that leaks.
fn redact_in_place(text: &mut String) {
    if let std::borrow::Cow::Owned(clean) = redact(text) {
        *text = clean;
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
            code: e.code,
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
    fn unknown_model_is_a_404_with_model_not_found_code() {
        let e = GatewayError::UnknownModel {
            model: "gpt-9".into(),
            known: vec!["chat".into(), "fast".into()],
        };
        let reply = ErrorReply::from_gateway(&e);
        assert_eq!(reply.status, 404, "unknown model is a 404, as OpenAI answers it");
        assert_eq!(reply.code, Some("model_not_found"), "OpenAI's code for it");
        assert!(
            reply.message.contains("chat, fast"),
            "message lists known models: {}",
            reply.message
        );
    }

    fn event(class: ErrorClass, status: u16, retry_after: Option<Duration>) -> ErrorEvent {
        ErrorEvent {
            code: None,
            class,
            status,
            message: "request deadline exceeded before the first token".into(),
            retry_after,
            envelope: Envelope::default(),
        }
    }

    async fn body_json(resp: axum::response::Response) -> serde_json::Value {
        use http_body_util::BodyExt;
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        serde_json::from_slice(&bytes).unwrap_or_default()
    }

    #[tokio::test]
    async fn a_timeout_renders_as_504_without_retry_after_in_every_dialect() {
        // Even if a hint rode along (an upstream 408's Retry-After), a timeout never says wait.
        let timeout = || event(ErrorClass::Timeout, 504, Some(Duration::from_secs(1)));
        let reply = ErrorReply::from_event(timeout());
        assert_eq!(reply.retry_after, None, "no retry hint on a timeout");

        let resp = crate::transport::openai::error_response(&reply, "req_t");
        assert_eq!(resp.status(), 504, "OpenAI status");
        assert!(resp.headers().get("retry-after").is_none(), "OpenAI: no retry-after");
        assert!(
            resp.headers().get("retry-after-ms").is_none(),
            "OpenAI: no retry-after-ms"
        );
        let body = body_json(resp).await;
        assert_eq!(
            (&body["error"]["type"], &body["error"]["code"]),
            (&serde_json::json!("server_error"), &serde_json::json!("timeout")),
            "OpenAI: every 5xx is server_error (§6.1), the code says timeout: {body}"
        );

        let resp = crate::transport::anthropic::error_response(&reply, "req_t");
        assert_eq!(resp.status(), 504, "Anthropic status");
        assert!(resp.headers().get("retry-after").is_none(), "Anthropic: no retry-after");
        let body = body_json(resp).await;
        assert_eq!(
            body["error"]["type"], "timeout_error",
            "Anthropic's 504 type (§6.3): {body}"
        );

        let resp = crate::transport::native_sse::error_response(&reply, "req_t");
        assert_eq!(resp.status(), 504, "native SSE status");
        assert!(
            resp.headers().get("retry-after").is_none(),
            "native SSE: no retry-after"
        );
        let body = body_json(resp).await;
        assert_eq!(
            (&body["type"], &body["class"]),
            (&serde_json::json!("error"), &serde_json::json!("timeout")),
            "native error message: {body}"
        );
        assert!(
            body.get("retry_after_ms").is_none(),
            "native SSE: no retry_after_ms: {body}"
        );

        let ws = crate::transport::native::ServerMessage::from_error_event(Some("r1".into()), timeout());
        let ws: serde_json::Value = serde_json::from_str(&ws.to_json()).unwrap_or_default();
        assert_eq!(ws["class"], "timeout", "WebSocket error class: {ws}");
        assert!(ws.get("retry_after_ms").is_none(), "WebSocket: no retry_after_ms: {ws}");
    }

    #[test]
    fn load_failures_keep_their_retry_hint_and_others_lose_it() {
        let wait = Some(Duration::from_millis(1500));
        for class in [ErrorClass::RateLimited, ErrorClass::Overloaded, ErrorClass::Unavailable] {
            let reply = ErrorReply::from_event(event(class, class.http_status(), wait));
            assert_eq!(reply.retry_after, wait, "{class}: waiting helps");
        }
        for class in [
            ErrorClass::Timeout,
            ErrorClass::NoRoute,
            ErrorClass::ContextLength,
            ErrorClass::BadRequest,
            ErrorClass::Quota,
            ErrorClass::NotFound,
            ErrorClass::Auth,
        ] {
            let reply = ErrorReply::from_event(event(class, class.http_status(), wait));
            assert_eq!(reply.retry_after, None, "{class}: waiting does not help");
        }
    }

    #[tokio::test]
    async fn no_route_is_a_400_invalid_request_in_both_sdk_dialects() {
        // As gateway.rs emits it when the router finds no eligible route.
        let no_route = ErrorReply::from_event(ErrorEvent {
            code: None,
            class: ErrorClass::NoRoute,
            status: 400,
            message: "no route is eligible for this request: eu-a (region)".into(),
            retry_after: None,
            envelope: Envelope::default(),
        });
        let resp = crate::transport::openai::error_response(&no_route, "req_n");
        assert_eq!(resp.status(), 400, "OpenAI status");
        let body = body_json(resp).await;
        assert_eq!(
            (&body["error"]["type"], &body["error"]["code"]),
            (
                &serde_json::json!("invalid_request_error"),
                &serde_json::json!("no_route")
            ),
            "{body}"
        );
        let resp = crate::transport::anthropic::error_response(&no_route, "req_n");
        assert_eq!(resp.status(), 400, "Anthropic status");
        let body = body_json(resp).await;
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        assert_eq!(
            ErrorClass::NoRoute.http_status(),
            400,
            "the class's status agrees with the gateway's"
        );
    }

    #[tokio::test]
    async fn context_length_is_a_400_with_openais_code() {
        let reply = ErrorReply::from_event(ErrorEvent {
            code: None,
            class: ErrorClass::ContextLength,
            status: ErrorClass::ContextLength.http_status(),
            message: "prompt is too long: 210000 tokens > 200000 maximum".into(),
            retry_after: None,
            envelope: Envelope::default(),
        });
        let resp = crate::transport::openai::error_response(&reply, "req_c");
        assert_eq!(resp.status(), 400, "OpenAI status");
        let body = body_json(resp).await;
        assert_eq!(
            (&body["error"]["type"], &body["error"]["code"]),
            (
                &serde_json::json!("invalid_request_error"),
                &serde_json::json!("context_length_exceeded")
            ),
            "{body}"
        );
        let resp = crate::transport::anthropic::error_response(&reply, "req_c");
        assert_eq!(resp.status(), 400, "Anthropic status");
        assert_eq!(body_json(resp).await["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn an_event_reaches_a_client_redacted_with_its_failed_attempts() {
        let mut envelope = Envelope::default();
        envelope.fell_back_from.push(crate::types::FailedAttempt {
            route: "a".into(),
            class: ErrorClass::Auth,
            status: Some(401),
            message: "echo authorization: Bearer sk-proj-0123456789abcdef".into(),
            after_ms: 1,
            after_tokens: 0,
        });
        let reply = ErrorReply::from_event(ErrorEvent {
            code: None,
            class: ErrorClass::Unavailable,
            status: 502,
            message: "a (auth 401: x-api-key: sk-ant-api03-0123456789)".into(),
            retry_after: None,
            envelope,
        });
        assert_eq!(reply.message, "a (auth 401: x-api-key: [redacted])", "the message");
        let failed = &reply.envelope.as_ref().map(|e| e.fell_back_from[0].message.clone());
        assert_eq!(
            failed.as_deref(),
            Some("echo authorization: Bearer [redacted]"),
            "fell_back_from[].message"
        );
    }

    #[test]
    fn an_error_after_commit_is_a_bad_gateway_for_non_streaming_replies() {
        let e = ErrorEvent {
            code: None,
            class: ErrorClass::RateLimited,
            status: 429,
            message: "slow down".into(),
            retry_after: None,
            envelope: Envelope::default(),
        };
        assert_eq!(ErrorReply::after_commit(e).status, 502, "a broken answer is a 502");
        let e = ErrorEvent {
            code: None,
            class: ErrorClass::BadRequest,
            status: 400,
            message: "max_tokens (1) ends the answer inside the call".into(),
            retry_after: None,
            envelope: Envelope::default(),
        };
        assert_eq!(
            ErrorReply::after_commit(e).status,
            400,
            "the request's own fault stays a 400"
        );
        let cut = ErrorReply::after_commit(crate::transport::drain::cut_event(Envelope::default()));
        assert_eq!(cut.status, 503, "a drained answer is a 503 an SDK retries elsewhere");
        assert!(cut.retry_after.is_some(), "with Retry-After");
    }
}
