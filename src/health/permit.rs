//! One attempt's permission to use a route, and how its outcome reaches the route's health:
//! breaker, error-rate window, admission limit, cool-down and failure counters.
//!
//! The outcome of a user attempt is counted once, when it resolves: [`RoutePermit::success`]
//! at a normal finish, [`RoutePermit::failure`] at any failure, before or after commit.
//! [`RoutePermit::first_token`] only marks the commit (so a later failure is known to be
//! mid-stream) and lets a half-open probe prove its route. Dropping a permit unresolved (a
//! cancelled hedge loser, a client that left, the request's own deadline) judges nothing
//! and frees the slots it held.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::breaker::Ticket;
use super::{Health, DEFAULT_COOLING, MAX_COOLING};
use crate::types::ErrorClass;

/// What a permit was taken for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitKind {
    /// A user request's attempt (possibly a traffic probe: see [`RoutePermit::is_probe`]).
    Attempt,
    /// The background prober's own request: any failure is a failed probe, and its outcome
    /// stays out of the user error rate.
    Probe,
}

/// Permission for one attempt on a route. Report how it ended with `success`/`failure`;
/// dropping it unresolved frees the slot without judging the route.
pub struct RoutePermit {
    health: Arc<Health>,
    idx: usize,
    ticket: Ticket,
    kind: PermitKind,
    resolved: bool,
    /// A first token arrived: a failure from now on is a mid-stream failure.
    committed: bool,
}

impl RoutePermit {
    pub(super) fn new(health: Arc<Health>, idx: usize, ticket: Ticket, kind: PermitKind) -> Self {
        RoutePermit {
            health,
            idx,
            ticket,
            kind,
            resolved: false,
            committed: false,
        }
    }

    pub fn route(&self) -> &str {
        &self.health.routes[self.idx].name
    }

    /// Was this admitted as a half-open probe (the prober's, or a user request under
    /// traffic probes)? Only a probe's outcome can close or reopen a half-open breaker.
    pub fn is_probe(&self) -> bool {
        self.ticket.is_probe()
    }

    pub fn kind(&self) -> PermitKind {
        self.kind
    }

    /// The attempt produced its first content token. For a probe that is proof of life and
    /// closes a half-open breaker; for anything else nothing is counted until it resolves.
    pub fn first_token(&mut self, _now: Instant) {
        if !self.committed {
            self.committed = true;
            self.health.routes[self.idx]
                .state
                .lock()
                .breaker
                .on_first_token(self.ticket);
        }
    }

    pub fn success(mut self, now: Instant) {
        let mut s = self.health.routes[self.idx].state.lock();
        s.breaker.on_success(now, self.ticket);
        if let Some(took) = s.breaker.take_recovery() {
            crate::telemetry::rotation::recovered(&self.health.routes[self.idx].name, took);
        }
        s.admission.on_success();
        if self.kind == PermitKind::Attempt {
            s.outcomes.record(now, true);
        }
        self.resolved = true;
    }

    /// The attempt failed with `class`; `retry_after` is the upstream's wait hint (it sets a
    /// rate-limited route's cool-down); `transport`: the connection failed, the upstream said
    /// nothing (`ProviderError::transport`).
    pub fn failure(mut self, now: Instant, class: ErrorClass, retry_after: Option<Duration>, transport: bool) {
        let route = &self.health.routes[self.idx];
        let counts = class.counts_against_route();
        let mut s = route.state.lock();
        // A probe that brought no first token failed, whatever the class: a rate-limited or
        // misconfigured route is not back either (and must not be probed in a tight loop).
        if counts || self.kind == PermitKind::Probe {
            let before = s.breaker.openings();
            s.breaker.on_failure(now, self.ticket);
            if s.breaker.openings() != before {
                // Logged once, here, where the opening is decided: what an operator most needs
                // to see of a route, with why and for how long.
                let cause = if self.kind == PermitKind::Probe {
                    "probe_failed"
                } else {
                    "tripped"
                };
                tracing::warn!(
                    route = %route.name,
                    cause,
                    class = class.metric_label(),
                    reason = s.breaker.opened_reason().unwrap_or_default(),
                    cooldown_ms = u64::try_from(s.breaker.cooldown().as_millis()).unwrap_or(u64::MAX),
                    "breaker opened"
                );
                crate::telemetry::rotation::breaker_opened(&route.name, cause);
            }
        } else {
            s.breaker.release(self.ticket);
        }
        match self.kind {
            PermitKind::Probe => {
                route.counters.probe_failures.fetch_add(1, Ordering::Relaxed);
            }
            PermitKind::Attempt if counts => {
                s.outcomes.record(now, false);
                route.counters.failures.fetch_add(1, Ordering::Relaxed);
                if self.committed {
                    route.counters.midstream_failures.fetch_add(1, Ordering::Relaxed);
                }
            }
            PermitKind::Attempt => {}
        }
        // The admission limit shrinks on what says "too much load": a 429, or an upstream
        // that answered 5xx / 529 or an in-band overload. A broken connection (a reset
        // mid-answer, a refused connect) says nothing of load; the breaker judges it.
        let overload = class == ErrorClass::RateLimited || (class == ErrorClass::Unavailable && !transport);
        if overload {
            s.admission.on_overload(now);
        }
        match class {
            ErrorClass::RateLimited => {
                let wait = retry_after.unwrap_or(DEFAULT_COOLING).min(MAX_COOLING);
                s.cool_until(now + wait);
            }
            // Out of credit: no retry soon changes that, an operator has to act (the mux
            // alerts on it where it logs the attempt's failure). Cool the route for long.
            ErrorClass::Quota => s.cool_until(now + self.health.quota_cooldown),
            _ => {}
        }
        self.resolved = true;
    }
}

