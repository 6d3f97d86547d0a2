//! The edge's own refusals (400 for a bad Host, 404, 405, 408, 413, 431) as JSON in the caller's dialect, chosen by
//! path: the Anthropic shape under `/v1/messages`, the native one under `/v1/stream`, the
//! OpenAI shape everywhere else. Each carries `x-request-id`.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;

use crate::transport::error::ErrorReply;
use crate::transport::{anthropic, native_sse, openai};
use crate::types::{Dialect, ErrorClass, RequestCtx};

/// Why the edge refused a request before any handler answered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeRefusal {
    NotFound,
    MethodNotAllowed,
    /// The body did not arrive within `body_read_timeout_ms`.
    BodyTimeout,
    /// The body is (or says it is) over `max_body_bytes`.
    TooLarge {
        limit: usize,
    },
    /// The client broke off or mangled its body.
    BodyUnreadable,
    /// The request's header fields are over `max_header_bytes` (`head_limit`).
    HeadersTooLarge {
        limit: usize,
    },
    /// An HTTP/1.1 request with no Host header, or a request with more than one (`host`).
    BadHost {
        count: usize,
    },
}

impl EdgeRefusal {
    fn reply(self) -> ErrorReply {
        let (status, class, code, message) = match self {
            EdgeRefusal::NotFound => (
                404,
                ErrorClass::BadRequest,
                "not_found",
                "no such endpoint; see the README for tailcut's routes".to_string(),
            ),
            EdgeRefusal::MethodNotAllowed => (
                405,
                ErrorClass::BadRequest,
                "method_not_allowed",
                "this endpoint does not take that method (see the allow header)".to_string(),
            ),
            EdgeRefusal::BodyTimeout => (
                408,
                ErrorClass::Timeout,
                "request_timeout",
                "the request body did not arrive in time (server.body_read_timeout_ms)".to_string(),
            ),
            EdgeRefusal::TooLarge { limit } => (
                413,
                ErrorClass::BadRequest,
                "request_too_large",
                format!("request body exceeds the {limit}-byte limit (server.max_body_bytes)"),
            ),
            EdgeRefusal::BodyUnreadable => (
                400,
                ErrorClass::BadRequest,
                "body_unreadable",
                "the request body could not be read".to_string(),
            ),
            EdgeRefusal::HeadersTooLarge { limit } => (
                431,
                ErrorClass::BadRequest,
                "headers_too_large",
                format!("request headers exceed the {limit}-byte limit (server.max_header_bytes)"),
            ),
            EdgeRefusal::BadHost { count } => (
                400,
                ErrorClass::BadRequest,
                "bad_host",
                format!("a request must carry exactly one Host header (RFC 9112 section 3.2); this one has {count}"),
            ),
        };
        ErrorReply {
            status,
            class,
            code: Some(code),
            ..ErrorReply::bad_request(message)
        }
    }

    /// After these the rest of the body is unread or unwanted: the connection is not reused.
    fn closes_connection(self) -> bool {
        matches!(
            self,
            EdgeRefusal::BodyTimeout
                | EdgeRefusal::TooLarge { .. }
                | EdgeRefusal::BodyUnreadable
                | EdgeRefusal::HeadersTooLarge { .. }
                | EdgeRefusal::BadHost { .. }
        )
    }
}

/// The dialect a path speaks.
pub fn dialect_of(path: &str) -> Dialect {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    if under("/v1/messages") {
        Dialect::Anthropic
    } else if under("/v1/stream") || under("/v1/streams") || under("/v1/ws") {
        Dialect::Native
    } else {
        Dialect::OpenAi
    }
}

/// The request id the answer will carry: the client's `x-request-id` when it sent a usable
/// one (the rule `RequestCtx::from_headers` applies), else a fresh one.
pub fn request_id(headers: &HeaderMap, dialect: Dialect) -> String {
    client_request_id(headers).map_or_else(|| RequestCtx::new(dialect).request_id, str::to_string)
}

/// The client's `x-request-id`, when it sent a usable one.
pub fn client_request_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .and_then(crate::types::usable_request_id)
}

/// `refusal` as JSON in `dialect`, with `x-request-id` (and `connection: close` where the
/// connection cannot be reused).
pub fn render(refusal: EdgeRefusal, dialect: Dialect, request_id: &str) -> Response {
    let reply = refusal.reply();
    let mut response = match dialect {
        Dialect::Anthropic => anthropic::error_response(&reply, request_id),
        Dialect::Native => native_sse::error_response(&reply, request_id),
        Dialect::OpenAi => openai::error_response(&reply, request_id),
    };
    if refusal.closes_connection() {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    // Keep the status exact even if a dialect maps it differently.
    *response.status_mut() = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::BAD_REQUEST);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_pick_their_dialect() {
        assert_eq!(dialect_of("/v1/messages"), Dialect::Anthropic, "messages");
        assert_eq!(
            dialect_of("/v1/messages/count_tokens"),
            Dialect::Anthropic,
            "under messages"
        );
        assert_eq!(dialect_of("/v1/messagesx"), Dialect::OpenAi, "a prefix is not a path");
        assert_eq!(dialect_of("/v1/stream"), Dialect::Native, "native SSE");
        assert_eq!(
            dialect_of("/v1/streams/abc/events"),
            Dialect::Native,
            "resumable streams"
        );
        assert_eq!(dialect_of("/nope"), Dialect::OpenAi, "OpenAI by default");
    }

    async fn body_of(refusal: EdgeRefusal, dialect: Dialect) -> serde_json::Value {
        use http_body_util::BodyExt;
        let resp = render(refusal, dialect, "req_t");
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        serde_json::from_slice(&bytes).expect("a JSON body")
    }

    #[tokio::test]
    async fn each_refusal_has_its_dialects_own_error_type() {
        let too_large = EdgeRefusal::TooLarge { limit: 10 };
        assert_eq!(
            body_of(too_large, Dialect::Anthropic).await["error"]["type"],
            "request_too_large",
            "Anthropic's type for a 413"
        );
        assert_eq!(
            body_of(EdgeRefusal::BodyTimeout, Dialect::OpenAi).await["error"]["type"],
            "invalid_request_error",
            "a slow client is not a server error"
        );
        assert_eq!(
            body_of(EdgeRefusal::BodyTimeout, Dialect::Anthropic).await["error"]["type"],
            "timeout_error"
        );
    }
}
