//! Native SSE for browsers: `POST /v1/stream` (OpenAI-style body, read with fetch) and
//! `GET /v1/stream?q=<JSON request>` (for `EventSource`, which cannot set headers, so with
//! `[auth]` it passes a browser token as `&token=`), streaming the native messages
//! as named events: `start`, `delta`, `tool_call`, `reset`, `route_switch`, `usage`,
//! `done`, `error`.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use tokio::sync::OwnedSemaphorePermit;

use super::body::{check_cost, require_json};
use super::chat::{serve_chat, Asker};
use super::decode_error::DecodeError;
use super::error::ErrorReply;
use super::events::await_commit;
use super::native::{ChatOptions, ServerMessage};
use super::openai::{decode_request, decode_value};
use super::sse_out::{
    encoded, envelope_headers, event_frame, json_response, sse_response, Flow, FrameEncoder, Frames, PING_COMMENT,
};
use crate::config::RequestLimits;
use crate::server::ConnHandle;
use crate::transport::AppState;
use crate::types::{ChatRequest, Dialect, EventStream, RequestCtx, StreamEvent};
use axum::Extension;

/// `GET /v1/stream` parameters: `EventSource` cannot send a body or headers, so the
/// request and the per-request options ride in the query string. The query is strict: an
/// unknown key, a repeated one or a bad value is a 400 naming it, so a typo never passes.
#[derive(Debug, Default, PartialEq)]
pub struct StreamQuery {
    q: Option<String>,
    options: ChatOptions,
}

/// Keys `GET /v1/stream` accepts (`token` is read by `auth`).
const QUERY_KEYS: &[&str] = &[
    "q",
    "token",
    "response_type",
    "hedge",
    "deadline_ms",
    "priority",
    "session",
    "region",
];

impl StreamQuery {
    pub fn parse(uri: &Uri) -> Result<StreamQuery, DecodeError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map_err(|_| DecodeError::body("the query string is not valid form encoding"))?;
        let mut seen: Vec<String> = Vec::new();
        let mut out = StreamQuery::default();
        for (key, value) in pairs {
            if !QUERY_KEYS.contains(&key.as_str()) {
                let message = format!(
                    "unknown query parameter {key:?} (expected one of {})",
                    QUERY_KEYS.join(", ")
                );
                return Err(DecodeError::new(key, message));
            }
            if seen.contains(&key) {
                return Err(DecodeError::new(key.clone(), format!("{key} is given twice")));
            }
            seen.push(key.clone());
            let o = &mut out.options;
            match key.as_str() {
                "q" => out.q = Some(value),
                "response_type" => o.response_type = Some(value),
                "priority" => o.priority = Some(value),
                "session" => o.session = Some(value),
                "region" => o.region = Some(value),
                "hedge" => {
                    o.hedge = Some(match value.as_str() {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(DecodeError::new(
                                "hedge",
                                format!("hedge must be true or false, not {value:?}"),
                            ))
                        }
                    })
                }
                "deadline_ms" => {
                    o.deadline_ms = Some(value.parse().map_err(|_| {
                        DecodeError::new(
                            "deadline_ms",
                            format!("deadline_ms must be a whole number, not {value:?}"),
                        )
                    })?)
                }
                _ => {} // token
            }
        }
        Ok(out)
    }
}

pub async fn post_stream(
    State(state): State<AppState>,
    conn: Option<Extension<ConnHandle>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let decoded = decode_checked(&headers, &body, &state.config.server.request_limits);
    start(state, headers, None, conn, decoded, ChatOptions::default()).await
}

/// A chat body as every HTTP endpoint takes it: declared as JSON (else 415), within the
/// request cost limits, then decoded as an OpenAI-style request.
pub(crate) fn decode_checked(
    headers: &HeaderMap,
    body: &[u8],
    limits: &RequestLimits,
) -> Result<ChatRequest, ErrorReply> {
    require_json(headers)?;
    check_cost(body, limits)?;
    Ok(decode_request(body)?)
}

pub async fn get_stream(
    State(state): State<AppState>,
    conn: Option<Extension<ConnHandle>>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let query = match StreamQuery::parse(&uri) {
        Ok(query) => query,
        Err(e) => {
            let request_id = RequestCtx::new(Dialect::Native).request_id;
            return error_response(&e.into(), &request_id);
        }
    };
    let decoded = match query.q.as_deref() {
        None | Some("") => Err(DecodeError::new("q", "pass the request as ?q=<URL-encoded JSON>")),
        Some(q) => check_cost(q.as_bytes(), &state.config.server.request_limits).and_then(|()| {
            serde_json::from_str(q)
                .map_err(|e| DecodeError::new("q", format!("q is not valid JSON: {e}")))
                .and_then(decode_value)
        }),
    }
    .map_err(ErrorReply::from);
    start(
        state,
        headers,
        super::auth::query_token(&uri),
        conn,
        decoded,
        query.options,
    )
    .await
}

async fn start(
    state: AppState,
    headers: HeaderMap,
    query_token: Option<String>,
    conn: Option<Extension<ConnHandle>>,
    decoded: Result<ChatRequest, ErrorReply>,
    options: ChatOptions,
) -> Response {
    let keepalive = state.config.server.sse_keepalive;
    let prepare = |ctx: &mut RequestCtx| {
        let mut req = decoded?;
        options.apply(ctx)?;
        req.stream = true;
        req.include_usage = true;
        Ok((req, ctx.request_id.clone()))
    };
    let answer =
        |events, request_id: String, permit| async move { reply(events, &request_id, keepalive, permit).await };
    let asker = Asker {
        query_token: query_token.as_deref(),
        ..Asker::new(&headers, conn)
    };
    serve_chat(&state, asker, Dialect::Native, error_response, prepare, answer).await
}

