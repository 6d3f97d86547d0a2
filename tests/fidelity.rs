//! Cross-wire fidelity: a route of another wire than the client's is not eligible for what
//! the answer depends on (logprobs, signed thinking, documents), so such a request is served
//! by a route of the client's wire or refused with a 400 that names the field; and what a
//! cross-wire route drops of the rest is listed in the envelope's `dropped`.

mod support;

use serde_json::{json, Value};
use support::{client, start};
use tailcut::server::Running;

const CONFIG: &str = "[server]\nlisten = \"127.0.0.1:0\"\nsse_keepalive_ms = 600000\ndrain_grace_ms = 0\n\
    [sim]\nlisten = \"127.0.0.1:0\"\n\
    [sim.scenarios.quick]\nttft = { median_ms = 1.0, sigma = 0.0 }\ninter_token_ms = 0.0\n\
    [[routes]]\nname = \"oa\"\nprovider = \"simulated\"\nwire = \"openai\"\nscenario = \"quick\"\nmodel = \"up-gpt\"\nlevel = \"L1\"\n\
    [[routes]]\nname = \"an\"\nprovider = \"simulated\"\nwire = \"anthropic\"\nscenario = \"quick\"\nmodel = \"up-claude\"\nlevel = \"L0\"\n\
    [models.anthropic-only]\nroutes = [\"an\"]\n[models.openai-only]\nroutes = [\"oa\"]\n\
    [models.both]\nroutes = [\"an\", \"oa\"]\n\
    [[routes]]\nname = \"o4\"\nprovider = \"simulated\"\nwire = \"openai\"\nscenario = \"quick\"\nmodel = \"o4-mini\"\nlevel = \"L0\"\n\
    [models.reasoning]\nroutes = [\"o4\"]\n[models.reasoning-or-not]\nroutes = [\"o4\", \"oa\"]\n";

/// POSTs `body` to `path` (an Anthropic version header on every request): status and JSON.
async fn post(server: &Running, path: &str, body: Value) -> (u16, Value) {
    let resp = client()
        .post(server.url(path))
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn openai(server: &Running, body: Value) -> (u16, Value) {
    post(server, "/v1/chat/completions", body).await
}

async fn anthropic(server: &Running, body: Value) -> (u16, Value) {
    post(server, "/v1/messages", body).await
}

fn hi() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

#[tokio::test]
async fn logprobs_are_served_by_an_openai_route_or_refused_naming_them() {
    let server = start(CONFIG).await;
    // The Anthropic route ranks first, but cannot return log-probabilities.
    let (status, body) = openai(&server, json!({"model": "both", "messages": hi(), "logprobs": true})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["tailcut"]["route"], "oa", "{body}");
    // Without logprobs the first rung serves.
    let (_, body) = openai(&server, json!({"model": "both", "messages": hi()})).await;
    assert_eq!(body["tailcut"]["route"], "an", "{body}");
    // No route of the client's wire: a 400 that names the field and the route's reason.
    let (status, body) = openai(
        &server,
        json!({"model": "anthropic-only", "messages": hi(), "logprobs": true}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("logprobs") && message.contains("an"), "{message}");
}

#[tokio::test]
async fn fields_a_cross_wire_route_does_not_receive_are_listed_in_the_envelope() {
    let server = start(CONFIG).await;
    let (status, body) = openai(
        &server,
        json!({"model": "anthropic-only", "messages": hi(), "store": true, "user": "u-1", "temperature": 0.5}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["tailcut"]["dropped"], json!(["store"]), "user is mapped: {body}");
    // The same request to a route of its own wire loses nothing.
    let (_, body) = openai(
        &server,
        json!({"model": "openai-only", "messages": hi(), "store": true}),
    )
    .await;
    assert_eq!(body["tailcut"].get("dropped"), None, "{body}");
}

#[tokio::test]
async fn anthropic_thinking_and_documents_need_an_anthropic_route() {
    let server = start(CONFIG).await;
    let thinking = json!({"type": "enabled", "budget_tokens": 1024});
    let (status, body) = anthropic(
        &server,
        json!({"model": "openai-only", "max_tokens": 2048, "thinking": thinking, "messages": hi()}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("thinking")),
        "{body}"
    );
    let document = json!([{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "A note."}},
        {"type": "text", "text": "Summarise it."}
    ]}]);
    let (status, body) = anthropic(
        &server,
        json!({"model": "openai-only", "max_tokens": 64, "messages": document}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("document")),
        "{body}"
    );
    let (status, body) = anthropic(
        &server,
        json!({"model": "both", "max_tokens": 64, "messages": document}),
    )
    .await;
    assert_eq!(status, 200, "a route of its own wire takes it: {body}");
    assert_eq!(body["tailcut"]["route"], "an");
}

