//! One request's life in the mux: race to the first content token (hedging the primary),
//! commit, stream the winner, and apply the mid-stream policy when it fails.
//!
//! The `Run` holds one request's state; its parts live beside it:
//! - `first_token`: the race to the first content token, the hedge, the commit;
//! - `launch`: starting the next attempt (budgets, minimum useful time, same-route retry);
//! - `recovery`: the mid-stream policies after commit;
//! - `outcome`: failures, the error a client gets, the L3 cache, the decision record.

mod first_token;
mod launch;
mod outcome;
mod recovery;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::attempt::{Attempt, AttemptEvent, Role};
use super::hedge::{HedgeTimer, NoHedge};
use super::midstream::{self, Seam, SeamOut};
use super::race::Race;
use super::transcript::Transcript;
use super::Mux;
use crate::config::{MidStreamPolicy, RouteConfig};
use crate::gateway::RequestCtx;
use crate::provider::{ErrorClass, ProviderError, UpstreamRequest};
use crate::router::{Candidate, Plan};
use crate::telemetry as t;
use crate::types::{
    ChatRequest, Envelope, ErrorEvent, EventStream, FailedAttempt, FinishReason, HedgeInfo, Level, ResponseType,
    StreamEvent, Usage,
};

pub fn stream(mux: Arc<Mux>, req: Arc<ChatRequest>, ctx: RequestCtx, plan: Plan) -> EventStream {
    Box::pin(async_stream::stream! {
        let mut run = Run::new(mux, req, ctx, plan);
        let (mut cur, first) = match run.first_token(true, None).await {
            Ok(won) => won,
            Err(e) => {
                // L3: a cached complete answer rather than an error, when no generating route
                // could serve and the failure was not the request's own fault.
                if let Some(answer) = run.cached_answer(&e) {
                    for event in run.serve_cached(answer) {
                        yield event;
                    }
                    return;
                }
                yield StreamEvent::Error(e);
                return;
            }
        };
        yield StreamEvent::Start(run.env.clone());
        let mut pending = Some(first);
        let mut seam = Seam::Pass;
        let mut last_token = Instant::now();
        // Computed once per attempt: it reads the route's gap histogram.
        let mut stall = run.stall_limit(&cur.route);
        let capped_at = last_token + run.mux.config.server.max_stream;
        loop {
            // The first event of an attempt comes from the race, not after a gap: it must not
            // enter the inter-token window (a zero gap would tighten every stall limit).
            let (ev, after_gap) = match pending.take() {
                Some(ev) => (ev, false),
                None => {
                    let ev = tokio::select! {
                        biased;
                        ev = cur.next_event() => ev.unwrap_or_else(|| AttemptEvent::Failed(
                            ProviderError::new(ErrorClass::Protocol, "attempt ended without an outcome"))),
                        _ = tokio::time::sleep_until(last_token + stall) => AttemptEvent::Failed(ProviderError::new(
                            ErrorClass::Timeout, format!("stalled: no token for {} ms", stall.as_millis()))),
                        _ = tokio::time::sleep_until(capped_at) => {
                            // Our own cap, not the route's failure: end honestly, blame no one.
                            let err = ProviderError::new(ErrorClass::Timeout, "answer exceeded the maximum stream duration");
                            run.record_abandoned(&mut cur, &err);
                            run.env.policy = Some(MidStreamPolicy::Truncate.as_str().into());
                            run.log_outcome("truncated");
                            yield StreamEvent::Finish { reason: FinishReason::Truncated, envelope: run.env.clone() };
                            return;
                        }
                    };
                    (ev, true)
                }
            };
            if matches!(ev, AttemptEvent::ToolCall(_) | AttemptEvent::Finished(_)) {
                // Whatever the seam still holds is settled before a tool call or the end.
                match run.close_seam(&mut seam) {
                    Err(Diverged) => {
                        yield run.diverged(&cur);
                        return;
                    }
                    Ok(Some(held)) => yield StreamEvent::TextDelta(held),
                    Ok(None) => {}
                }
            }
            match ev {
                AttemptEvent::Progress => last_token = Instant::now(),
                AttemptEvent::Text(text) => {
                    let now = Instant::now();
                    if after_gap {
                        run.mux.health.record_token_gap(&cur.route, now, now.saturating_duration_since(last_token));
                    }
                    last_token = now;
                    match seam.feed(&text) {
                        SeamOut::Emit(s) if !s.is_empty() => {
                            run.transcript.push_text(&s);
                            yield StreamEvent::TextDelta(s);
                        }
                        SeamOut::Emit(_) | SeamOut::Hold => {}
                        SeamOut::Diverged => {
                            yield run.diverged(&cur);
                            return;
                        }
                    }
                }
                AttemptEvent::ToolStarted => {
                    last_token = Instant::now();
                    run.transcript.tool_open = true;
                }
                AttemptEvent::ToolCall(call) => {
                    last_token = Instant::now();
                    run.transcript.tool_calls += 1;
                    run.transcript.tool_open = false;
                    if run.mux.config.cache.enabled {
                        run.calls.push(call.clone());
                    }
                    yield StreamEvent::ToolCall(call);
                }
                AttemptEvent::Usage(u) => run.usage = Some(u),
                AttemptEvent::Finished(reason) => {
                    cur.resolve(Ok(()));
                    run.remember(&cur.route, reason);
                    if run.req.include_usage {
                        if let Some(u) = run.usage {
                            yield StreamEvent::Usage(u);
                        }
                    }
                    run.log_outcome("completed");
                    yield StreamEvent::Finish { reason, envelope: run.env.clone() };
                    return;
                }
                AttemptEvent::Failed(err) => {
                    run.record_failure(&mut cur, &err);
                    metrics::counter!(t::MIDSTREAM_TOTAL, "class" => err.class.as_str()).increment(1);
                    // Close the failed upstream now, not when a recovery commits.
                    let failed_route = Arc::clone(&cur.route);
                    drop(std::mem::replace(&mut cur, Attempt::closed(&failed_route)));
                    match run.recover(&failed_route).await {
                        Recovery::Restart { attempt, first, reset } => {
                            if let Some(reason) = reset {
                                yield StreamEvent::Reset { reason };
                            }
                            seam = if run.transcript.visible() { Seam::swallow(&run.transcript.text) } else { Seam::Pass };
                            cur = attempt;
                            stall = run.stall_limit(&cur.route);
                            pending = Some(first);
                            last_token = Instant::now();
                        }
                        Recovery::Continue { attempt, first } => {
                            if run.ctx.dialect.can_reset() {
                                yield StreamEvent::RouteSwitch { from: failed_route.to_string(), to: attempt.route.to_string() };
                            }
                            seam = Seam::trim(&run.transcript.text);
                            cur = attempt;
                            stall = run.stall_limit(&cur.route);
                            pending = Some(first);
                            last_token = Instant::now();
                        }
                        Recovery::Done(reason) => {
                            if run.req.include_usage {
                                if let Some(u) = run.usage {
                                    yield StreamEvent::Usage(u);
                                }
                            }
                            run.log_outcome("completed");
                            yield StreamEvent::Finish { reason, envelope: run.env.clone() };
                            return;
                        }
                        Recovery::Truncate => {
                            run.log_outcome("truncated");
                            yield StreamEvent::Finish { reason: FinishReason::Truncated, envelope: run.env.clone() };
                            return;
                        }
                        Recovery::Fail(e) => {
                            yield StreamEvent::Error(e);
                            return;
                        }
                    }
                }
            }
        }
    })
}

