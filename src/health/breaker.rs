//! Per-route circuit breaker: a plain state machine over reported outcomes and `now`.
//!
//! # Why
//! A route that keeps failing costs every request that tries it a failed attempt (and,
//! before commit, a slice of its deadline; after commit, a mid-stream recovery). The
//! breaker takes such a route out of the plan for a cool-down, then lets a probe find out
//! whether it recovered.
//!
//! # States and triggers
//! - **Closed**: all traffic passes. Every attempt's outcome is counted once, when it
//!   resolves: a success at a normal finish, a failure at any failure that counts against
//!   the route, before or after commit (a stream that dies mid-answer is a failure, not a
//!   success at its first token). Outcomes go into a rolling window
//!   ([`crate::health::window`]). The breaker opens when either
//!   - the window holds at least `min_volume` outcomes and its error rate reaches
//!     `error_rate`, or
//!   - `consecutive_failures` failures arrive in a row (0 turns this trigger off).
//! - **Open { until }**: no traffic until `until` (`now + cooldown`).
//! - **Half-open**: once cooled, a probe may run. With [`ProbeMode::Background`] the
//!   background prober (`mux::probe`) sends a request of its own, one at a time, and no
//!   user request is admitted; with [`ProbeMode::Traffic`] up to `half_open_probes` user
//!   requests are admitted as probes. A probe's first token or success closes the
//!   breaker; a probe's failure opens it again with the cool-down doubled (capped at
//!   `max_cooldown`).
//! - **Probation**: a breaker a probe closed keeps its cool-down until a user request
//!   succeeds (then the cool-down is back to its base). If a request fails first, that is a
//!   relapse: the breaker opens again at once, its cool-down doubled, as for a failed probe.
//!   A route that answers a one-token probe but fails real answers (mid-stream) costs one
//!   user request per probe, and is out for longer each time, not re-admitted every base
//!   cool-down. A probe that ends with neither (a
//!   cancelled hedge loser) hands its slot back with [`Breaker::release`].
//!
//! # Tickets
//! Every admission returns a [`Ticket`]: whether it is a probe, and the breaker's *epoch*
//! (how many times it has opened) at admission. Outcomes are reported with their ticket,
//! so only a probe's outcome can close or reopen a half-open breaker, only a probe frees a
//! probe slot, and a straggler admitted before the breaker last opened (an older epoch)
//! changes nothing: it is no evidence about the route since.
//!
//! Nothing here runs on its own: there is no task and no timer. Every method that
//! depends on time takes `now`, and the open → half-open step happens when a caller
//! looks at the breaker after `until`.
//!
//! # Known limits
//! - The window is cleared on every transition, so a closed breaker starts from fresh
//!   evidence and the error-rate trigger needs `min_volume` new outcomes to fire again.
//! - A probe proves one request of one shape (a one-token answer); a route that answers
//!   that but fails long answers is closed again and reopened by its real traffic, with a
//!   cool-down doubled each relapse (probation).

use std::time::Duration;

use tokio::time::Instant;

use super::window::OutcomeCounts;
pub use crate::config::{BreakerConfig, ProbeMode};

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

/// One admission through a breaker; hand it back with the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    /// The breaker's epoch (openings so far) when this was admitted.
    epoch: u64,
    probe: bool,
}

