//! What the dashboard reads from `/admin/routes` beyond the health snapshot (admission as
//! integer slots, the TTFT CCDF, stale markers), the drill's duration (`?ms=`, strict), and
//! `/admin/rotation`: the rotation metrics per model and per route, with their history.

mod support;

use serde_json::Value;
use support::*;

const QUICK: &str = r#"
[sim.scenarios.quick]
text = "Hello."
ttft = { median_ms = 5.0, sigma = 0.5 }
inter_token_ms = 1.0
"#;

async fn admin_routes(server: &tailcut::server::Running) -> Value {
    let resp = client()
        .get(server.url("/admin/routes"))
        .send()
        .await
        .expect("request sent");
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("admin view is JSON")
}

#[tokio::test]
async fn admin_routes_carries_the_ccdf_and_integer_admission() {
    let server = start(&config_toml(&[("a", "openai", "quick")], QUICK)).await;
    let before = admin_routes(&server).await;
    let route = &before["routes"][0];
    assert_eq!(
        route["ttft_ccdf"],
        Value::Null,
        "no curve before any first token: {route}"
    );
    assert_eq!(route["ttft_stale"], false);
    assert_eq!(route["ttft_last_known"], Value::Null);
    for _ in 0..25 {
        let resp = post_chat(&server, &chat_body(false)).await;
        assert_eq!(resp.status(), 200);
    }
    let after = admin_routes(&server).await;
    let route = &after["routes"][0];
    let slots = route["admission_slots"]
        .as_u64()
        .expect("admission_slots is an integer");
    let limit = route["admission_limit"].as_f64().expect("admission_limit");
    assert_eq!(slots, limit.floor() as u64, "slots are the floor of the limit: {route}");
    let ccdf = &route["ttft_ccdf"];
    assert_eq!(ccdf["stale"], false, "a curve from this read: {ccdf}");
    assert_eq!(ccdf["samples"], 25, "{ccdf}");
    let points = ccdf["points"].as_array().expect("points");
    assert!(points.len() >= 10, "the tail down to one sample in 25: {ccdf}");
    let tails: Vec<f64> = points.iter().filter_map(|p| p[1].as_f64()).collect();
    let times: Vec<f64> = points.iter().filter_map(|p| p[0].as_f64()).collect();
    assert_eq!(tails.first(), Some(&1.0), "{ccdf}");
    assert_eq!(
        tails.last(),
        Some(&(1.0 / 25.0)),
        "the slowest sample closes the curve: {ccdf}"
    );
    assert!(tails.windows(2).all(|w| w[0] > w[1]), "tail probabilities fall: {ccdf}");
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "TTFT grows along the tail: {ccdf}"
    );
    assert_eq!(route["drill_ms_left"], Value::Null, "no drill running");
    server.shutdown().await;
}

#[tokio::test]
async fn a_drill_takes_a_duration_and_says_how_long_it_lasts() {
    let token_env = "TAILCUT_TEST_ADMIN_TOKEN_ADMIN_VIEW";
    std::env::set_var(token_env, "drill-secret");
    let toml = config_toml(&[("a", "openai", "quick")], QUICK).replacen(
        "[server]\n",
        &format!("[server]\nadmin_token_env = \"{token_env}\"\n"),
        1,
    );
    let server = start(&toml).await;
    let drill = |query: &'static str| {
        client()
            .post(server.url(&format!("/admin/routes/a/drill{query}")))
            .bearer_auth("drill-secret")
            .send()
    };
    for (query, named) in [
        ("?ms=soon", "ms"),
        ("?ms=0", "ms"),
        ("?ms=600001", "ms"),
        ("?seconds=5", "seconds"),
    ] {
        let resp = drill(query).await.expect("drill sent");
        assert_eq!(resp.status(), 400, "{query} is refused");
        assert!(resp.headers().contains_key("x-request-id"), "{query}: no x-request-id");
        let body: Value = resp.json().await.expect("a JSON error");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(body["error"]["code"], "bad_request", "{body}");
        assert!(message.contains(named), "{query}: the error names {named}: {body}");
    }
    let resp = drill("?ms=60000").await.expect("drill sent");
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.expect("JSON");
    assert_eq!(body["duration_ms"], 60000, "the answer says how long: {body}");
    let route = &admin_routes(&server).await["routes"][0];
    assert_eq!(route["breaker"], "open", "{route}");
    let left = route["drill_ms_left"].as_u64().expect("the time left is shown");
    assert!(left > 0 && left <= 60000, "{route}");

    let resp = drill("").await.expect("drill sent");
    let body: Value = resp.json().await.expect("JSON");
    let one = body["duration_ms"].as_u64().expect("duration_ms");
    assert!(
        (1..=1000).contains(&one),
        "without ms a drill lasts one cool-down (1 s by default): {body}"
    );
    server.shutdown().await;
}

