//! The mux decides *how* a planned request streams: attempts, the hedge timer, the race to
//! the first content token, the commit point, mid-stream policies and the tool-call
//! assembler. It owns every timer and every cancellation.
//!
//! Drop = cancel. `Mux::run` returns a stream that does all its work inside `poll_next`:
//! nothing is spawned. When the client goes away the transport drops the stream, which drops
//! every running attempt, which drops its upstream response body and closes that connection.
//! The same mechanism cancels a hedge loser the instant the winner's first token arrives.
//!
//! The commit point is the first content token (non-empty text, or the start of a tool
//! call), never response headers or a role-only chunk. Before it, failover is free and
//! invisible; `StreamEvent::Start` marks it; after it, `midstream` policies apply.

mod attempt;
pub mod budget;
pub mod cache;
mod error;
mod hedge;
mod midstream;
pub mod probe;
mod race;
mod run;
mod seam;
mod shadow;
pub mod tool_calls;
mod transcript;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::time::Instant;

pub use attempt::{Attempt, AttemptEvent, Role};
pub use error::MuxError;
pub use hedge::NoHedge;
pub use seam::{Seam, SeamOut, SeamVerdict};

use self::budget::{Budget, BudgetConfig};
use self::cache::AnswerCache;
use crate::config::Config;
use crate::health::lease::LeaseTable;
use crate::health::Health;
use crate::provider::SharedProvider;
use crate::telemetry::handles::Handles;
use crate::types::Plan;
use crate::types::RequestCtx;
use crate::types::{ChatRequest, EventStream};

/// Shared by every request: config, health, providers per route, the budgets, route leases
/// and the L3 answer cache.
pub struct Mux {
    pub config: Arc<Config>,
    pub health: Arc<Health>,
    providers: HashMap<String, SharedProvider>,
    /// Hedges as a share of requests.
    budget: Mutex<Budget>,
    /// Fleet-wide: every attempt beyond a request's first (failovers, recoveries, hedges).
    retry_budget: Mutex<Budget>,
    /// Per route: extra attempts it takes from failover, as a share of its first-choice load.
    blast: HashMap<String, Mutex<Budget>>,
    /// Session → route: recorded here at commit; the gateway copies a session's entry before
    /// planning and applies the plan's revocation after it (each one short lock).
    pub leases: Mutex<LeaseTable>,
    pub cache: Mutex<AnswerCache>,
    /// Slots for shadow requests in flight.
    shadows: Arc<tokio::sync::Semaphore>,
    /// The request path's metric handles but the routes' own (those are in `health`).
    pub metrics: Handles,
}

impl Mux {
    pub fn new(config: Arc<Config>, health: Arc<Health>, providers: HashMap<String, SharedProvider>) -> Self {
        let budget = Budget::new(BudgetConfig {
            ratio: config.hedge.budget_ratio,
            floor_per_sec: config.hedge.budget_floor_per_sec,
            window: config.hedge.budget_window,
        });
        let limits = &config.limits;
        let retry_budget = Budget::new(BudgetConfig {
            ratio: limits.retry_budget_ratio,
            floor_per_sec: limits.retry_budget_floor_per_sec,
            window: limits.retry_budget_window,
        });
        let blast = config
            .routes
            .iter()
            .map(|r| {
                let b = Budget::new(BudgetConfig {
                    ratio: limits.blast_radius,
                    floor_per_sec: limits.blast_radius_floor_per_sec,
                    window: limits.retry_budget_window,
                });
                (r.name.clone(), Mutex::new(b))
            })
            .collect();
        Mux {
            metrics: Handles::new(&config),
            shadows: Arc::new(tokio::sync::Semaphore::new(limits.shadow_max_in_flight)),
            leases: Mutex::new(LeaseTable::new(&config.leases)),
            cache: Mutex::new(AnswerCache::new(config.cache)),
            budget: Mutex::new(budget),
            retry_budget: Mutex::new(retry_budget),
            blast,
            config,
            health,
            providers,
        }
    }

    /// Records one logical request in the fleet-wide retry budget.
    fn retry_deposit(&self, now: Instant) {
        self.retry_budget.lock().on_request(now);
    }

    /// A first-choice attempt on `route`: the base its failover share is measured against.
    fn blast_deposit(&self, route: &str, now: Instant) {
        if let Some(b) = self.blast.get(route) {
            b.lock().on_request(now);
        }
    }

    pub fn provider(&self, route: &str) -> Option<SharedProvider> {
        self.providers.get(route).cloned()
    }

    /// Records one logical request in the hedge budget.
    fn budget_deposit(&self, now: Instant) {
        self.budget.lock().on_request(now);
    }

    /// Streams `req` along `plan`, its answers judged by `gates` (compiled once for the
    /// request, `Gates::compile`). The first event is `Start` (commit) or `Error`. The stream
    /// holds `guard` until it ends or is dropped (the gateway's open-stream count), so no
    /// wrapper stream is needed for it.
    pub fn run(
        self: &Arc<Self>,
        req: ChatRequest,
        ctx: RequestCtx,
        plan: Plan,
        gates: tool_calls::Gates,
        guard: impl Send + 'static,
    ) -> EventStream {
        run::stream(Arc::clone(self), Arc::new(req), ctx, plan, gates, guard)
    }
}
