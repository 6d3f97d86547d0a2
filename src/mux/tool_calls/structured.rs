//! The structured answer's gate: a request with `response_format` `json_object` or
//! `json_schema` has its answer text held, like a tool call, until the answer ends; then it
//! must parse as JSON (an object for `json_object`) and match the schema when one was given.
//! Only a valid answer is released, whole, as one text delta.
//!
//! The route is still chosen at its first token (the commit point: the race is won and the
//! client's headers are sent), but nothing of the answer is visible before it is valid, so
//! a failed gate can be repaired or restarted without the client having to unsee anything.
//! An answer that ends for another reason than `stop` (length, refusal, content filter) is
//! released as it is, with its honest finish reason.

use std::sync::Arc;

use jsonschema::Validator;
use serde_json::Value;

use super::pattern_budget::{PatternBudget, SchemaRefusal};
use super::schema::{checked, Uncompiled};
use crate::types::{ChatRequest, ErrorClass, ResponseFormat};

/// Cap on a held structured answer, in bytes (the assembler's cap on tool-call arguments).
pub const MAX_HELD_BYTES: usize = super::MAX_BUFFERED_BYTES;

/// Why a structured answer cannot be released. Every variant is invalid output.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StructuredError {
    #[error("the structured answer is not valid JSON: {0}")]
    NotJson(String),
    #[error("the structured answer is not a JSON object (JSON mode asks for one)")]
    NotObject,
    #[error("the structured answer does not match the response format's schema: {0}")]
    SchemaMismatch(String),
    #[error("the structured answer exceeds the limit of {0} bytes")]
    TooLarge(usize),
}

impl StructuredError {
    pub fn class(&self) -> ErrorClass {
        ErrorClass::InvalidOutput
    }

    /// Does this rejection say something about the route's health? Not for valid JSON that
    /// fails only the client's own schema (which may be one no answer can meet); text that
    /// is not JSON, or not the object JSON mode asks for, or too large, still counts.
    pub fn blames_route(&self) -> bool {
        !matches!(self, StructuredError::SchemaMismatch(_))
    }
}

/// What the answer must be.
#[derive(Debug)]
enum Expect {
    Object,
    /// `None`: the schema does not compile (remote `$ref`s are never fetched); any JSON.
    Schema(Option<Validator>),
}

/// Holds one answer's text until it is judged; see the module doc. Cloning an empty gate
/// gives another attempt its own, sharing the compiled schema.
#[derive(Debug, Clone)]
pub struct StructuredGate {
    expect: Arc<Expect>,
    text: String,
}

impl StructuredGate {
    /// The gate for `req`'s answer, when it asks for a structured one.
    pub fn for_request(req: &ChatRequest) -> Option<Self> {
        let expect = match req.response_format.as_ref()? {
            ResponseFormat::Text => return None,
            ResponseFormat::JsonObject => Expect::Object,
            ResponseFormat::JsonSchema { schema, .. } => Expect::Schema(super::schema::validator(schema).ok()),
        };
        Some(StructuredGate {
            expect: Arc::new(expect),
            text: String::new(),
        })
    }

    /// The gate for `req`'s answer, its schema compiled once with its patterns within
    /// `budget`'s share; a schema that does not compile is the request's error.
    pub fn compile(req: &ChatRequest, budget: PatternBudget) -> Result<Option<Self>, SchemaRefusal> {
        let expect = match req.response_format.as_ref() {
            None | Some(ResponseFormat::Text) => return Ok(None),
            Some(ResponseFormat::JsonObject) => Expect::Object,
            Some(ResponseFormat::JsonSchema { schema, .. }) => {
                if let Some(why) = super::unsatisfiable::why_unsatisfiable(schema) {
                    return Err(SchemaRefusal {
                        param: "response_format".into(),
                        code: "invalid_response_schema",
                        message: format!("no answer can satisfy the json_schema: {why}"),
                    });
                }
                match checked(schema, budget, "response_format".into(), "the json_schema") {
                    Ok(validator) => Expect::Schema(Some(validator)),
                    Err(Uncompiled::OverShare(refusal)) => return Err(refusal),
                    Err(Uncompiled::Invalid(why)) => {
                        return Err(SchemaRefusal {
                            param: "response_format".into(),
                            code: "invalid_response_schema",
                            message: format!("the json_schema is not a valid JSON Schema: {why}"),
                        })
                    }
                }
            }
        };
        Ok(Some(StructuredGate {
            expect: Arc::new(expect),
            text: String::new(),
        }))
    }

