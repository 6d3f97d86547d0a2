//! Who may use the edge, end to end over loopback: client keys (401 without, in every
//! dialect), the key's tenant (403 for any other, known or not), its models (403), its rpm,
//! tpm and stream limits (429 with Retry-After, rpm on paused time), browser tokens (mint,
//! bearer, `?token=` on EventSource GET and the WebSocket upgrade, expiry on paused time,
//! binding, no minting with a token), private ops, the non-loopback refusal, `keys new`,
//! and credentials that never reach a response, a log line or a metric.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::SinkExt;
use serde_json::{json, Value};
use sha2::Digest;
use support::*;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const KEY: &str = "tc_test-key-for-acme-0123456789abcdef";
const OTHER_KEY: &str = "tc_test-key-for-globex-0123456789abcdef";
const ADMIN_ENV: &str = "TAILCUT_TEST_AUTH_ADMIN_TOKEN";
const ADMIN_TOKEN: &str = "admin-token-for-the-auth-tests";
const SECRET_ENV: &str = "TAILCUT_TEST_AUTH_TOKEN_SECRET";
const TEXT: &str = "Hello from an authenticated route.";

fn hash(key: &str) -> String {
    hex::encode(sha2::Sha256::digest(key.as_bytes()))
}

/// Two routes; `b` alone has the data term tenant `acme` requires, so a request served as
/// `acme` always lands on `b` and any other on `a` first.
fn config(key_extra: &str, extra: &str) -> String {
    std::env::set_var(ADMIN_ENV, ADMIN_TOKEN);
    std::env::set_var(SECRET_ENV, "a-token-secret-of-at-least-32-bytes!");
    format!(
        r#"[server]
listen = "127.0.0.1:0"
sse_keepalive_ms = 600000
admin_token_env = "{ADMIN_ENV}"
[sim]
listen = "127.0.0.1:0"
[sim.scenarios.quick]
text = "{TEXT}"
ttft = {{ median_ms = 5.0, sigma = 0.0 }}
inter_token_ms = 1.0
[sim.scenarios.long]
ttft = {{ median_ms = 5.0, sigma = 0.0 }}
inter_token_ms = 20.0
tokens = 2000
[[routes]]
name = "a"
provider = "simulated"
scenario = "quick"
region = "eu"
[[routes]]
name = "b"
provider = "simulated"
scenario = "quick"
region = "eu"
data_terms = ["zdr"]
[[routes]]
name = "slow"
provider = "simulated"
scenario = "long"
region = "eu"
data_terms = ["zdr"]
[models.chat]
routes = ["a", "b"]
hedge = false
[models.other]
routes = ["a", "b"]
hedge = false
[models.long]
routes = ["slow"]
hedge = false
[tenants.acme]
data_terms = ["zdr"]
[tenants.globex]
[auth]
token_secret_env = "{SECRET_ENV}"
[[auth.keys]]
name = "acme-app"
sha256 = "{}"
tenant = "acme"
{key_extra}
[[auth.keys]]
name = "globex-app"
sha256 = "{}"
tenant = "globex"
{extra}"#,
        hash(KEY),
        hash(OTHER_KEY),
    )
}

fn openai_body(model: &str) -> Value {
    json!({"model": model, "stream": true, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]})
}

fn anthropic_body(model: &str) -> Value {
    json!({"model": model, "stream": false, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]})
}

/// A POST with `headers`: status, headers, body.
async fn post(url: String, body: &Value, headers: &[(&str, &str)]) -> (u16, reqwest::header::HeaderMap, String) {
    let mut req = client().post(url).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = tokio::time::timeout(Duration::from_secs(20), resp.text())
        .await
        .expect("no hang")
        .unwrap_or_default();
    (status, headers, text)
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

/// The three HTTP dialects, each with a request for `model` and a credential header.
struct Dialects<'a> {
    server: &'a tailcut::server::Running,
}

impl Dialects<'_> {
    async fn openai(&self, model: &str, headers: &[(&str, &str)]) -> (u16, reqwest::header::HeaderMap, Value) {
        let (s, h, b) = post(self.server.url("/v1/chat/completions"), &openai_body(model), headers).await;
        (s, h, if s == 200 { Value::String(b) } else { json_of(&b) })
    }

    async fn anthropic(&self, model: &str, headers: &[(&str, &str)]) -> (u16, reqwest::header::HeaderMap, Value) {
        let (s, h, b) = post(self.server.url("/v1/messages"), &anthropic_body(model), headers).await;
        (s, h, json_of(&b))
    }

    async fn native(&self, model: &str, headers: &[(&str, &str)]) -> (u16, reqwest::header::HeaderMap, Value) {
        let (s, h, b) = post(self.server.url("/v1/stream"), &openai_body(model), headers).await;
        (s, h, if s == 200 { Value::String(b) } else { json_of(&b) })
    }
}

/// A WebSocket upgrade at `path_and_query` with `headers`; the HTTP status when refused.
async fn ws_open(server: &tailcut::server::Running, path_and_query: &str, headers: &[(&str, &str)]) -> Result<Ws, u16> {
    let url = server.url(path_and_query).replacen("http://", "ws://", 1);
    let mut req = url.into_client_request().expect("ws request");
    for (k, v) in headers {
        req.headers_mut().insert(
            reqwest::header::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            v.parse().expect("value"),
        );
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Err(resp.status().as_u16()),
        Err(e) => panic!("unexpected WebSocket failure: {e}"),
    }
}

