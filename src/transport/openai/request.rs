//! Decoding an OpenAI Chat Completions request body into a `ChatRequest`. Unknown fields
//! are ignored, as OpenAI-compatible servers do; every rejection names the field at fault.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::transport::decode_error::{DecodeError, PathStyle};

mod tools;
use crate::transport::verbatim;
use crate::types::{ChatRequest, ContentPart, Message, MessageJson, RawJson, Role, Sampling, ToolCall, Wire};
use tools::{response_format, tool, tool_choice};

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawRequest {
    model: Option<String>,
    /// Each message's JSON text, decoded by `message` straight into its `RawMessage`.
    messages: Option<Vec<Box<RawValue>>>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    response_format: Option<Value>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    stop: Option<Value>,
    seed: Option<i64>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    reasoning_effort: Option<String>,
    stream: Option<bool>,
    stream_options: Option<RawStreamOptions>,
    metadata: Option<Map<String, Value>>,
    n: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawStreamOptions {
    include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct RawMessage {
    role: String,
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<RawToolCall>>,
    #[serde(default)]
    tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawToolCall {
    id: String,
    #[serde(rename = "type", default)]
    kind: Option<String>,
    function: RawFunctionCall,
}

#[derive(Debug, Deserialize)]
struct RawFunctionCall {
    name: String,
    #[serde(default)]
    arguments: String,
}

/// Decodes a request body. Malformed JSON, missing `model`/`messages` and unsupported
/// values (`n > 1`, unknown roles or parts) are client errors.
pub fn decode_request(body: &[u8]) -> Result<ChatRequest, DecodeError> {
    DecodeError::require_object(body)?;
    let raw: RawRequest = serde_json::from_slice(body).map_err(|e| {
        let again = &mut serde_json::Deserializer::from_slice(body);
        DecodeError::from_json_in::<RawRequest, _>(e, again, PathStyle::Brackets)
    })?;
    let mut req = from_raw(raw)?;
    req.verbatim = verbatim::from_body(Wire::OpenAi, body);
    Ok(req)
}

/// Decodes a request that arrived inside another JSON message (WebSocket, query string).
pub fn decode_value(value: Value) -> Result<ChatRequest, DecodeError> {
    let Value::Object(object) = &value else {
        return Err(DecodeError::body("the request must be a JSON object"));
    };
    let raw = RawRequest::deserialize(&value)
        .map_err(|e| DecodeError::from_json_in::<RawRequest, _>(e, &value, PathStyle::Brackets))?;
    let mut req = from_raw(raw)?;
    req.verbatim = verbatim::from_value(Wire::OpenAi, object);
    Ok(req)
}

fn from_raw(raw: RawRequest) -> Result<ChatRequest, DecodeError> {
    let model = raw
        .model
        .filter(|m| !m.trim().is_empty())
        .ok_or_else(|| DecodeError::new("model", "you must provide a model parameter"))?;
    let raw_messages = raw
        .messages
        .ok_or_else(|| DecodeError::new("messages", "missing required parameter: 'messages'"))?;
    if raw_messages.is_empty() {
        return Err(DecodeError::new(
            "messages",
            "'messages' must contain at least one message",
        ));
    }
    match raw.n {
        None | Some(1) => {}
        Some(0) => return Err(DecodeError::new("n", "n must be 1")),
        Some(n) => {
            return Err(DecodeError::new(
                "n",
                format!("n = {n} is not supported: tailcut streams one choice per request; send {n} requests"),
            ))
        }
    }
    // No upstream answers with zero tokens; a 0 is a client's mistake, said so here.
    for (key, value) in [
        ("max_completion_tokens", raw.max_completion_tokens),
        ("max_tokens", raw.max_tokens),
    ] {
        if value == Some(0) {
            return Err(DecodeError::new(key, format!("{key} must be at least 1")));
        }
    }
    let messages = raw_messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let tools = raw
        .tools
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, t)| tool(i, t))
        .collect::<Result<Vec<_>, _>>()?;
    let tool_choice = raw.tool_choice.map(|v| tool_choice(v, &tools)).transpose()?.flatten();
    crate::transport::ranges::openai(ChatRequest {
        model,
        messages,
        tools,
        tool_choice,
        response_format: raw.response_format.map(response_format).transpose()?.flatten(),
        sampling: Sampling {
            temperature: raw.temperature,
            top_p: raw.top_p,
            stop: stop(raw.stop)?,
            seed: raw.seed,
            presence_penalty: raw.presence_penalty,
            frequency_penalty: raw.frequency_penalty,
        },
        max_tokens: raw.max_completion_tokens.or(raw.max_tokens),
        reasoning_effort: raw.reasoning_effort,
        stream: raw.stream.unwrap_or(false),
        include_usage: raw.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
        metadata: raw.metadata.unwrap_or_default(),
        verbatim: None,
    })
}

fn message(i: usize, value: Box<RawValue>) -> Result<Message, DecodeError> {
    let at = format!("messages[{i}]");
    let raw: RawMessage = DecodeError::decode_raw_at(&value, &at, PathStyle::Brackets)?;
    let role = match raw.role.as_str() {
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        "function" => {
            return Err(DecodeError::new(
                format!("{at}.role"),
                "the deprecated 'function' role is not supported; use 'tool'",
            ))
        }
        other => {
            return Err(DecodeError::new(
                format!("{at}.role"),
                format!("unknown role {other:?} in {at}"),
            ))
        }
    };
    // Only an assistant message that calls tools may go without content (OpenAI's rule).
    let has_calls = raw.tool_calls.as_ref().is_some_and(|c| !c.is_empty());
    if matches!(raw.content, None | Some(Value::Null)) && !(role == Role::Assistant && has_calls) {
        let why = match role {
            Role::Assistant => "an assistant message needs content or tool_calls",
            _ => "a message of this role needs content",
        };
        return Err(DecodeError::new(
            format!("{at}.content"),
            format!("missing required parameter: '{at}.content' ({why})"),
        ));
    }
    // An empty array says nothing (OpenAI refuses it the same way); an assistant message
    // that calls tools needs no content.
    if matches!(&raw.content, Some(Value::Array(parts)) if parts.is_empty()) && !(role == Role::Assistant && has_calls)
    {
        return Err(DecodeError::new(
            format!("{at}.content"),
            format!("invalid '{at}.content': empty array; expected a string or at least one content part"),
        ));
    }
    let content = content_parts(raw.content, &format!("{at}.content"))?;
    let tool_calls = match (role, raw.tool_calls) {
        (Role::Assistant, Some(calls)) => calls
            .into_iter()
            .enumerate()
            .map(|(j, c)| assistant_tool_call(&format!("{at}.tool_calls[{j}]"), j, c))
            .collect::<Result<Vec<_>, _>>()?,
        _ => Vec::new(),
    };
    let tool_call_id = match role {
        Role::Tool => Some(raw.tool_call_id.filter(|id| !id.is_empty()).ok_or_else(|| {
            DecodeError::new(
                format!("{at}.tool_call_id"),
                format!("{at} has role 'tool' but no tool_call_id"),
            )
        })?),
        _ => None,
    };
    Ok(Message {
        role,
        content,
        tool_calls,
        tool_call_id,
        name: raw.name,
        json: Some(MessageJson::Own(Wire::OpenAi, RawJson::new(value))),
    })
}

fn assistant_tool_call(at: &str, index: usize, raw: RawToolCall) -> Result<ToolCall, DecodeError> {
    if let Some(kind) = raw.kind.as_deref().filter(|k| *k != "function") {
        return Err(DecodeError::new(
            at,
            format!("{at}: tool call type {kind:?} is not supported"),
        ));
    }
    // Valid JSON that is not an object ("[1,2]", "\"str\"") is refused as non-JSON arguments
    // are: a call's arguments are an object, and an Anthropic route (`tool_use.input`) cannot
    // carry anything else. (Non-JSON text is refused where a route must parse it.)
    if serde_json::from_str::<Value>(&raw.function.arguments).is_ok_and(|v| !v.is_object()) {
        return Err(DecodeError::new(
            format!("{at}.function.arguments"),
            format!("tool call {} has arguments that are not a JSON object", raw.id),
        ));
    }
    Ok(ToolCall {
        index: u32::try_from(index).unwrap_or(u32::MAX),
        id: raw.id,
        name: raw.function.name,
        arguments: raw.function.arguments,
    })
}

/// Content is a string, null, or an array of `text` / `image_url` parts.
pub(crate) fn content_parts(value: Option<Value>, at: &str) -> Result<Vec<ContentPart>, DecodeError> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(text)) => Ok(vec![ContentPart::Text(text)]),
        Some(Value::Array(parts)) => parts
            .into_iter()
            .enumerate()
            .map(|(j, p)| content_part(p, &format!("{at}[{j}]")))
            .collect(),
        Some(_) => Err(DecodeError::new(
            at,
            format!("{at} must be a string or an array of content parts"),
        )),
    }
}

