//! Hedge and retry budget: extra attempts allowed as a share of recent requests, plus a
//! small floor, over a rolling window (Finagle's RetryBudget, gRPC retry throttling).
//!
//! # Why
//! Hedges and retries are extra load sent exactly when a route is slow or failing. Without
//! a cap, a slow upstream makes every request a double request and the slowness feeds on
//! itself. The budget keeps extra attempts to a fraction of real traffic.
//!
//! # Rule
//! Within the rolling `window`, extra attempts may not exceed
//! `ratio × requests in window + floor_per_sec × window seconds`.
//! Every logical request deposits ([`Budget::on_request`]); every hedge or retry withdraws
//! ([`Budget::try_withdraw`]), which fails once the window's allowance is used.
//!
//! The floor lets a quiet service still hedge: with the defaults (10 %, 1/s, 10 s) a burst
//! with no recorded requests can take 10 extra attempts, and a long run of traffic gets at
//! most `ratio × requests + floor × (elapsed + window)` of them, the `+ window` being the
//! floor's reserve available at the very start.
//!
//! Pure: the owner decides its scope (per route, per model, global) and the lock around it.

use std::time::Duration;

use tokio::time::Instant;

use crate::health::window::RollingCounts;

const REQUESTS: usize = 0;
const WITHDRAWALS: usize = 1;

/// Absorbs float rounding in `ratio × requests` (e.g. 0.1 × 30 = 3.0000000000000004).
const EPSILON: f64 = 1e-9;

/// Why a budget refused one more attempt. Strings only at the edge (`metric_label`,
/// `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The request has used `limits.max_attempts`.
    Attempts,
    /// The fleet-wide hedge budget is spent.
    HedgeBudget,
    /// The fleet-wide retry budget is spent.
    RetryBudget,
    /// This route has taken its share of other routes' failovers.
    BlastRadius,
}

impl Refusal {
    pub fn metric_label(self) -> &'static str {
        match self {
            Refusal::Attempts => "attempts",
            Refusal::HedgeBudget => "hedge_budget",
            Refusal::RetryBudget => "retry_budget",
            Refusal::BlastRadius => "blast_radius",
        }
    }

    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Attempts => "attempt budget spent",
            Refusal::HedgeBudget => "hedge budget spent",
            Refusal::RetryBudget => "retry budget spent",
            Refusal::BlastRadius => "blast radius cap",
        }
    }

    /// Does this refusal hold for every other route too (so looking further is pointless)?
    pub fn is_request_wide(self) -> bool {
        !matches!(self, Refusal::BlastRadius)
    }
}

/// How much extra load hedges and retries may add.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetConfig {
    /// Extra attempts per request in the window (0.1 = 10 %).
    pub ratio: f64,
    /// Extra attempts per second allowed regardless of traffic.
    pub floor_per_sec: f64,
    /// How far back requests and withdrawals are remembered.
    pub window: Duration,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            ratio: 0.1,
            floor_per_sec: 1.0,
            window: Duration::from_secs(10),
        }
    }
}

/// The budget as seen at one instant, for the dashboard and the envelope.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetSnapshot {
    /// Logical requests in the window.
    pub requests: u64,
    /// Extra attempts taken in the window.
    pub withdrawals: u64,
    /// Extra attempts the window allows in total (fractional: whole ones can be taken).
    pub allowed: f64,
}

impl BudgetSnapshot {
    /// Whole extra attempts still available.
    pub fn remaining(&self) -> u64 {
        let left = (self.allowed + EPSILON - self.withdrawals as f64).floor();
        if left > 0.0 {
            // Saturating float-to-int cast of a positive finite value.
            left as u64
        } else {
            0
        }
    }
}

/// A rolling hedge/retry budget. See the module doc.
#[derive(Debug, Clone)]
pub struct Budget {
    cfg: BudgetConfig,
    counts: RollingCounts<2>,
}

impl Budget {
    pub fn new(cfg: BudgetConfig) -> Self {
        Budget {
            counts: RollingCounts::new(cfg.window),
            cfg,
        }
    }

    pub fn config(&self) -> &BudgetConfig {
        &self.cfg
    }

    /// A logical request arrived (deposit). Call once per request, not per attempt.
    pub fn on_request(&mut self, now: Instant) {
        self.counts.add(now, REQUESTS, 1);
    }

    /// Takes one extra attempt (a hedge or a retry) if the budget allows it.
    pub fn try_withdraw(&mut self, now: Instant) -> bool {
        if !self.allows(now) {
            return false;
        }
        self.withdraw(now);
        true
    }

    /// Would one more extra attempt fit? Nothing is taken: several budgets are tested first
    /// and withdrawn from only when all of them agree, so a refusal by one leaks no token of
    /// another.
    pub fn allows(&self, now: Instant) -> bool {
        self.snapshot(now).remaining() > 0
    }

    /// Takes one extra attempt after `allows` said yes.
    pub fn withdraw(&mut self, now: Instant) {
        self.counts.add(now, WITHDRAWALS, 1);
    }

    pub fn snapshot(&self, now: Instant) -> BudgetSnapshot {
        let [requests, withdrawals] = self.counts.totals(now);
        BudgetSnapshot {
            requests,
            withdrawals,
            allowed: self.allowed(requests),
        }
    }

    fn allowed(&self, requests: u64) -> f64 {
        let ratio = finite_non_negative(self.cfg.ratio);
        let floor = finite_non_negative(self.cfg.floor_per_sec);
        ratio * requests as f64 + floor * self.cfg.window.as_secs_f64()
    }
}

