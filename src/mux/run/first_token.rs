//! The race to the first content token: the primary, its hedge at the route's live p95
//! TTFT, failover before commit, and the commit that drops every loser.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::routes::RouteState;
use super::Run;
use crate::mux::attempt::{Attempt, AttemptEvent, Role};
use crate::mux::hedge::{HedgeTimer, NoHedge};
use crate::mux::race::Race;
use crate::mux::MuxError;
use crate::provider::ProviderError;
use crate::telemetry as t;
use crate::types::{ErrorClass, ErrorEvent, HedgeInfo, Level};

impl Run {
    /// Races attempts to the first content token. With `hedging`, the primary is hedged at
    /// its route's live p95 TTFT; a failure before the first token starts the next route at
    /// once while any running attempt keeps running.
    pub(super) async fn first_token(
        &mut self,
        hedging: bool,
        prefill: Option<&str>,
    ) -> Result<(Attempt, AttemptEvent), ErrorEvent> {
        let max_concurrent = self.mux.config.hedge.max_concurrent_attempts;
        let mut race = Race::default();
        let role = if self.attempts == 0 {
            Role::Primary
        } else {
            Role::Recovery
        };
        let primary = match self.start_next(role, prefill) {
            Ok(a) => a,
            // A recovery with no other route left may use the route that failed, once.
            Err(_) if role == Role::Recovery => match self.start_failed_again(prefill) {
                Some(a) => a,
                None => return Err(self.exhausted()),
            },
            Err(_) => return Err(self.exhausted()),
        };
        let mut timer = HedgeTimer::disarmed();
        if hedging {
            match self.hedge {
                Ok(()) if !self.routes.any_untried(|_| true) => self.hedge = Err(NoHedge::SingleRoute),
                Ok(()) => {
                    let (delay, live) = self.mux.health.hedge_delay(
                        &primary.route,
                        &self.mux.config.hedge_for(&primary.route),
                        primary.started,
                    );
                    timer = HedgeTimer::arm(primary.started, delay, live);
                }
                Err(_) => {}
            }
        }
        race.push(primary);
        // A transient failure retried once on the same route before a lower rung: (route, when).
        let mut retry: Option<(Arc<str>, Instant)> = None;
        // A failure that forbids failover (400, 401, refusal) while other attempts still run:
        // no new attempt starts, and it is the answer if none of those succeeds.
        let mut fatal: Option<ProviderError> = None;
        loop {
            if race.is_empty() && retry.is_none() {
                if let Some(err) = fatal.take() {
                    return Err(self.error_event(&err));
                }
                match self.start_next(Role::Failover, prefill) {
                    Ok(next) => race.push(next),
                    Err(_) => return Err(self.exhausted()),
                }
            }
            let retry_at = retry.as_ref().map(|r| r.1);
            let silent = race.first_token_due(|route| self.first_token_timeout(route));
            let step = tokio::select! {
                // Events first: a first token that is ready wins over a timer due at once.
                biased;
                (i, ev) = race.next() => Step::Event(i, ev),
                _ = sleep_until_some(silent.map(|s| s.1)) => Step::Silent(silent.map_or(0, |s| s.0)),
                _ = sleep_until_some(retry_at) => Step::Retry,
                _ = timer.due() => Step::Hedge,
                _ = tokio::time::sleep_until(self.deadline) => Step::Deadline,
            };
            let (mut failed, err) = match step {
                Step::Event(i, ev) => match ev {
                    AttemptEvent::Text(_)
                    | AttemptEvent::Thinking(_)
                    | AttemptEvent::ToolStarted
                    | AttemptEvent::ToolCall(_) => {
                        let mut winner = race.take(i);
                        let losers = race.drain();
                        self.commit(&mut winner, losers);
                        return Ok((winner, ev));
                    }
                    // An answer without content is only taken when nothing else is running:
                    // the first *content* token wins a race.
                    AttemptEvent::Finished(_) if race.len() == 1 && retry.is_none() => {
                        let mut winner = race.take(i);
                        self.commit(&mut winner, Vec::new());
                        return Ok((winner, ev));
                    }
                    AttemptEvent::Finished(_) => {
                        drop(race.take(i));
                        continue;
                    }
                    AttemptEvent::Failed(err) => (race.take(i), *err),
                    AttemptEvent::Usage(_) | AttemptEvent::Progress => continue,
                },
                Step::Silent(i) => {
                    let attempt = race.take(i);
                    let limit = self.first_token_timeout(&attempt.route);
                    (attempt, MuxError::FirstTokenTimeout(limit).into())
                }
                Step::Retry => {
                    if let Some((route, _)) = retry.take() {
                        if let Some(again) = self.start_again(&route, Role::Failover, prefill) {
                            race.push(again);
                        }
                    }
                    continue;
                }
                Step::Hedge => {
                    timer.disarm();
                    if fatal.is_none() {
                        self.fire_hedge(&mut race, &timer, max_concurrent, prefill);
                    }
                    continue;
                }
                Step::Deadline => {
                    // The request ran out of time: that is not the routes' fault, so the
                    // attempts are dropped without judging them.
                    let err = ProviderError::from(MuxError::Deadline);
                    for mut a in race.drain() {
                        self.record_abandoned(&mut a, &err);
                    }
                    return Err(self.error_event(fatal.as_ref().unwrap_or(&err)));
                }
            };
            let (role, route, tokens) = (failed.role, Arc::clone(&failed.route), failed.tokens);
            // A 400 to a continuation request is the route refusing the prefill (trailing
            // whitespace, thinking mode, no such convention), not the client's fault: the
            // route stays usable for a restart and the request moves on.
            let prefill_refused = prefill.is_some() && err.class == ErrorClass::BadRequest;
            self.record_failure(&mut failed, &err);
            drop(failed);
            let state = if prefill_refused {
                RouteState::PrefillRefused
            } else {
                RouteState::Failed
            };
            self.routes.set(&route, state);
            if role == Role::Primary {
                timer.disarm();
            }
            if !err.is_retryable() && !prefill_refused {
                if race.is_empty() {
                    return Err(self.error_event(&err));
                }
                timer.disarm();
                fatal.get_or_insert(err);
                continue;
            }
            if fatal.is_some() {
                continue;
            }
            if retry.is_none() {
                if let Some(at) = self.same_route_retry(&route, tokens, &err) {
                    retry = Some((route, at));
                    continue;
                }
            }
            // A failed hedge does not start a third attempt beside a running primary: that
            // would be a second hedge outside the hedge budget.
            if (role != Role::Hedge || race.is_empty()) && race.len() < max_concurrent {
                if let Ok(next) = self.start_next(Role::Failover, prefill) {
                    race.push(next);
                }
            }
        }
    }

