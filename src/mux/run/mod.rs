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
mod routes;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::attempt::{Attempt, AttemptEvent, Role};
use super::hedge::{HedgeTimer, NoHedge};
use super::midstream;
use super::race::Race;
use super::seam::{Seam, SeamOut, SeamVerdict};
use super::transcript::Transcript;
use super::Mux;
use crate::config::{MidStreamPolicy, RouteConfig};
use crate::provider::{ProviderError, UpstreamRequest};
use crate::telemetry as t;
use crate::types::ErrorClass;
use crate::types::Plan;
use crate::types::RequestCtx;
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
                run.log_outcome(e.class.as_str());
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
            // What the event decides: nothing more (streaming goes on), or a recovery.
            let mut recovery = None;
            if matches!(ev, AttemptEvent::ToolCall(_) | AttemptEvent::Finished(_)) {
                // Whatever the seam still holds is settled before a tool call or the end.
                let (out, verdict) = seam.finish();
                run.seam_verdict(verdict);
                match run.joined(out, &cur) {
                    Joined::Events(events) => for event in events {
                        let end = matches!(event, StreamEvent::Error(_));
                        yield event;
                        if end {
                            return;
                        }
                    },
                    Joined::StartOver => recovery = Some(run.start_over(&mut cur).await),
                }
            }
            if recovery.is_none() {
                recovery = match ev {
                    AttemptEvent::Progress => {
                        last_token = Instant::now();
                        None
                    }
                    AttemptEvent::Text(text) => {
                        let now = Instant::now();
                        if after_gap {
                            run.mux.health.record_token_gap(&cur.route, now, now.saturating_duration_since(last_token));
                        }
                        last_token = now;
                        let (out, verdict) = seam.feed(&text);
                        run.seam_verdict(verdict);
                        match run.joined(out, &cur) {
                            Joined::Events(events) => {
                                for event in events {
                                    let end = matches!(event, StreamEvent::Error(_));
                                    yield event;
                                    if end {
                                        return;
                                    }
                                }
                                None
                            }
                            Joined::StartOver => Some(run.start_over(&mut cur).await),
                        }
                    }
                    AttemptEvent::ToolStarted => {
                        last_token = Instant::now();
                        run.transcript.tool_open = true;
                        None
                    }
                    AttemptEvent::ToolCall(call) => {
                        last_token = Instant::now();
                        run.transcript.tool_calls += 1;
                        run.transcript.tool_open = false;
                        if run.mux.config.cache.enabled {
                            run.calls.push(call.clone());
                        }
                        yield StreamEvent::ToolCall(call);
                        None
                    }
                    AttemptEvent::Usage(u) => {
                        run.usage = Some(u);
                        None
                    }
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
                        run.routes.set(&failed_route, routes::RouteState::Failed);
                        drop(std::mem::replace(&mut cur, Attempt::closed(&failed_route)));
                        Some(run.recover(&failed_route).await)
                    }
                };
            }
            let Some(recovery) = recovery else { continue };
            match recovery {
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
                Recovery::Continue { from, attempt, first } => {
                    if run.ctx.dialect.can_reset() {
                        yield StreamEvent::RouteSwitch { from, to: attempt.route.to_string() };
                    }
                    seam = run.continuation_seam(&attempt.route);
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
                    run.log_outcome(e.class.as_str());
                    yield StreamEvent::Error(e);
                    return;
                }
            }
        }
    })
}

/// What the seam let through, as events for the client, or a continuation to replace.
enum Joined {
    Events(Vec<StreamEvent>),
    StartOver,
}

enum Recovery {
    Restart {
        attempt: Attempt,
        first: AttemptEvent,
        reset: Option<String>,
    },
    Continue {
        from: String,
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
    /// The plan's routes and what happened to each in this request.
    routes: routes::Routes,
    started: Instant,
    deadline: Instant,
    env: Envelope,
    attempts: u32,
    /// Attempts that count toward `limits.max_attempts` (a same-route retry does not).
    budgeted_attempts: u32,
    recoveries: u32,
    /// No second upstream may see this request (no hedge, no shadow).
    side_effecting: bool,
    hedge: Result<(), NoHedge>,
    rtype: ResponseType,
    transcript: Transcript,
    usage: Option<Usage>,
    /// The class of every failed attempt, in `env.fell_back_from` order.
    fail_classes: Vec<ErrorClass>,
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
        let side_effecting = launch::side_effecting(&mux, &ctx, &plan);
        mux.budget_deposit(started);
        mux.retry_deposit(started);
        let env = Envelope {
            request_id: ctx.request_id.clone(),
            lease: plan.lease.clone(),
            ..Envelope::default()
        };
        Run {
            routes: routes::Routes::new(
                plan.candidates.clone(),
                plan.excluded.iter().map(|e| (e.route.clone(), e.reason.clone())),
                started,
            ),
            calls: Vec::new(),
            started,
            deadline,
            env,
            attempts: 0,
            budgeted_attempts: 0,
            recoveries: 0,
            side_effecting,
            hedge,
            rtype,
            transcript: Transcript::default(),
            usage: None,
            retry_hints: Vec::new(),
            retried: Default::default(),
            fail_classes: Vec::new(),
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

    /// The seam for a continuation committed on `route`: verified against everything the
    /// client holds, knowing what the route's convention withheld from the prefill.
    fn continuation_seam(&self, route: &str) -> Seam {
        let convention = self.route_config(route).map(|r| r.prefill).unwrap_or_default();
        let text = &self.transcript.text;
        let sent = convention.sent_text(text);
        Seam::verify(text, &text[sent.len()..])
    }

    /// The events for what the seam let through: text for the client, or, when the new
    /// attempt turned out to be a different answer, a reset and that answer (clients that
    /// can be told) or an honest error (the SDK dialects).
    fn joined(&mut self, out: SeamOut, cur: &Attempt) -> Joined {
        Joined::Events(match out {
            SeamOut::Emit(s) if !s.is_empty() => {
                self.transcript.push_text(&s);
                vec![StreamEvent::TextDelta(s)]
            }
            SeamOut::Emit(_) | SeamOut::Hold => Vec::new(),
            SeamOut::Diverged { replay } if self.ctx.dialect.can_reset() => {
                self.env.resets += 1;
                self.transcript.clear();
                let mut events = vec![StreamEvent::Reset {
                    reason: format!("{} did not continue the answer; its new answer replaces it", cur.route),
                }];
                if !replay.is_empty() {
                    self.transcript.push_text(&replay);
                    events.push(StreamEvent::TextDelta(replay));
                }
                events
            }
            SeamOut::Diverged { .. } => vec![self.diverged(cur)],
            SeamOut::StartOver => return Joined::StartOver,
        })
    }

    fn seam_verdict(&mut self, verdict: Option<SeamVerdict>) {
        if let Some(v) = verdict {
            metrics::counter!(t::SEAMS_TOTAL, "verdict" => v.metric_label()).increment(1);
            if v != SeamVerdict::Continued {
                tracing::debug!(request_id = %self.ctx.request_id, verdict = v.metric_label(), "continuation started over");
            }
        }
    }

    fn since_start(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.started).as_millis() as u64
    }
}
