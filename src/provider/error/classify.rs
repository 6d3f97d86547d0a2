//! Reading upstream failures into `ProviderError`s: a non-2xx answer when a stream opens
//! (`classify_status`, reading at most `MAX_ERROR_BODY_BYTES` of the body), a transport
//! failure (`classify_transport`), and an error payload inside a 200 stream
//! (`classify_in_band`, T10). How long to wait comes from `retry_after`.
//!
//! The status decides first; the body refines it where providers overload one status:
//! a 429 (or 400/403) that is about billing is `Quota`, not a transient rate limit (§6.1
//! `insufficient_quota`, §6.3 "credit balance is too low"); a 400 about the prompt's size
//! is `ContextLength`. A 404 is `NotFound`: the route's model or URL is wrong.
//!
//! Upstream text is never relayed as is: a message is tailcut's own words for the class
//! ("upstream answered 401: authentication failed (…)") followed by at most
//! `MAX_EXCERPT_CHARS` of what the upstream said, redacted before it is cut.

use http::HeaderMap;
use http_body_util::BodyExt;
use serde_json::Value;

use super::redact::redact;
use super::{ErrorClass, ProviderError};
use crate::provider::retry_after::retry_after;

/// At most this much of an error response body is read.
pub const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// What an upstream said is quoted, redacted, in at most this many characters.
pub const MAX_EXCERPT_CHARS: usize = 200;

/// A transport failure's detail (our client's words, naming the URL) is cut to this many.
const MAX_DETAIL_CHARS: usize = 500;

/// `error.type` / `error.code` values that mean the account is out of credit or quota.
const QUOTA_CODES: [&str; 4] = [
    "insufficient_quota",
    "billing_error",
    "billing_not_active",
    "billing_hard_limit_reached",
];

/// Message phrases that mean the same, for bodies whose type is generic (Anthropic sends
/// its credit-balance 400 as `invalid_request_error`).
const QUOTA_PHRASES: [&str; 4] = [
    "credit balance is too low",
    "exceeded your current quota",
    "plan and billing details",
    "billing hard limit",
];

/// Message phrases of a prompt that does not fit the model's window.
const CONTEXT_PHRASES: [&str; 6] = [
    "maximum context length",
    "context_length_exceeded",
    "prompt is too long",
    "context window",
    "exceed context limit",
    "model_context_window_exceeded",
];

/// Classifies a non-2xx answer from its status, headers and (bounded) body.
pub fn classify_status(status: u16, headers: &HeaderMap, body: &[u8]) -> ProviderError {
    let body = &body[..body.len().min(MAX_ERROR_BODY_BYTES)];
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let said = json
        .as_ref()
        .and_then(error_message)
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let signals = Signals::of(json.as_ref(), &said);
    let class = match status {
        402 => ErrorClass::Quota,
        400 | 403 | 429 if signals.quota() => ErrorClass::Quota,
        429 => ErrorClass::RateLimited,
        400 | 422 if signals.context_length() => ErrorClass::ContextLength,
        413 => ErrorClass::ContextLength,
        401 | 403 => ErrorClass::Auth,
        404 => ErrorClass::NotFound,
        // Only an egress proxy asks for its credentials (a plain-http upstream through it):
        // the deployment's trouble, not the client's request.
        407 => ErrorClass::Unavailable,
        408 => ErrorClass::Timeout,
        // 409 is OpenAI's lock timeout, which its SDK retries; 529 is Anthropic's overload.
        409 | 500..=599 => ErrorClass::Unavailable,
        400..=499 => ErrorClass::BadRequest,
        _ => ErrorClass::Protocol,
    };
    let message = quoting(format!("upstream answered {status}: {}", summary(class)), &said);
    // A quota's Retry-After (if any) is the rate window's, not when credit comes back:
    // how long to cool the route is the health module's call.
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
pub async fn classify_response<B>(response: http::Response<B>) -> ProviderError
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    let (head, mut body) = response.into_parts();
    let mut read = Vec::new();
    // A body that fails half-way is still classified by what arrived.
    while read.len() < MAX_ERROR_BODY_BYTES {
        let Some(Ok(frame)) = body.frame().await else {
            break;
        };
        if let Some(chunk) = frame.data_ref() {
            let room = MAX_ERROR_BODY_BYTES - read.len();
            read.extend_from_slice(&chunk[..chunk.len().min(room)]);
        }
    }
    classify_status(head.status.as_u16(), &head.headers, &read)
}

