//! Reads what the simulator needs from an incoming OpenAI or Anthropic request body: stream
//! or not, usage wanted, a rough input token count, the final assistant message (a prefill)
//! with the marks that say which continuation convention it follows, what the answer is
//! asked to be (`Asks`: offered tools and the tool choice, JSON mode or a schema, max_tokens,
//! the reasoning), and what OpenAI chunks must carry (logprobs, the service tier).

use serde_json::Value;

use super::answer::estimate_tokens;
use super::reasoning::{asked_by_model, Asked};

/// The parts of a request that change the simulated answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Inbound {
    pub stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub include_usage: bool,
    pub input_tokens: u32,
    /// The final assistant message, when the request ends with one that has text.
    pub prefill: Option<Prefill>,
    pub model: Option<String>,
    /// OpenAI `logprobs: true`: the `top_logprobs` asked for (0 without).
    pub logprobs: Option<u8>,
    /// OpenAI `service_tier`, as asked.
    pub service_tier: Option<String>,
    pub asks: Asks,
}

/// What the request asks of the answer, which an honouring scenario follows.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Asks {
    /// OpenAI `max_completion_tokens` / `max_tokens`, Anthropic `max_tokens`.
    pub max_tokens: Option<u32>,
    /// Offered tools as (name, JSON schema of the arguments).
    pub tools: Vec<(String, Value)>,
    pub tool_choice: ToolChoice,
    pub format: Option<Format>,
    /// The last user message's text: what a scenario's `quality` answers.
    pub prompt: String,
    /// A hash of every message (role and text): seeds the quality verdicts, so the same
    /// conversation always gets the same one.
    pub digest: u64,
    /// The conversation ends with a tool's result (OpenAI: a `tool` message; Anthropic: a
    /// user message with a `tool_result` block): a model then answers in text unless the
    /// request names the tool to call, so an agent loop ends.
    pub after_tool_result: bool,
    /// Reasoning the request turns on (Anthropic `thinking`) or its model always does.
    pub reasoning: Asked,
}

/// Whether and which tool the answer must call.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) enum ToolChoice {
    /// The model may call one (the simulator does, when tools are offered).
    #[default]
    Auto,
    /// Never call one.
    None,
    /// Call this one.
    Named(String),
}

/// OpenAI `response_format`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Format {
    JsonObject,
    JsonSchema(Value),
}

impl Asks {
    /// The tool the answer calls, with its schema, if any.
    pub fn tool(&self) -> Option<&(String, Value)> {
        match &self.tool_choice {
            ToolChoice::None => None,
            ToolChoice::Auto if self.after_tool_result => None,
            ToolChoice::Auto => self.tools.first(),
            ToolChoice::Named(name) => self.tools.iter().find(|(n, _)| n == name),
        }
    }
}

/// A final assistant message and how it is marked.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Prefill {
    pub text: String,
    /// OpenAI: the message has `"prefix": true`.
    pub prefix: bool,
    /// OpenAI: the request has `"continue_final_message": true`.
    pub continue_final_message: bool,
    /// The message's last content part is text ending in whitespace.
    pub trailing_whitespace: bool,
}

