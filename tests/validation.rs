//! Strict request validation, end to end over loopback: every bad `x-tailcut-*` header is
//! refused (HTTP and the WebSocket upgrade alike), a message without `content` is a 400
//! naming its key path, the request cost bounds (`[server] max_messages`,
//! `max_decoded_bytes`) refuse bodies that would decode into far more than they weigh, and
//! sampling parameters are held to the ranges each real API accepts.

mod support;

use serde_json::{json, Value};
use support::*;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

fn quick(server_extra: &str) -> String {
    let toml = config_toml(&[("a", "openai", "quick")], "[sim.scenarios.quick]\ntext = \"fine\"\n");
    toml.replacen("[server]\n", &format!("[server]\n{server_extra}\n"), 1)
}

async fn post(server: &tailcut::server::Running, path: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = client().post(server.url(path)).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn message_text(json: &Value) -> String {
    json["error"]["message"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn a_hedge_header_other_than_on_or_off_is_a_400_naming_it() {
    let server = start(&quick("")).await;
    let (status, json) = post(
        &server,
        "/v1/chat/completions",
        &chat_body(false),
        &[("x-tailcut-hedge", "maybe")],
    )
    .await;
    assert_eq!(status, 400, "maybe is refused: {json}");
    assert!(
        message_text(&json).contains("x-tailcut-hedge") && message_text(&json).contains("maybe"),
        "the message names the header and the value: {json}"
    );
    for ok in ["on", "off", "true", "false", "1", "0", "yes", "no", "OFF"] {
        let (status, json) = post(
            &server,
            "/v1/chat/completions",
            &chat_body(false),
            &[("x-tailcut-hedge", ok)],
        )
        .await;
        assert_eq!(status, 200, "x-tailcut-hedge: {ok} is accepted: {json}");
    }
}

#[tokio::test]
async fn every_refused_header_is_a_400_whose_param_names_it() {
    let server = start(&quick("")).await;
    for headers in [
        vec![("x-tailcut-hedge", "maybe")],
        vec![("x-tailcut-response-type", "poem")],
        vec![("x-tailcut-deadline-ms", "soon")],
        vec![("x-tailcut-priority", "urgent")],
        vec![("x-tailcut-tenant", "nobody")],
        vec![("x-tailcut-region", "eu"), ("x-tailcut-region", "us")],
    ] {
        let name = headers[0].0;
        let (status, json) = post(&server, "/v1/chat/completions", &chat_body(false), &headers).await;
        assert_eq!(status, 400, "{headers:?}: {json}");
        assert_eq!(json["error"]["param"], name, "{headers:?}: {json}");
    }
}

#[tokio::test]
async fn the_websocket_upgrade_refuses_a_bad_hedge_header_too() {
    let server = start(&quick("")).await;
    let url = server.url("/v1/ws").replacen("http://", "ws://", 1);
    let mut req = url.into_client_request().expect("ws request");
    req.headers_mut()
        .insert("x-tailcut-hedge", "maybe".parse().expect("header value"));
    let refused = tokio_tungstenite::connect_async(req).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 400, "the upgrade is a 400")
        }
        Err(e) => panic!("expected an HTTP 400 refusal, got {e}"),
        Ok(_) => panic!("the upgrade with x-tailcut-hedge: maybe was accepted"),
    }
}

#[tokio::test]
async fn a_message_without_content_is_a_400_naming_its_path() {
    let server = start(&quick("")).await;
    let body = json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}, {"role": "user"}]});
    let (status, json) = post(&server, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(status, 400, "OpenAI: {json}");
    assert_eq!(json["error"]["param"], "messages[1].content", "OpenAI param: {json}");
    assert!(
        message_text(&json).contains("messages[1].content"),
        "OpenAI message: {json}"
    );

    let body = json!({"model": "chat", "max_tokens": 8, "messages": [{"role": "user"}]});
    let (status, json) = post(&server, "/v1/messages", &body, &[]).await;
    assert_eq!(status, 400, "Anthropic: {json}");
    assert!(
        message_text(&json).contains("messages.0.content"),
        "Anthropic message: {json}"
    );

    // An assistant turn that only calls tools needs no content.
    let body = json!({"model": "chat", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    ]});
    let (status, json) = post(&server, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(
        status, 200,
        "a tool-calling assistant turn without content is fine: {json}"
    );
}

