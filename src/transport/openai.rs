//! The OpenAI dialect: `POST /v1/chat/completions` (SSE chunks or one JSON completion),
//! `GET /v1/models` and `GET /v1/models/{id}`, as the official openai SDKs expect them.

mod request;
mod response;

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Serialize;
use tokio::sync::OwnedSemaphorePermit;

pub use request::{decode_request, decode_value};
pub use response::{completion_id, error_type, finish_reason, ChunkEncoder};

use super::body::{check_cost, require_json};
use super::chat::{serve_chat, Asker};
use super::error::ErrorReply;
use super::events::{await_commit, drain};
use super::sse_out::{encoded, envelope_headers, json_response, sse_response, to_json, PING_COMMENT};
use crate::gateway::ModelInfo;
use crate::server::ConnHandle;
use crate::transport::AppState;
use crate::types::EventStream;
use crate::types::{Dialect, RequestCtx};
use axum::Extension;

/// How a committed OpenAI answer is to be sent.
#[derive(Debug, Clone)]
pub struct Reply {
    pub request_id: String,
    /// The client's model name, used only if the envelope names no upstream model.
    pub alias: String,
    pub stream: bool,
    /// `server.max_answer_bytes`: the most a non-streaming answer may gather.
    pub max_answer_bytes: usize,
    pub include_usage: bool,
    pub keepalive: Duration,
}

pub async fn chat_completions(
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
        let how = Reply {
            request_id: ctx.request_id.clone(),
            alias: req.model.clone(),
            stream: req.stream,
            max_answer_bytes,
            include_usage: req.include_usage,
            keepalive,
        };
        // A completion always reports its usage; only a stream's usage chunk is opt-in.
        if !req.stream {
            req.include_usage = true;
        }
        Ok((req, how))
    };
    let asker = Asker::new(&headers, conn);
    serve_chat(&state, asker, Dialect::OpenAi, error_response, prepare, reply).await
}

/// Waits for the commit point, then streams chunks or drains into one completion. Before
/// commit every failure is a real HTTP error; the permit is held until the reply ends.
pub async fn reply(mut events: EventStream, how: Reply, permit: OwnedSemaphorePermit) -> Response {
    let start = match await_commit(&mut events).await {
        Ok(envelope) => envelope,
        Err(e) => return error_response(&e, &how.request_id),
    };
    let created = unix_now();
    if how.stream {
        let headers = envelope_headers(&start, &how.request_id);
        let encoder = ChunkEncoder::new(&how.request_id, &how.alias, created, start, how.include_usage);
        let first = vec![encoder.role_frame()];
        let frames = encoded(first, events, encoder);
        return sse_response(headers, frames, how.keepalive, Bytes::from_static(PING_COMMENT), permit);
    }
    // Boxed: inline, the drain's state (its envelope, the answer so far) would size the
    // reply future that every held stream keeps until its first token, streamed or not.
    let answer = Box::pin(drain(start, events, how.max_answer_bytes)).await;
    drop(permit);
    match answer {
        Ok(answer) => json_response(
            200,
            envelope_headers(&answer.envelope, &how.request_id),
            response::completion_json(&how.request_id, &how.alias, created, &answer),
        ),
        Err(e) => error_response(&e, &how.request_id),
    }
}

/// An HTTP error in OpenAI's format, with `retry-after` when there is a retry hint.
pub fn error_response(reply: &ErrorReply, request_id: &str) -> Response {
    json_response(reply.status, reply.headers(request_id), response::error_json(reply))
}

/// With `[auth]`, the caller's key (or token) is required, and only its models are listed.
pub async fn list_models(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match state.access.caller(&headers, None) {
        Ok(caller) => {
            let mut models = state.gateway.models();
            models.retain(|m| caller.may_use(&m.name));
            json_response(200, HeaderMap::new(), models_json(&models))
        }
        Err(refusal) => error_response(&refusal.reply(), &RequestCtx::new(Dialect::OpenAi).request_id),
    }
}

