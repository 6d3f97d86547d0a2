//! The error table of `docs/errors.md`, row by row, end to end over loopback in both SDK
//! dialects: each failure's HTTP status, its `type` (and OpenAI `code`), Retry-After only
//! where waiting helps, and `x-request-id` on every error.

mod support;

use serde_json::{json, Value};
use sha2::Digest;
use support::*;

const KEY: &str = "tc_errors-test-key-0123456789abcdef";

fn hash(key: &str) -> String {
    hex::encode(sha2::Sha256::digest(key.as_bytes()))
}

/// A test server over simulated routes with named scenarios; `server_extra` lands in `[server]`.
fn config(server_extra: &str, extra: &str) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
sse_keepalive_ms = 600000
{server_extra}
[sim]
listen = "127.0.0.1:0"
[sim.scenarios.quick]
text = "fine"
ttft = {{ median_ms = 5.0, sigma = 0.0 }}
[sim.scenarios.slow]
ttft = {{ median_ms = 30000.0, sigma = 0.0 }}
[sim.scenarios.limited]
failure = {{ status = 429, retry_after_s = 3 }}
[sim.scenarios.broken]
failure = {{ status = 500 }}
[sim.scenarios.busy]
failure = {{ status = 503, retry_after_s = 2 }}
[[routes]]
name = "quick"
provider = "simulated"
scenario = "quick"
region = "eu"
context_window = 200
max_output = 50
[[routes]]
name = "slow"
provider = "simulated"
scenario = "slow"
region = "eu"
[[routes]]
name = "limited"
provider = "simulated"
scenario = "limited"
region = "eu"
[[routes]]
name = "broken"
provider = "simulated"
scenario = "broken"
region = "eu"
[models.chat]
routes = ["quick"]
hedge = false
[models.slow]
routes = ["slow"]
hedge = false
[models.limited]
routes = ["limited"]
hedge = false
[models.broken]
routes = ["broken"]
hedge = false
[[routes]]
name = "busy"
provider = "simulated"
scenario = "busy"
region = "eu"
[models.busy]
routes = ["busy"]
hedge = false
{extra}"#
    )
}

#[derive(Clone, Copy, Debug)]
enum Dialect {
    OpenAi,
    Anthropic,
}

const BOTH: [Dialect; 2] = [Dialect::OpenAi, Dialect::Anthropic];

/// One error response: status, headers, JSON body.
struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    json: Value,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// `(type, code)`: OpenAI's `error.type` / `error.code`, Anthropic's `error.type` (no code).
    fn kind(&self, dialect: Dialect) -> (String, Option<String>) {
        let s = |v: &Value| v.as_str().map(str::to_string);
        match dialect {
            Dialect::OpenAi => (
                s(&self.json["error"]["type"]).unwrap_or_default(),
                s(&self.json["error"]["code"]),
            ),
            Dialect::Anthropic => (s(&self.json["error"]["type"]).unwrap_or_default(), None),
        }
    }
}

fn body(dialect: Dialect, model: &str, text: &str) -> Value {
    match dialect {
        Dialect::OpenAi => json!({"model": model, "messages": [{"role": "user", "content": text}]}),
        Dialect::Anthropic => {
            json!({"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": text}]})
        }
    }
}

async fn send(server: &tailcut::server::Running, dialect: Dialect, body: &Value, headers: &[(&str, &str)]) -> Reply {
    let path = match dialect {
        Dialect::OpenAi => "/v1/chat/completions",
        Dialect::Anthropic => "/v1/messages",
    };
    let mut req = client().post(server.url(path)).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap_or_default();
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("error body is JSON ({e}): {text}"));
    Reply { status, headers, json }
}

/// The JSON body sent as `text/plain`, as a careless client (or a form) would.
async fn send_text_plain(server: &tailcut::server::Running, dialect: Dialect, body: &Value) -> Reply {
    let path = match dialect {
        Dialect::OpenAi => "/v1/chat/completions",
        Dialect::Anthropic => "/v1/messages",
    };
    let resp = client()
        .post(server.url(path))
        .header("content-type", "text/plain")
        .body(body.to_string())
        .send()
        .await
        .expect("request sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap_or_default();
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("error body is JSON ({e}): {text}"));
    Reply { status, headers, json }
}

/// Asserts one row: status, type, OpenAI code, Retry-After presence, and the request id.
fn row(what: &str, dialect: Dialect, reply: &Reply, status: u16, openai: (&str, &str), anthropic: &str, retry: bool) {
    let at = format!("{what} ({dialect:?}): {}", reply.json);
    assert_eq!(reply.status, status, "status of {at}");
    let (kind, code) = reply.kind(dialect);
    match dialect {
        Dialect::OpenAi => {
            assert_eq!(kind, openai.0, "OpenAI type of {at}");
            assert_eq!(code.as_deref(), Some(openai.1), "OpenAI code of {at}");
        }
        Dialect::Anthropic => {
            assert_eq!(kind, anthropic, "Anthropic type of {at}");
            assert_eq!(reply.json["type"], "error", "Anthropic envelope of {at}");
        }
    }
    assert_eq!(
        reply.header("retry-after").is_some(),
        retry,
        "Retry-After {} on {at}",
        if retry { "expected" } else { "not expected" }
    );
    assert!(
        reply.header("x-request-id").is_some_and(|id| !id.is_empty()),
        "x-request-id on {at}"
    );
}

