//! One repair attempt, end to end over the simulated upstream: a tool call with invalid
//! arguments, or a structured answer not valid against its schema, goes back to the same
//! route once, the invalid output as the assistant's turn and the validator's error after
//! it, before the request moves to the next route; never for a side-effecting request; both
//! outcomes are counted per route. The invalid output never reaches the client.

mod recording;
mod support;

use recording::Recording;
use serde_json::{json, Value};
use support::*;

fn scenarios() -> Value {
    let quick = json!({"median_ms": 5.0, "sigma": 0.0});
    json!({
        "bad-args": {"ttft": quick, "inter_token_ms": 1.0, "tool_fragments": 2,
                     "tool_calls": [{"name": "weather", "arguments": "{\"city\": "}]},
        "good-args": {"ttft": quick, "inter_token_ms": 1.0, "tool_fragments": 2,
                      "tool_calls": [{"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}]},
        "bad-json": {"ttft": quick, "inter_token_ms": 1.0, "text": "{\"town\": \"Oslo\"}"},
        "good-json": {"ttft": quick, "inter_token_ms": 1.0, "text": "{\"city\": \"Oslo\"}"},
    })
}

fn config(rec: &Recording, prefix: &str, extra_a: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nsse_keepalive_ms = 600000\n\
         [[routes]]\nname = \"{prefix}-a\"\nprovider = \"openai\"\nbase_url = \"{}\"\nmodel = \"gpt-4o\"\nregion = \"eu\"\n{extra_a}\n\
         [[routes]]\nname = \"{prefix}-b\"\nprovider = \"openai\"\nbase_url = \"{}\"\nmodel = \"gpt-4o\"\nregion = \"eu\"\n\
         [models.chat]\nroutes = [\"{prefix}-a\", \"{prefix}-b\"]\n",
        rec.base_url(&format!("{prefix}-a"), "openai"),
        rec.base_url(&format!("{prefix}-b"), "openai"),
    )
}

fn tool_request() -> Value {
    json!({
        "model": "chat",
        "stream": true,
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [{"type": "function", "function": {
            "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }}]
    })
}

/// The tool calls' (name, arguments) the client received.
fn calls(reply: &SseReply) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for chunk in reply.chunks() {
        for c in chunk["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let index = c["index"].as_u64().unwrap_or(0) as usize;
            if out.len() <= index {
                out.push(Default::default());
            }
            out[index]
                .0
                .push_str(c["function"]["name"].as_str().unwrap_or_default());
            out[index]
                .1
                .push_str(c["function"]["arguments"].as_str().unwrap_or_default());
        }
    }
    out
}

fn last_message(body: &Value) -> Value {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or(Value::Null)
}

async fn repairs(server: &tailcut::server::Running, route: &str, outcome: &str) -> Option<String> {
    tailcut::telemetry::rotation::describe();
    let page = client()
        .get(server.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    let labels = format!("route=\"{route}\"");
    let outcome = format!("outcome=\"{outcome}\"");
    page.lines()
        .find(|l| l.starts_with("tailcut_repairs_total{") && l.contains(&labels) && l.contains(&outcome))
        .map(str::to_string)
}

#[tokio::test]
async fn invalid_tool_arguments_get_one_repair_on_the_same_route() {
    let rec = Recording::start(
        scenarios(),
        &[("r-a", &["bad-args", "good-args"]), ("r-b", &["good-args"])],
    )
    .await;
    let server = start(&config(&rec, "r", "")).await;
    let reply = post_sse(&server.url(""), &tool_request(), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(
        calls(&reply),
        [("weather".to_string(), "{\"city\": \"Oslo\"}".to_string())],
        "only the repaired, valid call reaches the client: {}",
        reply.raw
    );
    let env = reply.envelope();
    assert_eq!(env["route"], "r-a", "repaired on its own route: {env}");
    assert_eq!(env["repair"]["route"], "r-a");
    assert_eq!(env["repair"]["outcome"], "repaired", "{env}");
    let seen = rec.seen("r-a");
    assert_eq!(seen.len(), 2, "the first answer and its repair");
    assert!(rec.seen("r-b").is_empty(), "the next route was never needed");
    let ask = last_message(&seen[1]);
    let text = ask["content"].as_str().unwrap_or_default();
    assert_eq!(ask["role"], "user", "{ask}");
    assert!(
        text.contains("failed validation") && text.contains("weather") && text.contains("not a JSON object"),
        "the validator's error goes back: {text}"
    );
    let turns = seen[1]["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(turns.len(), 3, "request, invalid answer, error: {turns:?}");
    assert_eq!(turns[1]["role"], "assistant", "{turns:?}");
    assert_eq!(
        turns[1]["content"].as_str().unwrap_or_default(),
        "Tool call weather with arguments: {\"city\": ",
        "the invalid call itself goes back as the assistant's turn"
    );
    assert_eq!(
        seen[1]["messages"][0], seen[0]["messages"][0],
        "the repair carries the original request"
    );
    let counted = repairs(&server, "r-a", "repaired").await;
    assert!(counted.as_deref().is_some_and(|l| l.ends_with(" 1")), "{counted:?}");
}

#[tokio::test]
async fn a_failed_repair_moves_to_the_next_route() {
    let rec = Recording::start(scenarios(), &[("f-a", &["bad-args"]), ("f-b", &["good-args"])]).await;
    let server = start(&config(&rec, "f", "")).await;
    let reply = post_sse(&server.url(""), &tool_request(), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(calls(&reply).len(), 1, "{}", reply.raw);
    let env = reply.envelope();
    assert_eq!(env["route"], "f-b", "{env}");
    assert_eq!(env["repair"]["outcome"], "failed", "{env}");
    assert_eq!(
        (rec.seen("f-a").len(), rec.seen("f-b").len()),
        (2, 1),
        "one repair, then the next route"
    );
    assert_eq!(
        rec.seen("f-b")[0]["messages"].as_array().map(Vec::len),
        Some(1),
        "the next route gets the client's request, not the repair"
    );
    let counted = repairs(&server, "f-a", "failed").await;
    assert!(counted.as_deref().is_some_and(|l| l.ends_with(" 1")), "{counted:?}");
}

#[tokio::test]
async fn a_side_effecting_request_is_never_repaired() {
    let rec = Recording::start(
        scenarios(),
        &[("s-a", &["bad-args", "good-args"]), ("s-b", &["good-args"])],
    )
    .await;
    let server = start(&config(&rec, "s", "side_effecting = true")).await;
    let reply = post_sse(&server.url(""), &tool_request(), &[]).await;
    let env = reply.envelope();
    assert!(env.get("repair").is_none(), "{env}");
    assert_eq!(rec.seen("s-a").len(), 1, "the invalid answer is not sent back");
}

fn structured_request() -> Value {
    json!({
        "model": "chat",
        "stream": true,
        "messages": [{"role": "user", "content": "Where? As JSON."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "place", "schema":
            {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}
    })
}

/// The text the client received.
fn text(reply: &SseReply) -> String {
    reply
        .chunks()
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn a_structured_answer_invalid_for_its_schema_is_repaired_on_the_same_route() {
    let rec = Recording::start(
        scenarios(),
        &[("j-a", &["bad-json", "good-json"]), ("j-b", &["good-json"])],
    )
    .await;
    let server = start(&config(&rec, "j", "")).await;
    let reply = post_sse(&server.url(""), &structured_request(), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(
        text(&reply),
        "{\"city\": \"Oslo\"}",
        "only the repaired answer reaches the client, never the invalid one: {}",
        reply.raw
    );
    let deltas = reply
        .chunks()
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .count();
    assert_eq!(
        deltas, 1,
        "a structured answer is held and sent whole, as one delta: {}",
        reply.raw
    );
    let env = reply.envelope();
    assert_eq!(
        (env["route"].as_str(), env["repair"]["outcome"].as_str()),
        (Some("j-a"), Some("repaired")),
        "{env}"
    );
    let seen = rec.seen("j-a");
    assert_eq!(seen.len(), 2, "the first answer and its repair");
    assert!(rec.seen("j-b").is_empty(), "the next route was never needed");
    let turns = seen[1]["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(turns.len(), 3, "{turns:?}");
    assert_eq!(
        (turns[1]["role"].as_str(), turns[1]["content"].as_str()),
        (Some("assistant"), Some("{\"town\": \"Oslo\"}")),
        "the invalid answer goes back as the assistant's turn"
    );
    let error = turns[2]["content"].as_str().unwrap_or_default();
    assert!(
        error.contains("does not match the response format's schema") && error.contains("city"),
        "then the validator's error: {error}"
    );
    let counted = repairs(&server, "j-a", "repaired").await;
    assert!(counted.as_deref().is_some_and(|l| l.ends_with(" 1")), "{counted:?}");
}

#[tokio::test]
async fn a_structured_answer_that_stays_invalid_moves_to_the_next_route() {
    let rec = Recording::start(scenarios(), &[("k-a", &["bad-json"]), ("k-b", &["good-json"])]).await;
    let server = start(&config(&rec, "k", "")).await;
    let reply = post_sse(&server.url(""), &structured_request(), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(text(&reply), "{\"city\": \"Oslo\"}", "{}", reply.raw);
    let env = reply.envelope();
    assert_eq!(env["route"], "k-b", "{env}");
    assert_eq!(env["repair"]["outcome"], "failed", "{env}");
    assert_eq!(
        (rec.seen("k-a").len(), rec.seen("k-b").len()),
        (2, 1),
        "one repair, then the next route"
    );
    let counted = repairs(&server, "k-a", "failed").await;
    assert!(counted.as_deref().is_some_and(|l| l.ends_with(" 1")), "{counted:?}");
}

#[tokio::test]
async fn a_side_effecting_structured_request_is_never_repaired() {
    let rec = Recording::start(
        scenarios(),
        &[("t-a", &["bad-json", "good-json"]), ("t-b", &["good-json"])],
    )
    .await;
    let server = start(&config(&rec, "t", "side_effecting = true")).await;
    let reply = post_sse(&server.url(""), &structured_request(), &[]).await;
    let env = reply.envelope();
    assert!(env.get("repair").is_none(), "{env}");
    assert_eq!(rec.seen("t-a").len(), 1, "the invalid answer is not sent back");
    assert!(
        !text(&reply).contains("town"),
        "the invalid answer never reaches the client: {}",
        reply.raw
    );
}
