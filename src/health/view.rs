//! What is read of a route's health: the [`RouteView`]s the router plans with, taken before
//! planning with one short lock per route, and the [`RouteSnapshot`] `/admin/routes` shows.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::breaker::BreakerState;
use super::Health;
use crate::config::Config;
use crate::types::RouteStatus;

/// What the router reads of one route when it ranks: live latency, error rate, and whether
/// the route can take traffic now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RouteView {
    /// `None` until the window holds `VIEW_MIN_SAMPLES` first tokens.
    pub ttft_p50: Option<Duration>,
    pub ttft_p95: Option<Duration>,
    /// Failed share of recent attempts (0 with no attempts).
    pub error_rate: f64,
    /// Attempts behind `error_rate`.
    pub error_volume: u64,
    pub breaker_open: bool,
    /// Cooling after a rate limit.
    pub cooling: bool,
    /// How long until the breaker or the cool-down lets traffic through again.
    pub unavailable_for: Option<Duration>,
}

impl RouteView {
    /// Can the route take traffic now, as ranking and leases see it?
    pub fn status(&self) -> RouteStatus {
        if self.breaker_open {
            RouteStatus::BreakerOpen
        } else if self.cooling {
            RouteStatus::Cooling
        } else {
            RouteStatus::Available
        }
    }
}

/// The health one plan reads: a [`RouteView`] per route, copied out of [`Health`] before
/// planning so that the planner holds no lock and sees one consistent moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteViews {
    views: Vec<(String, RouteView)>,
}

impl RouteViews {
    /// `name`'s view; a fresh route's view for names not taken.
    pub fn get(&self, name: &str) -> RouteView {
        self.views
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .unwrap_or_default()
    }

    /// `name`'s view, looked for first at position `i`: views are taken in the order of the
    /// model's routes and planning walks them in that order, so this is one comparison where
    /// [`RouteViews::get`] scans (quadratic over a model of hundreds of routes).
    pub fn get_at(&self, i: usize, name: &str) -> RouteView {
        match self.views.get(i) {
            Some((n, v)) if n == name => *v,
            _ => self.get(name),
        }
    }
}

impl FromIterator<(String, RouteView)> for RouteViews {
    fn from_iter<I: IntoIterator<Item = (String, RouteView)>>(iter: I) -> Self {
        RouteViews {
            views: iter.into_iter().collect(),
        }
    }
}

/// Fewer first tokens than this and a route's percentiles are not reported.
const VIEW_MIN_SAMPLES: u64 = 5;

/// Per-route figures for `/admin/routes`.
#[derive(Debug, Clone, Serialize)]
pub struct RouteSnapshot {
    pub name: String,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub ttft_samples: u64,
    pub hedge_delay_ms: f64,
    pub breaker: String,
    pub breaker_open_ms: Option<u64>,
    pub cooling_ms: Option<u64>,
    pub admission_limit: f64,
    pub in_flight: u32,
    /// Failed share of user attempts in the last 10 s, mid-stream failures included.
    pub error_rate: f64,
    pub attempts: u64,
    pub hedges_fired: u64,
    /// Hedges fired because this route (the primary) was slow to its first token.
    pub hedges_fired_by: u64,
    pub hedges_won: u64,
    pub hedges_lost: u64,
    /// User attempts that failed in a way that counts against the route (since start).
    pub failures: u64,
    /// Of `failures`, those after the attempt's first token.
    pub midstream_failures: u64,
    /// Background probes sent, and how many failed.
    pub probes: u64,
    pub probe_failures: u64,
}

