//! Why an answer's tool calls cannot be emitted (`AssemblerError`), what failure of the
//! attempt that is, and whether it says anything about the route.

use crate::provider::ProviderError;
use crate::types::{ErrorClass, FinishReason};

/// Why an answer's tool calls cannot be emitted. Every variant is invalid output.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AssemblerError {
    #[error("tool call {index} was cut off by finish reason {}", reason.as_str())]
    Incomplete {
        index: u32,
        name: Option<String>,
        reason: FinishReason,
    },
    #[error("tool call {index} ({name}) arguments are not a JSON object: {message}")]
    InvalidJson { index: u32, name: String, message: String },
    #[error("tool call {index} ({name}) arguments do not match the tool's schema: {message}")]
    SchemaMismatch { index: u32, name: String, message: String },
    #[error("tool call {index} names {name:?}, which is not among the request's tools")]
    UnknownTool { index: u32, name: String },
    #[error("tool call {index} names {name:?}, which the request's tool_choice does not allow")]
    NotChosen { index: u32, name: String },
    #[error("tool calls exceed the limit of {limit} {what}")]
    TooLarge { what: &'static str, limit: usize },
    #[error("tool call {index} has no name")]
    MissingName { index: u32 },
    #[error("tool call {index} received more arguments after it ended")]
    FragmentAfterEnd { index: u32 },
}

impl AssemblerError {
    pub fn class(&self) -> ErrorClass {
        ErrorClass::InvalidOutput
    }

    /// The attempt's failure. A call cut off at the request's own `max_tokens` is the
    /// request's error (`BadRequest`): every route would cut it at the same place, so it is
    /// neither repaired nor failed over, and it never counts against the route that honoured
    /// the limit (else a client could open every route's breaker with a few such requests).
    /// Every other rejection is the route's invalid output.
    pub fn to_error(&self, max_tokens: Option<u32>) -> ProviderError {
        match (self, max_tokens) {
            (
                AssemblerError::Incomplete {
                    reason: FinishReason::Length,
                    ..
                },
                Some(limit),
            ) => ProviderError::new(
                ErrorClass::BadRequest,
                format!("{self}: max_tokens ({limit}) ends the answer inside the call; raise max_tokens"),
            ),
            _ => ProviderError::new(ErrorClass::InvalidOutput, self.to_string()),
        }
    }

    /// Does this rejection say something about the route's health? Not when the call is a
    /// JSON object for an offered tool that fails only that tool's schema: the schema is the
    /// client's, and one no answer can meet (`{"not": {}}`, a `"type": "string"` for
    /// arguments that are always an object) would otherwise let any client open every
    /// route's breaker. Garbage (arguments that are not a JSON object, a tool never offered,
    /// no name, a call cut short, too much) still counts: the route produced it whatever the
    /// schema.
    /// A call the request's `tool_choice` ruled out does not count either: it is the client's
    /// constraint, and upstreams (local servers above all) honour it unevenly.
    pub fn blames_route(&self) -> bool {
        !matches!(
            self,
            AssemblerError::SchemaMismatch { .. } | AssemblerError::NotChosen { .. }
        )
    }

    pub fn metric_label(&self) -> &'static str {
        match self {
            AssemblerError::Incomplete { .. } => "incomplete",
            AssemblerError::InvalidJson { .. } => "invalid_json",
            AssemblerError::SchemaMismatch { .. } => "schema_mismatch",
            AssemblerError::UnknownTool { .. } => "unknown_tool",
            AssemblerError::NotChosen { .. } => "not_chosen",
            AssemblerError::TooLarge { .. } => "too_large",
            AssemblerError::MissingName { .. } => "missing_name",
            AssemblerError::FragmentAfterEnd { .. } => "fragment_after_end",
        }
    }
}
