//! Which invalid output counts against a route (its breaker and error rate), on paused time
//! with scripted routes: an answer that is well formed but fails only the client's own schema
//! does not (any client could send a schema no answer meets, such as a `pattern` its `minLength` excludes, and open every
//! route's breaker for everyone); garbage does (arguments that are not JSON, a tool never
//! offered, text that is not JSON in JSON mode). Either way the answer is never released
//! invalid, and it is repaired once and failed over as before.
mod scripted;

use scripted::*;
use serde_json::{json, Value};
use tailcut::provider::{Delta, ToolFragment};
use tailcut::types::{
    ChatRequest, Dialect, ErrorClass, FinishReason, RequestCtx, ResponseFormat, StreamEvent, ToolSpec,
};

/// Two failures open a breaker; `a` serves tools and JSON schema answers.
fn config() -> String {
    toml(&[("a", "L0")], "[breaker]\nconsecutive_failures = 2\nmin_volume = 2\n").replace(
        "capabilities = [\"tools\", ",
        "capabilities = [\"tools\", \"json_schema\", ",
    )
}

/// An answer that calls `name` with `arguments`.
fn tool_answer(name: &str, arguments: &str) -> Script {
    Script::Stream(vec![
        Step::Wait(10),
        Step::D(Delta::tool(ToolFragment {
            index: 0,
            id: Some("call_1".into()),
            name: Some(name.into()),
            arguments: arguments.into(),
        })),
        Step::D(Delta::Finish(FinishReason::ToolCalls)),
    ])
}

fn tool_request(parameters: Value) -> ChatRequest {
    ChatRequest {
        tools: vec![ToolSpec {
            name: "weather".into(),
            description: None,
            parameters,
        }],
        ..req()
    }
}

fn structured_request(schema: Value) -> ChatRequest {
    ChatRequest {
        response_format: Some(ResponseFormat::JsonSchema {
            name: "answer".into(),
            schema,
            strict: None,
        }),
        ..req()
    }
}

fn weather() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
}

/// Sends `request` three times to a route playing `script`; each fails its gate (the
/// invalid output never reaches the client). Returns the route's breaker afterwards and how
/// many upstream calls were made.
async fn breaker_after_three(script: Script, request: ChatRequest) -> (String, usize) {
    let (gw, seen) = gateway(&config(), vec![("a", script)]);
    for i in 0..3 {
        let evs = collect(&gw, request.clone(), RequestCtx::new(Dialect::OpenAi)).await;
        let k = kinds(&evs);
        assert!(
            !k.iter().any(|e| e.starts_with("tool(") || e.starts_with("text(")),
            "request {i}: nothing invalid is released: {k:?}"
        );
        if i == 0 {
            let Some(StreamEvent::Error(e)) = evs.last() else {
                panic!("the first request fails: {k:?}")
            };
            let failed: Vec<ErrorClass> = e.envelope.fell_back_from.iter().map(|f| f.class).collect();
            assert!(
                failed.len() >= 2 && failed.iter().all(|c| *c == ErrorClass::InvalidOutput),
                "the answer and its repair (at least), all invalid output: {failed:?}"
            );
            assert_eq!(
                e.envelope.repair.as_ref().map(|r| r.outcome.clone()),
                Some("failed".to_string()),
                "the repair ran"
            );
        }
    }
    (breaker(&gw, "a"), seen.calls("a"))
}

#[tokio::test(start_paused = true)]
async fn a_tool_schema_no_answer_can_meet_opens_no_breaker() {
    // Schemas the scripted answer cannot meet (ones no value meets, `{"not": {}}`, are
    // refused before any attempt: tests/client_caused.rs).
    let never = json!({"type": "object", "properties": {"x": {"type": "string", "pattern": "^a$", "minLength": 2}}, "required": ["x"]});
    let paris = json!({"type": "object", "properties": {"city": {"const": "Paris"}}, "required": ["city"]});
    for schema in [never, paris, json!({"type": "string"})] {
        let (state, calls) = breaker_after_three(
            tool_answer("weather", "{\"city\": \"Oslo\"}"),
            tool_request(schema.clone()),
        )
        .await;
        assert_eq!(state, "closed", "{schema}: the route gave a well-formed call");
        assert!(
            calls >= 6,
            "{schema}: each request still had its answer and its repair: {calls}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_response_schema_no_answer_can_meet_opens_no_breaker() {
    let answer = Script::Stream(vec![Step::Wait(10), text("{\"city\": \"Oslo\"}"), finish()]);
    let paris = json!({"type": "object", "properties": {"city": {"const": "Paris"}}, "required": ["city"]});
    let (state, _) = breaker_after_three(answer, structured_request(paris)).await;
    assert_eq!(state, "closed", "the route gave valid JSON");
}

#[tokio::test(start_paused = true)]
async fn garbage_still_opens_the_breaker() {
    let cases = [
        (
            "arguments that are not JSON",
            tool_answer("weather", "{\"city\": "),
            tool_request(weather()),
        ),
        (
            "a tool never offered",
            tool_answer("get_stock_price", "{}"),
            tool_request(weather()),
        ),
        (
            "text that is not JSON",
            Script::Stream(vec![Step::Wait(10), text("Oslo, I think"), finish()]),
            structured_request(weather()),
        ),
    ];
    for (what, script, request) in cases {
        let (gw, _) = gateway(&config(), vec![("a", script)]);
        let evs = collect(&gw, request, RequestCtx::new(Dialect::OpenAi)).await;
        assert!(
            matches!(evs.last(), Some(StreamEvent::Error(_))),
            "{what}: refused: {:?}",
            kinds(&evs)
        );
        assert_eq!(
            breaker(&gw, "a"),
            "open",
            "{what}: the answer and its repair count against the route"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_block_closed_before_the_requests_max_tokens_cut_it_is_the_requests_error() {
    // Anthropic closes a tool block at the limit (`content_block_stop`), then says
    // `max_tokens`: the half-parsed arguments are the request's own cut, never the route's.
    let cut = Script::Stream(vec![
        Step::Wait(10),
        Step::D(Delta::tool(ToolFragment {
            index: 0,
            id: Some("toolu_1".into()),
            name: Some("weather".into()),
            arguments: "{\"city\": \"Pa".into(),
        })),
        Step::D(Delta::ToolEnd { index: 0 }),
        Step::D(Delta::Finish(FinishReason::Length)),
    ]);
    let (gw, seen) = gateway(&config(), vec![("a", cut)]);
    for i in 0..3 {
        let request = ChatRequest {
            max_tokens: Some(50),
            ..tool_request(weather())
        };
        let evs = collect(&gw, request, RequestCtx::new(Dialect::OpenAi)).await;
        let Some(StreamEvent::Error(e)) = evs.last() else {
            panic!("request {i} fails: {:?}", kinds(&evs))
        };
        assert_eq!(e.class, ErrorClass::BadRequest, "request {i}: {}", e.message);
        assert!(e.message.contains("raise max_tokens"), "{}", e.message);
    }
    assert_eq!(seen.calls("a"), 3, "no repair, no retry: one call per request");
    assert_eq!(breaker(&gw, "a"), "closed", "the route honoured the limit");
}
