//! What tailcut says about a model without running it, end to end over loopback:
//! `GET /v1/models/{id}` (a model name may hold `/`; a model the key may not use is the same
//! 404 as one that does not exist).

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
