//! End-to-end over loopback for `[server.cors]`: preflights from allowed and foreign origins,
//! the allow headers on actual answers, refusals of foreign browser requests (simple
//! `text/plain` and form POSTs, Origin-less cross-site GETs) before the upstream sees them,
//! clients without an Origin, the playground's own loopback origin, and DNS rebinding (a
//! WebSocket upgrade and a same-origin GET under a rebound name).

mod support;

use std::time::Duration;

use serde_json::Value;
use support::*;
use tailcut::server::Running;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const APP: &str = "https://app.example";
const EVIL: &str = "https://evil.example";

const QUICK: &str = r#"
[sim.scenarios.quick]
text = "Hello from the simulated upstream."
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 1.0
"#;

async fn start_cors() -> Running {
    let extra = format!("{QUICK}\n[server.cors]\nallowed_origins = [\"{APP}\"]\n");
    start(&config_toml(&[("a", "openai", "quick")], &extra)).await
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Proves refused requests never reached the upstream: a control request sent after them
/// is the only one the simulated upstream ever saw.
async fn only_the_control_request_reached_the_upstream(server: &Running) {
    let control = post_chat(server, &chat_body(false)).await;
    assert_eq!(control.status(), 200, "the control request (no Origin) is served");
    let log = wait_for_log(server, "the control request", |log| !log.is_empty()).await;
    assert_eq!(log.len(), 1, "only the control request reached the upstream: {log:?}");
}

fn stream_query() -> String {
    let q = serde_json::to_string(&chat_body(true)).expect("JSON");
    let encoded: String = q
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("/v1/stream?q={encoded}")
}

async fn refused_json(resp: reqwest::Response, what: &str) -> Value {
    assert_eq!(resp.status(), 403, "{what} is refused with 403");
    assert!(
        resp.headers().get("access-control-allow-origin").is_none(),
        "{what}: a refusal carries no Access-Control-Allow-Origin"
    );
    resp.json()
        .await
        .unwrap_or_else(|e| panic!("{what}: the refusal is JSON ({e})"))
}

#[tokio::test]
async fn preflight_from_an_allowed_origin_is_answered_with_the_allow_headers() {
    let server = start_cors().await;
    let resp = client()
        .request(reqwest::Method::OPTIONS, server.url("/v1/messages"))
        .header("origin", APP)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "x-api-key,content-type,anthropic-version,anthropic-beta,x-tailcut-hedge,x-stainless-os",
        )
        .send()
        .await
        .expect("preflight sent");
    assert!(resp.status().is_success(), "preflight answered: {}", resp.status());
    assert_eq!(
        header(&resp, "access-control-allow-origin"),
        Some(APP),
        "the origin is echoed"
    );
    let methods = header(&resp, "access-control-allow-methods")
        .unwrap_or_default()
        .to_string();
    assert!(
        methods.contains("POST") && methods.contains("GET"),
        "methods: {methods}"
    );
    // A page stops a resumable stream with DELETE /v1/streams/{id}: its preflight passes.
    assert!(methods.contains("DELETE"), "methods: {methods}");
    let allowed = header(&resp, "access-control-allow-headers")
        .unwrap_or_default()
        .to_string();
    for name in [
        "authorization",
        "content-type",
        "x-api-key",
        "x-request-id",
        "anthropic-version",
        "anthropic-beta",
        "x-tailcut-hedge",
        "x-tailcut-deadline-ms",
        "x-stainless-os",
    ] {
        assert!(
            allowed.split(',').any(|h| h.trim() == name),
            "{name} allowed: {allowed}"
        );
    }
    assert!(
        header(&resp, "access-control-max-age").is_some(),
        "preflights may be cached"
    );
    let vary = header(&resp, "vary").unwrap_or_default().to_ascii_lowercase();
    assert!(vary.contains("origin"), "caches keep answers per origin: {vary}");
    assert!(
        server.sim.as_ref().expect("sim").log().is_empty(),
        "a preflight runs nothing"
    );
}

#[tokio::test]
async fn preflight_from_a_foreign_origin_is_refused_without_allow_headers() {
    let server = start_cors().await;
    let resp = client()
        .request(reqwest::Method::OPTIONS, server.url("/v1/chat/completions"))
        .header("origin", EVIL)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type")
        .send()
        .await
        .expect("preflight sent");
    for name in ["access-control-allow-methods", "access-control-allow-headers"] {
        assert!(resp.headers().get(name).is_none(), "no {name} for a foreign origin");
    }
    refused_json(resp, "a foreign preflight").await;
}

