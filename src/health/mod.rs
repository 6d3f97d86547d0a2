//! Route health shared by the router (reads) and the mux (writes): TTFT and inter-token
//! windows, breakers, cool-downs after 429s, AIMD admission, and hedge counters per route.
//!
//! One `Mutex` per route around pure state machines that take `now`: no task per route, no
//! timers, so everything here runs under paused time in tests.

pub mod admission;
pub mod breaker;
pub mod ttft;
pub mod window;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use tokio::time::Instant;

use self::admission::{Aimd, AimdConfig};
use self::breaker::{Breaker, BreakerState};
use self::ttft::LatencyWindow;
use self::window::RollingCounts;
use crate::config::{Config, HedgeConfig};
use crate::gateway::Priority;
use crate::provider::{ErrorClass, ProviderError};

/// Health of every configured route, indexed by route name.
/// How long a 429 without Retry-After cools its route.
pub const DEFAULT_COOLING: Duration = Duration::from_secs(1);
/// The longest an upstream's Retry-After may cool a route (a bogus huge value must not take
/// a route away for days, nor overflow the clock).
const MAX_COOLING: Duration = Duration::from_secs(3600);

/// The shortest stall limit derived from observed gaps.
const STALL_FLOOR: Duration = Duration::from_secs(5);

pub struct Health {
    routes: Vec<RouteHealth>,
    index: HashMap<String, usize>,
}

pub struct RouteHealth {
    pub name: String,
    state: Mutex<RouteState>,
    pub counters: RouteCounters,
}

#[derive(Default)]
pub struct RouteCounters {
    pub attempts: AtomicU64,
    pub hedges_fired: AtomicU64,
    pub hedges_won: AtomicU64,
    pub hedges_lost: AtomicU64,
    pub cancelled: AtomicU64,
}

struct RouteState {
    ttft: LatencyWindow,
    gaps: LatencyWindow,
    breaker: Breaker,
    admission: Aimd,
    outcomes: RollingCounts<2>,
    cooling_until: Option<Instant>,
}

/// Why a route cannot take traffic right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    BreakerOpen { until: Instant },
    Cooling { until: Instant },
    Saturated,
}

impl Unavailable {
    pub fn reason(&self, now: Instant) -> String {
        match self {
            Unavailable::BreakerOpen { until } => {
                format!(
                    "breaker open for {} ms more",
                    until.saturating_duration_since(now).as_millis()
                )
            }
            Unavailable::Cooling { until } => {
                format!(
                    "cooling after rate limit for {} ms more",
                    until.saturating_duration_since(now).as_millis()
                )
            }
            Unavailable::Saturated => "admission limit reached".to_string(),
        }
    }
}

impl Health {
    pub fn new(config: &Config, now: Instant) -> Self {
        let routes: Vec<RouteHealth> = config
            .routes
            .iter()
            .map(|r| RouteHealth {
                name: r.name.clone(),
                state: Mutex::new(RouteState {
                    ttft: LatencyWindow::new(config.hedge.window, now),
                    gaps: LatencyWindow::new(config.hedge.window, now),
                    breaker: Breaker::new(config.breaker.clone()),
                    admission: Aimd::new(AimdConfig {
                        initial: f64::from(r.concurrency),
                        max: f64::from(r.concurrency) * 16.0,
                        ..AimdConfig::default()
                    }),
                    outcomes: RollingCounts::new(Duration::from_secs(10)),
                    cooling_until: None,
                }),
                counters: RouteCounters::default(),
            })
            .collect();
        let index = routes.iter().enumerate().map(|(i, r)| (r.name.clone(), i)).collect();
        Health { routes, index }
    }

    pub fn route(&self, name: &str) -> Option<&RouteHealth> {
        self.index.get(name).map(|&i| &self.routes[i])
    }

    pub fn routes(&self) -> &[RouteHealth] {
        &self.routes
    }