fn many_messages(n: usize, anthropic: bool) -> Value {
    let messages: Vec<Value> = (0..n).map(|_| json!({"role": "user", "content": "x"})).collect();
    if anthropic {
        json!({"model": "chat", "max_tokens": 8, "messages": messages})
    } else {
        json!({"model": "chat", "messages": messages})
    }
}

#[tokio::test]
async fn too_many_messages_is_a_400_naming_the_limit_in_both_dialects() {
    let server = start(&quick("max_messages = 100")).await;
    for (path, anthropic) in [("/v1/chat/completions", false), ("/v1/messages", true)] {
        let (status, json) = post(&server, path, &many_messages(100, anthropic), &[]).await;
        assert_eq!(status, 200, "{path}: 100 messages fit: {json}");
        let (status, json) = post(&server, path, &many_messages(101, anthropic), &[]).await;
        assert_eq!(status, 400, "{path}: 101 do not: {json}");
        assert!(
            message_text(&json).contains("server.max_messages"),
            "{path}: names the limit: {json}"
        );
    }
    let (_, json) = post(&server, "/v1/chat/completions", &many_messages(101, false), &[]).await;
    assert_eq!(json["error"]["code"], "max_messages_exceeded", "OpenAI code: {json}");
    let log = server.sim.as_ref().map(|s| s.log()).unwrap_or_default();
    assert_eq!(log.len(), 2, "only the requests within the limit reached the upstream");
}

#[tokio::test]
async fn a_body_that_decodes_past_the_limit_is_a_400_naming_it() {
    let server = start(&quick("max_decoded_bytes = 65536")).await;
    // 20,000 zeros: 40 kB of body, over a megabyte once every value is counted.
    let mut body = chat_body(false);
    body["metadata"] = json!({"k": vec![0; 20_000]});
    let (status, json) = post(&server, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(status, 400, "refused: {json}");
    assert_eq!(json["error"]["code"], "max_decoded_bytes_exceeded", "code: {json}");
    assert!(
        message_text(&json).contains("server.max_decoded_bytes"),
        "names the limit: {json}"
    );
    let (status, json) = post(&server, "/v1/chat/completions", &chat_body(false), &[]).await;
    assert_eq!(status, 200, "an ordinary request passes: {json}");
}

#[tokio::test]
async fn a_temperature_out_of_the_dialects_range_is_a_400_naming_it() {
    let server = start(&quick("")).await;
    let mut body = chat_body(false);
    body["temperature"] = json!(5);
    let (status, json) = post(&server, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(status, 400, "5 is over OpenAI's 2: {json}");
    assert_eq!(
        (&json["error"]["param"], &json["error"]["code"]),
        (&json!("temperature"), &json!("decimal_above_max_value")),
        "{json}"
    );
    assert_eq!(
        message_text(&json),
        "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 5 instead.",
        "OpenAI's own words"
    );

    let anthropic = |t: Value| json!({"model": "chat", "max_tokens": 8, "temperature": t, "messages": [{"role": "user", "content": "hi"}]});
    body["temperature"] = json!(1.5);
    let (status, json) = post(&server, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(status, 200, "1.5 is within OpenAI's range: {json}");
    let (status, json) = post(&server, "/v1/messages", &anthropic(json!(1.5)), &[]).await;
    assert_eq!(status, 400, "1.5 is over Anthropic's 1: {json}");
    assert_eq!(
        (&json["type"], &json["error"]["type"]),
        (&json!("error"), &json!("invalid_request_error")),
        "Anthropic's error body: {json}"
    );
    assert_eq!(message_text(&json), "temperature: range: 0..1", "Anthropic's own words");

    body["temperature"] = json!(2);
    let (status, json) = post(&server, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(status, 200, "OpenAI's maximum itself passes: {json}");
    let (status, json) = post(&server, "/v1/messages", &anthropic(json!(1)), &[]).await;
    assert_eq!(status, 200, "Anthropic's maximum itself passes: {json}");
    let log = server.sim.as_ref().map(|s| s.log()).unwrap_or_default();
    assert_eq!(log.len(), 3, "only the requests within range reached the upstream");
}
