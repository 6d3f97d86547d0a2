//! Reliability disciplines end to end: the fleet-wide retry budget under a correlated outage,
//! route leases kept and revoked, the L3 answer cache, and AIMD admission shedding batch
//! traffic before interactive traffic.

mod support;

use futures::StreamExt;
use support::*;
use tailcut::sim::{Failure, Scenario};

const OK: &str = r#"
[sim.scenarios.ok]
text = "served"
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 1.0
[sim.scenarios.down]
failure = { status = 503 }
[sim.scenarios.long]
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 50.0
tokens = 400
"#;

#[tokio::test]
async fn correlated_outage_spends_at_most_the_retry_budget() {
    let extra = format!(
        "{OK}\n[limits]\nretry_budget_ratio = 0.2\nretry_budget_floor_per_sec = 0.0\nretry_budget_window_secs = 3600\nblast_radius = 100.0\n\
         [breaker]\nconsecutive_failures = 0\nmin_volume = 1000000\n"
    );
    let server = start(&config_toml(
        &[
            ("a", "openai", "down"),
            ("b", "openai", "down"),
            ("c", "openai", "down"),
        ],
        &extra,
    ))
    .await;
    let requests = 200;
    for _ in 0..requests {
        let reply = post_sse(&server.url(""), &chat_body(true), &[("x-tailcut-hedge", "off")]).await;
        assert_eq!(reply.status, 503, "every route is down: {}", reply.raw);
    }
    let attempts = server.sim.as_ref().expect("sim").log().len();
    let extra_attempts = attempts - requests;
    assert!(
        extra_attempts <= requests / 5 + 1,
        "retries capped at 20% of requests: {extra_attempts} extra"
    );
    assert!(
        extra_attempts >= requests / 5 - 2,
        "the budget was spent, not starved: {extra_attempts} extra"
    );
}

#[tokio::test]
async fn a_spent_retry_budget_still_lets_a_failover_reach_a_proven_healthy_route() {
    // The primary fails every request, its breaker never opens and ranking keeps it first
    // (no error weight: the probe's case, a flaky first rung); the backup is healthy. The
    // retry budget (20%, no floor) would let only one request in five fail over; once the
    // backup has served, it is proven healthy and every later failover reaches it.
    let extra = format!(
        "{OK}\n[limits]\nretry_budget_ratio = 0.2\nretry_budget_floor_per_sec = 0.0\nretry_budget_window_secs = 3600\n\
         blast_radius = 100.0\nblast_radius_floor_per_sec = 1000.0\n\
         [breaker]\nconsecutive_failures = 0\nmin_volume = 1000000\n[ranking]\nerror_weight = 0.0\n"
    );
    let server = start(&config_toml(&[("a", "openai", "down"), ("b", "openai", "ok")], &extra)).await;
    let requests = 100;
    let mut served = 0;
    for _ in 0..requests {
        let reply = post_sse(&server.url(""), &chat_body(true), &[("x-tailcut-hedge", "off")]).await;
        if reply.status == 200 {
            assert_eq!(reply.envelope()["route"], "b", "{}", reply.raw);
            served += 1;
        }
    }
    // The first four find the budget below one attempt and the backup not yet proven.
    assert!(
        served >= requests - 5,
        "only {served} of {requests} served by the healthy backup"
    );
}

#[tokio::test]
async fn lease_is_kept_across_a_session_and_revoked_when_the_breaker_opens() {
    let token_env = "TAILCUT_TEST_ADMIN_TOKEN_LEASES";
    std::env::set_var(token_env, "drill-secret");
    let extra = format!("{OK}\n[leases]\nenabled = true\n");
    let toml = config_toml(&[("a", "openai", "ok"), ("b", "openai", "ok")], &extra).replacen(
        "[server]\n",
        &format!("[server]\nadmin_token_env = \"{token_env}\"\n"),
        1,
    );
    let server = start(&toml).await;
    let session = [("x-tailcut-session", "user-42"), ("x-tailcut-hedge", "off")];
    let first = post_sse(&server.url(""), &chat_body(true), &session).await.envelope();
    let leased = first["route"].as_str().expect("route").to_string();
    assert_eq!(first["lease"]["state"], "new", "{first}");
    let second = post_sse(&server.url(""), &chat_body(true), &session).await.envelope();
    assert_eq!(
        second["route"],
        leased.as_str(),
        "the session keeps its route: {second}"
    );
    assert_eq!(second["lease"]["state"], "kept", "{second}");

    let drill = client()
        .post(server.url(&format!("/admin/routes/{leased}/drill")))
        .bearer_auth("drill-secret")
        .send()
        .await
        .expect("drill sent");
    assert_eq!(drill.status(), 200, "the drill opened the breaker");
    let third = post_sse(&server.url(""), &chat_body(true), &session).await.envelope();
    assert_ne!(
        third["route"],
        leased.as_str(),
        "an open breaker moves the session: {third}"
    );
    assert_eq!(third["lease"]["state"], "revoked", "{third}");
    assert_eq!(third["lease"]["reason"], "breaker_open", "{third}");
}

#[tokio::test]
async fn two_tenants_sessions_of_the_same_name_are_two_leases() {
    let extra = format!("{OK}\n[leases]\nenabled = true\n[tenants.t1]\n[tenants.t2]\n");
    let server = start(&config_toml(&[("a", "openai", "ok"), ("b", "openai", "ok")], &extra)).await;
    let as_tenant = |t: &'static str| {
        [
            ("x-tailcut-session", "user-1"),
            ("x-tailcut-tenant", t),
            ("x-tailcut-hedge", "off"),
        ]
    };
    let first = post_sse(&server.url(""), &chat_body(true), &as_tenant("t1"))
        .await
        .envelope();
    assert_eq!(first["lease"]["state"], "new", "{first}");
    let other = post_sse(&server.url(""), &chat_body(true), &as_tenant("t2"))
        .await
        .envelope();
    assert_eq!(
        other["lease"]["state"], "new",
        "another tenant's user-1 is not t1's: {other}"
    );
    let again = post_sse(&server.url(""), &chat_body(true), &as_tenant("t1"))
        .await
        .envelope();
    assert_eq!(again["lease"]["state"], "kept", "t1's own lease stands: {again}");
}

