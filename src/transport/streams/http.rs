//! The resumable native SSE endpoints (docs/streams.md): `POST /v1/streams` starts an
//! answer and returns its id and token, `GET /v1/streams/{id}/events?token=` reads it as
//! SSE from any `Last-Event-ID`, `DELETE /v1/streams/{id}?token=` cancels it.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use super::{remote, Attached, Refused, Stop, Stream};
use crate::shared::replay::RemoteReader;
use crate::transport::chat::{serve_chat, Asker};
use crate::transport::error::ErrorReply;
use crate::transport::native::{ServerMessage, StreamCode};
use crate::transport::native_sse::{decode_checked, error_response};
use crate::transport::replay::{Read, Resume};
use crate::transport::sse_out::{json_response, to_json, with_keepalive, PING_COMMENT};
use crate::transport::AppState;
use crate::types::{Dialect, RequestCtx};

/// `POST /v1/streams`: the same request, headers and checks as `POST /v1/stream`; the answer
/// runs in the registry and the reply is `201` with where to read it.
pub async fn open_stream(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let request_id = RequestCtx::new(Dialect::Native).request_id;
    if state.resumable.is_full() {
        return error_response(&registry_full(), &request_id);
    }
    let registry = state.resumable.clone();
    let detached = registry.config().detached_cancel;
    let prepare = |ctx: &mut RequestCtx| {
        let mut req = decode_checked(&headers, &body, &state.config.server.request_limits)?;
        req.stream = true;
        req.include_usage = true;
        Ok((req, ctx.request_id.clone()))
    };
    let reply = |events, request_id: String, permit| async move {
        match registry.open(events, request_id.clone(), permit) {
            Ok(stream) => created(&stream, &request_id, detached),
            Err(_) => error_response(&registry_full(), &request_id),
        }
    };
    // The answer runs in the registry, which always reads it: no connection to close.
    serve_chat(
        &state,
        Asker::new(&headers, None),
        Dialect::Native,
        error_response,
        prepare,
        reply,
    )
    .await
}

fn registry_full() -> ErrorReply {
    ErrorReply {
        message: "tailcut holds as many resumable streams as it may ([server.streams] max_open); retry shortly".into(),
        ..ErrorReply::busy()
    }
}

fn created(stream: &Stream, request_id: &str, detached: Duration) -> Response {
    let body = serde_json::json!({
        "id": stream.id,
        "events_url": format!("/v1/streams/{}/events?token={}", stream.id, stream.token()),
        "token": stream.token(),
        "expires_in_s": detached.as_millis().div_ceil(1000),
    });
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(request_id) {
        headers.insert("x-request-id", v);
    }
    json_response(201, headers, to_json(&body))
}

/// `GET /v1/streams/{id}/events?token=T[&last_event_id=N]` (or `Last-Event-ID: N`).
pub async fn read_events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let params = match EventsQuery::parse(&uri, &headers) {
        Ok(p) => p,
        Err(message) => return bad_request(message),
    };
    let after = params.last_event_id.unwrap_or(0);
    let config = state.resumable.config();
    let stream = match (
        state.resumable.find(&id, params.token.as_deref()),
        state.resumable.remote(),
    ) {
        (Ok(stream), _) => stream,
        // Not held here: another instance may run it.
        (Err(Refused::NotFound), Some(shared)) => {
            return match remote::open_reader(shared, &id, params.token.as_deref(), after).await {
                Ok((reader, request_id)) => events_response(
                    Source::Remote(Box::new(reader)),
                    request_id,
                    config.retry,
                    state.config.server.sse_keepalive,
                ),
                Err(response) => response,
            };
        }
        (Err(refused), _) => return refused_response(refused),
    };
    match stream.replay.check_resume(after) {
        Resume::Finished => return StatusCode::NO_CONTENT.into_response(),
        Resume::Ahead { last } => {
            let message = format!("last_event_id {after} is beyond this stream's newest event ({last})");
            return bad_request(message);
        }
        Resume::Ok | Resume::Gap { .. } => {}
    }
    let request_id = stream.request_id.clone();
    events_response(
        Source::Local(stream.attach(after)),
        request_id,
        config.retry,
        state.config.server.sse_keepalive,
    )
}

