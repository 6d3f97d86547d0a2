//! Anthropic Messages wire types: the request body we send and the stream events we read.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::provider::wire_json::WireStr;

// ---- request ----

#[derive(Debug, Serialize)]
pub struct MessagesBody {
    pub model: String,
    pub max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    pub messages: Vec<WireMessage>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<WireTool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stop_sequences: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// An OpenAI client's `reasoning_effort`, as a budget (`ChatRequest::thinking_budget`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Value>,
    /// An OpenAI client's `user`, as `metadata.user_id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    pub stream: bool,
}

#[derive(Debug, Serialize)]
pub struct WireMessage {
    pub role: &'static str,
    pub content: Vec<Block>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text { text: String },
    Image { source: ImageSource },
    ToolUse { id: String, name: String, input: Value },
    ToolResult { tool_use_id: String, content: String },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImageSource {
    Base64 { media_type: String, data: String },
    Url { url: String },
}

#[derive(Debug, Serialize)]
pub struct WireTool {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub input_schema: Value,
}

// ---- stream ----

/// The data of one stream event, as much of it as the decoder reads. Unknown fields are
/// skipped unread and every field is optional, so new event and block types pass through
/// harmlessly. Strings borrow from the event's data unless they hold an escape.
#[derive(Debug, Default, Deserialize)]
pub struct EventData<'a> {
    /// The data's own `type`; dispatch follows the `event:` line first (T13).
    #[serde(default, rename = "type", borrow)]
    pub kind: Option<WireStr<'a>>,
    #[serde(default)]
    pub index: Option<u32>,
    #[serde(default)]
    pub message: Option<StartMessage>,
    #[serde(default, borrow)]
    pub content_block: Option<ContentBlock<'a>>,
    #[serde(default, borrow)]
    pub delta: Option<EventDelta<'a>>,
    #[serde(default)]
    pub usage: Option<WireUsage>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StartMessage {
    #[serde(default)]
    pub usage: Option<WireUsage>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ContentBlock<'a> {
    #[serde(default, rename = "type", borrow)]
    pub kind: WireStr<'a>,
    #[serde(default, borrow)]
    pub id: Option<WireStr<'a>>,
    #[serde(default, borrow)]
    pub name: Option<WireStr<'a>>,
    #[serde(default, borrow)]
    pub text: Option<WireStr<'a>>,
    /// A `thinking` block's text and signature as its start gives them (empty on Anthropic's
    /// API: the deltas carry them).
    #[serde(default, borrow)]
    pub thinking: Option<WireStr<'a>>,
    #[serde(default, borrow)]
    pub signature: Option<WireStr<'a>>,
    /// A `redacted_thinking` block's opaque data.
    #[serde(default, borrow)]
    pub data: Option<WireStr<'a>>,
    /// A `tool_use` block's input as the start gives it: `{}` on Anthropic's API (the deltas
    /// carry it), the whole input on servers that send no deltas.
    #[serde(default)]
    pub input: Option<Value>,
}

/// `content_block_delta.delta` and `message_delta.delta` share this shape.
#[derive(Debug, Default, Deserialize)]
pub struct EventDelta<'a> {
    #[serde(default, rename = "type", borrow)]
    pub kind: Option<WireStr<'a>>,
    #[serde(default, borrow)]
    pub text: Option<WireStr<'a>>,
    #[serde(default, borrow)]
    pub partial_json: Option<WireStr<'a>>,
    #[serde(default, borrow)]
    pub thinking: Option<WireStr<'a>>,
    #[serde(default, borrow)]
    pub signature: Option<WireStr<'a>>,
    /// A `citations_delta`'s citation, as sent (`types::ExtraField::Citation`).
    #[serde(default, borrow)]
    pub citation: Option<&'a serde_json::value::RawValue>,
    #[serde(default, borrow)]
    pub stop_reason: Option<WireStr<'a>>,
}

/// Cumulative counts (T9); any field may be missing on a given event.
#[derive(Debug, Default, Deserialize)]
pub struct WireUsage {
    #[serde(default)]
    pub input_tokens: Option<u32>,
    #[serde(default)]
    pub cache_creation_input_tokens: Option<u32>,
    #[serde(default)]
    pub cache_read_input_tokens: Option<u32>,
    #[serde(default)]
    pub output_tokens: Option<u32>,
}
