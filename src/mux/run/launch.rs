//! Starting the next attempt: plan order, the deadline's minimum useful time, the retry and
//! blast-radius budgets, and the same-route retry before a lower rung.

use super::*;

impl Run {
    /// Same route or next route: an equal-rung route is preferred at once, but when the next
    /// route is a lower rung, a transient failure (5xx, reset, or a 429 whose Retry-After
    /// fits the deadline) is retried once on the same route first. Returns when to retry.
    pub(super) fn same_route_retry(
        &mut self,
        route: &str,
        tokens: u32,
        err: &ProviderError,
    ) -> Option<(Candidate, Instant)> {
        if !matches!(err.class, ErrorClass::Unavailable | ErrorClass::RateLimited) || tokens > 0 {
            return None;
        }
        let level = self.route_config(route)?.level;
        let next_level = self.queue.front().map(|c| c.level)?;
        if next_level <= level || self.retried.contains(route) {
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
        let candidate = self.plan.candidates.iter().find(|c| c.route == route)?.clone();
        self.retried.insert(route.to_string());
        Some((candidate, at))
    }

    /// Starts an attempt on the next usable route in plan order (needing prefill support
    /// when `prefill` is set). Routes that cannot be used now are recorded and passed over.
    pub(super) fn start_next(&mut self, role: Role, prefill: Option<&str>) -> Option<Attempt> {
        loop {
            let pos = self.queue.iter().position(|c| {
                prefill.is_none() || self.route_config(&c.route).is_some_and(|r| r.capabilities.prefill)
            })?;
            let candidate = self.queue.remove(pos)?;
            let now = Instant::now();
            if self.attempts >= self.mux.config.limits.max_attempts {
                self.skipped
                    .push((candidate.route, "attempt budget spent".into(), None));
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
            let permit = match self.mux.health.acquire(&candidate.route, now, self.ctx.priority) {
                Ok(p) => p,
                Err(why) => {
                    let wait = match &why {
                        crate::health::Unavailable::BreakerOpen { until }
                        | crate::health::Unavailable::Cooling { until } => Some(until.saturating_duration_since(now)),
                        crate::health::Unavailable::Saturated => Some(Duration::from_secs(1)),
                    };
                    self.skipped.push((candidate.route, why.reason(now), wait));
                    continue;
                }
            };
            // Budgets are spent only for an attempt that can really start (the permit is
            // released if a budget says no).
            if let Some(why) = self.spend_budgets(role, &candidate.route, now) {
                drop(permit);
                let stop = why.ends_with("budget spent");
                self.skipped.push((candidate.route, why.into(), None));
                if stop {
                    return None;
                }
                continue;
            }
            let (Some(provider), Some(route)) =
                (self.mux.provider(&candidate.route), self.route_config(&candidate.route))
            else {
                continue;
            };
            let model: Arc<str> = Arc::from(route.model.as_str());
            let convention = route.prefill;
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
                prefill: prefill.map(|text| crate::types::Prefill {
                    text: text.to_string(),
                    convention,
                }),
                request_id: format!("{}-{}", self.ctx.request_id, self.attempts),
            };
            return Some(Attempt::start(
                Arc::from(candidate.route.as_str()),
                model,
                role,
                provider,
                upstream,
                Some(permit),
            ));
        }
    }

    /// Budgets for one more attempt on `route`: a first choice is the base the others are
    /// measured against; every other attempt spends the fleet-wide retry budget, and a
    /// failover or recovery also the route's blast-radius allowance (hedges have their own
    /// budget). `Some(reason)` when a budget said no.
    pub(super) fn spend_budgets(&mut self, role: Role, route: &str, now: Instant) -> Option<&'static str> {
        let verdict = match role {
            Role::Primary => {
                self.mux.blast_deposit(route, now);
                None
            }
            Role::Hedge if !self.mux.budget_withdraw(now) => Some("hedge budget spent"),
            _ if !self.mux.retry_withdraw(now) => Some("retry budget spent"),
            Role::Failover | Role::Recovery if !self.mux.blast_withdraw(route, now) => Some("blast radius cap"),
            _ => None,
        };
        if let Some(reason) = verdict {
            let label = if reason == "retry budget spent" {
                "retry_budget"
            } else {
                "blast_radius"
            };
            metrics::counter!(t::BUDGET_DENIED_TOTAL, "budget" => label).increment(1);
        }
        verdict
    }
}

pub(super) fn hedge_allowed(mux: &Mux, ctx: &RequestCtx, plan: &Plan) -> Result<(), NoHedge> {
    let cfg = &mux.config;
    if !cfg.hedge.enabled || cfg.models.get(&plan.model).is_some_and(|m| !m.hedge) {
        return Err(NoHedge::Disabled);
    }
    if ctx.hedge_off {
        return Err(NoHedge::ClientOff);
    }
    if plan
        .candidates
        .iter()
        .any(|c| cfg.route(&c.route).is_some_and(|r| r.side_effecting || !r.hedge))
    {
        return Err(NoHedge::SideEffecting);
    }
    Ok(())
}
