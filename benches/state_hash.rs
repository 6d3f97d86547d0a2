//! Micro-benchmark of the state hash (`types::state_hash`), run once per request: the bench
//! tool's one-message request, a tool round trip with a system prompt, and a 40-message chat;
//! `value/*` runs the form it replaced (a `serde_json::Value` of the history, serialized to a
//! `Vec`, then hashed) on the same inputs, for comparison (and checks the hashes agree).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use tailcut::types::{state_hash, ChatRequest, ContentPart, Message, Role, ToolCall};

/// A turn being built: role, its map so far, text, images, tool calls.
type OldTurn = (Role, Map<String, Value>, String, Vec<Value>, Vec<Value>);

/// The state hash as it was computed before: a `Value` of the canonical form, serialized.
fn value_state_hash(req: &ChatRequest) -> String {
    let system: Vec<String> = req
        .messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(Message::joined_text)
        .collect();
    let mut turns: Vec<OldTurn> = Vec::new();
    for m in req.messages.iter().filter(|m| m.role != Role::System) {
        let merge = m.role != Role::Tool && turns.last().is_some_and(|t| t.0 == m.role);
        if !merge {
            let mut head = Map::new();
            if let Some(id) = &m.tool_call_id {
                head.insert("tool_call_id".into(), json!(id));
            }
            turns.push((m.role, head, String::new(), Vec::new(), Vec::new()));
        }
        let Some(turn) = turns.last_mut() else { continue };
        for part in &m.content {
            match part {
                ContentPart::Text(t) => turn.2.push_str(t),
                ContentPart::ImageUrl { url } => turn.3.push(json!(url)),
                ContentPart::Opaque { .. } => {}
            }
        }
        for call in &m.tool_calls {
            let arguments = serde_json::from_str::<Value>(&call.arguments)
                .unwrap_or_else(|_| Value::String(call.arguments.clone()));
            turn.4
                .push(json!({"id": call.id, "name": call.name, "arguments": arguments}));
        }
    }
    let turns: Vec<Value> = turns
        .into_iter()
        .map(|(role, mut out, text, images, calls)| {
            let role = match role {
                Role::System => "system",
                Role::User => "user",
                Role::Assistant => "assistant",
                Role::Tool => "tool",
            };
            out.insert("role".into(), json!(role));
            if !text.is_empty() {
                out.insert("text".into(), json!(text));
            }
            if !images.is_empty() {
                out.insert("images".into(), Value::Array(images));
            }
            if !calls.is_empty() {
                out.insert("tool_calls".into(), Value::Array(calls));
            }
            Value::Object(out)
        })
        .collect();
    let canonical = json!({"v": 1, "system": system.join("\n\n"), "turns": turns});
    let bytes = serde_json::to_vec(&canonical).unwrap_or_default();
    hex::encode(&Sha256::digest(&bytes)[..16])
}

fn req(messages: Vec<Message>) -> ChatRequest {
    ChatRequest {
        model: "chat".into(),
        messages,
        ..ChatRequest::default()
    }
}

fn tool_round_trip() -> Vec<Message> {
    let mut call = Message::text(Role::Assistant, "");
    call.tool_calls.push(ToolCall {
        index: 0,
        id: "call_1".into(),
        name: "weather".into(),
        arguments: r#"{"city": "Oslo", "unit": "c", "days": [1, 2, 3]}"#.into(),
    });
    let mut result = Message::text(Role::Tool, r#"{"temp": 4, "sky": "cloudy"}"#);
    result.tool_call_id = Some("call_1".into());
    vec![
        Message::text(Role::System, "You are a terse assistant. Use the tools when needed."),
        Message::text(Role::User, "Weather in Oslo for the next three days?"),
        call,
        result,
    ]
}

fn long_chat() -> Vec<Message> {
    let line = "A sentence of ordinary prose, about eighty characters long, with a comma or two. ";
    let mut out = vec![Message::text(Role::System, "Answer briefly.")];
    for i in 0..40 {
        let role = if i % 2 == 0 { Role::User } else { Role::Assistant };
        out.push(Message::text(role, line.repeat(3)));
    }
    out
}

fn hashing(c: &mut Criterion) {
    let cases = [
        (
            "one_message",
            req(vec![Message::text(Role::User, "Tell me something.")]),
        ),
        ("tool_round_trip", req(tool_round_trip())),
        ("long_chat", req(long_chat())),
    ];
    let mut group = c.benchmark_group("state_hash");
    for (name, request) in &cases {
        assert_eq!(state_hash(request), value_state_hash(request), "{name}");
        group.bench_function(*name, |b| b.iter(|| state_hash(black_box(request))));
        group.bench_function(format!("value/{name}"), |b| {
            b.iter(|| value_state_hash(black_box(request)))
        });
    }
    group.finish();
}

criterion_group!(benches, hashing);
criterion_main!(benches);
