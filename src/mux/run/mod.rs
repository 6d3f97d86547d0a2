//! One request's life in the mux: race to the first content token (hedging the primary),
//! commit, stream the winner, and apply the mid-stream policy when it fails.
//!
//! The request is a state machine (`State`): awaiting its first token, streaming, recovering,
//! finished. The `Run` holds what the states share; its parts live beside it:
//! - `first_token`: the race to the first content token, the hedge, the commit;
//! - `streaming`: the committed attempt through the seam, the stall limit, the stream cap;
//! - `launch`: starting the next attempt (budgets, minimum useful time, same-route retry);
//! - `recovery`: the mid-stream policies after commit;
//! - `outcome`: failures, the error a client gets, the L3 cache, the decision record;
//! - `rotation`: route changes and the layer each moved, the rotation metrics;
//! - `repair`: the one repair attempt on the same route after invalid output.

mod after_send;
mod first_token;
mod launch;
mod outcome;
mod recovery;
mod repair;
mod rotation;
mod routes;
mod streaming;
mod usage;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use super::attempt::{Attempt, AttemptEvent};
use super::hedge::NoHedge;
use super::seam::Seam;
use super::tool_calls::Gates;
use super::transcript::Transcript;
use super::Mux;
use crate::config::RouteConfig;
use crate::types::{
    ChatRequest, Envelope, ErrorEvent, EventStream, FinishReason, Plan, PrefillConvention, RequestCtx, ResponseType,
    StreamEvent, Usage,
};

/// Where one request is in its life. Each state's step is a plain async function that queues
/// the client's events and returns the next state; the `.await`s inside the steps are the
/// only cancellation points, and dropping the request's stream there drops the state with
/// every attempt it holds (their upstream connections close).
enum State {
    /// Racing attempts to the first content token, hedging the primary (`first_token`).
    AwaitingFirstToken,
    /// Forwarding the committed attempt through the seam (`streaming`).
    Streaming(streaming::Streaming),
    /// Applying the mid-stream policy (`recovery`).
    Recovering(Recovering),
    /// The queued events are the last.
    Finished,
}

/// Why the committed answer needs a new attempt.
enum Recovering {
    /// The committed attempt on this route failed (it is already closed).
    Failed(Arc<str>),
    /// This continuation could not be told from a restart: drop it and restart.
    StartOver(Attempt),
}

pub fn stream(
    mux: Arc<Mux>,
    req: Arc<ChatRequest>,
    ctx: RequestCtx,
    plan: Plan,
    gates: Gates,
    guard: impl Send + 'static,
) -> EventStream {
    Box::pin(async_stream::stream! {
        // Moved into the stream: dropped when it ends or is dropped unfinished.
        let _guard = guard;
        let state_hash = Arc::new(OnceLock::new());
        let mut deferred = Some(after_send::StateHash::new(Arc::clone(&req), Arc::clone(&state_hash)));
        let mut run = Run::new(mux, req, ctx, plan, gates, state_hash);
        // Events for the client, queued by a step and sent before the next one runs.
        let mut out = Vec::new();
        let mut state = State::AwaitingFirstToken;
        // The client TTFT sample, from the commit's step on: recorded once the step after it
        // has sent its events (the first token is that step's first event), or when the stream
        // is dropped before (the pump drops it at `Finish`, a client may go away).
        let mut ttft = None;
        loop {
            state = match state {
                // The state hash waits until the first upstream request is on its way.
                State::AwaitingFirstToken => match deferred.take() {
                    Some(hash) => after_send::after_first_pending(run.begin(&mut out), hash).await,
                    None => run.begin(&mut out).await,
                },
                State::Streaming(s) => run.stream_step(s, &mut out).await,
                // Boxed: a recovery is rare and its future the largest of the steps (about
                // 1.7 KiB), which every stream would otherwise hold inline for its whole life.
                State::Recovering(r) => Box::pin(run.recover_step(r, &mut out)).await,
                State::Finished => State::Finished,
            };
            let committed_now = match run.ttft_sample.take() {
                Some(sample) => {
                    let histogram = run.mux.metrics.client_ttft().clone();
                    ttft = Some(after_send::Later::new(move || histogram.record(sample)));
                    true
                }
                None => false,
            };
            for event in out.drain(..) {
                yield event;
            }
            if !committed_now && ttft.is_some() {
                tokio::task::yield_now().await;
                drop(ttft.take());
            }
            if matches!(state, State::Finished) {
                return;
            }
        }
    })
}

