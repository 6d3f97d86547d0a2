//! What a request's schemas (its tools' parameters and a `json_schema` response format) may
//! cost to compile, counted before anything compiles (and that no two tools share a name):
//! at most [`MAX_TOOLS`] tools and
//! [`MAX_SCHEMA_PATTERNS`] regular expressions and `MAX_SCHEMA_NODES` schema nodes with their
//! references followed (`transport::schema_size`) across all the schemas, else a 400 naming
//! the limit or the schema.
//!
//! The schemas are then compiled once, by the gateway (`mux::tool_calls::Gates::compile`),
//! for all the request's attempts (the tool-call assembler checks finished calls against
//! them), their patterns within the request's 8 MiB budget; a schema that does not compile
//! is refused there, naming it. That runs on the runtime's worker threads. A plain schema compiles in
//! microseconds, but each `pattern` / `patternProperties` key is a regex: one of twenty
//! bytes such as `(\w{1,200}){1,200}` takes tens of milliseconds, so a 4 MB body of them
//! would hold a worker for minutes. The byte and message limits of `transport::body` do not
//! see that cost; counting the regexes does. 128 tools is OpenAI's own limit, so no request
//! an SDK would send is refused for it.

use super::decode_error::DecodeError;
use super::schema_size::{expanded_nodes, TooBig, MAX_SCHEMA_NODES};
use crate::mux::tool_calls::count_patterns;
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
    // Two tools of one name: a call to it could be judged by either schema, and the client
    // could not tell which tool the model meant.
    let mut names = std::collections::HashSet::with_capacity(req.tools.len());
    for (i, tool) in req.tools.iter().enumerate() {
        if !names.insert(tool.name.as_str()) {
            return Err(DecodeError::new(
                format!("tools[{i}]"),
                format!(
                    "duplicate tool name {:?}: each tool in a request needs a name of its own",
                    tool.name
                ),
            )
            .with_code("duplicate_tool_name"));
        }
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ToolSpec;
    use serde_json::{json, Value};

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
    fn the_response_formats_regexes_count_too() {
        let patterns: serde_json::Map<String, Value> = (0..=MAX_SCHEMA_PATTERNS)
            .map(|i| (format!("p{i}"), json!({"type": "string", "pattern": "^a+$"})))
            .collect();
        let req = ChatRequest {
            response_format: Some(ResponseFormat::JsonSchema {
                name: "answer".into(),
                schema: json!({"type": "object", "properties": patterns}),
                strict: None,
            }),
            ..ChatRequest::default()
        };
        let err = check(&req).expect_err("33 regexes in the response format");
        assert_eq!(err.code, Some("max_schema_patterns_exceeded"), "{}", err.message);
    }

    #[test]
    fn a_tool_name_given_twice_is_refused_naming_it_and_its_place() {
        let plain = json!({"type": "object"});
        let req = request(vec![
            tool("lookup", plain.clone()),
            tool("weather", plain.clone()),
            tool(
                "lookup",
                json!({"type": "object", "properties": {"q": {"type": "string"}}}),
            ),
        ]);
        let err = check(&req).expect_err("two tools named lookup");
        assert_eq!(err.code, Some("duplicate_tool_name"), "{}", err.message);
        assert_eq!(err.param.as_deref(), Some("tools[2]"), "the second of the two");
        assert!(
            err.message.contains("\"lookup\""),
            "names the duplicate: {}",
            err.message
        );
        let distinct = request(vec![tool("lookup", plain.clone()), tool("Lookup", plain)]);
        assert!(check(&distinct).is_ok(), "names are compared exactly");
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
