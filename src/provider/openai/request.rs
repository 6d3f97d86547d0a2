//! `ChatRequest` -> OpenAI Chat Completions request body (always streaming, always with
//! usage). A request that arrived on the OpenAI wire is passed through (`provider::
//! passthrough`); any other is written from the typed view.

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::types::{
    ChatBody, ImageUrl, StreamOptions, WireContent, WireFunction, WireFunctionCall, WireMessage, WirePart, WireTool,
    WireToolCall,
};
use crate::provider::passthrough::{Piece, SameWire};
use crate::provider::{ProviderError, UpstreamRequest};
use crate::types::{
    ContentPart, Message, ModelRules, PrefillConvention, ResponseFormat, Role, TokenParameter, ToolChoice, Verbatim,
    Wire,
};

/// The fields tailcut writes itself in a same-wire body; the client's own are not sent.
const OWNED: &[&str] = &[
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
];

/// vLLM's continuation flags, owned too when a continuation uses them.
const VLLM_FLAGS: &[&str] = &["continue_final_message", "add_generation_prompt"];

/// The body one attempt sends.
#[derive(Serialize)]
#[serde(untagged)]
pub(crate) enum Body<'a> {
    Typed(Box<ChatBody>),
    SameWire(SameWire<'a>),
}

/// The body for `model` (the route's upstream model id, not the client's name) under the
/// route's `rules`.
pub(crate) fn body<'a>(
    req: &'a UpstreamRequest,
    model: &'a str,
    rules: &ModelRules,
) -> Result<Body<'a>, ProviderError> {
    match req.chat.verbatim.as_deref().filter(|v| v.wire == Wire::OpenAi) {
        Some(verbatim) => same_wire(req, model, rules, verbatim).map(Body::SameWire),
        None => Ok(Body::Typed(Box::new(build_body(req, model, rules)))),
    }
}

/// A continuation ends with the partial answer as the final assistant message, marked by the
/// route's convention; never with an instruction to continue (models start over). When the
/// client's own request ended with an assistant message (its own prefill), the partial
/// answer continues that one message: every prefill convention continues only the final
/// message, and many chat templates refuse two assistant turns in a row. `true`: it replaces
/// the request's final message.
fn prefill_message(req: &UpstreamRequest) -> Option<(WireMessage, bool)> {
    let prefill = req.prefill.as_ref()?;
    let (mut last, replaces) = match req.chat.assistant_prefill() {
        Some(own) => (text_message("assistant", own + prefill.sent()), true),
        None => (text_message("assistant", prefill.sent().to_string()), false),
    };
    last.prefix = prefill.convention == PrefillConvention::Prefix;
    Some((last, replaces))
}

fn is_vllm(req: &UpstreamRequest) -> bool {
    req.prefill
        .as_ref()
        .is_some_and(|p| p.convention == PrefillConvention::Vllm)
}

/// The client's body with the owned fields rewritten: each message the client sent is sent
/// as it was; a message tailcut added (a repair, a session's earlier answer) is written.
fn same_wire<'a>(
    req: &'a UpstreamRequest,
    model: &'a str,
    rules: &ModelRules,
    verbatim: &'a Verbatim,
) -> Result<SameWire<'a>, ProviderError> {
    let chat = &req.chat;
    let vllm = is_vllm(req);
    let owned: &[&[&str]] = if vllm { &[OWNED, VLLM_FLAGS] } else { &[OWNED] };
    let mut body = SameWire::new(verbatim, owned, rules);
    let prefill = prefill_message(req);
    let kept = match &prefill {
        Some((_, true)) => chat.messages.len().saturating_sub(1),
        _ => chat.messages.len(),
    };
    let mut messages = Vec::with_capacity(kept + 1);
    for message in &chat.messages[..kept] {
        messages.push(match message.json.as_ref().and_then(|j| j.in_wire(Wire::OpenAi)) {
            Some(raw) => Piece::Sent(raw.raw()),
            None => Piece::made(&wire_message(message))?,
        });
    }
    if let Some((last, _)) = prefill {
        messages.push(Piece::made(&last)?);
    }
    body.set("model", Piece::made(&model)?);
    body.set("messages", Piece::Array(messages));
    body.set("stream", Piece::made(&true)?);
    // The client's other stream options stay; usage is always asked for (cost accounting).
    let mut options: Map<String, Value> = verbatim
        .field("stream_options")
        .and_then(|raw| serde_json::from_str(raw.text()).ok())
        .unwrap_or_default();
    options.insert("include_usage".into(), Value::Bool(true));
    body.set("stream_options", Piece::made(&options)?);
    if let Some(max) = chat.max_tokens {
        body.set(rules.token_parameter.field(), Piece::made(&max)?);
    }
    if vllm {
        body.set("continue_final_message", Piece::made(&true)?);
        body.set("add_generation_prompt", Piece::made(&false)?);
    }
    Ok(body)
}