/// Two routes of one upstream model (so a move between them is a `provider_switch`), the
/// first down, under a model no other test of this binary uses (the recorder is global).
const ROTATION_FLEET: &str = r#"[server]
listen = "127.0.0.1:0"
sse_keepalive_ms = 600000
[sim]
listen = "127.0.0.1:0"
[sim.scenarios.quick]
text = "Hello."
ttft = { median_ms = 5.0, sigma = 0.5 }
inter_token_ms = 1.0
[sim.scenarios.down]
failure = { status = 503 }
[[routes]]
name = "rv-down"
provider = "simulated"
wire = "openai"
scenario = "down"
model = "shared-model"
region = "eu"
cost_per_1k = 1.0
[[routes]]
name = "rv-up"
provider = "simulated"
wire = "openai"
scenario = "quick"
model = "shared-model"
region = "eu"
cost_per_1k = 2.0
[models.rotview]
routes = ["rv-down", "rv-up"]
"#;

#[tokio::test]
async fn admin_rotation_counts_requests_and_failovers_per_model_and_route() {
    let server = start(ROTATION_FLEET).await;
    let get = || async {
        let resp = client()
            .get(server.url("/admin/rotation"))
            .send()
            .await
            .expect("request sent");
        assert_eq!(resp.status(), 200);
        resp.json::<Value>().await.expect("rotation view is JSON")
    };
    let before = get().await;
    let model = |v: &Value| {
        v["models"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["model"] == "rotview").cloned())
            .unwrap_or(Value::Null)
    };
    let route = |v: &Value, name: &str| {
        v["routes"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["route"] == name).cloned())
            .unwrap_or(Value::Null)
    };
    assert_eq!(
        model(&before)["requests_total"],
        0.0,
        "every configured model is listed, zeros included: {before}"
    );
    assert_eq!(route(&before, "rv-up")["failovers_to_total"], 0.0, "{before}");

    let mut moved = 0.0;
    for _ in 0..3 {
        let mut body = chat_body(true);
        body["model"] = "rotview".into();
        let reply = post_sse(&server.url(""), &body, &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.raw);
        let env = reply.envelope();
        assert_eq!(env["route"], "rv-up", "{env}");
        moved += env["route_changes"].as_array().map_or(0, Vec::len) as f64;
    }
    assert!(moved >= 1.0, "the first request at least moved off the down route");

    let after = get().await;
    let m = model(&after);
    assert_eq!(m["requests"]["completed"], 3.0, "{m}");
    assert_eq!(m["requests_total"], 3.0, "{m}");
    assert_eq!(m["success_rate"], 1.0, "{m}");
    let down = route(&after, "rv-down");
    assert_eq!(
        down["failovers_from"]["provider_switch"]["served"], moved,
        "one move per route change, by layer and result: {down}"
    );
    let up = route(&after, "rv-up");
    assert_eq!(up["failovers_to_total"], moved, "{up}");
    assert_eq!(up["failover_success"], 1.0, "every move to rv-up was served: {up}");
    assert!(
        up["cost_micros"]["completed"].as_f64().is_some_and(|c| c > 0.0),
        "rv-up's answers cost something: {up}"
    );
    assert_eq!(
        down["cost_micros"],
        serde_json::json!({}),
        "rv-down served nothing: {down}"
    );
    let history = after["history"].as_array().expect("history is a list");
    let last = history.last().expect("the live interval is always there");
    assert_eq!(last["age_s"], 0, "{last}");
    assert!(
        last["logical"].as_f64().is_some_and(|n| n >= 3.0),
        "the live interval holds this test's requests: {last}"
    );
    assert!(after["sample_every_s"].as_u64().is_some());
    server.shutdown().await;
}