    /// Can `name` take a new attempt now? (breaker and cool-down; admission is checked when
    /// the attempt actually starts.)
    pub fn availability(&self, name: &str, now: Instant) -> Result<(), Unavailable> {
        let Some(r) = self.route(name) else { return Ok(()) };
        let s = r.state.lock();
        if let Some(until) = s.cooling_until.filter(|u| *u > now) {
            return Err(Unavailable::Cooling { until });
        }
        if !s.breaker.allows(now) {
            if let BreakerState::Open { until } = s.breaker.state(now) {
                return Err(Unavailable::BreakerOpen { until });
            }
            return Err(Unavailable::BreakerOpen { until: now });
        }
        Ok(())
    }

    /// Takes breaker and admission permission for one attempt on `name`.
    pub fn acquire(self: &Arc<Self>, name: &str, now: Instant, priority: Priority) -> Result<RoutePermit, Unavailable> {
        let idx = *self.index.get(name).ok_or(Unavailable::Saturated)?;
        let r = &self.routes[idx];
        let mut s = r.state.lock();
        if let Some(until) = s.cooling_until.filter(|u| *u > now) {
            return Err(Unavailable::Cooling { until });
        }
        if !s.admission.try_acquire(priority) {
            return Err(Unavailable::Saturated);
        }
        if !s.breaker.try_acquire(now) {
            s.admission.release();
            let until = match s.breaker.state(now) {
                BreakerState::Open { until } => until,
                _ => now,
            };
            return Err(Unavailable::BreakerOpen { until });
        }
        r.counters.attempts.fetch_add(1, Ordering::Relaxed);
        Ok(RoutePermit {
            health: Arc::clone(self),
            idx,
            resolved: false,
            proven: false,
        })
    }

    /// The hedge delay for a primary on `name`: its live TTFT percentile clamped to
    /// [floor, ceiling], or the configured default until the window has enough samples.
    pub fn hedge_delay(&self, name: &str, cfg: &HedgeConfig, now: Instant) -> (Duration, bool) {
        let live = self
            .route(name)
            .and_then(|r| r.state.lock().ttft.quantile(now, cfg.percentile, cfg.min_samples));
        // max-then-min, not clamp: a route's floor above the global ceiling must not panic.
        match live {
            Some(d) => (d.max(cfg.floor).min(cfg.ceiling), true),
            None => (cfg.default_delay.max(cfg.floor).min(cfg.ceiling), false),
        }
    }

    /// Preloads a route's TTFT window (tests, warm starts).
    pub fn record_ttft(&self, name: &str, now: Instant, ttft: Duration) {
        if let Some(r) = self.route(name) {
            r.state.lock().ttft.record(now, ttft);
        }
        metrics::histogram!(crate::telemetry::TTFT_SECONDS, "route" => name.to_string()).record(ttft.as_secs_f64());
    }

    /// A quantile of the route's live TTFT, once the window has 20 samples.
    pub fn ttft_quantile(&self, name: &str, q: f64, now: Instant) -> Option<Duration> {
        self.route(name).and_then(|r| r.state.lock().ttft.quantile(now, q, 20))
    }

    /// A first token slower than the route's latency objective: shrink its admission limit
    /// as an overload signal would.
    pub fn latency_breach(&self, name: &str, now: Instant) {
        if let Some(r) = self.route(name) {
            r.state.lock().admission.on_overload(now);
        }
    }

    pub fn record_token_gap(&self, name: &str, now: Instant, gap: Duration) {
        if let Some(r) = self.route(name) {
            r.state.lock().gaps.record(now, gap);
        }
    }

