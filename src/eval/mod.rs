//! `tailcut eval`: equivalence scores. An eval set (JSON lines: a prompt and a check per
//! item) runs against every route of a config; each answer is checked (exact, contains,
//! JSON Schema validity, tool-call validity, expected refusal) and the results become
//! per-route, per-task scores (`run`), written as JSON and printed as a table.
//!
//! One item a line:
//! `{"id": "capital", "task": "chat", "prompt": "Capital of France?", "check": {"type": "contains", "value": "Paris"}}`
//! with optional `system`, `tools` (`[{name, description, parameters}]`) and for
//! `json_schema` checks the `schema`.

mod run;

use serde::Deserialize;
use serde_json::Value;

pub use run::{run, Scores, TaskScore};

use crate::types::{ChatRequest, Message, ResponseFormat, Role, ToolSpec};

/// One eval item.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalItem {
    #[serde(default)]
    pub id: Option<String>,
    /// The task type the score is for (a route's `quality` key); default `chat`.
    #[serde(default = "default_task")]
    pub task: String,
    #[serde(default)]
    pub system: Option<String>,
    pub prompt: String,
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    pub check: Check,
}

fn default_task() -> String {
    "chat".into()
}

/// What an answer must do to pass.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Check {
    /// The answer's text, trimmed, equals `value`.
    Exact { value: String },
    /// The answer's text contains `value` (case-insensitive).
    Contains { value: String },
    /// The answer is JSON valid against `schema` (the request asks for it as `json_schema`).
    JsonSchema { schema: Value },
    /// The answer calls a tool (named `name`, when given) with valid arguments.
    ToolCall {
        #[serde(default)]
        name: Option<String>,
    },
    /// The model is expected to refuse.
    Refusal,
}

impl Check {
    pub fn label(&self) -> &'static str {
        match self {
            Check::Exact { .. } => "exact",
            Check::Contains { .. } => "contains",
            Check::JsonSchema { .. } => "json_schema",
            Check::ToolCall { .. } => "tool_call",
            Check::Refusal => "refusal",
        }
    }
}

/// `tailcut eval`: loads the config (the embedded default without one) and the set, runs
/// it with a progress bar, writes the scores as JSON to `out`, returns them.
pub async fn command(
    config: Option<&std::path::Path>,
    set: &std::path::Path,
    out: &std::path::Path,
    concurrency: usize,
) -> Result<Scores, String> {
    let config = match config {
        Some(path) => crate::config::load_file(path),
        None => crate::config::load_str(crate::config::DEFAULT_TOML),
    }
    .map_err(|e| e.to_string())?;
    let text = std::fs::read_to_string(set).map_err(|e| format!("{}: {e}", set.display()))?;
    let items = parse_set(&text).map_err(|e| format!("{}:\n{e}", set.display()))?;
    let scores = run(config, &items, concurrency, true).await?;
    let json = serde_json::to_vec_pretty(&scores).map_err(|e| e.to_string())?;
    std::fs::write(out, json).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(scores)
}

/// Parses an eval set: one JSON object a line; blank lines and `#` comments are skipped.
/// Every bad line is reported with its number.
pub fn parse_set(text: &str) -> Result<Vec<EvalItem>, String> {
    let mut items = Vec::new();
    let mut problems = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match serde_json::from_str::<EvalItem>(line) {
            Ok(item) => items.push(item),
            Err(e) => problems.push(format!("line {}: {e}", i + 1)),
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("\n"));
    }
    if items.is_empty() {
        return Err("the eval set has no items".into());
    }
    Ok(items)
}

/// The chat request an item sends to `model`.
pub fn request(item: &EvalItem, model: &str) -> ChatRequest {
    let mut messages = Vec::new();
    if let Some(system) = &item.system {
        messages.push(Message::text(Role::System, system.clone()));
    }
    messages.push(Message::text(Role::User, item.prompt.clone()));
    let response_format = match &item.check {
        Check::JsonSchema { schema } => Some(ResponseFormat::JsonSchema {
            name: "answer".into(),
            schema: schema.clone(),
            strict: None,
        }),
        _ => None,
    };
    ChatRequest {
        model: model.to_string(),
        messages,
        tools: item.tools.clone(),
        response_format,
        stream: true,
        include_usage: true,
        ..ChatRequest::default()
    }
}

/// What one answer came to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    pub text: String,
    /// Names of the (validated) tool calls.
    pub tool_calls: Vec<String>,
    pub refused: bool,
    /// The request failed (no answer to judge).
    pub error: Option<String>,
}

/// Judges `answer` against `check`: (passed, schema-valid when the check is a schema).
pub fn judge(check: &Check, answer: &Answer) -> (bool, Option<bool>) {
    if answer.error.is_some() && !matches!(check, Check::Refusal) {
        return (false, matches!(check, Check::JsonSchema { .. }).then_some(false));
    }
    match check {
        Check::Exact { value } => (answer.text.trim() == value.trim(), None),
        Check::Contains { value } => (answer.text.to_lowercase().contains(&value.to_lowercase()), None),
        Check::JsonSchema { schema } => {
            let valid = serde_json::from_str::<Value>(answer.text.trim())
                .ok()
                .is_some_and(|v| jsonschema::validator_for(schema).is_ok_and(|s| s.is_valid(&v)));
            (valid, Some(valid))
        }
        Check::ToolCall { name } => (
            match name {
                Some(n) => answer.tool_calls.iter().any(|c| c == n),
                None => !answer.tool_calls.is_empty(),
            },
            None,
        ),
        Check::Refusal => (answer.refused, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_parses_line_by_line_and_bad_lines_are_named() {
        let text = r#"
            # comment
            {"prompt": "Capital of France?", "check": {"type": "contains", "value": "Paris"}}
            {"task": "code", "prompt": "JSON", "check": {"type": "json_schema", "schema": {"type": "object"}}}
        "#;
        let items = parse_set(text).expect("valid");
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].task, "chat", "default task");
        let err = parse_set("{\"prompt\": \"x\"}\n{\"prompt\": \"y\", \"check\": {\"type\": \"sing\"}}")
            .expect_err("invalid");
        assert!(err.contains("line 1") && err.contains("line 2"), "{err}");
    }

    #[test]
    fn checks_judge_answers() {
        let text = |t: &str| Answer {
            text: t.into(),
            ..Answer::default()
        };
        let contains = Check::Contains { value: "paris".into() };
        assert_eq!(judge(&contains, &text("It is Paris.")), (true, None));
        assert_eq!(judge(&Check::Exact { value: "4".into() }, &text(" 4\n")), (true, None));
        let schema = Check::JsonSchema {
            schema: serde_json::json!({"type": "object", "required": ["a"]}),
        };
        assert_eq!(judge(&schema, &text("{\"a\": 1}")), (true, Some(true)));
        assert_eq!(judge(&schema, &text("{\"b\": 1}")), (false, Some(false)));
        assert_eq!(judge(&schema, &text("not json")), (false, Some(false)));
        let tool = Answer {
            tool_calls: vec!["weather".into()],
            ..Answer::default()
        };
        assert!(
            judge(
                &Check::ToolCall {
                    name: Some("weather".into())
                },
                &tool
            )
            .0
        );
        assert!(
            !judge(
                &Check::ToolCall {
                    name: Some("other".into())
                },
                &tool
            )
            .0
        );
        let refused = Answer {
            refused: true,
            ..Answer::default()
        };
        assert!(judge(&Check::Refusal, &refused).0);
        let failed = Answer {
            error: Some("503".into()),
            ..text("Paris")
        };
        assert!(!judge(&contains, &failed).0, "a failed request passes nothing");
    }
}