/// Waits for the commit point (before it, failures are real HTTP errors with a JSON body
/// in the native `error` shape), then streams named events until `done` or `error`.
pub async fn reply(
    mut events: EventStream,
    request_id: &str,
    keepalive: Duration,
    permit: OwnedSemaphorePermit,
) -> Response {
    let start = match await_commit(&mut events).await {
        Ok(envelope) => envelope,
        Err(e) => return error_response(&e, request_id),
    };
    let headers = envelope_headers(&start, request_id);
    let mut encoder = NativeEncoder {
        id: request_id.to_string(),
        frames: Frames::default(),
    };
    let mut first = Vec::new();
    encoder.encode(StreamEvent::Start(Box::new(start)), &mut first);
    sse_response(
        headers,
        encoded(first, events, encoder),
        keepalive,
        Bytes::from_static(PING_COMMENT),
        permit,
    )
}

/// An HTTP error whose body is the native `error` message.
pub fn error_response(reply: &ErrorReply, request_id: &str) -> Response {
    let body = ServerMessage::from_reply(Some(request_id.to_string()), reply).to_json();
    json_response(reply.status, reply.headers(request_id), body.into_bytes())
}

/// Each native message as `event: <type>` + its JSON; `id` is the request id.
struct NativeEncoder {
    id: String,
    frames: Frames,
}

impl FrameEncoder for NativeEncoder {
    fn encode(&mut self, event: StreamEvent, out: &mut Vec<Bytes>) -> Flow {
        let Some((message, terminal)) = ServerMessage::from_event(&self.id, event) else {
            return Flow::Continue;
        };
        out.push(self.frames.event(message.name(), &message));
        if terminal {
            Flow::End
        } else {
            Flow::Continue
        }
    }

    fn encode_unfinished(&mut self, out: &mut Vec<Bytes>) {
        let reply = ErrorReply::broken_stream("ended without a finish", None);
        let message = ServerMessage::from_reply(Some(self.id.clone()), &reply);
        out.push(event_frame(message.name(), &message));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Envelope, FinishReason};
    use futures::stream;
    use http_body_util::BodyExt;
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    #[tokio::test]
    async fn events_are_named_and_carry_the_native_shapes() {
        let sem = Arc::new(Semaphore::new(1));
        let permit = sem.clone().try_acquire_owned().expect("free permit");
        let events: EventStream = Box::pin(stream::iter(vec![
            StreamEvent::Start(Box::default()),
            StreamEvent::TextDelta("Hi".into()),
            StreamEvent::Reset {
                reason: "route failed".into(),
            },
            StreamEvent::TextDelta("Hello".into()),
            StreamEvent::Finish {
                reason: FinishReason::Stop,
                envelope: Box::new(Envelope::default()),
            },
        ]));
        let resp = reply(events, "req_n1", Duration::from_secs(15), permit).await;
        assert_eq!(resp.status(), 200, "committed");
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let body = String::from_utf8_lossy(&bytes);
        let names: Vec<&str> = body
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("event: "))
            .map(|e| e.split('\n').next().unwrap_or_default())
            .collect();
        assert_eq!(
            names,
            vec!["start", "delta", "reset", "delta", "done"],
            "named events in order: {body}"
        );
        assert!(
            body.contains("data: {\"type\":\"delta\",\"id\":\"req_n1\",\"text\":\"Hi\"}\n\n"),
            "delta data golden: {body}"
        );
    }

    fn parse(uri: &str) -> Result<StreamQuery, Option<String>> {
        StreamQuery::parse(&uri.parse().expect("uri")).map_err(|e| e.param)
    }

    #[test]
    fn the_get_query_is_strict_and_names_the_bad_key() {
        let q = parse("/v1/stream?q=%7B%7D&hedge=false&deadline_ms=900&token=t").expect("valid");
        assert_eq!(
            (q.q.as_deref(), q.options.hedge, q.options.deadline_ms),
            (Some("{}"), Some(false), Some(900)),
            "known keys parse"
        );
        assert_eq!(
            parse("/v1/stream?q=1&hedging=false").err(),
            Some(Some("hedging".into())),
            "unknown key"
        );
        assert_eq!(
            parse("/v1/stream?q=1&hedge=maybe").err(),
            Some(Some("hedge".into())),
            "bad bool"
        );
        assert_eq!(
            parse("/v1/stream?deadline_ms=soon").err(),
            Some(Some("deadline_ms".into())),
            "bad number"
        );
        assert_eq!(
            parse("/v1/stream?q=1&q=2").err(),
            Some(Some("q".into())),
            "repeated key"
        );
    }

    #[tokio::test]
    async fn error_before_commit_is_an_http_error_in_native_shape() {
        let sem = Arc::new(Semaphore::new(1));
        let permit = sem.clone().try_acquire_owned().expect("free permit");
        let events: EventStream = Box::pin(stream::empty());
        let resp = reply(events, "req_n2", Duration::from_secs(15), permit).await;
        assert_eq!(resp.status(), 500, "a stream that never started is an internal error");
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
        assert_eq!(
            (&json["type"], &json["class"]),
            (&serde_json::json!("error"), &serde_json::json!("internal")),
            "native error"
        );
    }
}