fn content_part(part: Value, at: &str) -> Result<ContentPart, DecodeError> {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
    let text_field = |field: &str| {
        part.get(field)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| DecodeError::new(at, format!("{at} has type {kind:?} but no string '{field}'")))
    };
    match kind {
        "text" => text_field("text").map(ContentPart::Text),
        "refusal" => text_field("refusal").map(ContentPart::Text),
        "image_url" => {
            let url = match part.get("image_url") {
                Some(Value::String(url)) => Some(url.clone()),
                Some(obj) => obj.get("url").and_then(Value::as_str).map(str::to_string),
                None => None,
            };
            url.map(|url| ContentPart::ImageUrl { url })
                .ok_or_else(|| DecodeError::new(at, format!("{at} has type \"image_url\" but no image_url.url")))
        }
        "" => Err(DecodeError::new(at, format!("{at} has no 'type'"))),
        // A `file`, `input_audio` or newer part: an OpenAI-wire route receives it as sent.
        other => Ok(ContentPart::Opaque {
            wire: Wire::OpenAi,
            kind: other.to_string(),
        }),
    }
}

fn stop(value: Option<Value>) -> Result<Vec<String>, DecodeError> {
    let bad = || DecodeError::new("stop", "stop must be a string or an array of strings");
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s]),
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(bad()),
            })
            .collect(),
        Some(_) => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ResponseFormat, ToolChoice};
    use serde_json::json;
    use tools::empty_object_schema;

    fn decode(v: Value) -> Result<ChatRequest, DecodeError> {
        decode_request(v.to_string().as_bytes())
    }

    fn minimal() -> Value {
        json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
    }

    fn with(field: &str, value: Value) -> Value {
        let mut v = minimal();
        v[field] = value;
        v
    }

    fn err_of(v: Value) -> DecodeError {
        match decode(v) {
            Err(e) => e,
            Ok(req) => panic!("expected a decode error, got {req:?}"),
        }
    }

    /// The typed view of the messages, without their own JSON.
    fn typed(req: &ChatRequest) -> Vec<Message> {
        let mut messages = req.messages.clone();
        for m in &mut messages {
            m.json = None;
        }
        messages
    }

    #[test]
    fn minimal_request_decodes_with_defaults() {
        let req = decode(minimal()).expect("minimal request decodes");
        assert_eq!(req.model, "chat", "model");
        assert_eq!(typed(&req), vec![Message::text(Role::User, "hi")], "one user message");
        assert!(!req.stream, "stream defaults to false");
        assert!(!req.include_usage, "usage defaults to off");
        assert_eq!(req.max_tokens, None, "no max tokens");
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let req = decode(with("logit_bias", json!({"1": 2})));
        assert!(req.is_ok(), "unknown fields do not fail the request: {req:?}");
    }

    #[test]
    fn system_and_developer_roles_become_system() {
        let v = with(
            "messages",
            json!([{"role": "developer", "content": "be brief"}, {"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]),
        );
        let roles: Vec<Role> = decode(v).expect("decodes").messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            vec![Role::System, Role::System, Role::User],
            "developer is a system prompt"
        );
    }

    #[test]
    fn array_content_keeps_text_and_images() {
        let v = with(
            "messages",
            json!([{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}}
            ]}]),
        );
        let req = decode(v).expect("decodes");
        assert_eq!(
            req.messages[0].content,
            vec![
                ContentPart::Text("what is this?".into()),
                ContentPart::ImageUrl {
                    url: "https://x/y.png".into()
                }
            ],
            "text and image parts in order"
        );
    }

    #[test]
    fn a_part_of_a_type_tailcut_does_not_read_is_kept_as_sent() {
        let part = json!({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}});
        let req = decode(with("messages", json!([{"role": "user", "content": [part.clone()]}]))).expect("decodes");
        assert_eq!(
            req.messages[0].content,
            [ContentPart::Opaque {
                wire: Wire::OpenAi,
                kind: "input_audio".into()
            }]
        );
        let raw = req.messages[0].json.as_ref().and_then(|j| j.in_wire(Wire::OpenAi));
        let sent: Value = raw
            .and_then(|r| serde_json::from_str(r.text()).ok())
            .unwrap_or_default();
        assert_eq!(sent["content"][0], part, "the message's own JSON keeps the part");
        let e = err_of(with("messages", json!([{"role": "user", "content": [{"text": "x"}]}])));
        assert_eq!(
            e.param.as_deref(),
            Some("messages[0].content[0]"),
            "a part without a type"
        );
    }

    #[test]
    fn tool_call_arguments_that_are_json_but_not_an_object_are_refused() {
        for arguments in ["[1,2]", "\"str\"", "42", "null", "true"] {
            let v = with(
                "messages",
                json!([
                    {"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{}"}},
                        {"id": "call_2", "type": "function", "function": {"name": "w", "arguments": arguments}}
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
                ]),
            );
            let e = decode(v).expect_err(arguments);
            assert_eq!(
                e.param.as_deref(),
                Some("messages[1].tool_calls[1].function.arguments"),
                "{arguments}: {}",
                e.message
            );
            assert!(e.message.contains("not a JSON object"), "{arguments}: {}", e.message);
        }
        for arguments in ["{\"a\":1}", "", "  "] {
            let v = with(
                "messages",
                json!([
                    {"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": arguments}}
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
                ]),
            );
            assert!(decode(v).is_ok(), "{arguments:?} is an object (or none)");
        }
    }

    #[test]
    fn assistant_tool_calls_and_tool_results_round_trip() {
        let v = with(
            "messages",
            json!([
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
            ]),
        );
        let req = decode(v).expect("decodes");
        let assistant = &req.messages[1];
        assert!(assistant.content.is_empty(), "null content is no parts");
        assert_eq!(
            assistant.tool_calls,
            vec![ToolCall {
                index: 0,
                id: "call_1".into(),
                name: "get_weather".into(),
                arguments: "{\"city\":\"Paris\"}".into()
            }],
            "the call is kept with its raw arguments"
        );
        assert_eq!(
            req.messages[2].tool_call_id.as_deref(),
            Some("call_1"),
            "tool result names its call"
        );
    }

    #[test]
    fn tool_message_without_call_id_is_rejected() {
        let e = err_of(with("messages", json!([{"role": "tool", "content": "x"}])));
        assert_eq!(
            e.param.as_deref(),
            Some("messages[0].tool_call_id"),
            "param names the missing field"
        );
    }

    #[test]
    fn an_empty_content_array_is_rejected_with_its_path() {
        let e = err_of(with("messages", json!([{"role": "user", "content": []}])));
        assert_eq!(e.param.as_deref(), Some("messages[0].content"), "{}", e.message);
        assert!(e.message.contains("empty array"), "says what is wrong: {}", e.message);
        let e = err_of(with(
            "messages",
            json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": []}]),
        ));
        assert_eq!(e.param.as_deref(), Some("messages[1].content"), "{}", e.message);
        let calls = with(
            "messages",
            json!([
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [], "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
            ]),
        );
        assert!(
            decode(calls).is_ok(),
            "an assistant message that calls tools needs no content"
        );
    }

    #[test]
    fn unknown_role_is_rejected() {
        let e = err_of(with("messages", json!([{"role": "robot", "content": "x"}])));
        assert!(e.message.contains("robot"), "message names the role: {}", e.message);
    }

    #[test]
    fn tools_and_tool_choice_decode() {
        let mut v = with(
            "tools",
            json!([{"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}}}]),
        );
        v["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
        let req = decode(v).expect("decodes");
        assert_eq!(req.tools[0].name, "get_weather", "tool name");
        assert_eq!(req.tools[0].parameters, json!({"type": "object"}), "schema kept");
        assert_eq!(
            req.tool_choice,
            Some(ToolChoice::Tool("get_weather".into())),
            "named choice"
        );
    }

    #[test]
    fn tool_without_parameters_gets_an_empty_object_schema() {
        let req = decode(with(
            "tools",
            json!([{"type": "function", "function": {"name": "now"}}]),
        ))
        .expect("decodes");
        assert_eq!(req.tools[0].parameters, empty_object_schema(), "default schema");
    }

    #[test]
    fn string_tool_choices_decode() {
        for (s, want) in [
            ("auto", ToolChoice::Auto),
            ("none", ToolChoice::None),
            ("required", ToolChoice::Required),
        ] {
            let mut v = with("tools", json!([{"type": "function", "function": {"name": "f"}}]));
            v["tool_choice"] = json!(s);
            assert_eq!(decode(v).expect("decodes").tool_choice, Some(want), "tool_choice {s}");
        }
    }

    #[test]
    fn tool_choice_naming_a_missing_tool_is_rejected() {
        let e = err_of(with(
            "tool_choice",
            json!({"type": "function", "function": {"name": "ghost"}}),
        ));
        assert_eq!(e.param.as_deref(), Some("tool_choice"), "param");
        assert!(e.message.contains("ghost"), "names the tool: {}", e.message);
    }

    #[test]
    fn response_formats_decode() {
        let req = decode(with("response_format", json!({"type": "json_object"}))).expect("decodes");
        assert_eq!(req.response_format, Some(ResponseFormat::JsonObject), "json_object");
        let req = decode(with(
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": true}}),
        ))
        .expect("decodes");
        assert_eq!(
            req.response_format,
            Some(ResponseFormat::JsonSchema {
                name: "answer".into(),
                schema: json!({"type": "object"}),
                strict: Some(true)
            }),
            "json_schema with name, schema and strict"
        );
        let req = decode(with("response_format", json!({"type": "text"}))).expect("decodes");
        assert_eq!(req.response_format, Some(ResponseFormat::Text), "text");
    }

    #[test]
    fn json_schema_without_schema_is_rejected() {
        let e = err_of(with(
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x"}}),
        ));
        assert_eq!(e.param.as_deref(), Some("response_format.json_schema.schema"), "param");
    }

    #[test]
    fn sampling_fields_decode() {
        let mut v = minimal();
        v["temperature"] = json!(0.2);
        v["top_p"] = json!(0.9);
        v["seed"] = json!(7);
        v["presence_penalty"] = json!(0.5);
        v["frequency_penalty"] = json!(-0.5);
        v["stop"] = json!("END");
        let s = decode(v).expect("decodes").sampling;
        assert_eq!(
            s,
            Sampling {
                temperature: Some(0.2),
                top_p: Some(0.9),
                stop: vec!["END".into()],
                seed: Some(7),
                presence_penalty: Some(0.5),
                frequency_penalty: Some(-0.5),
            },
            "every sampling knob is kept"
        );
        let s = decode(with("stop", json!(["a", "b"]))).expect("decodes").sampling;
        assert_eq!(s.stop, vec!["a".to_string(), "b".to_string()], "stop as an array");
        assert!(
            err_of(with("stop", json!(3))).message.contains("stop"),
            "stop of the wrong type is rejected"
        );
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let mut v = with("max_tokens", json!(10));
        assert_eq!(
            decode(v.clone()).expect("decodes").max_tokens,
            Some(10),
            "max_tokens alone"
        );
        v["max_completion_tokens"] = json!(20);
        assert_eq!(decode(v).expect("decodes").max_tokens, Some(20), "the newer field wins");
        for key in ["max_tokens", "max_completion_tokens"] {
            let e = decode(with(key, json!(0))).expect_err("zero tokens is refused");
            assert_eq!(e.param.as_deref(), Some(key), "{}", e.message);
        }
    }

    #[test]
    fn stream_and_include_usage_decode() {
        let mut v = with("stream", json!(true));
        v["stream_options"] = json!({"include_usage": true});
        let req = decode(v).expect("decodes");
        assert!(req.stream && req.include_usage, "stream with usage");
    }

    #[test]
    fn metadata_is_kept() {
        let req = decode(with("metadata", json!({"user": "u1"}))).expect("decodes");
        assert_eq!(req.metadata.get("user"), Some(&json!("u1")), "metadata kept");
    }

    #[test]
    fn n_above_one_is_rejected_saying_so() {
        let e = err_of(with("n", json!(3)));
        assert_eq!(e.param.as_deref(), Some("n"), "param is n");
        assert!(
            e.message.contains("not supported"),
            "message says n>1 is unsupported: {}",
            e.message
        );
        assert!(decode(with("n", json!(1))).is_ok(), "n = 1 is fine");
    }

    #[test]
    fn missing_model_or_messages_is_rejected() {
        let e = err_of(json!({"messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(e.param.as_deref(), Some("model"), "missing model");
        let e = err_of(json!({"model": "chat"}));
        assert_eq!(e.param.as_deref(), Some("messages"), "missing messages");
        let e = err_of(json!({"model": "chat", "messages": []}));
        assert_eq!(e.param.as_deref(), Some("messages"), "empty messages");
    }

    #[test]
    fn invalid_json_says_so() {
        let e = decode_request(b"{\"model\": ").expect_err("truncated JSON fails");
        assert!(e.message.contains("not valid JSON"), "message: {}", e.message);
        let e = decode_request(b"[1,2]").expect_err("an array is not a request");
        assert!(e.message.contains("must be a JSON object"), "message: {}", e.message);
        let e = decode(with("temperature", json!("hot"))).expect_err("wrong type fails");
        assert!(e.message.contains("invalid type"), "message: {}", e.message);
    }

    #[test]
    fn json_the_outer_decode_only_skips_is_refused_naming_its_message_not_a_position() {
        // A lone surrogate passes the outer decode, which keeps each message as text, and
        // fails when the message is parsed: the error names the message, with no line and
        // column counted from it.
        let body = br#"{"model":"chat","messages":[{"role":"user","content":"a \ud800 b"}]}"#;
        let e = decode_request(body).expect_err("a lone surrogate is not valid JSON");
        assert_eq!(e.param.as_deref(), Some("messages[0]"), "{e:?}");
        assert!(e.message.contains("not valid JSON"), "{e:?}");
        assert!(!e.message.contains("line"), "no position inside the message: {e:?}");
    }

    #[test]
    fn a_key_sent_twice_in_one_message_is_refused_naming_the_message() {
        // Which of two `content` values would stand is a guess; the request is refused.
        let body = br#"{"model":"chat","messages":[{"role":"user","content":"a"},
            {"role":"user","content":"b","content":"c"}]}"#;
        let e = decode_request(body).expect_err("a duplicate key is refused");
        assert!(e.message.contains("duplicate field"), "{e:?}");
        assert_eq!(e.param.as_deref(), Some("messages[1]"), "{e:?}");
    }

    #[test]
    fn a_value_of_the_wrong_type_is_named_by_its_place_in_the_request() {
        let e = decode(with("temperature", json!("hot"))).expect_err("a string temperature");
        assert_eq!(e.param.as_deref(), Some("temperature"), "{e:?}");
        assert!(!e.message.contains("line 1"), "the field, not a column: {}", e.message);
        let e = decode(json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}, {"role": 7}]}))
            .expect_err("a number for a role");
        assert_eq!(e.param.as_deref(), Some("messages[1].role"), "{e:?}");
        // The same from an embedded request (WebSocket, query string).
        let e = decode_value(with("max_tokens", json!(-1))).expect_err("a negative max_tokens");
        assert_eq!(e.param.as_deref(), Some("max_tokens"), "{e:?}");
        // A body that is not JSON keeps its own message, with no param.
        let e = decode_request(b"{\"model\": \"chat\",}").expect_err("a trailing comma");
        assert_eq!(e.param, None, "{e:?}");
    }

    #[test]
    fn decode_value_accepts_an_embedded_request() {
        let req = decode_value(minimal()).expect("decodes from a value");
        assert_eq!(req.model, "chat", "model");
    }
}
