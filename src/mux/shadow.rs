//! Shadow traffic: a configured share of committed requests is also run, in the background,
//! on the next route of the plan. The answer is drained and discarded; only the route's health
//! learns from it (TTFT, errors, breaker), so a fallback is proven before an incident needs it.
//!
//! Why a spawned task here, when nothing else on the stream path is spawned: a shadow is not
//! on the client's path at all. It never touches the client's stream, it is bounded (a
//! semaphore caps shadows in flight; none free means no shadow), it takes admission at batch
//! priority (shed first), it is never sent for side-effecting requests, and it ends by the
//! request's deadline.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::attempt::{Attempt, AttemptEvent, Role};
use super::tool_calls::Gates;
use super::Mux;
use crate::provider::UpstreamRequest;
use crate::telemetry as t;
use crate::types::{ChatRequest, Priority};

/// Starts a shadow of `req` on `route` when the share and the in-flight cap allow.
pub fn maybe_start(
    mux: &Arc<Mux>,
    shadows: &Arc<Semaphore>,
    req: &Arc<ChatRequest>,
    gates: &Gates,
    route: &str,
    deadline: Instant,
) {
    let share = mux.config.limits.shadow_share;
    if share <= 0.0 || rand::random::<f64>() >= share {
        return;
    }
    let Ok(slot) = Arc::clone(shadows).try_acquire_owned() else {
        metrics::counter!(t::SHADOW_TOTAL, "outcome" => "skipped_busy").increment(1);
        return;
    };
    let now = Instant::now();
    let (Some(provider), Some(cfg)) = (mux.provider(route), mux.config.route(route)) else {
        return;
    };
    let Ok(permit) = mux.health.acquire(route, now, Priority::Batch) else {
        metrics::counter!(t::SHADOW_TOTAL, "outcome" => "skipped_unavailable").increment(1);
        return;
    };
    let upstream = UpstreamRequest {
        chat: Arc::clone(req),
        prefill: None,
        request_id: format!("shadow-{}", uuid::Uuid::new_v4().simple()),
    };
    let mut attempt = Attempt::start(
        Arc::from(route),
        Arc::from(cfg.model.as_str()),
        Role::Hedge,
        provider,
        upstream,
        gates,
        Some(permit),
    );
    let health = Arc::clone(&mux.health);
    tokio::spawn(async move {
        let _slot = slot;
        let outcome = tokio::time::timeout_at(deadline, async {
            let mut first = true;
            while let Some(ev) = attempt.next_event().await {
                match ev {
                    AttemptEvent::Text(_) | AttemptEvent::ToolStarted if first => {
                        first = false;
                        let now = Instant::now();
                        health.record_ttft(&attempt.route, now, now.saturating_duration_since(attempt.started));
                    }
                    AttemptEvent::Finished(_) => {
                        attempt.resolve(Ok(()));
                        return "completed";
                    }
                    AttemptEvent::Failed(e) => {
                        attempt.resolve(Err(&e));
                        return "failed";
                    }
                    _ => {}
                }
            }
            "ended"
        })
        .await
        .unwrap_or("deadline");
        metrics::counter!(t::SHADOW_TOTAL, "outcome" => outcome).increment(1);
    });
}
