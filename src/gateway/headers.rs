//! Reading a request's `x-request-id` and `x-tailcut-*` headers into its `RequestCtx`.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};

use super::GatewayError;
use crate::types::{Dialect, Priority, RequestCtx, ResponseType};

/// The `x-tailcut-*` headers a request is steered by, in the order their values are checked.
pub(crate) const CONTROL_HEADERS: [&str; 8] = [
    "x-tailcut-hedge",
    "x-tailcut-response-type",
    "x-tailcut-deadline-ms",
    "x-tailcut-priority",
    "x-tailcut-session",
    "x-tailcut-region",
    "x-tailcut-tenant",
    "x-tailcut-task",
];
const HEDGE: usize = 0;
const RESPONSE_TYPE: usize = 1;
const DEADLINE_MS: usize = 2;
const PRIORITY: usize = 3;
const SESSION: usize = 4;
const REGION: usize = 5;
const TENANT: usize = 6;
const TASK: usize = 7;

/// The request headers `RequestCtx` is built from, found in one pass over the request's
/// headers: a lookup per name parsed and hashed each of nine names, per request.
#[derive(Default)]
struct CtxHeaders<'h> {
    request_id: Option<&'h HeaderValue>,
    /// Each control header's first value, and whether a second one came.
    control: [Option<&'h HeaderValue>; 8],
    repeated: [bool; 8],
}

impl<'h> CtxHeaders<'h> {
    fn read(headers: &'h HeaderMap) -> Self {
        let mut found = CtxHeaders::default();
        for (name, value) in headers {
            let name = name.as_str();
            if name == "x-request-id" {
                found.request_id.get_or_insert(value);
            } else if name.starts_with("x-tailcut-") {
                if let Some(at) = CONTROL_HEADERS.iter().position(|known| *known == name) {
                    match found.control[at] {
                        Some(_) => found.repeated[at] = true,
                        None => found.control[at] = Some(value),
                    }
                }
            }
        }
        found
    }

    /// A header's first value as trimmed text; a value that is not visible ASCII reads as absent.
    fn get(&self, at: usize) -> Option<&'h str> {
        self.control[at].and_then(|v| v.to_str().ok()).map(str::trim)
    }
}

