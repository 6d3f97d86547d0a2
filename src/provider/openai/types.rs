//! OpenAI Chat Completions wire types: the request body we send and the chunks we read.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use smallvec::SmallVec;

// ---- request ----

#[derive(Debug, Serialize)]
pub struct ChatBody {
    pub model: String,
    pub messages: Vec<WireMessage>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<WireTool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    pub stream: bool,
    pub stream_options: StreamOptions,
    /// vLLM: continue the final assistant message inside its turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continue_final_message: Option<bool>,
    /// vLLM: `false` with `continue_final_message`, so no new assistant turn is opened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub add_generation_prompt: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct StreamOptions {
    pub include_usage: bool,
}

#[derive(Debug, Serialize)]
pub struct WireMessage {
    pub role: &'static str,
    /// `null` for an assistant message that only calls tools.
    pub content: Option<WireContent>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<WireToolCall>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// DeepSeek / Mistral: continue this (final, assistant) message instead of answering it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub prefix: bool,
}

/// Plain text as a string; anything with images as an array of parts.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum WireContent {
    Text(String),
    Parts(Vec<WirePart>),
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WirePart {
    Text { text: String },
    ImageUrl { image_url: ImageUrl },
}

#[derive(Debug, Serialize)]
pub struct ImageUrl {
    pub url: String,
}

#[derive(Debug, Serialize)]
pub struct WireToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: WireFunctionCall,
}

#[derive(Debug, Serialize)]
pub struct WireFunctionCall {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Serialize)]
pub struct WireTool {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: WireFunction,
}

#[derive(Debug, Serialize)]
pub struct WireFunction {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub parameters: Value,
}

// ---- stream ----

/// One `chat.completion.chunk`. Every field is optional: usage chunks have no choices,
/// Azure's first chunk has empty ones, vLLM may send `null` (T8). We never ask for `n > 1`,
/// so the one choice is kept inline: no allocation for the list per upstream chunk.
#[derive(Debug, Default, Deserialize)]
pub struct Chunk {
    #[serde(default)]
    pub choices: Option<SmallVec<[Choice; 1]>>,
    #[serde(default)]
    pub usage: Option<WireUsage>,
    /// A truthy top-level `error` is an in-band failure (T10).
    #[serde(default)]
    pub error: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Choice {
    #[serde(default)]
    pub index: u32,
    #[serde(default)]
    pub delta: Option<ChoiceDelta>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ChoiceDelta {
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub refusal: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
    /// The deprecated single-call form (no index).
    #[serde(default)]
    pub function_call: Option<FunctionDelta>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ToolCallDelta {
    /// Required by OpenAI; some compatible servers omit it (§1.14).
    #[serde(default)]
    pub index: Option<u32>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub function: Option<FunctionDelta>,
}

#[derive(Debug, Default, Deserialize)]
pub struct FunctionDelta {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub arguments: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct WireUsage {
    #[serde(default)]
    pub prompt_tokens: u32,
    #[serde(default)]
    pub completion_tokens: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_with_one_choice_keeps_it_inline() {
        let data = r#"{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}"#;
        let chunk: Chunk = serde_json::from_str(data).unwrap_or_default();
        let choices = chunk.choices.unwrap_or_default();
        assert_eq!(choices.len(), 1);
        assert!(!choices.spilled(), "one choice must not allocate a list");
        assert_eq!(choices[0].delta.as_ref().and_then(|d| d.content.as_deref()), Some("hi"));
    }

    #[test]
    fn extra_choices_are_still_read_in_order() {
        let data = r#"{"choices":[{"index":1,"delta":{"content":"b"}},{"index":0,"delta":{"content":"a"}}]}"#;
        let chunk: Chunk = serde_json::from_str(data).unwrap_or_default();
        let indices: Vec<u32> = chunk.choices.into_iter().flatten().map(|c| c.index).collect();
        assert_eq!(indices, [1, 0]);
    }
}
