//! Error classification: every upstream failure becomes a `ProviderError` with a class that
//! decides failover (rate_limited and unavailable move on; bad_request, auth and refusal do not).
//!
//! Three sources are classified here: a non-2xx answer when a stream opens
//! (`classify_status`, reading at most `MAX_ERROR_BODY_BYTES` of the body), a transport
//! failure (`classify_transport`), and an error payload inside a 200 stream
//! (`classify_in_band`, T10). How long to wait comes from `retry_after`.

use std::fmt;
use std::time::Duration;

use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::retry_after::retry_after;

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

/// At most this much of an error response body is read.
pub const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// Provider messages are cut to this many characters.
const MAX_MESSAGE_CHARS: usize = 500;

/// Classifies a non-2xx answer from its status, headers and (bounded) body.
pub fn classify_status(status: u16, headers: &HeaderMap, body: &[u8]) -> ProviderError {
    let body = &body[..body.len().min(MAX_ERROR_BODY_BYTES)];
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let detail = json.as_ref().and_then(error_object);
    let message = json
        .as_ref()
        .and_then(error_message)
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string());
    let message = if message.is_empty() {
        format!("HTTP {status}")
    } else {
        bound(&message)
    };
    let class = match status {
        429 => ErrorClass::RateLimited,
        400 | 422 if mentions_context_length(detail, &message) => ErrorClass::ContextLength,
        413 => ErrorClass::ContextLength,
        401 | 403 => ErrorClass::Auth,
        // 402 is Anthropic's billing_error: an account problem, like a bad key.
        402 => ErrorClass::Auth,
        408 => ErrorClass::Timeout,
        // 409 is OpenAI's lock timeout, which its SDK retries.
        409 | 500..=599 => ErrorClass::Unavailable,
        400..=499 => ErrorClass::BadRequest,
        _ => ErrorClass::Protocol,
    };
    let message = match status {
        404 => format!("model or endpoint not found (check the route's base_url and model): {message}"),
        401 | 403 => format!("upstream rejected our credentials (check the route's api key): {message}"),
        _ if class == ErrorClass::Protocol => format!("unexpected HTTP status {status}: {message}"),
        _ => message,
    };
    let retry_after = match class {
        ErrorClass::RateLimited => retry_after(headers, true),
        ErrorClass::Unavailable | ErrorClass::Timeout => retry_after(headers, false),
        _ => None,
    };
    ProviderError::new(class, message)
        .with_status(status)
        .with_retry_after(retry_after)
}

/// Reads a failed response's body (at most `MAX_ERROR_BODY_BYTES`) and classifies it.
pub async fn classify_response(mut response: reqwest::Response) -> ProviderError {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let mut body = Vec::new();
    // A body that fails half-way is still classified by what arrived.
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = MAX_ERROR_BODY_BYTES - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= MAX_ERROR_BODY_BYTES {
            break;
        }
    }
    classify_status(status, &headers, &body)
}

/// Classifies a failure to reach the upstream or to read its body.
pub fn classify_transport(err: &reqwest::Error) -> ProviderError {
    let mut detail = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        detail = format!("{detail}: {inner}");
        source = inner.source();
    }
    let (class, what) = if err.is_timeout() {
        (ErrorClass::Timeout, "upstream timed out")
    } else if err.is_connect() {
        (ErrorClass::Unavailable, "could not connect to upstream")
    } else if err.is_builder() {
        (ErrorClass::Internal, "could not build the upstream request")
    } else if err.is_body() || err.is_decode() {
        (ErrorClass::Unavailable, "upstream body failed")
    } else {
        (ErrorClass::Unavailable, "upstream connection failed")
    };
    ProviderError::new(class, bound(&format!("{what}: {detail}")))
}