/// `DELETE /v1/streams/{id}?token=T`: cancels a running stream (its readers get an `error`
/// of code `cancelled`); `204` also when it had already ended.
pub async fn delete_stream(State(state): State<AppState>, Path(id): Path<String>, uri: Uri) -> Response {
    let token = match EventsQuery::parse(&uri, &HeaderMap::new()) {
        Ok(p) => p.token,
        Err(message) => return bad_request(message),
    };
    match (state.resumable.find(&id, token.as_deref()), state.resumable.remote()) {
        (Ok(stream), _) => {
            stream.stop(Stop::Cancelled);
            StatusCode::NO_CONTENT.into_response()
        }
        (Err(Refused::NotFound), Some(shared)) => remote::cancel(shared, &id, token.as_deref()).await,
        (Err(refused), _) => refused_response(refused),
    }
}

pub(super) fn refused_response(refused: Refused) -> Response {
    match refused {
        Refused::NotFound => refusal(404, StreamCode::NotFound, "no such stream"),
        Refused::Gone => refusal(
            410,
            StreamCode::Gone,
            "this stream ended and expired ([server.streams] keep_after_done_ms)",
        ),
        Refused::Forbidden => refusal(
            403,
            StreamCode::Forbidden,
            "the stream's token is missing or wrong (pass ?token= from POST /v1/streams)",
        ),
    }
}

fn refusal(status: u16, code: StreamCode, message: impl Into<String>) -> Response {
    let body = ServerMessage::stream_error(None, code, message).to_json();
    json_response(status, HeaderMap::new(), body.into_bytes())
}

pub(super) fn bad_request(message: String) -> Response {
    let body = ServerMessage::from_reply(None, &ErrorReply::bad_request(message)).to_json();
    json_response(400, HeaderMap::new(), body.into_bytes())
}

/// The reader's parameters; the query is strict so a typo is an error, not a full replay.
#[derive(Debug, Default, PartialEq)]
struct EventsQuery {
    token: Option<String>,
    last_event_id: Option<u64>,
}

impl EventsQuery {
    fn parse(uri: &Uri, headers: &HeaderMap) -> Result<EventsQuery, String> {
        let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map_err(|_| "the query string is not valid form encoding".to_string())?;
        let mut out = EventsQuery::default();
        for (key, value) in pairs {
            match key.as_str() {
                "token" if out.token.is_none() => out.token = Some(value),
                "last_event_id" if out.last_event_id.is_none() => {
                    out.last_event_id = Some(seq(&value).ok_or("last_event_id must be a whole number")?)
                }
                "token" | "last_event_id" => return Err(format!("{key} is given twice")),
                _ => {
                    return Err(format!(
                        "unknown query parameter {key:?} (expected token, last_event_id)"
                    ))
                }
            }
        }
        // The browser's reconnect header wins over a position fixed in the URL.
        if let Some(value) = headers.get("last-event-id") {
            let text = value.to_str().unwrap_or("\u{fffd}").trim();
            if !text.is_empty() {
                out.last_event_id = Some(seq(text).ok_or("Last-Event-ID must be a whole number")?);
            }
        }
        Ok(out)
    }
}

