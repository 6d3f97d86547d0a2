//! The native dialect's server messages (`start`, `delta`, `thinking`, `tool_call`, `reset`,
//! `route_switch`, `usage`, `done`, `error`), shared by the WebSocket and native SSE
//! transports. Unlike the SDK dialects it can say everything: resets, route switches and
//! truncation are first-class.

use serde::Serialize;

use super::decode_error::DecodeError;
use super::error::ErrorReply;
use crate::gateway::GatewayError;
use crate::types::{
    Envelope, ErrorEvent, FinishReason, Level, RequestCtx, ResponseType, StreamEvent, Thinking, ToolCall, Usage,
};

/// One server-to-client message, tagged by `type`, carrying the request's `id`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    Start {
        id: String,
        route: Option<String>,
        model: Option<String>,
        level: Level,
        hedged: bool,
        envelope: Envelope,
    },
    Delta {
        id: String,
        text: String,
    },
    /// The route's reasoning, as it streams: its `text`, the `signature` that closes a
    /// thinking block, or a `redacted` block's data (one of the three).
    Thinking {
        id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        redacted: Option<String>,
    },
    /// Always a complete call with valid arguments.
    ToolCall {
        id: String,
        call: ToolCall,
    },
    /// Discard everything received for this id so far; the answer starts over.
    Reset {
        id: String,
        reason: String,
    },
    RouteSwitch {
        id: String,
        from: String,
        to: String,
    },
    Usage {
        id: String,
        usage: Usage,
    },
    Done {
        id: String,
        finish_reason: FinishReason,
        envelope: Envelope,
    },
    Error {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        class: String,
        message: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        envelope: Option<Envelope>,
        /// Why a resumable stream ended or could not be read (`resume_gap`, `detached`,
        /// `draining`, `cancelled`, `not_found`, `gone`, `forbidden`: docs/streams.md), or
        /// the refusal's own code, the one the OpenAI dialect puts in `error.code`
        /// (`model_not_found`, `rpm_exceeded`, `draining`, ...: docs/errors.md).
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<&'static str>,
        /// `resume_gap`: the oldest event still held; resume from before it is impossible.
        #[serde(skip_serializing_if = "Option::is_none")]
        first_seq: Option<u64>,
        /// `draining`: the stream that was cut, so the client knows what to ask for again.
        #[serde(skip_serializing_if = "Option::is_none")]
        stream: Option<String>,
    },
    /// WebSocket only: the request was cancelled by the client and will send nothing more.
    Cancelled {
        id: String,
    },
    /// WebSocket only: a `chat` (or `resume`) was registered as a resumable stream.
    Accepted {
        id: String,
        stream: String,
        token: String,
    },
}

/// Why a resumable stream ended or could not be read, or why a WebSocket refused one frame
/// while its requests go on: the `code` of its `error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamCode {
    /// The events after the reader's position were dropped from the replay buffer.
    ResumeGap,
    /// No reader was attached for `detached_cancel_ms`.
    Detached,
    /// The server shut down.
    Draining,
    /// Its owner cancelled it.
    Cancelled,
    NotFound,
    /// It ended and expired.
    Gone,
    /// The stream token is missing or wrong.
    Forbidden,
    /// A `chat` under an id that is open (WebSocket): not that request's terminal message.
    DuplicateId,
    /// A request sent after the credential the socket was opened with expired (WebSocket).
    TokenExpired,
}

impl StreamCode {
    /// The error class that goes with the code.
    pub fn class(self) -> &'static str {
        match self {
            StreamCode::ResumeGap => "bad_request",
            StreamCode::Detached => "timeout",
            StreamCode::Draining => "unavailable",
            StreamCode::Cancelled => "cancelled",
            StreamCode::NotFound => "not_found",
            StreamCode::Gone => "gone",
            StreamCode::Forbidden => "forbidden",
            StreamCode::DuplicateId => "bad_request",
            StreamCode::TokenExpired => "unauthenticated",
        }
    }

    /// The code as sent.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamCode::ResumeGap => "resume_gap",
            StreamCode::Detached => "detached",
            StreamCode::Draining => "draining",
            StreamCode::Cancelled => "cancelled",
            StreamCode::NotFound => "not_found",
            StreamCode::Gone => "gone",
            StreamCode::Forbidden => "forbidden",
            StreamCode::DuplicateId => "duplicate_id",
            StreamCode::TokenExpired => "token_expired",
        }
    }
}

