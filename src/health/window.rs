//! Rolling, time-bucketed counters: how many of each thing happened in the last `window`.
//!
//! The window is a ring of [`BUCKETS`] fixed-width slices. Each slice remembers which
//! slice of time (its *epoch*, counted from the first sample) it holds, so reading the
//! totals never needs to mutate anything: a slice whose epoch has fallen out of the
//! window is simply skipped, and it is zeroed the next time a sample lands in its slot.
//!
//! One type serves every rolling count in `health` and `mux`: the breaker keeps
//! successes and failures ([`RollingCounts::record`]), the hedge budget keeps requests
//! and withdrawals ([`RollingCounts::add`] with its own field names). Counts are exact
//! per slice, so a burst and the same samples spread over the window weigh the same.
//!
//! Resolution: the current slice is partly filled, so the totals cover between
//! `window * (BUCKETS - 1) / BUCKETS` and `window` of history.

use std::time::Duration;

use tokio::time::Instant;

/// Slices per window: enough to forget old samples smoothly, few enough to sum on read.
pub const BUCKETS: usize = 10;

/// Field index of successes in an outcome window ([`RollingCounts::record`]).
pub const SUCCESSES: usize = 0;
/// Field index of failures in an outcome window ([`RollingCounts::record`]).
pub const FAILURES: usize = 1;

/// A window over successes and failures, as the breaker keeps it.
pub type OutcomeCounts = RollingCounts<2>;

/// `F` counters per slice, summed over a rolling window. Field indexes are `0..F`; callers
/// name them with constants (see [`SUCCESSES`], [`FAILURES`]). `F` defaults to two, the
/// shape of an outcome window.
#[derive(Debug, Clone)]
pub struct RollingCounts<const F: usize = 2> {
    window: Duration,
    bucket_width: Duration,
    buckets: [Bucket<F>; BUCKETS],
    /// The instant epoch 0 starts at; set by the first sample.
    origin: Option<Instant>,
    /// The newest epoch written. Samples reported late count into it rather than erase it.
    latest: u64,
}

#[derive(Debug, Clone, Copy)]
struct Bucket<const F: usize> {
    epoch: u64,
    counts: [u64; F],
}

impl<const F: usize> RollingCounts<F> {
    /// A window covering `window` of history. A zero window is widened to one nanosecond
    /// per slice so the arithmetic stays defined.
    pub fn new(window: Duration) -> Self {
        let bucket_width = (window / BUCKETS as u32).max(Duration::from_nanos(1));
        RollingCounts {
            window,
            bucket_width,
            buckets: [Bucket {
                epoch: 0,
                counts: [0; F],
            }; BUCKETS],
            origin: None,
            latest: 0,
        }
    }

    /// The span of history this window covers.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Adds `n` to counter `field` at `now`. A `field` outside `0..F` is a caller bug and
    /// is ignored rather than panicking.
    pub fn add(&mut self, now: Instant, field: usize, n: u64) {
        debug_assert!(field < F, "field {field} is outside this window's {F} counters");
        let origin = *self.origin.get_or_insert(now);
        let epoch = self.epoch_of(origin, now).max(self.latest);
        self.latest = epoch;
        let slot = &mut self.buckets[slot_of(epoch)];
        if slot.epoch != epoch {
            *slot = Bucket { epoch, counts: [0; F] };
        }
        if let Some(count) = slot.counts.get_mut(field) {
            *count = count.saturating_add(n);
        }
    }

    /// Every counter summed over the slices still inside the window at `now`.
    pub fn totals(&self, now: Instant) -> [u64; F] {
        let mut totals = [0; F];
        let Some(origin) = self.origin else {
            return totals;
        };
        let current = self.epoch_of(origin, now).max(self.latest);
        for bucket in &self.buckets {
            if bucket.epoch <= current && current - bucket.epoch < BUCKETS as u64 {
                for (total, count) in totals.iter_mut().zip(bucket.counts) {
                    *total = total.saturating_add(count);
                }
            }
        }
        totals
    }

    /// One counter summed over the window at `now` (0 for a `field` outside `0..F`).
    pub fn total(&self, now: Instant, field: usize) -> u64 {
        self.totals(now).get(field).copied().unwrap_or(0)
    }

    /// Forgets everything: the next sample starts a fresh window.
    pub fn reset(&mut self) {
        *self = RollingCounts::new(self.window);
    }

    fn epoch_of(&self, origin: Instant, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(origin).as_nanos();
        let epoch = elapsed / self.bucket_width.as_nanos();
        u64::try_from(epoch).unwrap_or(u64::MAX)
    }
}

fn slot_of(epoch: u64) -> usize {
    // The remainder is below BUCKETS, so it always fits a usize.
    (epoch % BUCKETS as u64) as usize
}

