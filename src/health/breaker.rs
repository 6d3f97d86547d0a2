//! Per-route circuit breaker: a plain state machine over reported outcomes and `now`.
//!
//! # Why
//! A route that keeps failing costs every request that tries it a failed attempt (and,
//! before commit, a slice of its deadline). The breaker takes such a route out of the
//! plan for a cool-down, then lets a few probes find out whether it recovered.
//!
//! # States and triggers
//! - **Closed**: all traffic passes. Outcomes go into a rolling window
//!   ([`crate::health::window`]). The breaker opens when either
//!   - the window holds at least `min_volume` outcomes and its error rate reaches
//!     `error_rate`, or
//!   - `consecutive_failures` failures arrive in a row (0 turns this trigger off).
//! - **Open { until }**: no traffic until `until` (`now + cooldown`).
//! - **Half-open**: once cooled, exactly `half_open_probes` concurrent requests are
//!   admitted. The first probe success closes the breaker and resets the cool-down to its
//!   base; the first probe failure opens it again with the cool-down doubled (capped at
//!   `max_cooldown`). A probe that ends with neither (a cancelled hedge loser) hands its
//!   slot back with [`Breaker::release_probe`].
//!
//! Nothing here runs on its own: there is no task and no timer. Every method that
//! depends on time takes `now`, and the open → half-open step happens when a caller
//! looks at the breaker after `until`.
//!
//! # Known limits
//! - Outcomes carry no ticket, so an outcome arriving while half-open is taken as a
//!   probe's outcome whenever a probe is in flight, even if it belongs to a request
//!   admitted before the breaker opened. Outcomes arriving while open, or half-open with
//!   no probe in flight, are stragglers and are ignored.
//! - The window is cleared on every transition, so a closed breaker starts from fresh
//!   evidence and the error-rate trigger needs `min_volume` new outcomes to fire again.

use std::time::Duration;

use tokio::time::Instant;

use super::window::OutcomeCounts;

/// When a breaker opens and how long it stays open.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// How far back the error rate looks.
    pub window: Duration,
    /// Outcomes the window must hold before the error rate can open the breaker.
    pub min_volume: u32,
    /// Error rate (0.0..=1.0) at or above which the breaker opens.
    pub error_rate: f64,
    /// Failures in a row that open the breaker regardless of volume; 0 disables.
    pub consecutive_failures: u32,
    /// First cool-down after opening.
    pub cooldown: Duration,
    /// Cap for the doubling cool-down.
    pub max_cooldown: Duration,
    /// Concurrent probes admitted when half-open (at least 1).
    pub half_open_probes: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            window: Duration::from_secs(10),
            min_volume: 20,
            error_rate: 0.5,
            consecutive_failures: 5,
            cooldown: Duration::from_secs(1),
            max_cooldown: Duration::from_secs(30),
            half_open_probes: 1,
        }
    }
}

/// What the breaker says about a route at some instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open { until: Instant },
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Closed,
    /// Cooling down until `until`; from then on it behaves as half-open with no probes.
    Open {
        until: Instant,
    },
    HalfOpen {
        probes_in_flight: u32,
    },
}

/// One route's breaker. See the module doc for the state machine.
#[derive(Debug, Clone)]
pub struct Breaker {
    cfg: BreakerConfig,
    phase: Phase,
    outcomes: OutcomeCounts,
    consecutive_failures: u32,
    cooldown: Duration,
    opened_reason: Option<String>,
}

impl Breaker {
    pub fn new(cfg: BreakerConfig) -> Self {
        Breaker {
            outcomes: OutcomeCounts::new(cfg.window),
            cooldown: cfg.cooldown.min(cfg.max_cooldown),
            cfg,
            phase: Phase::Closed,
            consecutive_failures: 0,
            opened_reason: None,
        }
    }

    pub fn config(&self) -> &BreakerConfig {
        &self.cfg
    }

