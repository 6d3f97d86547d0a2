//! What a request's schemas (its tools' parameters and a `json_schema` response format) may
//! cost, checked before anything compiles them: at most [`MAX_TOOLS`] tools, no two of one
//! name, and every schema within the request's one schema budget (`types::SchemaBudget`:
//! depth, nodes and keywords with references followed, references, regular expressions,
//! `enum`/`const` bytes). Past it is a 400 naming the schema's place in the client's own
//! dialect (`tools[2].function.parameters`, `tools.2.input_schema`, `response_format`) and
//! the limit, with the schema's code (`invalid_tool_schema`, `invalid_response_schema`).
//!
//! The schemas are then compiled once, by the gateway (`mux::tool_calls::Gates::compile`),
//! for all the request's attempts, their regexes within the request's 8 MiB budget; a schema
//! that does not compile is refused there, naming it. That runs on the runtime's worker
//! threads, which is why the cost is bounded here first: one `pattern` of twenty bytes such
//! as `(\w{1,200}){1,200}` takes tens of milliseconds to compile, and a few KB of `$defs`
//! that refer twice to the next level would compile to millions of nodes. 128 tools is
//! OpenAI's own limit, so no request an SDK would send is refused for it.

use super::decode_error::DecodeError;
use crate::types::{ChatRequest, Dialect, OverBudget, ResponseFormat, SchemaBudget};

/// Tools one request may offer (OpenAI's limit for `tools`).
pub const MAX_TOOLS: usize = 128;