/// What a recovery decided.
enum Recovery {
    Restart {
        attempt: Attempt,
        first: AttemptEvent,
        reset: Option<String>,
    },
    Continue {
        attempt: Attempt,
        first: AttemptEvent,
    },
    Truncate,
    /// The answer was already complete (its tool calls were sent): finish with this reason.
    Done(FinishReason),
    /// Boxed: it is twice the size of the next variant, and it passes on boxed.
    Fail(Box<ErrorEvent>),
}

struct Run {
    mux: Arc<Mux>,
    req: Arc<ChatRequest>,
    ctx: RequestCtx,
    /// The plan's routes and what happened to each in this request.
    routes: routes::Routes,
    started: Instant,
    deadline: Instant,
    /// When the committed answer must end (`server.max_stream_ms` after its first commit).
    capped_at: Instant,
    env: Envelope,
    attempts: u32,
    /// Attempts that count toward `limits.max_attempts` (a same-route retry does not).
    budgeted_attempts: u32,
    recoveries: u32,
    /// Why the request may not be hedged, if it may not. `ClientOff` and `SideEffecting` also
    /// mean no second upstream may see it at all (no shadow): see `side_effecting`.
    hedge: Result<(), NoHedge>,
    rtype: ResponseType,
    transcript: Transcript,
    /// The committed attempt's usage as its route reported it (`usage` bills it when the
    /// attempt is over).
    usage: Option<Usage>,
    /// What every attempt that streamed and is over was billed (`usage`).
    billed: Vec<crate::types::AttemptUsage>,
    /// Output tokens of the answer the current attempt continues (its prefill: what the client
    /// got from cut attempts), counted by the tokenizer; 0 for a first answer or a restart.
    carried: u32,
    /// Retry-After hints from failed attempts.
    retry_hints: Vec<Duration>,
    /// The plan as made (candidates, ranking with score breakdowns, exclusions, lease): the
    /// decision record logs it.
    plan: Plan,
    /// Tool calls sent, kept only for the answer cache.
    calls: Vec<crate::types::ToolCall>,
    /// Routes already retried once on the same rung.
    retried: std::collections::HashSet<String>,
    /// Moves between routes within this request (`rotation`).
    moves: rotation::Moves,
    /// The route whose text the client received last: what a continuation's `route_switch`
    /// says the answer moved from.
    voiced: Option<Arc<str>>,
    /// The repair attempt, once it was used (`repair`).
    repair: repair::RepairState,
    /// The request's quality gates, compiled once for all its attempts.
    gates: Gates,
    /// The state hash, once computed (`after_send`); `env` takes it before its first event.
    state_hash: Arc<OnceLock<Box<str>>>,
    /// The client's TTFT in seconds, set at the commit, recorded after the first flush.
    ttft_sample: Option<f64>,
}

