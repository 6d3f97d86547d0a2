//! What a request's schemas (its tools' parameters and a `json_schema` response format) may
//! cost to compile, and that they compile: at most [`MAX_TOOLS`] tools and
//! [`MAX_SCHEMA_PATTERNS`] regular expressions and `MAX_SCHEMA_NODES` schema nodes with their
//! references followed (`transport::schema_size`) across all the schemas, each a valid JSON
//! Schema whose patterns compile within `mux::tool_calls::PATTERN_SIZE_LIMIT`, else a 400 naming the limit or
//! the schema.
//!
//! The mux compiles the request's schemas once more, for all its attempts (the tool-call
//! assembler checks finished calls against them), on the runtime's worker threads. A plain schema compiles in
//! microseconds, but each `pattern` / `patternProperties` key is a regex: one of twenty
//! bytes such as `(\w{1,200}){1,200}` takes tens of milliseconds, so a 4 MB body of them
//! would hold a worker for minutes. The byte and message limits of `transport::body` do not
//! see that cost; counting the regexes does. 128 tools is OpenAI's own limit, so no request
//! an SDK would send is refused for it.

use serde_json::Value;

use super::error::DecodeError;
use super::schema_size::{expanded_nodes, TooBig, MAX_SCHEMA_NODES};
use crate::mux::tool_calls::compile_problem;
use crate::types::{ChatRequest, ResponseFormat};

/// Tools one request may offer (OpenAI's limit for `tools`).
pub const MAX_TOOLS: usize = 128;

/// Regular expressions (`pattern` strings and `patternProperties` keys) one request's tool
/// schemas may hold in all.
pub const MAX_SCHEMA_PATTERNS: usize = 32;

/// Refuses a request whose tools would cost more than the limits above to compile.
pub fn check(req: &ChatRequest) -> Result<(), DecodeError> {
    if req.tools.len() > MAX_TOOLS {
        return Err(DecodeError::new(
            "tools",
            format!(
                "too many tools: {} given, at most {MAX_TOOLS} per request",
                req.tools.len()
            ),
        )
        .with_code("max_tools_exceeded"));
    }
    let mut patterns = 0usize;
    for tool in &req.tools {
        patterns = patterns.saturating_add(count_patterns(&tool.parameters));
        if patterns > MAX_SCHEMA_PATTERNS {
            return Err(DecodeError::new(
                "tools",
                format!(
                    "the tool schemas hold too many regular expressions: at most \
                     {MAX_SCHEMA_PATTERNS} `pattern` / `patternProperties` entries per request \
                     (tool {:?} goes past it)",
                    tool.name
                ),
            )
            .with_code("max_schema_patterns_exceeded"));
        }
    }
    let format = match &req.response_format {
        Some(ResponseFormat::JsonSchema { schema, .. }) => Some(schema),
        _ => None,
    };
    if let Some(schema) = format {
        if patterns.saturating_add(count_patterns(schema)) > MAX_SCHEMA_PATTERNS {
            return Err(DecodeError::new(
                "response_format",
                format!(
                    "the schemas hold too many regular expressions: at most {MAX_SCHEMA_PATTERNS} \
                     `pattern` / `patternProperties` entries per request, tools and response \
                     format together"
                ),
            )
            .with_code("max_schema_patterns_exceeded"));
        }
    }
    // What compiling costs, references followed (`schema_size`), before anything compiles.
    let mut left = MAX_SCHEMA_NODES;
    let schemas = req
        .tools
        .iter()
        .enumerate()
        .filter(|(_, tool)| !tool.parameters.is_null())
        .map(|(i, tool)| {
            let what = format!("tool {:?}: its parameters", tool.name);
            (format!("tools[{i}]"), what, &tool.parameters, "invalid_tool_schema")
        })
        .chain(format.map(|schema| {
            let what = "the json_schema".to_string();
            ("response_format".to_string(), what, schema, "invalid_response_schema")
        }));
    for (param, what, schema, invalid) in schemas {
        match expanded_nodes(schema, left) {
            Ok(nodes) => left -= nodes,
            Err(TooBig::Unresolved(reference)) => {
                return Err(DecodeError::new(
                    param,
                    format!(
                        "{what}: the reference {reference:?} cannot be resolved: only references \
                         within the schema are (`#`, `#/json/pointer`, `#anchor`, an `$id` it gives)"
                    ),
                )
                .with_code(invalid));
            }
            Err(TooBig::Nodes | TooBig::Depth) => {
                return Err(DecodeError::new(
                    param,
                    format!(
                        "{what}: the schemas are too large once their references are followed: at \
                         most {MAX_SCHEMA_NODES} schema nodes per request, tools and response format \
                         together"
                    ),
                )
                .with_code("schema_too_complex"));
            }
        }
    }
    // A schema that does not compile cannot judge an answer: every answer checked against it
    // would be refused as the route's invalid output (and fail over, and count against every
    // route), so it is the request's error, found here before any attempt.
    for (i, tool) in req.tools.iter().enumerate() {
        if !tool.parameters.is_null() {
            compiles(&tool.parameters).map_err(|why| {
                DecodeError::new(
                    format!("tools[{i}]"),
                    format!(
                        "tool {:?}: its parameters are not a valid JSON Schema: {why}",
                        tool.name
                    ),
                )
                .with_code("invalid_tool_schema")
            })?;
        }
    }
    if let Some(schema) = format {
        compiles(schema).map_err(|why| {
            DecodeError::new(
                "response_format",
                format!("the json_schema is not a valid JSON Schema: {why}"),
            )
            .with_code("invalid_response_schema")
        })?;
    }
    Ok(())
}

