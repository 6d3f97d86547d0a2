//! Same-wire pass-through: a route that speaks the client's wire receives the client's
//! request byte for byte, except the fields tailcut owns (`model`, `stream`,
//! `stream_options`, the token limit), whatever unknown fields it carries at the top level,
//! in a message or in a content block, in any order and nesting, compact or pretty-printed.
//! What the route received is read back from the simulated upstream's log.

mod support;

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use support::{client, start};
use tailcut::server::Running;

const CONFIG: &str = "[server]\nlisten = \"127.0.0.1:0\"\nsse_keepalive_ms = 600000\ndrain_grace_ms = 0\n\
    [sim]\nlisten = \"127.0.0.1:0\"\n\
    [sim.scenarios.quick]\nttft = { median_ms = 1.0, sigma = 0.0 }\ninter_token_ms = 0.0\n\
    [[routes]]\nname = \"oa\"\nprovider = \"simulated\"\nwire = \"openai\"\nscenario = \"quick\"\nmodel = \"up-gpt\"\n\
    [[routes]]\nname = \"an\"\nprovider = \"simulated\"\nwire = \"anthropic\"\nscenario = \"quick\"\nmodel = \"up-claude\"\n\
    [models.chat]\nroutes = [\"oa\"]\n[models.claude]\nroutes = [\"an\"]\n";

/// Arbitrary JSON: scalars (numbers written in more than one way), strings with escapes,
/// and nested arrays and objects.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1.0e6f64..1.0e6).prop_map(|f| json!(f)),
        "[a-z\\\\\"\u{e9}\u{1F600} ]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Unknown field names: never one tailcut reads.
fn unknown_fields() -> impl Strategy<Value = Vec<(String, Value)>> {
    prop::collection::vec(("x_[a-z]{1,8}", json_value()), 0..4)
}

fn with_fields(mut object: Map<String, Value>, fields: &[(String, Value)]) -> Value {
    for (k, v) in fields {
        object.insert(k.clone(), v.clone());
    }
    Value::Object(object)
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// One case: unknown fields for the top level, the first message, its content block, and
/// an unknown block type; whether to pretty-print.
#[derive(Debug, Clone)]
struct Case {
    top: Vec<(String, Value)>,
    message: Vec<(String, Value)>,
    block: Vec<(String, Value)>,
    opaque: Vec<(String, Value)>,
    pretty: bool,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        unknown_fields(),
        unknown_fields(),
        unknown_fields(),
        unknown_fields(),
        any::<bool>(),
    )
        .prop_map(|(top, message, block, opaque, pretty)| Case {
            top,
            message,
            block,
            opaque,
            pretty,
        })
}

