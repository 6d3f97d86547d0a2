//! WebSocket session history end to end over loopback: a `chat` naming a `session` sends only
//! its new turn, tailcut projects the session's history in before it, the envelope says
//! which turns went in, and the `state_hash` equals that of the same full history sent
//! explicitly; past the context window the oldest turns are left out, and the envelope says so.

mod support;

use futures::SinkExt;
use serde_json::{json, Value};
use support::{config_toml, start, ws_connect, ws_next, Ws};
use tailcut::types::{state_hash, ChatRequest, Message as Turn, Role};
use tokio_tungstenite::tungstenite::Message;

const QUICK: &str = r#"
[sim.scenarios.quick]
text = "Hello there."
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 1.0
"#;

/// Sends one chat (with `session` when given) and reads it to `done`: (text, done envelope).
async fn chat(ws: &mut Ws, id: &str, session: Option<&str>, messages: Value) -> (String, Value) {
    let mut msg = json!({"type": "chat", "id": id, "request": {"model": "chat", "messages": messages}});
    if let Some(s) = session {
        msg["session"] = s.into();
    }
    ws.send(Message::text(msg.to_string())).await.expect("send");
    let mut text = String::new();
    loop {
        let m = ws_next(ws).await;
        if m["id"] != id {
            continue;
        }
        match m["type"].as_str() {
            Some("delta") => text.push_str(m["text"].as_str().unwrap_or_default()),
            Some("reset") => text.clear(),
            Some("done") => return (text, m["envelope"].clone()),
            Some("error") => panic!("{id} failed: {m}"),
            _ => {}
        }
    }
}

fn hash_of(messages: &[(Role, &str)]) -> String {
    let req = ChatRequest {
        model: "chat".into(),
        messages: messages.iter().map(|(role, text)| Turn::text(*role, *text)).collect(),
        ..ChatRequest::default()
    };
    state_hash(&req)
}

#[tokio::test]
async fn the_projected_history_hashes_as_the_same_history_sent_in_full() {
    let server = start(&config_toml(&[("a", "openai", "quick")], QUICK)).await;
    let mut ws = ws_connect(&server, None).await.expect("upgrade");

    let first = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "One?"}]);
    let (answer, env1) = chat(&mut ws, "c1", Some("s1"), first).await;
    assert!(!answer.is_empty(), "an answer");
    let h1 = &env1["history"];
    assert_eq!(h1["session"], "s1", "{env1}");
    assert_eq!(h1["turn"], 1);
    assert_eq!(h1["turns_included"], Value::Null, "nothing before the first turn: {h1}");

    let (_, env2) = chat(&mut ws, "c2", Some("s1"), json!([{"role": "user", "content": "Two?"}])).await;
    let h2 = &env2["history"];
    assert_eq!(h2["turn"], 2, "{h2}");
    assert_eq!(h2["turns_included"], json!({"from": 1, "to": 1}), "{h2}");
    assert_eq!(h2["dropped_for_budget"], 0);
    let projected = env2["state_hash"].as_str().expect("state_hash").to_string();

    let full = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "One?"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Two?"},
    ]);
    let (_, explicit) = chat(&mut ws, "c3", None, full).await;
    assert_eq!(
        explicit["state_hash"].as_str(),
        Some(projected.as_str()),
        "the projected history is the full history: {env2} vs {explicit}"
    );
    assert_eq!(explicit["history"], Value::Null, "no session, no projection");
    assert_eq!(
        projected,
        hash_of(&[
            (Role::System, "Be brief."),
            (Role::User, "One?"),
            (Role::Assistant, &answer),
            (Role::User, "Two?"),
        ]),
        "the hash of the canonical history"
    );

    let (_, env4) = chat(&mut ws, "c4", Some("s2"), json!([{"role": "user", "content": "Two?"}])).await;
    assert_eq!(
        env4["history"]["turns_included"],
        Value::Null,
        "another session has its own history: {env4}"
    );
    assert_eq!(
        env4["state_hash"].as_str(),
        Some(hash_of(&[(Role::User, "Two?")]).as_str())
    );
    server.shutdown().await;
}

#[tokio::test]
async fn past_the_context_window_the_oldest_turns_are_left_out() {
    // 500 prompt tokens (600 less the 100 reserved for the answer); a 1000-byte turn is
    // about 285 tokens with its answer, so one kept turn fits beside a new one, two do not.
    let toml = config_toml(&[("a", "openai", "quick")], QUICK).replacen(
        "region = \"eu\"\n",
        "region = \"eu\"\ncontext_window = 600\nmax_output = 100\n",
        1,
    );
    let server = start(&toml).await;
    let mut ws = ws_connect(&server, None).await.expect("upgrade");
    let long = |c: char| json!([{"role": "user", "content": c.to_string().repeat(1000)}]);

    let (_, env1) = chat(&mut ws, "t1", Some("s"), long('a')).await;
    assert_eq!(env1["history"]["turns_included"], Value::Null);
    let (_, env2) = chat(&mut ws, "t2", Some("s"), long('b')).await;
    assert_eq!(
        env2["history"]["turns_included"],
        Value::Null,
        "turn 1 does not fit beside turn 2: {env2}"
    );
    assert_eq!(env2["history"]["dropped_for_budget"], 1, "{env2}");
    let (_, env3) = chat(&mut ws, "t3", Some("s"), json!([{"role": "user", "content": "short"}])).await;
    let h3 = &env3["history"];
    assert_eq!(
        h3["turns_included"],
        json!({"from": 2, "to": 2}),
        "the newest that fit: {h3}"
    );
    assert_eq!(h3["dropped_for_budget"], 1, "the oldest left out: {h3}");
    assert_eq!(h3["dropped_for_limit"], 0, "left out, not forgotten: {h3}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_chat_over_the_cost_limits_is_refused_as_over_http() {
    // The frame's parse is bounded by its size, but not what its messages cost the gateway
    // and the upstream: `max_messages` holds over the socket as over HTTP.
    let config =
        config_toml(&[("a", "openai", "quick")], QUICK).replacen("[server]\n", "[server]\nmax_messages = 4\n", 1);
    let server = start(&config).await;
    let mut ws = ws_connect(&server, None).await.expect("upgrade");
    let many: Vec<Value> = (0..5).map(|_| json!({"role": "user", "content": "x"})).collect();
    let frame = json!({"type": "chat", "id": "m5", "request": {"model": "chat", "messages": many}});
    ws.send(Message::text(frame.to_string())).await.expect("sent");
    let refused = ws_next(&mut ws).await;
    assert_eq!(
        (&refused["type"], &refused["id"], &refused["class"], &refused["code"]),
        (
            &json!("error"),
            &json!("m5"),
            &json!("bad_request"),
            &json!("max_messages_exceeded")
        ),
        "refused before anything starts, no accepted: {refused}"
    );
    let (answer, _) = chat(&mut ws, "m4", None, Value::Array(many[..4].to_vec())).await;
    assert!(
        !answer.is_empty(),
        "four messages are within the limit, and the socket serves on"
    );
}
