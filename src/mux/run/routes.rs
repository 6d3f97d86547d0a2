//! The request's routes in plan order and what has happened to each within this request
//! (untried, running, failed, refused the prefill), plus why routes were passed over.
//!
//! A route passed over for a reason that passes (its breaker, a cool-down, a full admission
//! limit, a budget, too little deadline for it) stays a candidate: a later failover may still
//! use it. Only a route that ran and failed, or is running, is out of the request's way.

use std::time::Duration;

use tokio::time::Instant;

use crate::health::Unavailable;
use crate::mux::budget::Refusal;
use crate::types::{Candidate, Level};

/// What has happened to one candidate within this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RouteState {
    Untried,
    Running,
    /// It ran and failed (before or after its first token).
    Failed,
    /// It refused a continuation request (a 400 to the prefill) and is otherwise healthy: a
    /// restart may use it.
    PrefillRefused,
    /// It served (committed) this request.
    Served,
}

/// Why a route was passed over without an attempt.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Skip {
    /// The router excluded it (eligibility), with its explanation.
    Excluded(String),
    /// Less deadline left than the route's minimum useful time.
    Deadline {
        left: Duration,
        useful: Duration,
    },
    /// Breaker open, cooling after a rate limit, or admission full.
    Unavailable(Unavailable),
    Budget(Refusal),
}

impl Skip {
    pub fn reason(&self, now: Instant) -> String {
        match self {
            Skip::Excluded(why) => why.clone(),
            Skip::Deadline { left, useful } => format!(
                "deadline: {} ms left, less than the route's minimum useful time of {} ms",
                left.as_millis(),
                useful.as_millis()
            ),
            Skip::Unavailable(u) => u.reason(now),
            Skip::Budget(r) => r.reason().to_string(),
        }
    }

    /// How long until the route could take the request (a Retry-After hint).
    pub fn wait(&self, now: Instant) -> Option<Duration> {
        match self {
            Skip::Unavailable(Unavailable::BreakerOpen { until } | Unavailable::Cooling { until }) => {
                Some(until.saturating_duration_since(now))
            }
            Skip::Unavailable(Unavailable::Saturated) => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    pub fn metric_label(&self) -> &'static str {
        match self {
            Skip::Excluded(_) => "excluded",
            Skip::Deadline { .. } => "deadline",
            Skip::Unavailable(Unavailable::BreakerOpen { .. }) => "breaker_open",
            Skip::Unavailable(Unavailable::Cooling { .. }) => "cooling",
            Skip::Unavailable(Unavailable::Saturated) => "saturated",
            Skip::Budget(r) => r.metric_label(),
        }
    }
}

pub(super) struct Routes {
    candidates: Vec<Candidate>,
    state: Vec<RouteState>,
    /// The latest reason each passed-over route was skipped, in first-skipped order.
    skipped: Vec<(String, Skip, Instant)>,
}

impl Routes {
    pub fn new(candidates: Vec<Candidate>, excluded: impl Iterator<Item = (String, String)>, now: Instant) -> Self {
        Routes {
            state: vec![RouteState::Untried; candidates.len()],
            candidates,
            skipped: excluded.map(|(r, why)| (r, Skip::Excluded(why), now)).collect(),
        }
    }

    pub fn candidate(&self, i: usize) -> &Candidate {
        &self.candidates[i]
    }

    pub fn len(&self) -> usize {
        self.candidates.len()
    }

    pub fn state(&self, i: usize) -> RouteState {
        self.state[i]
    }

    pub fn position(&self, route: &str) -> Option<usize> {
        self.candidates.iter().position(|c| c.route == route)
    }

    pub fn set(&mut self, route: &str, state: RouteState) {
        if let Some(i) = self.position(route) {
            self.state[i] = state;
        }
    }

    /// Is there a route this request has not run yet (whatever its health now)?
    pub fn any_untried(&self, usable: impl Fn(&Candidate) -> bool) -> bool {
        self.candidates
            .iter()
            .zip(&self.state)
            .any(|(c, s)| *s == RouteState::Untried && usable(c))
    }

    /// The rung of the first untried route, if any.
    pub fn next_untried_level(&self) -> Option<Level> {
        self.candidates
            .iter()
            .zip(&self.state)
            .find(|(_, s)| **s == RouteState::Untried)
            .map(|(c, _)| c.level)
    }

    /// The first untried route other than `route` (for shadows).
    pub fn next_other(&self, route: &str) -> Option<&str> {
        self.candidates
            .iter()
            .zip(&self.state)
            .find(|(c, s)| **s == RouteState::Untried && c.route != route)
            .map(|(c, _)| c.route.as_str())
    }

    pub fn skip(&mut self, route: &str, why: Skip, now: Instant) {
        match self.skipped.iter_mut().find(|s| s.0 == route) {
            Some(entry) => {
                entry.1 = why;
                entry.2 = now;
            }
            None => self.skipped.push((route.to_string(), why, now)),
        }
    }

    /// Routes passed over (and not run since), with their latest reason.
    pub fn skipped(&self) -> impl Iterator<Item = (&str, &Skip, Instant)> {
        self.skipped
            .iter()
            .filter(|(r, _, _)| {
                self.position(r)
                    .is_none_or(|i| !matches!(self.state[i], RouteState::Running | RouteState::Served))
            })
            .map(|(r, s, at)| (r.as_str(), s, *at))
    }

    /// Was every route passed over only because it is cooling after a rate limit (besides
    /// routes eligibility excluded)? Then the honest answer is the providers' 429.
    pub fn only_cooling_skips(&self) -> bool {
        let mut any = false;
        for (_, skip, _) in self.skipped() {
            match skip {
                Skip::Unavailable(Unavailable::Cooling { .. }) => any = true,
                Skip::Excluded(_) => {}
                _ => return false,
            }
        }
        any
    }

    /// Did only the deadline stop this request from trying a route?
    pub fn only_deadline_skips(&self) -> bool {
        let mut any = false;
        for (_, skip, _) in self.skipped() {
            match skip {
                Skip::Deadline { .. } => any = true,
                Skip::Excluded(_) => {}
                _ => return false,
            }
        }
        any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes() -> Routes {
        let c = |r: &str, level| Candidate { route: r.into(), level };
        Routes::new(
            vec![c("a", Level::L0), c("b", Level::L0), c("c", Level::L1)],
            std::iter::once(("x".to_string(), "region".to_string())),
            Instant::now(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_skipped_route_stays_a_candidate() {
        let mut r = routes();
        let now = Instant::now();
        r.skip("b", Skip::Budget(Refusal::HedgeBudget), now);
        assert!(
            r.any_untried(|c| c.route == "b"),
            "a budget refusal does not lose the route"
        );
        r.set("a", RouteState::Failed);
        r.set("b", RouteState::Running);
        assert_eq!(r.next_untried_level(), Some(Level::L1));
        assert_eq!(
            r.skipped().map(|s| s.0).collect::<Vec<_>>(),
            vec!["x"],
            "a route that later ran is not reported as skipped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_route_skipped_twice_is_listed_once_with_its_latest_reason() {
        let mut r = routes();
        let now = Instant::now();
        r.skip("c", Skip::Unavailable(Unavailable::Saturated), now);
        r.skip(
            "c",
            Skip::Deadline {
                left: Duration::from_millis(1),
                useful: Duration::from_millis(50),
            },
            now,
        );
        let listed: Vec<_> = r.skipped().filter(|s| s.0 == "c").collect();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].1.metric_label(), "deadline");
        assert!(r.only_deadline_skips(), "exclusions by the router do not count");
    }
}