#[tokio::test]
async fn a_field_the_routes_model_refuses_makes_it_ineligible_and_one_it_drops_is_noted() {
    let server = start(CONFIG).await;
    // o4-mini returns no logprobs: the route after it serves.
    let ask = |model: &str| json!({"model": model, "messages": hi(), "logprobs": true, "max_completion_tokens": 50});
    let (status, body) = openai(&server, ask("reasoning-or-not")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["tailcut"]["route"], "oa", "{body}");
    let (status, body) = openai(&server, ask("reasoning")).await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("refuses logprobs"), "{message}");
    // A sampling field a reasoning model refuses changes no answer's meaning: not sent, noted.
    let (status, body) = openai(
        &server,
        json!({"model": "reasoning", "messages": hi(), "temperature": 0.3, "max_completion_tokens": 50}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["tailcut"]["dropped"], json!(["temperature"]), "{body}");
}

/// The body the simulated upstream received last.
fn last_body(server: &Running) -> Value {
    let log = server.sim.as_ref().map(|s| s.log()).unwrap_or_default();
    log.iter()
        .rev()
        .find_map(|r| r.body.as_deref().and_then(|b| serde_json::from_str(b).ok()))
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn reasoning_effort_user_and_serial_tools_are_mapped_to_an_anthropic_route() {
    let server = start(CONFIG).await;
    let (status, body) = openai(
        &server,
        json!({"model": "anthropic-only", "messages": hi(), "reasoning_effort": "medium", "user": "u-7",
               "temperature": 0.3, "max_completion_tokens": 3000}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let sent = last_body(&server);
    assert_eq!(
        sent["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048}),
        "{sent}"
    );
    assert_eq!(sent["metadata"], json!({"user_id": "u-7"}), "{sent}");
    assert_eq!(
        sent.get("temperature"),
        None,
        "thinking takes no other temperature: {sent}"
    );
    assert_eq!(body["tailcut"]["dropped"], json!(["temperature"]), "{body}");
    let reasoning = body["choices"][0]["message"]["reasoning_content"]
        .as_str()
        .unwrap_or_default();
    assert!(
        !reasoning.is_empty(),
        "the route's thinking comes back as reasoning_content: {body}"
    );
    // A budget Anthropic cannot take (max_tokens too small for its 1024 minimum): no thinking,
    // and the effort is dropped with a note.
    let (_, body) = openai(
        &server,
        json!({"model": "anthropic-only", "messages": hi(), "reasoning_effort": "high", "max_tokens": 500}),
    )
    .await;
    assert_eq!(last_body(&server).get("thinking"), None);
    assert_eq!(body["tailcut"]["dropped"], json!(["reasoning_effort"]), "{body}");
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let (status, body) = openai(
        &server,
        json!({"model": "anthropic-only", "messages": hi(), "tools": tools, "parallel_tool_calls": false}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        last_body(&server)["tool_choice"],
        json!({"type": "auto", "disable_parallel_tool_use": true})
    );
}

#[tokio::test]
async fn an_anthropic_clients_user_id_is_an_openai_routes_user() {
    let server = start(CONFIG).await;
    let (status, body) = anthropic(
        &server,
        json!({"model": "openai-only", "max_tokens": 64, "metadata": {"user_id": "u-9"}, "messages": hi()}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(last_body(&server)["user"], "u-9");
    assert_eq!(body["tailcut"].get("dropped"), None, "{body}");
}