/// Whether `schema` compiles, and why not: the mux's own reading of a schema, so what
/// passes here is what the request's quality gates judge by.
fn compiles(schema: &Value) -> Result<(), String> {
    compile_problem(schema).map_or(Ok(()), Err)
}

/// The regexes a schema holds. Iterative: a parsed value is at most serde_json's recursion
/// limit deep, but the walk need not rely on that.
fn count_patterns(schema: &Value) -> usize {
    let mut count = 0usize;
    let mut pending = vec![schema];
    while let Some(value) = pending.pop() {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    match (key.as_str(), child) {
                        ("pattern", Value::String(_)) => count += 1,
                        ("patternProperties", Value::Object(props)) => count += props.len(),
                        _ => {}
                    }
                    pending.push(child);
                }
            }
            Value::Array(items) => pending.extend(items),
            _ => {}
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ToolSpec;
    use serde_json::json;

    fn request(tools: Vec<ToolSpec>) -> ChatRequest {
        ChatRequest {
            tools,
            ..ChatRequest::default()
        }
    }

    fn tool(name: &str, parameters: Value) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: None,
            parameters,
        }
    }

    #[test]
    fn patterns_are_counted_wherever_they_sit() {
        let schema = json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "pattern": "^a$"},
                "list": {"type": "array", "items": [{"pattern": "b"}, {"anyOf": [{"pattern": "c"}]}]},
            },
            "patternProperties": {"^x": {}, "^y": {"pattern": "d"}},
            "$defs": {"id": {"pattern": "e"}},
        });
        assert_eq!(
            count_patterns(&schema),
            7,
            "five pattern strings and two patternProperties keys"
        );
        assert_eq!(count_patterns(&json!({"type": "object"})), 0, "none in a plain schema");
    }

    #[test]
    fn schemas_that_are_huge_once_references_are_followed_are_refused_before_compiling() {
        // 2^20 nodes inlined from a body of about 1.5 KB.
        let mut defs = serde_json::Map::new();
        for level in 0..20 {
            let next = format!("#/$defs/l{}", level + 1);
            defs.insert(
                format!("l{level}"),
                json!({"type": "object", "properties": {"a": {"$ref": next}, "b": {"$ref": next}}}),
            );
        }
        defs.insert("l20".into(), json!({"type": "string"}));
        let doubling = json!({"$defs": defs, "$ref": "#/$defs/l0"});
        let err = check(&request(vec![tool("deep", doubling)])).expect_err("refused");
        assert_eq!(err.code, Some("schema_too_complex"), "{}", err.message);
        assert_eq!(err.param.as_deref(), Some("tools[0]"));
        // The budget is for the request: many tools of a modest size add up.
        let modest = json!({"type": "object", "properties": {"x": {"enum": (0..500).collect::<Vec<_>>()}}});
        let many: Vec<ToolSpec> = (0..60).map(|i| tool(&format!("t{i}"), modest.clone())).collect();
        let err = check(&request(many)).expect_err("30,000 nodes in all");
        assert_eq!(err.code, Some("schema_too_complex"));
        let few: Vec<ToolSpec> = (0..10).map(|i| tool(&format!("t{i}"), modest.clone())).collect();
        assert!(check(&request(few)).is_ok(), "5,000 nodes fit");
    }

    #[test]
    fn a_pattern_that_compiles_to_megabytes_is_refused() {
        let heavy = json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "\\w{2000}\\d{2000}\\s{2000}"}}});
        let err = check(&request(vec![tool("heavy", heavy)])).expect_err("over the pattern size limit");
        assert_eq!(err.code, Some("invalid_tool_schema"), "{}", err.message);
        let plain = json!({"type": "object", "properties": {"d": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}}});
        assert!(
            check(&request(vec![tool("date", plain)])).is_ok(),
            "an ordinary pattern compiles"
        );
        for ordinary in [
            "^\\w{1,100}$",
            "^[\\w.+-]+@[\\w-]+\\.[\\w.]+$",
            "^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}Z$",
            // A Unicode class under a counted repetition (`[\\p{L}\\s'-]{0,63}`) compiles
            // past the limit; under `*` it is small.
            "^\\p{L}[\\p{L}\\s'-]*$",
            "^(?=.*[A-Z])[A-Za-z0-9]{8,64}$",
        ] {
            let schema = json!({"type": "object", "properties": {"s": {"type": "string", "pattern": ordinary}}});
            let checked = check(&request(vec![tool("ordinary", schema)]));
            assert!(checked.is_ok(), "{ordinary}: {:?}", checked.err().map(|e| e.message));
        }
    }

    #[test]
    fn a_schema_that_does_not_compile_is_the_requests_error_named_by_its_place() {
        for bad in [
            json!({"type": "objekt"}),
            json!({"$schema": "invalid-uri", "type": "object"}),
            json!({"type": "object", "properties": {"a": {"pattern": "(unclosed"}}}),
            json!({"$ref": "https://example.com/elsewhere.json"}),
            json!(12),
        ] {
            let req = request(vec![tool("ok", json!({"type": "object"})), tool("broken", bad.clone())]);
            let err = check(&req).expect_err("a broken schema is refused");
            assert_eq!(err.code, Some("invalid_tool_schema"), "{bad}");
            assert_eq!(err.param.as_deref(), Some("tools[1]"), "{bad}");
            assert!(err.message.contains("\"broken\""), "names the tool: {}", err.message);
        }
        let no_parameters = request(vec![tool("bare", Value::Null), tool("empty", json!({}))]);
        assert!(
            check(&no_parameters).is_ok(),
            "no schema and an empty one accept any object"
        );
        let structured = |schema: Value| ChatRequest {
            response_format: Some(ResponseFormat::JsonSchema {
                name: "answer".into(),
                schema,
                strict: None,
            }),
            ..ChatRequest::default()
        };
        let err = check(&structured(json!({"type": "strin"}))).expect_err("a broken response schema");
        assert_eq!(
            (err.code, err.param.as_deref()),
            (Some("invalid_response_schema"), Some("response_format"))
        );
        assert!(
            check(&structured(json!({"type": "object"}))).is_ok(),
            "a good one passes"
        );
        let patterns: serde_json::Map<String, Value> = (0..=MAX_SCHEMA_PATTERNS)
            .map(|i| (format!("p{i}"), json!({"type": "string", "pattern": "^a+$"})))
            .collect();
        let err = check(&structured(json!({"type": "object", "properties": patterns})))
            .expect_err("the response format's regexes count too");
        assert_eq!(err.code, Some("max_schema_patterns_exceeded"), "{}", err.message);
    }

    #[test]
    fn the_limits_are_inclusive_and_named_when_passed() {
        let plain = |i: usize| tool(&format!("t{i}"), json!({"type": "object"}));
        assert!(
            check(&request((0..MAX_TOOLS).map(plain).collect())).is_ok(),
            "128 tools pass"
        );
        let err = check(&request((0..=MAX_TOOLS).map(plain).collect())).expect_err("129 tools");
        assert_eq!(err.code, Some("max_tools_exceeded"), "code");
        assert_eq!(err.param.as_deref(), Some("tools"), "param");

        let patterned = |i: usize| tool(&format!("t{i}"), json!({"properties": {"a": {"pattern": "^a+$"}}}));
        assert!(
            check(&request((0..MAX_SCHEMA_PATTERNS).map(patterned).collect())).is_ok(),
            "32 patterns pass"
        );
        let err = check(&request((0..=MAX_SCHEMA_PATTERNS).map(patterned).collect())).expect_err("33 patterns");
        assert_eq!(err.code, Some("max_schema_patterns_exceeded"), "code");
        assert!(
            err.message.contains("\"t32\""),
            "names the tool that passed it: {}",
            err.message
        );
    }
}
