//! `ChatRequest` -> Anthropic Messages request body (always streaming). A request that
//! arrived on the Anthropic wire is passed through (`provider::passthrough`); any other is
//! written from the typed view.
//!
//! What does not map from the typed view: `seed`, `presence_penalty` and `frequency_penalty`
//! do not exist in the Messages API and are dropped; so is `response_format` (Anthropic has
//! no JSON mode here; structured answers are still validated downstream).

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::types::{Block, ImageSource, MessagesBody, WireMessage, WireTool};
use crate::provider::passthrough::{Piece, SameWire};
use crate::provider::{ErrorClass, ProviderError, UpstreamRequest};
use crate::types::{
    ContentPart, Message, MessageJson, ModelRules, PrefillConvention, Role, ToolChoice, Verbatim, Wire,
};

/// `max_tokens` is required by the Messages API; this is used when the client set none.
pub const DEFAULT_MAX_TOKENS: u32 = crate::types::ANTHROPIC_DEFAULT_MAX_TOKENS;

/// The fields tailcut writes itself in a same-wire body; the client's own are not sent.
const OWNED: &[&str] = &["model", "messages", "system", "stream", "max_tokens"];

/// The body one attempt sends.
#[derive(Serialize)]
#[serde(untagged)]
pub(crate) enum Body<'a> {
    Typed(Box<MessagesBody>),
    SameWire(SameWire<'a>),
}

/// The body for `model` (the route's upstream model id) under the route's `rules`. Fails
/// only on a conversation Anthropic cannot express (a tool result without its call id,
/// tool-call arguments that are not JSON).
pub(crate) fn body<'a>(
    req: &'a UpstreamRequest,
    model: &'a str,
    rules: &ModelRules,
) -> Result<Body<'a>, ProviderError> {
    match req.chat.verbatim.as_deref().filter(|v| v.wire == Wire::Anthropic) {
        Some(verbatim) => same_wire(req, model, rules, verbatim).map(Body::SameWire),
        None => Ok(Body::Typed(Box::new(build_body(req, model)?))),
    }
}

/// The client's body with the owned fields rewritten: each turn the client sent is sent as it
/// was (thinking blocks with their signatures, `cache_control`, documents); a message tailcut
/// added (a repair) is written. A final assistant turn that the answer continues (the
/// client's own prefill) is written too, so a continuation joins it and its trailing
/// whitespace is cut, as the API requires.
fn same_wire<'a>(
    req: &'a UpstreamRequest,
    model: &'a str,
    rules: &ModelRules,
    verbatim: &'a Verbatim,
) -> Result<SameWire<'a>, ProviderError> {
    let chat = &req.chat;
    let mut body = SameWire::new(verbatim, &[OWNED], rules);
    let written_from = match chat.assistant_prefill() {
        Some(_) => chat.messages.len() - 1,
        None => chat.messages.len(),
    };
    let systems: Vec<&Message> = chat.messages.iter().filter(|m| m.role == Role::System).collect();
    let own_system = match systems.as_slice() {
        [one] => one.json.as_ref().and_then(|j| j.in_wire(Wire::Anthropic)),
        _ => None,
    };
    if let Some(raw) = own_system {
        body.set("system", Piece::Sent(raw.raw()));
    } else if let Some(system) = system_text(chat.messages.iter()) {
        body.set("system", Piece::made(&system)?);
    }
    let mut messages: Vec<Piece<'a>> = Vec::new();
    let mut written: Vec<WireMessage> = Vec::new();
    for (i, message) in chat.messages.iter().enumerate() {
        if message.role == Role::System {
            continue;
        }
        match &message.json {
            Some(json) if i < written_from => {
                if let Some(raw) = json.in_wire(Wire::Anthropic) {
                    flush(&mut written, &mut messages)?;
                    messages.push(Piece::Sent(raw.raw()));
                } else if *json != MessageJson::SameTurn {
                    let (role, blocks) = wire_message(message)?;
                    push_merged(&mut written, role, blocks);
                }
            }
            _ => {
                let (role, blocks) = wire_message(message)?;
                push_merged(&mut written, role, blocks);
            }
        }
    }
    end_with_prefill(req, &mut written);
    flush(&mut written, &mut messages)?;
    body.set("model", Piece::made(&model)?);
    body.set("messages", Piece::Array(messages));
    body.set(
        "max_tokens",
        Piece::made(&chat.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS))?,
    );
    body.set("stream", Piece::made(&true)?);
    Ok(body)
}

fn flush<'a>(written: &mut Vec<WireMessage>, out: &mut Vec<Piece<'a>>) -> Result<(), ProviderError> {
    for message in written.drain(..) {
        out.push(Piece::made(&message)?);
    }
    Ok(())
}

