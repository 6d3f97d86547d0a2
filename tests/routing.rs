//! Routing reliability end to end over the simulated upstream: error classes decide failover,
//! Retry-After cools a route, one deadline bounds everything, residency is never broken, and
//! a transient failure is retried on the same route before stepping down a rung.

mod support;

use std::time::Duration;

use support::*;
use tailcut::sim::SimRecord;
use tokio::time::Instant;

const SCENARIOS: &str = r#"
[sim.scenarios.ok]
text = "served"
ttft = { median_ms = 10.0, sigma = 0.0 }
inter_token_ms = 1.0
[sim.scenarios.bad-request]
failure = { status = 400, message = "messages: invalid role" }
[sim.scenarios.unauthorized]
failure = { status = 401, message = "invalid x-api-key" }
[sim.scenarios.limited-2s]
failure = { status = 429, retry_after_s = 2 }
[sim.scenarios.limited-once]
text = "served after the retry"
ttft = { median_ms = 10.0, sigma = 0.0 }
failure = { status = 429, retry_after_s = 1, fail_first_n = 1 }
[sim.scenarios.flaky-once]
text = "served after the retry"
ttft = { median_ms = 10.0, sigma = 0.0 }
failure = { status = 502, fail_first_n = 1 }
[sim.scenarios.slow-fail]
ttft = { median_ms = 4000.0, sigma = 0.0 }
failure = { drop_after_tokens = 0 }
"#;

fn count(log: &[SimRecord], scenario: &str) -> usize {
    log.iter().filter(|r| r.scenario == scenario).count()
}

fn sim_log(server: &tailcut::server::Running) -> Vec<SimRecord> {
    server.sim.as_ref().expect("sim").log()
}

#[tokio::test]
async fn bad_request_is_returned_and_never_fails_over() {
    let server = start(&config_toml(
        &[("a", "openai", "bad-request"), ("b", "openai", "ok")],
        SCENARIOS,
    ))
    .await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.status, 400, "{}", reply.raw);
    assert!(
        reply.raw.contains("invalid role"),
        "the upstream's message reaches the client: {}",
        reply.raw
    );
    assert_eq!(count(&sim_log(&server), "ok"), 0, "a 400 is never shopped around");
}

#[tokio::test]
async fn upstream_401_is_a_gateway_configuration_error_without_failover() {
    let server = start(&config_toml(
        &[("a", "openai", "unauthorized"), ("b", "openai", "ok")],
        SCENARIOS,
    ))
    .await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(
        reply.status, 502,
        "the client's credentials are fine; ours are not: {}",
        reply.raw
    );
    assert!(reply.raw.contains("configuration"), "{}", reply.raw);
    assert_eq!(count(&sim_log(&server), "ok"), 0, "a 401 is never shopped around");
}

#[tokio::test(start_paused = true)]
async fn retry_after_cools_the_route_for_that_long() {
    let server = start(&config_toml(
        &[("a", "openai", "limited-2s"), ("b", "openai", "ok")],
        SCENARIOS,
    ))
    .await;
    let t0 = Instant::now();
    let reply = post_sse(&server.url(""), &chat_body(true), &[("x-tailcut-hedge", "off")]).await;
    assert_eq!(reply.text(), "served", "another route serves");
    assert_eq!(count(&sim_log(&server), "limited-2s"), 1);
    // Within the 2 s: the cooling route is passed over.
    tokio::time::sleep_until(t0 + Duration::from_millis(1900)).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[("x-tailcut-hedge", "off")]).await;
    assert_eq!(reply.text(), "served");
    assert_eq!(
        count(&sim_log(&server), "limited-2s"),
        1,
        "not called again within its Retry-After"
    );
    // After it: tried again.
    tokio::time::sleep_until(t0 + Duration::from_millis(2100)).await;
    let _ = post_sse(&server.url(""), &chat_body(true), &[("x-tailcut-hedge", "off")]).await;
    assert_eq!(
        count(&sim_log(&server), "limited-2s"),
        2,
        "called again once the Retry-After passed"
    );
}