/// Parses a Chat Completions request body.
pub(crate) fn openai(body: &Value) -> Inbound {
    let messages = messages(body);
    Inbound {
        stream: flag(body, "stream"),
        include_usage: body.get("stream_options").is_some_and(|o| flag(o, "include_usage")),
        input_tokens: estimate_tokens(&all_text(&messages)).max(1),
        prefill: prefill(body, &messages),
        model: model(body),
        logprobs: flag(body, "logprobs").then(|| {
            let top = body.get("top_logprobs").and_then(Value::as_u64).unwrap_or(0);
            u8::try_from(top.min(20)).unwrap_or(20)
        }),
        service_tier: body.get("service_tier").and_then(Value::as_str).map(str::to_owned),
        asks: Asks {
            max_tokens: count(body, "max_completion_tokens").or_else(|| count(body, "max_tokens")),
            tools: tools(body, |t| {
                let f = t.get("function")?;
                Some((f.get("name")?.as_str()?, f.get("parameters")))
            }),
            tool_choice: match body.get("tool_choice") {
                Some(Value::String(s)) if s == "none" => ToolChoice::None,
                Some(Value::Object(o)) => named(o.get("function").and_then(|f| f.get("name"))),
                _ => ToolChoice::Auto,
            },
            format: body
                .get("response_format")
                .and_then(|f| match f.get("type")?.as_str()? {
                    "json_object" => Some(Format::JsonObject),
                    "json_schema" => Some(Format::JsonSchema(
                        f.get("json_schema")
                            .and_then(|j| j.get("schema"))
                            .cloned()
                            .unwrap_or_else(|| serde_json::json!({"type": "object"})),
                    )),
                    _ => None,
                }),
            prompt: last_user(&messages),
            digest: digest("", &messages),
            after_tool_result: messages.last().is_some_and(|(role, _)| role == "tool"),
            reasoning: model(body).as_deref().map(asked_by_model).unwrap_or_default(),
        },
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
        prefill: prefill(body, &messages),
        model: model(body),
        logprobs: None,
        service_tier: None,
        asks: Asks {
            max_tokens: count(body, "max_tokens"),
            tools: tools(body, |t| Some((t.get("name")?.as_str()?, t.get("input_schema")))),
            tool_choice: match body
                .get("tool_choice")
                .and_then(|c| c.get("type"))
                .and_then(Value::as_str)
            {
                Some("none") => ToolChoice::None,
                Some("tool") => named(body.get("tool_choice").and_then(|c| c.get("name"))),
                _ => ToolChoice::Auto,
            },
            format: None,
            prompt: last_user(&messages),
            digest: digest(&system, &messages),
            after_tool_result: ends_in_tool_result(body),
            reasoning: thinking(body),
        },
    }
}

/// What an Anthropic request's `thinking` asks for (`strict` refuses a malformed one first).
fn thinking(body: &Value) -> Asked {
    let Some(config) = body.get("thinking") else {
        return Asked::Nothing;
    };
    match config.get("type").and_then(Value::as_str) {
        Some("enabled" | "adaptive") => Asked::Thinking {
            omitted: config.get("display").and_then(Value::as_str) == Some("omitted"),
        },
        _ => Asked::Nothing,
    }
}

/// Whether an Anthropic conversation's last message is a user turn carrying a tool's result.
fn ends_in_tool_result(body: &Value) -> bool {
    let Some(last) = body.get("messages").and_then(Value::as_array).and_then(|m| m.last()) else {
        return false;
    };
    last.get("role").and_then(Value::as_str) == Some("user")
        && last.get("content").and_then(Value::as_array).is_some_and(|parts| {
            parts
                .iter()
                .any(|p| p.get("type").and_then(Value::as_str) == Some("tool_result"))
        })
}

