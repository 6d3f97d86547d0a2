//! Continuity end to end: every envelope carries the `state_hash` of the client's history,
//! and the route that takes over after a failover or a mid-stream switch received the
//! whole history: the body the simulated upstream was sent, decoded again, hashes to the
//! client's state hash, whichever wire the route speaks.

mod recording;
mod support;

use recording::Recording;
use serde_json::{json, Value};
use support::*;
use tailcut::types::{state_hash, ChatRequest, Role};

const ANSWER: &str = "one two three four five six seven eight";

fn scenarios() -> Value {
    let quick = json!({"median_ms": 5.0, "sigma": 0.0});
    json!({
        "down": {"failure": {"status": 503}},
        "ok": {"text": ANSWER, "ttft": quick, "inter_token_ms": 1.0},
        "drop": {"text": ANSWER, "ttft": quick, "inter_token_ms": 1.0, "failure": {"drop_after_tokens": 3}},
    })
}

/// Route `a` (OpenAI wire) first, then `b` (Anthropic wire, which can continue a prefill).
fn config(rec: &Recording) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nsse_keepalive_ms = 600000\n\
         [[routes]]\nname = \"a\"\nprovider = \"openai\"\nbase_url = \"{}\"\nmodel = \"gpt-4o\"\nregion = \"eu\"\n\
         [[routes]]\nname = \"b\"\nprovider = \"anthropic\"\nbase_url = \"{}\"\nmodel = \"claude\"\nregion = \"eu\"\n\
         [models.chat]\nroutes = [\"a\", \"b\"]\n",
        rec.base_url("a", "openai"),
        rec.base_url("b", "anthropic"),
    )
}

/// A history with a system prompt, a tool call and its result.
fn history(tools: bool) -> Value {
    let mut body = json!({
        "model": "chat",
        "stream": true,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees"},
            {"role": "user", "content": "Thanks. Now count to eight."}
        ]
    });
    if tools {
        body["tools"] = json!([{"type": "function", "function": {
            "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}
        }}]);
    }
    body
}

fn client_hash(body: &Value) -> String {
    let req = tailcut::transport::openai::decode_value(body.clone()).expect("the client's body decodes");
    state_hash(&req)
}

fn received(rec: &Recording, route: &str, wire: &str) -> Vec<ChatRequest> {
    rec.seen(route)
        .into_iter()
        .map(|body| match wire {
            "openai" => tailcut::transport::openai::decode_value(body).expect("an OpenAI body"),
            _ => tailcut::transport::anthropic::decode_request(body.to_string().as_bytes()).expect("an Anthropic body"),
        })
        .collect()
}

#[tokio::test]
async fn the_route_that_takes_over_after_a_failover_gets_the_clients_history() {
    let rec = Recording::start(scenarios(), &[("a", &["down"]), ("b", &["ok"])]).await;
    let server = start(&config(&rec)).await;
    let body = history(true);
    let reply = post_sse(&server.url(""), &body, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    let env = reply.envelope();
    assert_eq!(env["route"], "b", "{env}");
    let hash = env["state_hash"]
        .as_str()
        .expect("the envelope carries state_hash")
        .to_string();
    assert_eq!(
        hash,
        client_hash(&body),
        "the envelope's hash is the client's history's"
    );
    let failed = received(&rec, "a", "openai");
    let took_over = received(&rec, "b", "anthropic");
    assert_eq!(failed.len(), 1);
    assert_eq!(took_over.len(), 1, "b took over once");
    assert_eq!(state_hash(&failed[0]), hash, "what the failed route was sent");
    assert_eq!(
        state_hash(&took_over[0]),
        hash,
        "the route that took over, on another wire, received the same history"
    );
}

#[tokio::test]
async fn the_route_that_continues_mid_stream_gets_the_history_and_the_partial_answer() {
    let rec = Recording::start(scenarios(), &[("a", &["drop"]), ("b", &["ok"])]).await;
    let server = start(&config(&rec)).await;
    let body = history(false);
    let reply = post_sse(&server.url(""), &body, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(
        reply.text(),
        ANSWER,
        "continued without loss or doubling: {}",
        reply.raw
    );
    let env = reply.envelope();
    assert_eq!(
        (env["route"].as_str(), env["policy"].as_str()),
        (Some("b"), Some("continue")),
        "{env}"
    );
    let hash = env["state_hash"].as_str().expect("state_hash").to_string();
    assert_eq!(hash, client_hash(&body));
    let mut took_over = received(&rec, "b", "anthropic");
    assert_eq!(took_over.len(), 1, "{took_over:?}");
    let mut continuation = took_over.remove(0);
    let prefill = continuation
        .messages
        .pop()
        .expect("a continuation ends with the partial answer");
    assert_eq!(prefill.role, Role::Assistant);
    assert_eq!(
        prefill.joined_text(),
        "one two three",
        "the partial answer the client holds"
    );
    assert_eq!(
        state_hash(&continuation),
        hash,
        "before the partial answer: the whole history, as the client sent it"
    );
}

#[tokio::test]
async fn the_hash_is_the_same_for_the_same_history_whichever_route_serves() {
    let body = history(false);
    let served_by = |script_a: &'static [&'static str]| {
        let body = body.clone();
        async move {
            let rec = Recording::start(scenarios(), &[("a", script_a), ("b", &["ok"])]).await;
            let server = start(&config(&rec)).await;
            let first = post_sse(&server.url(""), &body, &[]).await.envelope();
            let mut other = body.clone();
            other["messages"][4]["content"] = json!("Now count to nine.");
            let second = post_sse(&server.url(""), &other, &[]).await.envelope();
            (first, second)
        }
    };
    let (on_a, other_on_a) = served_by(&["ok"]).await;
    let (on_b, _) = served_by(&["down"]).await;
    assert_eq!((on_a["route"].as_str(), on_b["route"].as_str()), (Some("a"), Some("b")));
    assert_eq!(
        on_a["state_hash"], on_b["state_hash"],
        "same history, same hash, whichever route"
    );
    assert_ne!(
        on_a["state_hash"], other_on_a["state_hash"],
        "another history, another hash"
    );
}
