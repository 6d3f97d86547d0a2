//! Hedging end to end on paused time: the simulated upstream's delays and tailcut's timers
//! share tokio's virtual clock, so "the hedge fired at p95" is checked to the millisecond.

mod support;

use std::time::Duration;

use support::*;
use tailcut::sim::{SimEnd, SimRecord};
use tokio::time::Instant;

const SCENARIOS: &str = r#"
[sim.scenarios.slow]
text = "slow primary answer"
ttft = { median_ms = 3000.0, sigma = 0.0 }
inter_token_ms = 5.0
[sim.scenarios.fast]
text = "fast hedge answer"
ttft = { median_ms = 10.0, sigma = 0.0 }
inter_token_ms = 5.0
[sim.scenarios.medium]
text = "medium answer"
ttft = { median_ms = 2000.0, sigma = 0.0 }
inter_token_ms = 5.0
[sim.scenarios.quick-primary]
text = "quick primary answer"
ttft = { median_ms = 100.0, sigma = 0.0 }
inter_token_ms = 5.0
[sim.scenarios.dies-early]
ttft = { median_ms = 500.0, sigma = 0.0 }
failure = { drop_after_tokens = 0 }
"#;

/// Fills route `name`'s TTFT window so its p95 is `p95`.
fn preload(server: &tailcut::server::Running, name: &str, p95: Duration) {
    let health = server.state.gateway.health();
    let now = Instant::now();
    for _ in 0..40 {
        health.record_ttft(name, now, p95);
    }
}

/// A server over `routes` whose route "a" has a live p95 TTFT of 300 ms.
async fn start_preloaded(routes: &[(&str, &str, &str)]) -> tailcut::server::Running {
    let server = start(&config_toml(routes, SCENARIOS)).await;
    preload(&server, "a", Duration::from_millis(300));
    server
}

fn by_scenario<'a>(log: &'a [SimRecord], scenario: &str) -> Vec<&'a SimRecord> {
    log.iter().filter(|r| r.scenario == scenario).collect()
}

fn ms_between(a: Instant, b: Instant) -> f64 {
    b.saturating_duration_since(a).as_secs_f64() * 1000.0
}

#[tokio::test(start_paused = true)]
async fn hedge_fires_after_p95_ttft() {
    let server = start_preloaded(&[("a", "openai", "slow"), ("b", "openai", "fast")]).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.text(), "fast hedge answer", "the hedge won");
    let log = server.sim.as_ref().expect("sim").log();
    let primary = by_scenario(&log, "slow")[0];
    let hedge = by_scenario(&log, "fast")[0];
    let fired = ms_between(primary.accepted_at, hedge.accepted_at);
    assert!(
        (299.0..=301.0).contains(&fired),
        "hedge sent {fired} ms after the primary, p95 is 300 ms"
    );
    let env = reply.envelope();
    assert_eq!(env["hedged"], true, "{env}");
    assert_eq!(env["hedge"]["fired_after_ms"], 300, "{env}");
    assert_eq!(env["hedge"]["winner"], "b", "{env}");
    assert_eq!(reply.headers["x-tailcut-hedged"], "true");
}

#[tokio::test(start_paused = true)]
async fn route_hedge_ceiling_overrides_the_global_one() {
    let toml = config_toml(&[("a", "openai", "slow"), ("b", "openai", "fast")], SCENARIOS)
        .replace("name = \"a\"\n", "name = \"a\"\nhedge_ceiling_ms = 200\n");
    let server = start(&toml).await;
    preload(&server, "a", Duration::from_millis(300));
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.text(), "fast hedge answer");
    let log = server.sim.as_ref().expect("sim").log();
    let fired = ms_between(
        by_scenario(&log, "slow")[0].accepted_at,
        by_scenario(&log, "fast")[0].accepted_at,
    );
    assert!(
        (199.0..=201.0).contains(&fired),
        "the route's 200 ms ceiling, not its 300 ms p95: {fired}"
    );
}

#[tokio::test(start_paused = true)]
async fn hedge_not_fired_when_primary_is_fast() {
    let server = start_preloaded(&[("a", "openai", "quick-primary"), ("b", "openai", "fast")]).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.text(), "quick primary answer");
    let log = server.sim.as_ref().expect("sim").log();
    assert!(
        by_scenario(&log, "fast").is_empty(),
        "no hedge for a primary faster than its p95: {log:?}"
    );
    assert_eq!(reply.envelope()["hedged"], false);
}

