//! Reads and cancels of a stream this instance does not hold, through its shared copy in
//! Redis (`[state] redis_url`): the same statuses as a local stream (204/400/403/404/410),
//! and `503` with `Retry-After` when Redis does not answer (the stream may exist elsewhere).

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::http::{bad_request, refused_response};
use super::Refused;
use crate::shared::replay::{Lookup, Record, RemoteReader, SharedReplay};
use crate::transport::error::ErrorReply;
use crate::transport::native_sse::error_response;
use crate::types::ErrorClass;

/// A reader ahead of Redis may only be ahead of the owner's pending writes: look again this
/// many times, this far apart, before calling its position bogus.
const AHEAD_RECHECKS: u32 = 10;
const AHEAD_RECHECK_EVERY: Duration = Duration::from_millis(50);

/// A reader of stream `id` after `after`, with the stream's request id; or the response
/// that refuses it.
pub(super) async fn open_reader(
    remote: &SharedReplay,
    id: &str,
    token: Option<&str>,
    after: u64,
) -> Result<(RemoteReader, String), Response> {
    let mut record = find(remote, id, token).await?;
    for _ in 0..AHEAD_RECHECKS {
        if record.terminal.is_some() || after <= record.newest() {
            break;
        }
        tokio::time::sleep(AHEAD_RECHECK_EVERY).await;
        record = find(remote, id, token).await?;
    }
    match record.terminal {
        Some(terminal) if after == terminal => return Err(StatusCode::NO_CONTENT.into_response()),
        Some(_) if record.first.is_none() => return Err(refused_response(Refused::Gone)),
        _ => {}
    }
    if after > record.newest() {
        let last = record.newest();
        return Err(bad_request(format!(
            "last_event_id {after} is beyond this stream's newest event ({last})"
        )));
    }
    Ok((remote.reader(id, after), record.request_id))
}

/// `DELETE` of a stream another instance runs: flags the cancel for its owner.
pub(super) async fn cancel(remote: &SharedReplay, id: &str, token: Option<&str>) -> Response {
    let record = match find(remote, id, token).await {
        Ok(record) => record,
        Err(response) => return response,
    };
    if record.terminal.is_none() && !remote.cancel(id).await {
        return unreachable();
    }
    StatusCode::NO_CONTENT.into_response()
}

async fn find(remote: &SharedReplay, id: &str, token: Option<&str>) -> Result<Record, Response> {
    match remote.lookup(id).await {
        Lookup::Unreachable => Err(unreachable()),
        Lookup::NotFound => Err(refused_response(Refused::NotFound)),
        Lookup::Found(record) => match token {
            Some(t) if record.token_matches(t) => Ok(record),
            _ => Err(refused_response(Refused::Forbidden)),
        },
    }
}

fn unreachable() -> Response {
    let reply = ErrorReply {
        class: ErrorClass::Unavailable,
        message: "this stream is not held by this instance and shared state is unreachable; retry shortly".into(),
        ..ErrorReply::busy()
    };
    error_response(&reply, "")
}
