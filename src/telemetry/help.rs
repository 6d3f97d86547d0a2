//! The `# HELP` text of every metric, registered with the recorder when it is installed, so
//! `/metrics` says what each series counts, in which unit, and by which labels.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

use super::*;

/// Defined in their layers (`mux::probe`, `transport::auth`) and named here by value, so
/// telemetry imports nothing above it; tests/metrics_help.rs checks the rendered names.
const PROBES_TOTAL: &str = "tailcut_breaker_probes_total";
const AUTH_REFUSALS_TOTAL: &str = "tailcut_auth_refusals_total";
const REDIS_UP: &str = "tailcut_redis_up";
const REDIS_ERRORS_TOTAL: &str = "tailcut_redis_errors_total";
const HEALTH_HINTS_TOTAL: &str = "tailcut_health_hints_total";

/// Every metric tailcut records, with its description. A new metric is described here too.
pub(super) fn describe_all() {
    describe_counter!(REQUESTS_TOTAL, "Chat requests accepted by the gateway, by model.");
    describe_gauge!(
        REDIS_UP,
        "1 while the shared-state Redis answered its last operation, 0 while this instance serves with local state."
    );
    describe_counter!(
        REDIS_ERRORS_TOTAL,
        "Shared-state Redis operations that failed or timed out, by operation."
    );
    describe_counter!(
        HEALTH_HINTS_TOTAL,
        "Health hints shared through Redis, by direction (sent: a breaker opened or a 429 cool-down began here; received: a peer's, taken as advisory) and kind."
    );
    describe_gauge!(ACTIVE_STREAMS, "Client answer streams open right now.");
    describe_histogram!(
        TTFT_SECONDS,
        Unit::Seconds,
        "Time to the first content token of each successful attempt, by route."
    );
    describe_histogram!(
        CLIENT_TTFT_SECONDS,
        Unit::Seconds,
        "Time from the request to its first content token as the client saw it, hedges and failovers included."
    );
    describe_counter!(
        HEDGES_TOTAL,
        "Hedge decisions by result: fired, won or lost (whose first token came first), skipped."
    );
    describe_counter!(
        HEDGE_SKIPPED_TOTAL,
        "Hedges that were due but not sent, by reason (budget, side effects, no other route)."
    );
    describe_counter!(ATTEMPTS_TOTAL, "Upstream attempts started, by route and role.");
    describe_counter!(
        UPSTREAM_ERRORS_TOTAL,
        "Failed upstream attempts, by route and error class."
    );
    describe_counter!(
        CANCELLED_TOTAL,
        "Upstream attempts cancelled by tailcut, by reason (hedge_lost: the race's loser)."
    );
    describe_counter!(
        MIDSTREAM_TOTAL,
        "Answers that failed after their first token (then restarted, continued or truncated), by error class."
    );
    describe_counter!(
        AUTH_ERRORS_TOTAL,
        "Upstream rejections of tailcut's own credentials (401/403), by route: configuration to fix."
    );
    describe_counter!(
        BUDGET_DENIED_TOTAL,
        "Retries, hedges and failovers refused by a budget, by budget."
    );
    describe_counter!(
        SHADOW_TOTAL,
        "Shadow requests run on a plan's next route (answer discarded), by outcome."
    );
    describe_counter!(
        SEAMS_TOTAL,
        "Continuations judged at the seam, by verdict (continued, restart_matched, restart_diverged)."
    );
    describe_counter!(
        CONFIG_ERRORS_TOTAL,
        "Upstream faults that are tailcut's configuration (404 model or URL, quota), by route and class."
    );
    describe_counter!(
        PROBES_TOTAL,
        "Background breaker probes, by route and result (closed, failed)."
    );
    describe_counter!(
        AUTH_REFUSALS_TOTAL,
        "Client requests refused by [auth] (missing, bad or forbidden key, limits), by reason."
    );
}
