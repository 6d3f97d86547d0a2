//! The hedge: when the primary has no first content token by its route's live p95 TTFT, a
//! second attempt starts on the next *different* eligible route, if the hedge budget allows.
//!
//! Why this shape:
//! - The delay is per route and live (`Health::hedge_delay`: the rolling TTFT percentile,
//!   clamped to [floor, ceiling], a configured default until there are enough samples), so
//!   a route that is usually fast is hedged early and a slow-but-steady one is left alone.
//! - Only one hedge per request, and only before commit: after the first token the answer
//!   belongs to one route (mid-stream failures are the policies' business, not the hedge's).
//! - A budget (`budget::Budget`) caps hedges to a share of requests plus a small floor per
//!   second, so a correlated brownout of every route cannot double the load on all of them.
//! - Side-effecting requests are never hedged: two upstreams would both act.
//!
//! Known limits: the hedge delay is computed when the primary starts; a window that changes
//! during one request does not move its timer.

use std::time::Duration;

use tokio::time::Instant;

/// Why a request may not be hedged at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoHedge {
    Disabled,
    /// The client said `x-tailcut-hedge: off`: the request may have side effects.
    ClientOff,
    /// A route of the plan is `side_effecting`.
    SideEffecting,
    /// A route of the plan has `hedge = false` (no side effects implied).
    RouteOff,
    SingleRoute,
}

impl NoHedge {
    pub fn as_str(self) -> &'static str {
        match self {
            NoHedge::Disabled => "disabled",
            NoHedge::ClientOff => "client_off",
            NoHedge::SideEffecting => "side_effecting",
            NoHedge::RouteOff => "route_off",
            NoHedge::SingleRoute => "single_route",
        }
    }
}

/// The hedge timer of one request.
#[derive(Debug, Clone)]
pub struct HedgeTimer {
    /// When the hedge fires, if still armed.
    pub at: Option<Instant>,
    pub delay: Duration,
    /// The delay came from the live window (not the default).
    pub live: bool,
}

impl HedgeTimer {
    pub fn disarmed() -> Self {
        HedgeTimer {
            at: None,
            delay: Duration::ZERO,
            live: false,
        }
    }

    pub fn arm(start: Instant, delay: Duration, live: bool) -> Self {
        HedgeTimer {
            at: Some(start + delay),
            delay,
            live,
        }
    }

    pub fn disarm(&mut self) {
        self.at = None;
    }

    /// Sleeps until the hedge is due; pending forever when disarmed.
    pub async fn due(&self) {
        match self.at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}