/// Builds the typed body for `model`.
pub fn build_body(req: &UpstreamRequest, model: &str, rules: &ModelRules) -> ChatBody {
    let chat = &req.chat;
    let mut messages: Vec<WireMessage> = chat.messages.iter().map(wire_message).collect();
    if let Some((last, replaces)) = prefill_message(req) {
        if replaces {
            messages.pop();
        }
        messages.push(last);
    }
    let vllm = is_vllm(req).then_some(());
    let tools: Vec<WireTool> = chat
        .tools
        .iter()
        .map(|t| WireTool {
            kind: "function",
            function: WireFunction {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.parameters.clone(),
            },
        })
        .collect();
    // OpenAI rejects `tool_choice` without `tools`.
    let tool_choice = chat.tool_choice.as_ref().filter(|_| !tools.is_empty()).map(tool_choice);
    let sampling = &chat.sampling;
    let token = rules.token_parameter;
    let keep = |field: &str, value: Option<f64>| value.filter(|_| !rules.drops(field));
    ChatBody {
        model: model.to_string(),
        messages,
        tools,
        tool_choice,
        response_format: chat.response_format.as_ref().map(response_format),
        temperature: keep("temperature", sampling.temperature),
        top_p: keep("top_p", sampling.top_p),
        stop: sampling.stop.clone(),
        seed: sampling.seed,
        presence_penalty: keep("presence_penalty", sampling.presence_penalty),
        frequency_penalty: keep("frequency_penalty", sampling.frequency_penalty),
        max_tokens: chat.max_tokens.filter(|_| token == TokenParameter::MaxTokens),
        max_completion_tokens: chat.max_tokens.filter(|_| token == TokenParameter::MaxCompletionTokens),
        reasoning_effort: chat.reasoning_effort.clone(),
        user: anthropic_user(chat),
        stream: true,
        // Always: usage feeds cost accounting even when the client did not ask for it.
        stream_options: StreamOptions { include_usage: true },
        continue_final_message: vllm.map(|()| true),
        add_generation_prompt: vllm.map(|()| false),
    }
}

/// An Anthropic client's `metadata.user_id`, OpenAI's `user`.
fn anthropic_user(chat: &crate::types::ChatRequest) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Metadata {
        user_id: Option<String>,
    }
    let v = chat.verbatim.as_deref().filter(|v| v.wire == Wire::Anthropic)?;
    serde_json::from_str::<Metadata>(v.field("metadata")?.text())
        .ok()?
        .user_id
}

