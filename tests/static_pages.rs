//! The embedded pages: `GET /` serves the playground and `GET /dashboard` the route dashboard,
//! as uncached HTML that talks to the server's own endpoints, with a token field whose value
//! stays in the page (sent as a bearer, or `?token=` on the WebSocket URL).

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

/// What both pages promise about the token field: a password input, sent as a bearer, and
/// never stored where it outlives the page or shows in a URL.
fn assert_token_stays_in_the_page(html: &str, page: &str) {
    assert!(
        html.contains(r#"type="password" id="token""#),
        "{page}: the token is typed into a password field"
    );
    assert!(
        html.contains(r#""Authorization", "Bearer " + "#),
        "{page}: the token is sent as Authorization: Bearer"
    );
    for store in [
        "localStorage",
        "sessionStorage",
        "document.cookie",
        "indexedDB",
        "history.pushState",
    ] {
        assert!(!html.contains(store), "{page}: the token is never kept in {store}");
    }
    assert!(
        !html.contains(r#"params.get("token")"#),
        "{page}: the token is never read from the page's URL"
    );
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
    assert_token_stays_in_the_page(&html, "playground");
    assert!(
        html.contains(r#"credential ? "?token=" + encodeURIComponent(credential) : """#),
        "browsers cannot set WebSocket headers: the token rides in the upgrade's query, and not at all when the field is empty"
    );
    assert!(
        html.contains(r#"authFetch("/v1/tokens""#),
        "a typed API key never rides in a URL: the page trades it for a browser token first"
    );
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
    assert_token_stays_in_the_page(&html, "dashboard");
    assert!(
        html.contains(r#"authFetch("/admin/routes""#) && html.contains(r#"authFetch("/metrics""#),
        "the admin token goes to /admin/* and /metrics"
    );
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no external resources: everything is inline"
    );
    let admin = client()
        .get(server.url("/admin/routes"))
        .send()
        .await
        .expect("request sent");
    assert_eq!(
        admin.status().as_u16(),
        200,
        "with no auth on loopback the dashboard needs no token"
    );
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
        "failures",
        "midstream_failures",
    ] {
        assert!(
            route.get(field).is_some(),
            "the dashboard reads {field}, so /admin/routes must carry it: {route}"
        );
        assert!(html.contains(field), "the dashboard shows {field}");
    }
    server.shutdown().await;
}
