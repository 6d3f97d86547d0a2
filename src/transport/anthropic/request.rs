//! Decoding an Anthropic Messages request body into a `ChatRequest`: system blocks, text /
//! image / tool_use / tool_result content, tools with `input_schema`, and `tool_choice`.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::transport::decode_error::{DecodeError, PathStyle};
use crate::transport::verbatim;
use crate::types::{
    ChatRequest, ContentPart, Message, MessageJson, RawJson, Role, Sampling, ToolCall, ToolChoice, ToolSpec, Wire,
};

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawRequest {
    model: Option<String>,
    max_tokens: Option<u32>,
    system: Option<Box<RawValue>>,
    /// Each turn's JSON text, decoded by `turn` straight into its `RawMessage`.
    messages: Option<Vec<Box<RawValue>>>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    metadata: Option<Map<String, Value>>,
    stream: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct RawMessage {
    role: String,
    /// Missing is null, refused with the key path by `message`.
    #[serde(default)]
    content: Value,
}

#[derive(Debug, Deserialize)]
struct RawTool {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    name: String,
    #[serde(default)]
    description: Option<String>,
    input_schema: Option<Value>,
}

/// Decodes a Messages request body. Errors name the field the way Anthropic does
/// (`messages.0.content.1`).
pub fn decode_request(body: &[u8]) -> Result<ChatRequest, DecodeError> {
    DecodeError::require_object(body)?;
    let raw: RawRequest = serde_json::from_slice(body).map_err(|e| {
        let again = &mut serde_json::Deserializer::from_slice(body);
        DecodeError::from_json_in::<RawRequest, _>(e, again, PathStyle::Dotted)
    })?;
    let model = raw
        .model
        .filter(|m| !m.trim().is_empty())
        .ok_or_else(|| DecodeError::new("model", "model: field required"))?;
    let max_tokens = raw
        .max_tokens
        .ok_or_else(|| DecodeError::new("max_tokens", "max_tokens: field required"))?;
    if max_tokens == 0 {
        return Err(DecodeError::new(
            "max_tokens",
            "max_tokens: Input should be greater than or equal to 1",
        ));
    }
    let raw_messages = raw
        .messages
        .ok_or_else(|| DecodeError::new("messages", "messages: field required"))?;
    if raw_messages.is_empty() {
        return Err(DecodeError::new(
            "messages",
            "messages: at least one message is required",
        ));
    }
    let mut messages = Vec::new();
    if let Some(system) = raw.system {
        let value: Value = DecodeError::decode_raw_at(&system, "system", PathStyle::Dotted)?;
        if let Some(mut prompt) = system_message(value)? {
            prompt.json = Some(MessageJson::Own(Wire::Anthropic, RawJson::new(system)));
            messages.push(prompt);
        }
    }
    let last = raw_messages.len() - 1;
    for (i, m) in raw_messages.into_iter().enumerate() {
        turn(i, m, i == last, &mut messages)?;
    }
    let tools = raw
        .tools
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, t)| tool(i, t))
        .collect::<Result<Vec<_>, _>>()?;
    crate::transport::ranges::anthropic(ChatRequest {
        model,
        messages,
        tool_choice: raw.tool_choice.map(|v| tool_choice(v, &tools)).transpose()?,
        tools,
        response_format: None,
        sampling: Sampling {
            temperature: raw.temperature,
            top_p: raw.top_p,
            stop: raw.stop_sequences.unwrap_or_default(),
            ..Sampling::default()
        },
        max_tokens: Some(max_tokens),
        // The Anthropic dialect's own reasoning control is `thinking`, not this.
        reasoning_effort: None,
        stream: raw.stream.unwrap_or(false),
        // Anthropic always reports usage.
        include_usage: true,
        metadata: raw.metadata.unwrap_or_default(),
        verbatim: verbatim::from_body(Wire::Anthropic, body),
    })
}

