//! The embedded pages: `GET /` serves the playground and `GET /dashboard` the route dashboard,
//! as uncached HTML that talks to the server's own endpoints.

mod support;

use support::*;

const QUICK: &str = r#"
[sim.scenarios.quick]
text = "Hello."
ttft = { median_ms = 5.0, sigma = 0.0 }
"#;

/// Fetches `path` and checks what every embedded page shares: 200, HTML, `no-cache`.
async fn page(base: &str, path: &str) -> String {
    let resp = client()
        .get(format!("{base}{path}"))
        .send()
        .await
        .expect("request sent");
    assert_eq!(resp.status().as_u16(), 200, "GET {path} is served");
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(header("content-type"), "text/html; charset=utf-8", "GET {path} is HTML");
    assert_eq!(
        header("cache-control"),
        "no-cache",
        "GET {path} is revalidated so a new binary's page shows at once"
    );
    resp.text().await.expect("page body")
}

#[tokio::test]
async fn root_serves_the_playground_speaking_the_websocket_protocol() {
    let server = start(&config_toml(&[("a", "openai", "quick")], QUICK)).await;
    let html = page(&server.url(""), "/").await;
    assert!(
        html.contains("<title>tailcut playground</title>"),
        "the playground page"
    );
    assert!(html.contains("/v1/ws"), "the playground talks over the WebSocket");
    assert!(html.contains("/v1/models"), "the playground lists the models");
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no external resources: everything is inline"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn dashboard_serves_the_route_view_polling_admin_routes() {
    let server = start(&config_toml(&[("a", "openai", "quick")], QUICK)).await;
    let html = page(&server.url(""), "/dashboard").await;
    assert!(html.contains("<title>tailcut routes</title>"), "the dashboard page");
    assert!(html.contains("/admin/routes"), "the dashboard polls the admin view");
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no external resources: everything is inline"
    );
    let admin = client()
        .get(server.url("/admin/routes"))
        .send()
        .await
        .expect("request sent");
    let body: serde_json::Value = admin.json().await.expect("admin view is JSON");
    let route = &body["routes"][0];
    for field in [
        "ttft_p50_ms",
        "ttft_p95_ms",
        "ttft_p99_ms",
        "ttft_samples",
        "hedge_delay_ms",
        "breaker",
        "cooling_ms",
        "admission_limit",
        "in_flight",
        "error_rate",
        "hedges_fired",
        "hedges_won",
        "hedges_lost",
    ] {
        assert!(
            route.get(field).is_some(),
            "the dashboard reads {field}, so /admin/routes must carry it: {route}"
        );
        assert!(html.contains(field), "the dashboard shows {field}");
    }
    server.shutdown().await;
}