fn system_text<'m>(messages: impl Iterator<Item = &'m Message>) -> Option<String> {
    let system: Vec<String> = messages
        .filter(|m| m.role == Role::System)
        .map(Message::joined_text)
        .filter(|t| !t.is_empty())
        .collect();
    (!system.is_empty()).then(|| system.join("\n\n"))
}

/// The API continues a final assistant message, and rejects one ending in whitespace: the
/// whitespace is cut here, and the mux's seam drops its re-emission (`Prefill::withheld`). A
/// client's own final assistant message (its prefill) ending in whitespace is refused by the
/// API as well; the whitespace is cut the same way (an answer may then begin with it).
fn end_with_prefill(req: &UpstreamRequest, messages: &mut Vec<WireMessage>) {
    let sent = req
        .prefill
        .as_ref()
        .map(|p| PrefillConvention::Anthropic.sent_text(&p.text))
        .filter(|p| !p.is_empty());
    if let Some(partial) = sent {
        push_merged(
            messages,
            "assistant",
            vec![Block::Text {
                text: partial.to_string(),
            }],
        );
    }
    if let Some(last) = messages.last_mut().filter(|m| m.role == "assistant") {
        trim_final_text(&mut last.content);
        if last.content.is_empty() {
            messages.pop();
        }
    }
}

/// Builds the typed body for `model`.
pub fn build_body(req: &UpstreamRequest, model: &str) -> Result<MessagesBody, ProviderError> {
    let chat = &req.chat;
    let mut messages: Vec<WireMessage> = Vec::new();
    for message in chat.messages.iter().filter(|m| m.role != Role::System) {
        let (role, blocks) = wire_message(message)?;
        push_merged(&mut messages, role, blocks);
    }
    end_with_prefill(req, &mut messages);
    let tools: Vec<WireTool> = chat
        .tools
        .iter()
        .map(|t| WireTool {
            name: t.name.clone(),
            description: t.description.clone(),
            input_schema: t.parameters.clone(),
        })
        .collect();
    // OpenAI's `parallel_tool_calls: false` is Anthropic's `disable_parallel_tool_use`.
    let serial = chat
        .verbatim
        .as_deref()
        .filter(|v| v.wire == Wire::OpenAi)
        .and_then(|v| v.field("parallel_tool_calls"))
        .is_some_and(|raw| raw.text().trim() == "false");
    let tool_choice = chat
        .tool_choice
        .as_ref()
        .or(serial.then_some(&ToolChoice::Auto))
        .filter(|_| !tools.is_empty())
        .map(|choice| {
            let mut choice = match choice {
                ToolChoice::Auto => json!({"type": "auto"}),
                ToolChoice::Required => json!({"type": "any"}),
                ToolChoice::None => json!({"type": "none"}),
                ToolChoice::Tool(name) => json!({"type": "tool", "name": name}),
            };
            if serial && choice["type"] != "none" {
                choice["disable_parallel_tool_use"] = json!(true);
            }
            choice
        });
    let max_tokens = chat.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    // `reasoning_effort` as a thinking budget; thinking takes no temperature but 1, and no
    // top_p under 0.95 (docs/dialects.md, "Cross wire").
    let budget = chat.thinking_budget(max_tokens);
    let thinking = budget.map(|budget_tokens| json!({"type": "enabled", "budget_tokens": budget_tokens}));
    let sampling = &chat.sampling;
    // The OpenAI dialect takes 0 to 2, the Messages API 0 to 1 (it refuses more with a
    // 400, which never fails over): a hotter request is sent at the hottest it takes.
    let temperature = sampling.temperature.map(|t| t.clamp(0.0, 1.0));
    Ok(MessagesBody {
        model: model.to_string(),
        max_tokens,
        system: system_text(chat.messages.iter()),
        messages,
        tools,
        tool_choice,
        stop_sequences: sampling.stop.clone(),
        temperature: temperature.filter(|t| budget.is_none() || *t == 1.0),
        top_p: sampling.top_p.filter(|p| budget.is_none() || *p >= 0.95),
        thinking,
        metadata: chat.verbatim_str("user").map(|user_id| json!({"user_id": user_id})),
        stream: true,
    })
}

/// Consecutive messages of one role become one message: tool results answering parallel
/// calls must share a single user turn.
/// Cuts what the API refuses at the end of a final assistant text (`PrefillConvention::
/// Anthropic`) off the last block when it is text, dropping it if nothing is left.
fn trim_final_text(blocks: &mut Vec<Block>) {
    if let Some(Block::Text { text }) = blocks.last_mut() {
        text.truncate(PrefillConvention::Anthropic.sent_text(text).len());
        if text.is_empty() {
            blocks.pop();
        }
    }
}

