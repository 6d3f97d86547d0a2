//! Route health, written by the mux and copied by the gateway for the router (`views`): TTFT
//! and inter-token windows, breakers, cool-downs after 429s, AIMD admission, hedge counters.
//!
//! One `Mutex` per route around pure state machines that take `now`: no task per route, no
//! timers, so everything here runs under paused time in tests. The one background actor,
//! the prober (`mux::probe`), only reads when a probe is due and reports like any attempt.
//!
//! - [`permit`]: one attempt's permission and how its outcome is reported;
//! - [`view`]: the per-route views the gateway copies out for the router, and what
//!   `/admin/routes` shows;
//! - [`lease`]: session → route leases, written by the mux at commit, copied by the gateway
//!   before planning;
//! - [`peer`]: what this instance tells its peers, and their hints on its routes.
//!
//! Peer hints (`shared::hints`): other instances' breaker openings and 429 cool-downs. A live
//! hint makes the route's view cooling, so ranking puts it last (tried only when no other
//! candidate serves) and the decision record shows it as `cooling` with `recovers_in_ms`; it
//! never refuses an attempt ([`Health::acquire`] goes by this instance's own observations),
//! never touches the breaker, and ends with its TTL.

pub mod admission;
pub mod breaker;
pub mod lease;
pub mod peer;
pub mod permit;
pub mod ttft;
pub mod view;
pub mod window;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use self::admission::{Aimd, AimdConfig};
use self::breaker::{Breaker, BreakerState, ProbeMode};
use self::ttft::LatencyWindow;
use self::window::RollingCounts;
use crate::config::{Config, HedgeConfig};
use crate::telemetry::handles::RouteHandles;
use crate::types::Priority;

pub use peer::{HintKind, Outage};
pub use permit::{PermitKind, RoutePermit};
pub use view::{RouteSnapshot, RouteView, RouteViews};

/// How long a 429 without Retry-After cools its route.
pub const DEFAULT_COOLING: Duration = Duration::from_secs(1);
/// The longest an upstream's Retry-After may cool a route (a bogus huge value must not take
/// a route away for days, nor overflow the clock).
const MAX_COOLING: Duration = Duration::from_secs(3600);

/// The shortest stall limit derived from observed gaps.
const STALL_FLOOR: Duration = Duration::from_secs(5);

/// Health of every configured route, indexed by route name.
pub struct Health {
    routes: Vec<RouteHealth>,
    index: HashMap<String, usize>,
    /// `[breaker] probe` as configured.
    probe_mode: ProbeMode,
    /// How long a route out of quota is cooled.
    quota_cooldown: Duration,
    /// Background probers running against this health (0 or 1). Without one, half-open
    /// routes fall back to traffic probes, so a `Health` nobody probes never strands a route.
    probers: AtomicUsize,
}

pub struct RouteHealth {
    pub name: String,
    state: Mutex<RouteState>,
    pub counters: RouteCounters,
    /// The route's metric handles (`telemetry::handles`).
    pub metrics: RouteHandles,
}

#[derive(Default)]
pub struct RouteCounters {
    pub attempts: AtomicU64,
    /// Hedges fired as this route (the hedge's target).
    pub hedges_fired: AtomicU64,
    /// Hedges fired because this route, as the primary, had no first token in time.
    pub hedges_fired_by: AtomicU64,
    pub hedges_won: AtomicU64,
    pub hedges_lost: AtomicU64,
    pub cancelled: AtomicU64,
    /// Attempts that failed in a way that counts against the route, before or after commit.
    pub failures: AtomicU64,
    /// The share of `failures` that came after the attempt's first token.
    pub midstream_failures: AtomicU64,
    /// Background probes sent, and how many of them failed.
    pub probes: AtomicU64,
    pub probe_failures: AtomicU64,
}

struct RouteState {
    ttft: LatencyWindow,
    gaps: LatencyWindow,
    breaker: Breaker,
    admission: Aimd,
    /// User attempts' outcomes (probes are left out): the router's error rate.
    outcomes: RollingCounts<2>,
    cooling_until: Option<Instant>,
    /// The latest live hint from another instance, advisory only.
    peer: Option<(HintKind, Instant)>,
}

