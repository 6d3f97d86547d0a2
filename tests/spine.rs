//! End-to-end over real sockets: the OpenAI SSE dialect over the simulated upstream, the
//! commit point, failover before the first token, drop = cancel, malformed upstreams.

mod support;

use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use support::*;
use tailcut::sim::SimEnd;

const QUICK: &str = r#"
[sim.scenarios.quick]
text = "Hello from the simulated upstream, streamed token by token."
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 1.0
"#;

#[tokio::test]
async fn sse_text_equals_the_upstream_text() {
    let server = start(&config_toml(&[("a", "openai", "quick")], QUICK)).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.status, 200, "body: {}", reply.raw);
    assert_eq!(
        reply.text(),
        "Hello from the simulated upstream, streamed token by token."
    );
    assert!(reply.done(), "a complete stream ends with [DONE]");
    assert!(
        !reply.raw.contains("\nid:") && !reply.raw.starts_with("id:"),
        "never an id: line to OpenAI clients"
    );
    assert!(!reply.raw.contains("event:"), "never an event: line to OpenAI clients");
    let chunks = reply.chunks();
    assert_eq!(
        chunks[0]["choices"][0]["delta"]["role"], "assistant",
        "role chunk first"
    );
    assert_eq!(
        chunks[0]["model"], "model-a",
        "model is the upstream model that served, not the alias"
    );
    assert_eq!(reply.headers["x-tailcut-route"], "a");
    let env = reply.envelope();
    assert_eq!(env["route"], "a", "envelope names the route: {env}");
    assert_eq!(env["level"], "L0");
    assert_eq!(env["attempts"], 1);
}

#[tokio::test]
async fn anthropic_wire_route_serves_an_openai_client() {
    let server = start(&config_toml(&[("a", "anthropic", "quick")], QUICK)).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.status, 200, "body: {}", reply.raw);
    assert_eq!(
        reply.text(),
        "Hello from the simulated upstream, streamed token by token."
    );
    assert!(reply.done());
}

#[tokio::test]
async fn non_streaming_request_gets_one_completion() {
    let server = start(&config_toml(&[("a", "openai", "quick")], QUICK)).await;
    let resp = post_chat(&server, &chat_body(false)).await;
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.expect("json");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Hello from the simulated upstream, streamed token by token."
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn tool_call_fragments_arrive_as_one_complete_call() {
    let extra = r#"
[sim.scenarios.tool]
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 1.0
tool_fragments = 14
tool_calls = [{ name = "get_weather", arguments = '{"city":"Paris \"centre\"","unit":"celsius","days":[1,2,3]}' }]
"#;
    let server = start(&config_toml(&[("a", "openai", "tool")], extra)).await;
    let body = json!({
        "model": "chat", "stream": true,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}, "days": {"type": "array"}},
            "required": ["city"]}}}]
    });
    let reply = post_sse(&server.url(""), &body, &[]).await;
    assert_eq!(reply.status, 200, "body: {}", reply.raw);
    let calls: Vec<_> = reply
        .chunks()
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(calls.len(), 1, "exactly one tool-call delta, whole: {calls:?}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: serde_json::Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().expect("arguments string"))
            .expect("valid JSON");
    assert_eq!(
        args,
        json!({"city": "Paris \"centre\"", "unit": "celsius", "days": [1, 2, 3]})
    );
    let finish = reply
        .chunks()
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str().map(str::to_string));
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    let log = server.sim.as_ref().expect("sim").log();
    assert!(
        log[0].tokens_sent >= 10 || log.len() == 1,
        "the upstream really sent fragments"
    );
}

#[tokio::test]
async fn first_route_503_before_any_token_falls_over_to_the_second() {
    let extra = format!("{QUICK}\n[sim.scenarios.down]\nfailure = {{ status = 503 }}\n");
    let server = start(&config_toml(
        &[("a", "openai", "down"), ("b", "openai", "quick")],
        &extra,
    ))
    .await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[("x-tailcut-hedge", "off")]).await;
    assert_eq!(reply.status, 200, "the client sees a success: {}", reply.raw);
    assert_eq!(reply.headers["x-tailcut-route"], "b");
    let env = reply.envelope();
    assert_eq!(env["route"], "b");
    assert_eq!(env["fell_back_from"][0]["route"], "a", "{env}");
    assert_eq!(env["fell_back_from"][0]["status"], 503, "{env}");
    assert_eq!(env["fell_back_from"][0]["class"], "unavailable", "{env}");
}

#[tokio::test]
async fn every_route_failing_is_a_real_http_error_with_retry_after() {
    let extra = "[sim.scenarios.limited]\nfailure = { status = 429, retry_after_s = 7 }\n";
    let server = start(&config_toml(
        &[("a", "openai", "limited"), ("b", "anthropic", "limited")],
        extra,
    ))
    .await;
    let resp = post_chat(&server, &chat_body(true)).await;
    assert_eq!(resp.status(), 429, "not a 200 with an error inside");
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!(
        (1..=7).contains(&retry),
        "retry-after from the upstream hint, got {retry}"
    );
    let body: serde_json::Value = resp.json().await.expect("JSON error body");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("a") && m.contains("b")),
        "{body}"
    );
}