fn push_merged(messages: &mut Vec<WireMessage>, role: &'static str, blocks: Vec<Block>) {
    if blocks.is_empty() {
        return; // the API rejects empty turns
    }
    match messages.last_mut() {
        Some(last) if last.role == role => last.content.extend(blocks),
        _ => messages.push(WireMessage { role, content: blocks }),
    }
}

fn wire_message(message: &Message) -> Result<(&'static str, Vec<Block>), ProviderError> {
    if message.role == Role::Tool {
        let Some(id) = message.tool_call_id.clone() else {
            return Err(bad_request("a tool result has no tool_call_id"));
        };
        return Ok((
            "user",
            vec![Block::ToolResult {
                tool_use_id: id,
                content: message.joined_text(),
            }],
        ));
    }
    let mut blocks: Vec<Block> = message
        .content
        .iter()
        .filter_map(|part| match part {
            // The API rejects empty text blocks.
            ContentPart::Text(text) if text.is_empty() => None,
            ContentPart::Text(text) => Some(Block::Text { text: text.clone() }),
            ContentPart::ImageUrl { url } => Some(Block::Image {
                source: image_source(url),
            }),
            // Only in a message of another wire, which no route of this one is given.
            ContentPart::Opaque { .. } => None,
        })
        .collect();
    for call in &message.tool_calls {
        let input = if call.arguments.trim().is_empty() {
            Value::Object(Map::new())
        } else {
            serde_json::from_str(&call.arguments)
                .map_err(|_| bad_request(&format!("tool call {} has arguments that are not JSON", call.id)))?
        };
        blocks.push(Block::ToolUse {
            id: call.id.clone(),
            name: call.name.clone(),
            input,
        });
    }
    let role = if message.role == Role::Assistant {
        "assistant"
    } else {
        "user"
    };
    Ok((role, blocks))
}

/// `data:<media type>;base64,<data>` becomes an inline image; anything else a URL image.
fn image_source(url: &str) -> ImageSource {
    let inline = url
        .strip_prefix("data:")
        .and_then(|rest| rest.split_once(','))
        .and_then(|(meta, data)| Some((meta.strip_suffix(";base64")?, data)));
    match inline {
        Some((media_type, data)) => ImageSource::Base64 {
            media_type: media_type.to_string(),
            data: data.to_string(),
        },
        None => ImageSource::Url { url: url.to_string() },
    }
}

