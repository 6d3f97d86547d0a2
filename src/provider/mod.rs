//! Provider adapters: translate a `ChatRequest` into an upstream's wire format and its stream
//! back into neutral `Delta`s, classifying every failure on the way.
//!
//! Contract of a `DeltaStream`: it yields deltas until the upstream's terminal signal
//! (`Delta::Finish`, possibly followed by one `Delta::Usage`) and then ends. Any failure
//! (transport error, in-band error event, malformed event, EOF before the terminal signal)
//! is yielded once as `Err` and the stream ends. Dropping the stream closes the upstream
//! connection.
//!
//! After the finish signal the rest is optional: many OpenAI-compatible servers never send
//! `[DONE]`, so a stream ends as soon as its usage arrives, at its terminal marker, at EOF,
//! or `FINISH_GRACE` after the finish signal, whichever comes first (events after the
//! finish do not extend the grace). EOF *before* the finish signal is a `Protocol` error
//! (T11).

pub mod anthropic;
mod client;
mod error;
mod h1_pool;
mod h2_body;
mod h2_pool;
mod http;
mod lanes;
pub mod openai;
mod passthrough;
mod proxy;
mod retry_after;
mod scrub;
mod settings;
pub mod sse;
#[cfg(test)]
pub(crate) mod testkit;
pub(crate) mod wire_json;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};

pub use anthropic::AnthropicProvider;
pub use client::{http_client, HttpClient, CONNECT_TIMEOUT, POOL_IDLE_TIMEOUT, POOL_MAX_IDLE_PER_HOST};
pub use error::{
    classify_body, classify_in_band, classify_response, classify_status, classify_transport, redact, register_secret,
    Blame, ErrorClass, ProviderError, MAX_ERROR_BODY_BYTES, MIN_SECRET_CHARS,
};
pub(crate) use h2_pool::ConnectFailed;
pub use lanes::MAX_LANES;
pub use openai::OpenAiProvider;
pub use retry_after::retry_after;
pub use settings::DEFAULT_STREAMS_PER_CONNECTION;

use crate::types::{ChatRequest, FinishReason, Usage};
use sse::{SseError, SseEvent, SseLimits};

/// One piece of an upstream answer, before the mux assembles or commits anything.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    /// Non-empty answer text (role-only and empty deltas are never emitted, T12).
    Text(String),
    /// The route's reasoning (never empty text).
    Thinking(crate::types::Thinking),
    /// A field of the answer tailcut carries without reading, said before the text it
    /// belongs to. Boxed, as `ToolFragment` is.
    Extra(Box<crate::types::Extra>),
    /// A fragment of a tool call. `id`/`name` arrive only on a call's first fragment (T1);
    /// `index` is the only key that identifies the call (T3). Boxed: it is three times the
    /// size of the other variants, and every text delta would carry its size.
    ToolFragment(Box<ToolFragment>),
    /// An explicit end of one tool call (Anthropic `content_block_stop`, T6).
    ToolEnd {
        index: u32,
    },
    Usage(Usage),
    /// The upstream's terminal signal for the answer.
    Finish(FinishReason),
}

impl Delta {
    /// A tool-call fragment, boxed.
    pub fn tool(fragment: ToolFragment) -> Delta {
        Delta::ToolFragment(Box::new(fragment))
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolFragment {
    pub index: u32,
    pub id: Option<String>,
    pub name: Option<String>,
    pub arguments: String,
}

pub type DeltaStream = Pin<Box<dyn Stream<Item = Result<Delta, ProviderError>> + Send>>;

/// What the mux hands an adapter for one attempt.
#[derive(Debug, Clone)]
pub struct UpstreamRequest {
    pub chat: Arc<ChatRequest>,
    /// For the `continue` policy: the partial answer the request ends with, as the final
    /// assistant message marked by the route's convention (never an instruction to continue).
    pub prefill: Option<crate::types::Prefill>,
    /// Correlates upstream logs with ours (sent as `x-request-id`).
    pub request_id: String,
}

/// An upstream that can stream an answer. One instance per route.
pub trait Provider: Send + Sync + 'static {
    /// Opens the upstream stream. Resolves once the upstream accepted the request (2xx
    /// response headers); a non-2xx answer resolves to a classified `Err`.
    fn open(&self, req: UpstreamRequest) -> BoxFuture<'static, Result<DeltaStream, ProviderError>>;
}

pub type SharedProvider = Arc<dyn Provider>;

/// How long a stream may go on after its finish signal (for trailing usage or `[DONE]`)
/// before it counts as ended; counted from the finish, never restarted.
pub(crate) const FINISH_GRACE: Duration = Duration::from_secs(1);

/// What a wire decoder says after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    More,
    /// The terminal signal arrived: the stream is over.
    End,
}

