//! End-to-end over loopback for the order of the edge's steps (`server::app`): the body
//! reader's refusals and the router's 404/405 sit inside CORS (an allowed page can read
//! them, as JSON), the origin guard answers before the body is read, and the two pages sit
//! outside the guard and CORS.

mod support;

use serde_json::Value;
use support::*;
use tailcut::server::Running;

const APP: &str = "https://app.example";
const EVIL: &str = "https://evil.example";

const QUICK: &str = r#"
[sim.scenarios.quick]
text = "Hello from the simulated upstream."
ttft = { median_ms = 5.0, sigma = 0.0 }
"#;

async fn start_cors() -> Running {
    let extra = format!("{QUICK}\n[server.cors]\nallowed_origins = [\"{APP}\"]\n");
    let toml =
        config_toml(&[("a", "openai", "quick")], &extra).replacen("[server]\n", "[server]\nmax_body_bytes = 1024\n", 1);
    start(&toml).await
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn an_allowed_pages_body_refusal_is_json_it_can_read() {
    let server = start_cors().await;
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .header("origin", APP)
        .header("content-type", "application/json")
        .header("x-request-id", "rid-413")
        .body("x".repeat(2048))
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 413, "over max_body_bytes");
    assert_eq!(
        header(&resp, "access-control-allow-origin"),
        Some(APP),
        "the refusal passed through CORS"
    );
    assert_eq!(header(&resp, "x-request-id"), Some("rid-413"), "the client's id");
    let json: Value = resp.json().await.expect("JSON");
    assert_eq!(json["error"]["code"], "request_too_large", "OpenAI shape: {json}");
}

#[tokio::test]
async fn an_allowed_pages_unknown_path_and_wrong_method_are_json_it_can_read() {
    let server = start_cors().await;
    let resp = client()
        .get(server.url("/v1/nope"))
        .header("origin", APP)
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 404, "unknown path");
    assert_eq!(header(&resp, "access-control-allow-origin"), Some(APP), "through CORS");
    assert!(resp.headers().contains_key("x-request-id"), "a fresh request id");
    let json: Value = resp.json().await.expect("JSON");
    assert_eq!(json["error"]["code"], "not_found", "{json}");

    let resp = client()
        .get(server.url("/v1/messages"))
        .header("origin", APP)
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 405, "GET on a POST route");
    assert_eq!(header(&resp, "access-control-allow-origin"), Some(APP), "through CORS");
    assert!(resp.headers().contains_key("allow"), "the allow header is kept");
    let json: Value = resp.json().await.expect("JSON");
    assert_eq!(json["type"], "error", "Anthropic shape: {json}");
}

#[tokio::test]
async fn a_foreign_origin_is_refused_before_its_oversized_body_is_judged() {
    let server = start_cors().await;
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .header("origin", EVIL)
        .body("x".repeat(2048))
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 403, "the guard answers first, not the body limit");
    assert!(
        header(&resp, "access-control-allow-origin").is_none(),
        "a guard refusal carries no allow header"
    );
    let json: Value = resp.json().await.expect("JSON");
    assert_eq!(json["error"]["code"], "origin_not_allowed", "{json}");
}

#[tokio::test]
async fn the_pages_are_outside_the_guard_and_cors_and_their_refusals_are_json() {
    let server = start_cors().await;
    for path in ["/", "/dashboard"] {
        let resp = client()
            .get(server.url(path))
            .header("origin", EVIL)
            .send()
            .await
            .expect("sent");
        assert_eq!(resp.status(), 200, "{path} is served whatever the Origin");
        assert!(
            !resp.headers().contains_key("vary"),
            "{path}: no CORS headers on a page"
        );
    }
    let resp = client().post(server.url("/")).send().await.expect("sent");
    assert_eq!(resp.status(), 405, "a page takes GET only");
    assert!(!resp.headers().contains_key("vary"), "no CORS on a page's refusal");
    let json: Value = resp.json().await.expect("JSON");
    assert_eq!(json["error"]["code"], "method_not_allowed", "{json}");

    let resp = client()
        .get(server.url("/dashboard/"))
        .header("origin", EVIL)
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 403, "a path that is not a page is guarded");
}
