//! The request's budget for compiled regular expressions: 8 MiB ([`PATTERN_BUDGET`]) across
//! every `pattern` and `patternProperties` key of its schemas (tools and response format),
//! shared out evenly as each pattern's regex `size_limit`, at least [`MIN_PATTERN_SIZE`] and
//! at most `PATTERN_SIZE_LIMIT` (1 MiB); and the refusal of a request whose schemas do not
//! compile within it, naming the schema ([`SchemaRefusal`]).
//!
//! Why a budget per request and not only per pattern: 32 patterns (the transport's count
//! limit) of just under 1 MiB each compiled to 32 MiB for one request, held for all its
//! attempts. Shared out, a request's patterns hold at most 8 MiB together: 8 patterns get
//! 1 MiB each, 32 get 256 KiB each. A pattern over its share is the client's to simplify;
//! the refusal says whether fewer patterns would have given it room.

use serde_json::Value;

use super::schema::PATTERN_SIZE_LIMIT;
use crate::types::{patterns_at, ChatRequest, ResponseFormat};

/// Compiled pattern size one request's schemas may take in all.
pub const PATTERN_BUDGET: usize = 8 * 1024 * 1024;

/// The smallest `size_limit` any pattern gets, however many share the budget.
pub const MIN_PATTERN_SIZE: usize = 256 * 1024;

/// Why a request's schemas cannot be compiled: a 400 naming the schema's place (`param`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SchemaRefusal {
    /// `tools[i]` or `response_format`.
    pub param: String,
    /// `invalid_tool_schema`, `invalid_response_schema` or `pattern_budget_exceeded`.
    pub code: &'static str,
    pub message: String,
}

/// How one request's patterns share [`PATTERN_BUDGET`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatternBudget {
    patterns: usize,
}

impl PatternBudget {
    /// The budget for `req`'s schemas: its tools' parameters and a `json_schema` format.
    pub fn for_request(req: &ChatRequest) -> Self {
        let tools = req.tools.iter().map(|tool| count_patterns(&tool.parameters));
        let format = match &req.response_format {
            Some(ResponseFormat::JsonSchema { schema, .. }) => count_patterns(schema),
            _ => 0,
        };
        PatternBudget {
            patterns: tools.fold(format, usize::saturating_add),
        }
    }

    /// Patterns sharing the budget.
    pub fn patterns(self) -> usize {
        self.patterns
    }

    /// Each pattern's `size_limit`: an even share, within `MIN_PATTERN_SIZE..=PATTERN_SIZE_LIMIT`.
    pub fn per_pattern(self) -> usize {
        (PATTERN_BUDGET / self.patterns.max(1)).clamp(MIN_PATTERN_SIZE, PATTERN_SIZE_LIMIT)
    }

    /// Whether every pattern can have at least `MIN_PATTERN_SIZE` within the budget.
    pub fn fits(self) -> bool {
        self.patterns.saturating_mul(MIN_PATTERN_SIZE) <= PATTERN_BUDGET
    }

    /// The refusal of a request with more patterns than the budget has room for, naming
    /// the schema (`param`, `what`) whose patterns go past it.
    pub fn too_many(self, param: String, what: &str) -> SchemaRefusal {
        SchemaRefusal {
            param,
            code: "pattern_budget_exceeded",
            message: format!(
                "{what}: the schemas hold {} regular expressions; the request's budget of {} MiB \
                 of compiled patterns has room for at most {} ({} KiB each)",
                self.patterns,
                PATTERN_BUDGET >> 20,
                PATTERN_BUDGET / MIN_PATTERN_SIZE,
                MIN_PATTERN_SIZE >> 10
            ),
        }
    }

    /// The refusal of a schema (`param`, `what`) one of whose patterns compiles within the
    /// per-pattern maximum but not within its share.
    pub fn over_share(self, param: String, what: &str) -> SchemaRefusal {
        let roomier = if self.per_pattern() < PATTERN_SIZE_LIMIT {
            format!(
                "; with {} patterns or fewer in the request each gets {} KiB",
                PATTERN_BUDGET / PATTERN_SIZE_LIMIT,
                PATTERN_SIZE_LIMIT >> 10
            )
        } else {
            String::new()
        };
        SchemaRefusal {
            param,
            code: "pattern_budget_exceeded",
            message: format!(
                "{what}: a `pattern` compiles to more than its share of the request's {} MiB regex \
                 budget: {} KiB each for the request's {} patterns{roomier}",
                PATTERN_BUDGET >> 20,
                self.per_pattern() >> 10,
                self.patterns,
            ),
        }
    }
}

/// The regexes a schema holds (`pattern` strings and `patternProperties` keys). Iterative:
/// a parsed value is at most serde_json's recursion limit deep, but the walk need not rely
/// on that.
pub fn count_patterns(schema: &Value) -> usize {
    let mut count = 0usize;
    let mut pending = vec![schema];
    while let Some(value) = pending.pop() {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    count += patterns_at(key, child);
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
    use serde_json::json;

    fn budget(patterns: usize) -> PatternBudget {
        PatternBudget { patterns }
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
    fn the_budget_is_shared_evenly_between_its_floor_and_ceiling() {
        assert_eq!(budget(0).per_pattern(), PATTERN_SIZE_LIMIT, "none: the ceiling");
        assert_eq!(budget(1).per_pattern(), PATTERN_SIZE_LIMIT, "one: the ceiling");
        assert_eq!(budget(8).per_pattern(), PATTERN_SIZE_LIMIT, "8 x 1 MiB is the budget");
        assert_eq!(budget(16).per_pattern(), 512 * 1024);
        assert_eq!(budget(32).per_pattern(), MIN_PATTERN_SIZE, "32 x 256 KiB is the budget");
        assert!(budget(32).fits());
        assert!(!budget(33).fits(), "a 33rd pattern would take the total past 8 MiB");
        for n in 1..=32 {
            assert!(n * budget(n).per_pattern() <= PATTERN_BUDGET, "{n} patterns");
        }
    }

    #[test]
    fn a_request_counts_its_tools_and_its_response_format() {
        let patterned = json!({"properties": {"a": {"pattern": "^a$"}, "b": {"pattern": "^b$"}}});
        let req = ChatRequest {
            tools: vec![crate::types::ToolSpec {
                name: "t".into(),
                description: None,
                parameters: patterned.clone(),
            }],
            response_format: Some(ResponseFormat::JsonSchema {
                name: "f".into(),
                schema: patterned,
                strict: None,
            }),
            ..ChatRequest::default()
        };
        assert_eq!(PatternBudget::for_request(&req).patterns(), 4);
    }

    #[test]
    fn the_refusals_name_the_schema_and_the_budget() {
        let r = budget(32).over_share("tools[3]".into(), "tool \"lookup\"");
        assert_eq!((r.param.as_str(), r.code), ("tools[3]", "pattern_budget_exceeded"));
        assert!(r.message.starts_with("tool \"lookup\": "), "{}", r.message);
        assert!(
            r.message.contains("256 KiB each for the request's 32 patterns"),
            "{}",
            r.message
        );
        assert!(r.message.contains("8 patterns or fewer"), "{}", r.message);
        let r = budget(40).too_many("tools[0]".into(), "tool \"t\"");
        assert!(r.message.contains("at most 32"), "{}", r.message);
    }
}
