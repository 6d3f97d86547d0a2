//! Provider rotation before model change, end to end over the simulated upstream: a model
//! lists families; with `provider-only-before-model-change` every route of the failing
//! route's family is tried before another family; the envelope says which layer moved; the
//! flat `routes = [...]` form keeps its ladder order. Then the rotation metrics, scraped
//! from `/metrics` after scripted failovers.

mod support;

use serde_json::{json, Value};
use support::*;

const SCENARIOS: &str = r#"
[sim.scenarios.ok]
text = "served"
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 1.0
[sim.scenarios.down]
failure = { status = 503 }
"#;

/// A route on the simulated upstream; `model` is its upstream model id.
fn route(name: &str, model: &str, scenario: &str, level: &str) -> String {
    format!(
        "[[routes]]\nname = \"{name}\"\nprovider = \"simulated\"\nwire = \"openai\"\nscenario = \"{scenario}\"\nmodel = \"{model}\"\nregion = \"eu\"\nlevel = \"{level}\"\n"
    )
}

fn server_toml(routes: &[String], model: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nsse_keepalive_ms = 600000\n[sim]\nlisten = \"127.0.0.1:0\"\n{SCENARIOS}{}{model}",
        routes.concat()
    )
}

/// `gpt-4o` on two providers (the second a rung lower) and `claude` on one, with the first
/// `gpt-4o` route down; `down_too` also takes the second `gpt-4o` route down.
fn fleet(prefix: &str, down_too: bool) -> Vec<String> {
    vec![
        route(&format!("{prefix}-openai"), "gpt-4o", "down", "L0"),
        route(&format!("{prefix}-claude"), "claude", "ok", "L0"),
        route(
            &format!("{prefix}-azure"),
            "gpt-4o",
            if down_too { "down" } else { "ok" },
            "L1",
        ),
    ]
}

fn families(prefix: &str, rotation: &str) -> String {
    format!(
        "[models.chat]\nfamilies = [{{ name = \"gpt-4o\", routes = [\"{prefix}-openai\", \"{prefix}-azure\"] }}, {{ name = \"claude\", routes = [\"{prefix}-claude\"] }}]\n{rotation}"
    )
}

