//! Micro-benchmark of the percentile read planning and hedging make per request: a route's
//! TTFT quantile from its rolling window (cached between samples), beside the read it
//! replaced (copy the previous half's histogram, merge the current one in, then ask), and the
//! read right after a new sample (the cache refreshed).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use hdrhistogram::Histogram;
use tailcut::health::ttft::LatencyWindow;
use tokio::time::Instant;

fn histogram() -> Histogram<u64> {
    match Histogram::new_with_bounds(1, 600_000_000, 3) {
        Ok(h) => h,
        Err(e) => panic!("histogram: {e}"),
    }
}

fn percentile(c: &mut Criterion) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_time().build() {
        Ok(rt) => rt,
        Err(e) => panic!("runtime: {e}"),
    };
    let _entered = runtime.enter();
    let now = Instant::now();
    let samples: Vec<Duration> = (0..2000u64)
        .map(|i| Duration::from_micros(50_000 + (i * 7919) % 900_000))
        .collect();
    let mut window = LatencyWindow::new(Duration::from_secs(60), now);
    let (mut previous, mut current) = (histogram(), histogram());
    for (i, s) in samples.iter().enumerate() {
        window.record(now, *s);
        let h = if i % 2 == 0 { &mut previous } else { &mut current };
        let _ = h.record(s.as_micros() as u64);
    }
    let mut group = c.benchmark_group("ttft_percentile");
    group.bench_function("cached_read", |b| {
        b.iter(|| black_box(window.quantile(now, black_box(0.95), 20)))
    });
    group.bench_function("read_after_a_sample", |b| {
        b.iter(|| {
            window.record(now, Duration::from_millis(300));
            black_box(window.quantile(now, black_box(0.95), 20))
        })
    });
    group.bench_function("copy_and_merge_per_read (replaced)", |b| {
        b.iter(|| {
            let mut merged = previous.clone();
            let _ = merged.add(&current);
            black_box(merged.value_at_quantile(black_box(0.95)))
        })
    });
    group.finish();
}

criterion_group!(benches, percentile);
criterion_main!(benches);