fn ws_request(id: &str, model: &str) -> Message {
    let msg =
        json!({"type": "chat", "id": id, "request": {"model": model, "messages": [{"role": "user", "content": "hi"}]}});
    Message::text(msg.to_string())
}

/// The request's messages until its `done` or `error`; the last one.
async fn ws_outcome(ws: &mut Ws, id: &str, model: &str) -> Value {
    ws.send(ws_request(id, model)).await.expect("send");
    loop {
        let m = ws_next(ws).await;
        if m["type"] == "done" || m["type"] == "error" {
            assert_eq!(m["id"], id, "the outcome names its request: {m}");
            return m;
        }
    }
}

#[tokio::test]
async fn a_missing_or_wrong_key_is_401_in_every_dialect() {
    let server = start(&config("", "")).await;
    let d = Dialects { server: &server };
    for headers in [vec![], vec![("authorization", "Bearer tc_wrong-key-0123456789")]] {
        let (status, _, body) = d.openai("chat", &headers).await;
        assert_eq!(status, 401, "OpenAI: {body}");
        assert_eq!(
            body["error"]["type"], "invalid_request_error",
            "OpenAI's own 401 type: {body}"
        );
        assert!(
            matches!(
                body["error"]["code"].as_str(),
                Some("missing_api_key" | "invalid_api_key")
            ),
            "OpenAI code: {body}"
        );
        let (status, _, body) = d.anthropic("chat", &headers).await;
        assert_eq!(status, 401, "Anthropic: {body}");
        assert_eq!(
            (&body["type"], &body["error"]["type"]),
            (&json!("error"), &json!("authentication_error")),
            "Anthropic error body: {body}"
        );
        let (status, _, body) = d.native("chat", &headers).await;
        assert_eq!(status, 401, "native SSE: {body}");
        assert_eq!(
            (&body["type"], &body["class"]),
            (&json!("error"), &json!("unauthenticated")),
            "native error message: {body}"
        );
        assert_eq!(
            ws_open(&server, "/v1/ws", &headers).await.err(),
            Some(401),
            "WebSocket upgrade"
        );
        let models = client().get(server.url("/v1/models")).send().await.expect("sent");
        assert_eq!(models.status(), 401, "the model list needs a key too");
    }
    let (status, _, body) = d.anthropic("chat", &[("x-api-key", "tc_wrong-key-0123456789")]).await;
    assert_eq!(status, 401, "a wrong x-api-key: {body}");
    assert!(!body.to_string().contains("tc_wrong"), "the key is not echoed: {body}");
    assert!(
        server.sim.as_ref().expect("sim").log().is_empty(),
        "nothing reached an upstream"
    );
}

#[tokio::test]
async fn a_key_is_accepted_as_bearer_and_as_x_api_key_in_every_dialect() {
    let server = start(&config("", "")).await;
    let d = Dialects { server: &server };
    let auth = bearer(KEY);
    let (status, _, body) = d.openai("chat", &[("authorization", &auth)]).await;
    assert_eq!(status, 200, "OpenAI with a bearer: {body}");
    let (status, _, body) = d.anthropic("chat", &[("x-api-key", KEY)]).await;
    assert_eq!(status, 200, "Anthropic with x-api-key: {body}");
    assert_eq!(body["content"][0]["text"], TEXT, "{body}");
    let (status, _, body) = d.native("chat", &[("x-api-key", KEY)]).await;
    assert_eq!(status, 200, "native SSE: {body}");
    let mut ws = ws_open(&server, "/v1/ws", &[("authorization", &auth)])
        .await
        .expect("upgrade with a key");
    assert_eq!(
        ws_outcome(&mut ws, "r1", "chat").await["type"],
        "done",
        "a WebSocket request"
    );
}

#[tokio::test]
async fn the_key_decides_the_tenant_and_a_header_may_only_name_it() {
    let server = start(&config("", "")).await;
    let auth = bearer(KEY);
    let served = post_sse(&server.url(""), &openai_body("chat"), &[("authorization", &auth)]).await;
    assert_eq!(
        served.envelope()["route"],
        "b",
        "acme's data term picks route b without any header: {}",
        served.raw
    );
    let own = post_sse(
        &server.url(""),
        &openai_body("chat"),
        &[("authorization", &auth), ("x-tailcut-tenant", "acme")],
    )
    .await;
    assert_eq!(own.status, 200, "naming its own tenant is fine: {}", own.raw);
    let globex = post_sse(
        &server.url(""),
        &openai_body("chat"),
        &[("authorization", &bearer(OTHER_KEY))],
    )
    .await;
    assert_eq!(
        globex.envelope()["route"],
        "a",
        "the other key is globex: {}",
        globex.raw
    );
}

#[tokio::test]
async fn a_tenant_header_sent_twice_is_refused_and_never_read_as_its_first_value() {
    let server = start(&config("", "")).await;
    let auth = bearer(KEY);
    for second in ["globex", "no-such-tenant", "acme"] {
        let headers = [
            ("authorization", auth.as_str()),
            ("x-tailcut-tenant", "acme"),
            ("x-tailcut-tenant", second),
        ];
        let (status, _, body) = post(server.url("/v1/chat/completions"), &openai_body("chat"), &headers).await;
        assert_eq!(status, 400, "acme then {second}: {body}");
        assert!(body.contains("x-tailcut-tenant may be sent only once"), "{body}");
    }
}

