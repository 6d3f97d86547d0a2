//! The background prober: finds out whether a route behind an open breaker recovered by
//! sending a request of its own, so no user request pays for a probe.
//!
//! # Why
//! With probes taken from user traffic, a route's recovery is only noticed when a user
//! request happens to be routed to it after its cool-down, and that user pays for the
//! probe if the route is still down. A route that recovered could sit unused for many
//! seconds. The prober probes each cooled route itself, with a minimal request: one user
//! message ("ping"), `max_tokens = 1`.
//!
//! # Triggers
//! One tokio task for the whole server. It wakes at the earliest moment a route's probe is
//! due (the end of its breaker's cool-down, or of a 429/quota cooling if that is later),
//! and at least every [`TICK`] to see breakers that opened since. Per route, one probe at
//! a time ([`Health::acquire_probe`] takes the breaker's single probe slot); its request id
//! starts with `probe_`, so upstream logs tell probes apart:
//! - a first content delta (text, a tool-call fragment) or a finish is proof of life: the
//!   breaker closes and the route is ranked again by its health;
//! - an error, a stream that ends without either, or no answer within the route's
//!   first-token timeout (at most [`MAX_PROBE_WAIT`]) is a failed probe: the breaker
//!   reopens with its cool-down doubled, up to `[breaker] max_cooldown_ms`, which is
//!   therefore the longest gap between two probes.
//!
//! While the prober runs (and `[breaker] probe = "background"`), a half-open route admits
//! no user request; the router ranks it last and [`Health::acquire`] refuses it.
//!
//! # Cancellation
//! Drop = cancel: dropping the [`Prober`] aborts the task, which drops every probe in
//! flight (closing its upstream connection and freeing its probe slot) and detaches the
//! prober from [`Health`], so half-open routes fall back to traffic probes rather than stay
//! shut. The server holds it for as long as it serves. Only `tokio::time` is used, so
//! paused-time tests drive it.
//!
//! # Known limits
//! - A probe proves a one-token answer; a route that fails only long answers (mid-stream)
//!   is closed, then reopened by the first real request that fails. That reopening is a
//!   relapse (the breaker's probation) and doubles the cool-down, so such a route costs one
//!   user request per probe and is out for up to `max_cooldown_ms` at a time, not
//!   re-admitted every base cool-down. (A probe that reads a whole answer as long as the
//!   route's cut ones is not built.)
//! - A probe's latency is not recorded in the route's TTFT window (its prompt is not
//!   representative), so a recovered route's hedge delay starts from its old samples.
//! - Probes are not counted against the hedge, retry or blast-radius budgets; they are one
//!   tiny request per route every `max_cooldown_ms` at most.
//!
//! [`Health`]: crate::health::Health
//! [`Health::acquire_probe`]: crate::health::Health::acquire_probe
//! [`Health::acquire`]: crate::health::Health::acquire

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Mux;
use crate::health::breaker::ProbeMode;
use crate::health::{ProberAttached, RoutePermit};
use crate::provider::{Delta, ProviderError, SharedProvider, UpstreamRequest};
use crate::types::{ChatRequest, ErrorClass, Message, Role};

/// Background probes by route and result (`closed`: the route is back; `failed`).
pub const PROBES_TOTAL: &str = "tailcut_breaker_probes_total";

/// The longest the prober sleeps before looking for breakers that opened since.
pub const TICK: Duration = Duration::from_millis(250);

/// The longest a probe waits for its first sign of life, whatever the route's
/// first-token timeout: a probe only has to prove one token.
pub const MAX_PROBE_WAIT: Duration = Duration::from_secs(10);

/// The running prober. Dropping it stops it.
pub struct Prober {
    task: JoinHandle<()>,
}

