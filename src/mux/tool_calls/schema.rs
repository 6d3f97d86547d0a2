//! The request's tool schemas, compiled once, and the checks a finished call's arguments
//! must pass: a JSON object (`""` reads as `{}`) that matches its tool's schema. Also why a
//! client's schema does not compile ([`compile_problem`]), which the transport refuses.

use std::collections::HashMap;

use jsonschema::Validator;
use serde_json::Value;

/// The most a compiled `pattern` may take (the regex crate's own default is 10 MiB): 32 of a
/// client's `\w{2000}\d{2000}\s{2000}` held a worker for seconds and took 200 MiB. Real
/// schemas' patterns (dates, identifiers, e-mail shapes) take a few KiB; a Unicode class
/// under a large counted repetition (`\p{L}{0,63}`) is over it, under `*` or `+` it is not.
pub const PATTERN_SIZE_LIMIT: usize = 1024 * 1024;

/// The lazy DFA's cache per pattern, bounding what matching one may allocate.
const PATTERN_DFA_LIMIT: usize = 256 * 1024;

/// Backtracking steps per match for the patterns that need backtracking (look-arounds,
/// back-references; the crate's default is 1,000,000).
const PATTERN_BACKTRACK_LIMIT: usize = 100_000;

/// Compiles a client's schema with the pattern limits above: every schema tailcut checks an
/// answer against is compiled here. The error is what the crate says, as text.
pub fn validator(schema: &Value) -> Result<Validator, String> {
    jsonschema::options()
        .with_pattern_options(
            jsonschema::PatternOptions::fancy_regex()
                .size_limit(PATTERN_SIZE_LIMIT)
                .dfa_size_limit(PATTERN_DFA_LIMIT)
                .backtrack_limit(PATTERN_BACKTRACK_LIMIT),
        )
        .build(schema)
        .map_err(|err| err.to_string())
}

/// Validation messages are cut to this many bytes: they may quote the arguments.
pub(super) const MAX_MESSAGE_BYTES: usize = 300;

/// A tool with no usable schema, or any tool when the request offered none.
static ANY_OBJECT: Schema = Schema::AnyObject;

/// The request's tools by name, each schema compiled once.
#[derive(Debug)]
pub(super) struct ToolSchemas {
    by_name: HashMap<String, Schema>,
}

#[derive(Debug)]
pub(super) enum Schema {
    /// No schema given, or one that does not compile: any JSON object is accepted.
    AnyObject,
    Checked(Validator),
}

impl ToolSchemas {
    /// Compiles every tool's schema. The first tool of a given name wins.
    pub(super) fn compile(tools: &[crate::types::ToolSpec]) -> Self {
        let mut by_name = HashMap::with_capacity(tools.len());
        for tool in tools {
            by_name
                .entry(tool.name.clone())
                .or_insert_with(|| Schema::compile(&tool.name, &tool.parameters));
        }
        ToolSchemas { by_name }
    }

    /// The schema a call to `name` must match, or `None` when the request offered tools
    /// and `name` is not one of them. With no tools offered, any name is accepted.
    pub(super) fn lookup(&self, name: &str) -> Option<&Schema> {
        if self.by_name.is_empty() {
            return Some(&ANY_OBJECT);
        }
        self.by_name.get(name)
    }
}

impl Schema {
    fn compile(tool: &str, parameters: &Value) -> Schema {
        if parameters.is_null() {
            return Schema::AnyObject;
        }
        match validator(parameters) {
            Ok(validator) => Schema::Checked(validator),
            Err(err) => {
                tracing::debug!(tool, error = %err, "tool schema does not compile; arguments checked as any JSON object");
                Schema::AnyObject
            }
        }
    }

    /// Checks parsed arguments against the schema; the error says what is wrong.
    pub(super) fn check(&self, arguments: &Value) -> Result<(), String> {
        match self {
            Schema::AnyObject => Ok(()),
            Schema::Checked(validator) => validator.validate(arguments).map_err(|err| clip(err.to_string())),
        }
    }
}

/// Why `schema` does not compile as a JSON Schema (remote `$ref`s are never fetched, so one
/// does not compile), cut short since the message may quote the schema; `None` when it does.
pub fn compile_problem(schema: &Value) -> Option<String> {
    validator(schema).err().map(clip)
}

/// Parses a finished call's concatenated arguments: a JSON object, with blank meaning `{}`.
pub(super) fn parse_object(arguments: &str) -> Result<Value, String> {
    if arguments.trim().is_empty() {
        return Ok(Value::Object(serde_json::Map::new()));
    }
    let value: Value = serde_json::from_str(arguments).map_err(|err| err.to_string())?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(format!("expected an object, got {}", json_kind(&value)))
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Cuts a message to [`MAX_MESSAGE_BYTES`] at a character boundary.
pub(super) fn clip(message: String) -> String {
    cut(message, MAX_MESSAGE_BYTES)
}

/// `text` cut to at most `max` bytes at a char boundary, marked when cut.
pub(super) fn cut(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut at = max;
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    text.truncate(at);
    text.push('…');
    text
}