fn count(body: &Value, key: &str) -> Option<u32> {
    body.get(key)
        .and_then(Value::as_u64)
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// The offered tools as (name, schema); a tool without a schema takes any object.
fn tools(body: &Value, read: impl Fn(&Value) -> Option<(&str, Option<&Value>)>) -> Vec<(String, Value)> {
    body.get("tools")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(read)
                .map(|(name, schema)| {
                    let schema = schema.cloned().unwrap_or_else(|| serde_json::json!({"type": "object"}));
                    (name.to_owned(), schema)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn named(name: Option<&Value>) -> ToolChoice {
    match name.and_then(Value::as_str) {
        Some(n) => ToolChoice::Named(n.to_owned()),
        None => ToolChoice::Auto,
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

fn last_user(messages: &[Turn]) -> String {
    messages
        .iter()
        .rev()
        .find(|(role, _)| role == "user")
        .map(|(_, text)| text.clone())
        .unwrap_or_default()
}

/// A stable hash of the conversation (SHA-256, its first eight bytes).
fn digest(system: &str, messages: &[Turn]) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(system.as_bytes());
    for (role, text) in messages {
        h.update([0u8]);
        h.update(role.as_bytes());
        h.update([0u8]);
        h.update(text.as_bytes());
    }
    let out = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&out[..8]);
    u64::from_le_bytes(first)
}

fn all_text(messages: &[Turn]) -> String {
    messages.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>().join(" ")
}

/// The final assistant message, if it has text. An instruction such as "continue" in a
/// user message is not a prefill: real models start over or rephrase.
fn prefill(body: &Value, messages: &[Turn]) -> Option<Prefill> {
    let (role, text) = messages.last()?;
    if role != "assistant" || text.is_empty() {
        return None;
    }
    let last = body
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|list| list.last());
    let trailing_whitespace = last
        .and_then(|m| m.get("content"))
        .and_then(last_text_part)
        .is_some_and(|t| t.ends_with(char::is_whitespace));
    Some(Prefill {
        text: text.clone(),
        prefix: last.is_some_and(|m| flag(m, "prefix")),
        continue_final_message: flag(body, "continue_final_message"),
        trailing_whitespace,
    })
}

/// The text of a `content`'s last part (the whole string for a string content).
fn last_text_part(content: &Value) -> Option<&str> {
    match content {
        Value::String(s) => Some(s),
        Value::Array(parts) => parts.last()?.get("text")?.as_str(),
        _ => None,
    }
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
    fn after_a_tool_result_the_answer_is_text_unless_a_tool_is_named() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
        let first = json!({"tools": tools, "messages": [{"role": "user", "content": "go"}]});
        assert!(openai(&first).asks.tool().is_some(), "offered tools get a call");
        let result = json!({"tools": tools, "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "42"}
        ]});
        assert_eq!(openai(&result).asks.tool(), None, "after the result: text");
        let mut named = result.clone();
        named["tool_choice"] = json!({"type": "function", "function": {"name": "f"}});
        assert!(openai(&named).asks.tool().is_some(), "a named tool is still called");

        let atools = json!([{"name": "f", "input_schema": {"type": "object"}}]);
        let aresult = json!({"tools": atools, "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "42"}]}
        ]});
        assert_eq!(
            anthropic(&aresult).asks.tool(),
            None,
            "Anthropic: text after the result"
        );
        let afirst = json!({"tools": atools, "messages": [{"role": "user", "content": "go"}]});
        assert!(anthropic(&afirst).asks.tool().is_some(), "Anthropic: a call first");
    }

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
        let prefill = inbound.prefill.unwrap_or_default();
        assert_eq!(prefill.text, "Hello big", "prefill text");
        assert!(!prefill.trailing_whitespace, "no trailing whitespace");
        assert_eq!(inbound.input_tokens, 5, "system words count too");
        assert!(!inbound.stream, "stream defaults to false");
    }

    #[test]
    fn trailing_whitespace_is_judged_on_the_last_text_part_only() {
        let ends_in_space = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b\n"}]}
        ]});
        let got = anthropic(&ends_in_space).prefill.unwrap_or_default();
        assert!(got.trailing_whitespace, "last block ends in a newline: {got:?}");
        let earlier_space = json!({"messages": [
            {"role": "assistant", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]}
        ]});
        let got = anthropic(&earlier_space).prefill.unwrap_or_default();
        assert!(!got.trailing_whitespace, "only the last block counts: {got:?}");
        assert_eq!(got.text, "a b", "text of every block");
    }

    #[test]
    fn openai_marks_of_the_prefix_and_vllm_conventions_are_read() {
        let body = json!({"continue_final_message": true, "add_generation_prompt": false, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello big", "prefix": true}
        ]});
        let prefill = openai(&body).prefill.unwrap_or_default();
        assert!(prefill.prefix, "prefix flag: {prefill:?}");
        assert!(prefill.continue_final_message, "vLLM flag: {prefill:?}");
        let plain = json!({"messages": [{"role": "assistant", "content": "Hello"}]});
        let prefill = openai(&plain).prefill.unwrap_or_default();
        assert!(!prefill.prefix && !prefill.continue_final_message, "plain: {prefill:?}");
    }

    #[test]
    fn a_user_asking_to_continue_is_not_a_prefill() {
        let body = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello big"},
            {"role": "user", "content": "Continue exactly where you stopped."}
        ]});
        assert_eq!(
            openai(&body).prefill,
            None,
            "an instruction is not a continuation contract"
        );
        assert_eq!(anthropic(&body).prefill, None, "on either wire");
        let empty = json!({"messages": [{"role": "assistant", "content": ""}]});
        assert_eq!(openai(&empty).prefill, None, "an empty assistant message is no prefill");
    }

    #[test]
    fn garbage_bodies_parse_to_defaults() {
        let inbound = openai(&json!({"messages": "nope", "stream": "yes"}));
        assert!(!inbound.stream, "non-bool stream is false");
        assert_eq!(inbound.input_tokens, 1, "minimum one input token");
    }
}