/// Classifies an error payload that arrived inside a 200 stream (T10): OpenAI-style
/// `{"error":{...}}` or Anthropic's `{"type":"error","error":{...}}`.
pub fn classify_in_band(payload: &Value) -> ProviderError {
    let detail = error_object(payload);
    let field = |name: &str| detail.and_then(|d| d.get(name)).and_then(Value::as_str).unwrap_or("");
    let (kind, code) = (field("type"), field("code"));
    let message = error_message(payload).map(|m| bound(&m));
    let message = message.unwrap_or_else(|| "upstream reported an error in the stream".to_string());
    let class = [code, kind]
        .into_iter()
        .find_map(class_of_error_type)
        .unwrap_or(ErrorClass::Unavailable);
    let class = if class == ErrorClass::BadRequest && mentions_context_length(detail, &message) {
        ErrorClass::ContextLength
    } else {
        class
    };
    let label = if kind.is_empty() { code } else { kind };
    let message = if label.is_empty() {
        message
    } else {
        format!("{label}: {message}")
    };
    ProviderError::new(class, message)
}

fn class_of_error_type(kind: &str) -> Option<ErrorClass> {
    Some(match kind {
        "overloaded_error"
        | "server_error"
        | "api_error"
        | "overloaded"
        | "server_is_overloaded"
        | "service_unavailable"
        | "slow_down"
        | "internal_error" => ErrorClass::Unavailable,
        "rate_limit_error" | "rate_limit_exceeded" | "insufficient_quota" | "requests" | "tokens" => {
            ErrorClass::RateLimited
        }
        "context_length_exceeded" | "request_too_large" => ErrorClass::ContextLength,
        "invalid_request_error" | "not_found_error" | "invalid_value" => ErrorClass::BadRequest,
        "authentication_error" | "permission_error" | "invalid_api_key" | "billing_error" => ErrorClass::Auth,
        "timeout_error" | "timeout" => ErrorClass::Timeout,
        _ => return None,
    })
}

/// The `error` object of an OpenAI or Anthropic error body.
fn error_object(body: &Value) -> Option<&Value> {
    body.get("error").filter(|e| e.is_object())
}

fn error_message(body: &Value) -> Option<String> {
    let message = match body.get("error") {
        Some(Value::String(s)) => Some(s.as_str()),
        Some(e) => e.get("message").and_then(Value::as_str),
        None => body.get("message").and_then(Value::as_str),
    };
    message.map(str::trim).filter(|m| !m.is_empty()).map(str::to_string)
}