    /// How long an attempt on `route` may go without a first token before it is failed over.
    pub(super) fn first_token_timeout(&self, route: &str) -> Duration {
        self.route_config(route)
            .map_or(Duration::from_secs(30), |r| r.first_token_timeout)
    }

    pub(super) fn fire_hedge(
        &mut self,
        race: &mut Race,
        timer: &HedgeTimer,
        max_concurrent: usize,
        prefill: Option<&str>,
    ) {
        let skip = |reason: &'static str| {
            metrics::counter!(t::HEDGES_TOTAL, "result" => "skipped").increment(1);
            metrics::counter!(t::HEDGE_SKIPPED_TOTAL, "reason" => reason).increment(1);
        };
        if race.len() >= max_concurrent {
            return skip("concurrency");
        }
        let primary = race.routes().next().unwrap_or_default().to_string();
        let hedge = match self.start_next(Role::Hedge, prefill) {
            Ok(hedge) => hedge,
            Err(no) => return skip(if no.refusal.is_some() { "budget" } else { "no_route" }),
        };
        metrics::counter!(t::HEDGES_TOTAL, "result" => "fired").increment(1);
        if let Some(h) = self.mux.health.route(&hedge.route) {
            h.counters
                .hedges_fired
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(p) = self.mux.health.route(&primary) {
            p.counters
                .hedges_fired_by
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
    pub(super) fn commit(&mut self, winner: &mut Attempt, losers: Vec<Attempt>) {
        let now = Instant::now();
        winner.first_token(now);
        let ttft = now.saturating_duration_since(winner.started);
        self.mux.health.record_ttft(&winner.route, now, ttft);
        if self
            .route_config(&winner.route)
            .and_then(|r| r.latency_slo)
            .is_some_and(|slo| ttft > slo)
        {
            self.mux.health.latency_breach(&winner.route, now);
        }
        let had_losers = !losers.is_empty();
        self.routes.set(&winner.route, RouteState::Served);
        for loser in &losers {
            // Cancelled, not failed: a later recovery may still use it.
            self.routes.set(&loser.route, RouteState::Untried);
            // A loser's TTFT is censored: it was at least its age now. Without recording that,
            // a primary that keeps losing hedges keeps only its fast samples, its p95 drifts
            // down and hedges fire ever earlier. Only ages past the route's current hedge delay
            // carry tail information; younger losers are left out rather than biasing it down.
            let age = now.saturating_duration_since(loser.started);
            let (delay, _) = self
                .mux
                .health
                .hedge_delay(&loser.route, &self.mux.config.hedge_for(&loser.route), now);
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
        // The one place the mux writes the session's lease: the winner keeps, moves or starts it
        // (a revocation the plan returned was applied by the gateway right after planning).
        if let Some(session) = self.ctx.session.as_deref().filter(|_| self.mux.config.leases.enabled) {
            let recorded = self.mux.leases.lock().record(session, &winner.route, now);
            self.env.lease = crate::health::lease::envelope_lease(self.plan.lease.as_ref(), recorded);
        }
        self.moves_committed(&winner.route);
        self.env.route = Some(winner.route.to_string());
        self.env.model = Some(winner.model.to_string());
        self.env.dropped = match self.route_config(&winner.route) {
            Some(r) => crate::router::CrossWire::of(&self.req).dropped_by(&self.req, r.wire, &r.rules),
            None => Vec::new(),
        };
        // Shadows are for any request a second upstream may safely see.
        if !self.side_effecting() {
            if let Some(next) = self.routes.next_other(&winner.route) {
                crate::mux::shadow::maybe_start(
                    &self.mux,
                    &self.mux.shadows,
                    &self.req,
                    &self.gates,
                    next,
                    self.deadline,
                );
            }
        }
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
                let c = if won {
                    &h.counters.hedges_won
                } else {
                    &h.counters.hedges_lost
                };
                c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        if self.recoveries == 0 {
            // Recorded once the first events are on their way (`after_send::Later`).
            self.ttft_sample = Some(now.saturating_duration_since(self.started).as_secs_f64());
        }
    }
}

/// What woke the race up.
enum Step {
    Event(usize, AttemptEvent),
    /// The attempt at this position has gone without a first token for too long.
    Silent(usize),
    Retry,
    Hedge,
    Deadline,
}

pub(super) async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