impl RouteState {
    /// Cools the route until at least `until`.
    fn cool_until(&mut self, until: Instant) {
        self.cooling_until = Some(self.cooling_until.map_or(until, |u| u.max(until)));
    }

    /// Until when the route's view is cooling: this instance's cool-down after a rate limit,
    /// or a peer's live hint, whichever ends later (what ranking and `/admin/routes` read).
    fn cooling(&self, now: Instant) -> Option<Instant> {
        let peer = self.peer.map(|(_, until)| until).filter(|u| *u > now);
        match (self.local_cooling(now), peer) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// This instance's own cool-down after a rate limit: what refuses attempts.
    fn local_cooling(&self, now: Instant) -> Option<Instant> {
        self.cooling_until.filter(|u| *u > now)
    }
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

/// Marks a background prober as running until dropped (see [`Health::attach_prober`]).
pub struct ProberAttached {
    health: Arc<Health>,
}

impl Drop for ProberAttached {
    fn drop(&mut self) {
        self.health.probers.fetch_sub(1, Ordering::SeqCst);
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
                    peer: None,
                }),
                counters: RouteCounters::default(),
                metrics: RouteHandles::new(&r.name),
            })
            .collect();
        let index = routes.iter().enumerate().map(|(i, r)| (r.name.clone(), i)).collect();
        Health {
            routes,
            index,
            probe_mode: config.breaker.probe,
            quota_cooldown: config.breaker.quota_cooldown,
            probers: AtomicUsize::new(0),
        }
    }

    pub fn route(&self, name: &str) -> Option<&RouteHealth> {
        self.index.get(name).map(|&i| &self.routes[i])
    }

    pub fn routes(&self) -> &[RouteHealth] {
        &self.routes
    }

    /// Declares a background prober running until the guard drops. While one runs (and
    /// `[breaker] probe = "background"`), half-open routes admit no user request.
    pub fn attach_prober(self: &Arc<Self>) -> ProberAttached {
        self.probers.fetch_add(1, Ordering::SeqCst);
        ProberAttached {
            health: Arc::clone(self),
        }
    }

    /// Are half-open routes probed in the background right now (configured and running)?
    pub fn background_probing(&self) -> bool {
        self.probe_mode == ProbeMode::Background && self.probers.load(Ordering::SeqCst) > 0
    }

    /// How user requests meet a half-open breaker right now.
    fn user_probes(&self) -> ProbeMode {
        if self.background_probing() {
            ProbeMode::Background
        } else {
            ProbeMode::Traffic
        }
    }

    /// Can `name` take a new attempt now? (breaker and cool-down; admission is checked when
    /// the attempt actually starts.)
    pub fn availability(&self, name: &str, now: Instant) -> Result<(), Unavailable> {
        let Some(r) = self.route(name) else { return Ok(()) };
        let s = r.state.lock();
        if let Some(until) = s.local_cooling(now) {
            return Err(Unavailable::Cooling { until });
        }
        if !s.breaker.allows(now, self.user_probes()) {
            return Err(Unavailable::BreakerOpen {
                until: breaker_until(&s.breaker, now),
            });
        }
        Ok(())
    }

    /// Takes breaker and admission permission for one attempt on `name`.
    pub fn acquire(self: &Arc<Self>, name: &str, now: Instant, priority: Priority) -> Result<RoutePermit, Unavailable> {
        let idx = *self.index.get(name).ok_or(Unavailable::Saturated)?;
        let r = &self.routes[idx];
        let mut s = r.state.lock();
        if let Some(until) = s.local_cooling(now) {
            return Err(Unavailable::Cooling { until });
        }
        if !s.admission.try_acquire(priority) {
            return Err(Unavailable::Saturated);
        }
        let Some(ticket) = s.breaker.try_acquire(now, self.user_probes()) else {
            s.admission.release();
            return Err(Unavailable::BreakerOpen {
                until: breaker_until(&s.breaker, now),
            });
        };
        r.counters.attempts.fetch_add(1, Ordering::Relaxed);
        Ok(RoutePermit::new(Arc::clone(self), idx, ticket, PermitKind::Attempt))
    }

    /// Takes the probe slot of `name` for the background prober, when its breaker has
    /// cooled and the route is not cooling after a rate limit or quota failure.
    pub fn acquire_probe(self: &Arc<Self>, name: &str, now: Instant) -> Option<RoutePermit> {
        let idx = *self.index.get(name)?;
        let r = &self.routes[idx];
        let mut s = r.state.lock();
        if s.local_cooling(now).is_some() || !s.admission.try_acquire(Priority::Interactive) {
            return None;
        }
        let Some(ticket) = s.breaker.try_probe(now) else {
            s.admission.release();
            return None;
        };
        r.counters.probes.fetch_add(1, Ordering::Relaxed);
        Some(RoutePermit::new(Arc::clone(self), idx, ticket, PermitKind::Probe))
    }

    /// When `name` needs its next background probe: the end of its cool-down (or of a rate
    /// limit's cooling, whichever is later); `None` when closed or a probe is running.
    pub fn probe_due(&self, name: &str, now: Instant) -> Option<Instant> {
        let s = self.route(name)?.state.lock();
        let due = s.breaker.probe_due(now)?;
        Some(s.local_cooling(now).map_or(due, |c| c.max(due)))
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
        match self.route(name) {
            Some(r) => {
                r.state.lock().ttft.record(now, ttft);
                r.metrics.ttft().record(ttft.as_secs_f64());
            }
            None => {
                metrics::histogram!(crate::telemetry::TTFT_SECONDS, "route" => name.to_string())
                    .record(ttft.as_secs_f64());
            }
        }
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

    /// Opens a route's breaker on purpose for one cool-down (drills).
    pub fn force_open(&self, name: &str, now: Instant) -> bool {
        self.force_open_for(name, now, Duration::ZERO).is_some()
    }

    /// Opens a route's breaker on purpose for one cool-down or `at_least`, the longer (a
    /// drill with a duration). Returns when the breaker may take traffic again (a 429's
    /// cool-down on the route runs apart from it); `None` for an unknown route.
    pub fn force_open_for(&self, name: &str, now: Instant, at_least: Duration) -> Option<Instant> {
        self.route(name)
            .map(|r| r.state.lock().breaker.force_open_for(now, at_least, "drill"))
    }
}