#[tokio::test]
async fn every_route_503_is_a_503_or_502_with_json() {
    let extra = "[sim.scenarios.down]\nfailure = { status = 500 }\n";
    let server = start(&config_toml(&[("a", "openai", "down"), ("b", "openai", "down")], extra)).await;
    let resp = post_chat(&server, &chat_body(true)).await;
    assert_eq!(resp.status(), 502);
    let body: serde_json::Value = resp.json().await.expect("JSON error body");
    assert!(body["error"]["message"].is_string(), "{body}");
}

#[tokio::test]
async fn unknown_model_is_a_404_listing_known_models() {
    let server = start(&config_toml(&[("a", "openai", "quick")], QUICK)).await;
    let resp = post_chat(
        &server,
        &json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(resp.status(), 404, "an unknown model is a 404, as OpenAI answers it");
    let body: serde_json::Value = resp.json().await.expect("json");
    assert!(
        body["error"]["message"].as_str().is_some_and(|m| m.contains("chat")),
        "{body}"
    );
}

#[tokio::test]
async fn client_disconnect_closes_the_upstream_connection() {
    let extra = "[sim.scenarios.long]\nttft = { median_ms = 5.0, sigma = 0.0 }\ninter_token_ms = 20.0\ntokens = 2000\n";
    let server = start(&config_toml(&[("a", "openai", "long")], extra)).await;
    let resp = post_chat(&server, &chat_body(true)).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    for _ in 0..3 {
        body.next().await.expect("some bytes").expect("no error");
    }
    let dropped_at = tokio::time::Instant::now();
    drop(body);
    let log = wait_for_log(&server, "upstream closed", |log| {
        log.iter().any(|r| r.end == Some(SimEnd::ClientClosed))
    })
    .await;
    let ended = log[0].ended_at.expect("end recorded");
    let lag = ended.saturating_duration_since(dropped_at);
    assert!(
        lag < Duration::from_millis(100),
        "upstream closed {lag:?} after the client left"
    );
    assert!(log[0].tokens_sent < 2000, "the upstream did not finish the answer");
}

async fn one_route_with(failure: &str) -> (tailcut::server::Running, SseReply) {
    let extra = format!("[sim.scenarios.bad]\nttft = {{ median_ms = 5.0, sigma = 0.0 }}\ninter_token_ms = 1.0\ntokens = 8\nfailure = {{ {failure} }}\n");
    let toml = config_toml(&[("a", "openai", "bad")], &extra) + "[policies]\nprose = \"truncate\"\n";
    let server = start(&toml).await;
    let reply = tokio::time::timeout(
        Duration::from_secs(20),
        post_sse(&server.url(""), &chat_body(true), &[]),
    )
    .await
    .expect("no hang");
    (server, reply)
}

#[tokio::test]
async fn leading_bom_is_tolerated() {
    let (_s, reply) = one_route_with("bom = true").await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert!(reply.done(), "a BOM before the first event is harmless: {}", reply.raw);
}

#[tokio::test]
async fn invalid_utf8_mid_stream_is_a_classified_error() {
    let (_s, reply) = one_route_with("invalid_utf8_after_tokens = 3").await;
    assert_eq!(reply.status, 200, "committed before the bad bytes");
    assert!(!reply.done(), "never [DONE] after a broken upstream: {}", reply.raw);
    assert!(reply.raw.contains("\"error\""), "an in-band error: {}", reply.raw);
}

#[tokio::test]
async fn huge_line_is_a_classified_error_not_a_hang() {
    let (_s, reply) = one_route_with("huge_line_bytes = 10485760").await;
    assert!(!reply.done(), "{}", &reply.raw[..reply.raw.len().min(500)]);
}

#[tokio::test]
async fn eof_before_finish_reason_is_a_failure() {
    let (_s, reply) = one_route_with("eof_before_finish = true").await;
    assert!(
        !reply.done(),
        "an upstream that stopped early is not a complete answer: {}",
        reply.raw
    );
    assert!(reply.raw.contains("\"error\""), "{}", reply.raw);
}

#[tokio::test]
async fn eof_after_finish_reason_without_done_is_a_normal_end_with_usage() {
    let extra = "[sim.scenarios.nodone]\nttft = { median_ms = 5.0, sigma = 0.0 }\ninter_token_ms = 1.0\ntokens = 5\nfailure = { missing_done = true }\n";
    let server = start(&config_toml(&[("a", "openai", "nodone")], extra)).await;
    let mut body = chat_body(true);
    body["stream_options"] = json!({"include_usage": true});
    let reply = post_sse(&server.url(""), &body, &[]).await;
    assert_eq!(reply.status, 200);
    assert!(reply.done(), "tailcut's own stream completes: {}", reply.raw);
    let usage = reply
        .chunks()
        .iter()
        .find_map(|c| c.get("usage").filter(|u| !u.is_null()).cloned());
    assert!(
        usage.is_some_and(|u| u["completion_tokens"].as_u64().unwrap_or(0) > 0),
        "{}",
        reply.raw
    );
}