impl ServerMessage {
    /// Renders one stream event for request `id`; the flag is true for terminal events.
    /// `None` for an event this dialect has no message for.
    pub fn from_event(id: &str, event: StreamEvent) -> Option<(ServerMessage, bool)> {
        let id = id.to_string();
        Some(match event {
            StreamEvent::Start(envelope) => (
                ServerMessage::Start {
                    id,
                    route: envelope.route.clone(),
                    model: envelope.model.clone(),
                    level: envelope.level,
                    hedged: envelope.hedged,
                    envelope: *envelope,
                },
                false,
            ),
            StreamEvent::TextDelta(text) => (ServerMessage::Delta { id, text }, false),
            StreamEvent::Thinking(thinking) => {
                let (text, signature, redacted) = match thinking {
                    Thinking::Text(t) => (Some(t.into()), None, None),
                    Thinking::Signature(s) => (None, Some(s.into()), None),
                    Thinking::Redacted(d) => (None, None, Some(d.into())),
                };
                let msg = ServerMessage::Thinking {
                    id,
                    text,
                    signature,
                    redacted,
                };
                (msg, false)
            }
            // A provider wire's own fields: the native dialect is no provider's (the mux
            // hands it none).
            StreamEvent::Extra(_) => return None,
            StreamEvent::ToolCall(call) => (ServerMessage::ToolCall { id, call: *call }, false),
            StreamEvent::Reset { reason } => (ServerMessage::Reset { id, reason }, false),
            StreamEvent::RouteSwitch { from, to } => (ServerMessage::RouteSwitch { id, from, to }, false),
            StreamEvent::Usage(usage) => (ServerMessage::Usage { id, usage }, false),
            StreamEvent::Finish { reason, envelope } => (
                ServerMessage::Done {
                    id,
                    finish_reason: reason,
                    envelope: *envelope,
                },
                true,
            ),
            StreamEvent::Error(e) => (ServerMessage::from_error_event(Some(id), *e), true),
        })
    }

    pub fn from_error_event(id: Option<String>, e: ErrorEvent) -> ServerMessage {
        ServerMessage::from_reply(id, &ErrorReply::from_event(e))
    }

    pub fn from_reply(id: Option<String>, reply: &ErrorReply) -> ServerMessage {
        ServerMessage::Error {
            id,
            class: reply.class.as_str().to_string(),
            message: reply.message.clone(),
            retry_after_ms: reply.retry_after_ms(),
            envelope: reply.envelope.as_deref().cloned(),
            // Every specific code a refusal has, as over HTTP: a client tells `rpm_exceeded`
            // from `max_streams_exceeded`, and a chat refused by the drain (`draining`) from
            // an overloaded server, without parsing the message.
            code: reply.code,
            first_seq: None,
            stream: None,
        }
    }

    /// An error about a resumable stream itself (not its answer), named by `code`.
    pub fn stream_error(id: Option<String>, code: StreamCode, message: impl Into<String>) -> ServerMessage {
        ServerMessage::Error {
            id,
            class: code.class().to_string(),
            message: message.into(),
            retry_after_ms: None,
            envelope: None,
            code: Some(code.as_str()),
            first_seq: None,
            stream: None,
        }
    }

    /// The same message for another request id (a WebSocket's own name for a stream).
    pub fn with_id(&self, new_id: &str) -> ServerMessage {
        let mut m = self.clone();
        match &mut m {
            ServerMessage::Start { id, .. }
            | ServerMessage::Delta { id, .. }
            | ServerMessage::Thinking { id, .. }
            | ServerMessage::ToolCall { id, .. }
            | ServerMessage::Reset { id, .. }
            | ServerMessage::RouteSwitch { id, .. }
            | ServerMessage::Usage { id, .. }
            | ServerMessage::Done { id, .. }
            | ServerMessage::Cancelled { id }
            | ServerMessage::Accepted { id, .. } => *id = new_id.to_string(),
            ServerMessage::Error { id, .. } => *id = Some(new_id.to_string()),
        }
        m
    }