#[tokio::test]
async fn an_allowed_origins_answers_carry_allow_origin_and_expose_route_headers() {
    let server = start_cors().await;
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .header("origin", APP)
        .json(&chat_body(false))
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 200, "served");
    assert_eq!(
        header(&resp, "access-control-allow-origin"),
        Some(APP),
        "readable by the page"
    );
    let exposed = header(&resp, "access-control-expose-headers")
        .unwrap_or_default()
        .to_string();
    for name in ["x-tailcut-route", "x-tailcut-level", "x-tailcut-hedged", "x-request-id"] {
        assert!(
            exposed.split(',').any(|h| h.trim() == name),
            "{name} exposed: {exposed}"
        );
    }
    let mut bad = chat_body(false);
    bad["model"] = Value::from("no-such-model");
    let error = client()
        .post(server.url("/v1/chat/completions"))
        .header("origin", APP)
        .json(&bad)
        .send()
        .await
        .expect("sent");
    assert_eq!(error.status(), 404, "an unknown model is a 404");
    assert_eq!(
        header(&error, "access-control-allow-origin"),
        Some(APP),
        "errors are readable by the page too"
    );
}

#[tokio::test]
async fn a_cross_site_text_plain_post_is_refused_before_the_upstream() {
    let server = start_cors().await;
    let body = serde_json::to_string(&chat_body(false)).expect("JSON");
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .header("origin", EVIL)
        .header("content-type", "text/plain;charset=UTF-8")
        .body(body.clone())
        .send()
        .await
        .expect("sent");
    let json = refused_json(resp, "a text/plain chat completion").await;
    assert_eq!(
        json["error"]["code"], "origin_not_allowed",
        "OpenAI error shape: {json}"
    );
    let resp = client()
        .post(server.url("/v1/messages"))
        .header("origin", EVIL)
        .header("content-type", "text/plain")
        .body(body.clone())
        .send()
        .await
        .expect("sent");
    let json = refused_json(resp, "a text/plain message").await;
    assert_eq!(json["type"], "error", "Anthropic error shape: {json}");
    assert!(json["error"]["message"].is_string(), "Anthropic error shape: {json}");
    let resp = client()
        .post(server.url("/v1/stream"))
        .header("origin", EVIL)
        .header("content-type", "text/plain")
        .body(body)
        .send()
        .await
        .expect("sent");
    let json = refused_json(resp, "a text/plain native stream").await;
    assert_eq!(json["type"], "error", "native error message: {json}");
    only_the_control_request_reached_the_upstream(&server).await;
}

#[tokio::test]
async fn a_cross_site_form_post_is_refused_before_the_upstream() {
    let server = start_cors().await;
    let q = serde_json::to_string(&chat_body(false)).expect("JSON");
    for (origin, path) in [
        (EVIL, "/v1/chat/completions"),
        (EVIL, "/v1/stream"),
        ("null", "/v1/chat/completions"),
    ] {
        let resp = client()
            .post(server.url(path))
            .header("origin", origin)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("q={q}"))
            .send()
            .await
            .expect("sent");
        refused_json(resp, &format!("a form POST to {path} from {origin}")).await;
    }
    only_the_control_request_reached_the_upstream(&server).await;
}

#[tokio::test]
async fn a_cross_site_get_without_an_origin_is_refused_before_the_upstream() {
    let server = start_cors().await;
    // What an <img src> on another site sends: no Origin, but fetch metadata says cross-site.
    let resp = client()
        .get(server.url(&stream_query()))
        .header("sec-fetch-site", "cross-site")
        .header("sec-fetch-mode", "no-cors")
        .send()
        .await
        .expect("sent");
    let json = refused_json(resp, "a no-cors cross-site GET").await;
    assert_eq!(json["type"], "error", "native error message: {json}");
    only_the_control_request_reached_the_upstream(&server).await;
}

#[tokio::test]
async fn a_request_without_origin_works() {
    let server = start_cors().await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.status, 200, "SDKs and curl send no Origin");
    assert!(reply.done(), "the stream completes");
    assert!(
        reply.headers.get("access-control-allow-origin").is_none(),
        "no CORS headers without an Origin"
    );
    let resp = client().get(server.url(&stream_query())).send().await.expect("sent");
    assert_eq!(resp.status(), 200, "a GET stream without an Origin is served");
}

#[tokio::test]
async fn an_answer_without_origin_carries_the_same_vary_and_expose_headers_as_one_with_it() {
    let server = start_cors().await;
    let send = |origin: Option<&'static str>, model: &'static str| {
        let mut body = chat_body(false);
        body["model"] = Value::from(model);
        let mut request = client().post(server.url("/v1/chat/completions")).json(&body);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    for model in ["chat", "no-such-model"] {
        let with = send(Some(APP), model).await.expect("sent");
        let without = send(None, model).await.expect("sent");
        assert_eq!(with.status(), without.status(), "{model}");
        let all = |resp: &reqwest::Response, name: &str| {
            resp.headers()
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap_or_default().to_string())
                .collect::<Vec<_>>()
        };
        for name in ["vary", "access-control-expose-headers"] {
            assert!(!all(&with, name).is_empty(), "{model}: {name} on the CORS answer");
            assert_eq!(all(&with, name), all(&without, name), "{model}: {name}");
        }
        assert!(
            without.headers().get("access-control-allow-origin").is_none(),
            "{model}: no allow-origin without an Origin"
        );
    }
    let preflight = client()
        .request(reqwest::Method::OPTIONS, server.url("/v1/chat/completions"))
        .send()
        .await
        .expect("sent");
    assert!(
        preflight.headers().get("access-control-allow-methods").is_some(),
        "an OPTIONS without an Origin is still answered by the CORS layer"
    );
}