impl Health {
    /// The views of `names` at `now`, for one plan: one short lock per route, in turn.
    pub fn views<'a>(&self, names: impl IntoIterator<Item = &'a str>, now: Instant) -> RouteViews {
        names.into_iter().map(|n| (n.to_string(), self.view(n, now))).collect()
    }

    /// What ranking reads of `name` (a fresh route's view for unknown names), read under the
    /// route's lock: the percentiles are computed there, nothing else is copied out. Reading
    /// rotates the route's latency window to `now`, as recording would.
    pub fn view(&self, name: &str, now: Instant) -> RouteView {
        let Some(r) = self.route(name) else {
            return RouteView::default();
        };
        let mut s = r.state.lock();
        let volume = s.outcomes.volume(now);
        let cooling_until = s.cooling(now);
        let breaker_open = !s.breaker.allows(now, self.user_probes());
        let breaker_until = match s.breaker.state(now) {
            BreakerState::Open { until } if breaker_open => Some(until),
            _ => None,
        };
        let until = match (cooling_until, breaker_until) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        RouteView {
            ttft_p50: s.ttft.quantile(now, 0.50, VIEW_MIN_SAMPLES),
            ttft_p95: s.ttft.quantile(now, 0.95, VIEW_MIN_SAMPLES),
            error_rate: if volume == 0 { 0.0 } else { s.outcomes.error_rate(now) },
            error_volume: volume,
            breaker_open,
            cooling: cooling_until.is_some(),
            unavailable_for: until.map(|u| u.saturating_duration_since(now)),
        }
    }

    pub fn snapshot(&self, now: Instant, config: &Config) -> Vec<RouteSnapshot> {
        self.routes
            .iter()
            .map(|r| {
                let cfg = &config.hedge_for(&r.name);
                let mut s = r.state.lock();
                let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
                let volume = s.outcomes.volume(now);
                let count = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
                let breaker = s.breaker.state(now);
                RouteSnapshot {
                    name: r.name.clone(),
                    ttft_p50_ms: ms(s.ttft.quantile(now, 0.50, 1)),
                    ttft_p95_ms: ms(s.ttft.quantile(now, 0.95, 1)),
                    ttft_p99_ms: ms(s.ttft.quantile(now, 0.99, 1)),
                    ttft_samples: s.ttft.samples(now),
                    hedge_delay_ms: ms(s.ttft.quantile(now, cfg.percentile, cfg.min_samples))
                        .map(|d| {
                            d.max(cfg.floor.as_secs_f64() * 1e3)
                                .min(cfg.ceiling.as_secs_f64() * 1e3)
                        })
                        .unwrap_or(cfg.default_delay.max(cfg.floor).min(cfg.ceiling).as_secs_f64() * 1e3),
                    breaker: breaker.as_str().into(),
                    breaker_open_ms: match breaker {
                        BreakerState::Open { until } => Some(until.saturating_duration_since(now).as_millis() as u64),
                        _ => None,
                    },
                    cooling_ms: s
                        .cooling(now)
                        .map(|u| u.saturating_duration_since(now).as_millis() as u64),
                    admission_limit: s.admission.limit(),
                    in_flight: s.admission.in_flight(),
                    error_rate: if volume == 0 { 0.0 } else { s.outcomes.error_rate(now) },
                    attempts: count(&r.counters.attempts),
                    hedges_fired: count(&r.counters.hedges_fired),
                    hedges_fired_by: count(&r.counters.hedges_fired_by),
                    hedges_won: count(&r.counters.hedges_won),
                    hedges_lost: count(&r.counters.hedges_lost),
                    failures: count(&r.counters.failures),
                    midstream_failures: count(&r.counters.midstream_failures),
                    probes: count(&r.counters.probes),
                    probe_failures: count(&r.counters.probe_failures),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_are_copies_read_once_per_route() {
        let cfg = crate::config::load_str(crate::config::DEFAULT_TOML).expect("default config");
        let now = Instant::now();
        let health = Health::new(&cfg, now);
        let name = cfg.routes[0].name.clone();
        let views = health.views([name.as_str(), "nowhere"], now);
        health.force_open(&name, now);
        assert!(
            !views.get(&name).breaker_open,
            "a view is a copy: later changes do not show"
        );
        assert_eq!(views.get(&name).status(), RouteStatus::Available);
        assert_eq!(views.get("nowhere"), RouteView::default(), "unknown routes look fresh");
        assert_eq!(views.get_at(0, &name), views.get(&name), "found at its position");
        assert_eq!(views.get_at(1, &name), views.get(&name), "found elsewhere too");
        assert_eq!(views.get_at(7, "nowhere"), RouteView::default(), "out of range: fresh");
        let fresh = health.views([name.as_str()], now);
        assert_eq!(
            fresh.get(&name).status(),
            RouteStatus::BreakerOpen,
            "a new view sees it"
        );
    }
}