/// `GET /v1/models/{id}` (the id may hold `/`: model names are config keys): the model as
/// `list_models` lists it, if the caller may use it. A model the caller's key may not use is
/// the same 404 as one that does not exist, so a key cannot learn what other keys may use.
pub async fn get_model(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Response {
    let request_id = RequestCtx::new(Dialect::OpenAi).request_id;
    let caller = match state.access.caller(&headers, None) {
        Ok(caller) => caller,
        Err(refusal) => return error_response(&refusal.reply(), &request_id),
    };
    let Ok(Path(id)) = id else {
        let reply = ErrorReply {
            param: Some("model".to_string()),
            ..ErrorReply::bad_request("the model id in the path is not UTF-8 once percent-decoded")
        };
        return error_response(&reply, &request_id);
    };
    if !state.config.models.contains_key(&id) || !caller.may_use(&id) {
        return error_response(&model_not_found(&id), &request_id);
    }
    json_response(200, HeaderMap::new(), to_json(&model_entry(&id)))
}

/// OpenAI's 404 for a model that does not exist or that the caller may not use, in its words.
fn model_not_found(id: &str) -> ErrorReply {
    ErrorReply {
        status: 404,
        param: Some("model".to_string()),
        code: Some("model_not_found"),
        ..ErrorReply::bad_request(format!(
            "The model '{id}' does not exist or you do not have access to it."
        ))
    }
}

#[derive(Serialize)]
struct ModelList<'a> {
    object: &'static str,
    data: Vec<ModelEntry<'a>>,
}

#[derive(Serialize)]
struct ModelEntry<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
}

/// `{"object":"list","data":[{"id","object":"model","created","owned_by":"tailcut"}]}`.
pub fn models_json(models: &[ModelInfo]) -> Vec<u8> {
    to_json(&ModelList {
        object: "list",
        data: models.iter().map(|m| model_entry(&m.name)).collect(),
    })
}

