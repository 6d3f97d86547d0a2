//! What `/admin/routes` remembers between reads: each route's last TTFT figures (shown stale,
//! with their age, once the live window empties) and the drills running with a duration.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::millis;
use crate::health::{Health, RouteSnapshot};

/// Something a read of `/admin/routes` saw, and when.
#[derive(Debug, Clone)]
struct Seen<T> {
    value: T,
    at: Instant,
}

impl<T> Seen<T> {
    fn age_ms(&self, now: Instant) -> u64 {
        millis(now.saturating_duration_since(self.at))
    }
}

#[derive(Debug, Clone, Copy)]
struct Percentiles {
    p50: Option<f64>,
    p95: Option<f64>,
    p99: Option<f64>,
    samples: u64,
}

/// The last TTFT figures seen for one route.
#[derive(Debug, Clone, Default)]
pub(super) struct LastTtft {
    percentiles: Option<Seen<Percentiles>>,
    ccdf: Option<Seen<Vec<[f64; 2]>>>,
}

impl LastTtft {
    /// Whether percentiles were ever seen for the route.
    pub(super) fn has_percentiles(&self) -> bool {
        self.percentiles.is_some()
    }

    /// `{"points", "samples", "age_ms", "stale"}`: the CCDF of this read, or the last one
    /// seen (stale, `age_ms` old); `null` if none was ever seen.
    pub(super) fn ccdf_json(&self, now: Instant) -> Value {
        match (&self.ccdf, &self.percentiles) {
            (Some(c), p) => json!({
                "points": c.value,
                "samples": p.as_ref().map(|p| p.value.samples),
                "age_ms": c.age_ms(now),
                "stale": c.at != now,
            }),
            (None, _) => Value::Null,
        }
    }

    pub(super) fn percentiles_json(&self, now: Instant) -> Value {
        match &self.percentiles {
            Some(p) => json!({
                "p50_ms": p.value.p50,
                "p95_ms": p.value.p95,
                "p99_ms": p.value.p99,
                "samples": p.value.samples,
                "age_ms": p.age_ms(now),
            }),
            None => Value::Null,
        }
    }
}

/// A drill: when it ends (its breaker's opening lasts until then).
struct Drill {
    ends_at: Instant,
}

/// What `/admin/routes` keeps between requests, one per server (an `Extension` of the ops
/// router). Keyed by route name, and only for configured routes: bounded by the config.
#[derive(Default)]
pub struct OpsMemory {
    ttft: Mutex<HashMap<String, LastTtft>>,
    drills: Mutex<HashMap<String, Drill>>,
}

impl OpsMemory {
    /// Records what this read of `snap` saw (percentiles when its window holds samples, the
    /// CCDF when there is one) and returns what is known now, fresh or not.
    pub(super) fn remember(&self, snap: &RouteSnapshot, ccdf: Vec<[f64; 2]>, now: Instant) -> LastTtft {
        let mut all = self.ttft.lock();
        let last = all.entry(snap.name.clone()).or_default();
        if snap.ttft_samples > 0 {
            last.percentiles = Some(Seen {
                value: Percentiles {
                    p50: snap.ttft_p50_ms,
                    p95: snap.ttft_p95_ms,
                    p99: snap.ttft_p99_ms,
                    samples: snap.ttft_samples,
                },
                at: now,
            });
        }
        if !ccdf.is_empty() {
            last.ccdf = Some(Seen { value: ccdf, at: now });
        }
        last.clone()
    }

    /// How long the drill on `name` keeps its breaker open from `now`, if one runs.
    pub(super) fn drill_left(&self, name: &str, now: Instant) -> Option<Duration> {
        self.drills
            .lock()
            .get(name)
            .map(|d| d.ends_at.saturating_duration_since(now))
            .filter(|left| !left.is_zero())
    }

    /// Opens `name`'s breaker for `requested` (one cool-down when `None`, and never less),
    /// replacing a drill running on it. Returns how long it stays open, `None` for an unknown
    /// route. One opening that lasts the drill: a refusal's retry hint is the drill's end, and
    /// the breaker turns half-open (probes) only then.
    pub(super) fn start_drill(
        &self,
        health: &Arc<Health>,
        name: &str,
        requested: Option<Duration>,
        now: Instant,
    ) -> Option<Duration> {
        let ends_at = health.force_open_for(name, now, requested.unwrap_or_default())?;
        let open_for = ends_at.saturating_duration_since(now);
        self.drills.lock().insert(name.to_string(), Drill { ends_at });
        Some(open_for)
    }
}