#[tokio::test(start_paused = true)]
async fn loser_connection_is_closed() {
    let server = start_preloaded(&[("a", "openai", "slow"), ("b", "openai", "fast")]).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.status, 200);
    let log = wait_for_log(&server, "loser closed", |l| {
        l.iter().any(|r| r.scenario == "slow" && r.end.is_some())
    })
    .await;
    let loser = by_scenario(&log, "slow")[0];
    let winner = by_scenario(&log, "fast")[0];
    assert_eq!(
        loser.end,
        Some(SimEnd::ClientClosed),
        "the loser's connection was closed by tailcut"
    );
    assert_eq!(loser.first_token_at, None, "the loser never produced a token");
    let first = winner.first_token_at.expect("winner's first token");
    let closed = loser.ended_at.expect("loser end time");
    let lag = ms_between(first, closed);
    assert!(lag <= 1.0, "loser closed {lag} ms after the winner's first token");
}

#[tokio::test(start_paused = true)]
async fn no_loser_event_reaches_the_sse_client() {
    let server = start_preloaded(&[("a", "openai", "slow"), ("b", "anthropic", "fast")]).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    let chunks = reply.chunks();
    let roles = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"].get("role").is_some())
        .count();
    assert_eq!(roles, 1, "one role chunk, the winner's: {}", reply.raw);
    assert!(
        chunks.iter().all(|c| c["model"] == "model-b"),
        "every chunk is the winner's: {}",
        reply.raw
    );
    assert_eq!(reply.text(), "fast hedge answer");
}

#[tokio::test(start_paused = true)]
async fn no_loser_event_reaches_the_ws_client() {
    use futures::SinkExt;
    let server = start_preloaded(&[("a", "openai", "slow"), ("b", "anthropic", "fast")]).await;
    let mut ws = ws_connect(&server, None).await.expect("websocket");
    ws.send(ws_chat("h1")).await.expect("sent");
    let mut messages = Vec::new();
    loop {
        let msg = ws_next(&mut ws).await;
        if msg["type"] == "accepted" {
            continue; // the request's registration, not an answer event
        }
        let done = matches!(msg["type"].as_str(), Some("done" | "error"));
        messages.push(msg);
        if done {
            break;
        }
    }
    let kinds: Vec<&str> = messages.iter().filter_map(|m| m["type"].as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "start").count(),
        1,
        "one start: {messages:?}"
    );
    assert_eq!(messages[0]["type"], "start", "start first: {messages:?}");
    assert_eq!(messages[0]["route"], "b", "the winner's start: {messages:?}");
    let text: String = messages
        .iter()
        .filter(|m| m["type"] == "delta")
        .filter_map(|m| m["text"].as_str())
        .collect();
    assert_eq!(text, "fast hedge answer", "only the winner's text: {messages:?}");
    let done = messages.last().expect("done");
    assert_eq!(done["envelope"]["hedged"], true, "{done}");
    assert_eq!(done["envelope"]["hedge"]["winner"], "b", "{done}");
}

#[tokio::test(start_paused = true)]
async fn side_effecting_requests_never_hedge() {
    let server = start_preloaded(&[("a", "openai", "slow"), ("b", "openai", "fast")]).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[("x-tailcut-hedge", "off")]).await;
    assert_eq!(reply.text(), "slow primary answer", "the primary served, however slow");
    let log = server.sim.as_ref().expect("sim").log();
    assert!(
        by_scenario(&log, "fast").is_empty(),
        "x-tailcut-hedge: off is never hedged"
    );

    let toml = config_toml(&[("a", "openai", "slow"), ("b", "openai", "fast")], SCENARIOS)
        .replace("name = \"a\"\n", "name = \"a\"\nside_effecting = true\n");
    let server = start(&toml).await;
    preload(&server, "a", Duration::from_millis(300));
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.text(), "slow primary answer");
    let log = server.sim.as_ref().expect("sim").log();
    assert!(
        by_scenario(&log, "fast").is_empty(),
        "a side-effecting route is never hedged"
    );
}

