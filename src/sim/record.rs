//! The request log: one `SimRecord` per request, kept in arrival order and bounded, and the
//! guard inside every response body that records how the response ended (including the
//! client closing the connection, which is how tests prove cancellation).

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;
use tokio::time::Instant;

use super::continuation::PrefillOutcome;

/// Records kept; older ones are forgotten first.
const LOG_CAPACITY: usize = 100_000;

/// Request bodies kept: those of the newest records only, each up to `MAX_KEPT_BODY` bytes,
/// so what tests read of the requests a route received stays bounded under load.
const BODIES_KEPT: usize = 256;
const MAX_KEPT_BODY: usize = 1 << 20;

/// How the simulator ended one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SimEnd {
    /// The whole answer and the wire's terminal signal were written.
    Completed,
    /// The client dropped the response before it was finished.
    ClientClosed,
    /// The simulator aborted the connection on purpose (`drop_after_tokens`).
    Dropped,
    /// A non-2xx status with the wire's error body.
    ErrorStatus,
    /// The wire's in-band error event was written and the body ended.
    InBandError,
    /// The body ended cleanly without the terminal signal: `eof_before_finish`,
    /// `missing_done`, or after an injected malformed, invalid UTF-8 or huge line.
    Truncated,
}

/// What the simulator saw and did for one request.
#[derive(Debug, Clone, Serialize)]
pub struct SimRecord {
    /// Arrival order across the whole simulator, from 0.
    pub id: u64,
    pub scenario: String,
    /// "openai" or "anthropic".
    pub wire: &'static str,
    /// The request's `x-request-id` header.
    pub request_id: Option<String>,
    /// HTTP status sent.
    pub status: u16,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// The TTFT drawn for this request, in ms.
    pub planned_ttft_ms: f64,
    /// Milliseconds since the simulator started (tokio clock, so paused time works).
    pub accepted_at_ms: f64,
    /// When the first content token (text, refusal text or tool-call start) was written.
    pub first_token_at_ms: Option<f64>,
    pub ended_at_ms: Option<f64>,
    /// `None` while the response is still being written.
    pub end: Option<SimEnd>,
    /// Content tokens written (text tokens or tool-call argument fragments).
    pub tokens_sent: u32,
    /// Characters of the request's final assistant message (its prefill), 0 without one.
    pub prefill_chars: usize,
    /// The prefill was honoured and a prefix of the answer, so only the remainder was sent
    /// (`continuation == Some(PrefillOutcome::Exact)`).
    pub continued: bool,
    /// What the upstream did with the prefill; `None` without one, or when an injected
    /// status error answered first.
    pub continuation: Option<PrefillOutcome>,
    /// The request body as received (the newest `BODIES_KEPT` records, bodies up to 1 MiB;
    /// `None` otherwise), and the `anthropic-beta` header: what tests check a route got.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "shared_text")]
    pub body: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anthropic_beta: Option<String>,
    #[serde(skip)]
    pub accepted_at: Instant,
    #[serde(skip)]
    pub first_token_at: Option<Instant>,
    #[serde(skip)]
    pub ended_at: Option<Instant>,
}

fn shared_text<S: serde::Serializer>(text: &Option<Arc<str>>, s: S) -> Result<S::Ok, S::Error> {
    text.as_deref().serialize(s)
}

/// The simulator's clock: tokio time since start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SimClock {
    started: Instant,
}

impl SimClock {
    pub fn start() -> Self {
        SimClock {
            started: Instant::now(),
        }
    }

    pub fn ms(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.started).as_secs_f64() * 1000.0
    }
}

/// The bounded, shared request log.
#[derive(Debug)]
pub(crate) struct SimLog {
    clock: SimClock,
    inner: Mutex<LogInner>,
}

#[derive(Debug, Default)]
struct LogInner {
    next_id: u64,
    records: VecDeque<SimRecord>,
}

/// What a handler knows about a request when it arrives.
pub(crate) struct Arrival<'a> {
    pub scenario: String,
    pub wire: &'static str,
    pub request_id: Option<String>,
    pub stream: bool,
    pub accepted_at: Instant,
    pub body: &'a [u8],
    pub anthropic_beta: Option<String>,
}

impl SimLog {
    pub fn new(clock: SimClock) -> Self {
        SimLog {
            clock,
            inner: Mutex::new(LogInner::default()),
        }
    }

    pub fn clock(&self) -> SimClock {
        self.clock
    }

