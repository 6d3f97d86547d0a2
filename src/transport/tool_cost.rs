//! What a request's tool schemas may cost to compile: at most [`MAX_TOOLS`] tools and
//! [`MAX_SCHEMA_PATTERNS`] regular expressions across all their schemas, else a 400 naming
//! the limit.
//!
//! Every attempt compiles the request's schemas (the tool-call assembler checks finished
//! calls against them), on the runtime's worker threads. A plain schema compiles in
//! microseconds, but each `pattern` / `patternProperties` key is a regex: one of twenty
//! bytes such as `(\w{1,200}){1,200}` takes tens of milliseconds, so a 4 MB body of them
//! would hold a worker for minutes. The byte and message limits of `transport::body` do not
//! see that cost; counting the regexes does. 128 tools is OpenAI's own limit, so no request
//! an SDK would send is refused for it.

use serde_json::Value;

use super::error::DecodeError;
use crate::types::ChatRequest;

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
    Ok(())
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