/// Classifies a failure to reach the upstream or to send it the request (the error of
/// hyper-util's client, whatever its source: the connector's, hyper's, the socket's).
pub fn classify_transport(err: &(dyn std::error::Error + 'static)) -> ProviderError {
    let (class, what) = if timed_out(err) {
        (ErrorClass::Timeout, "upstream timed out")
    } else if let Some(what) = proxy_failure(err) {
        (ErrorClass::Unavailable, what)
    } else if is_connect(err) && is_tls(err) {
        (ErrorClass::Unavailable, "could not connect to upstream (TLS)")
    } else if is_connect(err) {
        (ErrorClass::Unavailable, "could not connect to upstream")
    } else {
        (ErrorClass::Unavailable, "upstream connection failed")
    };
    transport_error(class, what, err)
}

/// Classifies a failure while reading an answered upstream's body.
pub fn classify_body(err: &(dyn std::error::Error + 'static)) -> ProviderError {
    if timed_out(err) {
        return transport_error(ErrorClass::Timeout, "upstream timed out", err);
    }
    transport_error(ErrorClass::Unavailable, "upstream body failed", err)
}

fn transport_error(class: ErrorClass, what: &str, err: &(dyn std::error::Error + 'static)) -> ProviderError {
    let mut detail = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        detail = format!("{detail}: {inner}");
        source = inner.source();
    }
    // A detail could quote what the upstream sent; redacted like any upstream text.
    let mut error = ProviderError::new(class, bound(&redact(&format!("{what}: {detail}")), MAX_DETAIL_CHARS));
    error.transport = true;
    error
}

/// Every error in `err`'s chain, `err` first, looking inside `io::Error`s too (whose
/// `source` skips the error they wrap).
fn chain<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(err), |e| {
        e.downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|inner| inner as &(dyn std::error::Error + 'static))
            .or_else(|| e.source())
    })
}

fn timed_out(err: &(dyn std::error::Error + 'static)) -> bool {
    chain(err).any(|e| {
        e.is::<crate::provider::client::ConnectTimedOut>()
            || e.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_timeout)
            || e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
    })
}

fn is_connect(err: &(dyn std::error::Error + 'static)) -> bool {
    chain(err).any(|e| {
        e.is::<crate::provider::ConnectFailed>()
            || e.downcast_ref::<hyper_util::client::legacy::Error>()
                .is_some_and(hyper_util::client::legacy::Error::is_connect)
    })
}

/// What went wrong at the egress proxy, if the connect failed there: like any failed connect
/// it is `Unavailable` (the mux fails over), and the message says it was the proxy. The proxy
/// is named by host and port only (`ProxyFailed` never holds its credentials).
fn proxy_failure(err: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    use crate::provider::client::ProxyFailed;
    chain(err)
        .find_map(|e| e.downcast_ref::<ProxyFailed>())
        .map(|failed| match failed {
            ProxyFailed::Refused { .. } => "could not connect to upstream (the proxy refused)",
            ProxyFailed::Unreachable { .. } => "could not connect to upstream (the proxy could not be reached)",
            ProxyFailed::Unsupported { .. } => "could not connect to upstream (unsupported proxy)",
        })
}

fn is_tls(err: &(dyn std::error::Error + 'static)) -> bool {
    chain(err).any(|e| e.is::<rustls::Error>())
}

/// Classifies an error payload that arrived inside a 200 stream (T10): OpenAI-style
/// `{"error":{...}}` or Anthropic's `{"type":"error","error":{...}}`.
pub fn classify_in_band(payload: &Value) -> ProviderError {
    let raw = error_message(payload);
    let signals = Signals::of(Some(payload), raw.as_deref().unwrap_or(""));
    let (kind, code) = (signals.kind, signals.code);
    let typed = [code, kind].into_iter().find_map(class_of_error_type);
    let class = match typed {
        // A generic type (or none) says less than a billing message does.
        None | Some(ErrorClass::RateLimited | ErrorClass::BadRequest | ErrorClass::Auth) if signals.quota() => {
            ErrorClass::Quota
        }
        None | Some(ErrorClass::BadRequest) if signals.context_length() => ErrorClass::ContextLength,
        // Unknown in-band errors are the upstream's trouble: fail over.
        Some(class) => class,
        None => ErrorClass::Unavailable,
    };
    let label = [kind, code].into_iter().find(|l| is_type_name(l));
    let own = match label {
        Some(label) => format!("upstream reported an error in the stream ({label}): {}", summary(class)),
        None => format!("upstream reported an error in the stream: {}", summary(class)),
    };
    ProviderError::new(class, quoting(own, raw.as_deref().unwrap_or("")))
}

/// tailcut's own words for an upstream failure of `class`.
fn summary(class: ErrorClass) -> &'static str {
    match class {
        ErrorClass::RateLimited => "rate limited",
        ErrorClass::Unavailable | ErrorClass::Overloaded => "unavailable",
        ErrorClass::Timeout => "timed out",
        ErrorClass::Protocol => "an unexpected status",
        ErrorClass::BadRequest => "the request was rejected",
        ErrorClass::Auth => "authentication failed (check the route's api key)",
        ErrorClass::Refusal => "the model refused",
        ErrorClass::InvalidOutput => "the answer was invalid",
        ErrorClass::ContextLength => "the prompt does not fit the model's context window",
        ErrorClass::Quota => "the account is out of credit or quota (check its plan and billing)",
        ErrorClass::NotFound => "model or endpoint not found (check the route's base_url and model)",
        // Never an upstream's answer; named for completeness.
        ErrorClass::NoRoute
        | ErrorClass::Internal
        | ErrorClass::Unauthenticated
        | ErrorClass::Forbidden
        | ErrorClass::Draining
        | ErrorClass::ClientTooSlow => "failed",
    }
}

/// An upstream's `error.type` / `code` is named in our message only when it looks like
/// one (a short snake_case word), never as free text.
fn is_type_name(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 48
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// `own`, followed by an excerpt of what the upstream said when it said anything.
fn quoting(own: String, said: &str) -> String {
    let excerpt = excerpt(said);
    if excerpt.is_empty() {
        own
    } else {
        format!("{own}; upstream said: \"{excerpt}\"")
    }
}

/// Upstream text as it may be shown: one line, redacted, then cut to `MAX_EXCERPT_CHARS`
/// (redacted first, so a cut never leaves part of a secret unrecognised; and again after
/// the control characters become spaces, which can complete a `Bearer <token>`).
fn excerpt(said: &str) -> String {
    let one_line: String = redact(said)
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    bound(&redact(&one_line), MAX_EXCERPT_CHARS)
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
        "rate_limit_error" | "rate_limit_exceeded" | "requests" | "tokens" => ErrorClass::RateLimited,
        _ if QUOTA_CODES.contains(&kind) => ErrorClass::Quota,
        "context_length_exceeded" | "request_too_large" => ErrorClass::ContextLength,
        "not_found_error" | "model_not_found" => ErrorClass::NotFound,
        "invalid_request_error" | "invalid_value" => ErrorClass::BadRequest,
        "authentication_error" | "permission_error" | "invalid_api_key" => ErrorClass::Auth,
        "timeout_error" | "timeout" => ErrorClass::Timeout,
        _ => return None,
    })
}

/// What an error body says beyond its status: its `type`, `code` and message.
struct Signals<'a> {
    kind: &'a str,
    code: &'a str,
    /// Anthropic's spend-limit 429 carries `error.details.error_code` (observed, §6.3).
    detail_code: &'a str,
    lower: String,
}

