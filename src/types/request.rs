//! `ChatRequest`: the neutral request every transport decodes into and every provider encodes from.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::event::ToolCall;
use super::verbatim::{MessageJson, Verbatim, Wire};

/// One logical chat request, independent of the dialect it arrived in.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The client-facing model name (a `[models.*]` entry), not an upstream id.
    pub model: String,
    /// System prompts are messages with `Role::System`; adapters move them where
    /// their wire format wants them.
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub tool_choice: Option<ToolChoice>,
    pub response_format: Option<ResponseFormat>,
    pub sampling: Sampling,
    pub max_tokens: Option<u32>,
    /// OpenAI `reasoning_effort` (`minimal`, `low`, `medium`, `high`, ...), as the client
    /// sent it: an OpenAI-wire route receives it unchanged.
    pub reasoning_effort: Option<String>,
    pub stream: bool,
    /// The client asked for a usage event (`stream_options.include_usage`).
    pub include_usage: bool,
    /// The client's `metadata` object. It reaches a route of the client's wire with the rest
    /// of `verbatim`; the typed copy is for tailcut's own use.
    pub metadata: serde_json::Map<String, Value>,
    /// The client's own top-level fields, for a route of its wire (`None` for a request
    /// tailcut made itself: a probe, a test).
    #[serde(skip)]
    pub verbatim: Option<Arc<Verbatim>>,
}

/// The `max_tokens` an Anthropic-wire route is sent when the client gives none (the Messages
/// API requires one).
pub const ANTHROPIC_DEFAULT_MAX_TOKENS: u32 = 4096;

impl ChatRequest {
    /// The client's own prefill: the text of a final assistant message that calls no tool.
    /// A continuation continues that message, so the answer the client holds follows it.
    pub fn assistant_prefill(&self) -> Option<String> {
        self.messages
            .last()
            .filter(|m| m.role == Role::Assistant && m.tool_calls.is_empty())
            .map(Message::joined_text)
    }

    /// The thinking budget an Anthropic-wire route is given for this OpenAI-dialect
    /// request's `reasoning_effort` (docs/dialects.md, "Cross wire"): `low` 1024 tokens,
    /// `medium` 2048, `high` 4096, at most `max_tokens - 1`. `None` when there is nothing to
    /// map or Anthropic could not take it: another effort (`minimal`, `none`), a budget under
    /// its minimum of 1024, a tool choice that forces a tool, or a tool loop (its earlier
    /// assistant turns carry no thinking blocks, which Anthropic requires of them).
    pub fn thinking_budget(&self, max_tokens: u32) -> Option<u32> {
        if self.verbatim.as_deref().is_some_and(|v| v.wire != Wire::OpenAi) {
            return None;
        }
        let wanted = match self.reasoning_effort.as_deref()? {
            "low" => 1024,
            "medium" => 2048,
            "high" => 4096,
            _ => return None,
        };
        let forced = matches!(self.tool_choice, Some(ToolChoice::Required | ToolChoice::Tool(_)));
        let tool_loop = self.messages.iter().any(|m| !m.tool_calls.is_empty());
        let budget = wanted.min(max_tokens.saturating_sub(1));
        (budget >= 1024 && !forced && !tool_loop).then_some(budget)
    }

    /// A string the client sent at the top level of its own JSON (`user`, ...).
    pub fn verbatim_str(&self, name: &str) -> Option<String> {
        let raw = self.verbatim.as_deref()?.field(name)?;
        serde_json::from_str::<String>(raw.text()).ok()
    }

    /// Does the client ask an Anthropic-wire route to think (`thinking` of type `enabled` or
    /// `adaptive`, or a `reasoning_effort` it is given as a budget)? Such a route refuses a
    /// prefill, so no continuation goes to one.
    pub fn asks_thinking(&self) -> bool {
        if self
            .thinking_budget(self.max_tokens.unwrap_or(ANTHROPIC_DEFAULT_MAX_TOKENS))
            .is_some()
        {
            return true;
        }
        #[derive(serde::Deserialize)]
        struct Config<'a> {
            #[serde(rename = "type", borrow)]
            kind: std::borrow::Cow<'a, str>,
        }
        self.verbatim
            .as_deref()
            .filter(|v| v.wire == Wire::Anthropic)
            .and_then(|v| v.field("thinking"))
            .and_then(|raw| serde_json::from_str::<Config<'_>>(raw.text()).ok())
            .is_some_and(|c| c.kind != "disabled")
    }

