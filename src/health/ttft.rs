//! Rolling latency window per route (time to first content token, inter-token gaps): HDR
//! histograms over the last one to two half-windows, with the percentiles planning reads
//! cached across samples within a bounded staleness.
//!
//! Like tower's hedge histogram, the window rotates every half window, so the answer always
//! covers between one half-window and a full window of history, and a route that recovers
//! stops being judged by its bad minutes within one window. Two histograms are kept:
//! `current` (this half) and `window` (the previous half plus this one). A sample goes into
//! both; a rotation makes `current` the new `window` (a swap, no copy) and starts an empty
//! `current`. So a read never merges or copies a histogram: it asks `window` directly.
//!
//! Reading a quantile walks the histogram's counters (thousands of instructions), and every
//! request both adds a sample and reads two or three quantiles, so an answer is cached per
//! quantile and kept while few samples are newer than it: it is recomputed once the window
//! holds more than `1 / STALE_FRACTION` (1/32) more samples than when it was computed, and at
//! every rotation. Below 32 samples any new sample refreshes it. The staleness bound: a
//! cached `q` quantile is the exact (bucket-resolution) `q` quantile of all but at most one
//! in 33 of the window's samples, so it lies between the window's `q - 1/33` and `q + 1/33`
//! quantiles (a p95 between p92 and p98) — finer than the window's own drift, which covers
//! anything from one half-window to a whole window of history.

use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

/// Highest latency tracked; slower samples are clamped to it.
const MAX_TRACKED_US: u64 = 600_000_000;

/// Distinct quantiles cached at once (planning reads p50 and p95, hedging its percentile,
/// stall limits p99 of the gaps).
const CACHED: usize = 4;

/// A cached quantile is recomputed once more than one sample in this many (of those it was
/// computed over) came after it (the module doc's staleness bound).
const STALE_FRACTION: u64 = 32;

/// One cached quantile: q's bits, its value in µs, and the window's sample count when it was
/// computed.
#[derive(Debug, Clone, Copy)]
struct Cached {
    key: u64,
    us: u64,
    samples: u64,
}

impl Cached {
    /// Still within the staleness bound with `samples` in the window now (a rotation clears
    /// the cache, so the count only grows while an entry lives).
    fn fresh(&self, samples: u64) -> bool {
        samples.saturating_sub(self.samples) <= self.samples / STALE_FRACTION
    }
}

#[derive(Debug, Clone)]
pub struct LatencyWindow {
    /// Samples of this half window.
    current: Histogram<u64>,
    /// Samples of the previous half window and this one.
    window: Histogram<u64>,
    half: Duration,
    rotated_at: Instant,
    /// Quantiles read since the last rotation, each with the sample count it was computed at.
    cache: Vec<Cached>,
}

impl LatencyWindow {
    pub fn new(window: Duration, now: Instant) -> Self {
        LatencyWindow {
            current: new_histogram(),
            window: new_histogram(),
            half: (window / 2).max(Duration::from_millis(1)),
            rotated_at: now,
            cache: Vec::with_capacity(CACHED),
        }
    }

    pub fn record(&mut self, now: Instant, latency: Duration) {
        self.rotate(now);
        let us = (latency.as_micros() as u64).clamp(1, MAX_TRACKED_US);
        // Cannot fail: the value is clamped into the histograms' range.
        let _ = self.current.record(us);
        let _ = self.window.record(us);
    }

    /// Samples in the window.
    pub fn samples(&mut self, now: Instant) -> u64 {
        self.rotate(now);
        self.window.len()
    }

    /// The `q` quantile (0..1) over the window, or `None` with fewer than `min_samples`.
    pub fn quantile(&mut self, now: Instant, q: f64, min_samples: u64) -> Option<Duration> {
        self.rotate(now);
        let n = self.window.len();
        if n == 0 || n < min_samples {
            return None;
        }
        let q = q.clamp(0.0, 1.0);
        let key = q.to_bits();
        let at = self.cache.iter().position(|c| c.key == key);
        if let Some(c) = at.map(|i| self.cache[i]).filter(|c| c.fresh(n)) {
            return Some(Duration::from_micros(c.us));
        }
        // The middle of the sample's bucket: within half the resolution (±0.5%) of what was
        // recorded, where the bucket's top would read up to 1% high.
        let us = self.window.median_equivalent(self.window.value_at_quantile(q));
        let entry = Cached { key, us, samples: n };
        match at {
            Some(i) => self.cache[i] = entry,
            None => {
                if self.cache.len() == CACHED {
                    self.cache.remove(0);
                }
                self.cache.push(entry);
            }
        }
        Some(Duration::from_micros(us))
    }

    fn rotate(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.rotated_at);
        if elapsed < self.half {
            return;
        }
        if elapsed >= self.half * 2 {
            // Idle for a whole window: everything is stale.
            self.window.reset();
        } else {
            // The half that just ended is the new window's previous half.
            std::mem::swap(&mut self.window, &mut self.current);
        }
        self.current.reset();
        self.rotated_at = now;
        self.cache.clear();
    }
}

