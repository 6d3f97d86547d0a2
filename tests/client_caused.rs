//! What the client's own request causes never counts against a route. A `max_tokens` that
//! ends the answer inside a tool call, and a tool schema that does not compile, are answered
//! as the client's error after at most one upstream attempt; a valid schema no answer can
//! meet fails the client's requests as invalid output, but opens no breaker. Before, each
//! such request failed over through every route as "invalid output", and a few of them
//! opened every route's breaker, so other clients got 503.

mod support;

use serde_json::{json, Value};
use support::*;

fn config() -> String {
    config_toml(
        &[("a", "openai", "fast-stable"), ("b", "anthropic", "fast-stable")],
        "[breaker]\nconsecutive_failures = 2\nmin_volume = 2\n",
    )
}

fn tool_request(parameters: Value, max_tokens: Option<u32>) -> Value {
    let mut body = json!({
        "model": "chat",
        "stream": true,
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [{"type": "function", "function": {"name": "weather", "parameters": parameters}}],
    });
    if let Some(n) = max_tokens {
        body["max_tokens"] = json!(n);
    }
    body
}

fn weather() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
}

fn upstream_requests(server: &tailcut::server::Running) -> usize {
    server.sim.as_ref().map(|s| s.log().len()).unwrap_or_default()
}

/// A plain request after the abuse: served, by the first route, with no failed attempt.
async fn still_served_by_a(server: &tailcut::server::Running) {
    let reply = post_sse(&server.url(""), &tool_request(weather(), None), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    let envelope = reply.envelope();
    assert_eq!(envelope["route"], "a", "the first route still serves: {}", reply.raw);
    assert_eq!(envelope["fell_back_from"], json!([]), "{}", reply.raw);
}

#[tokio::test]
async fn a_tool_call_cut_at_the_clients_max_tokens_is_the_clients_error_after_one_attempt_and_opens_no_breaker() {
    let server = start(&config()).await;
    for i in 0..6 {
        let before = upstream_requests(&server);
        let reply = post_sse(&server.url(""), &tool_request(weather(), Some(1)), &[]).await;
        // The route committed at the call's start (the role chunk is out), so the error is
        // in band: the dialect's error chunk with the request's class, not a 5xx.
        assert_eq!(reply.status, 200, "request {i}: {}", reply.raw);
        let error = reply
            .chunks()
            .into_iter()
            .find_map(|c| c.get("error").cloned())
            .unwrap_or(Value::Null);
        assert_eq!(error["type"], "invalid_request_error", "request {i}: {}", reply.raw);
        assert!(
            reply.raw.contains("max_tokens (1) ends the answer inside the call"),
            "says why and what to change: {}",
            reply.raw
        );
        assert!(
            !reply.raw.contains("\"arguments\""),
            "no fragment of the call reaches the client: {}",
            reply.raw
        );
        assert_eq!(
            upstream_requests(&server) - before,
            1,
            "request {i}: one attempt, no repair and no failover"
        );
    }
    let mut plain = tool_request(weather(), Some(1));
    plain["stream"] = json!(false);
    let resp = post_chat(&server, &plain).await;
    assert_eq!(
        resp.status().as_u16(),
        400,
        "non-streaming: the client's 400, not a 502 an SDK retries"
    );
    still_served_by_a(&server).await;
}

#[tokio::test]
async fn a_tool_schema_that_does_not_compile_is_a_400_before_any_attempt() {
    let server = start(&config()).await;
    for i in 0..6 {
        let reply = post_sse(&server.url(""), &tool_request(json!({"type": "objekt"}), None), &[]).await;
        assert_eq!(reply.status, 400, "request {i}: {}", reply.raw);
        let body: Value = serde_json::from_str(&reply.raw).unwrap_or(Value::Null);
        assert_eq!(body["error"]["code"], "invalid_tool_schema", "{}", reply.raw);
        assert_eq!(body["error"]["param"], "tools[0]", "{}", reply.raw);
    }
    assert_eq!(upstream_requests(&server), 0, "no attempt was made");
    still_served_by_a(&server).await;
}

#[tokio::test]
async fn a_tool_schema_nothing_satisfies_is_a_400_before_any_attempt() {
    let server = start(&config()).await;
    let unsatisfiable = [
        json!(false),
        json!({"not": {}}),
        json!({"type": "object", "properties": {"unit": {"enum": []}}, "required": ["unit"]}),
        json!({"type": "object", "properties": {"days": {"type": "integer", "minimum": 7, "maximum": 1}}, "required": ["days"]}),
    ];
    for schema in unsatisfiable {
        let reply = post_sse(&server.url(""), &tool_request(schema.clone(), None), &[]).await;
        assert_eq!(reply.status, 400, "{schema}: {}", reply.raw);
        let body: Value = serde_json::from_str(&reply.raw).unwrap_or(Value::Null);
        assert_eq!(body["error"]["code"], "invalid_tool_schema", "{}", reply.raw);
        assert_eq!(body["error"]["param"], "tools[0]", "{}", reply.raw);
    }
    assert_eq!(upstream_requests(&server), 0, "no attempt was made");
    still_served_by_a(&server).await;
}

#[tokio::test]
async fn tool_patterns_over_the_requests_regex_budget_are_a_400_naming_the_tool_before_any_attempt() {
    let server = start(&config()).await;
    // Each compiles to between 256 and 512 KiB: 32 of them get 256 KiB each of the
    // request's 8 MiB, so the first is over its share.
    let tools: Vec<Value> = (0..32)
        .map(|i| {
            json!({"type": "function", "function": {"name": format!("t{i}"), "parameters":
                {"type": "object", "properties": {"s": {"type": "string", "pattern": "^\\w{3000}x$"}}}}})
        })
        .collect();
    let mut body = tool_request(weather(), None);
    body["tools"] = json!(tools);
    let reply = post_sse(&server.url(""), &body, &[]).await;
    assert_eq!(reply.status, 400, "{}", reply.raw);
    let body: Value = serde_json::from_str(&reply.raw).unwrap_or(Value::Null);
    assert_eq!(body["error"]["code"], "pattern_budget_exceeded", "{}", reply.raw);
    assert_eq!(body["error"]["param"], "tools[0]", "{}", reply.raw);
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("tool \"t0\"") && message.contains("8 MiB"),
        "{message}"
    );
    assert_eq!(upstream_requests(&server), 0, "no attempt was made");
}

/// A valid schema no answer can meet: every answer fails it, on every route, but only the
/// client's own requests pay (each is repaired and failed over, then refused); no route's
/// breaker opens, so other clients are still served by the first route.
#[tokio::test]
async fn a_tool_schema_no_answer_can_meet_fails_only_its_own_requests() {
    let server = start(&config()).await;
    for i in 0..4 {
        // Its pattern allows one letter, its minLength two: nothing the edge tells apart
        // before asking (a bare `not: {}` is refused at once, test above).
        let never = json!({"type": "object", "properties": {"x": {"type": "string", "pattern": "^a$", "minLength": 2}}, "required": ["x"]});
        let reply = post_sse(&server.url(""), &tool_request(never, None), &[]).await;
        assert!(
            reply.raw.contains("do not match the tool's schema"),
            "request {i} fails on the schema: {}",
            reply.raw
        );
        assert!(
            !reply.raw.contains("\"arguments\""),
            "no invalid call reaches the client: {}",
            reply.raw
        );
    }
    still_served_by_a(&server).await;
}