    /// Terminal messages end a stream: nothing follows them.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            ServerMessage::Done { .. } | ServerMessage::Error { .. } | ServerMessage::Cancelled { .. }
        )
    }

    pub fn from_gateway(id: Option<String>, e: &GatewayError) -> ServerMessage {
        ServerMessage::from_reply(id, &ErrorReply::from_gateway(e))
    }

    /// The `type` tag, used as the SSE event name.
    pub fn name(&self) -> &'static str {
        match self {
            ServerMessage::Start { .. } => "start",
            ServerMessage::Delta { .. } => "delta",
            ServerMessage::Thinking { .. } => "thinking",
            ServerMessage::ToolCall { .. } => "tool_call",
            ServerMessage::Reset { .. } => "reset",
            ServerMessage::RouteSwitch { .. } => "route_switch",
            ServerMessage::Usage { .. } => "usage",
            ServerMessage::Done { .. } => "done",
            ServerMessage::Error { .. } => "error",
            ServerMessage::Cancelled { .. } => "cancelled",
            ServerMessage::Accepted { .. } => "accepted",
        }
    }

    pub fn to_json(&self) -> String {
        String::from_utf8(super::sse_out::to_json(self)).unwrap_or_default()
    }
}

/// Per-request knobs a native client can set in the message itself (the SDK dialects use
/// `x-tailcut-*` headers for the same things).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChatOptions {
    pub response_type: Option<String>,
    pub hedge: Option<bool>,
    pub deadline_ms: Option<u64>,
    pub priority: Option<String>,
    pub session: Option<String>,
    pub region: Option<String>,
}