fn mentions_context_length(detail: Option<&Value>, message: &str) -> bool {
    let code = detail.and_then(|d| d.get("code")).and_then(Value::as_str);
    if code == Some("context_length_exceeded") {
        return true;
    }
    let lower = message.to_ascii_lowercase();
    [
        "maximum context length",
        "context_length_exceeded",
        "prompt is too long",
        "context window",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
}

fn bound(message: &str) -> String {
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}…", &message[..cut]),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::testkit::headers;

    fn status(code: u16, hdrs: &[(&str, &str)], body: &str) -> ProviderError {
        classify_status(code, &headers(hdrs), body.as_bytes())
    }

    #[test]
    fn rate_limit_honours_retry_after_seconds() {
        let e = status(
            429,
            &[("retry-after", "2")],
            r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
        );
        assert_eq!(e.class, ErrorClass::RateLimited);
        assert_eq!(e.status, Some(429));
        assert_eq!(e.message, "Rate limit reached", "message from error.message");
        assert_eq!(e.retry_after, Some(Duration::from_secs(2)));
    }

    #[test]
    fn retry_after_ms_wins_over_retry_after() {
        let e = status(429, &[("retry-after", "2"), ("retry-after-ms", "250")], "");
        assert_eq!(
            e.retry_after,
            Some(Duration::from_millis(250)),
            "retry-after-ms has precedence"
        );
        assert_eq!(e.message, "HTTP 429", "empty body falls back to the status");
    }

    #[test]
    fn server_errors_and_529_are_unavailable() {
        for code in [500, 502, 503, 504, 529] {
            let e = status(
                code,
                &[],
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            );
            assert_eq!(e.class, ErrorClass::Unavailable, "status {code}");
            assert_eq!(e.message, "Overloaded");
        }
    }

    #[test]
    fn bad_request_unless_it_is_about_context_length() {
        let plain = status(
            400,
            &[],
            r#"{"error":{"message":"Invalid value for 'temperature'","type":"invalid_request_error","code":"invalid_value"}}"#,
        );
        assert_eq!(plain.class, ErrorClass::BadRequest);
        let code = status(
            400,
            &[],
            r#"{"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
        );
        assert_eq!(code.class, ErrorClass::ContextLength, "by code");
        let openai = status(
            400,
            &[],
            r#"{"error":{"message":"This model's maximum context length is 128000 tokens."}}"#,
        );
        assert_eq!(openai.class, ErrorClass::ContextLength, "by OpenAI message");
        let anthropic = status(
            400,
            &[],
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
        );
        assert_eq!(anthropic.class, ErrorClass::ContextLength, "by Anthropic message");
        assert_eq!(
            status(413, &[], "<html>Request Entity Too Large</html>").class,
            ErrorClass::ContextLength
        );
    }

    #[test]
    fn auth_not_found_and_timeout_statuses() {
        let e = status(
            401,
            &[],
            r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
        );
        assert_eq!(e.class, ErrorClass::Auth);
        assert!(e.message.contains("invalid x-api-key"), "{}", e.message);
        assert_eq!(status(403, &[], "").class, ErrorClass::Auth);
        let nf = status(404, &[], r#"{"error":{"message":"The model `gpt-9` does not exist"}}"#);
        assert_eq!(
            nf.class,
            ErrorClass::BadRequest,
            "model not found is configuration, not an outage"
        );
        assert!(
            nf.message.contains("not found") && nf.message.contains("gpt-9"),
            "{}",
            nf.message
        );
        assert_eq!(status(408, &[], "").class, ErrorClass::Timeout);
        assert_eq!(status(302, &[], "").class, ErrorClass::Protocol);
    }

    #[test]
    fn long_messages_and_bodies_are_bounded() {
        let body = format!(r#"{{"error":{{"message":"{}"}}}}"#, "é".repeat(2000));
        let e = status(500, &[], &body);
        assert_eq!(
            e.message.chars().count(),
            MAX_MESSAGE_CHARS + 1,
            "500 chars plus an ellipsis"
        );
        let huge = "x".repeat(MAX_ERROR_BODY_BYTES * 2);
        assert!(status(500, &[], &huge).message.chars().count() <= MAX_MESSAGE_CHARS + 1);
    }

    #[test]
    fn in_band_errors_classify_by_type_and_code() {
        let cases = [
            (
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                ErrorClass::Unavailable,
            ),
            (
                r#"{"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}"#,
                ErrorClass::Unavailable,
            ),
            (
                r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
                ErrorClass::RateLimited,
            ),
            (
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#,
                ErrorClass::BadRequest,
            ),
            (
                r#"{"error":{"message":"x","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
                ErrorClass::ContextLength,
            ),
            (
                r#"{"type":"error","error":{"type":"authentication_error","message":"no"}}"#,
                ErrorClass::Auth,
            ),
            (r#"{"error":{"message":"??"}}"#, ErrorClass::Unavailable),
            (r#"{"error":"plain string"}"#, ErrorClass::Unavailable),
        ];
        for (payload, class) in cases {
            let value: Value = serde_json::from_str(payload).unwrap_or_default();
            let e = classify_in_band(&value);
            assert_eq!(e.class, class, "payload {payload}");
            assert_eq!(e.status, None, "in-band errors have no HTTP status");
        }
        let value: Value = serde_json::from_str(cases[0].0).unwrap_or_default();
        assert_eq!(classify_in_band(&value).message, "overloaded_error: Overloaded");
    }

    #[tokio::test]
    async fn transport_connect_failure_is_unavailable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        drop(listener);
        let err = crate::provider::http_client()
            .get(format!("http://{addr}/"))
            .send()
            .await
            .expect_err("nothing listens on a dropped port");
        let e = classify_transport(&err);
        assert_eq!(e.class, ErrorClass::Unavailable, "{e}");
        assert!(e.message.starts_with("could not connect"), "{}", e.message);
    }
}
