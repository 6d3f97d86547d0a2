//! Rotation metrics: logical requests by outcome, failovers by layer and result, attempts
//! per request, session route changes, the honest outage count (unroutable requests),
//! recovery time after a breaker opened, answers and their cost (by route, by model), policy
//! rejections and repairs.
//! Labels are low-cardinality: route, family and model names come from config, outcomes
//! and reasons from fixed sets. [`describe`] registers every metric's help text; call it
//! once after the recorder is installed.

use super::handles::{ModelHandles, RouteHandles};
use crate::types::{ErrorClass, Exclusion};

/// Logical (client) requests by model and outcome (`completed`, `truncated`,
/// `served_from_cache`, `diverged`, or the error class).
pub const LOGICAL_REQUESTS_TOTAL: &str = "tailcut_logical_requests_total";
/// Moves from a failed route to another, by layer and by how the new attempt ended.
pub const FAILOVERS_TOTAL: &str = "tailcut_failovers_total";
/// Upstream attempts per logical request (retry amplification).
pub const ATTEMPTS_PER_REQUEST: &str = "tailcut_attempts_per_request";
/// A session served by a route other than its lease's (the flapping rate).
pub const ROUTE_CHANGES_TOTAL: &str = "tailcut_route_changes_total";
/// Requests no route served for reasons that are not the client's: the honest outage count.
pub const UNROUTABLE_TOTAL: &str = "tailcut_unroutable_total";
/// From a route's breaker opening (the earliest of one outage: a trip, a drill, a failed
/// probe) to the route's first success after the breaker closed.
pub const RECOVERY_SECONDS: &str = "tailcut_recovery_seconds";
/// Breaker openings by route and cause (`tripped`: the failure count or rate; `probe_failed`:
/// a half-open probe failed). Drills are counted by the drill itself.
pub const BREAKER_OPENED_TOTAL: &str = "tailcut_breaker_opened_total";
/// Cost of answers (`cost_per_1k` times the answer's tokens / 1000), in millionths of the
/// currency unit (a counter counts integers), by serving route and outcome.
pub const ANSWER_COST_TOTAL: &str = "tailcut_answer_cost_micros_total";
/// Answers by serving route and outcome (every request a route served, costed or not): the
/// denominator of a route's cost per successful answer.
pub const ANSWERS_TOTAL: &str = "tailcut_answers_total";
/// The cost of answers as [`ANSWER_COST_TOTAL`] counts it, by the requested model and outcome.
pub const MODEL_COST_TOTAL: &str = "tailcut_model_answer_cost_micros_total";
/// Routes excluded from a plan by policy, by reason (region, data_terms, quality_floor ...).
pub const POLICY_REJECTIONS_TOTAL: &str = "tailcut_policy_rejections_total";
/// Repair attempts by route and outcome (`repaired`, `failed`).
pub const REPAIRS_TOTAL: &str = "tailcut_repairs_total";

/// Registers the help text of every rotation metric (`# HELP` lines on `/metrics`).
pub fn describe() {
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_counter!(
        LOGICAL_REQUESTS_TOTAL,
        "Logical client requests by model and outcome (completed, truncated, served_from_cache, diverged, or the error class)"
    );
    describe_counter!(
        FAILOVERS_TOTAL,
        "Moves from a failed route to another (from, to), by layer (provider_switch within a family, model_switch across families) and result of the new attempt (served, failed, cancelled)"
    );
    describe_histogram!(
        ATTEMPTS_PER_REQUEST,
        Unit::Count,
        "Upstream attempts per logical request, hedges, retries and repairs included (retry amplification)"
    );
    describe_counter!(
        ROUTE_CHANGES_TOTAL,
        "Requests of a session served by a route other than the session's leased route (flapping)"
    );
    describe_counter!(
        UNROUTABLE_TOTAL,
        "Requests no route served, for reasons not the client's (no_eligible_route, none_reachable, all_failed): tailcut's honest outage count"
    );
    describe_histogram!(
        RECOVERY_SECONDS,
        Unit::Seconds,
        "Time from a route's breaker opening (a trip, a drill or a failed probe; the earliest of one outage) to the route's first success after it closed (a probe's or a request's)"
    );
    describe_counter!(
        BREAKER_OPENED_TOTAL,
        "Breaker openings by route and cause (tripped: consecutive failures or the error rate; probe_failed: a half-open probe failed)"
    );
    describe_counter!(
        ANSWER_COST_TOTAL,
        "Cost of answers (cost_per_1k x tokens / 1000) in millionths of the currency unit, by serving route and outcome"
    );
    describe_counter!(
        ANSWERS_TOTAL,
        "Answers a route served, by serving route and outcome (completed, truncated, served_from_cache, diverged, or the error class after the first token)"
    );
    describe_counter!(
        MODEL_COST_TOTAL,
        "Cost of answers (cost_per_1k x tokens / 1000) in millionths of the currency unit, by requested model and outcome"
    );
    describe_counter!(
        POLICY_REJECTIONS_TOTAL,
        "Routes excluded from a plan by policy, by reason (region, data_terms, pool, capability, max_output, context_length, quality_floor)"
    );
    describe_counter!(
        REPAIRS_TOTAL,
        "Repair attempts after an answer failed its quality gate, by route and outcome (repaired, failed)"
    );
}

