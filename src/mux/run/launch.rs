//! Starting the next attempt: plan order, the deadline's minimum useful time, the attempt,
//! retry and blast-radius budgets, and the same-route retry before a lower rung.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::routes::{RouteState, Skip};
use super::Run;
use crate::mux::attempt::{Attempt, Role};
use crate::mux::budget::Refusal;
use crate::mux::hedge::NoHedge;
use crate::mux::Mux;
use crate::provider::{ProviderError, UpstreamRequest};
use crate::telemetry as t;
use crate::telemetry::handles::AttemptRole;
use crate::types::{ChatRequest, ErrorClass, Plan, RequestCtx};

/// No attempt could start. `refusal` is set when a request-wide budget said no (then no
/// other route was looked at).
pub(super) struct NoStart {
    pub refusal: Option<Refusal>,
}

impl Run {
    /// Same route or next route: an equal-rung route is preferred at once, but when the next
    /// route is a lower rung (or there is none), a transient failure (5xx, reset, or a 429
    /// whose Retry-After fits the deadline) is retried once on the same route first. Returns
    /// when to retry.
    pub(super) fn same_route_retry(&mut self, route: &str, tokens: u32, err: &ProviderError) -> Option<Instant> {
        if !matches!(err.class, ErrorClass::Unavailable | ErrorClass::RateLimited) || tokens > 0 {
            return None;
        }
        let level = self.route_config(route)?.level;
        if self.routes.next_untried_level().is_some_and(|next| next <= level) || self.retried.contains(route) {
            return None;
        }
        let wait = match (err.retry_after, err.class) {
            (Some(after), _) => after,
            // A 429 without a hint cools the route for a second (`Health`); sooner is refused.
            (None, ErrorClass::RateLimited) => crate::health::DEFAULT_COOLING,
            // Jittered backoff so a fleet of retries does not arrive in step.
            (None, _) => Duration::from_millis(rand::random_range(100..=300)),
        };
        let at = Instant::now().checked_add(wait)?;
        if at + Duration::from_millis(10) >= self.deadline {
            return None;
        }
        self.retried.insert(route.to_string());
        Some(at)
    }

    /// Starts an attempt on the next usable route in plan order (one that can continue when
    /// `prefill` is set). Routes that cannot be used now are recorded and passed over, and
    /// stay candidates for later.
    pub(super) fn start_next(&mut self, role: Role, prefill: Option<&str>) -> Result<Attempt, NoStart> {
        for i in 0..self.routes.len() {
            let usable = match self.routes.state(i) {
                RouteState::Untried => true,
                RouteState::PrefillRefused => prefill.is_none(),
                RouteState::Running | RouteState::Failed | RouteState::Served => false,
            };
            if !usable || (prefill.is_some() && !self.can_continue(&self.routes.candidate(i).route)) {
                continue;
            }
            let route = self.routes.candidate(i).route.clone();
            match self.try_start(&route, role, prefill, false) {
                Ok(attempt) => return Ok(attempt),
                Err(skip) => {
                    let stop = match &skip {
                        // A spent retry budget refuses a failover route by route: a later
                        // route may be a proven healthy one it lets through.
                        Skip::Budget(Refusal::RetryBudget) if matches!(role, Role::Failover) => None,
                        Skip::Budget(r) if r.is_request_wide() => Some(*r),
                        _ => None,
                    };
                    self.routes.skip(&route, skip, Instant::now());
                    if stop.is_some() {
                        return Err(NoStart { refusal: stop });
                    }
                }
            }
        }
        Err(NoStart { refusal: None })
    }

    /// The same route again, once: after a transient failure before its first token, or
    /// (`Role::Recovery`) after a mid-stream failure when no other route is left. It does not
    /// count toward the request's attempt budget, so it never costs the last route its turn.
    pub(super) fn start_again(&mut self, route: &str, role: Role, prefill: Option<&str>) -> Option<Attempt> {
        match self.try_start(route, role, prefill, true) {
            Ok(attempt) => Some(attempt),
            Err(skip) => {
                self.routes.skip(route, skip, Instant::now());
                None
            }
        }
    }