#[tokio::test(start_paused = true)]
async fn primary_failure_before_first_token_fails_over_at_once_while_the_hedge_runs() {
    let routes = [
        ("a", "openai", "dies-early"),
        ("b", "openai", "medium"),
        ("c", "openai", "fast"),
    ];
    let server = start(&config_toml(&routes, SCENARIOS)).await;
    preload(&server, "a", Duration::from_millis(300));
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.text(), "fast hedge answer", "the failover route served");
    let log = wait_for_log(&server, "hedge closed", |l| {
        l.iter().any(|r| r.scenario == "medium" && r.end.is_some())
    })
    .await;
    let primary = by_scenario(&log, "dies-early")[0];
    let hedge = by_scenario(&log, "medium")[0];
    let failover = by_scenario(&log, "fast")[0];
    let hedge_at = ms_between(primary.accepted_at, hedge.accepted_at);
    assert!((299.0..=301.0).contains(&hedge_at), "hedge at p95: {hedge_at}");
    let failover_at = ms_between(primary.accepted_at, failover.accepted_at);
    assert!(
        (499.0..=502.0).contains(&failover_at),
        "failover right when the primary died (500 ms): {failover_at}"
    );
    let hedge_end = ms_between(primary.accepted_at, hedge.ended_at.expect("hedge ended"));
    let failover_first = ms_between(primary.accepted_at, failover.first_token_at.expect("first token"));
    assert!(
        hedge_end >= failover_first,
        "the hedge kept running until the failover's first token"
    );
    assert_eq!(hedge.end, Some(SimEnd::ClientClosed));
    let env = reply.envelope();
    assert_eq!(env["fell_back_from"][0]["route"], "a", "{env}");
    assert_eq!(env["route"], "c", "{env}");
}

#[tokio::test(start_paused = true)]
async fn a_hedge_that_fails_while_its_primary_goes_on_is_no_route_change() {
    // The hedge to b fires at 300 ms and dies at 800 ms; a, running from the start, serves
    // at 2 s. The request never moved: b failed, and no route change names it.
    let server = start_preloaded(&[("a", "openai", "medium"), ("b", "openai", "dies-early")]).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.text(), "medium answer");
    let env = reply.envelope();
    assert_eq!(env["route"], "a", "{env}");
    assert_eq!(env["hedged"], true, "{env}");
    assert_eq!(env["fell_back_from"][0]["route"], "b", "{env}");
    let changes = env["route_changes"].as_array().map_or(0, Vec::len);
    assert_eq!(changes, 0, "no move from the failed hedge to the primary: {env}");
}

#[tokio::test(start_paused = true)]
async fn a_hedge_started_with_its_primary_that_wins_after_the_primary_failed_is_a_route_change() {
    // A zero hedge delay on paused time: a and its hedge b start at the same instant. a dies at
    // 500 ms, b serves at 2 s: the request moved from a to b (launch order decides, not time).
    let toml = config_toml(&[("a", "openai", "dies-early"), ("b", "openai", "medium")], SCENARIOS)
        + "[hedge]\nfloor_ms = 0\ndefault_delay_ms = 0\n";
    let server = start(&toml).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.text(), "medium answer");
    let env = reply.envelope();
    assert_eq!(env["route"], "b", "{env}");
    assert_eq!(env["route_changes"][0]["from"], "a", "{env}");
    assert_eq!(env["route_changes"][0]["to"], "b", "{env}");
}

#[tokio::test(start_paused = true)]
async fn budget_caps_hedges() {
    // Both routes slower than the ceiling: every request wants a hedge, whichever route the
    // ranking makes primary; only the budget says no.
    let extra = format!(
        "{SCENARIOS}\n[hedge]\nceiling_ms = 300\nbudget_ratio = 0.1\nbudget_floor_per_sec = 0.0\nbudget_window_secs = 3600\n"
    );
    let server = start(&config_toml(
        &[("a", "openai", "slow"), ("b", "openai", "medium")],
        &extra,
    ))
    .await;
    preload(&server, "a", Duration::from_millis(300));
    let base = server.url("");
    let total = 1000;
    for batch in 0..(total / 50) {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..50 {
            let base = base.clone();
            set.spawn(async move { post_sse(&base, &chat_body(true), &[]).await.status });
        }
        while let Some(status) = set.join_next().await {
            assert_eq!(status.expect("task"), 200, "batch {batch}");
        }
    }
    let log = server.sim.as_ref().expect("sim").log();
    // Ranking may move the primary to the faster route; every upstream request beyond one
    // per client request is a hedge (nothing fails here).
    let hedges = log.len() - total;
    let fired = server
        .state
        .gateway
        .health()
        .snapshot(Instant::now(), &server.state.config);
    let fired_by: u64 = fired.iter().map(|r| r.hedges_fired_by).sum();
    let fired: u64 = fired.iter().map(|r| r.hedges_fired).sum();
    assert_eq!(
        hedges as u64, fired,
        "extra upstream requests are exactly the hedges fired"
    );
    assert_eq!(fired_by, fired, "every hedge fired is counted on its primary's row too");
    assert!(hedges <= total / 10 + 1, "hedges capped at 10% of requests: {hedges}");
    assert!(hedges >= total / 10 - 5, "the budget was used, not starved: {hedges}");
}