/// A restart the client could not be told about did not reproduce what it was sent.
struct Diverged;

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
    Fail(ErrorEvent),
}

struct Run {
    mux: Arc<Mux>,
    req: Arc<ChatRequest>,
    ctx: RequestCtx,
    queue: VecDeque<Candidate>,
    started: Instant,
    deadline: Instant,
    env: Envelope,
    attempts: u32,
    recoveries: u32,
    hedge: Result<(), NoHedge>,
    rtype: ResponseType,
    transcript: Transcript,
    usage: Option<Usage>,
    /// Routes passed over without an attempt, with the reason (decision record).
    skipped: Vec<(String, String, Option<Duration>)>,
    /// Retry-After hints from failed attempts.
    retry_hints: Vec<Duration>,
    /// The plan as made (candidates, ranking with score breakdowns, exclusions, lease): the
    /// decision record logs it.
    plan: Plan,
    /// Tool calls sent, kept only for the answer cache.
    calls: Vec<crate::types::ToolCall>,
    /// Routes already retried once on the same rung.
    retried: std::collections::HashSet<String>,
}

impl Run {
    fn new(mux: Arc<Mux>, req: Arc<ChatRequest>, ctx: RequestCtx, plan: Plan) -> Self {
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
        Run {
            queue: plan.candidates.clone().into(),
            calls: Vec::new(),
            started,
            deadline,
            env,
            attempts: 0,
            recoveries: 0,
            hedge,
            rtype,
            transcript: Transcript::default(),
            usage: None,
            retry_hints: Vec::new(),
            retried: Default::default(),
            skipped: plan
                .excluded
                .iter()
                .map(|e| (e.route.clone(), e.reason.clone(), None))
                .collect(),
            plan,
            mux,
            req,
            ctx,
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

    /// Ends the seam: held continuation text to send, or `Diverged` when a swallowed restart
    /// ended short of what the client already has.
    fn close_seam(&mut self, seam: &mut Seam) -> Result<Option<String>, Diverged> {
        let out = match std::mem::replace(seam, Seam::Pass).finish() {
            SeamOut::Diverged => return Err(Diverged),
            SeamOut::Emit(s) if !s.is_empty() => Some(s),
            _ => None,
        };
        if let Some(s) = &out {
            self.transcript.push_text(s);
        }
        Ok(out)
    }

    fn since_start(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.started).as_millis() as u64
    }
}