    /// A mid-stream recovery with no other route left: the route that failed, once.
    pub(super) fn start_failed_again(&mut self, prefill: Option<&str>) -> Option<Attempt> {
        let i = (0..self.routes.len()).find(|&i| {
            let route = &self.routes.candidate(i).route;
            self.routes.state(i) == RouteState::Failed
                && !self.retried.contains(route)
                && (prefill.is_none() || self.can_continue(route))
        })?;
        let route = self.routes.candidate(i).route.clone();
        self.retried.insert(route.clone());
        self.start_again(&route, Role::Recovery, prefill)
    }

    /// The client's request, or for a continuation the same asking only for what is left of
    /// its `max_tokens` after the tokens the client already got (`recover` never continues
    /// when nothing is left).
    fn continuation_chat(&self, continuing: bool) -> Arc<ChatRequest> {
        match self.req.max_tokens {
            Some(max) if continuing && self.carried > 0 => Arc::new(ChatRequest {
                max_tokens: Some(max.saturating_sub(self.carried).max(1)),
                ..ChatRequest::clone(&self.req)
            }),
            _ => Arc::clone(&self.req),
        }
    }

    /// Can `route` continue this answer? Its convention must take a prefill, and an
    /// Anthropic-wire route refuses one while the client asks it to think.
    pub(super) fn can_continue(&self, route: &str) -> bool {
        self.route_config(route).is_some_and(|r| {
            r.prefill.can_continue() && !(r.wire == crate::config::Wire::Anthropic && self.req.asks_thinking())
        })
    }

    fn try_start(&mut self, route: &str, role: Role, prefill: Option<&str>, again: bool) -> Result<Attempt, Skip> {
        let now = Instant::now();
        if !again && self.budgeted_attempts >= self.mux.config.limits.max_attempts {
            return Err(Skip::Budget(Refusal::Attempts));
        }
        let left = self.deadline.saturating_duration_since(now);
        let useful = self
            .plan
            .min_useful(route)
            .or_else(|| self.mux.health.ttft_quantile(route, 0.5, now))
            .unwrap_or(Duration::from_millis(10));
        if left < useful {
            return Err(Skip::Deadline { left, useful });
        }
        let permit = self
            .mux
            .health
            .acquire(route, now, self.ctx.priority)
            .map_err(Skip::Unavailable)?;
        // Budgets are spent only for an attempt that can really start: the permit is
        // released (dropped) when a budget says no.
        self.spend_budgets(role, route, now, again).map_err(Skip::Budget)?;
        let (Some(provider), Some(config)) = (self.mux.provider(route), self.route_config(route)) else {
            return Err(Skip::Excluded("no provider for this route".into()));
        };
        let model: Arc<str> = Arc::from(config.model.as_str());
        let convention = config.prefill;
        self.attempts += 1;
        if !again {
            self.budgeted_attempts += 1;
        }
        self.env.attempts = self.attempts;
        let role_metric = match role {
            Role::Primary => AttemptRole::Primary,
            Role::Failover => AttemptRole::Failover,
            Role::Hedge => AttemptRole::Hedge,
            Role::Recovery => AttemptRole::Recovery,
        };
        match self.mux.health.route(route) {
            Some(h) => h.metrics.attempts(role_metric).increment(1),
            None => metrics::counter!(t::ATTEMPTS_TOTAL, "route" => route.to_string(), "role" => role_metric.label())
                .increment(1),
        }
        let chat = match self.repair.take_request(route) {
            // The repair attempt sends its own request (the answer and the validator's error).
            Some(repair) => repair,
            None => self.continuation_chat(prefill.is_some()),
        };
        let upstream = UpstreamRequest {
            chat,
            prefill: prefill.map(|text| crate::types::Prefill {
                text: text.to_string(),
                convention,
            }),
            request_id: format!("{}-{}", self.ctx.request_id, self.attempts),
        };
        self.routes.set(route, RouteState::Running);
        if matches!(role, Role::Failover | Role::Recovery) {
            self.moving_to(route);
        }
        let attempt = Attempt::start(
            Arc::from(route),
            model,
            role,
            provider,
            upstream,
            &self.gates,
            Some(permit),
        );
        self.launched(&attempt.route, self.attempts);
        Ok(attempt)
    }