impl ChatOptions {
    /// Applies the options over a context built from the connection's headers.
    pub fn apply(&self, ctx: &mut RequestCtx) -> Result<(), DecodeError> {
        if let Some(t) = &self.response_type {
            ctx.response_type = Some(ResponseType::parse(t).ok_or_else(|| {
                DecodeError::new(
                    "options.response_type",
                    format!("options.response_type must be prose, structured, tool or voice, not {t:?}"),
                )
            })?);
        }
        if let Some(hedge) = self.hedge {
            ctx.hedge_off = !hedge;
        }
        if let Some(ms) = self.deadline_ms {
            if ms == 0 {
                return Err(DecodeError::new(
                    "options.deadline_ms",
                    "options.deadline_ms must be positive",
                ));
            }
            ctx.deadline = Some(std::time::Duration::from_millis(ms));
        }
        if let Some(p) = &self.priority {
            ctx.priority = match p.to_ascii_lowercase().as_str() {
                "interactive" => crate::types::Priority::Interactive,
                "batch" => crate::types::Priority::Batch,
                _ => {
                    return Err(DecodeError::new(
                        "options.priority",
                        format!("options.priority must be interactive or batch, not {p:?}"),
                    ))
                }
            };
        }
        if let Some(s) = self.session.as_ref().filter(|s| !s.is_empty()) {
            ctx.session = Some(s.clone());
        }
        if let Some(r) = self.region.as_ref().filter(|r| !r.is_empty()) {
            ctx.region = Some(r.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ErrorClass;
    use crate::types::{Dialect, Priority};
    use serde_json::json;

    fn to_value(m: &ServerMessage) -> serde_json::Value {
        serde_json::from_str(&m.to_json()).expect("valid JSON")
    }

    #[test]
    fn start_carries_route_model_level_hedged_and_envelope() {
        let env = Envelope {
            route: Some("r1".into()),
            model: Some("m1".into()),
            level: Level::L1,
            hedged: true,
            ..Envelope::default()
        };
        let (msg, terminal) = ServerMessage::from_event("c1", StreamEvent::Start(Box::new(env))).expect("a message");
        let v = to_value(&msg);
        assert!(!terminal, "start is not terminal");
        assert_eq!(
            (
                &v["type"],
                &v["id"],
                &v["route"],
                &v["model"],
                &v["level"],
                &v["hedged"]
            ),
            (
                &json!("start"),
                &json!("c1"),
                &json!("r1"),
                &json!("m1"),
                &json!("L1"),
                &json!(true)
            ),
            "start fields"
        );
        assert_eq!(v["envelope"]["route"], "r1", "full envelope included");
    }

    #[test]
    fn every_event_has_its_native_shape() {
        let call = ToolCall {
            index: 0,
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{\"a\":1}".into(),
        };
        let cases = vec![
            (
                StreamEvent::TextDelta("hi".into()),
                json!({"type": "delta", "id": "c1", "text": "hi"}),
            ),
            (
                StreamEvent::ToolCall(Box::new(call)),
                json!({"type": "tool_call", "id": "c1", "call": {"index": 0, "id": "call_1", "name": "f", "arguments": "{\"a\":1}"}}),
            ),
            (
                StreamEvent::Reset {
                    reason: "route failed".into(),
                },
                json!({"type": "reset", "id": "c1", "reason": "route failed"}),
            ),
            (
                StreamEvent::RouteSwitch {
                    from: "a".into(),
                    to: "b".into(),
                },
                json!({"type": "route_switch", "id": "c1", "from": "a", "to": "b"}),
            ),
            (
                StreamEvent::Usage(Usage::new(1, 2)),
                json!({"type": "usage", "id": "c1", "usage": {"input_tokens": 1, "output_tokens": 2}}),
            ),
        ];
        for (event, want) in cases {
            let (msg, terminal) = ServerMessage::from_event("c1", event).expect("a message");
            assert_eq!(to_value(&msg), want, "shape of {}", msg.name());
            assert!(!terminal, "{} is not terminal", msg.name());
        }
    }

    #[test]
    fn done_and_error_are_terminal_and_truncation_is_said_plainly() {
        let (msg, terminal) = ServerMessage::from_event(
            "c1",
            StreamEvent::Finish {
                reason: FinishReason::Truncated,
                envelope: Box::new(Envelope::default()),
            },
        )
        .expect("a message");
        assert!(terminal, "done is terminal");
        assert_eq!(
            to_value(&msg)["finish_reason"],
            "truncated",
            "native clients see truncation as such"
        );

        let (msg, terminal) = ServerMessage::from_event(
            "c1",
            StreamEvent::Error(Box::new(ErrorEvent {
                code: None,
                class: ErrorClass::RateLimited,
                status: 429,
                message: "slow down".into(),
                retry_after: Some(std::time::Duration::from_millis(1500)),
                envelope: Envelope::default(),
            })),
        )
        .expect("a message");
        assert!(terminal, "error is terminal");
        let v = to_value(&msg);
        assert_eq!(
            (&v["class"], &v["retry_after_ms"]),
            (&json!("rate_limited"), &json!(1500)),
            "class and retry hint"
        );
    }

    #[test]
    fn options_override_the_connection_context() {
        let mut ctx = RequestCtx::new(Dialect::Native);
        let opts = ChatOptions {
            response_type: Some("voice".into()),
            hedge: Some(false),
            deadline_ms: Some(2500),
            priority: Some("batch".into()),
            session: Some("s1".into()),
            region: Some("eu".into()),
        };
        opts.apply(&mut ctx).expect("valid options apply");
        assert_eq!(ctx.response_type, Some(ResponseType::Voice), "response type");
        assert!(ctx.hedge_off, "hedge off");
        assert_eq!(ctx.deadline, Some(std::time::Duration::from_millis(2500)), "deadline");
        assert_eq!(ctx.priority, Priority::Batch, "priority");
        assert_eq!(
            (ctx.session.as_deref(), ctx.region.as_deref()),
            (Some("s1"), Some("eu")),
            "session and region"
        );
    }

    #[test]
    fn invalid_options_are_bad_requests() {
        let mut ctx = RequestCtx::new(Dialect::Native);
        let bad = ChatOptions {
            response_type: Some("poetry".into()),
            ..ChatOptions::default()
        };
        assert_eq!(
            bad.apply(&mut ctx).map_err(|e| e.param),
            Err(Some("options.response_type".into())),
            "unknown response type"
        );
        let bad = ChatOptions {
            deadline_ms: Some(0),
            ..ChatOptions::default()
        };
        assert_eq!(
            bad.apply(&mut ctx).map_err(|e| e.param),
            Err(Some("options.deadline_ms".into())),
            "zero deadline"
        );
    }
}