fn system_message(system: Value) -> Result<Option<Message>, DecodeError> {
    let parts = match system {
        Value::Null => return Ok(None),
        // No system prompt said as nothing: no system message.
        Value::String(s) if s.is_empty() => return Ok(None),
        Value::Array(blocks) if blocks.is_empty() => return Ok(None),
        Value::String(s) => vec![ContentPart::Text(s)],
        Value::Array(blocks) => blocks
            .into_iter()
            .enumerate()
            .map(|(i, b)| match (block_type(&b), b.get("text").and_then(Value::as_str)) {
                ("text", Some(text)) => Ok(ContentPart::Text(text.to_string())),
                _ => Err(DecodeError::new(
                    format!("system.{i}"),
                    format!("system.{i}: only text blocks are supported"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => {
            return Err(DecodeError::new(
                "system",
                "system: must be a string or an array of text blocks",
            ))
        }
    };
    Ok(Some(Message {
        content: parts,
        ..empty(Role::System)
    }))
}

fn block_type(block: &Value) -> &str {
    block.get("type").and_then(Value::as_str).unwrap_or_default()
}

/// One Anthropic turn can become several neutral messages: each `tool_result` block is a
/// tool message of its own, in order, around the user's text. As Anthropic's API, every
/// turn must have content except a final assistant turn (an empty prefill), and a text
/// block must hold text.
fn turn(i: usize, value: Box<RawValue>, last: bool, out: &mut Vec<Message>) -> Result<(), DecodeError> {
    let first = out.len();
    turn_messages(i, &value, last, out)?;
    // The turn's JSON goes with the first message it became; the others say they are part of it.
    let mut json = Some(MessageJson::Own(Wire::Anthropic, RawJson::new(value)));
    for message in &mut out[first..] {
        message.json = Some(json.take().unwrap_or(MessageJson::SameTurn));
    }
    Ok(())
}

fn turn_messages(i: usize, value: &RawValue, last: bool, out: &mut Vec<Message>) -> Result<(), DecodeError> {
    let at = format!("messages.{i}");
    let raw: RawMessage = DecodeError::decode_raw_at(value, &at, PathStyle::Dotted)?;
    let role = match raw.role.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        other => {
            return Err(DecodeError::new(
                format!("{at}.role"),
                format!("{at}.role: must be \"user\" or \"assistant\", not {other:?} (put system prompts in 'system')"),
            ))
        }
    };
    let may_be_empty = last && role == Role::Assistant;
    let empty_content = || {
        DecodeError::new(
            format!("{at}.content"),
            format!("{at}.content: must not be empty (every message needs content, except a final assistant message)"),
        )
    };
    let blocks = match raw.content {
        Value::String(text) if text.is_empty() && !may_be_empty => return Err(empty_content()),
        Value::String(text) => {
            out.push(Message::text(role, text));
            return Ok(());
        }
        Value::Array(blocks) if blocks.is_empty() && !may_be_empty => return Err(empty_content()),
        Value::Array(blocks) => blocks,
        // A missing `content` decodes as null.
        Value::Null => {
            return Err(DecodeError::new(
                format!("{at}.content"),
                format!("{at}.content: field required"),
            ))
        }
        _ => {
            return Err(DecodeError::new(
                format!("{at}.content"),
                format!("{at}.content: must be a string or an array of blocks"),
            ))
        }
    };
    let mut current = empty(role);
    for (j, block) in blocks.into_iter().enumerate() {
        let at = format!("{at}.content.{j}");
        match (block_type(&block), role) {
            ("text", _) => current.content.push(text_block(&block, &at)?),
            ("image", _) => current.content.push(image_block(&block, &at)?),
            ("tool_use", Role::Assistant) => {
                let index = u32::try_from(current.tool_calls.len()).unwrap_or(u32::MAX);
                current.tool_calls.push(tool_use_block(&block, &at, index)?);
            }
            ("tool_result", Role::User) => {
                if !current.content.is_empty() {
                    out.push(std::mem::replace(&mut current, empty(role)));
                }
                out.push(tool_result_block(block, &at)?);
            }
            (kind @ ("tool_use" | "tool_result"), _) => {
                return Err(DecodeError::new(
                    at.clone(),
                    format!("{at}: a {kind} block cannot appear in a {} turn", raw.role),
                ))
            }
            ("", _) => return Err(DecodeError::new(at.clone(), format!("{at}.type: field required"))),
            // A `document`, `thinking`, `redacted_thinking`, `search_result` or newer block:
            // an Anthropic-wire route receives it in the turn as sent (a thinking block with
            // its signature); no other wire can carry it.
            (other, _) => current.content.push(ContentPart::Opaque {
                wire: Wire::Anthropic,
                kind: other.to_string(),
            }),
        }
    }
    if !current.content.is_empty() || !current.tool_calls.is_empty() {
        out.push(current);
    }
    Ok(())
}

fn empty(role: Role) -> Message {
    Message {
        role,
        content: Vec::new(),
        tool_calls: Vec::new(),
        tool_call_id: None,
        name: None,
        json: None,
    }
}

fn text_block(block: &Value, at: &str) -> Result<ContentPart, DecodeError> {
    match block.get("text").and_then(Value::as_str) {
        None => Err(DecodeError::new(
            format!("{at}.text"),
            format!("{at}.text: field required"),
        )),
        Some("") => Err(DecodeError::new(
            format!("{at}.text"),
            format!("{at}.text: text content blocks must be non-empty"),
        )),
        Some(text) => Ok(ContentPart::Text(text.to_string())),
    }
}

/// Base64 sources become `data:` URLs; URL sources stay URLs.
fn image_block(block: &Value, at: &str) -> Result<ContentPart, DecodeError> {
    let source = block.get("source");
    let field = |name: &str| source.and_then(|s| s.get(name)).and_then(Value::as_str);
    let url = match field("type") {
        Some("base64") => match (field("media_type"), field("data")) {
            (Some(media), Some(data)) => format!("data:{media};base64,{data}"),
            _ => {
                return Err(DecodeError::new(
                    format!("{at}.source"),
                    format!("{at}.source: media_type and data are required"),
                ))
            }
        },
        Some("url") => field("url")
            .ok_or_else(|| DecodeError::new(format!("{at}.source.url"), format!("{at}.source.url: field required")))?
            .to_string(),
        _ => {
            return Err(DecodeError::new(
                format!("{at}.source"),
                format!("{at}.source: type must be base64 or url"),
            ))
        }
    };
    Ok(ContentPart::ImageUrl { url })
}

fn tool_use_block(block: &Value, at: &str, index: u32) -> Result<ToolCall, DecodeError> {
    let field = |name: &str| {
        block
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| DecodeError::new(format!("{at}.{name}"), format!("{at}.{name}: field required")))
    };
    let input = block.get("input").cloned().unwrap_or_else(|| Value::Object(Map::new()));
    Ok(ToolCall {
        index,
        id: field("id")?,
        name: field("name")?,
        arguments: input.to_string(),
    })
}

fn tool_result_block(block: Value, at: &str) -> Result<Message, DecodeError> {
    let id = block
        .get("tool_use_id")
        .and_then(Value::as_str)
        .ok_or_else(|| DecodeError::new(format!("{at}.tool_use_id"), format!("{at}.tool_use_id: field required")))?
        .to_string();
    let content = match block.get("content") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![ContentPart::Text(s.clone())],
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let at = format!("{at}.content.{k}");
                match block_type(p) {
                    "text" => text_block(p, &at),
                    "image" => image_block(p, &at),
                    "" => Err(DecodeError::new(at.clone(), format!("{at}.type: field required"))),
                    other => Ok(ContentPart::Opaque {
                        wire: Wire::Anthropic,
                        kind: other.to_string(),
                    }),
                }
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => {
            return Err(DecodeError::new(
                format!("{at}.content"),
                format!("{at}.content: must be a string or blocks"),
            ))
        }
    };
    Ok(Message {
        content,
        tool_call_id: Some(id),
        ..empty(Role::Tool)
    })
}

fn tool(i: usize, value: Value) -> Result<ToolSpec, DecodeError> {
    let at = format!("tools.{i}");
    let raw: RawTool = DecodeError::decode_at(&value, &at, PathStyle::Dotted)?;
    if let Some(kind) = raw.kind.as_deref().filter(|k| *k != "custom") {
        return Err(DecodeError::new(
            at.clone(),
            format!("{at}: server tool {kind:?} is not supported"),
        ));
    }
    let schema = raw.input_schema.ok_or_else(|| {
        DecodeError::new(
            format!("{at}.input_schema"),
            format!("{at}.input_schema: field required"),
        )
    })?;
    Ok(ToolSpec {
        name: raw.name,
        description: raw.description,
        parameters: schema,
    })
}

fn tool_choice(value: Value, tools: &[ToolSpec]) -> Result<ToolChoice, DecodeError> {
    let kind = block_type(&value);
    match kind {
        "auto" => Ok(ToolChoice::Auto),
        "any" => Ok(ToolChoice::Required),
        "none" => Ok(ToolChoice::None),
        "tool" => {
            let name = value
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| DecodeError::new("tool_choice.name", "tool_choice.name: field required"))?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(DecodeError::new(
                    "tool_choice.name",
                    format!("tool_choice names tool {name:?}, which is not in tools"),
                ));
            }
            Ok(ToolChoice::Tool(name.to_string()))
        }
        other => Err(DecodeError::new(
            "tool_choice.type",
            format!("tool_choice.type: must be auto, any, tool or none, not {other:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode(v: Value) -> Result<ChatRequest, DecodeError> {
        decode_request(v.to_string().as_bytes())
    }

    fn minimal() -> Value {
        json!({"model": "chat", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]})
    }

    #[test]
    fn a_value_of_the_wrong_type_is_named_the_way_anthropic_names_fields() {
        let e = decode(json!({"model": "chat", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": 5}]}))
            .expect_err("a number for content");
        assert_eq!(e.param.as_deref(), Some("messages.1.content"), "{e:?}");
        let mut v = minimal();
        v["max_tokens"] = json!("x");
        let e = decode(v).expect_err("a string max_tokens");
        assert_eq!(e.param.as_deref(), Some("max_tokens"), "{e:?}");
    }

    #[test]
    fn json_only_a_message_s_own_parse_finds_invalid_is_refused_naming_the_message() {
        // Messages are kept as text by the outer decode and parsed once each: a key sent
        // twice, or a lone surrogate, fails there and names the message.
        let twice = br#"{"model":"chat","max_tokens":1,"messages":[{"role":"user","content":"a","content":"b"}]}"#;
        let surrogate = br#"{"model":"chat","max_tokens":1,"messages":[{"role":"user","content":"ok"},{"role":"assistant","content":"\udc00"}]}"#;
        for (body, param, says) in [
            (&twice[..], "messages.0", "duplicate field"),
            (&surrogate[..], "messages.1", "not valid JSON"),
        ] {
            let e = decode_request(body).expect_err("refused");
            assert!(e.message.contains(says), "{says}: {e:?}");
            assert_eq!(e.param.as_deref(), Some(param), "{e:?}");
        }
    }

    fn with(field: &str, value: Value) -> Value {
        let mut v = minimal();
        v[field] = value;
        v
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
    fn minimal_request_decodes() {
        let req = decode(minimal()).expect("decodes");
        assert_eq!(req.model, "chat", "model");
        assert_eq!(req.max_tokens, Some(100), "max_tokens");
        assert_eq!(typed(&req), vec![Message::text(Role::User, "hi")], "one user turn");
        assert!(req.include_usage, "usage is always reported in this dialect");
    }

    #[test]
    fn a_final_assistant_turn_and_the_system_prompt_may_be_empty() {
        for empty in [json!(""), json!([])] {
            let v = with(
                "messages",
                json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": empty.clone()}]),
            );
            let req = decode(v).unwrap_or_else(|e| panic!("an empty prefill {empty}: {}", e.message));
            assert_eq!(typed(&req)[0], Message::text(Role::User, "hi"), "{empty}");
            let req = decode(with("system", empty.clone())).unwrap_or_else(|e| panic!("{empty}: {}", e.message));
            assert_eq!(
                typed(&req),
                vec![Message::text(Role::User, "hi")],
                "an empty system prompt is none: {empty}"
            );
        }
    }

    #[test]
    fn system_string_and_blocks_become_a_system_message() {
        let req = decode(with("system", json!("be brief"))).expect("decodes");
        assert_eq!(typed(&req)[0], Message::text(Role::System, "be brief"), "string system");
        let req = decode(with("system", json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}])))
            .expect("decodes");
        assert_eq!(req.messages[0].joined_text(), "ab", "system blocks joined in order");
        assert_eq!(req.messages[0].role, Role::System, "as a system message");
    }

    #[test]
    fn tool_use_and_tool_result_blocks_map_to_calls_and_tool_messages() {
        let v = with(
            "messages",
            json!([
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "checking"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {"type": "text", "text": "thanks"}
                ]}
            ]),
        );
        let req = decode(v).expect("decodes");
        let roles: Vec<Role> = req.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            vec![Role::User, Role::Assistant, Role::Tool, Role::User],
            "tool result becomes its own message"
        );
        assert_eq!(
            req.messages[1].tool_calls[0].arguments, r#"{"city":"Paris"}"#,
            "input becomes JSON arguments"
        );
        assert_eq!(
            req.messages[2].tool_call_id.as_deref(),
            Some("toolu_1"),
            "result names its call"
        );
        assert_eq!(req.messages[2].joined_text(), "sunny", "result content");
        assert_eq!(
            req.messages[3].joined_text(),
            "thanks",
            "trailing text stays a user message"
        );
    }

    #[test]
    fn images_become_urls() {
        let v = with(
            "messages",
            json!([{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
            ]}]),
        );
        let req = decode(v).expect("decodes");
        assert_eq!(
            req.messages[0].content,
            vec![
                ContentPart::ImageUrl {
                    url: "data:image/png;base64,AAAA".into()
                },
                ContentPart::ImageUrl {
                    url: "https://x/y.png".into()
                }
            ],
            "base64 as data URL, url as is"
        );
    }

    #[test]
    fn tools_and_choices_decode() {
        let mut v = with(
            "tools",
            json!([{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}]),
        );
        for (choice, want) in [
            (json!({"type": "auto"}), ToolChoice::Auto),
            (json!({"type": "any"}), ToolChoice::Required),
            (json!({"type": "none"}), ToolChoice::None),
            (
                json!({"type": "tool", "name": "get_weather"}),
                ToolChoice::Tool("get_weather".into()),
            ),
        ] {
            v["tool_choice"] = choice.clone();
            let req = decode(v.clone()).expect("decodes");
            assert_eq!(req.tool_choice, Some(want), "tool_choice {choice}");
            assert_eq!(
                req.tools[0].parameters,
                json!({"type": "object"}),
                "input_schema is the schema"
            );
        }
    }

    #[test]
    fn sampling_stop_metadata_and_stream_decode() {
        let mut v = with("stop_sequences", json!(["END"]));
        v["temperature"] = json!(0.3);
        v["top_p"] = json!(0.8);
        v["metadata"] = json!({"user_id": "u"});
        v["stream"] = json!(true);
        let req = decode(v).expect("decodes");
        assert_eq!(req.sampling.stop, vec!["END".to_string()], "stop sequences");
        assert_eq!(
            (req.sampling.temperature, req.sampling.top_p),
            (Some(0.3), Some(0.8)),
            "sampling"
        );
        assert_eq!(req.metadata.get("user_id"), Some(&json!("u")), "metadata");
        assert!(req.stream, "stream");
    }

    #[test]
    fn bad_requests_name_the_field() {
        let cases = [
            (
                json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}),
                "max_tokens",
            ),
            (
                json!({"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}),
                "model",
            ),
            (json!({"model": "chat", "max_tokens": 1}), "messages"),
            (
                json!({"model": "chat", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}),
                "max_tokens",
            ),
            (
                with("messages", json!([{"role": "system", "content": "x"}])),
                "messages.0.role",
            ),
            (
                with("messages", json!([{"role": "user", "content": [{"text": "x"}]}])),
                "messages.0.content.0",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b"}]}]),
                ),
                "messages.0.content.0",
            ),
            (with("tools", json!([{"name": "f"}])), "tools.0.input_schema"),
            (
                with("tools", json!([{"type": "web_search_20250305", "name": "web_search"}])),
                "tools.0",
            ),
            (
                with("tool_choice", json!({"type": "tool", "name": "ghost"})),
                "tool_choice.name",
            ),
            (
                with("messages", json!([{"role": "user", "content": []}])),
                "messages.0.content",
            ),
            (
                with("messages", json!([{"role": "user", "content": ""}])),
                "messages.0.content",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": []}, {"role": "user", "content": "again"}]),
                ),
                "messages.1.content",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": [{"type": "text", "text": ""}]}]),
                ),
                "messages.0.content.0.text",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": ""}]}]}]),
                ),
                "messages.0.content.0.content.0.text",
            ),
        ];
        for (body, param) in cases {
            let e = decode(body.clone()).expect_err("must be rejected");
            assert_eq!(
                e.param.as_deref(),
                Some(param),
                "{body} is rejected at {param}: {}",
                e.message
            );
        }
        let e = decode(with("messages", json!([{"role": "user", "content": []}]))).expect_err("empty");
        assert!(
            e.message.contains("messages.0.content") && e.message.contains("must not be empty"),
            "names the field: {}",
            e.message
        );
        let e = decode_request(b"{nope").expect_err("bad JSON");
        assert!(e.message.contains("not valid JSON"), "message: {}", e.message);
    }
}