    /// Budgets for one more attempt on `route`. A first choice is the base the others are
    /// measured against. A hedge spends the hedge budget and the fleet-wide retry budget; a
    /// failover before commit spends the retry budget and the route's blast-radius
    /// allowance; when the retry budget is spent, a failover to another route that is proven
    /// healthy (`proven_healthy`) still goes, under its blast-radius allowance alone: the
    /// budget is there so a fleet that fails everywhere is not hammered with retries, not to
    /// keep a request that one flaky route failed from the healthy next rung. A same-route
    /// retry (`again`) never gets that exemption. A mid-stream recovery spends neither: it is bounded per request
    /// (`limits.max_midstream_recoveries`), it is what keeps a committed answer whole, and a
    /// route that keeps failing mid-stream is taken out by its breaker, not by refusing its
    /// victims a fallback. Every budget is tested before any is withdrawn, so a refusal by
    /// one leaks no token of another.
    fn spend_budgets(&mut self, role: Role, route: &str, now: Instant, again: bool) -> Result<(), Refusal> {
        let mux = &self.mux;
        let verdict = match role {
            Role::Primary => {
                mux.blast_deposit(route, now);
                Ok(())
            }
            Role::Recovery => Ok(()),
            Role::Hedge => {
                let mut hedge = mux.budget.lock();
                let mut retry = mux.retry_budget.lock();
                if !hedge.allows(now) {
                    Err(Refusal::HedgeBudget)
                } else if !retry.allows(now) {
                    Err(Refusal::RetryBudget)
                } else {
                    hedge.withdraw(now);
                    retry.withdraw(now);
                    Ok(())
                }
            }
            Role::Failover => {
                let exempt = !again && proven_healthy(&mux.health.view(route, now));
                let mut retry = mux.retry_budget.lock();
                let mut blast = mux.blast.get(route).map(|b| b.lock());
                let retry_allows = retry.allows(now);
                if !retry_allows && !exempt {
                    Err(Refusal::RetryBudget)
                } else if blast.as_ref().is_some_and(|b| !b.allows(now)) {
                    Err(Refusal::BlastRadius)
                } else {
                    if retry_allows {
                        retry.withdraw(now);
                    }
                    if let Some(b) = blast.as_mut() {
                        b.withdraw(now);
                    }
                    Ok(())
                }
            }
        };
        if let Err(r) = verdict {
            metrics::counter!(t::BUDGET_DENIED_TOTAL, "budget" => r.metric_label()).increment(1);
        }
        verdict
    }
}

/// A route whose recent attempts (the router's window) show at least one and at most 10%
/// failed. A route nobody has tried lately is not proven: in an outage that hits every
/// route, no fallback has successes to show, so the retry budget still holds.
fn proven_healthy(view: &crate::health::RouteView) -> bool {
    view.error_volume >= 1 && view.error_rate <= 0.1 && !view.breaker_open && !view.cooling
}

/// Whether the request may be hedged. Side effects are checked first, because the answer also
/// gates shadows (`Run::side_effecting`) whatever else turns hedging off: the client says so
/// with `x-tailcut-hedge: off`, a route with `side_effecting = true`.
pub(super) fn hedge_allowed(mux: &Mux, ctx: &RequestCtx, plan: &Plan) -> Result<(), NoHedge> {
    let cfg = &mux.config;
    if ctx.hedge_off {
        return Err(NoHedge::ClientOff);
    }
    if plan
        .candidates
        .iter()
        .any(|c| cfg.route(&c.route).is_some_and(|r| r.side_effecting))
    {
        return Err(NoHedge::SideEffecting);
    }
    if !cfg.hedge.enabled || cfg.models.get(&plan.model).is_some_and(|m| !m.hedge) {
        return Err(NoHedge::Disabled);
    }
    if plan
        .candidates
        .iter()
        .any(|c| cfg.route(&c.route).is_some_and(|r| !r.hedge))
    {
        return Err(NoHedge::RouteOff);
    }
    Ok(())
}
