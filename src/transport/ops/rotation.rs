//! The admin view of the rotation metrics, `GET /admin/rotation`: per model and per route
//! figures read off the Prometheus recorder (logical requests by outcome, failovers by layer
//! and result, attempts per request, route changes, policy rejections, repairs, answers and
//! their cost, cost per successful answer per model and per route, recovery
//! time, the honest outage count), and a bounded ring of samples taken every
//! [`SAMPLE_EVERY`] so a freshly opened dashboard plots the last hour of failover rate and
//! outages. The figures come from the recorder's exposition text ([`super::exposition`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use super::exposition::{parse, Series};
use crate::telemetry::rotation as rt;
use crate::transport::AppState;

/// How often the ring takes a sample.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// Samples kept: one hour at one per [`SAMPLE_EVERY`].
pub const SAMPLES_KEPT: usize = 360;

/// Samples the rotation totals every `SAMPLE_EVERY` into `history`, while the router that
/// holds it lives (the task holds it weakly and ends with the server). Outside a runtime
/// the ring fills from reads only.
pub(super) fn sample_rotation(history: &Arc<RotationHistory>) {
    let (Ok(runtime), Some(handle)) = (tokio::runtime::Handle::try_current(), crate::telemetry::install()) else {
        return;
    };
    let weak = Arc::downgrade(history);
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(history) = weak.upgrade() else { return };
            let totals = Totals::of(&parse(&handle.render()));
            history.record(totals, Instant::now());
        }
    });
}

/// `GET /admin/rotation`: the rotation metrics per model and per route, and the last hour
/// of failover rate and outages (see the module doc). Gated like `/admin/routes`.
pub(super) async fn admin_rotation(
    State(state): State<AppState>,
    Extension(history): Extension<Arc<RotationHistory>>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = super::admin_gate(&state, &headers, state.access.is_on(), "admin reads") {
        return refused;
    }
    let Some(handle) = &state.metrics else {
        return (StatusCode::SERVICE_UNAVAILABLE, "metrics recorder not installed").into_response();
    };
    let series = parse(&handle.render());
    let now = Instant::now();
    let totals = Totals::of(&series);
    history.record(totals, now);
    let models: Vec<String> = state.config.models.keys().cloned().collect();
    let routes: Vec<String> = state.config.routes.iter().map(|r| r.name.clone()).collect();
    Json(view(&series, &models, &routes, history.points(totals, now))).into_response()
}

/// The cumulative totals one sample keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    pub logical: f64,
    pub failovers: f64,
    pub failovers_served: f64,
    pub unroutable: f64,
}

impl Totals {
    pub fn of(series: &[Series]) -> Totals {
        let mut t = Totals::default();
        for s in series {
            match s.name.as_str() {
                rt::LOGICAL_REQUESTS_TOTAL => t.logical += s.value,
                rt::FAILOVERS_TOTAL => {
                    t.failovers += s.value;
                    if s.label("result") == "served" {
                        t.failovers_served += s.value;
                    }
                }
                rt::UNROUTABLE_TOTAL => t.unroutable += s.value,
                _ => {}
            }
        }
        t
    }
}

/// The ring of samples: at most [`SAMPLES_KEPT`], at least [`SAMPLE_EVERY`] apart.
#[derive(Debug, Default)]
pub struct RotationHistory {
    ring: Mutex<VecDeque<(Instant, Totals)>>,
}

impl RotationHistory {
    /// Keeps `totals` as the sample at `now`, unless the last one is younger than
    /// [`SAMPLE_EVERY`] (reads and the sampler both call it). Returns whether it was kept.
    pub fn record(&self, totals: Totals, now: Instant) -> bool {
        let mut ring = self.ring.lock();
        if ring
            .back()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) < SAMPLE_EVERY)
        {
            return false;
        }
        if ring.len() >= SAMPLES_KEPT {
            ring.pop_front();
        }
        ring.push_back((now, totals));
        true
    }

    /// One point per interval between consecutive samples, the last interval ending with
    /// `live` at `now`: `{age_s, logical, failovers, failover_rate, unroutable}`, oldest first.
    /// A counter that went down (a restarted recorder) counts its interval from zero.
    pub fn points(&self, live: Totals, now: Instant) -> Vec<Value> {
        let ring = self.ring.lock();
        let mut samples: Vec<(Instant, Totals)> = ring.iter().copied().collect();
        drop(ring);
        if samples.last().is_none_or(|(at, _)| *at < now) {
            samples.push((now, live));
        }
        samples
            .windows(2)
            .map(|w| {
                let ((_, a), (at, b)) = (w[0], w[1]);
                let delta = |x: f64, y: f64| if y >= x { y - x } else { y };
                let logical = delta(a.logical, b.logical);
                let failovers = delta(a.failovers, b.failovers);
                json!({
                    "age_s": now.saturating_duration_since(at).as_secs(),
                    "logical": logical,
                    "failovers": failovers,
                    "failover_rate": ratio(failovers, logical),
                    "unroutable": delta(a.unroutable, b.unroutable),
                })
            })
            .collect()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.ring.lock().len()
    }
}