#[tokio::test]
async fn an_unknown_tenant_gets_the_same_403_as_a_forbidden_one_in_every_dialect() {
    let server = start(&config("", "")).await;
    let d = Dialects { server: &server };
    let auth = bearer(KEY);
    let mut bodies = Vec::new();
    for tenant in ["globex", "no-such-tenant"] {
        let headers = [("authorization", auth.as_str()), ("x-tailcut-tenant", tenant)];
        let (status, _, body) = d.openai("chat", &headers).await;
        assert_eq!(status, 403, "OpenAI, tenant {tenant}: {body}");
        bodies.push(body);
        let (status, _, body) = d.anthropic("chat", &headers).await;
        assert_eq!(status, 403, "Anthropic, tenant {tenant}: {body}");
        assert_eq!(body["error"]["type"], "permission_error", "{body}");
        let (status, _, body) = d.native("chat", &headers).await;
        assert_eq!(status, 403, "native, tenant {tenant}: {body}");
        assert_eq!(body["class"], "forbidden", "{body}");
        assert_eq!(
            ws_open(&server, "/v1/ws", &headers).await.err(),
            Some(403),
            "WebSocket, {tenant}"
        );
    }
    assert_eq!(
        bodies[0], bodies[1],
        "an unknown tenant cannot be told from a forbidden one"
    );
    assert!(
        !bodies[1].to_string().contains("no-such-tenant"),
        "the name is not echoed: {}",
        bodies[1]
    );
}

/// The first message the socket sends for a request of `model` under `id` (messages for
/// other requests on the socket are skipped).
async fn ws_first_reply(ws: &mut Ws, id: &str, model: &str) -> Value {
    ws.send(ws_request(id, model)).await.expect("send");
    loop {
        let m = ws_next(ws).await;
        if m["id"] == id {
            return m;
        }
    }
}

#[tokio::test]
async fn a_websocket_request_the_key_refuses_gets_its_error_alone_without_accepted() {
    let server = start(&config("models = [\"chat\", \"long\"]\nmax_streams = 1", "")).await;
    let auth = bearer(KEY);
    let mut ws = ws_open(&server, "/v1/ws", &[("authorization", &auth)])
        .await
        .expect("upgrade");
    let off_list = ws_first_reply(&mut ws, "r1", "other").await;
    assert_eq!(
        (&off_list["type"], &off_list["class"], &off_list["code"]),
        (&json!("error"), &json!("forbidden"), &json!("model_forbidden")),
        "a model off the key's list: the error first, no accepted, the code HTTP gives: {off_list}"
    );
    let held = ws_first_reply(&mut ws, "r2", "long").await;
    assert_eq!(held["type"], "accepted", "the key's one stream is open: {held}");
    let over = ws_first_reply(&mut ws, "r3", "chat").await;
    assert_eq!(
        (&over["type"], &over["class"], &over["code"]),
        (&json!("error"), &json!("rate_limited"), &json!("max_streams_exceeded")),
        "over the key's max_streams: the error first, no accepted, the code HTTP gives: {over}"
    );
}