impl<'a> Signals<'a> {
    fn of(body: Option<&'a Value>, message: &str) -> Self {
        let detail = body.and_then(error_object);
        let field = |name: &str| detail.and_then(|d| d.get(name)).and_then(Value::as_str).unwrap_or("");
        let detail_code = detail
            .and_then(|d| d.get("details"))
            .and_then(|d| d.get("error_code"))
            .and_then(Value::as_str)
            .unwrap_or("");
        Signals {
            kind: field("type"),
            code: field("code"),
            detail_code,
            lower: message.to_ascii_lowercase(),
        }
    }

    fn quota(&self) -> bool {
        QUOTA_CODES.contains(&self.kind)
            || QUOTA_CODES.contains(&self.code)
            || self.detail_code == "enforced_spend_limit_reached"
            || QUOTA_PHRASES.iter().any(|p| self.lower.contains(p))
    }

    fn context_length(&self) -> bool {
        self.code == "context_length_exceeded" || CONTEXT_PHRASES.iter().any(|p| self.lower.contains(p))
    }
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

fn bound(message: &str, max_chars: usize) -> String {
    match message.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &message[..cut]),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::provider::testkit::headers;

    fn status(code: u16, hdrs: &[(&str, &str)], body: &str) -> ProviderError {
        classify_status(code, &headers(hdrs), body.as_bytes())
    }