#[tokio::test]
async fn the_dashboard_reads_every_rotation_figure_the_view_carries() {
    let server = start(&config_toml(&[("a", "openai", "quick")], QUICK)).await;
    let html = client()
        .get(server.url("/dashboard"))
        .send()
        .await
        .expect("request sent")
        .text()
        .await
        .expect("the page");
    assert!(
        html.contains("/admin/rotation"),
        "the dashboard polls the rotation view"
    );
    let view: Value = client()
        .get(server.url("/admin/rotation"))
        .send()
        .await
        .expect("request sent")
        .json()
        .await
        .expect("JSON");
    let fields = |v: &Value| -> Vec<String> { v.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default() };
    for field in fields(&view)
        .iter()
        .chain(fields(&view["models"][0]).iter())
        .chain(fields(&view["routes"][0]).iter())
        .chain(fields(&view["history"][0]).iter())
    {
        if field == "samples_kept" {
            continue;
        }
        assert!(html.contains(field.as_str()), "the dashboard shows {field}");
    }
    server.shutdown().await;
}

/// Two models over their own routes (names no other test uses: the recorder is global):
/// `costa` on a down route then a cheap one, `costb` on a route three times as dear.
const COST_FLEET: &str = r#"[server]
listen = "127.0.0.1:0"
sse_keepalive_ms = 600000
[sim]
listen = "127.0.0.1:0"
[sim.scenarios.quick]
text = "Hello."
ttft = { median_ms = 5.0, sigma = 0.5 }
inter_token_ms = 1.0
[sim.scenarios.down]
failure = { status = 503 }
[[routes]]
name = "cv-down"
provider = "simulated"
wire = "openai"
scenario = "down"
model = "cost-model"
region = "eu"
cost_per_1k = 5.0
[[routes]]
name = "cv-cheap"
provider = "simulated"
wire = "openai"
scenario = "quick"
model = "cost-model"
region = "eu"
cost_per_1k = 1.0
[[routes]]
name = "cv-dear"
provider = "simulated"
wire = "openai"
scenario = "quick"
model = "cost-model"
region = "eu"
cost_per_1k = 3.0
[models.costa]
routes = ["cv-down", "cv-cheap"]
[models.costb]
routes = ["cv-dear"]
"#;

#[tokio::test]
async fn admin_rotation_shows_cost_per_successful_answer_per_model_and_route() {
    let server = start(COST_FLEET).await;
    for model in ["costa", "costa", "costb", "costb"] {
        let mut body = chat_body(true);
        body["model"] = model.into();
        let reply = post_sse(&server.url(""), &body, &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.raw);
    }
    let view: Value = client()
        .get(server.url("/admin/rotation"))
        .send()
        .await
        .expect("request sent")
        .json()
        .await
        .expect("rotation view is JSON");
    let find = |list: &str, key: &str, name: &str| {
        view[list]
            .as_array()
            .and_then(|l| l.iter().find(|x| x[key] == name).cloned())
            .unwrap_or(Value::Null)
    };
    let (cheap, dear, down) = (
        find("routes", "route", "cv-cheap"),
        find("routes", "route", "cv-dear"),
        find("routes", "route", "cv-down"),
    );
    assert_eq!(cheap["answers"]["completed"], 2.0, "{cheap}");
    assert_eq!(dear["answers"]["completed"], 2.0, "{dear}");
    assert_eq!(
        down["answers"],
        serde_json::json!({}),
        "the down route answered nothing: {down}"
    );
    assert_eq!(down["cost_per_successful_answer_micros"], Value::Null, "{down}");
    let per = |v: &Value| v["cost_per_successful_answer_micros"].as_f64().unwrap_or(0.0);
    let cost = |v: &Value| v["cost_micros"]["completed"].as_f64().unwrap_or(0.0);
    assert!(per(&cheap) > 0.0, "{cheap}");
    assert_eq!(per(&cheap), cost(&cheap) / 2.0, "{cheap}");
    assert_eq!(
        per(&dear),
        3.0 * per(&cheap),
        "the same answers at three times the price: {dear}"
    );
    let (a, b) = (find("models", "model", "costa"), find("models", "model", "costb"));
    assert_eq!(per(&a), per(&cheap), "costa's answers all came from cv-cheap: {a}");
    assert_eq!(per(&b), per(&dear), "costb's from cv-dear: {b}");
    assert_eq!(cost(&a), cost(&cheap), "{a}");
    server.shutdown().await;
}