/// Refuses a request whose tools would cost more than the limits above to compile; `dialect`
/// names the schema's place as the client wrote it.
pub fn check(req: &ChatRequest, dialect: Dialect) -> Result<(), DecodeError> {
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
    // The Anthropic dialect's paths are dotted (`tools.2.input_schema`), as its other errors'.
    let place = |i: usize| match dialect {
        Dialect::Anthropic => format!("tools.{i}.input_schema"),
        Dialect::OpenAi | Dialect::Native => format!("tools[{i}].function.parameters"),
    };
    let format = match &req.response_format {
        Some(ResponseFormat::JsonSchema { schema, .. }) => Some(schema),
        _ => None,
    };
    let schemas = req
        .tools
        .iter()
        .enumerate()
        .filter(|(_, tool)| !tool.parameters.is_null())
        .map(|(i, tool)| {
            let what = format!("tool {:?}: its parameters", tool.name);
            (place(i), what, &tool.parameters, "invalid_tool_schema")
        })
        .chain(format.map(|schema| {
            let what = "the json_schema".to_string();
            ("response_format".to_string(), what, schema, "invalid_response_schema")
        }));
    let mut budget = SchemaBudget::default();
    for (param, what, schema, code) in schemas {
        if let Err(over) = budget.charge(schema) {
            let message = match over {
                OverBudget::Unresolved(_) => format!("{what}: {over}"),
                _ => format!("{what}: over the schema budget: {over}"),
            };
            return Err(DecodeError::new(param, message).with_code(code));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ToolSpec, MAX_SCHEMA_DEPTH, MAX_SCHEMA_PATTERNS};
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

    fn openai(req: &ChatRequest) -> Result<(), DecodeError> {
        check(req, Dialect::OpenAi)
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
        let err = openai(&request(vec![tool("deep", doubling)])).expect_err("refused");
        assert_eq!(err.code, Some("invalid_tool_schema"), "{}", err.message);
        assert_eq!(err.param.as_deref(), Some("tools[0].function.parameters"));
        assert!(
            err.message.contains("once their references are followed"),
            "names the limit: {}",
            err.message
        );
        // The budget is for the request: many tools of a modest size add up.
        let modest = json!({"type": "object", "properties": {"x": {"enum": (0..500).collect::<Vec<_>>()}}});
        let many: Vec<ToolSpec> = (0..60).map(|i| tool(&format!("t{i}"), modest.clone())).collect();
        let err = openai(&request(many)).expect_err("30,000 nodes in all");
        assert_eq!(err.code, Some("invalid_tool_schema"));
        let few: Vec<ToolSpec> = (0..10).map(|i| tool(&format!("t{i}"), modest.clone())).collect();
        assert!(openai(&request(few)).is_ok(), "5,000 nodes fit");
    }

    #[test]
    fn a_schema_past_the_depth_is_refused_naming_its_place_in_the_clients_dialect() {
        let nest = |levels: usize| {
            (0..levels).fold(
                json!({"type": "string"}),
                |inner, _| json!({"type": "array", "items": inner}),
            )
        };
        assert!(openai(&request(vec![tool("ok", nest(MAX_SCHEMA_DEPTH))])).is_ok());
        let deep = request(vec![tool("plain", json!({})), tool("deep", nest(MAX_SCHEMA_DEPTH + 1))]);
        let err = openai(&deep).expect_err("one level past");
        assert_eq!(err.param.as_deref(), Some("tools[1].function.parameters"));
        assert_eq!(err.code, Some("invalid_tool_schema"));
        assert!(err.message.contains("\"deep\""), "names the tool: {}", err.message);
        assert!(
            err.message.contains(&format!("{MAX_SCHEMA_DEPTH} levels")),
            "names the limit: {}",
            err.message
        );
        let err = check(&deep, Dialect::Anthropic).expect_err("the same in the Anthropic dialect");
        assert_eq!(err.param.as_deref(), Some("tools.1.input_schema"));
        let format = ChatRequest {
            response_format: Some(ResponseFormat::JsonSchema {
                name: "answer".into(),
                schema: nest(MAX_SCHEMA_DEPTH + 1),
                strict: None,
            }),
            ..ChatRequest::default()
        };
        let err = openai(&format).expect_err("a response format past the depth");
        assert_eq!(err.param.as_deref(), Some("response_format"));
        assert_eq!(err.code, Some("invalid_response_schema"));
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
        let err = openai(&req).expect_err("33 regexes in the response format");
        assert_eq!(err.code, Some("invalid_response_schema"), "{}", err.message);
        assert!(err.message.contains("regular expressions"), "{}", err.message);
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
        let err = openai(&req).expect_err("two tools named lookup");
        assert_eq!(err.code, Some("duplicate_tool_name"), "{}", err.message);
        assert_eq!(err.param.as_deref(), Some("tools[2]"), "the second of the two");
        assert!(
            err.message.contains("\"lookup\""),
            "names the duplicate: {}",
            err.message
        );
        let distinct = request(vec![tool("lookup", plain.clone()), tool("Lookup", plain)]);
        assert!(openai(&distinct).is_ok(), "names are compared exactly");
    }

    #[test]
    fn the_limits_are_inclusive_and_named_when_passed() {
        let plain = |i: usize| tool(&format!("t{i}"), json!({"type": "object"}));
        assert!(
            openai(&request((0..MAX_TOOLS).map(plain).collect())).is_ok(),
            "128 tools pass"
        );
        let err = openai(&request((0..=MAX_TOOLS).map(plain).collect())).expect_err("129 tools");
        assert_eq!(err.code, Some("max_tools_exceeded"), "code");
        assert_eq!(err.param.as_deref(), Some("tools"), "param");

        let patterned = |i: usize| tool(&format!("t{i}"), json!({"properties": {"a": {"pattern": "^a+$"}}}));
        assert!(
            openai(&request((0..MAX_SCHEMA_PATTERNS).map(patterned).collect())).is_ok(),
            "32 patterns pass"
        );
        let err = openai(&request((0..=MAX_SCHEMA_PATTERNS).map(patterned).collect())).expect_err("33 patterns");
        assert_eq!(err.code, Some("invalid_tool_schema"), "code");
        assert_eq!(
            err.param.as_deref(),
            Some("tools[32].function.parameters"),
            "the tool that passed it"
        );
        assert!(err.message.contains("\"t32\""), "names the tool: {}", err.message);
    }
}
