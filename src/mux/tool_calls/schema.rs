//! The request's tool schemas, compiled once, and the checks a finished call's arguments
//! must pass: a JSON object (`""` reads as `{}`) that matches its tool's schema. A client's
//! schema that does not compile, or not within the request's pattern budget
//! (`pattern_budget`), is the request's error (`ToolSchemas::compile_within`).

use std::collections::HashMap;

use jsonschema::Validator;
use serde_json::Value;

use super::pattern_budget::{PatternBudget, SchemaRefusal};
use crate::types::{within_budget, ToolSpec};

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
    validator_within(schema, PATTERN_SIZE_LIMIT)
}

/// As `validator`, each pattern's compiled size bounded by `size_limit` (a request's share
/// of its pattern budget, `pattern_budget`). A schema past the schema budget
/// (`types::SchemaBudget`) is never compiled: the edge refuses a request's, and any other
/// (an assembler's own tools) is refused here.
pub(super) fn validator_within(schema: &Value, size_limit: usize) -> Result<Validator, String> {
    within_budget(schema).map_err(|over| over.to_string())?;
    jsonschema::options()
        .with_pattern_options(
            jsonschema::PatternOptions::fancy_regex()
                .size_limit(size_limit)
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
    /// Any name is accepted: an assembler over no tools that is not bound to a request
    /// (`ToolCallAssembler::new(&[])`). A request's own schemas never are: a call to a
    /// request that offered no tools names a tool it never offered.
    any_name: bool,
}

#[derive(Debug)]
pub(super) enum Schema {
    /// No schema given, or one that does not compile: any JSON object is accepted.
    AnyObject,
    Checked(Validator),
}

impl ToolSchemas {
    /// Compiles every tool's schema, each once, its patterns within `budget`'s share; a
    /// schema that does not compile is the request's error, naming the tool.
    pub(super) fn compile_within(tools: &[ToolSpec], budget: PatternBudget) -> Result<Self, SchemaRefusal> {
        let mut by_name = HashMap::with_capacity(tools.len());
        for (i, tool) in tools.iter().enumerate() {
            let schema = if tool.parameters.is_null() {
                Schema::AnyObject
            } else {
                let what = format!("tool {:?}", tool.name);
                if let Some(why) = super::unsatisfiable::why_unsatisfiable(&tool.parameters) {
                    return Err(SchemaRefusal {
                        param: format!("tools[{i}]"),
                        code: "invalid_tool_schema",
                        message: format!("{what}: no arguments can satisfy its parameters: {why}"),
                    });
                }
                match checked(&tool.parameters, budget, format!("tools[{i}]"), &what) {
                    Ok(validator) => Schema::Checked(validator),
                    Err(Uncompiled::OverShare(refusal)) => return Err(refusal),
                    Err(Uncompiled::Invalid(why)) => {
                        return Err(SchemaRefusal {
                            param: format!("tools[{i}]"),
                            code: "invalid_tool_schema",
                            message: format!("{what}: its parameters are not a valid JSON Schema: {why}"),
                        });
                    }
                }
            };
            by_name.entry(tool.name.clone()).or_insert(schema);
        }
        Ok(ToolSchemas {
            by_name,
            any_name: false,
        })
    }

    /// Compiles every tool's schema. The first tool of a given name wins.
    pub(super) fn compile(tools: &[ToolSpec]) -> Self {
        let mut by_name = HashMap::with_capacity(tools.len());
        for tool in tools {
            by_name
                .entry(tool.name.clone())
                .or_insert_with(|| Schema::compile(&tool.name, &tool.parameters));
        }
        let any_name = by_name.is_empty();
        ToolSchemas { by_name, any_name }
    }

    /// The schema a call to `name` must match, or `None` when `name` is not one of the
    /// tools (for a request's schemas, also when it offered none).
    pub(super) fn lookup(&self, name: &str) -> Option<&Schema> {
        if self.any_name {
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

/// Why a schema was not compiled.
pub(super) enum Uncompiled {
    /// It compiles within the per-pattern maximum but not within the request's share.
    OverShare(SchemaRefusal),
    /// It does not compile: what the crate says, cut short.
    Invalid(String),
}

/// `schema` compiled with its patterns within `budget`'s share (`param` and `what` name it in
/// a refusal). Only a failed compile is tried again, at the per-pattern maximum, to tell a
/// pattern over its share from one that cannot compile at all.
pub(super) fn checked(
    schema: &Value,
    budget: PatternBudget,
    param: String,
    what: &str,
) -> Result<Validator, Uncompiled> {
    validator_within(schema, budget.per_pattern()).map_err(|why| {
        if budget.per_pattern() < PATTERN_SIZE_LIMIT && validator(schema).is_ok() {
            Uncompiled::OverShare(budget.over_share(param, what))
        } else {
            Uncompiled::Invalid(clip(why))
        }
    })
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