fn seq(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// `retry:` first, then every event from the reader's position as `id`/`event`/`data`,
/// keep-alive comments while idle, and the end after the terminal event. Events already in
/// the buffer go out together in one write (up to `BATCH_BYTES`), so a replay does not
/// cost a round of small TCP writes.
fn events_response(mut source: Source, request_id: String, retry: Duration, keepalive: Duration) -> Response {
    let frames = async_stream::stream! {
        let mut out = format!("retry: {}\n\n", retry.as_millis()).into_bytes();
        let mut read = source.next().await;
        loop {
            let end = match read {
                Read::Event(seq, event) => {
                    write_frame(&mut out, Some(seq), event.name, &event.json);
                    event.terminal
                }
                Read::Gap { first } => {
                    let gap = gap_error(Some(request_id.clone()), first);
                    write_frame(&mut out, None, gap.name(), gap.to_json().as_bytes());
                    true
                }
                Read::End => true,
            };
            if end {
                yield Bytes::from(out);
                break;
            }
            match source.try_next() {
                Some(next) if out.len() < BATCH_BYTES => read = next,
                waiting => {
                    yield Bytes::from(std::mem::take(&mut out));
                    read = match waiting {
                        Some(next) => next,
                        None => source.next().await,
                    };
                }
            }
        }
    };
    let body = with_keepalive(frames, keepalive, Bytes::from_static(PING_COMMENT)).map(Ok::<_, Infallible>);
    let mut response = Body::from_stream(body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// Where a reader's events come from: the replay buffer here (attached while it reads), or
/// the shared copy in Redis of a stream another instance runs.
enum Source {
    Local(Attached),
    Remote(Box<RemoteReader>),
}

impl Source {
    async fn next(&mut self) -> Read {
        match self {
            Source::Local(attached) => attached.reader.next().await,
            Source::Remote(reader) => reader.next().await,
        }
    }

    fn try_next(&mut self) -> Option<Read> {
        match self {
            Source::Local(attached) => attached.reader.try_next(),
            Source::Remote(reader) => reader.try_next(),
        }
    }
}

/// The most bytes of already-buffered events sent in one write.
const BATCH_BYTES: usize = 32 * 1024;

/// The `error` a reader gets when the events it needs were dropped from the buffer.
pub fn gap_error(id: Option<String>, first: u64) -> ServerMessage {
    let message =
        format!("the events after the requested one were dropped from the replay buffer; the oldest held is {first}");
    let mut m = ServerMessage::stream_error(id, StreamCode::ResumeGap, message);
    if let ServerMessage::Error { first_seq, .. } = &mut m {
        *first_seq = Some(first);
    }
    m
}

/// `id: <seq>\nevent: <type>\ndata: <json>\n\n`; the JSON is compact, so one `data:` line.
fn write_frame(out: &mut Vec<u8>, seq: Option<u64>, name: &str, json: &[u8]) {
    if let Some(seq) = seq {
        out.extend_from_slice(format!("id: {seq}\n").as_bytes());
    }
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(uri: &str, last_event_id: Option<&str>) -> Result<EventsQuery, String> {
        let mut headers = HeaderMap::new();
        if let Some(v) = last_event_id {
            headers.insert("last-event-id", HeaderValue::from_str(v).expect("header value"));
        }
        EventsQuery::parse(&uri.parse().expect("uri"), &headers)
    }

    #[test]
    fn the_header_wins_over_the_query_position() {
        let q = query("/v1/streams/st_a/events?token=t&last_event_id=3", Some("7")).expect("valid");
        assert_eq!(
            q,
            EventsQuery {
                token: Some("t".into()),
                last_event_id: Some(7)
            },
            "header 7 over query 3"
        );
        let q = query("/x?last_event_id=3", Some("")).expect("valid");
        assert_eq!(q.last_event_id, Some(3), "an empty header is no header");
    }

    #[test]
    fn unknown_keys_and_bad_positions_are_refused_by_name() {
        let e = query("/x?token=t&lastEventId=3", None).expect_err("typo");
        assert!(e.contains("lastEventId"), "names the key: {e}");
        let e = query("/x?last_event_id=-1", None).expect_err("negative");
        assert!(e.contains("last_event_id"), "names the key: {e}");
        let e = query("/x", Some("abc")).expect_err("bad header");
        assert!(e.contains("Last-Event-ID"), "names the header: {e}");
        let e = query("/x?token=a&token=b", None).expect_err("twice");
        assert!(e.contains("twice"), "duplicate: {e}");
    }

    #[test]
    fn frames_carry_id_event_and_one_data_line() {
        let m = ServerMessage::Delta {
            id: "req_1".into(),
            text: "a\nb".into(),
        };
        let mut out = Vec::new();
        write_frame(&mut out, Some(4), m.name(), m.to_json().as_bytes());
        assert_eq!(
            &out[..],
            b"id: 4\nevent: delta\ndata: {\"type\":\"delta\",\"id\":\"req_1\",\"text\":\"a\\nb\"}\n\n",
            "golden frame"
        );
    }
}