/// `route` served a request for `model` that ended with `outcome` (a fixed set, see
/// `LOGICAL_REQUESTS_TOTAL`), costing `cost_micros` (0 when the route has no cost or the
/// answer no usage): one answer by route, and its cost by route and by model.
pub fn answered(model: &str, route: &str, outcome: &str, cost_micros: u64) {
    let outcome = outcome.to_string();
    metrics::counter!(ANSWERS_TOTAL, "route" => route.to_string(), "outcome" => outcome.clone()).increment(1);
    if cost_micros > 0 {
        metrics::counter!(ANSWER_COST_TOTAL, "route" => route.to_string(), "outcome" => outcome.clone())
            .increment(cost_micros);
        metrics::counter!(MODEL_COST_TOTAL, "model" => model.to_string(), "outcome" => outcome).increment(cost_micros);
    }
}

/// [`answered`] for a `completed` answer, through the model's and the route's handles.
pub fn completed(model: &ModelHandles, route: &RouteHandles, cost_micros: u64) {
    route.answers_completed().increment(1);
    if cost_micros > 0 {
        route.cost_completed().increment(cost_micros);
        model.cost_completed().increment(cost_micros);
    }
}

/// Counts a plan's exclusions, one per excluded route and reason.
pub fn policy_rejections(excluded: &[Exclusion]) {
    for e in excluded {
        for code in &e.codes {
            metrics::counter!(POLICY_REJECTIONS_TOTAL, "reason" => code.as_str()).increment(1);
        }
    }
}

/// A request the router could not plan at all: every route excluded.
pub fn none_eligible(excluded: &[Exclusion]) {
    policy_rejections(excluded);
    // A prompt too long for every route is the client's to shorten, not an outage.
    let clients = !excluded.is_empty()
        && excluded
            .iter()
            .all(|x| x.codes.contains(&crate::types::ExclusionCode::ContextLength));
    if !clients {
        metrics::counter!(UNROUTABLE_TOTAL, "reason" => "no_eligible_route").increment(1);
    }
}

/// Is a request that ended with error class `class` (its `as_str`) and no serving route an
/// outage of tailcut's, rather than the client's own doing or the model's answer?
pub fn is_outage(class: &str) -> bool {
    ![
        ErrorClass::BadRequest,
        ErrorClass::Refusal,
        ErrorClass::ContextLength,
        ErrorClass::Unauthenticated,
        ErrorClass::Forbidden,
    ]
    .iter()
    .any(|c| c.as_str() == class)
}

/// `route`'s breaker opened, for `cause` (`tripped` or `probe_failed`).
pub fn breaker_opened(route: &str, cause: &'static str) {
    metrics::counter!(BREAKER_OPENED_TOTAL, "route" => route.to_string(), "cause" => cause).increment(1);
}

/// `route` recovered: its breaker's earliest opening (a trip, a drill or a failed probe's
/// reopening) was `took` before its first success after closing (`Breaker::take_recovery`).
pub fn recovered(route: &str, took: std::time::Duration) {
    metrics::histogram!(RECOVERY_SECONDS, "route" => route.to_string()).record(took.as_secs_f64());
}