/// The fields the OpenAI wire's real API takes that tailcut has no typed view of.
fn openai_fields() -> Vec<(String, Value)> {
    [
        ("logprobs", json!(true)),
        ("top_logprobs", json!(3)),
        ("parallel_tool_calls", json!(false)),
        ("user", json!("user-1234")),
        ("service_tier", json!("flex")),
        ("store", json!(true)),
        ("prediction", json!({"type": "content", "content": "draft"})),
        ("logit_bias", json!({"50256": -100})),
        ("metadata", json!({"trace": "t1"})),
        ("modalities", json!(["text"])),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn openai_body(case: &Case) -> Value {
    let block = with_fields(object(json!({"type": "text", "text": "Say hi"})), &case.block);
    let opaque = with_fields(object(json!({"type": "x_part"})), &case.opaque);
    let first = with_fields(
        object(json!({"role": "user", "content": [block, opaque]})),
        &case.message,
    );
    let mut top = openai_fields();
    top.extend(case.top.iter().cloned());
    with_fields(
        object(json!({
            "model": "chat",
            "messages": [{"role": "system", "content": "Be brief."}, first],
            "max_tokens": 50,
            "stream": true,
            "stream_options": {"include_usage": false},
        })),
        &top,
    )
}

fn anthropic_body(case: &Case) -> Value {
    let block = with_fields(
        object(json!({"type": "text", "text": "Say hi", "cache_control": {"type": "ephemeral"}})),
        &case.block,
    );
    let opaque = with_fields(object(json!({"type": "x_block"})), &case.opaque);
    let first = with_fields(
        object(json!({"role": "user", "content": [block, opaque]})),
        &case.message,
    );
    let mut top = vec![
        ("metadata".to_string(), json!({"user_id": "u-1"})),
        ("top_k".to_string(), json!(5)),
        ("stop_sequences".to_string(), json!(["\n\nHuman:"])),
        ("service_tier".to_string(), json!("auto")),
    ];
    top.extend(case.top.iter().cloned());
    with_fields(
        object(json!({
            "model": "claude",
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [first],
            "max_tokens": 50,
            "stream": false,
        })),
        &top,
    )
}

/// The body's top-level fields, each value's text as written.
fn raw_fields(text: &str) -> BTreeMap<String, Box<RawValue>> {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("a JSON object ({e}): {text}"))
}

fn raw_items(raw: &RawValue) -> Vec<Box<RawValue>> {
    serde_json::from_str(raw.get()).unwrap_or_else(|e| panic!("a JSON array ({e}): {}", raw.get()))
}

fn texts(items: &[Box<RawValue>]) -> Vec<&str> {
    items.iter().map(|r| r.get()).collect()
}

/// Posts `body` written as `text` and returns what the route received.
async fn sent_and_received(server: &Running, path: &str, text: String) -> String {
    let before = server.sim.as_ref().map_or(0, |s| s.log().len());
    let resp = client()
        .post(server.url(path))
        .header("content-type", "application/json")
        .header("anthropic-beta", "interleaved-thinking-2025-05-14")
        .body(text)
        .send()
        .await
        .expect("request sent");
    let status = resp.status().as_u16();
    let answer = resp.text().await.unwrap_or_default();
    assert_eq!(status, 200, "answered: {answer}");
    let log = server.sim.as_ref().map(|s| s.log()).unwrap_or_default();
    assert_eq!(log.len(), before + 1, "one upstream request");
    let record = log.last().cloned().expect("a record");
    record.body.as_deref().map(str::to_string).expect("the body is kept")
}

fn write(value: &Value, pretty: bool) -> String {
    let text = if pretty {
        serde_json::to_string_pretty(value)
    } else {
        serde_json::to_string(value)
    };
    text.unwrap_or_default()
}

/// Every field the client sent reached the route as written, but the owned ones: `model`
/// (the route's, `model`), `stream`, `max_tokens` and any in `fixed`, which hold what tailcut
/// wrote; each message byte for byte; nothing added.
fn check(sent: &str, received: &str, model: &str, fixed: &[(&str, &str)]) {
    let sent = raw_fields(sent);
    let got = raw_fields(received);
    for (k, v) in &sent {
        let owned = fixed.iter().find(|(f, _)| f == k).map(|(_, want)| *want);
        match (k.as_str(), owned) {
            ("model", _) => assert_eq!(got["model"].get(), model, "the route's model"),
            ("stream", _) => assert_eq!(got["stream"].get(), "true"),
            ("max_tokens", _) => assert_eq!(got[k].get(), "50"),
            (_, Some(want)) => assert_eq!(got[k].get(), want, "{k} as tailcut writes it"),
            ("messages", None) => assert_eq!(
                texts(&raw_items(&got[k])),
                texts(&raw_items(v)),
                "every message byte for byte"
            ),
            (_, None) => assert_eq!(
                got.get(k).map(|r| r.get()),
                Some(v.get()),
                "{k} reaches the route as sent"
            ),
        }
    }
    assert_eq!(got.len(), sent.len(), "nothing added: {received}");
}

#[test]
fn a_same_wire_request_reaches_the_route_unchanged_but_for_the_owned_fields() {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let server = rt.block_on(start(CONFIG));
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(48));
    runner
        .run(&cases(), |case| {
            let body = openai_body(&case);
            let text = write(&body, case.pretty);
            let received = rt.block_on(sent_and_received(&server, "/v1/chat/completions", text.clone()));
            check(
                &text,
                &received,
                "\"up-gpt\"",
                &[("stream_options", r#"{"include_usage":true}"#)],
            );
            let body = anthropic_body(&case);
            let text = write(&body, case.pretty);
            let received = rt.block_on(sent_and_received(&server, "/v1/messages", text.clone()));
            check(&text, &received, "\"up-claude\"", &[]);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    let log = server.sim.as_ref().map(|s| s.log()).unwrap_or_default();
    assert!(
        log.iter()
            .filter(|r| r.wire == "anthropic")
            .all(|r| r.anthropic_beta.as_deref() == Some("interleaved-thinking-2025-05-14")),
        "the anthropic-beta header reaches an Anthropic route"
    );
    assert!(
        log.iter()
            .filter(|r| r.wire == "openai")
            .all(|r| r.anthropic_beta.is_none()),
        "and no other"
    );
}