/// One model: `{"id","object":"model","created":0,"owned_by":"tailcut"}`.
fn model_entry(id: &str) -> ModelEntry<'_> {
    ModelEntry {
        id,
        object: "model",
        created: 0,
        owned_by: "tailcut",
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ErrorClass;
    use crate::types::{Envelope, ErrorEvent, FinishReason, StreamEvent};
    use futures::stream;
    use http_body_util::BodyExt;
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    fn how(stream: bool) -> Reply {
        Reply {
            request_id: "req_t1".into(),
            alias: "chat".into(),
            stream,
            max_answer_bytes: usize::MAX,
            include_usage: false,
            keepalive: Duration::from_secs(15),
        }
    }

    fn permit(sem: &Arc<Semaphore>) -> OwnedSemaphorePermit {
        sem.clone().try_acquire_owned().expect("a free permit in the test")
    }

    fn served() -> Envelope {
        Envelope {
            route: Some("openai-eu".into()),
            model: Some("gpt-4o-mini".into()),
            ..Envelope::default()
        }
    }

    async fn body_text(resp: Response) -> String {
        let bytes = resp.into_body().collect().await.expect("body collects").to_bytes();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[tokio::test]
    async fn error_before_commit_is_a_real_http_error_with_retry_after() {
        let sem = Arc::new(Semaphore::new(1));
        let events: EventStream = Box::pin(stream::iter(vec![StreamEvent::Error(Box::new(ErrorEvent {
            code: None,
            class: ErrorClass::RateLimited,
            status: 429,
            message: "every route is rate limited".into(),
            retry_after: Some(Duration::from_millis(1500)),
            envelope: Envelope::default(),
        }))]));
        let resp = reply(events, how(true), permit(&sem)).await;
        assert_eq!(resp.status(), 429, "status from the error event");
        assert_eq!(
            resp.headers().get("retry-after").map(|v| v.as_bytes()),
            Some(&b"2"[..]),
            "rounded up"
        );
        let body = body_text(resp).await;
        assert!(
            body.contains("\"type\":\"rate_limit_error\""),
            "OpenAI error JSON: {body}"
        );
        assert_eq!(sem.available_permits(), 1, "the permit is released with the error");
    }

    #[tokio::test]
    async fn streamed_reply_has_sse_headers_chunks_and_done() {
        let sem = Arc::new(Semaphore::new(1));
        let events: EventStream = Box::pin(stream::iter(vec![
            StreamEvent::Start(Box::new(served())),
            StreamEvent::TextDelta("Hi".into()),
            StreamEvent::Finish {
                reason: FinishReason::Stop,
                envelope: Box::new(served()),
            },
        ]));
        let resp = reply(events, how(true), permit(&sem)).await;
        assert_eq!(resp.status(), 200, "committed");
        let h = resp.headers();
        assert_eq!(
            h.get("content-type").map(|v| v.as_bytes()),
            Some(&b"text/event-stream"[..]),
            "SSE"
        );
        assert_eq!(
            h.get("x-accel-buffering").map(|v| v.as_bytes()),
            Some(&b"no"[..]),
            "no proxy buffering"
        );
        assert_eq!(
            h.get("x-tailcut-route").map(|v| v.as_bytes()),
            Some(&b"openai-eu"[..]),
            "route header"
        );
        assert_eq!(sem.available_permits(), 0, "the permit is held while the body streams");
        let body = body_text(resp).await;
        assert!(body.contains("\"role\":\"assistant\""), "role chunk first: {body}");
        assert!(body.contains("\"content\":\"Hi\""), "content chunk: {body}");
        assert!(body.ends_with("data: [DONE]\n\n"), "ends with [DONE]: {body}");
        assert!(
            !body.contains("\nid:") && !body.contains("event:"),
            "no id: or event: lines: {body}"
        );
        assert_eq!(sem.available_permits(), 1, "the permit is released when the body ends");
    }

    #[tokio::test]
    async fn non_streamed_reply_is_one_completion() {
        let sem = Arc::new(Semaphore::new(1));
        let events: EventStream = Box::pin(stream::iter(vec![
            StreamEvent::Start(Box::new(served())),
            StreamEvent::TextDelta("Hello".into()),
            StreamEvent::Finish {
                reason: FinishReason::Stop,
                envelope: Box::new(served()),
            },
        ]));
        let resp = reply(events, how(false), permit(&sem)).await;
        assert_eq!(resp.status(), 200, "ok");
        let json: serde_json::Value = serde_json::from_str(&body_text(resp).await).expect("JSON body");
        assert_eq!(json["choices"][0]["message"]["content"], "Hello", "whole text");
        assert_eq!(json["id"], "chatcmpl-t1", "id from the request id");
    }

    #[tokio::test]
    async fn non_streamed_error_after_commit_is_a_502() {
        let sem = Arc::new(Semaphore::new(1));
        let events: EventStream = Box::pin(stream::iter(vec![
            StreamEvent::Start(Box::new(served())),
            StreamEvent::TextDelta("Hel".into()),
            StreamEvent::Error(Box::new(ErrorEvent {
                code: None,
                class: ErrorClass::Unavailable,
                status: 503,
                message: "route died".into(),
                retry_after: None,
                envelope: served(),
            })),
        ]));
        let resp = reply(events, how(false), permit(&sem)).await;
        assert_eq!(resp.status(), 502, "a broken answer is a bad gateway");
    }

    #[test]
    fn models_are_listed_in_openai_shape() {
        let models = vec![ModelInfo {
            name: "chat".into(),
            routes: vec!["a".into()],
        }];
        let json: serde_json::Value = serde_json::from_slice(&models_json(&models)).expect("JSON");
        assert_eq!(
            json,
            serde_json::json!({"object": "list", "data": [{"id": "chat", "object": "model", "created": 0, "owned_by": "tailcut"}]}),
            "model list"
        );
    }

    #[tokio::test]
    async fn a_model_not_found_is_openais_own_404() {
        let resp = error_response(&model_not_found("gpt-9"), "req_m");
        assert_eq!(resp.status(), 404, "status");
        let json: serde_json::Value = serde_json::from_str(&body_text(resp).await).expect("JSON");
        assert_eq!(
            json,
            serde_json::json!({"error": {
                "message": "The model 'gpt-9' does not exist or you do not have access to it.",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found"
            }}),
            "OpenAI's body for it"
        );
    }

    #[test]
    fn one_model_is_shaped_as_a_listed_one() {
        let json: serde_json::Value = serde_json::from_slice(&to_json(&model_entry("meta/llama-3"))).expect("JSON");
        assert_eq!(
            json,
            serde_json::json!({"id": "meta/llama-3", "object": "model", "created": 0, "owned_by": "tailcut"}),
            "model"
        );
    }

    /// The size of the future an async fn of four arguments returns.
    fn future_size<A, B, C, D, F>(_: impl Fn(A, B, C, D) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn the_handler_future_a_held_stream_keeps_is_small() {
        // Every stream waiting for its first token keeps its handler's future (boxed by
        // axum) until then; what is needed only before the gateway's call (`chat::open`)
        // and a non-streaming answer's drain are boxed apart, so they do not size it. It
        // was 2,360 bytes with both inline.
        for (dialect, size) in [
            ("openai", future_size(chat_completions)),
            ("anthropic", future_size(crate::transport::anthropic::messages)),
        ] {
            assert!(size <= 1_200, "{dialect}: the handler's future is {size} bytes");
        }
    }
}
