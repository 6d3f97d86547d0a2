//! What tailcut says about a model without running it, end to end over loopback:
//! `GET /v1/models/{id}` (a model name may hold `/`; a model the key may not use is the same
//! 404 as one that does not exist) and `POST /v1/messages/count_tokens` (tailcut's estimate,
//! labelled so, refused as `/v1/messages` refuses, and never sent to an upstream).

mod support;

use serde_json::{json, Value};
use sha2::Digest;
use support::*;

const KEY: &str = "tc_test-key-for-model-info-0123456789abcdef";

/// Two models, `chat` and `meta/llama-3`; with `auth`, one key that may use only `chat`.
fn config(auth: bool) -> String {
    let mut toml = config_toml(
        &[("a", "openai", "quick")],
        "[sim.scenarios.quick]\ntext = \"fine\"\n[models.\"meta/llama-3\"]\nroutes = [\"a\"]\n",
    );
    if auth {
        let sha = hex::encode(sha2::Sha256::digest(KEY.as_bytes()));
        toml.push_str(&format!(
            "[tenants.acme]\n[auth]\n[[auth.keys]]\nname = \"app\"\nsha256 = \"{sha}\"\ntenant = \"acme\"\nmodels = [\"chat\"]\n"
        ));
    }
    toml
}

/// A GET with `headers`: status and JSON body.
async fn get(server: &tailcut::server::Running, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = client().get(server.url(path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn not_found(id: &str) -> Value {
    json!({"error": {
        "message": format!("The model '{id}' does not exist or you do not have access to it."),
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found"
    }})
}

#[tokio::test]
async fn a_model_is_answered_by_its_id_even_with_a_slash_in_it() {
    let server = start(&config(false)).await;
    for id in ["chat", "meta/llama-3"] {
        let (status, json) = get(&server, &format!("/v1/models/{id}"), &[]).await;
        assert_eq!(status, 200, "{id}: {json}");
        assert_eq!(
            json,
            json!({"id": id, "object": "model", "created": 0, "owned_by": "tailcut"}),
            "{id}: the model as the list shows it"
        );
    }
    let (status, json) = get(&server, "/v1/models/meta%2Fllama-3", &[]).await;
    assert_eq!(
        (status, &json["id"]),
        (200, &json!("meta/llama-3")),
        "a percent-encoded slash is the same id: {json}"
    );
    let (status, json) = get(&server, "/v1/models/gpt-9", &[]).await;
    assert_eq!(status, 404, "an unknown model: {json}");
    assert_eq!(json, not_found("gpt-9"), "OpenAI's own 404 body");
}

#[tokio::test]
async fn a_model_the_key_may_not_use_is_the_same_404_as_one_that_does_not_exist() {
    let server = start(&config(true)).await;
    let auth = format!("Bearer {KEY}");
    let (status, json) = get(&server, "/v1/models/chat", &[("authorization", &auth)]).await;
    assert_eq!(
        (status, &json["id"]),
        (200, &json!("chat")),
        "the key's own model: {json}"
    );
    let (status, json) = get(&server, "/v1/models/chat", &[("x-api-key", KEY)]).await;
    assert_eq!(status, 200, "x-api-key is a key too: {json}");

    let (forbidden_status, forbidden) = get(&server, "/v1/models/meta/llama-3", &[("authorization", &auth)]).await;
    let (unknown_status, unknown) = get(&server, "/v1/models/gpt-9", &[("authorization", &auth)]).await;
    assert_eq!(
        (forbidden_status, unknown_status),
        (404, 404),
        "both 404: {forbidden} {unknown}"
    );
    assert_eq!(forbidden, not_found("meta/llama-3"), "nothing says the model exists");
    assert_eq!(unknown, not_found("gpt-9"), "unknown");

    let (status, json) = get(&server, "/v1/models/chat", &[]).await;
    assert_eq!(status, 401, "no key: {json}");
    assert_eq!(json["error"]["code"], "missing_api_key", "{json}");
}

/// A POST of `body` to `/v1/messages/count_tokens`: status, headers, JSON body.
async fn count(
    server: &tailcut::server::Running,
    body: &Value,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = client().post(server.url("/v1/messages/count_tokens")).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn count_body(model: &str, text: &str) -> Value {
    json!({"model": model, "system": "be brief", "messages": [{"role": "user", "content": text}]})
}

#[tokio::test]
async fn count_tokens_answers_an_estimate_labelled_so_and_asks_no_upstream() {
    let server = start(&config(false)).await;
    let (status, headers, short) = count(&server, &count_body("chat", "hi"), &[]).await;
    assert_eq!(status, 200, "no max_tokens needed: {short}");
    assert_eq!(
        headers.get("x-tailcut-estimate").map(|v| v.as_bytes()),
        Some(&b"true"[..]),
        "labelled an estimate"
    );
    assert!(headers.get("request-id").is_some(), "the Anthropic SDKs' request id");
    let short = short["input_tokens"].as_u64().expect("input_tokens is a number");
    let (_, _, long) = count(&server, &count_body("chat", &"word ".repeat(1_000)), &[]).await;
    let long = long["input_tokens"].as_u64().expect("input_tokens is a number");
    assert!(
        short > 0 && long > short + 1_000,
        "grows with the prompt: {short} then {long}"
    );
    let log = server.sim.as_ref().map(|s| s.log()).unwrap_or_default();
    assert!(log.is_empty(), "nothing reached an upstream: {} requests", log.len());
}

#[tokio::test]
async fn count_tokens_refuses_in_anthropics_format_as_messages_does() {
    let server = start(&config(false)).await;
    let (status, _, json) = count(&server, &count_body("gpt-9", "hi"), &[]).await;
    assert_eq!(status, 404, "an unknown model: {json}");
    assert_eq!(
        (&json["type"], &json["error"]["type"]),
        (&json!("error"), &json!("not_found_error")),
        "{json}"
    );
    let bad = json!({"model": "chat", "messages": [{"role": "user", "content": 5}]});
    let (status, _, json) = count(&server, &bad, &[]).await;
    assert_eq!(status, 400, "bad content: {json}");
    assert_eq!(json["error"]["type"], "invalid_request_error", "{json}");
    let message = json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("messages.0.content"), "names the field: {json}");

    let server = start(&config(true)).await;
    let (status, _, json) = count(&server, &count_body("chat", "hi"), &[]).await;
    assert_eq!(status, 401, "no key: {json}");
    assert_eq!(json["error"]["type"], "authentication_error", "{json}");
    let (status, _, json) = count(&server, &count_body("chat", "hi"), &[("x-api-key", KEY)]).await;
    assert_eq!(status, 200, "the key's model: {json}");
    let (status, _, json) = count(&server, &count_body("meta/llama-3", "hi"), &[("x-api-key", KEY)]).await;
    assert_eq!(
        status, 403,
        "a model off the key's list, as /v1/messages refuses it: {json}"
    );
    assert_eq!(json["error"]["type"], "permission_error", "{json}");
}