    /// The stall limit for a route: ten times its observed p99 inter-token gap (from 50
    /// gaps), at least 5 s so a model's legitimate pauses are not cut, never more than the
    /// configured limit.
    pub fn stall_limit(&self, name: &str, configured: Duration, now: Instant) -> Duration {
        let observed = self
            .route(name)
            .and_then(|r| r.state.lock().gaps.quantile(now, 0.99, 50));
        match observed {
            Some(p99) => (p99 * 10).clamp(configured.min(STALL_FLOOR), configured),
            None => configured,
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
                    breaker: match s.breaker.state(now) {
                        BreakerState::Closed => "closed".into(),
                        BreakerState::Open { .. } => "open".into(),
                        BreakerState::HalfOpen => "half_open".into(),
                    },
                    breaker_open_ms: match s.breaker.state(now) {
                        BreakerState::Open { until } => Some(until.saturating_duration_since(now).as_millis() as u64),
                        _ => None,
                    },
                    cooling_ms: s
                        .cooling_until
                        .filter(|u| *u > now)
                        .map(|u| u.saturating_duration_since(now).as_millis() as u64),
                    admission_limit: s.admission.limit(),
                    in_flight: s.admission.in_flight(),
                    error_rate: if volume == 0 { 0.0 } else { s.outcomes.error_rate(now) },
                    attempts: r.counters.attempts.load(Ordering::Relaxed),
                    hedges_fired: r.counters.hedges_fired.load(Ordering::Relaxed),
                    hedges_won: r.counters.hedges_won.load(Ordering::Relaxed),
                    hedges_lost: r.counters.hedges_lost.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// Opens a route's breaker on purpose (drills).
    pub fn force_open(&self, name: &str, now: Instant) -> bool {
        match self.route(name) {
            Some(r) => {
                r.state.lock().breaker.force_open(now, "drill");
                true
            }
            None => false,
        }
    }
}

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
    pub error_rate: f64,
    pub attempts: u64,
    pub hedges_fired: u64,
    pub hedges_won: u64,
    pub hedges_lost: u64,
}

/// Permission for one attempt on a route. Report how it ended with `success`/`failure`;
/// dropping it unresolved (a cancelled hedge loser, a client that left) frees the slot
/// without judging the route.
pub struct RoutePermit {
    health: Arc<Health>,
    idx: usize,
    resolved: bool,
    /// A first token arrived: the breaker already counted this attempt a success (a half-open
    /// probe closes at its first token, not at the end of a long answer).
    proven: bool,
}

impl RoutePermit {
    pub fn route(&self) -> &str {
        &self.health.routes[self.idx].name
    }

    /// The attempt produced its first token: the route works, whatever happens later.
    pub fn first_token(&mut self, now: Instant) {
        if !self.proven {
            self.health.routes[self.idx].state.lock().breaker.on_success(now);
            self.proven = true;
        }
    }

    pub fn success(mut self, now: Instant) {
        let mut s = self.health.routes[self.idx].state.lock();
        if !self.proven {
            s.breaker.on_success(now);
        }
        s.admission.on_success();
        s.outcomes.record(now, true);
        self.resolved = true;
    }

    pub fn failure(mut self, now: Instant, err: &ProviderError) {
        let mut s = self.health.routes[self.idx].state.lock();
        if err.class.counts_against_route() {
            s.breaker.on_failure(now);
            s.outcomes.record(now, false);
        } else if !self.proven {
            s.breaker.release_probe();
        }
        if matches!(err.class, ErrorClass::RateLimited | ErrorClass::Unavailable) {
            s.admission.on_overload(now);
        }
        if err.class == ErrorClass::RateLimited {
            let wait = err.retry_after.unwrap_or(DEFAULT_COOLING).min(MAX_COOLING);
            let until = now + wait;
            s.cooling_until = Some(s.cooling_until.map_or(until, |u| u.max(until)));
        }
        self.resolved = true;
    }
}

impl Drop for RoutePermit {
    fn drop(&mut self) {
        let mut s = self.health.routes[self.idx].state.lock();
        s.admission.release();
        if !self.resolved && !self.proven {
            s.breaker.release_probe();
        }
    }
}

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

/// Fewer first tokens than this and a route's percentiles are not reported.
const VIEW_MIN_SAMPLES: u64 = 5;

impl Health {
    /// A read-only view of `name` for ranking (a fresh route's view for unknown names).
    pub fn view(&self, name: &str, now: Instant) -> RouteView {
        let Some(r) = self.route(name) else {
            return RouteView::default();
        };
        let mut s = r.state.lock();
        let volume = s.outcomes.volume(now);
        let cooling_until = s.cooling_until.filter(|u| *u > now);
        let breaker_open = !s.breaker.allows(now);
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
}
