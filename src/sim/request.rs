//! Reads what the simulator needs from an incoming OpenAI or Anthropic request body: stream
//! or not, usage wanted, a rough input token count, and any assistant prefill to continue.

use serde_json::Value;

use super::answer::estimate_tokens;

/// The parts of a request that change the simulated answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Inbound {
    pub stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub include_usage: bool,
    pub input_tokens: u32,
    /// Assistant text the answer should continue from.
    pub prefill: Option<String>,
    pub model: Option<String>,
}

/// Parses a Chat Completions request body.
pub(crate) fn openai(body: &Value) -> Inbound {
    let messages = messages(body);
    Inbound {
        stream: flag(body, "stream"),
        include_usage: body.get("stream_options").is_some_and(|o| flag(o, "include_usage")),
        input_tokens: estimate_tokens(&all_text(&messages)).max(1),
        prefill: prefill(&messages),
        model: model(body),
    }
}

/// Parses a Messages request body (the system prompt sits beside the messages).
pub(crate) fn anthropic(body: &Value) -> Inbound {
    let messages = messages(body);
    let system = body.get("system").map(content_text).unwrap_or_default();
    Inbound {
        stream: flag(body, "stream"),
        include_usage: false,
        input_tokens: (estimate_tokens(&system) + estimate_tokens(&all_text(&messages))).max(1),
        prefill: prefill(&messages),
        model: model(body),
    }
}

/// One message as (role, text).
type Turn = (String, String);

fn messages(body: &Value) -> Vec<Turn> {
    body.get("messages")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|m| {
                    let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
                    let text = m.get("content").map(content_text).unwrap_or_default();
                    (role.to_owned(), text)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Text of a `content` that is a string or a list of parts with `text`.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

fn all_text(messages: &[Turn]) -> String {
    messages.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>().join(" ")
}

/// The assistant text to continue from: a final assistant message (prefill), or the last
/// assistant message when the final user message asks to continue.
fn prefill(messages: &[Turn]) -> Option<String> {
    let (last_role, last_text) = messages.last()?;
    let text = match last_role.as_str() {
        "assistant" => last_text.clone(),
        "user" if last_text.to_lowercase().contains("continue") => messages
            .iter()
            .rev()
            .skip(1)
            .find(|(role, _)| role == "assistant")
            .map(|(_, text)| text.clone())?,
        _ => return None,
    };
    (!text.is_empty()).then_some(text)
}

fn flag(v: &Value, key: &str) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn model(body: &Value) -> Option<String> {
    body.get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn openai_flags_and_input_estimate() {
        let body = json!({
            "model": "m", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "one two three"}]
        });
        let inbound = openai(&body);
        assert!(inbound.stream && inbound.include_usage, "flags: {inbound:?}");
        assert_eq!(inbound.input_tokens, 3, "words");
        assert_eq!(inbound.prefill, None, "no prefill");
        assert_eq!(inbound.model.as_deref(), Some("m"), "model");
    }

    #[test]
    fn anthropic_final_assistant_message_is_a_prefill() {
        let body = json!({
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "Hello big"}]}
            ]
        });
        let inbound = anthropic(&body);
        assert_eq!(inbound.prefill.as_deref(), Some("Hello big"), "prefill");
        assert_eq!(inbound.input_tokens, 5, "system words count too");
        assert!(!inbound.stream, "stream defaults to false");
    }

    #[test]
    fn a_user_asking_to_continue_after_an_assistant_turn_is_a_prefill() {
        let body = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello big"},
            {"role": "user", "content": "Continue exactly where you stopped."}
        ]});
        assert_eq!(openai(&body).prefill.as_deref(), Some("Hello big"), "prefill");
        let plain = json!({"messages": [
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "thanks"}
        ]});
        assert_eq!(openai(&plain).prefill, None, "no request to continue");
    }

    #[test]
    fn garbage_bodies_parse_to_defaults() {
        let inbound = openai(&json!({"messages": "nope", "stream": "yes"}));
        assert!(!inbound.stream, "non-bool stream is false");
        assert_eq!(inbound.input_tokens, 1, "minimum one input token");
    }
}