    /// The response type this request implies when nothing overrides it.
    pub fn detected_response_type(&self) -> ResponseType {
        if !self.tools.is_empty() && self.tool_choice != Some(ToolChoice::None) {
            ResponseType::Tool
        } else if self.response_format.as_ref().is_some_and(|f| f.is_structured()) {
            ResponseType::Structured
        } else {
            ResponseType::Prose
        }
    }

    /// Looks up the JSON Schema of a requested tool by name.
    pub fn tool_schema(&self, name: &str) -> Option<&Value> {
        self.tools.iter().find(|t| t.name == name).map(|t| &t.parameters)
    }

    /// Total characters of text in the conversation (used for size estimates).
    pub fn text_len(&self) -> usize {
        self.messages.iter().map(Message::text_len).sum()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: Vec<ContentPart>,
    /// Tool calls an assistant message made earlier in the conversation.
    pub tool_calls: Vec<ToolCall>,
    /// For `Role::Tool`: which call this result answers.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    /// The message's own JSON as the client sent it (`None` for one tailcut wrote: a repair
    /// prompt, an answer kept in a session's history).
    #[serde(skip)]
    pub json: Option<MessageJson>,
}

impl Message {
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        Message {
            role,
            content: vec![ContentPart::Text(text.into())],
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            json: None,
        }
    }

    /// The message's text parts joined together.
    pub fn joined_text(&self) -> String {
        let mut out = String::new();
        for part in &self.content {
            if let ContentPart::Text(t) = part {
                out.push_str(t);
            }
        }
        out
    }

    pub fn has_images(&self) -> bool {
        self.content.iter().any(|p| matches!(p, ContentPart::ImageUrl { .. }))
    }

    /// The kinds of the message's parts tailcut does not read, with the wire they are in.
    pub fn opaque_parts(&self) -> impl Iterator<Item = (Wire, &str)> {
        self.content.iter().filter_map(|p| match p {
            ContentPart::Opaque { wire, kind } => Some((*wire, kind.as_str())),
            _ => None,
        })
    }

    fn text_len(&self) -> usize {
        let parts: usize = self
            .content
            .iter()
            .map(|p| match p {
                ContentPart::Text(t) => t.len(),
                ContentPart::ImageUrl { .. } | ContentPart::Opaque { .. } => 0,
            })
            .sum();
        parts
            + self
                .tool_calls
                .iter()
                .map(|c| c.arguments.len() + c.name.len())
                .sum::<usize>()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text(String),
    ImageUrl {
        url: String,
    },
    /// A part tailcut does not read: an OpenAI `file`, `input_audio` or `refusal` part, an
    /// Anthropic `document`, `thinking`, `redacted_thinking` or `search_result` block, any
    /// type a provider adds. It reaches a route of the client's wire, unchanged, inside its
    /// message's `json`; a route of another wire cannot carry it and is not eligible.
    Opaque {
        wire: Wire,
        kind: String,
    },
}

/// A tool the model may call; `parameters` is its JSON Schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Tool(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema {
        name: String,
        schema: Value,
        strict: Option<bool>,
    },
}

impl ResponseFormat {
    pub fn is_structured(&self) -> bool {
        !matches!(self, ResponseFormat::Text)
    }
}

/// Sampling parameters; `None` means "the upstream's default".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub stop: Vec<String>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
}

/// What kind of answer is being streamed; decides the mid-stream policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseType {
    Prose,
    Structured,
    Tool,
    Voice,
}

impl ResponseType {
    pub fn as_str(self) -> &'static str {
        match self {
            ResponseType::Prose => "prose",
            ResponseType::Structured => "structured",
            ResponseType::Tool => "tool",
            ResponseType::Voice => "voice",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "prose" => Some(ResponseType::Prose),
            "structured" => Some(ResponseType::Structured),
            "tool" => Some(ResponseType::Tool),
            "voice" => Some(ResponseType::Voice),
            _ => None,
        }
    }
}
