//! Operations endpoints: liveness, readiness, Prometheus metrics, and the admin view of routes
//! (live TTFT percentiles and their CCDF, breakers, admission, hedge counters) with the breaker
//! drill.
//!
//! Who may call them: `/healthz` and `/readyz` are always public. The drill always needs the
//! admin token. With `[auth]`, every `/admin` route needs it too (reads included), and so does
//! `/metrics` unless `server.metrics_public = true`; without `[auth]` (loopback only) reads
//! stay open.
//!
//! `/admin/routes` remembers, per configured route, the last TTFT figures a read saw, so the
//! dashboard keeps showing them (marked stale, with their age) after the live window empties;
//! and the drills running, so `/admin/routes` says how long a drill (one opening of its
//! breaker, `?ms=` long) has left.
//!
//! `/admin/rotation` (in [`rotation`]) reads the rotation metrics per model and per route,
//! with an hour of samples for the dashboard's plots.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::transport::error::ErrorReply;
use crate::transport::{auth, openai, AppState};
use crate::types::{Dialect, ErrorClass};

mod exposition;
mod memory;
mod rotation;

pub use memory::OpsMemory;
use rotation::{admin_rotation, sample_rotation, RotationHistory};

pub fn routes() -> Router<AppState> {
    let history = Arc::new(RotationHistory::default());
    sample_rotation(&history);
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/admin/routes", get(admin_routes))
        .route("/admin/routes/{name}/drill", post(drill))
        .route("/admin/rotation", get(admin_rotation))
        .layer(Extension(Arc::new(OpsMemory::default())))
        .layer(Extension(history))
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.drain.is_draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response();
    }
    // Redis down never makes the instance unready: it serves with local state, and says so.
    // The answer never waits on Redis (a hung one would hold every load balancer's check for
    // its op_timeout): it reports the last outcome and refreshes it in the background. It
    // names no host: this endpoint is public.
    match &state.shared {
        Some(shared) => {
            shared.check_in_background();
            if shared.is_up() {
                "ready".into_response()
            } else {
                "ready; redis unreachable: serving with local state".into_response()
            }
        }
        None => "ready".into_response(),
    }
}

async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let private = state.access.is_on() && !state.config.server.metrics_public;
    if let Some(refused) = admin_gate(&state, &headers, private, "metrics") {
        return refused;
    }
    match &state.metrics {
        Some(handle) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle.render()).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "metrics recorder not installed").into_response(),
    }
}

async fn admin_routes(
    State(state): State<AppState>,
    Extension(memory): Extension<Arc<OpsMemory>>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = admin_gate(&state, &headers, state.access.is_on(), "admin reads") {
        return refused;
    }
    let now = Instant::now();
    let health = state.gateway.health();
    let routes: Vec<Value> = health
        .snapshot(now, &state.config)
        .into_iter()
        .map(|snap| {
            let ccdf = ttft_ccdf(snap.ttft_samples, |q| {
                health.ttft_quantile(&snap.name, q, now).map(|d| d.as_secs_f64() * 1e3)
            });
            let seen = memory.remember(&snap, ccdf, now);
            let drill_left = memory.drill_left(&snap.name, now);
            let mut row = serde_json::to_value(&snap).unwrap_or_else(|_| json!({ "name": snap.name }));
            if let Value::Object(fields) = &mut row {
                fields.insert("admission_slots".into(), json!(admission_slots(snap.admission_limit)));
                fields.insert("drill_ms_left".into(), json!(drill_left.map(millis)));
                fields.insert("ttft_ccdf".into(), seen.ccdf_json(now));
                let stale = snap.ttft_samples == 0 && seen.has_percentiles();
                fields.insert("ttft_stale".into(), json!(stale));
                fields.insert(
                    "ttft_last_known".into(),
                    if stale { seen.percentiles_json(now) } else { Value::Null },
                );
            }
            row
        })
        .collect();
    Json(json!({ "routes": routes })).into_response()
}

