//! The router decides *which* routes, in what order: a pure, synchronous function over a
//! snapshot of config, health and the session's lease. No `.await`, no timers, no locks: the
//! caller takes the snapshot, the mux owns the rest.
//!
//! Before planning, outside any lock: `tokens` measures the prompt for the model's routes
//! ([`count_prompt`]); the gateway copies the routes' health (`Health::views`) and the
//! session's lease (`health::lease::LeaseTable::get`) into a [`Snapshot`].
//!
//! Planning ([`plan_over`]): `requirements` (what the request, its tenant and its model
//! demand) → `eligibility` (filter; every exclusion has reasons) → the lease decision
//! (`health::lease::decide`: kept, or revoked with a reason) → `ranking` (order, explained)
//! → `families` (the model's rotation: every route of a family before the next family) →
//! `plan`. The [`Plan`](crate::types::Plan) it returns is a shared noun in `types`; the
//! lease decision rides in it as data (`Plan::lease_update`), applied by the table's owners.

mod eligibility;
mod families;
mod fidelity;
mod plan;
mod ranking;
mod requirements;
#[cfg(test)]
mod testkit;
mod tokens;

pub use eligibility::{count_prompt, describe as describe_exclusions, Eligibility, Ineligible, DEFAULT_OUTPUT_RESERVE};
pub use fidelity::CrossWire;
pub use plan::{model_routes, plan, plan_over, plan_with, LeaseLookup, RouteError, Snapshot};
pub use ranking::{rank, Ranked};
pub use requirements::{apply_tenant, tenant_defaults, Requirements, DEFAULT_TASK};
pub use tokens::{warm_tokenizers, Counter, Method, PromptSize, PromptTokens, IMAGE_TOKENS};
