//! The router decides *which* routes, in what order: a pure, synchronous function over a
//! snapshot of config and health. No `.await`, no timers: the mux owns those.

mod eligibility;
mod plan;

pub use eligibility::{check as check_eligibility, estimate_prompt_tokens};
pub use plan::{plan, Candidate, Exclusion, Plan, RouteError};