/// The longest drill `?ms=` may ask for.
const MAX_DRILL_MS: u64 = 600_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DrillQuery {
    /// How long the breaker stays open; default one cool-down.
    ms: Option<u64>,
}

/// `POST /admin/routes/{name}/drill[?ms=N]`: opens the route's breaker on purpose, to prove
/// the fallbacks before an incident does. Without `ms` it stays open one cool-down (then
/// half-open, as after any opening); with `ms` (1..=600000) it stays open that long (at
/// least one cool-down), and refusals' retry hints say when it ends. A new drill on the route replaces a running one. The answer says how
/// long the breaker stays open. Needs `Authorization: Bearer <admin token>`.
async fn drill(
    State(state): State<AppState>,
    Extension(memory): Extension<Arc<OpsMemory>>,
    Path(name): Path<String>,
    query: Result<Query<DrillQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = admin_gate(&state, &headers, true, "admin writes") {
        return refused;
    }
    let requested = match query {
        Ok(Query(DrillQuery { ms: Some(ms) })) if (1..=MAX_DRILL_MS).contains(&ms) => Some(Duration::from_millis(ms)),
        Ok(Query(DrillQuery { ms: Some(_) })) => {
            let message = format!("drill: ms must be 1..={MAX_DRILL_MS} (milliseconds)");
            return ops_error(400, ErrorClass::BadRequest, "bad_request", message, &headers);
        }
        Ok(Query(DrillQuery { ms: None })) => None,
        Err(rejection) => {
            let message = format!("drill: {} (the only key is ms)", rejection.body_text());
            return ops_error(400, ErrorClass::BadRequest, "bad_request", message, &headers);
        }
    };
    let now = Instant::now();
    match memory.start_drill(state.gateway.health(), &name, requested, now) {
        Some(open_for) => {
            tracing::warn!(route = %name, open_ms = millis(open_for), "breaker opened by drill");
            Json(json!({
                "route": name,
                "breaker": "open",
                "reason": "drill",
                "duration_ms": millis(open_for),
            }))
            .into_response()
        }
        None => ops_error(
            404,
            ErrorClass::NotFound,
            "route_not_found",
            format!("no route named {name:?}"),
            &headers,
        ),
    }
}