/// Significant figures kept: 2 is buckets 1% of the value wide, read at their middle (±5 ms at 1 s, ±0.5 ms at
/// 100 ms), ample for hedge delays, stall limits and ranking, in 3,072 counters (24 KiB) per
/// histogram over 1 µs .. 10 min (3 figures took 168 KiB, four histograms a route).
const SIGNIFICANT_FIGURES: u8 = 2;

fn new_histogram() -> Histogram<u64> {
    match Histogram::new_with_bounds(1, MAX_TRACKED_US, SIGNIFICANT_FIGURES) {
        Ok(h) => h,
        // Unreachable with these constant bounds; an auto-resizing histogram is the fallback.
        Err(_) => {
            let mut h =
                Histogram::new(SIGNIFICANT_FIGURES).unwrap_or_else(|_| unreachable!("2 significant figures is valid"));
            h.auto(true);
            h
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_keeps_small_histograms_within_one_percent() {
        let now = Instant::now();
        let w = LatencyWindow::new(Duration::from_secs(60), now);
        // Four of these per route: 3 significant figures held ~21,500 counters (168 KiB) each.
        assert!(
            w.window.distinct_values() <= 4_000,
            "{} counters in one histogram",
            w.window.distinct_values()
        );
        for ms in [5, 100, 1_234, 45_000] {
            let mut one = LatencyWindow::new(Duration::from_secs(60), now);
            one.record(now, Duration::from_millis(ms));
            let got = one.quantile(now, 0.5, 1).map(|d| d.as_secs_f64() * 1e3).unwrap_or(0.0);
            let err = (got - ms as f64).abs() / ms as f64;
            assert!(err <= 0.01, "{ms} ms read back as {got} ms");
        }
    }

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

    #[test]
    fn a_cached_quantile_follows_new_samples() {
        let now = Instant::now();
        let mut w = LatencyWindow::new(Duration::from_secs(60), now);
        for _ in 0..10 {
            w.record(now, Duration::from_millis(10));
        }
        let p50 = w.quantile(now, 0.5, 1).expect("samples");
        assert_eq!(
            w.quantile(now, 0.5, 1),
            Some(p50),
            "a second read gives the same answer"
        );
        for _ in 0..20 {
            w.record(now, Duration::from_millis(500));
        }
        let moved = w.quantile(now, 0.5, 1).expect("samples");
        assert!(
            moved > Duration::from_millis(400),
            "the read after new samples sees them: {moved:?}"
        );
        assert!(
            w.quantile(now, 0.1, 1).expect("samples") < Duration::from_millis(20),
            "each quantile its own"
        );
    }

    #[test]
    fn a_cached_quantile_is_kept_within_one_sample_in_32() {
        let now = Instant::now();
        let mut w = LatencyWindow::new(Duration::from_secs(60), now);
        for _ in 0..320 {
            w.record(now, Duration::from_millis(10));
        }
        let max = w.quantile(now, 1.0, 1).expect("samples");
        assert!(max < Duration::from_millis(20), "{max:?}");
        // Ten new samples on 320 (one in 32): the cached answer stands, though a fresh
        // reading of the maximum would see them.
        for _ in 0..10 {
            w.record(now, Duration::from_millis(900));
        }
        assert_eq!(
            w.quantile(now, 1.0, 1),
            Some(max),
            "within the bound: the cached answer"
        );
        assert!(
            w.quantile(now, 0.999, 1).expect("samples") > Duration::from_millis(800),
            "a quantile not cached is computed over every sample"
        );
        // The eleventh is past the bound: the next read is recomputed.
        w.record(now, Duration::from_millis(900));
        assert!(
            w.quantile(now, 1.0, 1).expect("samples") > Duration::from_millis(800),
            "past the bound the read sees the new samples"
        );
    }

    #[test]
    fn a_rotation_forgets_the_cached_answer() {
        let t0 = Instant::now();
        let mut w = LatencyWindow::new(Duration::from_secs(10), t0);
        for _ in 0..10 {
            w.record(t0, Duration::from_secs(5));
        }
        let t1 = t0 + Duration::from_secs(6);
        for _ in 0..10 {
            w.record(t1, Duration::from_millis(100));
        }
        assert_eq!(w.samples(t1), 20, "one rotation: both halves");
        let slow = w.quantile(t1, 0.9, 1).expect("samples");
        assert!(slow > Duration::from_secs(4), "the slow half still counts: {slow:?}");
        // No sample between the two reads: only the rotation can refresh the answer.
        let t2 = t1 + Duration::from_secs(6);
        let fast = w.quantile(t2, 0.9, 1).expect("the newer half remains");
        assert!(
            fast < Duration::from_millis(200),
            "the slow half aged out of the cached answer: {fast:?}"
        );
    }
}