    /// Would [`Breaker::try_acquire`] admit a request now? For the router's snapshot:
    /// closed, or cooled down with a probe slot free.
    pub fn allows(&self, now: Instant) -> bool {
        match self.phase {
            Phase::Closed => true,
            Phase::Open { until } => now >= until,
            Phase::HalfOpen { probes_in_flight } => probes_in_flight < self.probe_slots(),
        }
    }

    /// Admits one request if the breaker allows it. When half-open, an admitted request
    /// is a probe and holds a probe slot until its outcome (or [`Breaker::release_probe`]).
    pub fn try_acquire(&mut self, now: Instant) -> bool {
        match self.phase {
            Phase::Closed => true,
            Phase::Open { until } if now >= until => {
                self.phase = Phase::HalfOpen { probes_in_flight: 1 };
                true
            }
            Phase::Open { .. } => false,
            Phase::HalfOpen { probes_in_flight } if probes_in_flight < self.probe_slots() => {
                self.phase = Phase::HalfOpen {
                    probes_in_flight: probes_in_flight + 1,
                };
                true
            }
            Phase::HalfOpen { .. } => false,
        }
    }

    /// A request through this route succeeded (for the breaker: its failure class did not
    /// count against the route).
    pub fn on_success(&mut self, now: Instant) {
        match self.phase {
            Phase::Closed => {
                self.outcomes.record(now, true);
                self.consecutive_failures = 0;
            }
            Phase::HalfOpen { probes_in_flight } if probes_in_flight > 0 => self.close(),
            // A straggler admitted before the breaker opened: no evidence about recovery.
            Phase::HalfOpen { .. } | Phase::Open { .. } => {}
        }
    }

    /// A request through this route failed in a way that counts against it.
    pub fn on_failure(&mut self, now: Instant) {
        match self.phase {
            Phase::Closed => {
                self.outcomes.record(now, false);
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                if let Some(reason) = self.trip_reason(now) {
                    self.open(now, reason);
                }
            }
            Phase::HalfOpen { probes_in_flight } if probes_in_flight > 0 => {
                self.cooldown = self.cooldown.saturating_mul(2).min(self.cfg.max_cooldown);
                self.open(now, "half-open probe failed".to_string());
            }
            Phase::HalfOpen { .. } | Phase::Open { .. } => {}
        }
    }

    /// A probe ended with neither success nor failure (cancelled hedge loser, client gone):
    /// its slot is free for another probe. Does nothing unless half-open.
    pub fn release_probe(&mut self) {
        if let Phase::HalfOpen { probes_in_flight } = &mut self.phase {
            *probes_in_flight = probes_in_flight.saturating_sub(1);
        }
    }

    /// Opens the breaker now for the current cool-down (drills, operator action).
    pub fn force_open(&mut self, now: Instant, reason: &str) {
        self.open(now, reason.to_string());
    }