#[tokio::test(start_paused = true)]
async fn one_deadline_bounds_every_attempt() {
    let routes = [
        ("a", "openai", "slow-fail"),
        ("b", "openai", "slow-fail"),
        ("c", "openai", "slow-fail"),
    ];
    let server = start(&config_toml(&routes, SCENARIOS)).await;
    let t0 = Instant::now();
    let reply = post_sse(
        &server.url(""),
        &chat_body(true),
        &[("x-tailcut-deadline-ms", "5000"), ("x-tailcut-hedge", "off")],
    )
    .await;
    let took = t0.elapsed();
    assert_eq!(reply.status, 504, "{}", reply.raw);
    assert!(
        took <= Duration::from_millis(5050),
        "answered by the deadline, not after 3 x 4 s: {took:?}"
    );
    assert!(
        took >= Duration::from_millis(4990),
        "not before the deadline either: {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn transient_failure_is_retried_on_the_same_route_before_a_lower_rung() {
    let toml = config_toml(&[("a", "openai", "flaky-once"), ("b", "openai", "ok")], SCENARIOS)
        .replace("name = \"b\"\n", "name = \"b\"\nlevel = \"L2\"\n");
    let server = start(&toml).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[("x-tailcut-hedge", "off")]).await;
    assert_eq!(reply.text(), "served after the retry", "{}", reply.raw);
    let env = reply.envelope();
    assert_eq!(env["route"], "a");
    assert_eq!(env["level"], "L0", "{env}");
    assert_eq!(env["fell_back_from"][0]["status"], 502, "{env}");
    assert_eq!(count(&sim_log(&server), "ok"), 0, "the lower rung was not needed");

    // With Retry-After: the retry waits for it.
    let toml = config_toml(&[("a", "openai", "limited-once"), ("b", "openai", "ok")], SCENARIOS)
        .replace("name = \"b\"\n", "name = \"b\"\nlevel = \"L2\"\n");
    let server = start(&toml).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[("x-tailcut-hedge", "off")]).await;
    assert_eq!(reply.text(), "served after the retry");
    let log = sim_log(&server);
    let gap = log[1].accepted_at.saturating_duration_since(log[0].accepted_at);
    assert!(gap >= Duration::from_secs(1), "the retry honoured Retry-After: {gap:?}");
}

#[tokio::test]
async fn equal_rung_failure_moves_on_at_once() {
    let server = start(&config_toml(
        &[("a", "openai", "flaky-once"), ("b", "openai", "ok")],
        SCENARIOS,
    ))
    .await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[("x-tailcut-hedge", "off")]).await;
    assert_eq!(reply.text(), "served", "the same-rung route serves without a retry");
    assert_eq!(count(&sim_log(&server), "flaky-once"), 1);
}

#[tokio::test]
async fn residency_is_never_broken_even_when_every_eu_route_is_down() {
    let toml = config_toml(&[("eu-1", "openai", "limited-2s"), ("us-1", "openai", "ok")], SCENARIOS)
        .replace("name = \"us-1\"\nprovider = \"simulated\"\nwire = \"openai\"\nscenario = \"ok\"\nmodel = \"model-us-1\"\nregion = \"eu\"", "name = \"us-1\"\nprovider = \"simulated\"\nwire = \"openai\"\nscenario = \"ok\"\nmodel = \"model-us-1\"\nregion = \"us\"");
    let server = start(&toml).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[("x-tailcut-region", "eu")]).await;
    assert_eq!(reply.status, 429, "an honest failure, not the US route: {}", reply.raw);
    assert_eq!(
        count(&sim_log(&server), "ok"),
        0,
        "the US route never saw the EU-only request"
    );
    let body: serde_json::Value = serde_json::from_str(&reply.raw).expect("JSON error");
    assert_eq!(body["tailcut"]["level"], "L4", "the envelope says L4: {body}");
}

#[tokio::test]
async fn every_response_carries_level_route_and_failures() {
    let extra = format!("{SCENARIOS}\n[sim.scenarios.down]\nfailure = {{ status = 503 }}\n");
    let server = start(&config_toml(
        &[("a", "openai", "down"), ("b", "anthropic", "ok")],
        &extra,
    ))
    .await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.headers["x-tailcut-level"], "L0");
    assert_eq!(reply.headers["x-tailcut-route"], "b");
    let env = reply.envelope();
    for key in ["route", "level", "fell_back_from", "hedged", "attempts", "ttft_ms"] {
        assert!(env.get(key).is_some(), "envelope has {key}: {env}");
    }
}
