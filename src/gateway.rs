//! The one transport-agnostic entry point: `ChatRequest` + `RequestCtx` -> `EventStream`.
//! Every transport calls `Gateway::chat`; the gateway asks the router for a plan and hands it
//! to the mux.

use std::time::Duration;

use axum::http::HeaderMap;

use crate::provider::ErrorClass;
use crate::types::{ChatRequest, EventStream, ResponseType};

/// Which client dialect a request arrived in; decides what the mux may tell the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
    /// WebSocket and the native SSE dialect: can express `reset` and `route_switch`.
    Native,
}

impl Dialect {
    /// Can this dialect tell a client to discard what it has (a `Reset` event)?
    pub fn can_reset(self) -> bool {
        matches!(self, Dialect::Native)
    }
}

/// Request priority for admission: interactive traffic is shed last.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Batch,
    #[default]
    Interactive,
}

/// Everything about a request that is not the chat itself.
#[derive(Debug, Clone)]
pub struct RequestCtx {
    pub request_id: String,
    pub dialect: Dialect,
    /// `x-tailcut-hedge: off`.
    pub hedge_off: bool,
    /// `x-tailcut-response-type` override.
    pub response_type: Option<ResponseType>,
    /// `x-tailcut-deadline-ms`.
    pub deadline: Option<Duration>,
    /// `x-tailcut-priority`.
    pub priority: Priority,
    /// `x-tailcut-session`: route lease key.
    pub session: Option<String>,
    /// `x-tailcut-region`: only routes in this region are eligible.
    pub region: Option<String>,
}

impl RequestCtx {
    pub fn new(dialect: Dialect) -> Self {
        RequestCtx {
            request_id: new_request_id(),
            dialect,
            hedge_off: false,
            response_type: None,
            deadline: None,
            priority: Priority::Interactive,
            session: None,
            region: None,
        }
    }

    /// Reads the `x-tailcut-*` request headers. Invalid values are a client error.
    pub fn from_headers(headers: &HeaderMap, dialect: Dialect) -> Result<Self, GatewayError> {
        let mut ctx = RequestCtx::new(dialect);
        let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
        if let Some(id) = get("x-request-id").filter(|s| !s.is_empty() && s.len() <= 128) {
            ctx.request_id = id.to_string();
        }
        if let Some(v) = get("x-tailcut-hedge") {
            ctx.hedge_off = matches!(v.to_ascii_lowercase().as_str(), "off" | "false" | "0" | "no");
        }
        if let Some(v) = get("x-tailcut-response-type") {
            ctx.response_type = Some(ResponseType::parse(v).ok_or_else(|| {
                GatewayError::BadRequest(format!(
                    "x-tailcut-response-type must be prose, structured, tool or voice, not {v:?}"
                ))
            })?);
        }
        if let Some(v) = get("x-tailcut-deadline-ms") {
            let ms: u64 = v.parse().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                GatewayError::BadRequest(format!("x-tailcut-deadline-ms must be a positive integer, not {v:?}"))
            })?;
            ctx.deadline = Some(Duration::from_millis(ms));
        }
        if let Some(v) = get("x-tailcut-priority") {
            ctx.priority = match v.to_ascii_lowercase().as_str() {
                "interactive" => Priority::Interactive,
                "batch" => Priority::Batch,
                _ => {
                    return Err(GatewayError::BadRequest(format!(
                        "x-tailcut-priority must be interactive or batch, not {v:?}"
                    )))
                }
            };
        }
        ctx.session = get("x-tailcut-session").filter(|s| !s.is_empty()).map(str::to_string);
        ctx.region = get("x-tailcut-region").filter(|s| !s.is_empty()).map(str::to_string);
        Ok(ctx)
    }
}

fn new_request_id() -> String {
    format!("req_{}", uuid::Uuid::new_v4().simple())
}

/// A request refused before any stream exists.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GatewayError {
    #[error("unknown model {model:?}; known models: {}", known.join(", "))]
    UnknownModel { model: String, known: Vec<String> },
    #[error("{0}")]
    BadRequest(String),
    #[error("tailcut is at capacity; retry shortly")]
    Overloaded { retry_after: Duration },
}

impl GatewayError {
    pub fn status(&self) -> u16 {
        match self {
            GatewayError::UnknownModel { .. } | GatewayError::BadRequest(_) => 400,
            GatewayError::Overloaded { .. } => 503,
        }
    }

    pub fn class(&self) -> ErrorClass {
        match self {
            GatewayError::UnknownModel { .. } | GatewayError::BadRequest(_) => ErrorClass::BadRequest,
            GatewayError::Overloaded { .. } => ErrorClass::Overloaded,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            GatewayError::Overloaded { retry_after } => Some(*retry_after),
            _ => None,
        }
    }
}

/// Public model listing entry (`GET /v1/models`).
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub name: String,
    pub routes: Vec<String>,
}

pub struct Gateway {}

impl Gateway {
    /// Plans the request and returns its event stream. The first event is `Start` (commit)
    /// or `Error` (nothing was committed: render it as an HTTP error).
    pub fn chat(&self, _req: ChatRequest, _ctx: RequestCtx) -> Result<EventStream, GatewayError> {
        todo!("filled in by the gateway work")
    }

    pub fn models(&self) -> Vec<ModelInfo> {
        Vec::new()
    }
}