impl RequestCtx {
    /// Reads the `x-tailcut-*` request headers. Invalid values are a client error.
    pub fn from_headers(headers: &HeaderMap, dialect: Dialect) -> Result<Self, GatewayError> {
        let mut ctx = RequestCtx::new(dialect);
        let found = CtxHeaders::read(headers);
        // A control header sent twice is ambiguous (which tenant, which deadline?): refused,
        // so a second value can never slip past a check made on the first.
        if let Some(at) = found.repeated.iter().position(|repeated| *repeated) {
            let name = CONTROL_HEADERS[at];
            return Err(GatewayError::bad_header(name, format!("{name} may be sent only once")));
        }
        let get = |at: usize| found.get(at);
        let request_id = found.request_id.and_then(|v| v.to_str().ok());
        if let Some(id) = request_id.and_then(crate::types::usable_request_id) {
            ctx.request_id = id.to_string();
        }
        if let Some(v) = get(HEDGE) {
            ctx.hedge_off = match v.to_ascii_lowercase().as_str() {
                "on" | "true" | "1" | "yes" => false,
                "off" | "false" | "0" | "no" => true,
                _ => {
                    return Err(GatewayError::bad_header(
                        "x-tailcut-hedge",
                        format!("x-tailcut-hedge must be on or off (true/false, 1/0, yes/no), not {v:?}"),
                    ))
                }
            };
        }
        if let Some(v) = get(RESPONSE_TYPE) {
            ctx.response_type = Some(ResponseType::parse(v).ok_or_else(|| {
                GatewayError::bad_header(
                    "x-tailcut-response-type",
                    format!("x-tailcut-response-type must be prose, structured, tool or voice, not {v:?}"),
                )
            })?);
        }
        if let Some(v) = get(DEADLINE_MS) {
            let ms: u64 = v.parse().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                GatewayError::bad_header(
                    "x-tailcut-deadline-ms",
                    format!("x-tailcut-deadline-ms must be a positive integer, not {v:?}"),
                )
            })?;
            ctx.deadline = Some(Duration::from_millis(ms));
        }
        if let Some(v) = get(PRIORITY) {
            ctx.priority = match v.to_ascii_lowercase().as_str() {
                "interactive" => Priority::Interactive,
                "batch" => Priority::Batch,
                _ => {
                    return Err(GatewayError::bad_header(
                        "x-tailcut-priority",
                        format!("x-tailcut-priority must be interactive or batch, not {v:?}"),
                    ))
                }
            };
        }
        ctx.session = get(SESSION).filter(|s| !s.is_empty()).map(str::to_string);
        ctx.region = get(REGION).filter(|s| !s.is_empty()).map(str::to_string);
        ctx.tenant = get(TENANT).filter(|s| !s.is_empty()).map(str::to_string);
        ctx.task = get(TASK).filter(|s| !s.is_empty() && s.len() <= 64).map(str::to_string);
        Ok(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(pairs: &[(&'static str, &[u8])]) -> Result<RequestCtx, String> {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            if let Ok(value) = HeaderValue::from_bytes(value) {
                headers.append(*name, value);
            }
        }
        RequestCtx::from_headers(&headers, Dialect::OpenAi).map_err(|e| e.to_string())
    }

    #[test]
    fn every_control_header_is_read_trimmed() {
        let read = ctx(&[
            ("x-request-id", b" req_given "),
            ("x-tailcut-hedge", b"OFF"),
            ("x-tailcut-response-type", b"tool"),
            ("x-tailcut-deadline-ms", b" 1500"),
            ("x-tailcut-priority", b"Batch"),
            ("x-tailcut-session", b"s1"),
            ("x-tailcut-region", b"eu"),
            ("x-tailcut-tenant", b"acme "),
            ("x-tailcut-task", b"summarize"),
            ("x-tailcut-unknown", b"ignored"),
            ("content-type", b"application/json"),
        ]);
        let read = read.unwrap_or_else(|e| RequestCtx {
            request_id: e,
            ..RequestCtx::new(Dialect::OpenAi)
        });
        assert_eq!(read.request_id, "req_given");
        assert!(read.hedge_off);
        assert_eq!(read.response_type, ResponseType::parse("tool"));
        assert_eq!(read.deadline, Some(Duration::from_millis(1500)));
        assert_eq!(read.priority, Priority::Batch);
        assert_eq!(read.session.as_deref(), Some("s1"));
        assert_eq!(read.region.as_deref(), Some("eu"));
        assert_eq!(read.tenant.as_deref(), Some("acme"));
        assert_eq!(read.task.as_deref(), Some("summarize"));
    }

    #[test]
    fn a_repeated_control_header_is_refused_in_the_checking_order() {
        let refused = ctx(&[
            ("x-tailcut-task", b"a"),
            ("x-tailcut-task", b"b"),
            ("x-tailcut-region", b"eu"),
            ("x-tailcut-region", b"us"),
        ]);
        assert_eq!(
            refused.err().as_deref(),
            Some("x-tailcut-region may be sent only once"),
            "the first repeated one in CONTROL_HEADERS' order, whatever the request's order"
        );
        let twice_id = ctx(&[("x-request-id", b"first"), ("x-request-id", b"second")]);
        assert_eq!(
            twice_id.map(|c| c.request_id).ok().as_deref(),
            Some("first"),
            "a request id sent twice: the first counts"
        );
    }

    #[test]
    fn empty_long_and_unreadable_values_read_as_absent() {
        let long_id = "r".repeat(129);
        let read = ctx(&[
            ("x-request-id", long_id.as_bytes()),
            ("x-tailcut-session", b"  "),
            ("x-tailcut-tenant", b"caf\xc3\xa9"),
            ("x-tailcut-task", "t".repeat(65).as_bytes()),
        ]);
        let read = read.unwrap_or_else(|_| RequestCtx::new(Dialect::Anthropic));
        assert_eq!(read.dialect, Dialect::OpenAi, "read, not refused");
        assert!(read.request_id.starts_with("req_"), "a fresh id: {}", read.request_id);
        assert_eq!(read.session, None);
        assert_eq!(read.tenant, None, "not visible ASCII");
        assert_eq!(read.task, None, "over 64 characters");
        assert_eq!(
            ctx(&[("x-tailcut-deadline-ms", b"0")]).err().as_deref(),
            Some("x-tailcut-deadline-ms must be a positive integer, not \"0\"")
        );
    }
}