fn role(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

fn text_message(role: &'static str, text: String) -> WireMessage {
    WireMessage {
        role,
        content: Some(WireContent::Text(text)),
        tool_calls: Vec::new(),
        tool_call_id: None,
        name: None,
        prefix: false,
    }
}

fn wire_message(message: &Message) -> WireMessage {
    let tool_calls: Vec<WireToolCall> = message
        .tool_calls
        .iter()
        .map(|c| WireToolCall {
            id: c.id.clone(),
            kind: "function",
            function: WireFunctionCall {
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            },
        })
        .collect();
    let content = if message.has_images() {
        let parts = message
            .content
            .iter()
            .filter_map(|p| match p {
                ContentPart::Text(text) => Some(WirePart::Text { text: text.clone() }),
                ContentPart::ImageUrl { url } => Some(WirePart::ImageUrl {
                    image_url: ImageUrl { url: url.clone() },
                }),
                // Only in a message of another wire, which no route of this one is given.
                ContentPart::Opaque { .. } => None,
            })
            .collect();
        Some(WireContent::Parts(parts))
    } else {
        let text = message.joined_text();
        // An assistant turn that only called tools carries `content: null`.
        (!text.is_empty() || tool_calls.is_empty()).then_some(WireContent::Text(text))
    };
    WireMessage {
        role: role(message.role),
        content,
        tool_calls,
        tool_call_id: message.tool_call_id.clone().filter(|_| message.role == Role::Tool),
        // `name` is a participant name; tool messages identify themselves by tool_call_id.
        name: message.name.clone().filter(|_| message.role != Role::Tool),
        prefix: false,
    }
}

fn tool_choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
    }
}

