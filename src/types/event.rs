//! `StreamEvent`: what the mux emits and every transport renders. There is deliberately no
//! variant for a tool-call fragment: a partial tool call cannot leave the mux.

use std::pin::Pin;

use futures::Stream;
use serde::{Deserialize, Serialize};

use super::envelope::Envelope;
use super::thinking::{Extra, Thinking};
use super::ErrorClass;

/// The stream a transport pulls. Dropping it cancels every upstream attempt behind it.
pub type EventStream = Pin<Box<dyn Stream<Item = StreamEvent> + Send>>;

/// The large, rare payloads (the envelope, a tool call, an error) are boxed so the event a
/// stream moves per text delta stays small: every channel slot and every stream layer holds
/// one `StreamEvent` by value (see `tests::an_event_stays_small`).
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// The commit point: the first content token is ready. Carries the envelope so far.
    Start(Box<Envelope>),
    TextDelta(String),
    /// The route's reasoning, as it streams: content, but not answer text.
    Thinking(Thinking),
    /// A field of the route's answer for a client of the route's wire (`Extra`): it comes
    /// before the text it belongs to.
    Extra(Box<Extra>),
    /// A complete tool call whose arguments parsed (and matched the schema, if any).
    ToolCall(Box<ToolCall>),
    /// The client must discard everything it has received so far.
    Reset {
        reason: String,
    },
    /// A `continue` policy moved the answer to another route.
    RouteSwitch {
        from: String,
        to: String,
    },
    Usage(Usage),
    Finish {
        reason: FinishReason,
        envelope: Box<Envelope>,
    },
    /// Terminal failure. Before `Start` it becomes an HTTP error; after, an in-band error.
    Error(Box<ErrorEvent>),
}

/// A complete tool call. `arguments` is the raw JSON text, already validated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Position among the answer's tool calls (0, 1, ...).
    pub index: u32,
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// An answer's token counts. `input_tokens` counts every prompt token, those read from or
/// written to the provider's prompt cache included (OpenAI's `prompt_tokens`; an Anthropic
/// route's `input_tokens` + `cache_creation_input_tokens` + `cache_read_input_tokens`). The
/// details are what the route reported, `None` when it said nothing of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Prompt tokens read from the prompt cache (OpenAI `prompt_tokens_details.cached_tokens`,
    /// Anthropic `cache_read_input_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_tokens: Option<u32>,
    /// Prompt tokens written to the prompt cache (Anthropic `cache_creation_input_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u32>,
    /// Output tokens spent reasoning (OpenAI `completion_tokens_details.reasoning_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u32>,
}

impl Usage {
    pub fn new(input_tokens: u32, output_tokens: u32) -> Self {
        Usage {
            input_tokens,
            output_tokens,
            ..Usage::default()
        }
    }

    /// Two attempts' usage together (each detail summed where either reported it).
    pub fn plus(self, other: Usage) -> Usage {
        let add = |a: Option<u32>, b: Option<u32>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        Usage {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
            cache_read_tokens: add(self.cache_read_tokens, other.cache_read_tokens),
            cache_write_tokens: add(self.cache_write_tokens, other.cache_write_tokens),
            reasoning_tokens: add(self.reasoning_tokens, other.reasoning_tokens),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    Refusal,
    /// The stream ended early and the partial answer was kept (the `truncate` policy).
    Truncated,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Refusal => "refusal",
            FinishReason::Truncated => "truncated",
        }
    }
}

/// A terminal error as the client sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorEvent {
    pub class: ErrorClass,
    /// The HTTP status to answer with when nothing was committed yet.
    pub status: u16,
    pub message: String,
    pub retry_after: Option<std::time::Duration>,
    /// A code more specific than the class (a refusal's `rpm_exceeded`), as HTTP gives it.
    pub code: Option<&'static str>,
    pub envelope: Envelope,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_stays_small() {
        // The pump's read-ahead allocates its slots by this size, and every layer between the
        // upstream and the socket moves events by value: a large variant must be boxed.
        let size = std::mem::size_of::<StreamEvent>();
        assert!(size <= 64, "StreamEvent is {size} bytes; box the variant that grew");
    }
}