impl Prober {
    /// Starts the prober for `mux` when `[breaker] probe = "background"`; `None` with
    /// traffic probes. Must be called inside a tokio runtime.
    pub fn spawn(mux: Arc<Mux>) -> Option<Prober> {
        if mux.config.breaker.probe != ProbeMode::Background {
            return None;
        }
        metrics::describe_counter!(PROBES_TOTAL, "Background breaker probes by route and result");
        // Attached before the task first runs, so no user request slips into a half-open
        // route in between; the guard lives in the task and detaches when it is dropped.
        let attached = mux.health.attach_prober();
        Some(Prober {
            task: tokio::spawn(run(mux, attached)),
        })
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(mux: Arc<Mux>, _attached: ProberAttached) {
    let mut running = FuturesUnordered::new();
    let mut probing: HashSet<String> = HashSet::new();
    loop {
        let now = Instant::now();
        let mut wake = now + TICK;
        for route in &mux.config.routes {
            if probing.contains(&route.name) {
                continue;
            }
            let Some(due) = mux.health.probe_due(&route.name, now) else {
                continue;
            };
            if due > now {
                wake = wake.min(due);
                continue;
            }
            let Some(provider) = mux.provider(&route.name) else {
                continue;
            };
            let Some(permit) = mux.health.acquire_probe(&route.name, now) else {
                continue;
            };
            probing.insert(route.name.clone());
            let limit = route.first_token_timeout.min(MAX_PROBE_WAIT);
            running.push(probe(provider, permit, limit));
        }
        tokio::select! {
            Some(route) = running.next(), if !running.is_empty() => {
                probing.remove(&route);
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Sends one probe and reports it through `permit`; returns the route's name.
async fn probe(provider: SharedProvider, permit: RoutePermit, limit: Duration) -> String {
    let route = permit.route().to_string();
    let req = UpstreamRequest {
        chat: Arc::new(ChatRequest {
            model: "probe".into(),
            messages: vec![Message::text(Role::User, "ping")],
            max_tokens: Some(1),
            stream: true,
            ..ChatRequest::default()
        }),
        prefill: None,
        request_id: format!("probe_{}", uuid::Uuid::new_v4().simple()),
    };
    let outcome = match tokio::time::timeout(limit, first_sign(provider, req)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(ProviderError::new(
            ErrorClass::Timeout,
            format!("probe: no first token within {} ms", limit.as_millis()),
        )),
    };
    let now = Instant::now();
    match outcome {
        Ok(()) => {
            permit.success(now);
            metrics::counter!(PROBES_TOTAL, "route" => route.clone(), "result" => "closed").increment(1);
            tracing::info!(route = %route, "probe answered: breaker closed");
        }
        Err(err) => {
            permit.failure(now, err.class, err.retry_after, err.transport);
            metrics::counter!(PROBES_TOTAL, "route" => route.clone(), "result" => "failed").increment(1);
            if matches!(err.class, ErrorClass::Quota | ErrorClass::NotFound) {
                metrics::counter!(crate::telemetry::CONFIG_ERRORS_TOTAL, "route" => route.clone(), "class" => err.metric_label())
                    .increment(1);
                tracing::error!(route = %route, class = err.class.as_str(), "probe: the upstream refuses this route's configuration");
            } else {
                tracing::debug!(route = %route, class = err.class.as_str(), error = %err.message, "probe failed: breaker reopened");
            }
        }
    }
    route
}

/// Opens the stream and waits for a first content delta or a finish. Dropping the stream on
/// return closes the upstream connection.
async fn first_sign(provider: SharedProvider, req: UpstreamRequest) -> Result<(), ProviderError> {
    let mut stream = provider.open(req).await?;
    while let Some(item) = stream.next().await {
        match item? {
            Delta::Text(_) | Delta::Thinking(_) | Delta::ToolFragment(_) | Delta::Finish(_) => return Ok(()),
            Delta::ToolEnd { .. } | Delta::Usage(_) | Delta::Extra(_) => {}
        }
    }
    Err(ProviderError::new(
        ErrorClass::Protocol,
        "probe: upstream stream ended without a token or a finish",
    ))
}