    /// The state as seen at `now`: an open breaker whose cool-down has passed is half-open.
    pub fn state(&self, now: Instant) -> BreakerState {
        match self.phase {
            Phase::Closed => BreakerState::Closed,
            Phase::Open { until } if now < until => BreakerState::Open { until },
            Phase::Open { .. } | Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// The cool-down the next opening will use (doubles on each failed probe).
    pub fn cooldown(&self) -> Duration {
        self.cooldown
    }

    /// Why the breaker is not closed, or `None` when it is.
    pub fn opened_reason(&self) -> Option<&str> {
        self.opened_reason.as_deref()
    }

    /// Error rate over the window at `now` (while closed; 0.0 after a transition).
    pub fn error_rate(&self, now: Instant) -> f64 {
        self.outcomes.error_rate(now)
    }

    /// Outcomes in the window at `now`.
    pub fn volume(&self, now: Instant) -> u64 {
        self.outcomes.volume(now)
    }

    fn probe_slots(&self) -> u32 {
        self.cfg.half_open_probes.max(1)
    }

    fn trip_reason(&self, now: Instant) -> Option<String> {
        let limit = self.cfg.consecutive_failures;
        if limit > 0 && self.consecutive_failures >= limit {
            return Some(format!("{} consecutive failures", self.consecutive_failures));
        }
        let volume = self.outcomes.volume(now);
        let rate = self.outcomes.error_rate(now);
        if volume >= u64::from(self.cfg.min_volume) && volume > 0 && rate >= self.cfg.error_rate {
            return Some(format!(
                "error rate {:.0}% over {volume} requests in {:?}",
                rate * 100.0,
                self.cfg.window
            ));
        }
        None
    }

    fn open(&mut self, now: Instant, reason: String) {
        self.phase = Phase::Open {
            until: now + self.cooldown,
        };
        self.opened_reason = Some(reason);
        self.outcomes.reset();
        self.consecutive_failures = 0;
    }

    fn close(&mut self) {
        self.phase = Phase::Closed;
        self.opened_reason = None;
        self.cooldown = self.cfg.cooldown.min(self.cfg.max_cooldown);
        self.outcomes.reset();
        self.consecutive_failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn rate_only() -> BreakerConfig {
        BreakerConfig {
            consecutive_failures: 0,
            ..BreakerConfig::default()
        }
    }

    /// Alternates outcomes so no failure streak forms: `failures` failures among `total`.
    fn feed(breaker: &mut Breaker, now: Instant, total: u32, failures: u32) {
        for i in 0..total {
            if i < failures {
                breaker.on_failure(now);
            } else {
                breaker.on_success(now);
            }
        }
    }

    fn open_breaker(now: Instant) -> Breaker {
        let mut breaker = Breaker::new(BreakerConfig::default());
        breaker.force_open(now, "drill");
        breaker
    }

    #[tokio::test(start_paused = true)]
    async fn default_config_matches_the_documented_values() {
        let cfg = BreakerConfig::default();
        assert_eq!(cfg.window, Duration::from_secs(10), "window");
        assert_eq!(cfg.min_volume, 20, "min volume");
        assert_eq!(cfg.error_rate, 0.5, "error rate");
        assert_eq!(cfg.consecutive_failures, 5, "consecutive failures");
        assert_eq!(cfg.cooldown, Duration::from_secs(1), "cooldown");
        assert_eq!(cfg.max_cooldown, Duration::from_secs(30), "max cooldown");
        assert_eq!(cfg.half_open_probes, 1, "half-open probes");
    }

    #[tokio::test(start_paused = true)]
    async fn new_breaker_is_closed_and_admits() {
        let mut breaker = Breaker::new(BreakerConfig::default());
        let now = Instant::now();
        assert_eq!(breaker.state(now), BreakerState::Closed, "starts closed");
        assert!(breaker.allows(now), "closed allows");
        assert!(breaker.try_acquire(now), "closed admits");
        assert_eq!(breaker.opened_reason(), None, "no reason while closed");
    }

    #[tokio::test(start_paused = true)]
    async fn opens_at_error_rate_threshold_not_before() {
        let mut breaker = Breaker::new(rate_only());
        let now = Instant::now();
        // 9 failures + 11 successes = 45% over 20: below 50%.
        for i in 0..20 {
            if i % 2 == 0 && i < 18 {
                breaker.on_failure(now);
            } else {
                breaker.on_success(now);
            }
        }
        assert_eq!(breaker.volume(now), 20, "twenty outcomes recorded");
        assert_eq!(
            breaker.state(now),
            BreakerState::Closed,
            "45% is below the 50% threshold"
        );
        // One more failure: 10 of 21 = 47.6%, still below.
        breaker.on_failure(now);
        assert_eq!(breaker.state(now), BreakerState::Closed, "47.6% is below the threshold");
        // 11 of 22 = 50%: opens.
        breaker.on_failure(now);
        assert!(
            matches!(breaker.state(now), BreakerState::Open { .. }),
            "50% reaches the threshold and opens"
        );
        let reason = breaker.opened_reason().unwrap_or_default();
        assert!(reason.contains("error rate"), "reason names the trigger: {reason}");
    }

    #[tokio::test(start_paused = true)]
    async fn error_rate_waits_for_min_volume() {
        let mut breaker = Breaker::new(rate_only());
        let now = Instant::now();
        feed(&mut breaker, now, 19, 19);
        assert_eq!(
            breaker.state(now),
            BreakerState::Closed,
            "19 failures are below min volume 20"
        );
        breaker.on_failure(now);
        assert!(
            matches!(breaker.state(now), BreakerState::Open { .. }),
            "the 20th outcome opens it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn old_failures_leave_the_window() {
        let mut breaker = Breaker::new(rate_only());
        let start = Instant::now();
        feed(&mut breaker, start, 15, 15);
        let later = start + Duration::from_secs(11);
        feed(&mut breaker, later, 10, 5);
        assert_eq!(breaker.volume(later), 10, "the first fifteen expired");
        assert_eq!(
            breaker.state(later),
            BreakerState::Closed,
            "volume 10 is below min volume"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn opens_on_consecutive_failures() {
        let mut breaker = Breaker::new(BreakerConfig::default());
        let now = Instant::now();
        for _ in 0..4 {
            breaker.on_failure(now);
        }
        assert_eq!(breaker.state(now), BreakerState::Closed, "four in a row is not enough");
        breaker.on_failure(now);
        assert_eq!(
            breaker.state(now),
            BreakerState::Open {
                until: now + Duration::from_secs(1)
            },
            "the fifth failure in a row opens for the base cool-down"
        );
        assert_eq!(breaker.opened_reason(), Some("5 consecutive failures"), "reason");
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_breaks_the_failure_streak() {
        let mut breaker = Breaker::new(BreakerConfig::default());
        let now = Instant::now();
        for _ in 0..4 {
            breaker.on_failure(now);
        }
        breaker.on_success(now);
        for _ in 0..4 {
            breaker.on_failure(now);
        }
        assert_eq!(breaker.state(now), BreakerState::Closed, "no five failures in a row");
    }

    #[tokio::test(start_paused = true)]
    async fn open_breaker_admits_nothing_until_cooled() {
        let start = Instant::now();
        let mut breaker = open_breaker(start);
        let almost = start + Duration::from_secs(1) - MS;
        assert!(!breaker.allows(almost), "still cooling");
        assert!(!breaker.try_acquire(almost), "no traffic while open");
        let cooled = start + Duration::from_secs(1);
        assert_eq!(breaker.state(cooled), BreakerState::HalfOpen, "cooled means half-open");
        assert!(breaker.allows(cooled), "a probe would be admitted");
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_admits_exactly_one_probe() {
        let start = Instant::now();
        let mut breaker = open_breaker(start);
        let cooled = start + Duration::from_secs(1);
        assert!(breaker.try_acquire(cooled), "the first probe is admitted");
        assert!(!breaker.allows(cooled), "no slot left for the router");
        assert!(!breaker.try_acquire(cooled), "a second concurrent probe is refused");
        assert!(
            !breaker.try_acquire(cooled + Duration::from_secs(60)),
            "refused however long we wait"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_admits_the_configured_number_of_probes() {
        let start = Instant::now();
        let mut breaker = Breaker::new(BreakerConfig {
            half_open_probes: 3,
            ..BreakerConfig::default()
        });
        breaker.force_open(start, "drill");
        let cooled = start + Duration::from_secs(1);
        let admitted = (0..10).filter(|_| breaker.try_acquire(cooled)).count();
        assert_eq!(admitted, 3, "exactly three probes");
    }

    #[tokio::test(start_paused = true)]
    async fn probe_success_closes_and_resets_cooldown() {
        let start = Instant::now();
        let mut breaker = open_breaker(start);
        let mut now = start + Duration::from_secs(1);
        // One failed probe doubles the cool-down to 2 s.
        assert!(breaker.try_acquire(now), "probe admitted");
        breaker.on_failure(now);
        assert_eq!(breaker.cooldown(), Duration::from_secs(2), "doubled");
        now += Duration::from_secs(2);
        assert!(breaker.try_acquire(now), "second probe admitted");
        breaker.on_success(now);
        assert_eq!(breaker.state(now), BreakerState::Closed, "a probe success closes");
        assert_eq!(breaker.cooldown(), Duration::from_secs(1), "cool-down back to base");
        assert_eq!(breaker.opened_reason(), None, "reason cleared");
        assert!(
            breaker.try_acquire(now) && breaker.try_acquire(now),
            "closed admits everything"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn cooldown_doubles_on_failed_probe_and_caps_at_max() {
        let start = Instant::now();
        let mut breaker = open_breaker(start);
        let mut now = start;
        let mut seen = Vec::new();
        for _ in 0..8 {
            now += breaker.cooldown();
            assert!(breaker.try_acquire(now), "a probe is admitted once cooled");
            breaker.on_failure(now);
            seen.push(breaker.cooldown().as_secs());
            assert_eq!(
                breaker.state(now),
                BreakerState::Open {
                    until: now + breaker.cooldown()
                },
                "a failed probe reopens for the new cool-down"
            );
        }
        assert_eq!(seen, [2, 4, 8, 16, 30, 30, 30, 30], "doubling, capped at 30 s");
        assert_eq!(breaker.opened_reason(), Some("half-open probe failed"), "reason");
    }

    #[tokio::test(start_paused = true)]
    async fn released_probe_frees_its_slot() {
        let start = Instant::now();
        let mut breaker = open_breaker(start);
        let cooled = start + Duration::from_secs(1);
        assert!(breaker.try_acquire(cooled), "probe admitted");
        breaker.release_probe();
        assert_eq!(breaker.state(cooled), BreakerState::HalfOpen, "still half-open");
        assert!(breaker.try_acquire(cooled), "the slot can be used by another probe");
    }

    #[tokio::test(start_paused = true)]
    async fn outcomes_while_open_are_ignored() {
        let start = Instant::now();
        let mut breaker = open_breaker(start);
        breaker.on_success(start);
        breaker.on_failure(start);
        assert_eq!(
            breaker.state(start),
            BreakerState::Open {
                until: start + Duration::from_secs(1)
            },
            "stragglers neither close nor extend the open period"
        );
        let cooled = start + Duration::from_secs(1);
        breaker.on_success(cooled);
        assert_eq!(
            breaker.state(cooled),
            BreakerState::HalfOpen,
            "no probe in flight: ignored"
        );
        assert_eq!(breaker.cooldown(), Duration::from_secs(1), "cool-down unchanged");
    }

    #[tokio::test(start_paused = true)]
    async fn reclosed_breaker_starts_from_fresh_evidence() {
        let start = Instant::now();
        let mut breaker = Breaker::new(rate_only());
        feed(&mut breaker, start, 20, 20);
        let cooled = start + Duration::from_secs(1);
        assert!(breaker.try_acquire(cooled), "probe admitted");
        breaker.on_success(cooled);
        breaker.on_failure(cooled);
        assert_eq!(
            breaker.state(cooled),
            BreakerState::Closed,
            "old failures were forgotten"
        );
        assert_eq!(breaker.volume(cooled), 1, "only the new failure counts");
    }

    #[tokio::test(start_paused = true)]
    async fn force_open_records_the_reason() {
        let now = Instant::now();
        let breaker = open_breaker(now);
        assert_eq!(breaker.opened_reason(), Some("drill"), "drill reason kept");
        assert_eq!(breaker.state(now).as_str(), "open", "state label");
    }

    #[tokio::test(start_paused = true)]
    async fn zero_probes_config_still_admits_one() {
        let start = Instant::now();
        let mut breaker = Breaker::new(BreakerConfig {
            half_open_probes: 0,
            ..BreakerConfig::default()
        });
        breaker.force_open(start, "drill");
        let cooled = start + Duration::from_secs(1);
        assert!(
            breaker.try_acquire(cooled),
            "a breaker that never probes would never close"
        );
        assert!(!breaker.try_acquire(cooled), "but only one");
    }
}
