//! AIMD admission: a per-route concurrency limit that shrinks on overload and grows back
//! slowly, shedding batch traffic before interactive traffic.
//!
//! # Why
//! An upstream's real capacity moves (shared quota, regional load). Sending it more
//! concurrent streams than it can serve turns into 429s and slow first tokens for
//! everyone. The limit follows TCP congestion avoidance: additive increase while things
//! go well, multiplicative decrease on an overload signal (429, 529/overloaded, a latency
//! breach).
//!
//! # Rules
//! - Interactive requests are admitted while `in_flight < floor(limit)`.
//! - Batch requests are admitted while `in_flight < floor(limit * batch_share)` (never
//!   below 1, so batch-only traffic can still run and grow the limit). When the route is
//!   saturated, batch is therefore refused first.
//! - Each success adds `increase / limit`: about `increase` per limit's worth of successes.
//! - An overload multiplies the limit by `decrease`, at most once per `decrease_interval`:
//!   the burst of 429s that one overload produces counts once, not once per request.
//! - The limit stays within `min..=max`.
//!
//! Pure: no timers, no atomics. The owner wraps it in whatever lock it shares it under.
//!
//! # Known limits
//! The limit grows on every success, even when the route was far from saturated, so an
//! idle route drifts towards `max`; the first overload then halves it.

use std::time::Duration;

use tokio::time::Instant;

use crate::types::Priority;

/// Shape of one route's concurrency limit.
#[derive(Debug, Clone, PartialEq)]
pub struct AimdConfig {
    /// The limit before any feedback.
    pub initial: f64,
    /// Floor of the limit (at least 1 is sensible: 0 would shut the route for good).
    pub min: f64,
    /// Ceiling of the limit.
    pub max: f64,
    /// Additive increase per limit's worth of successes (each success adds `increase / limit`).
    pub increase: f64,
    /// Multiplicative decrease on overload, in `(0, 1)`.
    pub decrease: f64,
    /// Share of the limit batch traffic may use, in `(0, 1]`.
    pub batch_share: f64,
    /// At most one decrease per this interval.
    pub decrease_interval: Duration,
}

impl Default for AimdConfig {
    fn default() -> Self {
        AimdConfig {
            initial: 20.0,
            min: 1.0,
            max: 200.0,
            increase: 1.0,
            decrease: 0.5,
            batch_share: 0.7,
            decrease_interval: Duration::from_secs(1),
        }
    }
}

/// One route's adaptive concurrency limit and its in-flight count.
#[derive(Debug, Clone)]
pub struct Aimd {
    cfg: AimdConfig,
    limit: f64,
    in_flight: u32,
    last_decrease: Option<Instant>,
}

impl Aimd {
    pub fn new(cfg: AimdConfig) -> Self {
        let min = cfg.min.max(1.0);
        let max = cfg.max.max(min);
        let limit = clamp_finite(cfg.initial, min, max);
        Aimd {
            cfg: AimdConfig { min, max, ..cfg },
            limit,
            in_flight: 0,
            last_decrease: None,
        }
    }

    pub fn config(&self) -> &AimdConfig {
        &self.cfg
    }

    /// Admits one request of `priority` if the limit allows; an admitted request must be
    /// [`Aimd::release`]d when it ends.
    pub fn try_acquire(&mut self, priority: Priority) -> bool {
        if self.in_flight < self.capacity(priority) {
            self.in_flight += 1;
            true
        } else {
            false
        }
    }