#[tokio::test]
async fn drill_needs_the_admin_token() {
    let server = start(&config_toml(&[("a", "openai", "ok")], OK)).await;
    let resp = client()
        .post(server.url("/admin/routes/a/drill"))
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 403, "admin writes are off without a configured token");
}

#[tokio::test]
async fn cached_answer_is_served_at_l3_when_no_route_can_generate() {
    let extra = format!("{OK}\n[cache]\nenabled = true\n");
    let server = start(&config_toml(&[("a", "openai", "ok")], &extra)).await;
    let fresh = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(fresh.text(), "served");
    assert_eq!(fresh.envelope()["level"], "L0");
    let sim = server.sim.as_ref().expect("sim");
    let broken = Scenario {
        failure: Failure {
            status: Some(503),
            ..Failure::default()
        },
        ..Scenario::default()
    };
    sim.register("ok", broken);
    let cached = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(cached.status, 200, "{}", cached.raw);
    assert_eq!(cached.text(), "served", "the cached complete answer");
    let env = cached.envelope();
    assert_eq!(env["level"], "L3", "{env}");
    assert_eq!(
        env["fell_back_from"][0]["status"], 503,
        "the failure that led here is still told: {env}"
    );
    assert_eq!(cached.headers["x-tailcut-level"], "L3");
}

#[tokio::test]
async fn saturated_route_sheds_batch_before_interactive() {
    let toml = config_toml(&[("a", "openai", "long")], OK).replace("name = \"a\"\n", "name = \"a\"\nconcurrency = 2\n");
    let server = start(&toml).await;
    // One long interactive stream holds one of the route's two slots.
    let held = post_chat(&server, &chat_body(true)).await;
    assert_eq!(held.status(), 200);
    let mut held = held.bytes_stream();
    held.next().await.expect("bytes").expect("ok");
    let batch = client()
        .post(server.url("/v1/chat/completions"))
        .header("x-tailcut-priority", "batch")
        .json(&chat_body(true))
        .send()
        .await
        .expect("sent");
    assert_eq!(
        batch.status(),
        503,
        "batch may use only part of the limit, and it is used"
    );
    assert!(batch.headers().contains_key("retry-after"), "shed with a Retry-After");
    let interactive = client()
        .post(server.url("/v1/chat/completions"))
        .header("x-tailcut-priority", "interactive")
        .json(&chat_body(true))
        .send()
        .await
        .expect("sent");
    assert_eq!(
        interactive.status(),
        200,
        "interactive traffic still gets the last slot"
    );
    drop(held);
}

#[tokio::test]
async fn shadow_share_proves_the_secondary_without_touching_the_client_stream() {
    let extra = format!(
        "{OK}\n[sim.scenarios.secondary]\ntext = \"shadow answer\"\nttft = {{ median_ms = 5.0, sigma = 0.0 }}\n[limits]\nshadow_share = 1.0\n"
    );
    let server = start(&config_toml(
        &[("a", "openai", "ok"), ("b", "openai", "secondary")],
        &extra,
    ))
    .await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.text(), "served", "the client sees only the primary's answer");
    assert_eq!(
        reply.envelope()["attempts"],
        1,
        "the shadow is not an attempt of the client's request"
    );
    let log = wait_for_log(&server, "shadow finished", |l| {
        l.iter().any(|r| r.scenario == "secondary" && r.end.is_some())
    })
    .await;
    let shadow = log.iter().find(|r| r.scenario == "secondary").expect("shadow request");
    assert_eq!(
        shadow.end,
        Some(tailcut::sim::SimEnd::Completed),
        "the shadow ran to completion"
    );
    let snap = server
        .state
        .gateway
        .health()
        .snapshot(tokio::time::Instant::now(), &server.state.config);
    let b = snap.iter().find(|r| r.name == "b").expect("route b");
    assert_eq!(b.ttft_samples, 1, "the secondary's health learned from the shadow");

    let server = start(&config_toml(
        &[("a", "openai", "ok"), ("b", "openai", "secondary")],
        &extra,
    ))
    .await;
    let _ = post_sse(&server.url(""), &chat_body(true), &[("x-tailcut-hedge", "off")]).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let log = server.sim.as_ref().expect("sim").log();
    assert!(
        log.iter().all(|r| r.scenario != "secondary"),
        "side-effecting requests are never shadowed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_first_token_past_the_latency_objective_shrinks_the_admission_limit() {
    let extra =
        format!("{OK}\n[sim.scenarios.sluggish]\ntext = \"late\"\nttft = {{ median_ms = 400.0, sigma = 0.0 }}\n");
    let toml = config_toml(&[("a", "openai", "sluggish")], &extra).replace(
        "name = \"a\"\n",
        "name = \"a\"\nconcurrency = 20\nlatency_slo_ms = 250\n",
    );
    let server = start(&toml).await;
    let limit = |server: &tailcut::server::Running| {
        let snap = server
            .state
            .gateway
            .health()
            .snapshot(tokio::time::Instant::now(), &server.state.config);
        snap[0].admission_limit
    };
    assert_eq!(limit(&server), 20.0);
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.text(), "late", "a slow answer is still served");
    assert!(
        limit(&server) < 12.0,
        "the breach halved the limit (one success adds back a little): {}",
        limit(&server)
    );
}
