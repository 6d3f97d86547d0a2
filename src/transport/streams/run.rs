//! The task behind one resumable stream: pulls the gateway's events into the replay buffer
//! whether or not anyone reads, stops on a cut or after `detached_cancel_ms` without a
//! reader, releases the stream permit at the end, and expires the stream
//! `keep_after_done_ms` later.

use std::sync::Arc;

use futures::StreamExt;
use tokio::time::{sleep_until, Instant};

use super::{Registry, Stop, Stream};
use crate::transport::error::ErrorReply;
use crate::transport::native::{ServerMessage, StreamCode};
use crate::types::EventStream;

/// How long a client told to retry after a drain should wait.
const DRAIN_RETRY_MS: u64 = 1_000;

pub(super) async fn run(
    registry: Arc<Registry>,
    stream: Arc<Stream>,
    mut events: EventStream,
    permit: impl Send + 'static,
) {
    let config = registry.config().clone();
    let mut readers = stream.readers.subscribe();
    let mut stop = stream.stop.subscribe();
    // A stop sent before this task first ran is already the current value, which
    // `subscribe` marks seen: look at it once before waiting for changes.
    stop.mark_changed();
    let mut detached_since = (*readers.borrow_and_update() == 0).then(Instant::now);
    let request_id = stream.request_id.clone();
    loop {
        let detach_at = detached_since.map(|t| t + config.detached_cancel);
        tokio::select! {
            biased;
            changed = stop.changed() => {
                let why = if changed.is_ok() { stop.borrow_and_update().clone() } else { None };
                if let Some(why) = why {
                    stream.record(stopped(&request_id, &stream.id, why));
                    break;
                }
            }
            changed = readers.changed() => {
                let attached = changed.is_ok() && *readers.borrow_and_update() > 0;
                detached_since = match (attached, detached_since) {
                    (true, _) => None,
                    (false, Some(since)) => Some(since),
                    (false, None) => Some(Instant::now()),
                };
            }
            _ = sleep_until(detach_at.unwrap_or_else(Instant::now)), if detach_at.is_some() => {
                let message = format!(
                    "no reader was attached for {} ms; the answer was cancelled",
                    config.detached_cancel.as_millis()
                );
                stream.record(ServerMessage::stream_error(Some(request_id.clone()), StreamCode::Detached, message));
                break;
            }
            event = events.next() => {
                let message = match event {
                    Some(event) => match ServerMessage::from_event(&request_id, event) {
                        Some((message, _)) => message,
                        None => continue,
                    },
                    None => ServerMessage::from_reply(
                        Some(request_id.clone()),
                        &ErrorReply::broken_stream("ended without a finish", None),
                    ),
                };
                let terminal = message.is_terminal();
                stream.record(message);
                if terminal {
                    break;
                }
            }
        }
    }
    // The upstream is closed and the slot freed now, not when the stream expires.
    drop(events);
    drop(permit);
    registry.finished(&stream.id);
    tokio::time::sleep(config.keep_after_done).await;
    registry.expire(&stream.id);
}

fn stopped(request_id: &str, stream_id: &str, why: Stop) -> ServerMessage {
    match why {
        Stop::Cancelled => ServerMessage::stream_error(
            Some(request_id.to_string()),
            StreamCode::Cancelled,
            "the stream was cancelled by its owner",
        ),
        Stop::Draining(reason) => {
            let mut m = ServerMessage::stream_error(Some(request_id.to_string()), StreamCode::Draining, reason);
            if let ServerMessage::Error {
                retry_after_ms, stream, ..
            } = &mut m
            {
                *retry_after_ms = Some(DRAIN_RETRY_MS);
                *stream = Some(stream_id.to_string());
            }
            m
        }
    }
}