    /// An admitted request ended (whatever its outcome).
    pub fn release(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// A request finished well: grow the limit additively.
    pub fn on_success(&mut self) {
        let step = self.cfg.increase / self.limit;
        self.limit = clamp_finite(self.limit + step, self.cfg.min, self.cfg.max);
    }

    /// The route signalled overload (429, overloaded, latency breach): shrink the limit
    /// multiplicatively, unless it already shrank within `decrease_interval`.
    pub fn on_overload(&mut self, now: Instant) {
        let recently = self
            .last_decrease
            .is_some_and(|at| now.saturating_duration_since(at) < self.cfg.decrease_interval);
        if recently {
            return;
        }
        self.limit = clamp_finite(self.limit * self.cfg.decrease, self.cfg.min, self.cfg.max);
        self.last_decrease = Some(now);
    }

    /// The current limit (fractional; admission uses its floor).
    pub fn limit(&self) -> f64 {
        self.limit
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Would a request of `priority` be admitted now? For snapshots and ranking.
    pub fn has_room(&self, priority: Priority) -> bool {
        self.in_flight < self.capacity(priority)
    }

    /// Concurrent requests `priority` may have in flight under the current limit.
    pub fn capacity(&self, priority: Priority) -> u32 {
        let share = match priority {
            Priority::Interactive => 1.0,
            Priority::Batch => self.cfg.batch_share.clamp(0.0, 1.0),
        };
        // Saturating float-to-int cast; the limit is finite and within min..=max.
        let slots = (self.limit * share).floor() as u32;
        slots.max(1)
    }
}

/// Clamps to `min..=max`, treating a NaN (from a misconfigured factor) as `min`.
fn clamp_finite(value: f64, min: f64, max: f64) -> f64 {
    if value.is_nan() {
        min
    } else {
        value.clamp(min, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aimd(initial: f64) -> Aimd {
        Aimd::new(AimdConfig {
            initial,
            ..AimdConfig::default()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn limit_halves_on_overload() {
        let mut limit = aimd(20.0);
        limit.on_overload(Instant::now());
        assert_eq!(limit.limit(), 10.0, "one 429 halves the limit");
    }

    #[tokio::test(start_paused = true)]
    async fn limit_shrinks_multiplicatively_on_repeated_429s() {
        let mut limit = aimd(64.0);
        let start = Instant::now();
        for i in 1..=4u32 {
            limit.on_overload(start + Duration::from_secs(u64::from(i)));
        }
        assert_eq!(limit.limit(), 4.0, "64 halved four times");
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_429s_decreases_once() {
        let mut limit = aimd(20.0);
        let now = Instant::now();
        for i in 0..50u64 {
            limit.on_overload(now + Duration::from_millis(i * 10));
        }
        assert_eq!(
            limit.limit(),
            10.0,
            "fifty 429s within half a second count as one overload"
        );
        limit.on_overload(now + Duration::from_secs(1));
        assert_eq!(limit.limit(), 5.0, "the next interval may decrease again");
    }

    #[tokio::test(start_paused = true)]
    async fn limit_never_goes_below_min() {
        let mut limit = aimd(2.0);
        let start = Instant::now();
        for i in 0..10u64 {
            limit.on_overload(start + Duration::from_secs(i));
        }
        assert_eq!(limit.limit(), 1.0, "clamped at min");
        assert!(
            limit.try_acquire(Priority::Interactive),
            "a route at min still admits one"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn limit_recovers_additively() {
        let mut limit = aimd(10.0);
        limit.on_overload(Instant::now());
        assert_eq!(limit.limit(), 5.0, "halved");
        for _ in 0..5 {
            limit.on_success();
        }
        let after_one_window = limit.limit();
        assert!(
            (5.9..6.0).contains(&after_one_window),
            "a limit's worth of successes adds about one, got {after_one_window}"
        );
        let mut successes = 5;
        while limit.limit() < 10.0 {
            limit.on_success();
            successes += 1;
        }
        assert!(
            (30..=40).contains(&successes),
            "recovering from 5 to 10 takes about 5+6+7+8+9 = 35 successes, took {successes}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn limit_never_exceeds_max() {
        let mut limit = Aimd::new(AimdConfig {
            initial: 3.0,
            max: 4.0,
            ..AimdConfig::default()
        });
        for _ in 0..1000 {
            limit.on_success();
        }
        assert_eq!(limit.limit(), 4.0, "clamped at max");
    }

    #[tokio::test(start_paused = true)]
    async fn admits_up_to_the_limit() {
        let mut limit = aimd(4.0);
        let admitted = (0..10).filter(|_| limit.try_acquire(Priority::Interactive)).count();
        assert_eq!(admitted, 4, "four slots");
        assert_eq!(limit.in_flight(), 4, "four in flight");
        limit.release();
        assert!(limit.try_acquire(Priority::Interactive), "a released slot is reusable");
    }

    #[tokio::test(start_paused = true)]
    async fn batch_is_refused_before_interactive_when_saturated() {
        let mut limit = aimd(10.0);
        let batch = (0..10).filter(|_| limit.try_acquire(Priority::Batch)).count();
        assert_eq!(batch, 7, "batch may use only 70% of the limit");
        assert!(!limit.has_room(Priority::Batch), "batch sees no room");
        assert!(limit.has_room(Priority::Interactive), "interactive still has room");
        let interactive = (0..10).filter(|_| limit.try_acquire(Priority::Interactive)).count();
        assert_eq!(interactive, 3, "interactive gets the remaining 30%");
        assert!(!limit.try_acquire(Priority::Interactive), "now saturated for everyone");
    }

    #[tokio::test(start_paused = true)]
    async fn batch_is_shed_first_after_a_decrease() {
        let mut limit = aimd(10.0);
        for _ in 0..4 {
            assert!(limit.try_acquire(Priority::Interactive), "room for four");
        }
        limit.on_overload(Instant::now());
        assert!(
            !limit.try_acquire(Priority::Batch),
            "limit 5, batch share 3, 4 in flight: refused"
        );
        assert!(
            limit.try_acquire(Priority::Interactive),
            "interactive takes the fifth slot"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn batch_only_traffic_is_never_shut_out() {
        let mut limit = aimd(1.0);
        assert!(
            limit.try_acquire(Priority::Batch),
            "at least one batch slot even at limit 1"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn release_without_acquire_does_not_underflow() {
        let mut limit = aimd(4.0);
        limit.release();
        assert_eq!(limit.in_flight(), 0, "saturates at zero");
    }

    #[tokio::test(start_paused = true)]
    async fn nonsense_config_is_clamped() {
        let limit = Aimd::new(AimdConfig {
            initial: f64::NAN,
            min: 0.0,
            max: -5.0,
            ..AimdConfig::default()
        });
        assert_eq!(limit.limit(), 1.0, "NaN initial falls back to min, min raised to 1");
        assert_eq!(limit.config().max, 1.0, "max raised to min");
    }
}