#[tokio::test]
async fn the_playgrounds_own_loopback_origin_works() {
    let server = start_cors().await;
    let port = server.addr.port();
    let page = client().get(server.url("/")).send().await.expect("sent");
    assert_eq!(page.status(), 200, "the playground page loads");
    for origin in [format!("http://127.0.0.1:{port}"), format!("http://localhost:{port}")] {
        let resp = client()
            .post(server.url("/v1/chat/completions"))
            .header("origin", &origin)
            .header("sec-fetch-site", "same-origin")
            .json(&chat_body(false))
            .send()
            .await
            .expect("sent");
        assert_eq!(resp.status(), 200, "the page's POST from {origin} is served");
    }
    let models = client()
        .get(server.url("/v1/models"))
        .header("sec-fetch-site", "same-origin")
        .send()
        .await
        .expect("sent");
    assert_eq!(models.status(), 200, "the page's same-origin GET (no Origin) is served");
    let own = format!("http://127.0.0.1:{port}");
    assert!(
        ws_connect(&server, Some(&own)).await.is_ok(),
        "the playground's WebSocket opens"
    );
}

/// The status line of a hand-written WebSocket upgrade: tungstenite would send the real Host.
async fn raw_upgrade_status(server: &Running, host: &str, origin: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.expect("connect");
    let request = format!(
        "GET /v1/ws HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\nConnection: Upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    tcp.write_all(request.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
        .await
        .expect("no hang")
        .expect("read");
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_websocket_through_a_rebound_name_is_refused() {
    let server = start_cors().await;
    let port = server.addr.port();
    // evil.example resolves to 127.0.0.1: Host and Origin agree, and neither is ours.
    let rebound = raw_upgrade_status(
        &server,
        &format!("evil.example:{port}"),
        &format!("http://evil.example:{port}"),
    )
    .await;
    assert!(rebound.contains(" 403"), "the rebound upgrade is refused: {rebound}");
    let own = raw_upgrade_status(
        &server,
        &format!("127.0.0.1:{port}"),
        &format!("http://127.0.0.1:{port}"),
    )
    .await;
    assert!(
        own.contains(" 101"),
        "the same upgrade from the server's own origin opens: {own}"
    );
    let foreign = ws_connect(&server, Some(EVIL)).await;
    assert!(
        foreign.as_ref().is_err_and(|e| e.contains("403")),
        "a foreign origin's upgrade is refused: {:?}",
        foreign.err()
    );
    let listed = ws_connect(&server, Some(APP)).await;
    assert!(listed.is_ok(), "a listed origin's upgrade opens: {:?}", listed.err());
}

#[tokio::test]
async fn a_same_origin_get_through_a_rebound_name_is_refused_before_the_upstream() {
    let server = start_cors().await;
    let port = server.addr.port();
    // The browser sees evil.example:PORT as the page's own origin, so its GET has no Origin.
    let resp = client()
        .get(server.url(&stream_query()))
        .header("host", format!("evil.example:{port}"))
        .header("sec-fetch-site", "same-origin")
        .send()
        .await
        .expect("sent");
    let json = refused_json(resp, "a rebound same-origin GET").await;
    assert_eq!(json["type"], "error", "native error message: {json}");
    only_the_control_request_reached_the_upstream(&server).await;
}

/// An `Origin` sent twice is a 400 in each dialect, before the upstream, even when its first
/// value is an allowed origin (it was: only the first was checked).
#[tokio::test]
async fn an_origin_sent_twice_is_a_400_before_the_upstream_in_each_dialect() {
    let server = start_cors().await;
    let body = serde_json::to_string(&chat_body(false)).expect("JSON");
    for (path, second) in [
        ("/v1/chat/completions", EVIL),
        ("/v1/chat/completions", APP),
        ("/v1/messages", EVIL),
        ("/v1/stream", EVIL),
    ] {
        let resp = client()
            .post(server.url(path))
            .header("origin", APP)
            .header("origin", second)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .expect("sent");
        assert_eq!(resp.status(), 400, "{path}, then {second}");
        let json: Value = serde_json::from_str(&resp.text().await.unwrap_or_default()).unwrap_or(Value::Null);
        let message = match path {
            "/v1/stream" => {
                assert_eq!(json["class"], "bad_request", "native shape: {json}");
                &json["message"]
            }
            "/v1/messages" => {
                assert_eq!(
                    json["error"]["type"], "invalid_request_error",
                    "Anthropic shape: {json}"
                );
                &json["error"]["message"]
            }
            _ => {
                assert_eq!(json["error"]["param"], "origin", "OpenAI shape: {json}");
                &json["error"]["message"]
            }
        };
        assert!(
            message.as_str().is_some_and(|m| m.contains("only once")),
            "{path}: says why: {json}"
        );
    }
    only_the_control_request_reached_the_upstream(&server).await;
}
