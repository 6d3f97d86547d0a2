//! The bounds of a scenario's values: the clamps the simulator applies when it runs one
//! (`ms`, `probability`, [`MAX_TOKENS`]), and the values `check-config` refuses rather than
//! run clamped (`Scenario::problems`).

use std::time::Duration;

use super::scenario::{Failure, Scenario, Ttft};

/// The longest delay the simulator will ever sleep for one step.
const MAX_DELAY: Duration = Duration::from_secs(24 * 3600);

/// The most tokens one generated answer has, whatever `tokens` says.
pub(crate) const MAX_TOKENS: u32 = 100_000;

/// Milliseconds from a scenario (possibly NaN, negative or huge) as a safe `Duration`.
pub(crate) fn ms(value: f64) -> Duration {
    if value.is_nan() || value <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(value / 1000.0)
        .unwrap_or(MAX_DELAY)
        .min(MAX_DELAY)
}

/// A probability from a scenario, clamped into `[0, 1]` (NaN = never).
pub(crate) fn probability(value: f64) -> f64 {
    if value.is_nan() {
        0.0
    } else {
        value.clamp(0.0, 1.0)
    }
}

impl Scenario {
    /// Values the simulator would only clamp or ignore, as `(key, why)` pairs under the
    /// scenario's own path: a config that asks for them is refused by `check-config` and at
    /// start, rather than silently run as something else.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.tokens > MAX_TOKENS {
            out.push((
                "tokens".into(),
                format!("{} is more than the most an answer has, {MAX_TOKENS}", self.tokens),
            ));
        }
        for (key, value) in [
            ("inter_token_ms", self.inter_token_ms),
            ("inter_token_sigma", self.inter_token_sigma),
        ] {
            non_negative(&mut out, key, value);
        }
        self.ttft.problems("ttft", &mut out);
        self.failure.problems("failure", &mut out);
        if let Some(c) = &self.cold_start {
            non_negative(&mut out, "cold_start.extra_ms", c.extra_ms);
        }
        if let Some(b) = &self.brownout {
            non_negative(&mut out, "brownout.extra_ms", b.extra_ms);
            share(&mut out, "brownout.duty", b.duty);
        }
        if self.chunk_split == Some(0) {
            out.push(("chunk_split".into(), "must be at least 1 byte".into()));
        }
        for (i, phase) in self.phases.iter().enumerate() {
            if let Some(t) = &phase.ttft {
                t.problems(&format!("phases[{i}].ttft"), &mut out);
            }
            if let Some(f) = &phase.failure {
                f.problems(&format!("phases[{i}].failure"), &mut out);
            }
        }
        out
    }
}

impl Ttft {
    fn problems(&self, at: &str, out: &mut Vec<(String, String)>) {
        for (key, value) in [
            ("median_ms", self.median_ms),
            ("sigma", self.sigma),
            ("stall_min_ms", self.stall_min_ms),
            ("stall_max_ms", self.stall_max_ms),
        ] {
            non_negative(out, &format!("{at}.{key}"), value);
        }
        share(out, &format!("{at}.stall_prob"), self.stall_prob);
    }
}

impl Failure {
    fn problems(&self, at: &str, out: &mut Vec<(String, String)>) {
        if let Some(status) = self.status.filter(|s| !(200..=599).contains(s)) {
            out.push((
                format!("{at}.status"),
                format!("{status} is not an HTTP status from 200 to 599"),
            ));
        }
        share(out, &format!("{at}.status_rate"), self.status_rate);
        share(out, &format!("{at}.drop_rate"), self.drop_rate);
    }
}

/// A duration or spread: a finite number, 0 or more.
fn non_negative(out: &mut Vec<(String, String)>, key: &str, value: f64) {
    if !(value.is_finite() && value >= 0.0) {
        out.push((key.to_string(), format!("{value} must be a finite number, 0 or more")));
    }
}

/// A probability or share: from 0 to 1.
fn share(out: &mut Vec<(String, String)>, key: &str, value: f64) {
    if !(0.0..=1.0).contains(&value) {
        out.push((key.to_string(), format!("{value} must be from 0 to 1")));
    }
}
