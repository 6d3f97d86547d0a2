//! Rolling latency window per route (time to first content token, inter-token gaps): a
//! rotating pair of HDR histograms, so percentiles follow the last one to two half-windows.
//!
//! Like tower's hedge histogram, two histograms rotate: samples go into `current`; every half
//! window `current` becomes `previous` and a fresh one starts. Percentiles read both, so the
//! answer always covers between one half-window and a full window of history, and a route
//! that recovers stops being judged by its bad minutes within one window.

use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

/// Highest latency tracked; slower samples are clamped to it.
const MAX_TRACKED_US: u64 = 600_000_000;

#[derive(Debug, Clone)]
pub struct LatencyWindow {
    current: Histogram<u64>,
    previous: Histogram<u64>,
    half: Duration,
    rotated_at: Instant,
}

impl LatencyWindow {
    pub fn new(window: Duration, now: Instant) -> Self {
        LatencyWindow {
            current: new_histogram(),
            previous: new_histogram(),
            half: (window / 2).max(Duration::from_millis(1)),
            rotated_at: now,
        }
    }

    pub fn record(&mut self, now: Instant, latency: Duration) {
        self.rotate(now);
        let us = (latency.as_micros() as u64).clamp(1, MAX_TRACKED_US);
        // Cannot fail: the value is clamped into the histogram's range.
        let _ = self.current.record(us);
    }

    /// Samples in the window.
    pub fn samples(&mut self, now: Instant) -> u64 {
        self.rotate(now);
        self.current.len() + self.previous.len()
    }

    /// The `q` quantile (0..1) over the window, or `None` with fewer than `min_samples`.
    pub fn quantile(&mut self, now: Instant, q: f64, min_samples: u64) -> Option<Duration> {
        self.rotate(now);
        let n = self.current.len() + self.previous.len();
        if n == 0 || n < min_samples {
            return None;
        }
        let mut merged = self.previous.clone();
        // Cannot fail: both histograms share the same bounds.
        let _ = merged.add(&self.current);
        Some(Duration::from_micros(merged.value_at_quantile(q.clamp(0.0, 1.0))))
    }

    fn rotate(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.rotated_at);
        if elapsed < self.half {
            return;
        }
        if elapsed >= self.half * 2 {
            // Idle for a whole window: everything is stale.
            self.previous.reset();
        } else {
            std::mem::swap(&mut self.previous, &mut self.current);
        }
        self.current.reset();
        self.rotated_at = now;
    }
}

fn new_histogram() -> Histogram<u64> {
    // 3 significant digits over 1 us .. 10 min: ~1 ms resolution at 1 s, a few tens of KiB.
    match Histogram::new_with_bounds(1, MAX_TRACKED_US, 3) {
        Ok(h) => h,
        // Unreachable with these constant bounds; an auto-resizing histogram is the fallback.
        Err(_) => {
            let mut h = Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant figures is valid"));
            h.auto(true);
            h
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_quantile_below_min_samples() {
        let now = Instant::now();
        let mut w = LatencyWindow::new(Duration::from_secs(60), now);
        for _ in 0..19 {
            w.record(now, Duration::from_millis(100));
        }
        assert_eq!(w.quantile(now, 0.95, 20), None, "19 samples are not enough");
        w.record(now, Duration::from_millis(100));
        assert!(w.quantile(now, 0.95, 20).is_some(), "20 samples are");
    }

    #[test]
    fn p95_of_uniform_samples() {
        let now = Instant::now();
        let mut w = LatencyWindow::new(Duration::from_secs(60), now);
        for ms in 1..=100 {
            w.record(now, Duration::from_millis(ms));
        }
        let p95 = w.quantile(now, 0.95, 1).expect("enough samples");
        assert!((94..=96).contains(&p95.as_millis()), "p95 of 1..=100 ms was {p95:?}");
    }

    #[test]
    fn old_samples_age_out_after_a_window() {
        let t0 = Instant::now();
        let mut w = LatencyWindow::new(Duration::from_secs(10), t0);
        for _ in 0..50 {
            w.record(t0, Duration::from_secs(5));
        }
        let t1 = t0 + Duration::from_secs(6);
        for _ in 0..50 {
            w.record(t1, Duration::from_millis(100));
        }
        assert_eq!(w.samples(t1), 100, "after one rotation both halves count");
        let t2 = t1 + Duration::from_secs(6);
        assert_eq!(w.samples(t2), 50, "the slow half aged out");
        let p95 = w.quantile(t2, 0.95, 1).expect("samples");
        assert!(p95 < Duration::from_millis(200), "only fast samples remain: {p95:?}");
        assert_eq!(
            w.samples(t2 + Duration::from_secs(30)),
            0,
            "idle for a window forgets all"
        );
    }
}
