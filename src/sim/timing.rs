//! Latency sampling: time to first token (lognormal, stalls, cold start, brownout) and the
//! gaps between tokens.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::Rng;
use rand_distr::{Distribution, LogNormal};

use super::bounds::{ms, probability};
use super::scenario::Scenario;

/// The longest TTFT stall drawn (one day).
const MAX_STALL_MS: f64 = 86_400_000.0;

/// Where one request stands when its TTFT is drawn.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Moment {
    /// 0 for the scenario's first request.
    pub request_number: u64,
    /// Milliseconds on the simulator's clock (brownouts are time-based).
    pub clock_ms: u64,
}

/// Draws the time to first token of one request.
pub(crate) fn ttft(scenario: &Scenario, moment: Moment, rng: &mut SmallRng) -> Duration {
    let t = &scenario.ttft;
    let mut total = lognormal_around(t.median_ms, t.sigma, rng);
    if rng.random_bool(probability(t.stall_prob)) {
        // Clamped so the uniform range is always finite and ordered.
        let bound = |v: f64| if v.is_nan() { 0.0 } else { v.clamp(0.0, MAX_STALL_MS) };
        let (lo, hi) = (bound(t.stall_min_ms), bound(t.stall_max_ms));
        let stall = if hi > lo { rng.random_range(lo..=hi) } else { lo };
        total += ms(stall);
    }
    if let Some(cold) = &scenario.cold_start {
        if moment.request_number < cold.requests {
            total += ms(cold.extra_ms);
        }
    }
    if let Some(b) = &scenario.brownout {
        if b.period_ms > 0 {
            let phase = (moment.clock_ms % b.period_ms) as f64;
            if phase < probability(b.duty) * b.period_ms as f64 {
                total += ms(b.extra_ms);
            }
        }
    }
    total
}

/// Draws one gap between tokens: lognormal with mean `inter_token_ms`.
pub(crate) fn inter_token(scenario: &Scenario, rng: &mut SmallRng) -> Duration {
    let sigma = sane_sigma(scenario.inter_token_sigma);
    let mean = scenario.inter_token_ms;
    if sigma == 0.0 || mean.is_nan() || mean <= 0.0 {
        return ms(mean);
    }
    // mean = exp(mu + sigma²/2), so this median keeps the configured mean.
    lognormal_around(mean * (-sigma * sigma / 2.0).exp(), sigma, rng)
}

fn lognormal_around(median_ms: f64, sigma: f64, rng: &mut SmallRng) -> Duration {
    let sigma = sane_sigma(sigma);
    if sigma == 0.0 || !median_ms.is_finite() || median_ms <= 0.0 {
        return ms(median_ms);
    }
    match LogNormal::new(median_ms.ln(), sigma) {
        Ok(dist) => ms(dist.sample(rng)),
        Err(_) => ms(median_ms),
    }
}

fn sane_sigma(sigma: f64) -> f64 {
    if sigma.is_finite() && sigma > 0.0 {
        sigma.min(10.0)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::scenario::{Brownout, ColdStart, Ttft};
    use rand::SeedableRng;

    fn constant(median_ms: f64) -> Scenario {
        Scenario {
            ttft: Ttft {
                median_ms,
                ..Ttft::default()
            },
            ..Scenario::default()
        }
    }

    const FIRST: Moment = Moment {
        request_number: 0,
        clock_ms: 0,
    };

    #[test]
    fn zero_sigma_gives_exactly_the_median() {
        let mut rng = SmallRng::seed_from_u64(3);
        let got = ttft(&constant(250.0), FIRST, &mut rng);
        assert_eq!(got, Duration::from_millis(250), "constant TTFT");
    }

    #[test]
    fn cold_start_adds_only_to_the_first_requests() {
        let scenario = Scenario {
            cold_start: Some(ColdStart {
                requests: 2,
                extra_ms: 1000.0,
            }),
            ..constant(100.0)
        };
        let mut rng = SmallRng::seed_from_u64(3);
        let at = |n| Moment {
            request_number: n,
            clock_ms: 0,
        };
        assert_eq!(ttft(&scenario, at(1), &mut rng), Duration::from_millis(1100), "cold");
        assert_eq!(ttft(&scenario, at(2), &mut rng), Duration::from_millis(100), "warm");
    }

    #[test]
    fn brownout_follows_the_clock() {
        let scenario = Scenario {
            brownout: Some(Brownout {
                period_ms: 1000,
                duty: 0.5,
                extra_ms: 300.0,
            }),
            ..constant(100.0)
        };
        let mut rng = SmallRng::seed_from_u64(3);
        let at = |clock_ms| Moment {
            request_number: 9,
            clock_ms,
        };
        assert_eq!(ttft(&scenario, at(1200), &mut rng), Duration::from_millis(400), "in");
        assert_eq!(ttft(&scenario, at(1700), &mut rng), Duration::from_millis(100), "out");
    }

    #[test]
    fn lognormal_median_is_roughly_honoured() {
        let scenario = Scenario {
            ttft: Ttft {
                median_ms: 500.0,
                sigma: 0.6,
                ..Ttft::default()
            },
            ..Scenario::default()
        };
        let mut rng = SmallRng::seed_from_u64(11);
        let mut samples: Vec<Duration> = (0..2001).map(|_| ttft(&scenario, FIRST, &mut rng)).collect();
        samples.sort();
        let median = samples[1000].as_secs_f64() * 1000.0;
        assert!((420.0..600.0).contains(&median), "sample median {median} ms");
    }

    #[test]
    fn hostile_numbers_never_panic() {
        let scenario = Scenario {
            ttft: Ttft {
                median_ms: f64::NAN,
                sigma: -1.0,
                stall_prob: 7.0,
                stall_min_ms: 5.0,
                stall_max_ms: f64::INFINITY,
            },
            inter_token_ms: f64::INFINITY,
            inter_token_sigma: f64::NAN,
            ..Scenario::default()
        };
        let mut rng = SmallRng::seed_from_u64(0);
        let _ = ttft(&scenario, FIRST, &mut rng);
        let _ = inter_token(&scenario, &mut rng);
    }
}