#[tokio::test]
async fn client_faults_are_4xx_invalid_request_errors_in_both_dialects() {
    let server = start(&config("", "")).await;
    for d in BOTH {
        let r = send(&server, d, &body(d, "no-such-model", "hi"), &[]).await;
        row(
            "unknown model",
            d,
            &r,
            404,
            ("invalid_request_error", "model_not_found"),
            "not_found_error",
            false,
        );

        let r = send(&server, d, &body(d, "chat", "hi"), &[("x-tailcut-priority", "urgent")]).await;
        row(
            "bad header",
            d,
            &r,
            400,
            ("invalid_request_error", "bad_request"),
            "invalid_request_error",
            false,
        );

        let r = send(&server, d, &body(d, "chat", "hi"), &[("x-tailcut-region", "mars")]).await;
        row(
            "no route",
            d,
            &r,
            400,
            ("invalid_request_error", "no_route"),
            "invalid_request_error",
            false,
        );

        let long = "word ".repeat(400);
        let r = send(&server, d, &body(d, "chat", &long), &[]).await;
        row(
            "prompt longer than every window",
            d,
            &r,
            400,
            ("invalid_request_error", "context_length_exceeded"),
            "invalid_request_error",
            false,
        );

        let r = send_text_plain(&server, d, &body(d, "chat", "hi")).await;
        row(
            "text/plain body",
            d,
            &r,
            415,
            ("invalid_request_error", "unsupported_media_type"),
            "invalid_request_error",
            false,
        );
    }
}

#[tokio::test]
async fn limits_are_429_with_retry_after_and_deadlines_are_504_without() {
    for d in BOTH {
        // A fresh server per dialect: after a 429 the route cools, and a request that finds
        // every route cooling is answered by the mux without trying one.
        let server = start(&config("", "")).await;
        let r = send(&server, d, &body(d, "limited", "hi"), &[]).await;
        row(
            "every route rate limited",
            d,
            &r,
            429,
            ("rate_limit_error", "rate_limit_exceeded"),
            "rate_limit_error",
            true,
        );

        // The next request finds the route still cooling after that 429: still a 429 with
        // Retry-After, never a 503 "overloaded".
        let r = send(&server, d, &body(d, "limited", "hi"), &[]).await;
        row(
            "every route cooling after a rate limit",
            d,
            &r,
            429,
            ("rate_limit_error", "rate_limit_exceeded"),
            "rate_limit_error",
            true,
        );

        let r = send(&server, d, &body(d, "slow", "hi"), &[("x-tailcut-deadline-ms", "100")]).await;
        row(
            "deadline before the first token",
            d,
            &r,
            504,
            ("server_error", "timeout"),
            "timeout_error",
            false,
        );

        // A deadline shorter than any route's minimum useful time: refused without trying.
        let r = send(&server, d, &body(d, "chat", "hi"), &[("x-tailcut-deadline-ms", "1")]).await;
        row(
            "deadline too short for every route",
            d,
            &r,
            504,
            ("server_error", "timeout"),
            "timeout_error",
            false,
        );

        let r = send(&server, d, &body(d, "broken", "hi"), &[]).await;
        row(
            "every route failed",
            d,
            &r,
            502,
            ("server_error", "unavailable"),
            "api_error",
            false,
        );

        // Every route said 503 and named a wait: the upstream's own hint is passed on.
        let r = send(&server, d, &body(d, "busy", "hi"), &[]).await;
        row(
            "every route said 503 with Retry-After",
            d,
            &r,
            503,
            ("server_error", "unavailable"),
            "api_error",
            true,
        );
        assert_eq!(r.header("retry-after"), Some("2"), "{d:?}: the upstream's hint");
    }
}

#[tokio::test]
async fn a_full_gateway_is_503_overloaded_with_retry_after() {
    let server = start(&config("max_streams = 1", "")).await;
    // Hold the one stream permit with an answer that takes 30 s to start.
    let held = client()
        .post(server.url("/v1/chat/completions"))
        .json(&json!({"model": "slow", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send();
    let held = tokio::spawn(held);
    wait_for_log(&server, "the held request reached the upstream", |log| !log.is_empty()).await;
    for d in BOTH {
        let r = send(&server, d, &body(d, "chat", "hi"), &[]).await;
        row(
            "no free stream",
            d,
            &r,
            503,
            ("server_error", "overloaded"),
            "overloaded_error",
            true,
        );
    }
    held.abort();
}

#[tokio::test]
async fn auth_failures_are_401_and_403() {
    let extra = format!(
        "[tenants.acme]\n[auth]\n[[auth.keys]]\nname = \"app\"\nsha256 = \"{}\"\ntenant = \"acme\"\nmodels = [\"slow\"]\n",
        hash(KEY)
    );
    let server = start(&config("", &extra)).await;
    let bearer = format!("Bearer {KEY}");
    for d in BOTH {
        let r = send(&server, d, &body(d, "chat", "hi"), &[]).await;
        let (kind, _) = r.kind(d);
        assert_eq!(r.status, 401, "no key ({d:?}): {}", r.json);
        let want = match d {
            Dialect::OpenAi => "invalid_request_error",
            Dialect::Anthropic => "authentication_error",
        };
        assert_eq!(kind, want, "no key ({d:?}) type: {}", r.json);
        assert!(r.header("x-request-id").is_some(), "x-request-id on a 401 ({d:?})");

        let r = send(&server, d, &body(d, "chat", "hi"), &[("authorization", &bearer)]).await;
        let (kind, _) = r.kind(d);
        assert_eq!(r.status, 403, "a model off the key's list ({d:?}): {}", r.json);
        let want = match d {
            Dialect::OpenAi => "invalid_request_error",
            Dialect::Anthropic => "permission_error",
        };
        assert_eq!(kind, want, "forbidden ({d:?}) type: {}", r.json);
        assert!(r.header("retry-after").is_none(), "no Retry-After on a 403 ({d:?})");
    }
}