/// When a breaker that refuses traffic may take it again: the end of its cool-down, or for
/// a half-open breaker (a probe is deciding) one base cool-down from now, so a client's
/// Retry-After is never zero.
fn breaker_until(breaker: &Breaker, now: Instant) -> Instant {
    match breaker.state(now) {
        BreakerState::Open { until } => until,
        BreakerState::Closed | BreakerState::HalfOpen => now + breaker.config().cooldown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_peer_hint_ranks_a_route_cooling_until_its_ttl_but_never_refuses_or_opens_it() {
        let config = crate::config::load_str(
            "[[routes]]\nname = \"eu-a\"\nprovider = \"simulated\"\n[[routes]]\nname = \"eu-b\"\nprovider = \"simulated\"\n[models.chat]\nroutes = [\"eu-a\", \"eu-b\"]\n",
        )
        .expect("test config");
        let now = Instant::now();
        let h = Arc::new(Health::new(&config, now));
        assert!(h.peer_hint("eu-a", HintKind::BreakerOpen, now + Duration::from_secs(2)));
        let view = h.view("eu-a", now);
        assert!(
            view.cooling && !view.breaker_open,
            "cooling in the view, breaker closed"
        );
        assert_eq!(view.unavailable_for, Some(Duration::from_secs(2)), "for the hint's TTL");
        assert!(h.availability("eu-a", now).is_ok(), "the route is not refused");
        let permit = h.acquire("eu-a", now, Priority::Interactive);
        assert!(permit.is_ok(), "an attempt may still run on it");
        drop(permit);
        assert!(h.outages(now).is_empty(), "a peer's hint is never passed on as our own");
        tokio::time::advance(Duration::from_secs(2)).await;
        let later = Instant::now();
        assert!(!h.view("eu-a", later).cooling, "the hint ends with its TTL");
        assert!(h.live_peer_hint("eu-a", later).is_none());
        h.force_open("eu-a", later);
        assert_eq!(
            h.outages(later).first().map(|o| o.kind),
            Some(HintKind::BreakerOpen),
            "our own opening is an outage to tell"
        );
    }
}
