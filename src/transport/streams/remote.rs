//! Reads and cancels of a stream this instance does not hold, through its shared copy in
//! Redis (`[state] redis_url`): the same answers as a local stream (SSE: 204/400/403/404/410;
//! WebSocket: the same refusal codes), and "unavailable" (SSE: `503` with `Retry-After`) when
//! Redis does not answer (the stream may exist elsewhere).

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::http::{bad_request, refused_response};
use super::Refused;
use crate::shared::replay::{Lookup, Record, RemoteReader, SharedReplay};
use crate::transport::error::ErrorReply;
use crate::transport::native_sse::error_response;
use crate::transport::replay::Resume;
use crate::types::ErrorClass;

/// A reader ahead of Redis may only be ahead of the owner's pending writes: look again this
/// many times, this far apart, before calling its position bogus.
const AHEAD_RECHECKS: u32 = 10;
const AHEAD_RECHECK_EVERY: Duration = Duration::from_millis(50);

/// Why a stream another instance may run cannot be read or cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    Refused(Refused),
    /// Redis did not answer: whether the stream exists is unknown.
    Unreachable,
}

/// Where a resume of remote stream `id` from `after` (the last seq the reader has) stands,
/// with the stream's record: the answers a local stream's `find` and `check_resume` give.
/// A position past Redis's newest event is looked at again for a while first, as the
/// owner's latest writes may still be queued.
pub async fn check_resume(
    remote: &SharedReplay,
    id: &str,
    token: Option<&str>,
    after: u64,
) -> Result<(Record, Resume), Denied> {
    let mut record = find(remote, id, token).await?;
    for _ in 0..AHEAD_RECHECKS {
        if record.terminal.is_some() || after <= record.newest() {
            break;
        }
        tokio::time::sleep(AHEAD_RECHECK_EVERY).await;
        record = find(remote, id, token).await?;
    }
    let resume = match record.terminal {
        // Its events expired (the record outlives them): gone whatever the position, as
        // on the owner, which forgets the whole stream at once.
        Some(_) if record.first.is_none() => return Err(Denied::Refused(Refused::Gone)),
        Some(terminal) if after == terminal => Resume::Finished,
        _ if after > record.newest() => Resume::Ahead { last: record.newest() },
        _ => match record.first {
            Some(first) if after.saturating_add(1) < first => Resume::Gap { first },
            _ => Resume::Ok,
        },
    };
    Ok((record, resume))
}

/// A reader of stream `id` after `after`, with the stream's request id; or the response
/// that refuses it. (A gap is the reader's first answer, as for a local stream.)
pub(super) async fn open_reader(
    remote: &SharedReplay,
    id: &str,
    token: Option<&str>,
    after: u64,
) -> Result<(RemoteReader, String), Response> {
    let (record, resume) = check_resume(remote, id, token, after).await.map_err(denied_response)?;
    match resume {
        Resume::Finished => Err(StatusCode::NO_CONTENT.into_response()),
        Resume::Ahead { last } => Err(bad_request(format!(
            "last_event_id {after} is beyond this stream's newest event ({last})"
        ))),
        Resume::Ok | Resume::Gap { .. } => Ok((remote.reader(id, after), record.request_id)),
    }
}

/// Asks the owner of stream `id` to cancel it, once the token is checked; nothing to do when
/// it already ended.
pub async fn cancel_checked(remote: &SharedReplay, id: &str, token: Option<&str>) -> Result<(), Denied> {
    let record = find(remote, id, token).await?;
    if record.terminal.is_none() && !remote.cancel(id).await {
        return Err(Denied::Unreachable);
    }
    Ok(())
}

/// `DELETE` of a stream another instance runs: flags the cancel for its owner.
pub(super) async fn cancel(remote: &SharedReplay, id: &str, token: Option<&str>) -> Response {
    match cancel_checked(remote, id, token).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(denied) => denied_response(denied),
    }
}

async fn find(remote: &SharedReplay, id: &str, token: Option<&str>) -> Result<Record, Denied> {
    match remote.lookup(id).await {
        Lookup::Unreachable => Err(Denied::Unreachable),
        Lookup::NotFound => Err(Denied::Refused(Refused::NotFound)),
        Lookup::Found(record) => match token {
            Some(t) if record.token_matches(t) => Ok(record),
            _ => Err(Denied::Refused(Refused::Forbidden)),
        },
    }
}

fn denied_response(denied: Denied) -> Response {
    match denied {
        Denied::Refused(refused) => refused_response(refused),
        Denied::Unreachable => error_response(&unreachable(), ""),
    }
}

/// The error for a stream not held here while Redis does not answer: retry shortly.
pub fn unreachable() -> ErrorReply {
    ErrorReply {
        class: ErrorClass::Unavailable,
        message: "this stream is not held by this instance and shared state is unreachable; retry shortly".into(),
        ..ErrorReply::busy()
    }
}