fn changes(envelope: &Value) -> Vec<(String, String, String)> {
    envelope["route_changes"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|c| {
                    (
                        c["from"].as_str().unwrap_or_default().to_string(),
                        c["to"].as_str().unwrap_or_default().to_string(),
                        c["layer"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn change(from: &str, to: &str, layer: &str) -> (String, String, String) {
    (from.into(), to.into(), layer.into())
}

#[tokio::test]
async fn every_provider_of_the_family_is_tried_before_another_model() {
    let server = start(&server_toml(&fleet("p", false), &families("p", ""))).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    let env = reply.envelope();
    assert_eq!(
        env["route"], "p-azure",
        "the same model on another provider, though a rung lower than claude: {env}"
    );
    assert_eq!(env["family"], "gpt-4o");
    assert_eq!(
        changes(&env),
        [change("p-openai", "p-azure", "provider_switch")],
        "{env}"
    );
}

#[tokio::test]
async fn the_model_changes_only_when_its_family_is_exhausted() {
    let server = start(&server_toml(&fleet("x", true), &families("x", ""))).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    let env = reply.envelope();
    assert_eq!(env["route"], "x-claude", "{env}");
    assert_eq!(env["family"], "claude");
    assert_eq!(
        changes(&env),
        [
            change("x-openai", "x-azure", "provider_switch"),
            change("x-azure", "x-claude", "model_switch"),
        ],
        "one route change per move, each with its layer: {env}"
    );
}

#[tokio::test]
async fn the_ladder_rotation_follows_the_rungs_across_families() {
    let model = families("l", "rotation = \"ladder\"\n");
    let server = start(&server_toml(&fleet("l", false), &model)).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    let env = reply.envelope();
    assert_eq!(env["route"], "l-claude", "L0 before L1 whatever the family: {env}");
    assert_eq!(changes(&env), [change("l-openai", "l-claude", "model_switch")]);
}

#[tokio::test]
async fn the_flat_form_keeps_its_ladder_and_names_families_by_upstream_model() {
    let model = "[models.chat]\nroutes = [\"f-openai\", \"f-claude\", \"f-azure\"]\n";
    let server = start(&server_toml(&fleet("f", true), model)).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    let env = reply.envelope();
    assert_eq!(env["route"], "f-claude", "{env}");
    assert_eq!(
        env["family"], "claude",
        "the route's upstream model id names its family"
    );
    assert_eq!(changes(&env), [change("f-openai", "f-claude", "model_switch")]);

    // Same upstream model behind two routes of a flat list: a provider switch.
    let model = "[models.chat]\nroutes = [\"g-openai\", \"g-azure\", \"g-claude\"]\n";
    let server = start(&server_toml(&fleet("g", false), model)).await;
    let env = post_sse(&server.url(""), &chat_body(true), &[]).await.envelope();
    assert_eq!(env["route"], "g-claude", "the ladder: L0 claude before L1 azure: {env}");
    let model = "[models.chat]\nroutes = [\"h-openai\", \"h-azure\", \"h-claude\"]\nrotation = \"provider-only-before-model-change\"\n";
    let server = start(&server_toml(&fleet("h", false), model)).await;
    let env = post_sse(&server.url(""), &chat_body(true), &[]).await.envelope();
    assert_eq!(env["route"], "h-azure", "a flat list may opt into the rotation: {env}");
    assert_eq!(changes(&env), [change("h-openai", "h-azure", "provider_switch")]);
}

/// The value of the sample line `name{labels}` on a Prometheus page (labels in any order).
fn sample(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    page.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (head, value) = line.rsplit_once(' ')?;
        let (metric, rest) = head.split_once('{').unwrap_or((head, ""));
        if metric != name {
            return None;
        }
        labels
            .iter()
            .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
            .then(|| value.parse().ok())
            .flatten()
    })
}

async fn scrape(server: &tailcut::server::Running) -> String {
    client()
        .get(server.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body")
}

#[tokio::test]
async fn rotation_metrics_count_failovers_by_layer_outages_and_rejections() {
    let server = start(&server_toml(&fleet("m", true), &families("m", ""))).await;
    tailcut::telemetry::rotation::describe();
    // Two moves (provider, then model), served.
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    // No route in the region asked for: refused by policy before any attempt.
    let refused = post_sse(&server.url(""), &chat_body(true), &[("x-tailcut-region", "apac")]).await;
    assert_eq!(refused.status, 400, "{}", refused.raw);
    let page = scrape(&server).await;
    for help in [
        "tailcut_logical_requests_total",
        "tailcut_failovers_total",
        "tailcut_attempts_per_request",
        "tailcut_unroutable_total",
        "tailcut_policy_rejections_total",
    ] {
        assert!(
            page.contains(&format!("# HELP {help} ")),
            "{help} has help text:\n{page}"
        );
    }
    let moved = |from: &str, to: &str, layer: &str, result: &str| {
        sample(
            &page,
            "tailcut_failovers_total",
            &[("from", from), ("to", to), ("layer", layer), ("result", result)],
        )
    };
    assert_eq!(
        moved("m-openai", "m-azure", "provider_switch", "failed"),
        Some(1.0),
        "{page}"
    );
    assert_eq!(
        moved("m-azure", "m-claude", "model_switch", "served"),
        Some(1.0),
        "{page}"
    );
    assert!(
        sample(&page, "tailcut_policy_rejections_total", &[("reason", "region")]).is_some_and(|v| v >= 3.0),
        "each of the three routes was excluded for its region: {page}"
    );
    assert!(
        sample(&page, "tailcut_unroutable_total", &[("reason", "no_eligible_route")]).is_some_and(|v| v >= 1.0),
        "{page}"
    );
    assert!(
        sample(
            &page,
            "tailcut_logical_requests_total",
            &[("model", "chat"), ("outcome", "completed")]
        )
        .is_some_and(|v| v >= 1.0),
        "{page}"
    );
    assert!(
        page.contains("tailcut_attempts_per_request_count"),
        "the attempts histogram is rendered: {page}"
    );
}

#[tokio::test]
async fn a_request_every_route_failed_is_counted_as_an_outage() {
    let routes = vec![
        route("o-openai", "gpt-4o", "down", "L0"),
        route("o-azure", "gpt-4o", "down", "L0"),
    ];
    let model = "[models.chat]\nfamilies = [{ name = \"gpt-4o\", routes = [\"o-openai\", \"o-azure\"] }]\n";
    let server = start(&server_toml(&routes, model)).await;
    tailcut::telemetry::rotation::describe();
    let before = sample(
        &scrape(&server).await,
        "tailcut_unroutable_total",
        &[("reason", "all_failed")],
    )
    .unwrap_or(0.0);
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.status, 503, "{}", reply.raw);
    let page = scrape(&server).await;
    let after = sample(&page, "tailcut_unroutable_total", &[("reason", "all_failed")]).unwrap_or(0.0);
    assert!(
        after >= before + 1.0,
        "the honest outage count rose: {before} -> {after}\n{page}"
    );
    assert_eq!(
        sample(
            &page,
            "tailcut_failovers_total",
            &[
                ("from", "o-openai"),
                ("to", "o-azure"),
                ("layer", "provider_switch"),
                ("result", "failed")
            ]
        ),
        Some(1.0),
        "{page}"
    );
}

#[tokio::test]
async fn recovery_time_is_measured_from_the_breaker_opening_to_the_routes_next_answer() {
    let scenarios = "[sim.scenarios.flaky-2]\ntext = \"back\"\nttft = { median_ms = 5.0, sigma = 0.0 }\nfailure = { status = 503, fail_first_n = 2 }\n";
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nsse_keepalive_ms = 600000\n[sim]\nlisten = \"127.0.0.1:0\"\n{SCENARIOS}{scenarios}\
         [breaker]\nconsecutive_failures = 2\ncooldown_ms = 20\nmax_cooldown_ms = 40\n{}{}\
         [models.chat]\nfamilies = [{{ name = \"gpt-4o\", routes = [\"rc-a\", \"rc-b\"] }}]\n",
        route("rc-a", "gpt-4o", "flaky-2", "L0"),
        route("rc-b", "gpt-4o", "ok", "L0"),
    );
    let server = start(&toml).await;
    tailcut::telemetry::rotation::describe();
    for _ in 0..2 {
        let env = post_sse(&server.url(""), &chat_body(true), &[]).await.envelope();
        assert_eq!(env["route"], "rc-b", "rc-a fails its first two requests: {env}");
    }
    // The breaker opened on the second failure; the background probe closes it again.
    let mut served_by_a = false;
    for _ in 0..200 {
        let env = post_sse(&server.url(""), &chat_body(true), &[]).await.envelope();
        if env["route"] == "rc-a" {
            served_by_a = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(served_by_a, "rc-a recovered and served again");
    let page = scrape(&server).await;
    assert!(page.contains("# HELP tailcut_recovery_seconds "), "{page}");
    assert_eq!(
        sample(&page, "tailcut_recovery_seconds_count", &[("route", "rc-a")]),
        Some(1.0),
        "one recovery, measured once: {page}"
    );
    assert!(
        sample(&page, "tailcut_recovery_seconds_sum", &[("route", "rc-a")]).is_some_and(|s| s > 0.0),
        "{page}"
    );
    assert!(page.contains("# HELP tailcut_breaker_opened_total "), "{page}");
    assert_eq!(
        sample(
            &page,
            "tailcut_breaker_opened_total",
            &[("route", "rc-a"), ("cause", "tripped")]
        ),
        Some(1.0),
        "the opening is counted once, with its cause: {page}"
    );
}

#[tokio::test]
async fn a_session_moved_off_its_leased_route_is_a_route_change() {
    let scenarios = "[sim.scenarios.ok-then-down]\ntext = \"served\"\nttft = { median_ms = 5.0, sigma = 0.0 }\n";
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nsse_keepalive_ms = 600000\n[sim]\nlisten = \"127.0.0.1:0\"\n{SCENARIOS}{scenarios}{}{}\
         [models.session-model]\nroutes = [\"sc-a\", \"sc-b\"]\n",
        route("sc-a", "gpt-4o", "ok-then-down", "L0"),
        route("sc-b", "gpt-4o", "ok", "L0"),
    );
    let server = start(&toml).await;
    tailcut::telemetry::rotation::describe();
    let body = json!({"model": "session-model", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let session = [("x-tailcut-session", "s-1")];
    let first = post_sse(&server.url(""), &body, &session).await.envelope();
    assert_eq!(first["route"], "sc-a", "{first}");
    let count = |page: &str| sample(page, "tailcut_route_changes_total", &[("model", "session-model")]);
    assert_eq!(
        count(&scrape(&server).await),
        None,
        "the session's first route is no change"
    );
    // sc-a now fails: the session moves to sc-b.
    let sim = server.sim.as_ref().expect("sim");
    sim.register(
        "ok-then-down",
        serde_json::from_value(json!({"failure": {"status": 503}})).expect("scenario"),
    );
    let second = post_sse(&server.url(""), &body, &session).await.envelope();
    assert_eq!(second["route"], "sc-b", "{second}");
    assert_eq!(count(&scrape(&server).await), Some(1.0));
    let third = post_sse(&server.url(""), &body, &session).await.envelope();
    assert_eq!(third["route"], "sc-b", "the lease moved with it: {third}");
    assert_eq!(count(&scrape(&server).await), Some(1.0), "staying is no change");
}
