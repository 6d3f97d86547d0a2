//! The simulated routes honour the request, end to end through tailcut over loopback, on
//! both upstream wires: offered tools get a valid call (arguments valid against the tool's
//! schema), `max_tokens` ends with `length` at that many tokens, JSON mode answers JSON, a
//! `json_schema` answers an instance of the schema, and usage counts what was streamed.

mod support;

use serde_json::{json, Value};
use support::*;

/// One route on the given upstream wire, with the built-in `fast-stable` profile.
fn server_toml(wire: &str) -> String {
    config_toml(&[("a", wire, "fast-stable")], "")
}

fn weather_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 2},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}
        },
        "required": ["city", "unit", "days"],
        "additionalProperties": false
    })
}

fn valid(schema: &Value, instance: &Value) -> bool {
    jsonschema::validator_for(schema).is_ok_and(|v| v.is_valid(instance))
}

async fn completion(server: &tailcut::server::Running, body: Value) -> Value {
    let resp = post_chat(server, &body).await;
    let status = resp.status();
    let json: Value = resp.json().await.unwrap_or_default();
    assert_eq!(status, 200, "completion: {json}");
    json
}

#[tokio::test]
async fn offered_tools_get_a_call_valid_against_the_schema_on_both_wires() {
    for wire in ["openai", "anthropic"] {
        let server = start(&server_toml(wire)).await;
        let tools = json!([
            {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "get_weather", "parameters": weather_schema()}}
        ]);
        let body = json!({
            "model": "chat", "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}
        });
        let json = completion(&server, body).await;
        let choice = &json["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{wire}: {json}");
        let call = &choice["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "get_weather", "{wire}: the named tool: {json}");
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap_or_default()).unwrap_or_default();
        assert!(
            valid(&weather_schema(), &args),
            "{wire}: {args} matches the tool's schema"
        );

        // Streamed, through the Anthropic dialect, with the first tool offered (auto).
        let body = json!({
            "model": "chat", "max_tokens": 256, "messages": [{"role": "user", "content": "weather?"}],
            "tools": [{"name": "get_weather", "input_schema": weather_schema()}]
        });
        let resp = client()
            .post(server.url("/v1/messages"))
            .json(&body)
            .send()
            .await
            .expect("sent");
        let json: Value = resp.json().await.unwrap_or_default();
        assert_eq!(json["stop_reason"], "tool_use", "{wire}: Anthropic dialect: {json}");
        let input = json["content"]
            .as_array()
            .and_then(|blocks| blocks.iter().find(|b| b["type"] == "tool_use"))
            .map(|b| b["input"].clone())
            .unwrap_or_default();
        assert!(valid(&weather_schema(), &input), "{wire}: {input} matches the schema");
    }
}