/// An operations endpoint's refusal, in OpenAI's error shape like the API's own (`message`,
/// `type`, `code`), with the caller's `x-request-id` or a fresh one.
fn ops_error(status: u16, class: ErrorClass, code: &'static str, message: String, headers: &HeaderMap) -> Response {
    let reply = ErrorReply {
        status,
        class,
        code: Some(code),
        ..ErrorReply::bad_request(message)
    };
    openai::error_response(&reply, &crate::server::request_id(headers, Dialect::OpenAi))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The concurrency the AIMD limit admits now (admission uses the floor of its fractional
/// limit, and always at least one).
fn admission_slots(limit: f64) -> u64 {
    if limit.is_finite() && limit >= 1.0 {
        // Saturating float-to-int cast of a finite value.
        limit.floor() as u64
    } else {
        1
    }
}

/// Tail probabilities the CCDF is sampled at, from the whole window down to one in a
/// thousand (log-spaced, so a log y axis shows them evenly).
const CCDF_TAIL: [f64; 19] = [
    1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.15, 0.1, 0.07, 0.05, 0.03, 0.02, 0.01, 0.005, 0.002, 0.001,
];

/// The TTFT CCDF of a window of `samples` first tokens, as `[ms, P(TTFT > ms)]` points read
/// off its quantiles (`quantile(q)` in ms, `None` while the window is too small): each tail
/// probability the window can resolve (at least one sample beyond it), then the slowest
/// sample at `1/samples`. Empty while `quantile` has no answer.
fn ttft_ccdf(samples: u64, quantile: impl Fn(f64) -> Option<f64>) -> Vec<[f64; 2]> {
    if samples == 0 {
        return Vec::new();
    }
    let n = samples as f64;
    let mut points = Vec::with_capacity(CCDF_TAIL.len() + 1);
    for p in CCDF_TAIL.iter().copied().filter(|p| p * n >= 1.0) {
        let Some(ms) = quantile(1.0 - p) else {
            return Vec::new();
        };
        points.push([ms, p]);
    }
    let floor = 1.0 / n;
    if points.last().is_some_and(|last| last[1] > floor) {
        if let Some(max) = quantile(1.0) {
            points.push([max, floor]);
        }
    }
    points
}

/// When `needed`, the request must carry `Authorization: Bearer <admin token>` (the value of
/// `server.admin_token_env`, compared in constant time). The refusal, if any: 403 when no
/// token is configured (`what` is off), 401 when it is missing or wrong.
fn admin_gate(state: &AppState, headers: &HeaderMap, needed: bool, what: &str) -> Option<Response> {
    if !needed {
        return None;
    }
    let Some(expected) = state
        .config
        .server
        .admin_token_env
        .as_deref()
        .and_then(|var| std::env::var(var).ok())
        .filter(|t| !t.is_empty())
    else {
        let hint = if what == "metrics" {
            " (or server.metrics_public = true)"
        } else {
            ""
        };
        let message = format!("{what} are off: set server.admin_token_env{hint}");
        return Some(ops_error(403, ErrorClass::Auth, "admin_off", message, headers));
    };
    match auth::admin_bearer(headers) {
        Some(given) if auth::same_secret(given, &expected) => None,
        _ => Some(ops_error(
            401,
            ErrorClass::Auth,
            "bad_admin_token",
            "bad or missing admin token (Authorization: Bearer <token>)".to_string(),
            headers,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::{Health, Unavailable};

    fn health() -> (Arc<Health>, String) {
        let cfg = crate::config::load_str(crate::config::DEFAULT_TOML).expect("default config");
        let name = cfg.routes[0].name.clone();
        (Arc::new(Health::new(&cfg, Instant::now())), name)
    }

    fn open_until(health: &Health, name: &str, now: Instant) -> Option<Instant> {
        match health.availability(name, now) {
            Err(Unavailable::BreakerOpen { until }) => Some(until),
            _ => None,
        }
    }

    #[test]
    fn ccdf_reads_the_tail_the_window_can_resolve() {
        // 1..=100 ms: P(TTFT > q-quantile) = 1 - q.
        let points = ttft_ccdf(100, |q| Some((q * 100.0).max(1.0)));
        let tails: Vec<f64> = points.iter().map(|p| p[1]).collect();
        assert_eq!(tails.first(), Some(&1.0), "starts with the whole window");
        assert_eq!(tails.last(), Some(&0.01), "ends at one sample in 100: {tails:?}");
        assert!(!tails.contains(&0.005), "no tail finer than one sample: {tails:?}");
        assert!(
            points.windows(2).all(|w| w[0][0] <= w[1][0] && w[0][1] > w[1][1]),
            "TTFT grows as the tail thins: {points:?}"
        );
        let slowest = ttft_ccdf(30, |q| Some(q * 30.0));
        assert_eq!(
            slowest.last(),
            Some(&[30.0, 1.0 / 30.0]),
            "the slowest sample closes the curve at 1/n"
        );
        assert!(ttft_ccdf(10, |_| None).is_empty(), "too few samples: no curve");
        assert!(ttft_ccdf(0, Some).is_empty(), "no samples: no curve");
    }

    #[test]
    fn admission_is_the_integer_number_of_slots() {
        assert_eq!(admission_slots(256.5), 256);
        assert_eq!(admission_slots(0.4), 1, "admission always lets one through");
        assert_eq!(admission_slots(f64::NAN), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn ttft_figures_outlive_the_window_marked_stale_with_their_age() {
        let (health, name) = health();
        let cfg = crate::config::load_str(crate::config::DEFAULT_TOML).expect("default config");
        let memory = OpsMemory::default();
        let t0 = Instant::now();
        for ms in 1..=40 {
            health.record_ttft(&name, t0, Duration::from_millis(ms * 10));
        }
        let read = |now: Instant| {
            let snap = health
                .snapshot(now, &cfg)
                .into_iter()
                .find(|s| s.name == name)
                .expect("the route's snapshot");
            let ccdf = ttft_ccdf(snap.ttft_samples, |q| {
                health.ttft_quantile(&name, q, now).map(|d| d.as_secs_f64() * 1e3)
            });
            (snap.ttft_samples, memory.remember(&snap, ccdf, now))
        };
        let (samples, fresh) = read(t0);
        assert_eq!(samples, 40);
        assert_eq!(fresh.ccdf_json(t0)["stale"], false);
        assert_eq!(fresh.percentiles_json(t0)["age_ms"], 0);

        let later = t0 + Duration::from_secs(125);
        let (samples, last) = read(later);
        assert_eq!(samples, 0, "the live window has emptied");
        let known = last.percentiles_json(later);
        assert_eq!(known["samples"], 40, "the last figures are kept: {known}");
        assert!(known["p95_ms"].as_f64().is_some_and(|p| p > 300.0), "{known}");
        assert_eq!(known["age_ms"], 125_000, "with their age");
        let ccdf = last.ccdf_json(later);
        assert_eq!(ccdf["stale"], true, "the curve too: {ccdf}");
        assert_eq!(ccdf["age_ms"], 125_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_drill_without_a_duration_lasts_one_cooldown() {
        let (health, name) = health();
        let memory = OpsMemory::default();
        let now = Instant::now();
        let cooldown = Duration::from_millis(1000);
        assert_eq!(memory.start_drill(&health, &name, None, now), Some(cooldown));
        assert_eq!(
            memory.drill_left(&name, now),
            Some(cooldown),
            "it says how long is left"
        );
        assert_eq!(memory.start_drill(&health, "nowhere", None, now), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_drill_with_a_duration_keeps_the_breaker_open_that_long() {
        let (health, name) = health();
        let memory = OpsMemory::default();
        let t0 = Instant::now();
        let open_for = memory.start_drill(&health, &name, Some(Duration::from_secs(10)), t0);
        assert_eq!(open_for, Some(Duration::from_secs(10)));
        for step in 1..=99 {
            tokio::time::advance(Duration::from_millis(100)).await;
            let now = Instant::now();
            assert_eq!(
                open_until(&health, &name, now),
                Some(t0 + Duration::from_secs(10)),
                "still open {step}00 ms into a 10 s drill, and a refusal says until its end"
            );
            assert_eq!(
                memory.drill_left(&name, now),
                Some(Duration::from_millis(10_000 - step * 100)),
                "time left at {step}00 ms"
            );
        }
        tokio::time::advance(Duration::from_millis(1600)).await;
        let now = Instant::now();
        assert_eq!(
            open_until(&health, &name, now),
            None,
            "the breaker cools once the drill ends"
        );
        assert_eq!(memory.drill_left(&name, now), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_drill_on_a_route_cooling_after_a_429_keeps_its_duration() {
        let (health, name) = health();
        let memory = OpsMemory::default();
        let t0 = Instant::now();
        let permit = health
            .acquire(&name, t0, crate::types::Priority::default())
            .expect("a closed route admits");
        permit.failure(
            t0,
            crate::provider::ErrorClass::RateLimited,
            Some(Duration::from_secs(5)),
            false,
        );
        let open_for = memory.start_drill(&health, &name, Some(Duration::from_secs(60)), t0);
        assert_eq!(
            open_for,
            Some(Duration::from_secs(60)),
            "the drill's own length, not the cooling's"
        );
        assert_eq!(
            memory.drill_left(&name, t0 + Duration::from_secs(30)),
            Some(Duration::from_secs(30))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_drill_replaces_the_running_one() {
        let (health, name) = health();
        let memory = OpsMemory::default();
        memory.start_drill(&health, &name, Some(Duration::from_secs(60)), Instant::now());
        memory.start_drill(&health, &name, Some(Duration::from_secs(3)), Instant::now());
        tokio::time::advance(Duration::from_millis(4600)).await;
        assert_eq!(
            open_until(&health, &name, Instant::now()),
            None,
            "the 60 s drill was stopped by the 3 s one"
        );
    }
}