fn bad_request(message: &str) -> ProviderError {
    ProviderError::new(ErrorClass::BadRequest, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::testkit::upstream;
    use crate::types::{ChatRequest, Sampling, ToolCall, ToolSpec};

    fn body_json(req: &UpstreamRequest) -> Value {
        let body = build_body(req, "claude-x").unwrap_or_else(|e| panic!("body builds: {e}"));
        serde_json::to_value(body).unwrap_or_default()
    }

    fn tool_result(id: &str, text: &str) -> Message {
        let mut m = Message::text(Role::Tool, text);
        m.tool_call_id = Some(id.into());
        m
    }

    fn conversation() -> ChatRequest {
        let mut assistant = Message::text(Role::Assistant, "Checking.");
        for (i, id) in ["t1", "t2"].iter().enumerate() {
            assistant.tool_calls.push(ToolCall {
                index: i as u32,
                id: (*id).into(),
                name: "w".into(),
                arguments: r#"{"c":"P"}"#.into(),
            });
        }
        let mut user = Message::text(Role::User, "Weather?");
        user.content.push(ContentPart::ImageUrl {
            url: "data:image/png;base64,iVBORw0".into(),
        });
        user.content.push(ContentPart::ImageUrl {
            url: "https://example.com/b.jpg".into(),
        });
        ChatRequest {
            messages: vec![
                Message::text(Role::System, "Be brief."),
                Message::text(Role::System, "Use metric."),
                user,
                assistant,
                tool_result("t1", "18C"),
                tool_result("t2", "19C"),
            ],
            tools: vec![ToolSpec {
                name: "w".into(),
                description: None,
                parameters: json!({"type": "object"}),
            }],
            tool_choice: Some(ToolChoice::Required),
            sampling: Sampling {
                temperature: Some(0.3),
                top_p: Some(0.9),
                stop: vec!["END".into()],
                seed: Some(1),
                presence_penalty: Some(0.1),
                frequency_penalty: Some(0.1),
            },
            ..ChatRequest::default()
        }
    }

    #[test]
    fn a_temperature_over_anthropics_range_is_sent_at_its_top() {
        let mut chat = conversation();
        chat.sampling.temperature = Some(1.5);
        let body = body_json(&upstream(chat, None));
        assert_eq!(body["temperature"], 1.0, "{body}");
        let mut chat = conversation();
        chat.sampling.temperature = Some(0.3);
        let body = body_json(&upstream(chat, None));
        assert_eq!(body["temperature"], json!(0.3), "within the range, as given: {body}");
    }

    #[test]
    fn system_is_joined_and_max_tokens_defaults() {
        let body = body_json(&upstream(conversation(), None));
        assert_eq!(body["model"], "claude-x");
        assert_eq!(body["system"], "Be brief.\n\nUse metric.");
        assert_eq!(
            body["max_tokens"], DEFAULT_MAX_TOKENS,
            "max_tokens is required upstream"
        );
        assert_eq!(body["stream"], true);
        assert_eq!(body["stop_sequences"], json!(["END"]));
        assert_eq!(
            (body["temperature"].clone(), body["top_p"].clone()),
            (json!(0.3), json!(0.9))
        );
        for dropped in ["seed", "presence_penalty", "frequency_penalty", "response_format"] {
            assert!(
                body.get(dropped).is_none(),
                "{dropped} does not exist in the Messages API"
            );
        }
    }

    #[test]
    fn images_tool_use_and_merged_tool_results() {
        let body = body_json(&upstream(conversation(), None));
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        assert_eq!(
            messages.len(),
            3,
            "user, assistant, one user turn of tool results: {messages:?}"
        );
        assert_eq!(
            messages[0]["content"][1],
            json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0"}})
        );
        assert_eq!(
            messages[0]["content"][2],
            json!({"type": "image", "source": {"type": "url", "url": "https://example.com/b.jpg"}})
        );
        assert_eq!(messages[1]["content"][0], json!({"type": "text", "text": "Checking."}));
        assert_eq!(
            messages[1]["content"][1],
            json!({"type": "tool_use", "id": "t1", "name": "w", "input": {"c": "P"}})
        );
        assert_eq!(
            messages[2],
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "18C"},
                {"type": "tool_result", "tool_use_id": "t2", "content": "19C"}
            ]})
        );
    }

    #[test]
    fn tools_and_tool_choice_use_anthropic_shapes() {
        let body = body_json(&upstream(conversation(), None));
        assert_eq!(
            body["tools"],
            json!([{"name": "w", "input_schema": {"type": "object"}}])
        );
        assert_eq!(body["tool_choice"], json!({"type": "any"}), "required maps to any");
        let mut chat = conversation();
        for (choice, want) in [
            (ToolChoice::Auto, json!({"type": "auto"})),
            (ToolChoice::None, json!({"type": "none"})),
            (ToolChoice::Tool("w".into()), json!({"type": "tool", "name": "w"})),
        ] {
            chat.tool_choice = Some(choice);
            assert_eq!(body_json(&upstream(chat.clone(), None))["tool_choice"], want);
        }
    }

    #[test]
    fn prefill_is_a_final_assistant_message_without_trailing_whitespace() {
        let chat = ChatRequest {
            messages: vec![Message::text(Role::User, "Count")],
            ..ChatRequest::default()
        };
        let body = body_json(&upstream(chat, Some("1, 2, \n")));
        assert_eq!(
            body["messages"][1],
            json!({"role": "assistant", "content": [{"type": "text", "text": "1, 2,"}]})
        );
    }

    #[test]
    fn unexpressible_conversations_are_bad_requests() {
        let mut orphan = Message::text(Role::Tool, "x");
        orphan.tool_call_id = None;
        let chat = ChatRequest {
            messages: vec![orphan],
            ..ChatRequest::default()
        };
        let err = build_body(&upstream(chat, None), "m").err().map(|e| e.class);
        assert_eq!(err, Some(ErrorClass::BadRequest));
    }

    #[test]
    fn a_clients_own_prefill_loses_its_trailing_whitespace_and_a_continuation_joins_it() {
        let chat = ChatRequest {
            messages: vec![
                Message::text(Role::User, "Greet"),
                Message::text(Role::Assistant, "Hello wörld, "),
            ],
            ..ChatRequest::default()
        };
        let body = body_json(&upstream(chat.clone(), None));
        assert_eq!(
            body["messages"][1],
            json!({"role": "assistant", "content": [{"type": "text", "text": "Hello wörld,"}]})
        );
        let body = body_json(&upstream(chat, Some(" this is ")));
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert_eq!(
            messages[1]["content"],
            json!([{"type": "text", "text": "Hello wörld, "}, {"type": "text", "text": " this is"}]),
            "one final assistant turn; only its end is trimmed"
        );
    }
}