impl RollingCounts<2> {
    /// Records one outcome: a success or a failure.
    pub fn record(&mut self, now: Instant, success: bool) {
        self.add(now, if success { SUCCESSES } else { FAILURES }, 1);
    }

    /// Outcomes recorded in the window at `now`.
    pub fn volume(&self, now: Instant) -> u64 {
        let [successes, failures] = self.totals(now);
        successes.saturating_add(failures)
    }

    /// Failures over outcomes in the window at `now`; 0.0 when the window is empty.
    pub fn error_rate(&self, now: Instant) -> f64 {
        let [successes, failures] = self.totals(now);
        let volume = successes.saturating_add(failures);
        if volume == 0 {
            0.0
        } else {
            failures as f64 / volume as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(10);
    const SLICE: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn empty_window_reads_zero() {
        let counts = OutcomeCounts::new(WINDOW);
        let now = Instant::now();
        assert_eq!(counts.totals(now), [0, 0], "nothing recorded yet");
        assert_eq!(counts.volume(now), 0, "no volume yet");
        assert_eq!(counts.error_rate(now), 0.0, "empty window has no errors");
    }

    #[tokio::test(start_paused = true)]
    async fn record_counts_successes_and_failures() {
        let mut counts = OutcomeCounts::new(WINDOW);
        let now = Instant::now();
        for success in [true, true, true, false] {
            counts.record(now, success);
        }
        assert_eq!(counts.totals(now), [3, 1], "three successes, one failure");
        assert_eq!(counts.volume(now), 4, "four outcomes");
        assert_eq!(counts.error_rate(now), 0.25, "one in four failed");
    }

    #[tokio::test(start_paused = true)]
    async fn samples_inside_the_window_are_kept() {
        let mut counts = RollingCounts::<3>::new(WINDOW);
        let start = Instant::now();
        for i in 0..9 {
            counts.add(start + SLICE * i, 2, 1);
        }
        let now = start + SLICE * 9;
        assert_eq!(counts.total(now, 2), 9, "all nine samples are within ten seconds");
        assert_eq!(counts.total(now, 0), 0, "other fields untouched");
    }

    #[tokio::test(start_paused = true)]
    async fn window_forgets_samples_older_than_the_window() {
        let mut counts = OutcomeCounts::new(WINDOW);
        let start = Instant::now();
        counts.record(start, false);
        counts.record(start + SLICE * 5, true);
        assert_eq!(counts.volume(start + SLICE * 9), 2, "both still inside at 9 s");
        assert_eq!(
            counts.totals(start + SLICE * 10),
            [1, 0],
            "the t=0 failure expired at 10 s"
        );
        assert_eq!(counts.volume(start + SLICE * 15), 0, "everything expired at 15 s");
    }

    #[tokio::test(start_paused = true)]
    async fn reading_does_not_need_a_write_to_expire() {
        let mut counts = OutcomeCounts::new(WINDOW);
        let start = Instant::now();
        counts.record(start, false);
        assert_eq!(
            counts.volume(start + Duration::from_secs(3600)),
            0,
            "an hour later, nothing"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reused_slot_is_cleared_before_counting() {
        let mut counts = OutcomeCounts::new(WINDOW);
        let start = Instant::now();
        for _ in 0..5 {
            counts.record(start, false);
        }
        // Epoch 10 lands in the same slot as epoch 0.
        counts.record(start + SLICE * 10, true);
        assert_eq!(
            counts.totals(start + SLICE * 10),
            [1, 0],
            "the old slice was overwritten"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn late_samples_count_into_the_newest_slice() {
        let mut counts = OutcomeCounts::new(WINDOW);
        let start = Instant::now();
        counts.record(start + SLICE * 20, true);
        counts.record(start + SLICE * 5, false);
        assert_eq!(
            counts.totals(start + SLICE * 20),
            [1, 1],
            "the late failure is not lost"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn reset_forgets_everything() {
        let mut counts = OutcomeCounts::new(WINDOW);
        let now = Instant::now();
        counts.record(now, false);
        counts.reset();
        assert_eq!(counts.volume(now), 0, "reset clears the window");
        assert_eq!(counts.window(), WINDOW, "reset keeps the window length");
    }

    #[tokio::test(start_paused = true)]
    async fn zero_window_does_not_panic() {
        let mut counts = OutcomeCounts::new(Duration::ZERO);
        let now = Instant::now();
        counts.record(now, true);
        assert_eq!(counts.volume(now), 1, "a sample at the same instant still counts");
        assert_eq!(counts.volume(now + SLICE), 0, "and is gone a second later");
    }

    #[tokio::test(start_paused = true)]
    async fn out_of_range_field_reads_zero() {
        let counts = OutcomeCounts::new(WINDOW);
        assert_eq!(counts.total(Instant::now(), 7), 0, "unknown field reads as zero");
    }
}
