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
mod hedge;
mod midstream;
mod race;
mod run;
pub mod tool_calls;
mod transcript;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::time::Instant;

pub use attempt::{Attempt, AttemptEvent, Role};
pub use hedge::NoHedge;
pub use midstream::{Seam, SeamOut};

use self::budget::{Budget, BudgetConfig};
use crate::config::Config;
use crate::gateway::RequestCtx;
use crate::health::Health;
use crate::provider::SharedProvider;
use crate::router::Plan;
use crate::types::{ChatRequest, EventStream};

/// Shared by every request: config, health, providers per route, the hedge budget.
pub struct Mux {
    pub config: Arc<Config>,
    pub health: Arc<Health>,
    providers: HashMap<String, SharedProvider>,
    budget: Mutex<Budget>,
}

impl Mux {
    pub fn new(config: Arc<Config>, health: Arc<Health>, providers: HashMap<String, SharedProvider>) -> Self {
        let budget = Budget::new(BudgetConfig {
            ratio: config.hedge.budget_ratio,
            floor_per_sec: config.hedge.budget_floor_per_sec,
            window: config.hedge.budget_window,
        });
        Mux {
            config,
            health,
            providers,
            budget: Mutex::new(budget),
        }
    }

    pub fn provider(&self, route: &str) -> Option<SharedProvider> {
        self.providers.get(route).cloned()
    }

    /// Records one logical request in the hedge budget.
    fn budget_deposit(&self, now: Instant) {
        self.budget.lock().on_request(now);
    }

    /// Takes one hedge from the budget, if any is left.
    fn budget_withdraw(&self, now: Instant) -> bool {
        self.budget.lock().try_withdraw(now)
    }

    /// Streams `req` along `plan`. The first event is `Start` (commit) or `Error`.
    pub fn run(self: &Arc<Self>, req: ChatRequest, ctx: RequestCtx, plan: Plan) -> EventStream {
        run::stream(Arc::clone(self), Arc::new(req), ctx, plan)
    }
}