impl Run {
    fn new(
        mux: Arc<Mux>,
        req: Arc<ChatRequest>,
        ctx: RequestCtx,
        plan: Plan,
        gates: Gates,
        state_hash: Arc<OnceLock<Box<str>>>,
    ) -> Self {
        let started = Instant::now();
        let deadline = started + ctx.deadline.unwrap_or(mux.config.server.deadline);
        let rtype = ctx.response_type.unwrap_or_else(|| req.detected_response_type());
        let hedge = launch::hedge_allowed(&mux, &ctx, &plan);
        mux.budget_deposit(started);
        mux.retry_deposit(started);
        let env = Envelope {
            request_id: ctx.request_id.clone(),
            lease: plan.lease.clone(),
            ..Envelope::default()
        };
        crate::telemetry::rotation::policy_rejections(&plan.excluded);
        Run {
            routes: routes::Routes::new(
                plan.candidates.clone(),
                plan.excluded.iter().map(|e| (e.route.clone(), e.reason.clone())),
                started,
            ),
            calls: Vec::new(),
            started,
            deadline,
            capped_at: deadline + mux.config.server.max_stream,
            env,
            attempts: 0,
            budgeted_attempts: 0,
            recoveries: 0,
            hedge,
            rtype,
            transcript: Transcript::default(),
            usage: None,
            billed: Vec::new(),
            carried: 0,
            retry_hints: Vec::new(),
            retried: Default::default(),
            moves: Default::default(),
            voiced: None,
            repair: Default::default(),
            gates,
            state_hash,
            ttft_sample: None,
            plan,
            mux,
            req,
            ctx,
        }
    }

    /// Puts the state hash in the envelope, computing it now if `after_send` has not.
    fn settle_state_hash(&mut self) {
        if self.env.state_hash.is_empty() {
            let req = &self.req;
            self.env.state_hash = self
                .state_hash
                .get_or_init(|| crate::types::state_hash(req).into())
                .clone();
        }
    }

    /// The first state: race to the first content token. The commit sends `Start`; no route
    /// at all ends the request with its error, or with a cached answer (L3) when one may stand
    /// in.
    async fn begin(&mut self, out: &mut Vec<StreamEvent>) -> State {
        let first = self.first_token(true, None).await;
        self.settle_state_hash();
        match first {
            Ok((cur, first)) => {
                self.capped_at = Instant::now() + self.mux.config.server.max_stream;
                out.push(StreamEvent::Start(Box::new(self.env.clone())));
                let seam = self.first_seam(&cur.route);
                State::Streaming(self.streaming(cur, first, seam))
            }
            Err(e) => {
                // L3: a cached complete answer rather than an error, when no generating route
                // could serve and the failure was not the request's own fault.
                match self.cached_answer(&e) {
                    Some(answer) => out.extend(self.serve_cached(answer)),
                    None => {
                        self.log_outcome(e.class.as_str());
                        out.push(StreamEvent::Error(Box::new(e)));
                    }
                }
                State::Finished
            }
        }
    }

    /// May the request have side effects, so that no second upstream may see it? The hedge
    /// decision checks side effects before anything else turns hedging off, so it says.
    fn side_effecting(&self) -> bool {
        matches!(self.hedge, Err(NoHedge::ClientOff | NoHedge::SideEffecting))
    }

    /// The first attempt's seam: it passes everything, except on the Anthropic wire after a
    /// client's own prefill that ended in whitespace. The adapter cut that whitespace (the
    /// Messages API refuses it), so the answer's re-emission of it is dropped: the client,
    /// which holds its prefill, would otherwise get it twice.
    fn first_seam(&self, route: &str) -> Seam {
        let anthropic = self
            .route_config(route)
            .is_some_and(|r| r.wire == crate::config::Wire::Anthropic);
        let own = self.req.assistant_prefill().filter(|_| anthropic).unwrap_or_default();
        match PrefillConvention::Anthropic.withheld(&own) {
            "" => Seam::Pass,
            cut => Seam::Trim { rest: cut.to_string() },
        }
    }

    fn route_config(&self, name: &str) -> Option<&RouteConfig> {
        self.mux.config.route(name)
    }

    fn stall_limit(&self, route: &str) -> Duration {
        let configured = self
            .route_config(route)
            .map_or(Duration::from_secs(10), |r| r.stall_timeout);
        self.mux.health.stall_limit(route, configured, Instant::now())
    }

    fn since_start(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.started).as_millis() as u64
    }
}
