//! The request's quality gates, compiled once per request: every attempt (primary, hedge,
//! failover, repair, shadow) takes a fresh tool-call assembler and structured-answer gate
//! that share the compiled tool schemas and response schema.

use super::pattern_budget::{count_patterns, PatternBudget, SchemaRefusal};
use super::schema::ToolSchemas;
use super::{StructuredGate, ToolCallAssembler};
use crate::types::ChatRequest;

/// The compiled gates of one request; cloning shares the compiled schemas.
#[derive(Debug, Clone)]
pub struct Gates {
    /// Holds no call: each attempt's assembler starts as a clone of it.
    assembler: ToolCallAssembler,
    /// Holds no text; `None` when the request asks for no structured answer.
    structured: Option<StructuredGate>,
}

impl Gates {
    /// Compiles `req`'s tool schemas and response schema, each once, their patterns within
    /// the request's budget (`pattern_budget`). The repair's request carries the same tools
    /// and response format, so the same gates judge it. A schema that does not compile, or
    /// not within the budget, is the request's error, naming the schema.
    pub fn compile(req: &ChatRequest) -> Result<Self, SchemaRefusal> {
        let budget = PatternBudget::for_request(req);
        if !budget.fits() {
            return Err(too_many(req, budget));
        }
        Ok(Gates {
            assembler: ToolCallAssembler::over(ToolSchemas::compile_within(&req.tools, budget)?)
                .with_choice(req.tool_choice.as_ref()),
            structured: StructuredGate::compile(req, budget)?,
        })
    }

    /// An empty assembler and gate for one attempt.
    pub fn for_attempt(&self) -> (ToolCallAssembler, Option<StructuredGate>) {
        (self.assembler.clone(), self.structured.clone())
    }
}