#[tokio::test]
async fn a_model_off_the_keys_list_is_403_in_every_dialect_and_not_listed() {
    let server = start(&config("models = [\"chat\"]", "")).await;
    let d = Dialects { server: &server };
    let auth = bearer(KEY);
    let headers = [("authorization", auth.as_str())];
    let (status, _, body) = d.openai("other", &headers).await;
    assert_eq!(status, 403, "OpenAI: {body}");
    assert_eq!(body["error"]["code"], "model_forbidden", "{body}");
    assert_eq!(d.anthropic("other", &headers).await.0, 403, "Anthropic");
    assert_eq!(d.native("other", &headers).await.0, 403, "native");
    assert_eq!(d.openai("chat", &headers).await.0, 200, "its own model");
    let mut ws = ws_open(&server, "/v1/ws", &headers).await.expect("upgrade");
    let refused = ws_outcome(&mut ws, "r1", "other").await;
    assert_eq!(
        (&refused["type"], &refused["class"]),
        (&json!("error"), &json!("forbidden")),
        "WebSocket: {refused}"
    );
    assert_eq!(
        ws_outcome(&mut ws, "r2", "chat").await["type"],
        "done",
        "the socket serves on"
    );
    let list: Value = client()
        .get(server.url("/v1/models"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["chat"], "only the key's models are listed: {list}");
}

#[tokio::test(start_paused = true)]
async fn rpm_is_enforced_and_refills_on_paused_time() {
    let server = start(&config("rpm = 2", "")).await;
    let d = Dialects { server: &server };
    let auth = bearer(KEY);
    let headers = [("authorization", auth.as_str())];
    assert_eq!(d.openai("chat", &headers).await.0, 200, "first");
    assert_eq!(d.openai("chat", &headers).await.0, 200, "second: a minute's burst");
    let (status, h, body) = d.openai("chat", &headers).await;
    assert_eq!(status, 429, "third: {body}");
    assert_eq!(body["error"]["code"], "rpm_exceeded", "{body}");
    let wait: u64 = h["retry-after"].to_str().expect("text").parse().expect("seconds");
    assert!((29..=30).contains(&wait), "one interval of 60 s / 2: {wait}");
    assert_eq!(
        d.openai("chat", &[("authorization", &bearer(OTHER_KEY))]).await.0,
        200,
        "another key has its own limit"
    );
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(d.openai("chat", &headers).await.0, 200, "refilled after Retry-After");
}

#[tokio::test]
async fn a_rate_limited_key_is_429_with_retry_after_in_every_dialect() {
    let server = start(&config("rpm = 1", "")).await;
    let d = Dialects { server: &server };
    let auth = bearer(KEY);
    let headers = [("authorization", auth.as_str())];
    let mut ws = ws_open(&server, "/v1/ws", &headers).await.expect("upgrade");
    assert_eq!(
        ws_outcome(&mut ws, "r1", "chat").await["type"],
        "done",
        "the one request"
    );
    let (status, h, body) = d.openai("chat", &headers).await;
    assert_eq!(
        (status, &body["error"]["type"]),
        (429, &json!("rate_limit_error")),
        "OpenAI: {body}"
    );
    assert!(
        h.contains_key("retry-after") && h.contains_key("retry-after-ms"),
        "OpenAI hints"
    );
    let (status, h, body) = d.anthropic("chat", &headers).await;
    assert_eq!(
        (status, &body["error"]["type"]),
        (429, &json!("rate_limit_error")),
        "Anthropic: {body}"
    );
    assert!(h.contains_key("retry-after"), "Anthropic hint");
    let (status, h, body) = d.native("chat", &headers).await;
    assert_eq!(
        (status, &body["class"], &body["code"]),
        (429, &json!("rate_limited"), &json!("rpm_exceeded")),
        "native: {body}"
    );
    assert!(h.contains_key("retry-after"), "native hint");
    let refused = ws_outcome(&mut ws, "r2", "chat").await;
    assert_eq!(
        (&refused["class"], &refused["code"]),
        (&json!("rate_limited"), &json!("rpm_exceeded")),
        "WebSocket: the class and code HTTP gives: {refused}"
    );
    assert!(refused["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0), "{refused}");
}

#[tokio::test]
async fn tpm_counts_the_input_estimate_plus_max_tokens() {
    let server = start(&config("tpm = 1000", "")).await;
    let auth = bearer(KEY);
    let headers = [("authorization", auth.as_str())];
    let body = |max: u32| json!({"model": "chat", "max_tokens": max, "messages": [{"role": "user", "content": "hi"}]});
    let url = server.url("/v1/chat/completions");
    assert_eq!(
        post(url.clone(), &body(600), &headers).await.0,
        200,
        "about 605 of 1000"
    );
    let (status, h, text) = post(url.clone(), &body(600), &headers).await;
    assert_eq!(status, 429, "another 605 does not fit: {text}");
    assert_eq!(json_of(&text)["error"]["code"], "tpm_exceeded", "{text}");
    assert!(h.contains_key("retry-after"), "tpm says when");
    let (status, h, text) = post(url, &body(5000), &headers).await;
    assert_eq!(status, 400, "more than the whole tpm can never pass: {text}");
    assert_eq!(json_of(&text)["error"]["code"], "request_exceeds_tpm", "{text}");
    assert!(!h.contains_key("retry-after"), "no point in retrying");
}

#[tokio::test]
async fn max_streams_is_a_429_while_the_keys_streams_are_open() {
    let server = start(&config("max_streams = 1", "")).await;
    let auth = bearer(KEY);
    let open = client()
        .post(server.url("/v1/chat/completions"))
        .header("authorization", &auth)
        .json(&openai_body("long"))
        .send()
        .await
        .expect("sent");
    assert_eq!(open.status(), 200, "the first stream is open");
    let (status, h, text) = post(
        server.url("/v1/messages"),
        &anthropic_body("chat"),
        &[("x-api-key", KEY)],
    )
    .await;
    assert_eq!(status, 429, "the key's one stream is taken: {text}");
    assert_eq!(h["retry-after"], "1", "retry in a second");
    assert_eq!(json_of(&text)["error"]["type"], "rate_limit_error", "{text}");
    let other = post(
        server.url("/v1/chat/completions"),
        &openai_body("chat"),
        &[("authorization", &bearer(OTHER_KEY))],
    )
    .await;
    assert_eq!(other.0, 200, "another key is not held back");
    drop(open);
    let mut served = 0;
    for _ in 0..200 {
        served = post(
            server.url("/v1/chat/completions"),
            &openai_body("chat"),
            &[("authorization", &auth)],
        )
        .await
        .0;
        if served == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(served, 200, "the slot is released when the client goes away");
}

async fn mint(server: &tailcut::server::Running, auth: &str, body: Value) -> (u16, Value) {
    let (status, _, text) = post(server.url("/v1/tokens"), &body, &[("authorization", auth)]).await;
    (status, json_of(&text))
}

#[tokio::test(start_paused = true)]
async fn a_minted_token_works_as_a_bearer_until_it_expires() {
    let server = start(&config("", "")).await;
    let (status, minted) = mint(&server, &bearer(KEY), json!({"ttl_s": 60})).await;
    assert_eq!(status, 200, "minted: {minted}");
    let token = minted["token"].as_str().expect("token").to_string();
    assert!(
        minted["expires_at"].as_u64().is_some_and(|t| t > 1_600_000_000),
        "Unix seconds: {minted}"
    );
    let d = Dialects { server: &server };
    let auth = bearer(&token);
    assert_eq!(
        d.openai("chat", &[("authorization", &auth)]).await.0,
        200,
        "a token as bearer"
    );
    let served = post_sse(&server.url(""), &openai_body("chat"), &[("authorization", &auth)]).await;
    assert_eq!(
        served.envelope()["route"],
        "b",
        "bound to the key's tenant: {}",
        served.raw
    );
    tokio::time::advance(Duration::from_secs(61)).await;
    let (status, _, body) = d.openai("chat", &[("authorization", &auth)]).await;
    assert_eq!(status, 401, "expired: {body}");
    assert_eq!(body["error"]["code"], "token_expired", "{body}");
    let (status, _, body) = d.native("chat", &[("authorization", &auth)]).await;
    assert_eq!(
        (status, &body["class"]),
        (401, &json!("unauthenticated")),
        "native: {body}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_websocket_opened_with_a_token_takes_no_new_request_once_it_expired() {
    let server = start(&config("", "")).await;
    let (_, minted) = mint(&server, &bearer(KEY), json!({"ttl_s": 20})).await;
    let token = minted["token"].as_str().expect("token");
    let mut ws = ws_open(&server, &format!("/v1/ws?token={token}"), &[])
        .await
        .expect("upgrade with ?token=");
    assert_eq!(ws_outcome(&mut ws, "r1", "chat").await["type"], "done", "while valid");
    tokio::time::advance(Duration::from_secs(21)).await;
    let after = ws_outcome(&mut ws, "r2", "chat").await;
    assert_eq!(
        (&after["type"], &after["class"]),
        (&json!("error"), &json!("unauthenticated")),
        "the socket outlives its token, its requests do not: {after}"
    );
    assert_eq!(after["code"], "token_expired", "{after}");
}

#[tokio::test]
async fn a_token_rides_in_the_url_of_an_event_source_and_a_websocket_but_a_key_never_does() {
    let server = start(&config("", "")).await;
    let (_, minted) = mint(&server, &bearer(KEY), json!({})).await;
    let token = minted["token"].as_str().expect("token");
    let q = serde_json::to_string(&openai_body("chat")).expect("JSON");
    let url = reqwest::Url::parse_with_params(&server.url("/v1/stream"), &[("q", q.as_str()), ("token", token)])
        .expect("url");
    let resp = client().get(url).send().await.expect("sent");
    assert_eq!(resp.status(), 200, "EventSource GET with ?token=");
    let body = resp.text().await.unwrap_or_default();
    assert!(body.contains("event: done"), "streamed to the end: {body}");
    let mut ws = ws_open(&server, &format!("/v1/ws?token={token}"), &[])
        .await
        .expect("upgrade with ?token=");
    assert_eq!(
        ws_outcome(&mut ws, "r1", "chat").await["type"],
        "done",
        "a request on it"
    );
    let with_key =
        reqwest::Url::parse_with_params(&server.url("/v1/stream"), &[("q", q.as_str()), ("token", KEY)]).expect("url");
    let resp = client().get(with_key).send().await.expect("sent");
    assert_eq!(resp.status(), 401, "an API key in a URL is refused");
    assert_eq!(
        ws_open(&server, &format!("/v1/ws?token={KEY}"), &[]).await.err(),
        Some(401),
        "WS too"
    );
    let posted = post(
        format!("{}?token={token}", server.url("/v1/chat/completions")),
        &openai_body("chat"),
        &[],
    )
    .await;
    assert_eq!(
        posted.0, 401,
        "?token= is only for endpoints browsers reach without headers"
    );
}

#[tokio::test]
async fn a_websocket_refuses_an_invalid_url_token_even_beside_a_valid_header_key() {
    let server = start(&config("", "")).await;
    let (_, minted) = mint(&server, &bearer(KEY), json!({})).await;
    let token = minted["token"].as_str().expect("token");
    let key = bearer(KEY);
    for (forged, what) in [
        ("tct_forged.signature", "a token this server never signed"),
        (KEY, "a key in the URL"),
    ] {
        assert_eq!(
            ws_open(&server, &format!("/v1/ws?token={forged}"), &[("authorization", &key)])
                .await
                .err(),
            Some(401),
            "{what} beside a valid Authorization key"
        );
        assert_eq!(
            ws_open(&server, &format!("/v1/ws?token={forged}"), &[("x-api-key", KEY)])
                .await
                .err(),
            Some(401),
            "{what} beside a valid x-api-key"
        );
    }
    let mut ws = ws_open(&server, &format!("/v1/ws?token={token}"), &[("authorization", &key)])
        .await
        .expect("a valid key and a valid token");
    assert_eq!(ws_outcome(&mut ws, "r1", "chat").await["type"], "done", "served");

    // The same rule on the EventSource GET, and for a second credential header.
    let q = serde_json::to_string(&openai_body("chat")).expect("JSON");
    let stream = |token: &str| {
        reqwest::Url::parse_with_params(&server.url("/v1/stream"), &[("q", q.as_str()), ("token", token)]).expect("url")
    };
    let forged = client()
        .get(stream("tct_forged.signature"))
        .header("authorization", &key)
        .send()
        .await
        .expect("sent");
    assert_eq!(
        forged.status(),
        401,
        "a forged ?token= beside a valid key on /v1/stream"
    );
    let both = client()
        .get(stream(token))
        .header("authorization", &key)
        .send()
        .await
        .expect("sent");
    assert_eq!(both.status(), 200, "a valid key and a valid token");
    let d = Dialects { server: &server };
    let (status, _, body) = d
        .openai(
            "chat",
            &[("authorization", &key), ("x-api-key", "tc_not-a-key-0000000000")],
        )
        .await;
    assert_eq!(status, 401, "a wrong x-api-key beside a valid Authorization: {body}");
    let (status, _, body) = d.openai("chat", &[("authorization", &key), ("x-api-key", KEY)]).await;
    assert_eq!(status, 200, "the same key twice is fine: {body}");
}

#[tokio::test]
async fn a_token_cannot_mint_tokens() {
    let server = start(&config("", "")).await;
    let (_, minted) = mint(&server, &bearer(KEY), json!({})).await;
    let token = minted["token"].as_str().expect("token");
    let (status, body) = mint(&server, &bearer(token), json!({})).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "token_cannot_mint", "{body}");
    let (status, body) = mint(&server, "", json!({})).await;
    assert_eq!(status, 401, "minting needs a key: {body}");
}

#[tokio::test]
async fn a_token_is_bound_to_its_models_and_its_keys_tenant() {
    let server = start(&config("models = [\"chat\", \"other\"]", "")).await;
    let (status, minted) = mint(&server, &bearer(KEY), json!({"models": ["chat"], "ttl_s": 600})).await;
    assert_eq!(status, 200, "{minted}");
    let auth = bearer(minted["token"].as_str().expect("token"));
    let d = Dialects { server: &server };
    assert_eq!(d.openai("chat", &[("authorization", &auth)]).await.0, 200, "its model");
    assert_eq!(
        d.openai("other", &[("authorization", &auth)]).await.0,
        403,
        "the key's, not the token's"
    );
    let headers = [("authorization", auth.as_str()), ("x-tailcut-tenant", "globex")];
    assert_eq!(d.openai("chat", &headers).await.0, 403, "its tenant only");
    for (body, status, what) in [
        (json!({"models": ["long"]}), 403, "a model beyond the key's"),
        (
            json!({"models": ["gpt-9"]}),
            403,
            "a model that does not exist, beyond the key's",
        ),
        (json!({"models": []}), 400, "no models"),
        (json!({"ttl_s": 7200}), 400, "longer than an hour"),
        (json!({"ttl_s": 0}), 400, "no life"),
        (json!({"tll_s": 60}), 400, "a misspelt field"),
    ] {
        let (got, reply) = mint(&server, &bearer(KEY), body).await;
        assert_eq!(got, status, "{what}: {reply}");
    }
}

/// A credential header sent twice is a 400 in each dialect, whatever the values (before,
/// the first was used, and a second could slip past whatever read the first).
#[tokio::test]
async fn a_credential_header_sent_twice_is_a_400_in_each_dialect() {
    let server = start(&config("", "")).await;
    let d = Dialects { server: &server };
    let (key, other) = (bearer(KEY), bearer(OTHER_KEY));
    for (name, first, second) in [
        ("authorization", key.as_str(), key.as_str()),
        ("authorization", key.as_str(), other.as_str()),
        ("x-api-key", KEY, OTHER_KEY),
    ] {
        let headers = [(name, first), (name, second)];
        let (status, _, body) = d.openai("chat", &headers).await;
        assert_eq!(status, 400, "OpenAI, {name} twice: {body}");
        assert_eq!(body["error"]["param"], name, "{body}");
        assert_eq!(body["error"]["code"], "bad_request", "{body}");
        let (status, _, body) = d.anthropic("chat", &headers).await;
        assert_eq!(status, 400, "Anthropic, {name} twice: {body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        let (status, _, body) = d.native("chat", &headers).await;
        assert_eq!(status, 400, "native, {name} twice: {body}");
        assert_eq!(body["class"], "bad_request", "{body}");
        let (status, _, text) = post(server.url("/v1/tokens"), &json!({}), &headers).await;
        assert_eq!(status, 400, "minting, {name} twice: {text}");
        assert!(
            !text.contains(KEY) && !text.contains(OTHER_KEY),
            "no key in the answer: {text}"
        );
    }
}

#[tokio::test]
async fn a_token_request_that_is_not_a_json_object_is_a_400_saying_so() {
    let server = start(&config("", "")).await;
    let auth = bearer(KEY);
    for body in [json!([600, ["chat"]]), json!([]), json!("ttl_s"), json!(600)] {
        let (status, _, text) = post(server.url("/v1/tokens"), &body, &[("authorization", &auth)]).await;
        assert_eq!(status, 400, "{body}: {text}");
        let message = json_of(&text)["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(message.contains("must be a JSON object"), "{body}: {text}");
        assert!(!text.contains("\"token\""), "no token minted for {body}: {text}");
    }
    let (status, _, text) = post(
        server.url("/v1/tokens"),
        &json!({"ttl_s": 60}),
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(status, 200, "an object still mints: {text}");
}

/// Minting a token for a model is refused exactly as a chat request for it is: past the
/// key's list a 403 `model_forbidden`, and a model that does not exist a 404
/// `model_not_found` naming the known ones (it was a 400 before the key's list was checked).
#[tokio::test]
async fn minting_for_a_model_answers_as_a_chat_request_for_it() {
    let server = start(&config("models = [\"chat\"]", "")).await;
    let d = Dialects { server: &server };
    for (key, model, status, code) in [
        (KEY, "gpt-9", 403, "model_forbidden"),
        (KEY, "other", 403, "model_forbidden"),
        (OTHER_KEY, "gpt-9", 404, "model_not_found"),
    ] {
        let auth = bearer(key);
        let (chat_status, _, chat) = d.openai(model, &[("authorization", &auth)]).await;
        let (mint_status, minted) = mint(&server, &auth, json!({"models": [model]})).await;
        assert_eq!(
            (chat_status, mint_status),
            (status, status),
            "{model}: {chat} / {minted}"
        );
        assert_eq!(chat["error"]["code"], code, "{model}: {chat}");
        assert_eq!(minted["error"]["code"], code, "{model}: {minted}");
        assert_eq!(minted["error"]["type"], chat["error"]["type"], "{model}");
        assert_eq!(minted["error"]["param"], "model", "{model}: {minted}");
    }
    let (_, minted) = mint(&server, &bearer(OTHER_KEY), json!({"models": ["gpt-9"]})).await;
    assert!(
        minted["error"]["message"].as_str().is_some_and(|m| m.contains("chat")),
        "the known models are listed, as chat lists them: {minted}"
    );
}

#[tokio::test]
async fn tokens_are_off_without_their_secret() {
    let toml = config("", "").replace(&format!("token_secret_env = \"{SECRET_ENV}\"\n"), "");
    let server = start(&toml).await;
    let (status, body) = mint(&server, &bearer(KEY), json!({})).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "tokens_off", "{body}");
}

#[tokio::test]
async fn admin_routes_and_metrics_need_the_admin_token_with_auth() {
    let server = start(&config("", "")).await;
    let get = |path: &str, token: Option<&str>| {
        let mut req = client().get(server.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move { req.send().await.expect("sent").status().as_u16() }
    };
    assert_eq!(get("/admin/routes", None).await, 401, "admin reads are private");
    assert_eq!(
        get("/admin/routes", Some(KEY)).await,
        401,
        "a client key is not the admin token"
    );
    assert_eq!(
        get("/admin/routes", Some(ADMIN_TOKEN)).await,
        200,
        "with the admin token"
    );
    assert_eq!(get("/metrics", None).await, 401, "metrics are private");
    assert_eq!(get("/metrics", Some(ADMIN_TOKEN)).await, 200, "with the admin token");
    assert_eq!(get("/healthz", None).await, 200, "liveness is public");
    assert_eq!(get("/readyz", None).await, 200, "readiness is public");
    let drill = client()
        .post(server.url("/admin/routes/a/drill"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(drill.status(), 401, "writes too");

    let public = start(&config("", "").replacen("[server]\n", "[server]\nmetrics_public = true\n", 1)).await;
    let status = client()
        .get(public.url("/metrics"))
        .send()
        .await
        .expect("sent")
        .status();
    assert_eq!(status, 200, "metrics_public opens /metrics");
    let status = client()
        .get(public.url("/admin/routes"))
        .send()
        .await
        .expect("sent")
        .status();
    assert_eq!(status, 401, "but not /admin");

    let no_admin = start(&config("", "").replace(&format!("admin_token_env = \"{ADMIN_ENV}\"\n"), "")).await;
    let status = client()
        .get(no_admin.url("/admin/routes"))
        .send()
        .await
        .expect("sent")
        .status();
    assert_eq!(status, 403, "with [auth] and no admin token, admin is off");
}

#[tokio::test]
async fn without_auth_ops_reads_stay_open_on_loopback() {
    let server = start(&config_toml(&[("a", "openai", "fast-stable")], "")).await;
    for path in ["/admin/routes", "/metrics", "/v1/models"] {
        let status = client().get(server.url(path)).send().await.expect("sent").status();
        assert_eq!(status, 200, "{path} without [auth]");
    }
    let (status, body) = mint(&server, "", json!({})).await;
    assert_eq!(status, 403, "no [auth], no tokens: {body}");
}

#[tokio::test]
async fn without_auth_a_non_loopback_address_is_refused() {
    let open = config_toml(&[("a", "openai", "fast-stable")], "");
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.expect("bind any");
    let cfg = tailcut::config::load_str(&open).expect("valid");
    let err = tailcut::server::start(cfg, listener).await.err().expect("refused");
    let message = err.to_string();
    assert!(
        message.contains("no [auth]") && message.contains("allow_unauthenticated") && message.contains("keys new"),
        "a clear message that says what to do: {message}"
    );
    let allowed = open.replacen("[server]\n", "[server]\nallow_unauthenticated = true\n", 1);
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.expect("bind any");
    let running = tailcut::server::start(tailcut::config::load_str(&allowed).expect("valid"), listener).await;
    assert!(running.is_ok(), "allow_unauthenticated opts out");
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.expect("bind any");
    let authed = tailcut::config::load_str(&config("", "")).expect("valid");
    assert!(
        tailcut::server::start(authed, listener).await.is_ok(),
        "with [auth] any address"
    );
}

#[test]
fn the_cli_refuses_a_public_address_without_auth() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tailcut"))
        .args(["serve", "--listen", "0.0.0.0:0"])
        .output()
        .expect("runs");
    assert!(!out.status.success(), "exits with failure");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refusing to listen on 0.0.0.0"), "says why: {stderr}");
}

#[tokio::test]
async fn keys_new_prints_a_key_and_config_lines_that_parse() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tailcut"))
        .args(["keys", "new", "--tenant", "acme"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = String::from_utf8(out.stdout).expect("UTF-8");
    let stderr = String::from_utf8(out.stderr).expect("UTF-8");
    let key = stderr
        .lines()
        .next()
        .expect("the key on its own line")
        .trim()
        .to_string();
    assert!(key.starts_with("tc_") && key.len() > 40, "a long random key: {key}");
    assert!(!lines.contains(&key), "the config lines hold only its hash: {lines}");
    let toml = format!(
        "{}\n[tenants.acme]\n[auth]\n{lines}",
        config_toml(&[("a", "openai", "fast-stable")], "")
    );
    let cfg = tailcut::config::load_str(&toml).unwrap_or_else(|e| panic!("the printed lines are config: {e}\n{lines}"));
    assert_eq!(
        cfg.auth.as_ref().map(|a| a.keys[0].tenant.as_str()),
        Some("acme"),
        "bound to acme"
    );
    let server = tailcut::server::start(cfg, tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind"))
        .await
        .expect("starts");
    let reply = post_sse(&server.url(""), &chat_body(true), &[("authorization", &bearer(&key))]).await;
    assert_eq!(reply.status, 200, "the printed key works: {}", reply.raw);
}

/// Collects every log line the server writes on this (current-thread) runtime.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn keys_and_tokens_never_reach_a_response_a_log_line_or_a_metric() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("tailcut=trace"))
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let server = start(&config("models = [\"chat\"]\nrpm = 3", "")).await;
    let (_, minted) = mint(&server, &bearer(KEY), json!({"ttl_s": 60})).await;
    let token = minted["token"].as_str().expect("token").to_string();
    let mut seen = String::new();
    let d = Dialects { server: &server };
    for auth in [bearer(KEY), bearer(&token), bearer("tc_wrong-key-0123456789")] {
        for model in ["chat", "other"] {
            let headers = [("authorization", auth.as_str()), ("x-tailcut-tenant", "globex")];
            seen.push_str(&format!("{:?}", d.openai(model, &headers).await));
            seen.push_str(&format!(
                "{:?}",
                d.anthropic(model, &[("authorization", auth.as_str())]).await
            ));
            seen.push_str(&format!(
                "{:?}",
                d.native(model, &[("authorization", auth.as_str())]).await
            ));
        }
    }
    let ws = format!("/v1/ws?token={token}&x=1");
    if let Ok(mut ws) = ws_open(&server, &ws, &[]).await {
        seen.push_str(&ws_outcome(&mut ws, "r1", "other").await.to_string());
    }
    seen.push_str(&format!("{:?}", mint(&server, &bearer(&token), json!({})).await));
    let metrics = client()
        .get(server.url("/metrics"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("sent")
        .text()
        .await
        .unwrap_or_default();
    let logged = String::from_utf8_lossy(&logs.0.lock().expect("logs")).into_owned();
    assert!(logged.contains("request refused"), "refusals are logged: {logged}");
    let (_, signature) = token.rsplit_once('.').expect("signed");
    for secret in [KEY, token.as_str(), signature, "tc_wrong-key", ADMIN_TOKEN] {
        assert!(!seen.contains(secret), "a response holds {secret}: {seen}");
        assert!(!logged.contains(secret), "a log line holds {secret}: {logged}");
        assert!(!metrics.contains(secret), "a metric holds {secret}");
    }
}

#[tokio::test]
async fn a_token_goes_with_its_key_when_the_key_is_replaced_under_the_same_name() {
    // Two servers sharing the token secret, as after a restart with a rotated key: the
    // second has a new key under the old key's name. The old key's token is refused there.
    let before = start(&config("", "")).await;
    let (status, minted) = mint(&before, &bearer(KEY), json!({"ttl_s": 600})).await;
    assert_eq!(status, 200, "minted: {minted}");
    let token = minted["token"].as_str().expect("token").to_string();
    let auth = bearer(&token);
    let d = Dialects { server: &before };
    assert_eq!(
        d.openai("chat", &[("authorization", &auth)]).await.0,
        200,
        "the token works"
    );

    let rotated = config("", "").replacen(&hash(KEY), &hash("tc_a-rotated-key-0123456789abcdef"), 1);
    let after = start(&rotated).await;
    let d = Dialects { server: &after };
    let (status, _, body) = d.openai("chat", &[("authorization", &auth)]).await;
    assert_eq!(status, 401, "the rotated key's old token: {body}");
    assert_eq!(
        d.openai("chat", &[("authorization", &bearer(KEY))]).await.0,
        401,
        "and the old key"
    );
}