fn ratio(part: f64, whole: f64) -> Value {
    if whole > 0.0 {
        json!(part / whole)
    } else {
        Value::Null
    }
}

/// Adds `value` under `keys` in a tree of JSON objects.
fn add(tree: &mut Map<String, Value>, keys: &[&str], value: f64) {
    let Some((last, path)) = keys.split_last() else {
        return;
    };
    let mut node = tree;
    for key in path {
        let entry = node.entry(key.to_string()).or_insert_with(|| json!({}));
        if !entry.is_object() {
            *entry = json!({});
        }
        let Value::Object(next) = entry else { return };
        node = next;
    }
    let sum = node.get(*last).and_then(Value::as_f64).unwrap_or(0.0) + value;
    node.insert(last.to_string(), json!(sum));
}

fn sum_values(map: &Map<String, Value>) -> f64 {
    map.values().filter_map(Value::as_f64).sum()
}

/// A histogram's (or summary's) `_sum` and `_count`, by one label's value (`""` when the
/// series has no such label).
fn sums_and_counts(series: &[Series], name: &str, label: &str) -> BTreeMap<String, (f64, f64)> {
    let (sum, count) = (format!("{name}_sum"), format!("{name}_count"));
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for s in series {
        let entry = || s.label(label).to_string();
        if s.name == sum {
            out.entry(entry()).or_default().0 += s.value;
        } else if s.name == count {
            out.entry(entry()).or_default().1 += s.value;
        }
    }
    out
}

