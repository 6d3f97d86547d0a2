//! The Anthropic dialect: `POST /v1/messages`, streamed as named SSE events or answered
//! with one `message`, as the official Anthropic SDKs expect; and
//! `POST /v1/messages/count_tokens` (`count_tokens`).

mod count_tokens;
mod request;
mod response;

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use tokio::sync::OwnedSemaphorePermit;

pub use count_tokens::count_tokens;
pub use request::decode_request;
pub use response::{error_type, message_id, stop_reason, EventEncoder, PING_EVENT};

use super::body::{check_cost, require_json};
use super::chat::{serve_chat, Asker};
use super::error::{insert, ErrorReply};
use super::events::{await_commit, drain};
use super::sse_out::{encoded, envelope_headers, json_response, sse_response};
use super::verbatim;
use crate::server::ConnHandle;
use crate::transport::AppState;
use crate::types::EventStream;
use crate::types::{Dialect, RequestCtx};
use axum::Extension;

/// How a committed Anthropic answer is to be sent.
#[derive(Debug, Clone)]
pub struct Reply {
    pub request_id: String,
    /// The client's model name, used only if the envelope names no upstream model.
    pub alias: String,
    pub stream: bool,
    /// `server.max_answer_bytes`: the most a non-streaming answer may gather.
    pub max_answer_bytes: usize,
    pub keepalive: Duration,
}

pub async fn messages(
    State(state): State<AppState>,
    conn: Option<Extension<ConnHandle>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let keepalive = state.config.server.sse_keepalive;
    let max_answer_bytes = state.config.server.max_answer_bytes;
    let limits = state.config.server.request_limits;
    let prepare = |ctx: &mut RequestCtx| {
        require_json(&headers)?;
        check_cost(&body, &limits)?;
        let mut req = decode_request(&body)?;
        verbatim::keep_headers(&mut req, &headers, &["anthropic-beta"]);
        let how = Reply {
            request_id: ctx.request_id.clone(),
            alias: req.model.clone(),
            stream: req.stream,
            max_answer_bytes,
            keepalive,
        };
        Ok((req, how))
    };
    serve_chat(
        &state,
        Asker::new(&headers, conn),
        Dialect::Anthropic,
        error_response,
        prepare,
        reply,
    )
    .await
}

/// Waits for the commit point, then streams events or drains into one message. Before
/// commit every failure is a real HTTP error; the permit is held until the reply ends.
pub async fn reply(mut events: EventStream, how: Reply, permit: OwnedSemaphorePermit) -> Response {
    let start = match await_commit(&mut events).await {
        Ok(envelope) => envelope,
        Err(e) => return error_response(&e, &how.request_id),
    };
    if how.stream {
        let headers = with_anthropic_id(envelope_headers(&start, &how.request_id), &how.request_id);
        let encoder = EventEncoder::new(&how.request_id, &how.alias, start);
        let first = vec![encoder.start_frame()];
        let frames = encoded(first, events, encoder);
        return sse_response(headers, frames, how.keepalive, Bytes::from_static(PING_EVENT), permit);
    }
    // Boxed: inline, the drain's state (its envelope, the answer so far) would size the
    // reply future that every held stream keeps until its first token, streamed or not.
    let answer = Box::pin(drain(start, events, how.max_answer_bytes)).await;
    drop(permit);
    match answer {
        Ok(answer) => json_response(
            200,
            with_anthropic_id(envelope_headers(&answer.envelope, &how.request_id), &how.request_id),
            response::message_json(&how.request_id, &how.alias, &answer),
        ),
        Err(e) => error_response(&e, &how.request_id),
    }
}

/// Anthropic SDKs read the request id from `request-id`.
fn with_anthropic_id(mut headers: HeaderMap, request_id: &str) -> HeaderMap {
    insert(&mut headers, "request-id", request_id);
    headers
}

/// An HTTP error in Anthropic's format, with `retry-after` when there is a retry hint.
pub fn error_response(reply: &ErrorReply, request_id: &str) -> Response {
    let headers = with_anthropic_id(reply.headers(request_id), request_id);
    json_response(reply.status, headers, response::error_json(reply))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Envelope, FinishReason, StreamEvent};
    use futures::stream;
    use http_body_util::BodyExt;
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    fn how(stream: bool) -> Reply {
        Reply {
            request_id: "req_t2".into(),
            alias: "chat".into(),
            stream,
            max_answer_bytes: usize::MAX,
            keepalive: Duration::from_secs(15),
        }
    }

    async fn body_text(resp: Response) -> String {
        let bytes = resp.into_body().collect().await.expect("body collects").to_bytes();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn answer_events() -> EventStream {
        let env = Envelope {
            model: Some("claude-x".into()),
            ..Envelope::default()
        };
        Box::pin(stream::iter(vec![
            StreamEvent::Start(Box::new(env.clone())),
            StreamEvent::TextDelta("Hello".into()),
            StreamEvent::Finish {
                reason: FinishReason::Stop,
                envelope: Box::new(env),
            },
        ]))
    }

    #[tokio::test]
    async fn streamed_reply_is_named_events_from_message_start_to_message_stop() {
        let sem = Arc::new(Semaphore::new(1));
        let permit = sem.clone().try_acquire_owned().expect("free permit");
        let resp = reply(answer_events(), how(true), permit).await;
        assert_eq!(resp.status(), 200, "committed");
        assert_eq!(
            resp.headers().get("request-id").map(|v| v.as_bytes()),
            Some(&b"req_t2"[..]),
            "request-id"
        );
        let body = body_text(resp).await;
        assert!(
            body.starts_with("event: message_start\n"),
            "starts with message_start: {body}"
        );
        assert!(
            body.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
            "ends with message_stop: {body}"
        );
        assert!(
            body.split("\n\n")
                .filter(|e| !e.is_empty())
                .all(|e| e.starts_with("event: ")),
            "every event has an event: line: {body}"
        );
    }

    #[tokio::test]
    async fn non_streamed_reply_is_one_message() {
        let sem = Arc::new(Semaphore::new(1));
        let permit = sem.clone().try_acquire_owned().expect("free permit");
        let resp = reply(answer_events(), how(false), permit).await;
        let json: serde_json::Value = serde_json::from_str(&body_text(resp).await).expect("JSON");
        assert_eq!(json["content"][0]["text"], "Hello", "text block");
        assert_eq!(json["model"], "claude-x", "served model");
        assert_eq!(json["stop_reason"], "end_turn", "stop reason");
    }

    #[tokio::test]
    async fn busy_is_a_503_overloaded_error_with_retry_after() {
        let resp = error_response(&ErrorReply::busy(), "req_x");
        assert_eq!(resp.status(), 503, "status");
        assert_eq!(
            resp.headers().get("retry-after").map(|v| v.as_bytes()),
            Some(&b"1"[..]),
            "retry-after"
        );
        let body = body_text(resp).await;
        assert!(body.contains("\"overloaded_error\""), "Anthropic error type: {body}");
    }
}
