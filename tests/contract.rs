//! Contract tests per route pair: the same neutral request through an OpenAI-format and an
//! Anthropic-format simulated route gives the same neutral event stream (text, tool calls,
//! usage, finish, errors), so a hedge or failover between providers is invisible.

mod support;

use futures::StreamExt;
use support::*;
use tailcut::types::{ChatRequest, Dialect, Message, RequestCtx, Role, StreamEvent, ToolSpec};

const SCENARIOS: &str = r#"
[sim.scenarios.text]
text = "Both providers say exactly this, token by token."
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 1.0
[sim.scenarios.tools]
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 1.0
tool_fragments = 11
tool_calls = [{ name = "get_weather", arguments = '{"city":"Zürich","unit":"celsius"}' }, { name = "get_time", arguments = '{"tz":"Europe/Zurich"}' }]
[sim.scenarios.refusal]
ttft = { median_ms = 5.0, sigma = 0.0 }
failure = { refusal = true }
[sim.scenarios.cut-tool]
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 1.0
tool_calls = [{ name = "get_weather", arguments = '{"city":"Paris","unit":"celsius"}' }]
failure = { length_in_tool_call = true }
[sim.scenarios.overloaded]
text = "This answer is cut by an in-band overload."
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 1.0
failure = { in_band_error_after_tokens = 3 }
"#;

fn config(scenario: &str) -> String {
    let mut toml = config_toml(&[("oa", "openai", scenario), ("an", "anthropic", scenario)], SCENARIOS);
    toml.push_str("[models.via-openai]\nroutes = [\"oa\"]\n[models.via-anthropic]\nroutes = [\"an\"]\n");
    toml.push_str("[policies]\nprose = \"truncate\"\ntool = \"truncate\"\n");
    toml
}

fn request(model: &str, tools: bool) -> ChatRequest {
    let mut req = ChatRequest {
        model: model.into(),
        messages: vec![
            Message::text(Role::System, "Be brief."),
            Message::text(Role::User, "Hello"),
        ],
        stream: true,
        include_usage: true,
        ..ChatRequest::default()
    };
    if tools {
        for name in ["get_weather", "get_time"] {
            req.tools.push(ToolSpec {
                name: name.into(),
                description: None,
                parameters: serde_json::json!({"type": "object"}),
            });
        }
    }
    req
}

/// The neutral events with what legitimately differs per route (envelope, ids) blanked, and
/// the extras left out: they are each wire's own fields, for its own clients only.
fn normalized(events: Vec<StreamEvent>) -> Vec<String> {
    events
        .into_iter()
        .filter(|e| !matches!(e, StreamEvent::Extra(_)))
        .map(|e| match e {
            StreamEvent::Start(_) => "start".to_string(),
            StreamEvent::TextDelta(t) => format!("text:{t}"),
            StreamEvent::ToolCall(c) => format!("tool:{}:{}:{}", c.index, c.name, c.arguments),
            StreamEvent::Usage(u) => format!("usage:{}", u.output_tokens > 0),
            StreamEvent::Finish { reason, .. } => format!("finish:{}", reason.as_str()),
            StreamEvent::Error(e) => format!("error:{}", e.class),
            other => format!("{other:?}"),
        })
        .collect()
}

async fn both(scenario: &str, tools: bool) -> (Vec<String>, Vec<String>) {
    let server = start(&config(scenario)).await;
    let gateway = &server.state.gateway;
    let mut out = Vec::new();
    for model in ["via-openai", "via-anthropic"] {
        let ctx = RequestCtx::new(Dialect::Native);
        let stream = gateway.chat(request(model, tools), ctx).expect("planned");
        out.push(normalized(stream.collect().await));
    }
    let anthropic = out.pop().unwrap_or_default();
    let openai = out.pop().unwrap_or_default();
    (openai, anthropic)
}

#[tokio::test]
async fn text_streams_are_equivalent_across_providers() {
    let (openai, anthropic) = both("text", false).await;
    assert_eq!(openai, anthropic);
    assert_eq!(openai.first().map(String::as_str), Some("start"));
    assert_eq!(openai.last().map(String::as_str), Some("finish:stop"));
    let text: String = openai.iter().filter_map(|e| e.strip_prefix("text:")).collect();
    assert_eq!(text, "Both providers say exactly this, token by token.");
    assert!(openai.contains(&"usage:true".to_string()), "{openai:?}");
}

#[tokio::test]
async fn parallel_tool_calls_are_equivalent_across_providers() {
    let (openai, anthropic) = both("tools", true).await;
    assert_eq!(openai, anthropic);
    assert_eq!(
        openai
            .iter()
            .filter(|e| e.starts_with("tool:"))
            .cloned()
            .collect::<Vec<_>>(),
        vec![
            r#"tool:0:get_weather:{"city":"Zürich","unit":"celsius"}"#.to_string(),
            r#"tool:1:get_time:{"tz":"Europe/Zurich"}"#.to_string(),
        ]
    );
    assert_eq!(openai.last().map(String::as_str), Some("finish:tool_calls"));
}

#[tokio::test]
async fn refusals_are_equivalent_across_providers() {
    let (openai, anthropic) = both("refusal", false).await;
    assert_eq!(openai.last(), anthropic.last(), "{openai:?} vs {anthropic:?}");
}

#[tokio::test]
async fn max_tokens_inside_a_tool_call_never_yields_the_fragment() {
    let (openai, anthropic) = both("cut-tool", true).await;
    assert_eq!(openai, anthropic);
    assert!(
        openai.iter().all(|e| !e.starts_with("tool:")),
        "no partial call: {openai:?}"
    );
}

#[tokio::test]
async fn in_band_overload_is_the_same_failure_on_both_providers() {
    let (openai, anthropic) = both("overloaded", false).await;
    assert_eq!(openai, anthropic);
    assert_eq!(
        openai.last().map(String::as_str),
        Some("finish:truncated"),
        "{openai:?}"
    );
}
