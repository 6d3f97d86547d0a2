//! The router decides *which* routes, in what order: a pure, synchronous function over a
//! snapshot of config and health. No `.await`, no timers: the mux owns those.
//!
//! Flow: `requirements` (what the request, its tenant and its model demand) → `eligibility`
//! (filter; every exclusion has reasons) → `lease` (the session's route, kept or revoked) →
//! `ranking` (order, explained) → `plan`. `tokens` sizes prompts for the context check.

mod eligibility;
pub mod lease;
mod plan;
mod ranking;
mod requirements;
#[cfg(test)]
mod testkit;
mod tokens;

pub use eligibility::{
    describe as describe_exclusions, Eligibility, ExclusionCode, Ineligible, DEFAULT_OUTPUT_RESERVE,
};
pub use lease::{envelope_lease, LeaseCandidate, LeaseTable};
pub use plan::{plan, plan_with, Candidate, CandidateScore, Exclusion, LeaseLookup, Plan, RouteError};
pub use ranking::{rank, Ranked, RouteStatus, ScoreBreakdown};
pub use requirements::{apply_tenant, tenant_defaults, Requirements, DEFAULT_TASK};
pub use tokens::{warm_tokenizers, Counter, Method, PromptSize, IMAGE_TOKENS};