/// The refusal of a request with more patterns than the budget has room for, naming the
/// first tool (or the response format) whose patterns go past it.
fn too_many(req: &ChatRequest, budget: PatternBudget) -> SchemaRefusal {
    let room = super::PATTERN_BUDGET / super::MIN_PATTERN_SIZE;
    let mut seen = 0usize;
    for (i, tool) in req.tools.iter().enumerate() {
        seen = seen.saturating_add(count_patterns(&tool.parameters));
        if seen > room {
            return budget.too_many(format!("tools[{i}]"), &format!("tool {:?}", tool.name));
        }
    }
    budget.too_many("response_format".into(), "the json_schema")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ResponseFormat, ToolSpec};
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

    fn with_pattern(pattern: &str) -> Value {
        json!({"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}})
    }

    fn structured(schema: Value) -> ChatRequest {
        ChatRequest {
            response_format: Some(ResponseFormat::JsonSchema {
                name: "answer".into(),
                schema,
                strict: None,
            }),
            ..ChatRequest::default()
        }
    }

    #[test]
    fn a_pattern_that_compiles_to_megabytes_is_refused() {
        let heavy = with_pattern("\\w{2000}\\d{2000}\\s{2000}");
        let err = Gates::compile(&request(vec![tool("heavy", heavy)])).expect_err("over the pattern size limit");
        assert_eq!(err.code, "invalid_tool_schema", "{}", err.message);
        for ordinary in [
            "^[0-9]{4}-[0-9]{2}-[0-9]{2}$",
            "^\\w{1,100}$",
            "^[\\w.+-]+@[\\w-]+\\.[\\w.]+$",
            "^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}Z$",
            // A Unicode class under a counted repetition (`[\\p{L}\\s'-]{0,63}`) compiles
            // past the limit; under `*` it is small.
            "^\\p{L}[\\p{L}\\s'-]*$",
            "^(?=.*[A-Z])[A-Za-z0-9]{8,64}$",
        ] {
            let compiled = Gates::compile(&request(vec![tool("ordinary", with_pattern(ordinary))]));
            assert!(compiled.is_ok(), "{ordinary}: {:?}", compiled.err());
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
            let err = Gates::compile(&req).expect_err("a broken schema is refused");
            assert_eq!(err.code, "invalid_tool_schema", "{bad}");
            assert_eq!(err.param, "tools[1]", "{bad}");
            assert!(err.message.contains("\"broken\""), "names the tool: {}", err.message);
        }
        let no_parameters = request(vec![tool("bare", Value::Null), tool("empty", json!({}))]);
        assert!(
            Gates::compile(&no_parameters).is_ok(),
            "no schema and an empty one accept any object"
        );
        let err = Gates::compile(&structured(json!({"type": "strin"}))).expect_err("a broken response schema");
        assert_eq!(
            (err.code, err.param.as_str()),
            ("invalid_response_schema", "response_format")
        );
        assert!(
            Gates::compile(&structured(json!({"type": "object"}))).is_ok(),
            "a good one passes"
        );
    }

    /// Compiles to between 256 KiB and 512 KiB: within its share when 16 patterns share the
    /// budget, over it when 32 do.
    const MIDSIZE: &str = "^\\w{3000}x$";

    #[test]
    fn patterns_share_the_requests_budget_and_one_over_its_share_is_refused_naming_its_tool() {
        let tools = |n: usize| request((0..n).map(|i| tool(&format!("t{i}"), with_pattern(MIDSIZE))).collect());
        assert!(Gates::compile(&tools(16)).is_ok(), "16 patterns get 512 KiB each");
        let err = Gates::compile(&tools(32)).expect_err("32 patterns get 256 KiB each");
        assert_eq!(err.code, "pattern_budget_exceeded", "{}", err.message);
        assert_eq!(err.param, "tools[0]", "{}", err.message);
        assert!(
            err.message.starts_with("tool \"t0\": "),
            "names the tool: {}",
            err.message
        );
        assert!(err.message.contains("256 KiB each"), "{}", err.message);
        // The response format's patterns share the same budget.
        let mut req = tools(16);
        let patterns: serde_json::Map<String, Value> = (0..16)
            .map(|i| (format!("p{i}"), json!({"type": "string", "pattern": "^a+$"})))
            .collect();
        req.response_format = structured(json!({"type": "object", "properties": patterns})).response_format;
        assert_eq!(
            Gates::compile(&req).err().map(|e| e.code),
            Some("pattern_budget_exceeded"),
            "16 tool patterns and 16 in the response format share 8 MiB"
        );
    }

    #[test]
    fn more_patterns_than_the_budget_has_room_for_are_refused_before_compiling() {
        let patterned = json!({"properties": {"a": {"pattern": "^a$"}}});
        let req = request((0..33).map(|i| tool(&format!("t{i}"), patterned.clone())).collect());
        let err = Gates::compile(&req).expect_err("33 x 256 KiB is over 8 MiB");
        assert_eq!((err.code, err.param.as_str()), ("pattern_budget_exceeded", "tools[32]"));
        assert!(err.message.contains("\"t32\""), "{}", err.message);
    }

    #[test]
    fn a_request_that_offered_no_tools_takes_no_call() {
        let gates = Gates::compile(&request(Vec::new())).expect("no tools compile");
        let (mut assembler, _) = gates.for_attempt();
        let call = crate::provider::ToolFragment {
            index: 0,
            id: Some("call_1".into()),
            name: Some("get_weather".into()),
            arguments: "{}".into(),
        };
        let pushed = assembler
            .push(call)
            .and_then(|_| assembler.finish(crate::types::FinishReason::ToolCalls));
        assert!(
            matches!(pushed, Err(super::super::AssemblerError::UnknownTool { ref name, .. }) if name == "get_weather"),
            "a tool never offered: {pushed:?}"
        );
    }

    #[test]
    fn tool_choice_none_takes_no_call_and_a_forced_tool_no_other() {
        use crate::types::{FinishReason, ToolChoice};
        let call = |name: &str| crate::provider::ToolFragment {
            index: 0,
            id: Some("call_1".into()),
            name: Some(name.into()),
            arguments: "{}".into(),
        };
        let outcome = |choice: Option<ToolChoice>, name: &str| {
            let mut req = request(vec![tool("get_weather", Value::Null), tool("other", Value::Null)]);
            req.tool_choice = choice;
            let (mut assembler, _) = Gates::compile(&req).expect("compiles").for_attempt();
            assembler
                .push(call(name))
                .and_then(|_| assembler.finish(FinishReason::ToolCalls))
        };
        let refused = |r: &Result<Vec<crate::types::ToolCall>, super::super::AssemblerError>| {
            matches!(r, Err(super::super::AssemblerError::NotChosen { .. }))
        };
        assert!(
            refused(&outcome(Some(ToolChoice::None), "get_weather")),
            "none: no call"
        );
        assert!(
            refused(&outcome(Some(ToolChoice::Tool("other".into())), "get_weather")),
            "forced other: not this one"
        );
        assert!(
            outcome(Some(ToolChoice::Tool("other".into())), "other").is_ok(),
            "the forced tool"
        );
        assert!(
            outcome(Some(ToolChoice::Auto), "get_weather").is_ok(),
            "auto: any offered"
        );
        assert!(
            outcome(Some(ToolChoice::Required), "other").is_ok(),
            "required: any offered"
        );
        let err = outcome(Some(ToolChoice::None), "get_weather").err();
        assert!(
            err.is_some_and(|e| !e.blames_route()),
            "the client's constraint blames no route"
        );
    }
}