/// The whole view: every configured model and route (zeros included), the global figures
/// and the history. `models` and `routes` come from config, so the view is bounded by it.
pub fn view(series: &[Series], models: &[String], routes: &[String], history: Vec<Value>) -> Value {
    let mut by_model: BTreeMap<&str, Map<String, Value>> = models.iter().map(|m| (m.as_str(), Map::new())).collect();
    let mut by_route: BTreeMap<&str, Map<String, Value>> = routes.iter().map(|r| (r.as_str(), Map::new())).collect();
    let mut failovers = Map::new();
    let mut unroutable = Map::new();
    let mut rejections = Map::new();
    let mut completed_cost = 0.0;
    for s in series {
        let v = s.value;
        match s.name.as_str() {
            rt::LOGICAL_REQUESTS_TOTAL => {
                if let Some(m) = by_model.get_mut(s.label("model")) {
                    add(m, &["requests", s.label("outcome")], v);
                }
            }
            rt::ROUTE_CHANGES_TOTAL => {
                if let Some(m) = by_model.get_mut(s.label("model")) {
                    add(m, &["route_changes"], v);
                }
            }
            rt::FAILOVERS_TOTAL => {
                let (layer, result) = (s.label("layer"), s.label("result"));
                add(&mut failovers, &[layer, result], v);
                if let Some(r) = by_route.get_mut(s.label("from")) {
                    add(r, &["failovers_from", layer, result], v);
                }
                if let Some(r) = by_route.get_mut(s.label("to")) {
                    add(r, &["failovers_to", layer, result], v);
                }
            }
            rt::REPAIRS_TOTAL => {
                if let Some(r) = by_route.get_mut(s.label("route")) {
                    add(r, &["repairs", s.label("outcome")], v);
                }
            }
            rt::ANSWERS_TOTAL => {
                if let Some(r) = by_route.get_mut(s.label("route")) {
                    add(r, &["answers", s.label("outcome")], v);
                }
            }
            rt::MODEL_COST_TOTAL => {
                if let Some(m) = by_model.get_mut(s.label("model")) {
                    add(m, &["cost_micros", s.label("outcome")], v);
                }
            }
            rt::ANSWER_COST_TOTAL => {
                if s.label("outcome") == "completed" {
                    completed_cost += v;
                }
                if let Some(r) = by_route.get_mut(s.label("route")) {
                    add(r, &["cost_micros", s.label("outcome")], v);
                }
            }
            rt::UNROUTABLE_TOTAL => add(&mut unroutable, &[s.label("reason")], v),
            rt::POLICY_REJECTIONS_TOTAL => add(&mut rejections, &[s.label("reason")], v),
            _ => {}
        }
    }
    for (route, (sum, count)) in sums_and_counts(series, rt::RECOVERY_SECONDS, "route") {
        if let Some(r) = by_route.get_mut(route.as_str()) {
            r.insert(
                "recovery".into(),
                json!({"count": count, "mean_s": if count > 0.0 { json!(sum / count) } else { Value::Null }}),
            );
        }
    }
    let totals = Totals::of(series);
    let mut completed = 0.0;
    let models: Vec<Value> = by_model
        .into_iter()
        .map(|(name, mut m)| {
            let requests = m.remove("requests").unwrap_or_else(|| json!({}));
            let total = requests.as_object().map_or(0.0, sum_values);
            let done = requests["completed"].as_f64().unwrap_or(0.0);
            completed += done;
            let cost = m.get("cost_micros").cloned().unwrap_or_else(|| json!({}));
            let done_cost = cost["completed"].as_f64().unwrap_or(0.0);
            json!({
                "model": name,
                "requests": requests,
                "requests_total": total,
                "success_rate": ratio(done, total),
                "route_changes": m.get("route_changes").cloned().unwrap_or(json!(0.0)),
                "cost_micros": cost,
                "cost_per_successful_answer_micros": ratio(done_cost, done),
            })
        })
        .collect();
    let routes: Vec<Value> = by_route
        .into_iter()
        .map(|(name, r)| {
            let layered = |key: &str| r.get(key).cloned().unwrap_or_else(|| json!({}));
            let (from, to) = (layered("failovers_from"), layered("failovers_to"));
            let results = |v: &Value, result: Option<&str>| -> f64 {
                v.as_object().map_or(0.0, |layers| {
                    layers
                        .values()
                        .filter_map(Value::as_object)
                        .flat_map(|results| results.iter())
                        .filter(|(k, _)| result.is_none_or(|want| k.as_str() == want))
                        .filter_map(|(_, n)| n.as_f64())
                        .sum()
                })
            };
            let into = results(&to, None);
            let (answers, cost) = (layered("answers"), layered("cost_micros"));
            let completed = |v: &Value| v["completed"].as_f64().unwrap_or(0.0);
            json!({
                "route": name,
                "failovers_from": from,
                "failovers_from_total": results(&from, None),
                "failovers_to": to,
                "failovers_to_total": into,
                "failover_success": ratio(results(&to, Some("served")), into),
                "repairs": layered("repairs"),
                "answers": answers,
                "cost_micros": cost,
                "cost_per_successful_answer_micros": ratio(completed(&cost), completed(&answers)),
                "recovery": r.get("recovery").cloned().unwrap_or(json!({"count": 0.0, "mean_s": null})),
            })
        })
        .collect();
    let attempts = sums_and_counts(series, rt::ATTEMPTS_PER_REQUEST, "")
        .remove("")
        .unwrap_or_default();
    json!({
        "sample_every_s": SAMPLE_EVERY.as_secs(),
        "samples_kept": SAMPLES_KEPT,
        "logical_requests": totals.logical,
        "failovers": failovers,
        "failovers_total": totals.failovers,
        "failover_rate": ratio(totals.failovers, totals.logical),
        "failover_success": ratio(totals.failovers_served, totals.failovers),
        "attempts_per_request": {
            "requests": attempts.1,
            "attempts": attempts.0,
            "mean": ratio(attempts.0, attempts.1),
        },
        "unroutable": unroutable,
        "unroutable_total": totals.unroutable,
        "policy_rejections": rejections,
        "cost_per_successful_answer_micros": ratio(completed_cost, completed),
        "models": models,
        "routes": routes,
        "history": history,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP tailcut_failovers_total Moves
# TYPE tailcut_failovers_total counter
tailcut_failovers_total{from="a",to="b",layer="provider_switch",result="served"} 3
tailcut_failovers_total{from="a",to="c",layer="model_switch",result="failed"} 1
tailcut_logical_requests_total{model="chat",outcome="completed"} 8
tailcut_logical_requests_total{model="chat",outcome="unavailable"} 2
tailcut_unroutable_total{reason="all_failed"} 2
tailcut_answer_cost_micros_total{route="b",outcome="completed"} 400
tailcut_answers_total{route="b",outcome="completed"} 5
tailcut_answers_total{route="b",outcome="truncated"} 1
tailcut_model_answer_cost_micros_total{model="chat",outcome="completed"} 400
tailcut_attempts_per_request{quantile="0.5"} 1
tailcut_attempts_per_request_sum 14
tailcut_attempts_per_request_count 10
tailcut_recovery_seconds_bucket{route="a",le="+Inf"} 1
tailcut_recovery_seconds_sum{route="a"} 4.5
tailcut_recovery_seconds_count{route="a"} 1
tailcut_policy_rejections_total{reason="quality_floor"} 5
tailcut_requests_total{model="chat"} 10
tailcut_route_changes_total{model="odd \"quoted\\ name"} 1
"#;

    #[test]
    fn the_view_counts_per_model_and_per_route() {
        let series = parse(TEXT);
        let v = view(
            &series,
            &["chat".into()],
            &["a".into(), "b".into(), "c".into()],
            Vec::new(),
        );
        assert_eq!(v["logical_requests"], 10.0);
        assert_eq!(v["failovers_total"], 4.0);
        assert_eq!(v["failover_rate"], 0.4, "{v}");
        assert_eq!(v["failover_success"], 0.75);
        assert_eq!(v["failovers"]["provider_switch"]["served"], 3.0);
        assert_eq!(v["attempts_per_request"]["mean"], 1.4);
        assert_eq!(v["unroutable_total"], 2.0);
        assert_eq!(v["policy_rejections"]["quality_floor"], 5.0);
        assert_eq!(v["cost_per_successful_answer_micros"], 50.0, "400 over 8 answers");
        let chat = &v["models"][0];
        assert_eq!(chat["requests"]["completed"], 8.0);
        assert_eq!(chat["success_rate"], 0.8);
        assert_eq!(chat["cost_per_successful_answer_micros"], 50.0, "400 over 8: {chat}");
        let a = &v["routes"][0];
        assert_eq!(a["failovers_from_total"], 4.0, "{a}");
        assert_eq!(a["recovery"]["mean_s"], 4.5);
        let b = &v["routes"][1];
        assert_eq!(b["failovers_to"]["provider_switch"]["served"], 3.0);
        assert_eq!(b["failover_success"], 1.0);
        assert_eq!(b["answers"]["truncated"], 1.0);
        assert_eq!(b["cost_per_successful_answer_micros"], 80.0, "400 over b's 5: {b}");
        assert_eq!(a["cost_per_successful_answer_micros"], Value::Null, "a served nothing");
        assert_eq!(v["routes"][2]["failover_success"], 0.0, "c took one move and failed it");
    }

    #[tokio::test(start_paused = true)]
    async fn the_ring_keeps_one_sample_per_interval_for_an_hour() {
        let history = RotationHistory::default();
        let t0 = Instant::now();
        let at = |n: f64| Totals {
            logical: n * 10.0,
            failovers: n,
            failovers_served: n,
            unroutable: n / 2.0,
        };
        assert!(history.record(at(0.0), t0));
        assert!(
            !history.record(at(1.0), t0 + Duration::from_secs(3)),
            "a second sample within the interval is not kept"
        );
        for i in 1..=400u32 {
            assert!(history.record(at(f64::from(i)), t0 + SAMPLE_EVERY * i));
        }
        assert_eq!(history.len(), SAMPLES_KEPT, "bounded to an hour of samples");
        let now = t0 + SAMPLE_EVERY * 400 + Duration::from_secs(4);
        let points = history.points(at(401.0), now);
        assert_eq!(
            points.len(),
            SAMPLES_KEPT,
            "one point between each two samples, and the live one"
        );
        let last = &points[points.len() - 1];
        assert_eq!(last["age_s"], 0);
        assert_eq!(last["logical"], 10.0);
        assert_eq!(last["failover_rate"], 0.1);
        assert_eq!(last["unroutable"], 0.5);
        assert_eq!(points[0]["age_s"], 3584, "the oldest interval ended about an hour ago");
    }

    #[test]
    fn a_counter_that_went_down_counts_from_zero() {
        let history = RotationHistory::default();
        let t0 = Instant::now();
        let many = Totals {
            logical: 50.0,
            ..Totals::default()
        };
        history.record(many, t0);
        let few = Totals {
            logical: 3.0,
            ..Totals::default()
        };
        let points = history.points(few, t0 + SAMPLE_EVERY);
        assert_eq!(points[0]["logical"], 3.0);
    }
}