    /// Adds a record for a new request and returns its id.
    pub fn arrive(&self, arrival: Arrival) -> u64 {
        let mut inner = self.inner.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        if inner.records.len() >= LOG_CAPACITY {
            inner.records.pop_front();
        }
        let len = inner.records.len();
        if let Some(old) = len.checked_sub(BODIES_KEPT).and_then(|i| inner.records.get_mut(i)) {
            old.body = None;
        }
        let body =
            (arrival.body.len() <= MAX_KEPT_BODY).then(|| Arc::from(String::from_utf8_lossy(arrival.body).as_ref()));
        inner.records.push_back(SimRecord {
            id,
            scenario: arrival.scenario,
            wire: arrival.wire,
            request_id: arrival.request_id,
            status: 200,
            stream: arrival.stream,
            planned_ttft_ms: 0.0,
            accepted_at_ms: self.clock.ms(arrival.accepted_at),
            first_token_at_ms: None,
            ended_at_ms: None,
            end: None,
            tokens_sent: 0,
            prefill_chars: 0,
            continued: false,
            continuation: None,
            body,
            anthropic_beta: arrival.anthropic_beta,
            accepted_at: arrival.accepted_at,
            first_token_at: None,
            ended_at: None,
        });
        id
    }

    /// Changes one record in place (a no-op once it was evicted).
    pub fn update(&self, id: u64, change: impl FnOnce(&mut SimRecord)) {
        let mut inner = self.inner.lock();
        let Some(first) = inner.records.front().map(|r| r.id) else {
            return;
        };
        let Some(offset) = id.checked_sub(first) else {
            return;
        };
        if let Some(record) = usize::try_from(offset).ok().and_then(|i| inner.records.get_mut(i)) {
            change(record);
        }
    }

    pub fn snapshot(&self) -> Vec<SimRecord> {
        self.inner.lock().records.iter().cloned().collect()
    }

    pub fn clear(&self) {
        self.inner.lock().records.clear();
    }

    fn end(&self, id: u64, end: SimEnd) {
        let now = Instant::now();
        let at_ms = self.clock.ms(now);
        self.update(id, |r| {
            r.end = Some(end);
            r.ended_at = Some(now);
            r.ended_at_ms = Some(at_ms);
        });
    }
}

/// Lives inside a response (body stream or handler). Records tokens as they are written and
/// the way the response ended; dropped before `finish` means the client closed it.
pub(crate) struct RecordGuard {
    log: Arc<SimLog>,
    id: u64,
    first_token_seen: bool,
    finished: bool,
}

impl RecordGuard {
    pub fn new(log: Arc<SimLog>, id: u64) -> Self {
        RecordGuard {
            log,
            id,
            first_token_seen: false,
            finished: false,
        }
    }

    /// The first content token is about to be written.
    pub fn first_token(&mut self) {
        if self.first_token_seen {
            return;
        }
        self.first_token_seen = true;
        let now = Instant::now();
        let at_ms = self.log.clock().ms(now);
        self.log.update(self.id, |r| {
            r.first_token_at = Some(now);
            r.first_token_at_ms = Some(at_ms);
        });
    }

    /// One more content token is about to be written.
    pub fn token(&mut self) {
        self.log.update(self.id, |r| r.tokens_sent += 1);
    }

    pub fn finish(&mut self, end: SimEnd) {
        if !self.finished {
            self.finished = true;
            self.log.end(self.id, end);
        }
    }
}

impl Drop for RecordGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.log.end(self.id, SimEnd::ClientClosed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival() -> Arrival<'static> {
        Arrival {
            scenario: "s".to_owned(),
            wire: "openai",
            request_id: None,
            stream: true,
            accepted_at: Instant::now(),
            body: b"{}",
            anthropic_beta: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_an_unfinished_guard_records_client_closed() {
        let log = Arc::new(SimLog::new(SimClock::start()));
        let id = log.arrive(arrival());
        let mut guard = RecordGuard::new(log.clone(), id);
        guard.first_token();
        guard.token();
        drop(guard);
        let record = &log.snapshot()[0];
        assert_eq!(record.end, Some(SimEnd::ClientClosed), "end");
        assert_eq!(record.tokens_sent, 1, "tokens");
        assert!(record.first_token_at.is_some(), "first token time");
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_guard_keeps_its_end() {
        let log = Arc::new(SimLog::new(SimClock::start()));
        let id = log.arrive(arrival());
        let mut guard = RecordGuard::new(log.clone(), id);
        guard.finish(SimEnd::Completed);
        drop(guard);
        assert_eq!(log.snapshot()[0].end, Some(SimEnd::Completed), "end");
    }

    #[tokio::test(start_paused = true)]
    async fn updates_after_clear_are_ignored_and_ids_keep_counting() {
        let log = Arc::new(SimLog::new(SimClock::start()));
        let old = log.arrive(arrival());
        log.clear();
        let new = log.arrive(arrival());
        log.update(old, |r| r.tokens_sent = 99);
        let records = log.snapshot();
        assert_eq!(records.len(), 1, "one record after clear");
        assert_eq!(records[0].id, new, "ids keep counting");
        assert_eq!(records[0].tokens_sent, 0, "stale update must not land");
    }
}
