//! Micro-benchmark of the state hash (`types::state_hash`), run once per request: the bench
//! tool's one-message request, a tool round trip with a system prompt, and a 40-message chat.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use tailcut::types::{state_hash, ChatRequest, Message, Role, ToolCall};

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
        group.bench_function(*name, |b| b.iter(|| state_hash(black_box(request))));
    }
    group.finish();
}

criterion_group!(benches, hashing);
criterion_main!(benches);