impl Drop for RoutePermit {
    fn drop(&mut self) {
        let mut s = self.health.routes[self.idx].state.lock();
        s.admission.release();
        if !self.resolved {
            s.breaker.release(self.ticket);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::provider::ProviderError;

    /// Reports `err` the way the mux does.
    fn fail(permit: RoutePermit, now: Instant, err: &ProviderError) {
        permit.failure(now, err.class, err.retry_after, err.transport);
    }
    use std::time::Duration;

    use super::*;
    use crate::config::{load_str, Config};
    use crate::health::breaker::BreakerState;
    use crate::health::Unavailable;
    use crate::types::Priority;

    fn config(breaker: &str) -> Config {
        load_str(&format!(
            "[[routes]]\nname = \"a\"\nprovider = \"simulated\"\n[models.chat]\nroutes = [\"a\"]\n[breaker]\n{breaker}"
        ))
        .expect("test config")
    }

    fn health(breaker: &str, now: Instant) -> Arc<Health> {
        Arc::new(Health::new(&config(breaker), now))
    }

    fn admit(h: &Arc<Health>, now: Instant) -> RoutePermit {
        h.acquire("a", now, Priority::Interactive).expect("the route admits")
    }

    fn state(h: &Health, now: Instant) -> BreakerState {
        h.route("a").expect("route a").state.lock().breaker.state(now)
    }

    fn dropped() -> ProviderError {
        ProviderError::new(ErrorClass::Unavailable, "connection reset mid-answer")
    }

    fn snapshot(h: &Health, now: Instant) -> crate::health::RouteSnapshot {
        h.snapshot(now, &config("")).remove(0)
    }

    #[tokio::test(start_paused = true)]
    async fn a_broken_connection_is_no_overload_signal_but_a_5xx_and_a_429_are() {
        let now = Instant::now();
        let h = health("consecutive_failures = 1000", now);
        let limit = |h: &Health| snapshot(h, now).admission_limit;
        let start = limit(&h);
        let mut reset = dropped();
        reset.transport = true;
        for _ in 0..5 {
            fail(admit(&h, now), now, &reset);
        }
        assert_eq!(limit(&h), start, "resets mid-answer leave the admission limit alone");
        fail(admit(&h, now), now, &dropped().with_status(503));
        let after_503 = limit(&h);
        assert!(after_503 < start, "a 503 shrinks it: {start} -> {after_503}");
        let later = now + Duration::from_secs(5);
        fail(
            admit(&h, later),
            later,
            &ProviderError::new(ErrorClass::RateLimited, "slow down"),
        );
        assert!(limit(&h) < after_503, "so does a 429");
    }

    /// Problem 1 of the review: 26 mid-stream drops left the breaker closed at 0% errors.
    #[tokio::test(start_paused = true)]
    async fn midstream_failures_open_the_breaker_and_show_in_the_error_rate() {
        let now = Instant::now();
        let h = health("", now);
        for _ in 0..5 {
            let mut p = admit(&h, now);
            p.first_token(now);
            fail(p, now, &dropped());
        }
        assert!(
            matches!(state(&h, now), BreakerState::Open { .. }),
            "five streams that died after their first token open the breaker"
        );
        let snap = snapshot(&h, now);
        assert_eq!(snap.error_rate, 1.0, "the drops are in the error rate");
        assert_eq!(snap.failures, 5, "every failure counted");
        assert_eq!(snap.midstream_failures, 5, "all after the first token");
    }

    #[tokio::test(start_paused = true)]
    async fn a_completed_answer_counts_one_success() {
        let now = Instant::now();
        let h = health("", now);
        let mut p = admit(&h, now);
        p.first_token(now);
        p.success(now);
        fail(admit(&h, now), now, &dropped());
        let snap = snapshot(&h, now);
        assert_eq!(snap.error_rate, 0.5, "one success and one failure, each counted once");
        assert_eq!(
            (snap.failures, snap.midstream_failures),
            (1, 0),
            "a failure before commit"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn not_found_and_invalid_output_count_against_the_route() {
        let now = Instant::now();
        let h = health("consecutive_failures = 2\n", now);
        fail(
            admit(&h, now),
            now,
            &ProviderError::new(ErrorClass::NotFound, "no such model"),
        );
        fail(
            admit(&h, now),
            now,
            &ProviderError::new(ErrorClass::InvalidOutput, "bad tool JSON"),
        );
        assert!(matches!(state(&h, now), BreakerState::Open { .. }), "both count");
    }

    /// Problem 2 of the review: a straggler's permit freed the real probe's slot.
    #[tokio::test(start_paused = true)]
    async fn straggler_permit_does_not_release_the_probe_slot() {
        let start = Instant::now();
        let h = health("probe = \"traffic\"\n", start);
        let straggler = admit(&h, start);
        let failing = admit(&h, start);
        h.force_open("a", start);
        let cooled = start + Duration::from_secs(1);
        let probe = admit(&h, cooled);
        assert!(
            probe.is_probe() && !straggler.is_probe(),
            "only the half-open admission is a probe"
        );
        drop(straggler);
        assert!(
            h.acquire("a", cooled, Priority::Interactive).is_err(),
            "the straggler's drop lets in no second probe"
        );
        fail(failing, cooled, &dropped());
        assert_eq!(state(&h, cooled), BreakerState::HalfOpen, "nor does its failure reopen");
        fail(probe, cooled, &dropped());
        assert!(
            matches!(state(&h, cooled), BreakerState::Open { .. }),
            "the probe's own failure reopens"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn straggler_success_does_not_close_a_half_open_breaker() {
        let start = Instant::now();
        let h = health("probe = \"traffic\"\n", start);
        let mut straggler = admit(&h, start);
        h.force_open("a", start);
        let cooled = start + Duration::from_secs(1);
        let _probe = admit(&h, cooled);
        straggler.first_token(cooled);
        straggler.success(cooled);
        assert_eq!(state(&h, cooled), BreakerState::HalfOpen, "only the probe decides");
    }

    #[tokio::test(start_paused = true)]
    async fn with_a_prober_half_open_admits_no_user_request() {
        let start = Instant::now();
        let h = health("", start);
        let _prober = h.attach_prober();
        h.force_open("a", start);
        let cooled = start + Duration::from_secs(1);
        assert!(h.availability("a", cooled).is_err(), "the router is told no");
        assert!(
            h.acquire("a", cooled, Priority::Interactive).is_err(),
            "users are refused"
        );
        assert!(h.view("a", cooled).breaker_open, "ranked as open");
        let probe = h.acquire_probe("a", cooled).expect("the prober probes");
        assert!(h.acquire_probe("a", cooled).is_none(), "one probe at a time");
        probe.success(cooled);
        assert_eq!(state(&h, cooled), BreakerState::Closed, "the probe's success closes");
        assert!(h.acquire("a", cooled, Priority::Interactive).is_ok(), "users are back");
        let snap = snapshot(&h, cooled);
        assert_eq!(
            (snap.probes, snap.error_rate),
            (1, 0.0),
            "a probe stays out of the error rate"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_prober_half_open_falls_back_to_traffic_probes() {
        let start = Instant::now();
        let h = health("", start);
        drop(h.attach_prober());
        h.force_open("a", start);
        let cooled = start + Duration::from_secs(1);
        let probe = h.acquire("a", cooled, Priority::Interactive);
        assert!(
            probe.is_ok_and(|p| p.is_probe()),
            "a route nobody probes in the background is probed by traffic, never stranded"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_reopens_whatever_its_class() {
        let start = Instant::now();
        let h = health("", start);
        let _prober = h.attach_prober();
        h.force_open("a", start);
        let cooled = start + Duration::from_secs(1);
        let mut err = ProviderError::new(ErrorClass::RateLimited, "slow down");
        err.retry_after = Some(Duration::from_secs(3));
        fail(h.acquire_probe("a", cooled).expect("probe"), cooled, &err);
        assert!(
            matches!(state(&h, cooled), BreakerState::Open { .. }),
            "a 429 is no proof of recovery"
        );
        assert_eq!(
            h.probe_due("a", cooled),
            Some(cooled + Duration::from_secs(3)),
            "the next probe waits out the Retry-After (longer than the 2 s cool-down)"
        );
        assert_eq!(snapshot(&h, cooled).probe_failures, 1, "counted as a failed probe");
    }

    #[tokio::test(start_paused = true)]
    async fn quota_failure_cools_the_route_for_the_quota_cooldown() {
        let now = Instant::now();
        let h = health("", now);
        fail(
            admit(&h, now),
            now,
            &ProviderError::new(ErrorClass::Quota, "insufficient_quota"),
        );
        let almost = now + Duration::from_secs(300) - Duration::from_millis(1);
        assert!(
            matches!(h.availability("a", almost), Err(Unavailable::Cooling { .. })),
            "cooled for five minutes"
        );
        assert!(h.availability("a", now + Duration::from_secs(300)).is_ok(), "then back");
        assert_eq!(
            state(&h, now),
            BreakerState::Closed,
            "a quota failure is not a breaker failure"
        );
    }
}