impl Ticket {
    /// Was this admitted as a half-open probe?
    pub fn is_probe(&self) -> bool {
        self.probe
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
    /// Times the breaker has opened; tickets from an older epoch are stragglers.
    epoch: u64,
    /// The earliest opening not yet followed by a success (any opening: a trip, a drill, a
    /// failed probe): where the route's recovery time is counted from.
    down_since: Option<Instant>,
    /// A recovery time measured at the first success after the breaker closed, until taken.
    recovered: Option<Duration>,
    /// Closed by a probe, and no user request has succeeded since: a trip now is a relapse
    /// and doubles the cool-down, as a failed probe does.
    probation: bool,
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
            epoch: 0,
            down_since: None,
            recovered: None,
            probation: false,
        }
    }

    pub fn config(&self) -> &BreakerConfig {
        &self.cfg
    }

    /// Would [`Breaker::try_acquire`] admit a user request now under `mode`? For the
    /// router's snapshot: closed, or (traffic probes only) cooled with a probe slot free.
    pub fn allows(&self, now: Instant, mode: ProbeMode) -> bool {
        match self.phase {
            Phase::Closed => true,
            _ if mode == ProbeMode::Background => false,
            Phase::Open { until } => now >= until,
            Phase::HalfOpen { probes_in_flight } => probes_in_flight < self.probe_slots(),
        }
    }

    /// Admits one user request if the breaker allows it under `mode`. With traffic probes,
    /// a request admitted while half-open is a probe and holds a probe slot until its
    /// outcome (or [`Breaker::release`]).
    pub fn try_acquire(&mut self, now: Instant, mode: ProbeMode) -> Option<Ticket> {
        match self.phase {
            Phase::Closed => Some(self.ticket(false)),
            _ if mode == ProbeMode::Background => None,
            Phase::Open { until } if now >= until => {
                self.phase = Phase::HalfOpen { probes_in_flight: 1 };
                Some(self.ticket(true))
            }
            Phase::HalfOpen { probes_in_flight } if probes_in_flight < self.probe_slots() => {
                self.phase = Phase::HalfOpen {
                    probes_in_flight: probes_in_flight + 1,
                };
                Some(self.ticket(true))
            }
            Phase::Open { .. } | Phase::HalfOpen { .. } => None,
        }
    }

    /// Admits the background prober's request once cooled: one probe at a time, whatever
    /// `half_open_probes` says.
    pub fn try_probe(&mut self, now: Instant) -> Option<Ticket> {
        match self.phase {
            Phase::Open { until } if now >= until => {}
            Phase::HalfOpen { probes_in_flight: 0 } => {}
            Phase::Closed | Phase::Open { .. } | Phase::HalfOpen { .. } => return None,
        }
        self.phase = Phase::HalfOpen { probes_in_flight: 1 };
        Some(self.ticket(true))
    }

    /// When the next background probe may start: the end of the cool-down, `now` when
    /// cooled with no probe in flight, `None` when closed or a probe is running.
    pub fn probe_due(&self, now: Instant) -> Option<Instant> {
        match self.phase {
            Phase::Open { until } => Some(until),
            Phase::HalfOpen { probes_in_flight: 0 } => Some(now),
            Phase::Closed | Phase::HalfOpen { .. } => None,
        }
    }

    /// The admitted request produced its first content token. A probe's first token is
    /// proof of life and closes a half-open breaker; otherwise nothing is counted yet (the
    /// outcome is counted once, when it resolves).
    pub fn on_first_token(&mut self, ticket: Ticket) {
        if self.is_current_probe(ticket) {
            self.close();
        }
    }

    /// The admitted request succeeded (for the breaker: it did not fail in a way that counts
    /// against the route).
    pub fn on_success(&mut self, now: Instant, ticket: Ticket) {
        if ticket.epoch != self.epoch {
            return;
        }
        match self.phase {
            Phase::Closed => {
                self.outcomes.record(now, true);
                self.consecutive_failures = 0;
                self.note_recovered(now);
                if self.probation {
                    // The route served a real request: it is back, the cool-down too.
                    self.probation = false;
                    self.cooldown = self.cfg.cooldown.min(self.cfg.max_cooldown);
                }
            }
            Phase::HalfOpen { .. } if ticket.probe => {
                self.close();
                self.note_recovered(now);
            }
            Phase::HalfOpen { .. } | Phase::Open { .. } => {}
        }
    }

    /// The recovery time measured since it was last taken: from the earliest opening of an
    /// outage (a trip, a drill or a failed probe's reopening) to the first success after
    /// the breaker closed again. Taken once (`tailcut_recovery_seconds`).
    pub fn take_recovery(&mut self) -> Option<Duration> {
        self.recovered.take()
    }

    fn note_recovered(&mut self, now: Instant) {
        if let Some(since) = self.down_since.take() {
            self.recovered = Some(now.saturating_duration_since(since));
        }
    }

    /// The admitted request failed in a way that counts against the route.
    pub fn on_failure(&mut self, now: Instant, ticket: Ticket) {
        if ticket.epoch != self.epoch {
            return;
        }
        match self.phase {
            Phase::Closed => {
                self.outcomes.record(now, false);
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                if self.probation {
                    // Its probe passed, and the first real answer since failed (a route that
                    // answers a one-token probe and fails real answers, mid-stream): a
                    // relapse, at once, not after another streak of users' failures.
                    self.cooldown = self.cooldown.saturating_mul(2).min(self.cfg.max_cooldown);
                    self.open(now, "failed again since its probe passed".to_string());
                } else if let Some(reason) = self.trip_reason(now) {
                    self.open(now, reason);
                }
            }
            Phase::HalfOpen { .. } if ticket.probe => {
                self.cooldown = self.cooldown.saturating_mul(2).min(self.cfg.max_cooldown);
                self.open(now, "half-open probe failed".to_string());
            }
            Phase::HalfOpen { .. } | Phase::Open { .. } => {}
        }
    }

    /// The admitted request ended with neither success nor failure (cancelled hedge loser,
    /// client gone, a failure that says nothing about the route): a probe's slot is free for
    /// another probe. Does nothing for a non-probe or a straggler.
    pub fn release(&mut self, ticket: Ticket) {
        if !self.is_current_probe(ticket) {
            return;
        }
        if let Phase::HalfOpen { probes_in_flight } = &mut self.phase {
            *probes_in_flight = probes_in_flight.saturating_sub(1);
        }
    }

    /// Opens the breaker now for the current cool-down (drills, operator action).
    pub fn force_open(&mut self, now: Instant, reason: &str) {
        self.force_open_for(now, Duration::ZERO, reason);
    }

    /// Opens the breaker now for the current cool-down or `at_least`, whichever is longer (a
    /// drill with a duration): one opening, so what a refusal says is left is the real time.
    /// Returns when it may take traffic again.
    pub fn force_open_for(&mut self, now: Instant, at_least: Duration, reason: &str) -> Instant {
        self.open(now, reason.to_string());
        let end = (now + self.cooldown).max(now + at_least);
        self.phase = Phase::Open { until: end };
        end
    }

    /// The state as seen at `now`: an open breaker whose cool-down has passed is half-open.
    pub fn state(&self, now: Instant) -> BreakerState {
        match self.phase {
            Phase::Closed => BreakerState::Closed,
            Phase::Open { until } if now < until => BreakerState::Open { until },
            Phase::Open { .. } | Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Counts openings (trips, failed probes, drills): it changes exactly when the breaker
    /// opens, so a caller can tell that the outcome it just reported opened it.
    pub fn openings(&self) -> u64 {
        self.epoch
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

    fn ticket(&self, probe: bool) -> Ticket {
        Ticket {
            epoch: self.epoch,
            probe,
        }
    }

    fn is_current_probe(&self, ticket: Ticket) -> bool {
        ticket.probe && ticket.epoch == self.epoch && matches!(self.phase, Phase::HalfOpen { .. })
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
        self.down_since.get_or_insert(now);
        self.phase = Phase::Open {
            until: now + self.cooldown,
        };
        self.epoch = self.epoch.wrapping_add(1);
        self.opened_reason = Some(reason);
        self.outcomes.reset();
        self.consecutive_failures = 0;
    }

    /// Closed by a probe: on probation until a user request succeeds (the cool-down resets
    /// then, or doubles if the route trips first).
    fn close(&mut self) {
        self.phase = Phase::Closed;
        self.opened_reason = None;
        self.probation = true;
        self.outcomes.reset();
        self.consecutive_failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const TRAFFIC: ProbeMode = ProbeMode::Traffic;
    const BACKGROUND: ProbeMode = ProbeMode::Background;

    fn rate_only() -> BreakerConfig {
        BreakerConfig {
            consecutive_failures: 0,
            ..BreakerConfig::default()
        }
    }

    fn admit(breaker: &mut Breaker, now: Instant) -> Ticket {
        breaker.try_acquire(now, TRAFFIC).expect("the breaker admits")
    }

    fn fail(breaker: &mut Breaker, now: Instant) {
        let t = admit(breaker, now);
        breaker.on_failure(now, t);
    }

    fn succeed(breaker: &mut Breaker, now: Instant) {
        let t = admit(breaker, now);
        breaker.on_success(now, t);
    }

    /// `failures` failures among `total` outcomes, failures first.
    fn feed(breaker: &mut Breaker, now: Instant, total: u32, failures: u32) {
        for i in 0..total {
            if i < failures {
                fail(breaker, now);
            } else {
                succeed(breaker, now);
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
        assert_eq!(cfg.max_cooldown, Duration::from_secs(5), "max cooldown");
        assert_eq!(cfg.half_open_probes, 1, "half-open probes");
        assert_eq!(cfg.probe, BACKGROUND, "background probes");
        assert_eq!(cfg.quota_cooldown, Duration::from_secs(300), "quota cool-down");
    }

    #[tokio::test(start_paused = true)]
    async fn new_breaker_is_closed_and_admits() {
        let mut breaker = Breaker::new(BreakerConfig::default());
        let now = Instant::now();
        assert_eq!(breaker.state(now), BreakerState::Closed, "starts closed");
        assert!(breaker.allows(now, BACKGROUND), "closed allows");
        let ticket = breaker.try_acquire(now, BACKGROUND);
        assert!(ticket.is_some_and(|t| !t.is_probe()), "closed admits, not as a probe");
        assert_eq!(breaker.try_probe(now), None, "nothing to probe while closed");
        assert_eq!(breaker.probe_due(now), None, "no probe due while closed");
        assert_eq!(breaker.opened_reason(), None, "no reason while closed");
    }

    #[tokio::test(start_paused = true)]
    async fn opens_at_error_rate_threshold_not_before() {
        let mut breaker = Breaker::new(rate_only());
        let now = Instant::now();
        // 9 failures + 11 successes = 45% over 20: below 50%.
        for i in 0..20 {
            if i % 2 == 0 && i < 18 {
                fail(&mut breaker, now);
            } else {
                succeed(&mut breaker, now);
            }
        }
        assert_eq!(breaker.volume(now), 20, "twenty outcomes recorded");
        assert_eq!(
            breaker.state(now),
            BreakerState::Closed,
            "45% is below the 50% threshold"
        );
        // One more failure: 10 of 21 = 47.6%, still below.
        fail(&mut breaker, now);
        assert_eq!(breaker.state(now), BreakerState::Closed, "47.6% is below the threshold");
        // 11 of 22 = 50%: opens.
        fail(&mut breaker, now);
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
        fail(&mut breaker, now);
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
            fail(&mut breaker, now);
        }
        assert_eq!(breaker.state(now), BreakerState::Closed, "four in a row is not enough");
        fail(&mut breaker, now);
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
            fail(&mut breaker, now);
        }
        succeed(&mut breaker, now);
        for _ in 0..4 {
            fail(&mut breaker, now);
        }
        assert_eq!(breaker.state(now), BreakerState::Closed, "no five failures in a row");
    }

    /// The review's bug: a first token reset the streak, so streams that all died mid-answer
    /// never opened the breaker.
    #[tokio::test(start_paused = true)]
    async fn first_tokens_do_not_break_a_streak_of_midstream_failures() {
        let mut breaker = Breaker::new(BreakerConfig::default());
        let now = Instant::now();
        for _ in 0..5 {
            let t = admit(&mut breaker, now);
            breaker.on_first_token(t);
            breaker.on_failure(now, t);
        }
        assert!(
            matches!(breaker.state(now), BreakerState::Open { .. }),
            "five streams that died after their first token open the breaker"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn midstream_failures_count_in_the_error_rate() {
        let mut breaker = Breaker::new(rate_only());
        let now = Instant::now();
        for _ in 0..10 {
            let t = admit(&mut breaker, now);
            breaker.on_first_token(t);
            breaker.on_failure(now, t);
        }
        assert_eq!(breaker.volume(now), 10, "each attempt counted once");
        assert_eq!(breaker.error_rate(now), 1.0, "all of them failures");
    }

    #[tokio::test(start_paused = true)]
    async fn open_breaker_admits_nothing_until_cooled() {
        let start = Instant::now();
        let mut breaker = open_breaker(start);
        let almost = start + Duration::from_secs(1) - MS;
        assert!(!breaker.allows(almost, TRAFFIC), "still cooling");
        assert_eq!(breaker.try_acquire(almost, TRAFFIC), None, "no traffic while open");
        assert_eq!(breaker.try_probe(almost), None, "no probe while open");
        assert_eq!(
            breaker.probe_due(almost),
            Some(start + Duration::from_secs(1)),
            "due at the end"
        );
        let cooled = start + Duration::from_secs(1);
        assert_eq!(breaker.state(cooled), BreakerState::HalfOpen, "cooled means half-open");
        assert!(breaker.allows(cooled, TRAFFIC), "a traffic probe would be admitted");
    }

    #[tokio::test(start_paused = true)]
    async fn background_mode_admits_no_user_request_when_half_open() {
        let start = Instant::now();
        let mut breaker = open_breaker(start);
        let cooled = start + Duration::from_secs(1);
        assert!(!breaker.allows(cooled, BACKGROUND), "the router is told no");
        assert_eq!(breaker.try_acquire(cooled, BACKGROUND), None, "no user probe");
        let probe = breaker.try_probe(cooled).expect("the prober may probe");
        assert!(probe.is_probe(), "the prober's ticket is a probe");
        assert_eq!(
            breaker.try_acquire(cooled, BACKGROUND),
            None,
            "still none while it runs"
        );
        breaker.on_success(cooled, probe);
        assert_eq!(
            breaker.state(cooled),
            BreakerState::Closed,
            "the probe's success closes"
        );
        assert!(breaker.try_acquire(cooled, BACKGROUND).is_some(), "users are back");
    }

    #[tokio::test(start_paused = true)]
    async fn background_probes_run_one_at_a_time() {
        let start = Instant::now();
        let mut breaker = Breaker::new(BreakerConfig {
            half_open_probes: 3,
            ..BreakerConfig::default()
        });
        breaker.force_open(start, "drill");
        let cooled = start + Duration::from_secs(1);
        let first = breaker.try_probe(cooled).expect("one probe");
        assert_eq!(breaker.try_probe(cooled), None, "a second concurrent probe is refused");
        assert_eq!(breaker.probe_due(cooled), None, "nothing due while one runs");
        breaker.release(first);
        assert_eq!(
            breaker.probe_due(cooled),
            Some(cooled),
            "a released probe is due again now"
        );
        assert!(breaker.try_probe(cooled).is_some(), "and may be retried");
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_admits_exactly_one_probe() {
        let start = Instant::now();
        let mut breaker = open_breaker(start);
        let cooled = start + Duration::from_secs(1);
        let probe = breaker.try_acquire(cooled, TRAFFIC);
        assert!(
            probe.is_some_and(|t| t.is_probe()),
            "the first request is admitted as a probe"
        );
        assert!(!breaker.allows(cooled, TRAFFIC), "no slot left for the router");
        assert_eq!(
            breaker.try_acquire(cooled, TRAFFIC),
            None,
            "a second concurrent probe is refused"
        );
        assert_eq!(
            breaker.try_acquire(cooled + Duration::from_secs(60), TRAFFIC),
            None,
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
        let admitted = (0..10)
            .filter(|_| breaker.try_acquire(cooled, TRAFFIC).is_some())
            .count();
        assert_eq!(admitted, 3, "exactly three probes");
    }

    #[tokio::test(start_paused = true)]
    async fn probe_success_closes_and_a_user_success_resets_the_cooldown() {
        let start = Instant::now();
        let mut breaker = open_breaker(start);
        let mut now = start + Duration::from_secs(1);
        // One failed probe doubles the cool-down to 2 s.
        let probe = admit(&mut breaker, now);
        breaker.on_failure(now, probe);
        assert_eq!(breaker.cooldown(), Duration::from_secs(2), "doubled");
        now += Duration::from_secs(2);
        let probe = admit(&mut breaker, now);
        breaker.on_success(now, probe);
        assert_eq!(breaker.state(now), BreakerState::Closed, "a probe success closes");
        assert_eq!(breaker.cooldown(), Duration::from_secs(2), "on probation: kept");
        assert_eq!(breaker.opened_reason(), None, "reason cleared");
        succeed(&mut breaker, now);
        assert_eq!(
            breaker.cooldown(),
            Duration::from_secs(1),
            "a user success: back to base"
        );
        assert!(
            breaker.try_acquire(now, TRAFFIC).is_some() && breaker.try_acquire(now, TRAFFIC).is_some(),
            "closed admits everything"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn probe_first_token_closes_and_its_later_failure_is_a_relapse() {
        let start = Instant::now();
        let mut breaker = open_breaker(start);
        let cooled = start + Duration::from_secs(1);
        let probe = admit(&mut breaker, cooled);
        breaker.on_first_token(probe);
        assert_eq!(breaker.state(cooled), BreakerState::Closed, "proof of life closes");
        breaker.on_failure(cooled, probe);
        assert_eq!(
            breaker.state(cooled),
            BreakerState::Open {
                until: cooled + Duration::from_secs(2)
            },
            "its later mid-stream failure reopens it at once, the cool-down doubled"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_route_whose_traffic_trips_it_after_each_passed_probe_stays_out_longer_each_time() {
        // A route that answers the one-token probe and fails every real answer (mid-stream):
        // each relapse doubles the cool-down up to the cap, as a failed probe would.
        let cfg = BreakerConfig {
            consecutive_failures: 3,
            ..BreakerConfig::default()
        };
        let mut breaker = Breaker::new(cfg.clone());
        let mut now = Instant::now();
        let mut cooldowns = Vec::new();
        for round in 0..5 {
            // Three failures in a row open it; once on probation, the first one does.
            for _ in 0..if round == 0 { 3 } else { 1 } {
                fail(&mut breaker, now);
            }
            let BreakerState::Open { until } = breaker.state(now) else {
                panic!("round {round}: failures open it");
            };
            cooldowns.push(until - now);
            now = until;
            let probe = breaker.try_probe(now).expect("cooled: a probe may run");
            breaker.on_success(now, probe);
            assert_eq!(breaker.state(now), BreakerState::Closed, "the probe passes");
        }
        let secs: Vec<u64> = cooldowns.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 5, 5], "doubling per relapse, capped at max_cooldown");
        // One answer that goes through ends the probation.
        succeed(&mut breaker, now);
        for _ in 0..3 {
            fail(&mut breaker, now);
        }
        assert_eq!(
            breaker.state(now),
            BreakerState::Open {
                until: now + cfg.cooldown
            },
            "a fresh trip after a served answer starts from the base cool-down"
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
            let probe = breaker.try_probe(now).expect("a probe is admitted once cooled");
            breaker.on_failure(now, probe);
            seen.push(breaker.cooldown().as_secs());
            assert_eq!(
                breaker.state(now),
                BreakerState::Open {
                    until: now + breaker.cooldown()
                },
                "a failed probe reopens for the new cool-down"
            );
        }
        assert_eq!(seen, [2, 4, 5, 5, 5, 5, 5, 5], "doubling, capped at 5 s");
        assert_eq!(breaker.opened_reason(), Some("half-open probe failed"), "reason");
    }

    #[tokio::test(start_paused = true)]
    async fn released_probe_frees_its_slot() {
        let start = Instant::now();
        let mut breaker = open_breaker(start);
        let cooled = start + Duration::from_secs(1);
        let probe = admit(&mut breaker, cooled);
        breaker.release(probe);
        assert_eq!(breaker.state(cooled), BreakerState::HalfOpen, "still half-open");
        assert!(
            breaker.try_acquire(cooled, TRAFFIC).is_some(),
            "the slot can be used by another probe"
        );
    }

    /// Problem 2 of the review: a straggler admitted while closed freed the probe's slot.
    #[tokio::test(start_paused = true)]
    async fn straggler_does_not_release_a_probe_slot() {
        let start = Instant::now();
        let mut breaker = Breaker::new(BreakerConfig::default());
        let straggler = admit(&mut breaker, start);
        breaker.force_open(start, "drill");
        let cooled = start + Duration::from_secs(1);
        let _probe = admit(&mut breaker, cooled);
        breaker.release(straggler);
        assert_eq!(
            breaker.try_acquire(cooled, TRAFFIC),
            None,
            "the straggler's release does not let in a second probe"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn straggler_outcome_neither_closes_nor_reopens_a_half_open_breaker() {
        let start = Instant::now();
        let mut breaker = Breaker::new(BreakerConfig::default());
        let early = admit(&mut breaker, start);
        let late = admit(&mut breaker, start);
        breaker.force_open(start, "drill");
        let cooled = start + Duration::from_secs(1);
        let probe = admit(&mut breaker, cooled);
        breaker.on_success(cooled, early);
        assert_eq!(
            breaker.state(cooled),
            BreakerState::HalfOpen,
            "a straggler's success does not close"
        );
        breaker.on_failure(cooled, late);
        assert_eq!(
            breaker.state(cooled),
            BreakerState::HalfOpen,
            "a straggler's failure does not reopen"
        );
        assert_eq!(breaker.cooldown(), Duration::from_secs(1), "nor double the cool-down");
        breaker.on_failure(cooled, probe);
        assert!(
            matches!(breaker.state(cooled), BreakerState::Open { .. }),
            "the real probe's failure still reopens"
        );
        assert_eq!(breaker.cooldown(), Duration::from_secs(2), "and doubles the cool-down");
    }

    #[tokio::test(start_paused = true)]
    async fn straggler_outcome_after_reclosing_is_ignored() {
        let start = Instant::now();
        let mut breaker = Breaker::new(BreakerConfig::default());
        let straggler = admit(&mut breaker, start);
        breaker.force_open(start, "drill");
        let cooled = start + Duration::from_secs(1);
        let probe = admit(&mut breaker, cooled);
        breaker.on_success(cooled, probe);
        breaker.on_failure(cooled, straggler);
        assert_eq!(
            breaker.volume(cooled),
            0,
            "evidence from before the opening is not counted"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn outcomes_while_open_are_ignored() {
        let start = Instant::now();
        let mut breaker = Breaker::new(BreakerConfig::default());
        let a = admit(&mut breaker, start);
        let b = admit(&mut breaker, start);
        breaker.force_open(start, "drill");
        breaker.on_success(start, a);
        breaker.on_failure(start, b);
        assert_eq!(
            breaker.state(start),
            BreakerState::Open {
                until: start + Duration::from_secs(1)
            },
            "stragglers neither close nor extend the open period"
        );
        assert_eq!(breaker.cooldown(), Duration::from_secs(1), "cool-down unchanged");
    }

    #[tokio::test(start_paused = true)]
    async fn reclosed_breaker_starts_from_fresh_evidence() {
        let start = Instant::now();
        let mut breaker = Breaker::new(rate_only());
        feed(&mut breaker, start, 20, 20);
        let cooled = start + Duration::from_secs(1);
        let probe = admit(&mut breaker, cooled);
        breaker.on_success(cooled, probe);
        // A user success ends the probation; the evidence before the opening is gone.
        succeed(&mut breaker, cooled);
        fail(&mut breaker, cooled);
        assert_eq!(
            breaker.state(cooled),
            BreakerState::Closed,
            "old failures were forgotten"
        );
        assert_eq!(breaker.volume(cooled), 2, "only the new outcomes count");
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
            breaker.try_acquire(cooled, TRAFFIC).is_some(),
            "a breaker that never probes would never close"
        );
        assert_eq!(breaker.try_acquire(cooled, TRAFFIC), None, "but only one");
    }

    #[test]
    fn probe_mode_parses_its_labels() {
        for mode in [BACKGROUND, TRAFFIC] {
            assert_eq!(ProbeMode::parse(mode.as_str()), Some(mode), "{mode:?} round-trips");
        }
        assert_eq!(ProbeMode::parse("sometimes"), None, "unknown label");
    }
    #[tokio::test(start_paused = true)]
    async fn recovery_counts_from_a_drill_through_a_failed_probe_to_the_first_success() {
        let t0 = Instant::now();
        let mut breaker = open_breaker(t0);
        assert_eq!(breaker.take_recovery(), None, "nothing measured while open");
        tokio::time::advance(Duration::from_secs(1)).await;
        let probe = breaker.try_probe(Instant::now()).expect("cooled: a probe may run");
        breaker.on_failure(Instant::now(), probe);
        assert_eq!(
            breaker.state(Instant::now()).as_str(),
            "open",
            "the failed probe reopened it"
        );
        tokio::time::advance(Duration::from_secs(2)).await;
        let probe = breaker.try_probe(Instant::now()).expect("cooled again");
        breaker.on_first_token(probe);
        tokio::time::advance(Duration::from_millis(500)).await;
        breaker.on_success(Instant::now(), probe);
        assert_eq!(
            breaker.take_recovery(),
            Some(Duration::from_millis(3500)),
            "from the drill's opening, not the reopening, to the first success"
        );
        assert_eq!(breaker.take_recovery(), None, "taken once");
        succeed(&mut breaker, Instant::now());
        assert_eq!(breaker.take_recovery(), None, "later successes measure nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn a_tripped_breaker_recovers_at_the_first_user_success_after_traffic_probes() {
        let t0 = Instant::now();
        let mut breaker = Breaker::new(BreakerConfig {
            consecutive_failures: 2,
            ..BreakerConfig::default()
        });
        fail(&mut breaker, t0);
        fail(&mut breaker, t0);
        assert_eq!(breaker.state(t0).as_str(), "open", "tripped");
        tokio::time::advance(Duration::from_secs(1)).await;
        let probe = admit(&mut breaker, Instant::now());
        tokio::time::advance(Duration::from_millis(200)).await;
        breaker.on_success(Instant::now(), probe);
        assert_eq!(
            breaker.take_recovery(),
            Some(Duration::from_millis(1200)),
            "trip to success"
        );
    }
}