    /// Holds one text delta. `Ok(true)` for the first text: the commit point.
    pub fn push(&mut self, delta: &str) -> Result<bool, StructuredError> {
        if self.text.len() + delta.len() > MAX_HELD_BYTES {
            return Err(StructuredError::TooLarge(MAX_HELD_BYTES));
        }
        let first = self.text.is_empty() && !delta.is_empty();
        self.text.push_str(delta);
        Ok(first)
    }

    /// Has any text been held?
    pub fn started(&self) -> bool {
        !self.text.is_empty()
    }

    /// The held text, as it is (for an answer that is released unjudged, or kept for a repair).
    pub fn take_text(&mut self) -> String {
        std::mem::take(&mut self.text)
    }

    /// Judges the held text; it stays held either way (`take_text`).
    pub fn check(&self) -> Result<(), StructuredError> {
        let value: Value =
            serde_json::from_str(self.text.trim()).map_err(|e| StructuredError::NotJson(e.to_string()))?;
        match &*self.expect {
            Expect::Object if !value.is_object() => Err(StructuredError::NotObject),
            Expect::Object | Expect::Schema(None) => Ok(()),
            Expect::Schema(Some(validator)) => match validator.iter_errors(&value).next() {
                None => Ok(()),
                // Cut: the message may quote the answer.
                Some(err) => Err(StructuredError::SchemaMismatch(super::schema::clip(format!(
                    "{err} at {}",
                    err.instance_path()
                )))),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn gate(format: ResponseFormat) -> StructuredGate {
        let req = ChatRequest {
            response_format: Some(format),
            ..ChatRequest::default()
        };
        StructuredGate::for_request(&req).unwrap_or_else(|| panic!("a structured request has a gate"))
    }

    fn schema() -> ResponseFormat {
        ResponseFormat::JsonSchema {
            name: "city".into(),
            schema: json!({"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}),
            strict: None,
        }
    }

    #[test]
    fn only_structured_requests_are_gated() {
        assert!(StructuredGate::for_request(&ChatRequest::default()).is_none());
        let text = ChatRequest {
            response_format: Some(ResponseFormat::Text),
            ..ChatRequest::default()
        };
        assert!(StructuredGate::for_request(&text).is_none());
    }

    #[test]
    fn a_schema_answer_is_judged_whole_after_it_ends() {
        let mut g = gate(schema());
        assert_eq!(g.push("{\"ci"), Ok(true), "the first text is the commit point");
        assert_eq!(g.push("ty\": \"Oslo\"}"), Ok(false));
        assert_eq!(g.check(), Ok(()));
        assert_eq!(g.take_text(), "{\"city\": \"Oslo\"}");

        let mut g = gate(schema());
        let _ = g.push("{\"town\": \"Oslo\"}");
        assert!(
            matches!(g.check(), Err(StructuredError::SchemaMismatch(m)) if m.contains("city")),
            "a missing required property"
        );
        let mut g = gate(schema());
        let _ = g.push("{\"city\": ");
        assert!(matches!(g.check(), Err(StructuredError::NotJson(_))), "cut JSON");
    }

    #[test]
    fn json_mode_wants_an_object() {
        let mut g = gate(ResponseFormat::JsonObject);
        let _ = g.push("[1, 2]");
        assert_eq!(g.check(), Err(StructuredError::NotObject));
        let mut g = gate(ResponseFormat::JsonObject);
        let _ = g.push(" {\"a\": 1}\n");
        assert_eq!(g.check(), Ok(()), "surrounding whitespace is fine");
    }

    #[test]
    fn held_text_is_bounded() {
        let mut g = gate(ResponseFormat::JsonObject);
        let big = "x".repeat(MAX_HELD_BYTES);
        assert_eq!(g.push(&big), Ok(true));
        assert_eq!(g.push("y"), Err(StructuredError::TooLarge(MAX_HELD_BYTES)));
    }
}
