//! One request's life in the mux: race to the first content token (hedging the primary),
//! commit, stream the winner, and apply the mid-stream policy when it fails.

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
        loop {
            let ev = match pending.take() {
                Some(ev) => ev,
                None => {
                    let stall = run.stall_limit(&cur.route);
                    tokio::select! {
                        ev = cur.next_event() => ev.unwrap_or_else(|| AttemptEvent::Failed(
                            ProviderError::new(ErrorClass::Protocol, "attempt ended without an outcome"))),
                        _ = tokio::time::sleep_until(last_token + stall) => AttemptEvent::Failed(ProviderError::new(
                            ErrorClass::Timeout, format!("stalled: no token for {} ms", stall.as_millis()))),
                        _ = tokio::time::sleep_until(run.deadline) => AttemptEvent::Failed(
                            ProviderError::new(ErrorClass::Timeout, "request deadline exceeded mid-stream")),
                    }
                }
            };
            match ev {
                AttemptEvent::Text(text) => {
                    let now = Instant::now();
                    run.mux.health.record_token_gap(&cur.route, now, now.saturating_duration_since(last_token));
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
                    match seam.finish() {
                        SeamOut::Diverged => {
                            yield run.diverged(&cur);
                            return;
                        }
                        SeamOut::Emit(s) if !s.is_empty() => {
                            run.transcript.push_text(&s);
                            yield StreamEvent::TextDelta(s);
                        }
                        _ => {}
                    }
                    seam = Seam::Pass;
                    run.transcript.tool_calls += 1;
                    run.transcript.tool_open = false;
                    if run.mux.config.cache.enabled {
                        run.calls.push(call.clone());
                    }
                    yield StreamEvent::ToolCall(call);
                }
                AttemptEvent::Usage(u) => run.usage = Some(u),
                AttemptEvent::Finished(reason) => {
                    match seam.finish() {
                        SeamOut::Diverged => {
                            yield run.diverged(&cur);
                            return;
                        }
                        SeamOut::Emit(s) if !s.is_empty() => {
                            run.transcript.push_text(&s);
                            yield StreamEvent::TextDelta(s);
                        }
                        _ => {}
                    }
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
                    match run.recover(&cur.route).await {
                        Recovery::Restart { attempt, first, reset } => {
                            if let Some(reason) = reset {
                                yield StreamEvent::Reset { reason };
                            }
                            seam = if run.transcript.visible() { Seam::swallow(&run.transcript.text) } else { Seam::Pass };
                            cur = attempt;
                            pending = Some(first);
                            last_token = Instant::now();
                        }
                        Recovery::Continue { attempt, first } => {
                            if run.ctx.dialect.can_reset() {
                                yield StreamEvent::RouteSwitch { from: cur.route.to_string(), to: attempt.route.to_string() };
                            }
                            seam = Seam::trim(&run.transcript.text);
                            cur = attempt;
                            pending = Some(first);
                            last_token = Instant::now();
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

enum Recovery {
    Restart { attempt: Attempt, first: AttemptEvent, reset: Option<String> },
    Continue { attempt: Attempt, first: AttemptEvent },
    Truncate,
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
    /// The plan's candidates as planned (the queue consumes them).
    planned: Vec<Candidate>,
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
        let hedge = hedge_allowed(&mux, &ctx, &plan);
        mux.budget_deposit(started);
        mux.retry_deposit(started);
        let env = Envelope { request_id: ctx.request_id.clone(), lease: plan.lease.clone(), ..Envelope::default() };
        Run {
            planned: plan.candidates.clone(),
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
            skipped: plan.excluded.iter().map(|e| (e.route.clone(), e.reason.clone(), None)).collect(),
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
        let configured = self.route_config(route).map_or(Duration::from_secs(10), |r| r.stall_timeout);
        self.mux.health.stall_limit(route, configured, Instant::now())
    }

    fn since_start(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.started).as_millis() as u64
    }

    /// Races attempts to the first content token. With `hedging`, the primary is hedged at
    /// its route's live p95 TTFT; a failure before the first token starts the next route at
    /// once while any running attempt keeps running.
    async fn first_token(&mut self, hedging: bool, prefill: Option<&str>) -> Result<(Attempt, AttemptEvent), ErrorEvent> {
        let max_concurrent = self.mux.config.hedge.max_concurrent_attempts;
        let mut race = Race::default();
        let role = if self.attempts == 0 { Role::Primary } else { Role::Recovery };
        let Some(primary) = self.start_next(role, prefill) else { return Err(self.exhausted()) };
        let mut timer = HedgeTimer::disarmed();
        if hedging {
            match self.hedge {
                Ok(()) if self.queue.is_empty() => self.hedge = Err(NoHedge::SingleRoute),
                Ok(()) => {
                    let (delay, live) = self.mux.health.hedge_delay(&primary.route, &self.mux.config.hedge, primary.started);
                    timer = HedgeTimer::arm(primary.started, delay, live);
                }
                Err(_) => {}
            }
        }
        race.push(primary);
        // A transient failure retried once on the same route before a lower rung: (route, when).
        let mut retry: Option<(Candidate, Instant)> = None;
        loop {
            if race.is_empty() && retry.is_none() {
                let Some(next) = self.start_next(Role::Failover, prefill) else { return Err(self.exhausted()) };
                race.push(next);
            }
            let retry_at = retry.as_ref().map(|r| r.1);
            tokio::select! {
                (i, ev) = race.next() => match ev {
                    ev @ (AttemptEvent::Text(_) | AttemptEvent::ToolStarted | AttemptEvent::ToolCall(_) | AttemptEvent::Finished(_)) => {
                        let winner = race.take(i);
                        let losers = race.drain();
                        self.commit(&winner, losers);
                        return Ok((winner, ev));
                    }
                    AttemptEvent::Failed(err) => {
                        let mut failed = race.take(i);
                        self.record_failure(&mut failed, &err);
                        if failed.role == Role::Primary {
                            timer.disarm();
                        }
                        if !err.is_retryable() {
                            return Err(self.error_event(&err));
                        }
                        if retry.is_none() {
                            if let Some(at) = self.same_route_retry(&failed, &err) {
                                if let Some(candidate) = self.planned.iter().find(|c| *c.route == *failed.route) {
                                    retry = Some((candidate.clone(), at));
                                    continue;
                                }
                            }
                        }
                        if race.len() < max_concurrent {
                            if let Some(next) = self.start_next(Role::Failover, prefill) {
                                race.push(next);
                            }
                        }
                    }
                    AttemptEvent::Usage(_) => {}
                },
                _ = sleep_until_some(retry_at) => {
                    if let Some((candidate, _)) = retry.take() {
                        self.queue.push_front(candidate);
                        if let Some(next) = self.start_next(Role::Failover, prefill) {
                            race.push(next);
                        }
                    }
                }
                _ = timer.due() => {
                    timer.disarm();
                    self.fire_hedge(&mut race, &timer, max_concurrent, prefill);
                }
                _ = tokio::time::sleep_until(self.deadline) => {
                    let err = ProviderError::new(ErrorClass::Timeout, "request deadline exceeded before the first token");
                    for mut a in race.drain() {
                        self.record_failure(&mut a, &err);
                    }
                    return Err(self.error_event(&err));
                }
            }
        }
    }

    /// Same route or next route: an equal-rung route is preferred at once, but when the next
    /// route is a lower rung, a transient failure (5xx, reset, or a 429 whose Retry-After
    /// fits the deadline) is retried once on the same route first. Returns when to retry.
    fn same_route_retry(&mut self, failed: &Attempt, err: &ProviderError) -> Option<Instant> {
        if !matches!(err.class, ErrorClass::Unavailable | ErrorClass::RateLimited) || failed.tokens > 0 {
            return None;
        }
        if !self.retried.insert(failed.route.to_string()) {
            return None;
        }
        let level = self.route_config(&failed.route)?.level;
        let next_level = self.queue.front().map(|c| c.level)?;
        if next_level <= level {
            return None;
        }
        let wait = err.retry_after.unwrap_or_else(|| {
            // Jittered backoff so a fleet of retries does not arrive in step.
            Duration::from_millis(rand::random_range(100..=300))
        });
        let at = Instant::now() + wait;
        (at + Duration::from_millis(10) < self.deadline).then_some(at)
    }

    fn fire_hedge(&mut self, race: &mut Race, timer: &HedgeTimer, max_concurrent: usize, prefill: Option<&str>) {
        let now = Instant::now();
        let skip = |reason: &'static str| metrics::counter!(t::HEDGE_SKIPPED_TOTAL, "reason" => reason).increment(1);
        if race.len() >= max_concurrent {
            return skip("concurrency");
        }
        if self.queue.is_empty() {
            return skip("no_route");
        }
        if !self.mux.budget_withdraw(now) {
            return skip("budget");
        }
        let primary = race.routes().next().unwrap_or_default().to_string();
        let Some(hedge) = self.start_next(Role::Hedge, prefill) else { return skip("no_route") };
        metrics::counter!(t::HEDGES_TOTAL, "result" => "fired").increment(1);
        if let Some(h) = self.mux.health.route(&hedge.route) {
            h.counters.hedges_fired.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.env.hedged = true;
        self.env.hedge = Some(HedgeInfo {
            fired_after_ms: timer.delay.as_millis() as u64,
            primary,
            hedge_route: hedge.route.to_string(),
            winner: None,
            loser_cancelled_ms: None,
        });
        tracing::debug!(request_id = %self.ctx.request_id, route = %hedge.route, delay_ms = timer.delay.as_millis() as u64, live = timer.live, "hedge fired");
        race.push(hedge);
    }

    /// The first content token arrived on `winner`: drop every other attempt now.
    fn commit(&mut self, winner: &Attempt, losers: Vec<Attempt>) {
        let now = Instant::now();
        let ttft = now.saturating_duration_since(winner.started);
        self.mux.health.record_ttft(&winner.route, now, ttft);
        let had_losers = !losers.is_empty();
        let hedge_cfg = &self.mux.config.hedge;
        for loser in &losers {
            // A loser's TTFT is censored: it was at least its age now. Without recording that,
            // a primary that keeps losing hedges keeps only its fast samples, its p95 drifts
            // down and hedges fire ever earlier. Only ages past the route's current hedge delay
            // carry tail information; younger losers are left out rather than biasing it down.
            let age = now.saturating_duration_since(loser.started);
            let (delay, _) = self.mux.health.hedge_delay(&loser.route, hedge_cfg, now);
            if age >= delay {
                self.mux.health.record_ttft(&loser.route, now, age);
            }
            metrics::counter!(t::CANCELLED_TOTAL, "reason" => "hedge_lost").increment(1);
            if let Some(h) = self.mux.health.route(&loser.route) {
                h.counters.cancelled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        drop(losers);
        let cancelled_ms = now.elapsed().as_secs_f64() * 1000.0;
        if self.env.route.is_none() {
            self.env.ttft_ms = Some(self.since_start(now));
        }
        if let Some(session) = self.ctx.session.as_deref().filter(|_| self.mux.config.leases.enabled) {
            let recorded = self.mux.leases.lock().record(session, &winner.route, now);
            self.env.lease = crate::router::envelope_lease(self.plan.lease.as_ref(), recorded);
        }
        self.env.route = Some(winner.route.to_string());
        self.env.model = Some(winner.model.to_string());
        self.env.level = self.route_config(&winner.route).map_or(Level::L0, |r| r.level);
        self.env.attempts = self.attempts;
        if let Some(hedge) = self.env.hedge.as_mut().filter(|h| h.winner.is_none()) {
            let won = winner.role == Role::Hedge;
            hedge.winner = Some(winner.route.to_string());
            if had_losers {
                hedge.loser_cancelled_ms = Some(cancelled_ms);
            }
            let result = if won { "won" } else { "lost" };
            metrics::counter!(t::HEDGES_TOTAL, "result" => result).increment(1);
            if let Some(h) = self.mux.health.route(&hedge.hedge_route) {
                let c = if won { &h.counters.hedges_won } else { &h.counters.hedges_lost };
                c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        metrics::histogram!(t::CLIENT_TTFT_SECONDS).record(now.saturating_duration_since(self.started).as_secs_f64());
    }

    /// Starts an attempt on the next usable route in plan order (needing prefill support
    /// when `prefill` is set). Routes that cannot be used now are recorded and passed over.
    fn start_next(&mut self, role: Role, prefill: Option<&str>) -> Option<Attempt> {
        loop {
            let pos = self.queue.iter().position(|c| {
                prefill.is_none() || self.route_config(&c.route).is_some_and(|r| r.capabilities.prefill)
            })?;
            let candidate = self.queue.remove(pos)?;
            let now = Instant::now();
            if self.attempts >= self.mux.config.limits.max_attempts {
                self.skipped.push((candidate.route, "attempt budget spent".into(), None));
                return None;
            }
            let remaining = self.deadline.saturating_duration_since(now);
            let useful = self
                .plan
                .min_useful(&candidate.route)
                .or_else(|| self.mux.health.ttft_quantile(&candidate.route, 0.5, now))
                .unwrap_or(Duration::from_millis(10));
            if remaining < useful {
                let why = format!(
                    "deadline: {} ms left, less than the route's minimum useful time of {} ms",
                    remaining.as_millis(),
                    useful.as_millis()
                );
                self.skipped.push((candidate.route, why, None));
                continue;
            }
            if let Some(why) = self.spend_budgets(role, &candidate.route, now) {
                let stop = why == "retry budget spent";
                self.skipped.push((candidate.route, why.into(), None));
                if stop {
                    return None;
                }
                continue;
            }
            let permit = match self.mux.health.acquire(&candidate.route, now, self.ctx.priority) {
                Ok(p) => p,
                Err(why) => {
                    let wait = match &why {
                        crate::health::Unavailable::BreakerOpen { until } | crate::health::Unavailable::Cooling { until } => {
                            Some(until.saturating_duration_since(now))
                        }
                        crate::health::Unavailable::Saturated => Some(Duration::from_secs(1)),
                    };
                    self.skipped.push((candidate.route, why.reason(now), wait));
                    continue;
                }
            };
            let (Some(provider), Some(route)) = (self.mux.provider(&candidate.route), self.route_config(&candidate.route)) else {
                continue;
            };
            let model: Arc<str> = Arc::from(route.model.as_str());
            self.attempts += 1;
            self.env.attempts = self.attempts;
            let role_label = match role {
                Role::Primary => "primary",
                Role::Failover => "failover",
                Role::Hedge => "hedge",
                Role::Recovery => "recovery",
            };
            metrics::counter!(t::ATTEMPTS_TOTAL, "route" => candidate.route.clone(), "role" => role_label).increment(1);
            let upstream = UpstreamRequest {
                chat: Arc::clone(&self.req),
                prefill: prefill.map(str::to_string),
                request_id: format!("{}-{}", self.ctx.request_id, self.attempts),
            };
            return Some(Attempt::start(Arc::from(candidate.route.as_str()), model, role, provider, upstream, Some(permit)));
        }
    }

    /// Budgets for one more attempt on `route`: a first choice is the base the others are
    /// measured against; every other attempt spends the fleet-wide retry budget, and a
    /// failover or recovery also the route's blast-radius allowance (hedges have their own
    /// budget). `Some(reason)` when a budget said no.
    fn spend_budgets(&mut self, role: Role, route: &str, now: Instant) -> Option<&'static str> {
        if self.mux.health.availability(route, now).is_err() {
            return None; // `acquire` will pass it over with the precise reason
        }
        let verdict = match role {
            Role::Primary => {
                self.mux.blast_deposit(route, now);
                None
            }
            _ if !self.mux.retry_withdraw(now) => Some("retry budget spent"),
            Role::Failover | Role::Recovery if !self.mux.blast_withdraw(route, now) => Some("blast radius cap"),
            _ => None,
        };
        if let Some(reason) = verdict {
            let label = if reason == "retry budget spent" { "retry_budget" } else { "blast_radius" };
            metrics::counter!(t::BUDGET_DENIED_TOTAL, "budget" => label).increment(1);
        }
        verdict
    }

    /// A complete cached answer to serve at L3 instead of `err`, when the cache is on.
    fn cached_answer(&mut self, err: &ErrorEvent) -> Option<super::cache::CachedAnswer> {
        if !self.mux.config.cache.enabled
            || matches!(err.class, ErrorClass::BadRequest | ErrorClass::Auth | ErrorClass::Refusal | ErrorClass::NoRoute)
        {
            return None;
        }
        self.mux.cache.lock().get(&self.req, Instant::now())
    }

    /// The events of a cached answer served at L3.
    fn serve_cached(&mut self, answer: super::cache::CachedAnswer) -> Vec<StreamEvent> {
        self.env.level = Level::L3;
        self.env.route = Some("cache".into());
        self.env.model = Some(answer.served_by.clone());
        self.env.ttft_ms = Some(self.since_start(Instant::now()));
        self.log_outcome("served_from_cache");
        let mut out = vec![StreamEvent::Start(self.env.clone())];
        if !answer.text.is_empty() {
            out.push(StreamEvent::TextDelta(answer.text));
        }
        out.extend(answer.tool_calls.into_iter().map(StreamEvent::ToolCall));
        if self.req.include_usage {
            out.extend(answer.usage.map(StreamEvent::Usage));
        }
        out.push(StreamEvent::Finish { reason: answer.finish, envelope: self.env.clone() });
        out
    }

    /// A completed answer: keep it for L3 when the cache is on.
    fn remember(&mut self, route: &str, finish: FinishReason) {
        if !self.mux.config.cache.enabled || self.env.level == Level::L3 {
            return;
        }
        let answer = super::cache::CachedAnswer {
            text: self.transcript.text.clone(),
            tool_calls: std::mem::take(&mut self.calls),
            finish,
            usage: self.usage,
            served_by: route.to_string(),
        };
        let _ = self.mux.cache.lock().put(&self.req, answer, Instant::now());
    }

    fn record_failure(&mut self, attempt: &mut Attempt, err: &ProviderError) {
        attempt.resolve(Err(err));
        metrics::counter!(t::UPSTREAM_ERRORS_TOTAL, "route" => attempt.route.to_string(), "class" => err.metric_label()).increment(1);
        if err.class == ErrorClass::Auth {
            metrics::counter!(t::AUTH_ERRORS_TOTAL, "route" => attempt.route.to_string()).increment(1);
            tracing::error!(route = %attempt.route, status = ?err.status, "upstream rejected tailcut's credentials: check the route's api_key_env");
        }
        self.retry_hints.extend(err.retry_after);
        let now = Instant::now();
        self.env.fell_back_from.push(FailedAttempt {
            route: attempt.route.to_string(),
            class: err.class.as_str().to_string(),
            status: err.status,
            message: err.message.clone(),
            after_ms: self.since_start(now),
            after_tokens: attempt.tokens,
        });
    }

    /// The committed attempt on `failed_route` failed: apply the response type's policy.
    async fn recover(&mut self, failed_route: &str) -> Recovery {
        let limit = self.mux.config.limits.max_midstream_recoveries;
        if self.recoveries >= limit {
            self.env.policy = Some(MidStreamPolicy::Truncate.as_str().into());
            return Recovery::Truncate;
        }
        self.recoveries += 1;
        if !self.transcript.visible() {
            // Nothing the client would have to unsee: a seamless restart in every dialect.
            self.transcript.clear();
            self.env.policy = Some(MidStreamPolicy::Restart.as_str().into());
            return match self.first_token(false, None).await {
                Ok((attempt, first)) => Recovery::Restart { attempt, first, reset: None },
                Err(e) => Recovery::Fail(e),
            };
        }
        let prefill_route = self
            .queue
            .iter()
            .any(|c| self.route_config(&c.route).is_some_and(|r| r.capabilities.prefill));
        let pair = self.mux.config.policies.for_type(self.rtype);
        let policy = midstream::choose(pair, self.rtype, &self.transcript, prefill_route);
        self.env.policy = Some(policy.as_str().into());
        match policy {
            MidStreamPolicy::Truncate => Recovery::Truncate,
            MidStreamPolicy::Restart => match self.first_token(false, None).await {
                Ok((attempt, first)) => {
                    let reset = if self.ctx.dialect.can_reset() {
                        self.env.resets += 1;
                        self.transcript.clear();
                        Some(format!("{failed_route} failed mid-stream; restarted on {}", attempt.route))
                    } else {
                        None
                    };
                    Recovery::Restart { attempt, first, reset }
                }
                Err(_) => {
                    self.env.policy = Some(MidStreamPolicy::Truncate.as_str().into());
                    Recovery::Truncate
                }
            },
            MidStreamPolicy::Continue => {
                let partial = self.transcript.text.clone();
                match self.first_token(false, Some(&partial)).await {
                    Ok((attempt, first)) => {
                        self.env.route_switches += 1;
                        Recovery::Continue { attempt, first }
                    }
                    Err(_) => {
                        self.env.policy = Some(MidStreamPolicy::Truncate.as_str().into());
                        Recovery::Truncate
                    }
                }
            }
        }
    }

    /// A restart the client could not be told about produced a different answer.
    fn diverged(&mut self, cur: &Attempt) -> StreamEvent {
        let err = ProviderError::new(
            ErrorClass::Unavailable,
            format!(
                "the answer was interrupted and its retry on {} diverged from the text already sent; the response is incomplete",
                cur.route
            ),
        );
        self.log_outcome("diverged");
        StreamEvent::Error(self.error_event(&err))
    }

    /// Every route was tried or passed over: the most telling error for the client.
    fn exhausted(&mut self) -> ErrorEvent {
        let fails = &self.env.fell_back_from;
        let waits: Vec<Duration> = self.skipped.iter().filter_map(|s| s.2).collect();
        let (class, status, retry_after) = if fails.is_empty() {
            (ErrorClass::Overloaded, 503, waits.iter().min().copied().or(Some(Duration::from_secs(1))))
        } else if fails.iter().all(|f| f.class == "rate_limited") {
            (ErrorClass::RateLimited, 429, None)
        } else if fails.iter().any(|f| f.class == "timeout") {
            (ErrorClass::Timeout, 504, None)
        } else if fails.iter().all(|f| f.status == Some(503)) {
            (ErrorClass::Unavailable, 503, None)
        } else {
            (ErrorClass::Unavailable, 502, None)
        };
        let mut parts: Vec<String> = fails
            .iter()
            .map(|f| match f.status {
                Some(s) => format!("{} ({} {s}: {})", f.route, f.class, f.message),
                None => format!("{} ({}: {})", f.route, f.class, f.message),
            })
            .collect();
        parts.extend(self.skipped.iter().map(|(r, why, _)| format!("{r} (skipped: {why})")));
        let message = format!("no route could serve the request: {}", parts.join("; "));
        let mut err = ProviderError::new(class, message);
        err.retry_after = retry_after;
        let mut ev = self.error_event(&err);
        ev.status = status;
        ev
    }

    fn error_event(&mut self, err: &ProviderError) -> ErrorEvent {
        let mut env = self.env.clone();
        if env.route.is_none() {
            env.level = Level::L4;
        }
        self.log_outcome(err.class.as_str());
        let (message, status) = match err.class {
            ErrorClass::Auth => (
                format!("gateway configuration error: an upstream rejected tailcut's credentials ({})", err.message),
                502,
            ),
            _ => (err.message.clone(), err.class.http_status()),
        };
        let retry_after = err.retry_after.or_else(|| {
            (err.class == ErrorClass::RateLimited)
                .then(|| self.retry_hints.iter().min().copied().unwrap_or(Duration::from_secs(1)))
        });
        ErrorEvent { class: err.class, status, message, retry_after, envelope: env }
    }

    fn log_outcome(&self, outcome: &str) {
        let completed = outcome == "completed";
        macro_rules! decided {
            ($level:ident) => {
                tracing::$level!(
            request_id = %self.ctx.request_id,
            model = %self.req.model,
            outcome,
            route = self.env.route.as_deref().unwrap_or("-"),
            level = self.env.level.as_str(),
            attempts = self.attempts,
            hedged = self.env.hedged,
            ttft_ms = self.env.ttft_ms,
            fell_back_from = ?self.env.fell_back_from.iter().map(|f| (&f.route, &f.class, f.status)).collect::<Vec<_>>(),
            skipped = ?self.skipped.iter().map(|s| (&s.0, &s.1)).collect::<Vec<_>>(),
            plan = %serde_json::to_string(&self.plan).unwrap_or_default(),
            "request decided"
                )
            };
        }
        // The decision record: every request at debug, every request that did not simply
        // complete at info.
        if completed {
            decided!(debug);
        } else {
            decided!(info);
        }
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn hedge_allowed(mux: &Mux, ctx: &RequestCtx, plan: &Plan) -> Result<(), NoHedge> {
    let cfg = &mux.config;
    if !cfg.hedge.enabled || cfg.models.get(&plan.model).is_some_and(|m| !m.hedge) {
        return Err(NoHedge::Disabled);
    }
    if ctx.hedge_off {
        return Err(NoHedge::ClientOff);
    }
    if plan.candidates.iter().any(|c| cfg.route(&c.route).is_some_and(|r| r.side_effecting || !r.hedge)) {
        return Err(NoHedge::SideEffecting);
    }
    Ok(())
}