/// One upstream wire format's per-answer state machine: SSE events in, deltas out.
pub(crate) trait WireDecoder: Send + 'static {
    fn on_event(&mut self, event: SseEvent, out: &mut Vec<Delta>) -> Result<Progress, ProviderError>;
    /// The finish signal was seen; anything after it (usage, a terminal marker) is optional.
    fn finished(&self) -> bool;
    /// The body ended (EOF, a failure after finish, or the grace period): emit what is still
    /// owed, or fail if the answer never finished.
    fn on_end(&mut self, out: &mut Vec<Delta>) -> Result<(), ProviderError>;
}

/// Runs a wire decoder over an SSE body. Owns the body, so dropping the returned stream
/// closes the upstream connection.
pub(crate) fn drive<S, E, D>(body: S, mut decoder: D) -> DeltaStream
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
    D: WireDecoder,
{
    Box::pin(async_stream::stream! {
        // Boxed, so what is left of an answered body can be handed to `finish_body`.
        let mut events = Box::pin(sse::sse_events(body, SseLimits::default()));
        let mut out = Vec::new();
        // Armed once, at the finish signal: later events (keep-alives, pings) must not
        // push it back, or an upstream that keeps talking would hold the attempt forever.
        let mut grace_ends: Option<tokio::time::Instant> = None;
        loop {
            let next = if decoder.finished() {
                let ends = *grace_ends.get_or_insert_with(|| tokio::time::Instant::now() + FINISH_GRACE);
                tokio::time::timeout_at(ends, events.next()).await.ok().flatten()
            } else {
                events.next().await
            };
            let failure = match next {
                Some(Ok(event)) => match decoder.on_event(event, &mut out) {
                    Ok(progress) => {
                        for delta in out.drain(..) {
                            yield Ok(delta);
                        }
                        if progress == Progress::End {
                            finish_body(events);
                            return;
                        }
                        continue;
                    }
                    Err(e) => Some(e),
                },
                Some(Err(e)) => Some(sse_failure(e)),
                None => None,
            };
            for delta in out.drain(..) {
                yield Ok(delta);
            }
            if let Some(e) = failure {
                if !decoder.finished() {
                    yield Err(e);
                    return;
                }
                tracing::debug!(error = %e, "upstream failed after its finish signal; answer kept");
            }
            let end = decoder.on_end(&mut out);
            for delta in out.drain(..) {
                yield Ok(delta);
            }
            if let Err(e) = end {
                yield Err(e);
            }
            return;
        }
    })
}

/// Events read past the terminal signal, at most, so an answered body's connection can go
/// back to the pool: its end (and a trailing `[DONE]` or usage) is all that should be left.
const DRAIN_EVENTS: usize = 4;

/// How long the rest of an answered body is waited for, in the background, at most.
pub(crate) const DRAIN_FOR: Duration = Duration::from_millis(250);

/// Reads what is left of a body whose answer is complete, so its connection returns to the
/// pool: what is already buffered at once, the rest (usually the chunked body's last chunk, a
/// moment behind `[DONE]`) in a task of its own, bounded by `DRAIN_EVENTS` and `DRAIN_FOR`.
/// The reader never waits for it. A body dropped before its end closes its connection, and
/// then the next request to the upstream paid for a new TCP connection and connection task:
/// at concurrency 1, 1.8 spawned tasks a request.
fn finish_body<St>(mut events: Pin<Box<St>>)
where
    St: Stream<Item = Result<SseEvent, SseError>> + Send + ?Sized + 'static,
{
    for _ in 0..DRAIN_EVENTS {
        match events.next().now_or_never() {
            Some(Some(Ok(_))) => {}
            // Ended (the connection is back in the pool) or failed (it is not reusable).
            Some(_) => return,
            None => break,
        }
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let rest = async {
            for _ in 0..DRAIN_EVENTS {
                if !matches!(events.next().await, Some(Ok(_))) {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(DRAIN_FOR, rest).await;
    });
}

fn sse_failure(err: SseError) -> ProviderError {
    match err {
        SseError::Transport(inner) => classify_body(inner.as_ref()),
        other => ProviderError::new(ErrorClass::Protocol, format!("malformed upstream stream: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delta_stays_small() {
        // Every decoder pushes deltas into its buffer and every layer up to the mux moves
        // them by value: a large variant must be boxed.
        let size = std::mem::size_of::<Delta>();
        assert!(size <= 32, "Delta is {size} bytes; box the variant that grew");
    }
}
