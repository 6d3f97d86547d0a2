//! Provider-neutral nouns every layer shares: what a client asked for and its context, the
//! plan, error classes, policies, prefill conventions, what the mux emits, the envelope, and
//! what a client's JSON Schema may cost.
//! This module imports no layer.

mod ctx;
mod envelope;
mod error_class;
mod event;
mod model_rules;
mod plan;
mod policy;
mod prefill;
mod request;
mod schema_budget;
mod state_hash;
mod thinking;
mod verbatim;

pub use ctx::{usable_request_id, Dialect, Priority, RequestCtx, MAX_CLIENT_REQUEST_ID};
pub use envelope::{
    AttemptUsage, Envelope, FailedAttempt, HedgeInfo, LeaseInfo, Level, RepairInfo, RouteChange, SwitchLayer,
};
pub use envelope::{HistoryInfo, TurnRange};
pub use error_class::{Blame, ErrorClass};
pub use event::{ErrorEvent, EventStream, FinishReason, StreamEvent, ToolCall, Usage};
pub use model_rules::{ModelRules, TokenParameter, REASONING_DROPS, REASONING_REFUSES};
pub use plan::{
    Candidate, CandidateScore, Exclusion, ExclusionCode, LeaseState, LeaseUpdate, Plan, RevokeReason, RouteStatus,
    ScoreBreakdown,
};
pub use policy::MidStreamPolicy;
pub use prefill::{Prefill, PrefillConvention};
pub use request::{
    ChatRequest, ContentPart, Message, ResponseFormat, ResponseType, Role, Sampling, ToolChoice, ToolSpec,
    ANTHROPIC_DEFAULT_MAX_TOKENS,
};
pub use schema_budget::{
    patterns_at, within_budget, OverBudget, SchemaBudget, MAX_SCHEMA_DEPTH, MAX_SCHEMA_KEYWORDS,
    MAX_SCHEMA_LITERAL_BYTES, MAX_SCHEMA_NODES, MAX_SCHEMA_PATTERNS, MAX_SCHEMA_REFS,
};
pub use state_hash::{canonical_history, state_hash};
pub use thinking::{Extra, ExtraField, Thinking};
pub use verbatim::{MessageJson, RawJson, Verbatim, Wire};