    fn in_band(payload: &str) -> ProviderError {
        let value: Value = serde_json::from_str(payload).unwrap_or_default();
        classify_in_band(&value)
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
        assert_eq!(
            e.message, "upstream answered 429: rate limited; upstream said: \"Rate limit reached\"",
            "our words, then an excerpt of error.message"
        );
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
        assert_eq!(
            e.message, "upstream answered 429: rate limited",
            "an empty body adds no excerpt"
        );
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
            assert_eq!(
                e.message,
                format!("upstream answered {code}: unavailable; upstream said: \"Overloaded\"")
            );
        }
        assert_eq!(
            status(409, &[], "").class,
            ErrorClass::Unavailable,
            "OpenAI's lock timeout, retried by its SDK"
        );
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
        let budget = status(
            400,
            &[],
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000"}}"#,
        );
        assert_eq!(
            budget.class,
            ErrorClass::ContextLength,
            "Anthropic's input + max_tokens"
        );
        let vllm = status(
            400,
            &[],
            r#"{"object":"error","message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","code":400}"#,
        );
        assert_eq!(vllm.class, ErrorClass::ContextLength, "vLLM's top-level message");
        assert_eq!(
            status(413, &[], "<html>Request Entity Too Large</html>").class,
            ErrorClass::ContextLength
        );
    }

    #[test]
    fn auth_and_timeout_statuses() {
        let e = status(
            401,
            &[],
            r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
        );
        assert_eq!(e.class, ErrorClass::Auth);
        assert!(e.message.contains("invalid x-api-key"), "{}", e.message);
        assert_eq!(status(403, &[], "").class, ErrorClass::Auth);
        assert_eq!(status(408, &[], "").class, ErrorClass::Timeout);
        assert_eq!(status(302, &[], "").class, ErrorClass::Protocol);
    }

    #[test]
    fn a_404_is_not_found_and_fails_over() {
        let openai = status(
            404,
            &[],
            r#"{"error":{"message":"The model `gpt-9` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#,
        );
        assert_eq!(
            openai.class,
            ErrorClass::NotFound,
            "a wrong model id is our configuration"
        );
        assert!(openai.is_retryable(), "another route may have the model");
        assert!(
            openai.message.contains("base_url and model") && openai.message.contains("gpt-9"),
            "{}",
            openai.message
        );
        let anthropic = status(
            404,
            &[],
            r#"{"type":"error","error":{"type":"not_found_error","message":"Not found"},"request_id":"req_1"}"#,
        );
        assert_eq!(anthropic.class, ErrorClass::NotFound);
        assert_eq!(
            status(404, &[], "404 page not found").class,
            ErrorClass::NotFound,
            "a wrong base_url answers in plain text"
        );
    }

    #[test]
    fn insufficient_quota_is_quota_not_a_rate_limit() {
        let openai = status(
            429,
            &[("retry-after", "20")],
            r#"{"error": {"message": "You exceeded your current quota, please check your plan and billing details.", "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}"#,
        );
        assert_eq!(openai.class, ErrorClass::Quota, "§6.1: billing, not transient");
        assert_eq!(openai.retry_after, None, "a rate window says nothing about credit");
        assert!(openai.message.contains("out of credit or quota"), "{}", openai.message);
        let by_message = status(
            429,
            &[],
            r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details."}}"#,
        );
        assert_eq!(by_message.class, ErrorClass::Quota, "by message alone");
        let credit = status(
            400,
            &[],
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."},"request_id":"req_011CZuM2Vx9EjMXN9LJn5ryb"}"#,
        );
        assert_eq!(credit.class, ErrorClass::Quota, "§6.3 credit balance on a 400");
        let billing = status(
            403,
            &[],
            r#"{"type":"error","error":{"type":"billing_error","message":"billing issue"}}"#,
        );
        assert_eq!(billing.class, ErrorClass::Quota, "billing_error on a 403");
        assert_eq!(status(402, &[], "").class, ErrorClass::Quota, "402 Payment Required");
        let spend = status(
            429,
            &[],
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"spend limit","details":{"error_code":"enforced_spend_limit_reached"}}}"#,
        );
        assert_eq!(spend.class, ErrorClass::Quota, "Anthropic's spend limit");
        let tpm = status(
            429,
            &[],
            r#"{"error": {"message": "Request too large for gpt-4o in organization org-V on tokens per min (TPM): Limit 30000, Requested 30601.", "type": "tokens", "param": null, "code": "rate_limit_exceeded"}}"#,
        );
        assert_eq!(tpm.class, ErrorClass::RateLimited, "a TPM limit is still a rate limit");
    }

    #[test]
    fn long_messages_and_bodies_are_bounded() {
        let body = format!(r#"{{"error":{{"message":"{}"}}}}"#, "é".repeat(2000));
        let e = status(500, &[], &body);
        let quoted = format!("\"{}…\"", "é".repeat(MAX_EXCERPT_CHARS));
        assert!(
            e.message.ends_with(&format!("upstream said: {quoted}")),
            "{MAX_EXCERPT_CHARS} chars plus an ellipsis: {}",
            e.message
        );
        let huge = "x".repeat(MAX_ERROR_BODY_BYTES * 2);
        let own = "upstream answered 500: unavailable; upstream said: \"\""
            .chars()
            .count();
        assert!(status(500, &[], &huge).message.chars().count() <= own + MAX_EXCERPT_CHARS + 1);
    }

    #[test]
    fn upstream_text_is_quoted_on_one_line_after_our_own_words() {
        let e = status(401, &[], "<html>\n<body>401\tUnauthorized\r\n</body>\n</html>");
        assert_eq!(
            e.message,
            "upstream answered 401: authentication failed (check the route's api key); upstream said: \"<html> <body>401 Unauthorized </body> </html>\""
        );
        let typed = in_band(r#"{"error":{"message":"m","type":"Bearer abc DEF","code":"server_error"}}"#);
        assert_eq!(
            typed.message, "upstream reported an error in the stream (server_error): unavailable; upstream said: \"m\"",
            "a type that is not a snake_case name is never quoted"
        );
    }

    #[test]
    fn echoed_credentials_never_reach_the_message() {
        let body = r#"{"error":{"message":"bad request headers: {\"authorization\": \"Bearer sk-proj-Abc123def456ghi789\", \"x-api-key\": \"sk-ant-api03-zzzzzzzzzzzz\"}"}}"#;
        let e = status(400, &[], body);
        assert!(
            !e.message.contains("sk-proj") && !e.message.contains("sk-ant"),
            "{}",
            e.message
        );
        assert!(e.message.contains("Bearer [redacted]"), "{}", e.message);
        let plain = status(
            502,
            &[],
            "upstream saw Authorization: Bearer abcDEF123456789 and gave up",
        );
        assert!(
            plain
                .message
                .ends_with("upstream said: \"upstream saw Authorization: Bearer [redacted] and gave up\""),
            "{}",
            plain.message
        );
        let cut = format!("{}Bearer sk-proj-{}", "x ".repeat(98), "k".repeat(40));
        assert!(
            !status(500, &[], &cut).message.contains("sk-proj-k"),
            "redacted before the cut"
        );
        let stream = in_band(
            r#"{"error":{"message":"x-api-key: sk-ant-api03-secretsecret is invalid","type":"authentication_error"}}"#,
        );
        assert_eq!(
            stream.message,
            "upstream reported an error in the stream (authentication_error): authentication failed (check the route's api key); upstream said: \"x-api-key: [redacted] is invalid\""
        );
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
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
                ErrorClass::ContextLength,
            ),
            (
                r#"{"type":"error","error":{"type":"authentication_error","message":"no"}}"#,
                ErrorClass::Auth,
            ),
            (
                r#"{"error":{"message":"quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
                ErrorClass::Quota,
            ),
            (
                r#"{"type":"error","error":{"type":"billing_error","message":"pay up"}}"#,
                ErrorClass::Quota,
            ),
            (
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}"#,
                ErrorClass::Quota,
            ),
            (
                r#"{"type":"error","error":{"type":"not_found_error","message":"Not found"}}"#,
                ErrorClass::NotFound,
            ),
            (
                r#"{"type":"error","error":{"type":"timeout_error","message":"late"}}"#,
                ErrorClass::Timeout,
            ),
            (r#"{"error":{"message":"??"}}"#, ErrorClass::Unavailable),
            (r#"{"error":"plain string"}"#, ErrorClass::Unavailable),
        ];
        for (payload, class) in cases {
            let e = in_band(payload);
            assert_eq!(e.class, class, "payload {payload}");
            assert_eq!(e.status, None, "in-band errors have no HTTP status");
        }
        assert_eq!(
            in_band(cases[0].0).message,
            "upstream reported an error in the stream (overloaded_error): unavailable; upstream said: \"Overloaded\""
        );
    }

    #[test]
    fn a_proxy_asking_for_credentials_is_unavailable_not_the_clients_error() {
        let e = classify_status(407, &HeaderMap::new(), b"");
        assert_eq!(e.class, ErrorClass::Unavailable, "{e}");
        assert_eq!(e.status, Some(407));
    }

    #[tokio::test]
    async fn transport_connect_failure_is_unavailable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        drop(listener);
        let mut request = http::Request::new(http_body_util::Full::new(bytes::Bytes::new()));
        *request.uri_mut() = format!("http://{addr}/v1/models?key=AIzaSyA-secret-value")
            .parse()
            .expect("uri");
        let err = crate::provider::http_client()
            .request(request)
            .await
            .expect_err("nothing listens on a dropped port");
        let e = classify_transport(&*err);
        assert_eq!(e.class, ErrorClass::Unavailable, "{e}");
        assert!(e.message.starts_with("could not connect"), "{}", e.message);
        assert!(
            !e.message.contains("AIzaSyA"),
            "a key in the URL is redacted: {}",
            e.message
        );
    }

    #[tokio::test]
    async fn a_connection_closed_before_the_answer_is_a_connection_failure() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        tokio::spawn(async move {
            if let Ok((mut socket, _)) = listener.accept().await {
                let mut request = [0u8; 1024];
                let _ = socket.read(&mut request).await;
            }
        });
        let mut request = http::Request::new(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = format!("http://{addr}/v1/chat/completions").parse().expect("uri");
        let err = crate::provider::http_client()
            .request(request)
            .await
            .expect_err("the upstream hung up");
        let e = classify_transport(&*err);
        assert_eq!(e.class, ErrorClass::Unavailable, "{e}");
        assert!(e.message.starts_with("upstream connection failed"), "{}", e.message);
    }
}