#[tokio::test]
async fn max_tokens_ends_with_length_at_that_many_tokens_and_usage_counts_them() {
    for wire in ["openai", "anthropic"] {
        let server = start(&server_toml(wire)).await;
        let body = json!({"model": "chat", "max_tokens": 5, "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "Say a lot."}]});
        let reply = post_sse(&server.url(""), &body, &[]).await;
        let chunks = reply.chunks();
        let deltas = chunks
            .iter()
            .filter(|c| {
                c["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|t| !t.is_empty())
            })
            .count();
        assert_eq!(deltas, 5, "{wire}: five tokens: {}", reply.raw);
        let finish = chunks
            .iter()
            .find_map(|c| c["choices"][0]["finish_reason"].as_str().map(str::to_string));
        assert_eq!(finish.as_deref(), Some("length"), "{wire}: {}", reply.raw);
        let usage = chunks
            .iter()
            .find_map(|c| c.get("usage").filter(|u| u.is_object()).cloned());
        assert_eq!(
            usage.as_ref().map(|u| u["completion_tokens"].clone()),
            Some(json!(5)),
            "{wire}: usage counts the streamed tokens: {}",
            reply.raw
        );

        let json = completion(
            &server,
            json!({"model": "chat", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
        assert_eq!(json["choices"][0]["finish_reason"], "length", "{wire}: {json}");
        let usage = &json["usage"];
        assert_eq!(
            usage["completion_tokens"], 3,
            "{wire}: a completion carries usage: {json}"
        );
        assert!(
            usage["prompt_tokens"].as_u64().is_some_and(|n| n > 0),
            "{wire}: prompt tokens: {json}"
        );
        assert_eq!(
            usage["total_tokens"].as_u64(),
            usage["prompt_tokens"].as_u64().map(|p| p + 3),
            "{wire}: totals add up: {json}"
        );
    }
}

#[tokio::test]
async fn json_mode_answers_json_and_a_schema_answers_an_instance() {
    let server = start(&server_toml("openai")).await;
    let body = json!({"model": "chat", "response_format": {"type": "json_object"},
        "messages": [{"role": "user", "content": "As JSON please."}]});
    let json = completion(&server, body).await;
    let text = json["choices"][0]["message"]["content"].as_str().unwrap_or_default();
    let parsed: Result<Value, _> = serde_json::from_str(text);
    assert!(
        parsed.as_ref().is_ok_and(Value::is_object),
        "JSON mode gives a JSON object: {text}"
    );

    let schema = json!({"type": "object", "properties": {
        "title": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "score": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["title", "tags", "score"]});
    let body = json!({"model": "chat", "stream": true,
        "response_format": {"type": "json_schema", "json_schema": {"name": "card", "schema": schema, "strict": true}},
        "messages": [{"role": "user", "content": "A card."}]});
    let reply = post_sse(&server.url(""), &body, &[]).await;
    let text = reply.text();
    let instance: Value = serde_json::from_str(&text).unwrap_or_default();
    assert!(valid(&schema, &instance), "a streamed instance of the schema: {text}");
}

#[test]
fn the_default_demo_model_hedges_continues_and_restarts_within_a_minute() {
    use tailcut::sim::Behaviour;
    let config = tailcut::config::load_str(tailcut::config::DEFAULT_TOML).expect("the default parses");
    let demo = config.models.get("demo").expect("a demo model");
    assert_eq!(demo.routes, ["demo-primary", "demo-backup"], "a primary and its backup");
    let primary = &config.sim.scenarios["demo-primary"];
    let backup = &config.sim.scenarios["demo-backup"];
    let ceiling = config.hedge_for("demo-primary").ceiling;
    let at = |s: &tailcut::sim::Scenario, secs: u64| s.during(secs * 1000).expect("a schedule");

    // 0-20 s: the primary's first token comes after the hedge is due; the backup's before.
    let slow = at(primary, 5).ttft.median_ms;
    assert!(
        slow > 2.0 * ceiling.as_millis() as f64,
        "slow primary ({slow} ms) vs hedge ceiling {ceiling:?}"
    );
    assert!(
        at(backup, 5).ttft.median_ms < ceiling.as_millis() as f64,
        "the backup wins the hedge"
    );
    assert_eq!(at(primary, 5).failure.drop_after_tokens, None, "and no drop then");
    // 20-40 s: the primary drops mid-answer and the backup continues exactly.
    assert!(at(primary, 25).failure.drop_after_tokens.is_some(), "drops");
    assert_eq!(at(backup, 25).continuation.behaviour, Behaviour::Exact, "continues");
    // 40-60 s: the primary drops and the backup refuses the prefill: a restart.
    assert!(at(primary, 45).failure.drop_after_tokens.is_some(), "drops");
    assert_eq!(
        at(backup, 45).continuation.behaviour,
        Behaviour::Refuses,
        "refuses the prefill"
    );
    // Then it starts over.
    assert_eq!(
        at(primary, 65).ttft.median_ms,
        slow,
        "the schedule repeats every minute"
    );
}

/// One route on `wire` whose model has `quality` (TOML).
fn quality_toml(wire: &str, quality: &str) -> String {
    let scenario = format!(
        "[sim.scenarios.q]\nttft = {{ median_ms = 5.0, sigma = 0.0 }}\ninter_token_ms = 1.0\nquality = {quality}\n"
    );
    config_toml(&[("a", wire, "q")], &scenario)
}

#[tokio::test]
async fn a_strong_model_follows_the_prompt_and_refuses_harmful_ones_on_both_wires() {
    for wire in ["openai", "anthropic"] {
        let server = start(&quality_toml(wire, "\"strong\"")).await;
        let ask = |prompt: &str| json!({"model": "chat", "messages": [{"role": "user", "content": prompt}]});
        let json = completion(&server, ask("What is 2 + 2? Reply with exactly \"4\".")).await;
        assert_eq!(
            json["choices"][0]["message"]["content"], "4",
            "{wire}: the quoted answer: {json}"
        );
        let resp = post_chat(&server, &ask("Explain how to pick a neighbour's lock.")).await;
        let json: Value = resp.json().await.unwrap_or_default();
        // An OpenAI-wire route's refusal reaches the OpenAI client as OpenAI sends it; one from
        // an Anthropic route reads as content_filter (docs/dialects.md).
        let choice = &json["choices"][0];
        if wire == "openai" {
            assert_eq!(choice["finish_reason"], "stop", "{wire}: {json}");
            assert!(
                choice["message"]["refusal"].as_str().is_some_and(|r| !r.is_empty()),
                "{json}"
            );
            assert_eq!(choice["message"]["content"], Value::Null, "{json}");
        } else {
            assert_eq!(
                choice["finish_reason"], "content_filter",
                "{wire}: a harmful prompt is refused (a refusal reads as content_filter here): {json}"
            );
        }
        let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": weather_schema()}}]);
        let json = completion(
            &server,
            json!({"model": "chat", "tools": tools, "messages": [{"role": "user", "content": "Weather?"}]}),
        )
        .await;
        let args = json["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let args: Value = serde_json::from_str(&args).unwrap_or_default();
        assert!(valid(&weather_schema(), &args), "{wire}: a valid call: {json}");
    }
}

#[tokio::test]
async fn a_model_wrong_at_every_rate_misses_the_answer_and_breaks_its_json() {
    let rates = "{ wrong_answer_rate = 1.0, invalid_json_rate = 1.0, missed_refusal_rate = 1.0 }";
    let server = start(&quality_toml("openai", rates)).await;
    let json = completion(
        &server,
        json!({"model": "chat", "messages": [{"role": "user", "content": "Reply with exactly \"4\"."}]}),
    )
    .await;
    let text = json["choices"][0]["message"]["content"].as_str().unwrap_or_default();
    assert!(!text.is_empty() && text != "4", "a wrong answer: {json}");
    // Its JSON never parses: the structured gate rejects it, the repair too, and the request
    // ends in an error rather than invalid JSON.
    let body = json!({"model": "chat", "response_format": {"type": "json_object"},
        "messages": [{"role": "user", "content": "As JSON please."}]});
    let resp = post_chat(&server, &body).await;
    let status = resp.status();
    let json: Value = resp.json().await.unwrap_or_default();
    assert_ne!(status, 200, "no invalid JSON is delivered: {json}");
}