/// A misconfigured NaN, infinite or negative factor allows nothing rather than everything.
fn finite_non_negative(value: f64) -> f64 {
    if value.is_finite() && value > 0.0 {
        value
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn withdraw_all(budget: &mut Budget, now: Instant) -> u64 {
        let mut taken = 0;
        while budget.try_withdraw(now) {
            taken += 1;
            assert!(taken <= 1_000_000, "the budget must run out");
        }
        taken
    }

    #[tokio::test(start_paused = true)]
    async fn default_config_is_ten_percent_one_per_second_ten_seconds() {
        let cfg = BudgetConfig::default();
        assert_eq!(
            (cfg.ratio, cfg.floor_per_sec, cfg.window),
            (0.1, 1.0, Duration::from_secs(10)),
            "defaults"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn burst_at_start_is_capped_by_the_floor() {
        let mut budget = Budget::new(BudgetConfig::default());
        let now = Instant::now();
        assert_eq!(withdraw_all(&mut budget, now), 10, "floor 1/s over a 10 s window");
        let snap = budget.snapshot(now);
        assert_eq!(
            (snap.requests, snap.withdrawals, snap.remaining()),
            (0, 10, 0),
            "snapshot"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn requests_add_ratio_of_an_attempt_each() {
        let mut budget = Budget::new(BudgetConfig {
            floor_per_sec: 0.0,
            ..BudgetConfig::default()
        });
        let now = Instant::now();
        for _ in 0..9 {
            budget.on_request(now);
        }
        assert!(!budget.try_withdraw(now), "nine requests earn 0.9 of an attempt");
        budget.on_request(now);
        assert!(budget.try_withdraw(now), "the tenth earns a whole one");
        assert!(!budget.try_withdraw(now), "and only one");
        for _ in 0..20 {
            budget.on_request(now);
        }
        assert_eq!(
            withdraw_all(&mut budget, now),
            2,
            "30 requests allow 3 in total, float rounding absorbed"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn thousand_requests_over_time_allow_at_most_ratio_plus_floor() {
        let cfg = BudgetConfig::default();
        for step_ms in [1, 37, 250, 2_000] {
            let mut budget = Budget::new(cfg.clone());
            let start = Instant::now();
            let step = Duration::from_millis(step_ms);
            let mut taken = 0u64;
            let mut now = start;
            for _ in 0..1000 {
                budget.on_request(now);
                if budget.try_withdraw(now) {
                    taken += 1;
                    // Old requests expire before the withdrawals they funded, so the
                    // invariant holds at each withdrawal, not at every instant.
                    let snap = budget.snapshot(now);
                    assert!(
                        snap.withdrawals as f64 <= snap.allowed + EPSILON,
                        "a withdrawal never takes the window past its allowance: {snap:?}"
                    );
                }
                now += step;
            }
            let elapsed = (now - start).as_secs_f64();
            let bound = cfg.ratio * 1000.0 + cfg.floor_per_sec * (elapsed + cfg.window.as_secs_f64());
            assert!(
                taken as f64 <= bound,
                "step {step_ms} ms: took {taken} extra attempts, bound {bound:.1} over {elapsed:.1} s"
            );
            // One withdrawal is attempted per request, so 1,000 is the most it could take.
            let steady = (cfg.ratio * 1000.0 + cfg.floor_per_sec * elapsed).min(1000.0);
            assert!(
                taken as f64 >= steady * 0.8,
                "step {step_ms} ms: the budget is needlessly stingy: took {taken}, steady allowance {steady:.1}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn busy_burst_allows_ratio_of_it() {
        let mut budget = Budget::new(BudgetConfig::default());
        let now = Instant::now();
        let mut taken = 0;
        for _ in 0..1000 {
            budget.on_request(now);
            if budget.try_withdraw(now) {
                taken += 1;
            }
        }
        assert_eq!(taken, 110, "10% of 1000 plus the 10-attempt floor");
    }

    #[tokio::test(start_paused = true)]
    async fn window_forgets_old_traffic() {
        let mut budget = Budget::new(BudgetConfig {
            floor_per_sec: 0.0,
            ..BudgetConfig::default()
        });
        let start = Instant::now();
        for _ in 0..100 {
            budget.on_request(start);
        }
        assert_eq!(withdraw_all(&mut budget, start), 10, "10% of 100");
        let later = start + 10 * SEC;
        let snap = budget.snapshot(later);
        assert_eq!(
            (snap.requests, snap.withdrawals),
            (0, 0),
            "a window later both are forgotten"
        );
        assert!(!budget.try_withdraw(later), "old requests fund nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn old_withdrawals_stop_counting_against_the_floor() {
        let mut budget = Budget::new(BudgetConfig::default());
        let start = Instant::now();
        assert_eq!(withdraw_all(&mut budget, start), 10, "initial floor");
        assert!(!budget.try_withdraw(start + 5 * SEC), "still inside the window");
        assert_eq!(
            withdraw_all(&mut budget, start + 10 * SEC),
            10,
            "the floor is back once they expire"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn nonsense_ratio_allows_nothing_beyond_the_floor() {
        let mut budget = Budget::new(BudgetConfig {
            ratio: f64::NAN,
            floor_per_sec: -1.0,
            ..BudgetConfig::default()
        });
        let now = Instant::now();
        for _ in 0..100 {
            budget.on_request(now);
        }
        assert!(!budget.try_withdraw(now), "NaN ratio and negative floor allow nothing");
    }
}