fn response_format(format: &ResponseFormat) -> Value {
    match format {
        ResponseFormat::Text => json!({"type": "text"}),
        ResponseFormat::JsonObject => json!({"type": "json_object"}),
        ResponseFormat::JsonSchema { name, schema, strict } => {
            let mut spec = json!({"name": name, "schema": schema});
            if let Some(strict) = strict {
                spec["strict"] = json!(strict);
            }
            json!({"type": "json_schema", "json_schema": spec})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::testkit::{continuation, upstream};
    use crate::types::{ChatRequest, Sampling, ToolCall, ToolSpec};

    fn body_json(req: &UpstreamRequest) -> Value {
        typed(req, "gpt-4o-mini")
    }

    fn conversation() -> ChatRequest {
        let mut assistant = Message::text(Role::Assistant, "");
        assistant.tool_calls.push(ToolCall {
            index: 0,
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into(),
        });
        let mut tool = Message::text(Role::Tool, "18C");
        tool.tool_call_id = Some("call_1".into());
        let mut user = Message::text(Role::User, "Look:");
        user.content.push(ContentPart::ImageUrl {
            url: "https://example.com/a.png".into(),
        });
        ChatRequest {
            model: "chat".into(),
            messages: vec![Message::text(Role::System, "Be brief."), user, assistant, tool],
            tools: vec![ToolSpec {
                name: "get_weather".into(),
                description: Some("Weather now".into()),
                parameters: json!({"type": "object"}),
            }],
            tool_choice: Some(ToolChoice::Tool("get_weather".into())),
            response_format: Some(ResponseFormat::JsonSchema {
                name: "w".into(),
                schema: json!({}),
                strict: Some(true),
            }),
            sampling: Sampling {
                temperature: Some(0.2),
                top_p: None,
                stop: vec!["END".into()],
                seed: Some(7),
                presence_penalty: None,
                frequency_penalty: Some(0.5),
            },
            max_tokens: Some(100),
            ..ChatRequest::default()
        }
    }

    #[test]
    fn body_carries_the_route_model_and_always_streams_with_usage() {
        let body = body_json(&upstream(conversation(), None));
        assert_eq!(
            body["model"], "gpt-4o-mini",
            "the route's upstream model, not the client's name"
        );
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
        assert_eq!(body["max_tokens"], 100);
        assert_eq!(body["temperature"], 0.2);
        assert_eq!(body["seed"], 7);
        assert_eq!(body["frequency_penalty"], 0.5);
        assert_eq!(body["stop"], json!(["END"]));
        assert!(body.get("top_p").is_none(), "unset sampling params are omitted");
    }

    #[test]
    fn messages_map_roles_images_tool_calls_and_results() {
        let body = body_json(&upstream(conversation(), None));
        let messages = &body["messages"];
        assert_eq!(messages[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(
            messages[1]["content"],
            json!([{"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}])
        );
        assert_eq!(
            messages[2]["content"],
            Value::Null,
            "tool-only assistant turn has null content"
        );
        assert_eq!(
            messages[2]["tool_calls"],
            json!([{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}])
        );
        assert_eq!(
            messages[3],
            json!({"role": "tool", "content": "18C", "tool_call_id": "call_1"})
        );
    }

    #[test]
    fn tools_tool_choice_and_response_format_use_openai_shapes() {
        let body = body_json(&upstream(conversation(), None));
        assert_eq!(
            body["tools"],
            json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {"type": "object"}}}])
        );
        assert_eq!(
            body["tool_choice"],
            json!({"type": "function", "function": {"name": "get_weather"}})
        );
        assert_eq!(
            body["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "w", "schema": {}, "strict": true}})
        );
        let mut no_tools = conversation();
        no_tools.tools.clear();
        let body = body_json(&upstream(no_tools, None));
        assert!(
            body.get("tool_choice").is_none() && body.get("tools").is_none(),
            "no tool_choice without tools"
        );
    }

    #[test]
    fn a_continuation_ends_with_the_partial_answer_never_an_instruction() {
        let chat = ChatRequest {
            messages: vec![Message::text(Role::User, "Count")],
            ..ChatRequest::default()
        };
        let plain = body_json(&continuation(chat.clone(), "1, 2, ", PrefillConvention::Assistant));
        let messages = plain["messages"].as_array().cloned().unwrap_or_default();
        assert_eq!(messages.len(), 2, "no user turn after the partial answer: {messages:?}");
        assert_eq!(messages[1], json!({"role": "assistant", "content": "1, 2, "}));
        assert!(plain.get("continue_final_message").is_none(), "{plain}");

        let prefix = body_json(&continuation(chat.clone(), "1, 2, ", PrefillConvention::Prefix));
        assert_eq!(
            prefix["messages"][1],
            json!({"role": "assistant", "content": "1, 2, ", "prefix": true}),
            "DeepSeek / Mistral mark the final message"
        );

        let vllm = body_json(&continuation(chat, "1, 2, ", PrefillConvention::Vllm));
        assert_eq!(vllm["messages"][1], json!({"role": "assistant", "content": "1, 2, "}));
        assert_eq!(vllm["continue_final_message"], json!(true), "{vllm}");
        assert_eq!(vllm["add_generation_prompt"], json!(false), "{vllm}");
    }

    #[test]
    fn a_continuation_of_a_clients_own_prefill_is_one_final_assistant_message() {
        let chat = ChatRequest {
            messages: vec![
                Message::text(Role::User, "Greet"),
                Message::text(Role::Assistant, "Hello wörld,"),
            ],
            ..ChatRequest::default()
        };
        for convention in [
            PrefillConvention::Assistant,
            PrefillConvention::Prefix,
            PrefillConvention::Vllm,
        ] {
            let body = body_json(&continuation(chat.clone(), " this is", convention));
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            assert_eq!(messages.len(), 2, "{convention:?}: {messages:?}");
            assert_eq!(messages[1]["role"], "assistant");
            assert_eq!(messages[1]["content"], "Hello wörld, this is", "{convention:?}");
        }
        // Without a continuation the client's prefill goes as it came.
        let body = body_json(&upstream(chat, None));
        assert_eq!(
            body["messages"][1],
            json!({"role": "assistant", "content": "Hello wörld,"})
        );
    }

    fn typed(req: &UpstreamRequest, model: &str) -> Value {
        serde_json::to_value(build_body(req, model, &ModelRules::for_model(Wire::OpenAi, model))).unwrap_or_default()
    }

    #[test]
    fn reasoning_models_get_max_completion_tokens_and_the_reasoning_effort() {
        let chat = ChatRequest {
            max_tokens: Some(200),
            reasoning_effort: Some("low".into()),
            ..conversation()
        };
        let upstream = upstream(chat, None);
        let body = typed(&upstream, "o4-mini");
        assert_eq!(body["max_completion_tokens"], 200, "{body}");
        assert!(
            body.get("max_tokens").is_none(),
            "never max_tokens to a reasoning model: {body}"
        );
        assert_eq!(body["reasoning_effort"], "low", "{body}");
        let body = typed(&upstream, "gpt-4o-mini");
        assert_eq!(body["max_tokens"], 200, "{body}");
        assert!(body.get("max_completion_tokens").is_none(), "{body}");
    }
}
