//! Anthropic extended thinking rules (providers.md §2.4), with the API's messages: the
//! `thinking` configuration, the sampling it allows, the shape of the assistant turn it
//! continues, and the thinking blocks a conversation carries back, whose signatures must be
//! the ones the simulator issued for exactly their text (`signature.rs`).
//!
//! Checked in this order: the configuration's schema (type, budget), blocks missing their
//! signature or data, then with thinking on `max_tokens` above the budget (unless the
//! `interleaved-thinking-2025-05-14` beta), `temperature` 1 only, no `top_k`, `top_p` within
//! 0.95..=1, no forced `tool_choice` with `enabled` (`adaptive` allows it), and the current
//! assistant turn (a prefill, or a tool loop in progress) starting with a `thinking` or
//! `redacted_thinking` block; with thinking off, no thinking in a final assistant message;
//! last, every block's signature or data.
//!
//! The current turn begins after the last user message that is not only tool results; its
//! first assistant message is the one that must start with thinking, as the API's
//! "preceeding the lastmost set of `tool_use` and `tool_result` blocks" says.
//!
//! A `redacted_thinking` block must carry `data` the simulator issued; the real API's
//! refusal of foreign data was not found, so "messages.N.content.M: Invalid `data` in
//! `redacted_thinking` block" is *[unverified]*, after the signature refusal. So is the
//! pydantic-style refusal of an unknown `thinking.type`.

use serde_json::Value;

use super::super::plan::StatusError;
use super::super::signature;
use super::has_beta;

const INTERLEAVED_BETA: &str = "interleaved-thinking-2025-05-14";
const MIN_BUDGET: u64 = 1024;

const DOCS: &str = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking";

/// The request's thinking configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Config {
    Off,
    /// `enabled`, with its budget.
    Enabled(u64),
    Adaptive,
}

pub(super) fn refusal(body: &Value, beta: Option<&str>) -> Option<StatusError> {
    let refuse = |message: String| Some(StatusError::invalid(message));
    let config = match config(body) {
        Ok(config) => config,
        Err(message) => return refuse(message),
    };
    let blocks = thinking_blocks(body);
    if let Some(message) = blocks.iter().find_map(Block::missing) {
        return refuse(message);
    }
    let message = match config {
        Config::Off => final_thinking_while_off(body),
        Config::Enabled(budget) => {
            let max_tokens = body.get("max_tokens").and_then(Value::as_u64);
            if max_tokens.is_some_and(|m| m <= budget) && !has_beta(beta, INTERLEAVED_BETA) {
                return refuse("`max_tokens` must be greater than `thinking.budget_tokens`.".to_owned());
            }
            sampling(body)
                .or_else(|| forced_tool(body))
                .or_else(|| turn_start(body))
        }
        Config::Adaptive => sampling(body).or_else(|| turn_start(body)),
    };
    message
        .or_else(|| blocks.iter().find_map(Block::forged))
        .and_then(refuse)
}

fn config(body: &Value) -> Result<Config, String> {
    let Some(thinking) = body.get("thinking").filter(|t| !t.is_null()) else {
        return Ok(Config::Off);
    };
    match thinking.get("type").and_then(Value::as_str) {
        Some("disabled") => Ok(Config::Off),
        Some("adaptive") => Ok(Config::Adaptive),
        Some("enabled") => match thinking.get("budget_tokens") {
            None => Err("thinking.enabled.budget_tokens: Field required".to_owned()),
            Some(budget) => match budget.as_u64() {
                Some(n) if n >= MIN_BUDGET => Ok(Config::Enabled(n)),
                Some(_) => Err(format!(
                    "thinking.enabled.budget_tokens: Input should be greater than or equal to {MIN_BUDGET}"
                )),
                None if budget.as_i64().is_some() => Err(format!(
                    "thinking.enabled.budget_tokens: Input should be greater than or equal to {MIN_BUDGET}"
                )),
                None => Err("thinking.enabled.budget_tokens: Input should be a valid integer".to_owned()),
            },
        },
        Some(tag) => Err(format!(
            "thinking: Input tag '{tag}' found using 'type' does not match any of the expected tags: 'adaptive', 'disabled', 'enabled'"
        )),
        None => Err("thinking: Unable to extract tag using discriminator 'type'".to_owned()),
    }
}

/// `temperature`, `top_k` and `top_p` as thinking allows them.
fn sampling(body: &Value) -> Option<String> {
    let set = |field: &str| body.get(field).filter(|v| !v.is_null());
    if set("temperature").is_some_and(|t| t.as_f64() != Some(1.0)) {
        return Some(format!(
            "`temperature` may only be set to 1 when thinking is enabled. Please consult our documentation at \
             {DOCS}#important-considerations-when-using-extended-thinking"
        ));
    }
    if set("top_k").is_some() {
        return Some(format!(
            "`top_k` must be unset when thinking is enabled. Please consult our documentation at \
             {DOCS}#important-considerations-when-using-extended-thinking"
        ));
    }
    if set("top_p").is_some_and(|p| !p.as_f64().is_some_and(|p| (0.95..=1.0).contains(&p))) {
        return Some("`top_p` must be greater than or equal to 0.95 or unset when thinking is enabled.".to_owned());
    }
    None
}

fn forced_tool(body: &Value) -> Option<String> {
    let kind = body.get("tool_choice")?.get("type")?.as_str()?;
    matches!(kind, "any" | "tool").then(|| "Thinking may not be enabled when tool_choice forces tool use.".to_owned())
}

fn messages(body: &Value) -> &[Value] {
    body.get("messages")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn role(message: &Value) -> &str {
    message.get("role").and_then(Value::as_str).unwrap_or_default()
}

/// A message's content as blocks' types (a string content is one text block).
fn block_types(message: &Value) -> Vec<&str> {
    match message.get("content") {
        Some(Value::String(_)) => vec!["text"],
        Some(Value::Array(blocks)) => blocks
            .iter()
            .map(|b| b.get("type").and_then(Value::as_str).unwrap_or_default())
            .collect(),
        _ => Vec::new(),
    }
}

/// A user message that only carries tool results continues the assistant's turn.
fn only_tool_results(message: &Value) -> bool {
    let types = block_types(message);
    role(message) == "user" && !types.is_empty() && types.iter().all(|t| *t == "tool_result")
}

/// The current assistant turn (after the last user message of its own) must open with
/// thinking when the request continues it: a final assistant message, or tool results.
fn turn_start(body: &Value) -> Option<String> {
    let messages = messages(body);
    let start = messages
        .iter()
        .rposition(|m| role(m) == "user" && !only_tool_results(m))
        .map_or(0, |i| i + 1);
    let (n, first) = messages
        .iter()
        .enumerate()
        .skip(start)
        .find(|(_, m)| role(m) == "assistant")?;
    let found = block_types(first).first().copied()?;
    if matches!(found, "thinking" | "redacted_thinking") {
        return None;
    }
    Some(format!(
        "messages.{n}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{found}`. When \
         `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the \
         lastmost set of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks from \
         previous turns. To avoid this requirement, disable `thinking`. Please consult our documentation at {DOCS}"
    ))
}

/// With thinking off, a final assistant message may not hold thinking.
fn final_thinking_while_off(body: &Value) -> Option<String> {
    let messages = messages(body);
    let n = messages.len().checked_sub(1)?;
    let last = &messages[n];
    if role(last) != "assistant" {
        return None;
    }
    let m = block_types(last)
        .iter()
        .position(|t| matches!(*t, "thinking" | "redacted_thinking"))?;
    Some(format!(
        "messages.{n}.content.{m}: When thinking is disabled, an `assistant` message in the final position cannot \
         contain `thinking`. To use thinking blocks, enable `thinking` in your request."
    ))
}

/// One thinking or redacted thinking block of the history, where it sits.
struct Block<'a> {
    at: String,
    value: &'a Value,
    redacted: bool,
}

fn thinking_blocks(body: &Value) -> Vec<Block<'_>> {
    let mut out = Vec::new();
    for (n, message) in messages(body).iter().enumerate() {
        let Some(blocks) = message.get("content").and_then(Value::as_array) else {
            continue;
        };
        for (m, value) in blocks.iter().enumerate() {
            let redacted = match value.get("type").and_then(Value::as_str) {
                Some("thinking") => false,
                Some("redacted_thinking") => true,
                _ => continue,
            };
            out.push(Block {
                at: format!("messages.{n}.content.{m}"),
                value,
                redacted,
            });
        }
    }
    out
}

impl Block<'_> {
    fn text(&self, key: &str) -> Option<&str> {
        self.value.get(key).and_then(Value::as_str)
    }

    /// A required field absent (or, for the signature and data, empty).
    fn missing(&self) -> Option<String> {
        let at = &self.at;
        if self.redacted {
            return self
                .text("data")
                .is_none_or(str::is_empty)
                .then(|| format!("{at}.redacted_thinking.data: Field required"));
        }
        if self.text("thinking").is_none() {
            return Some(format!("{at}.thinking.thinking: Field required"));
        }
        self.text("signature")
            .is_none_or(str::is_empty)
            .then(|| format!("{at}.thinking.signature: Field required"))
    }

    /// A signature or data the simulator did not issue for this block.
    fn forged(&self) -> Option<String> {
        let at = &self.at;
        if self.redacted {
            let data = self.text("data").unwrap_or_default();
            return (!signature::seals(data)).then(|| format!("{at}: Invalid `data` in `redacted_thinking` block"));
        }
        let thinking = self.text("thinking").unwrap_or_default();
        let sig = self.text("signature").unwrap_or_default();
        (!signature::verifies(thinking, sig)).then(|| format!("{at}: Invalid `signature` in `thinking` block"))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const INTERLEAVED: Option<&str> = Some("token-efficient-tools-2025-02-19, interleaved-thinking-2025-05-14");

    fn on(extra: Value) -> Value {
        let mut body = json!({
            "model": "claude", "max_tokens": 4096,
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "messages": [{"role": "user", "content": "What is 27 * 453?"}]
        });
        if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
            body.extend(extra);
        }
        body
    }

    #[track_caller]
    fn refused(body: &Value, beta: Option<&str>) -> String {
        let error = refusal(body, beta).unwrap_or_else(|| panic!("refused: {body}"));
        assert_eq!(error.status, 400, "{error:?}");
        error.message.unwrap_or_default()
    }

    fn thinking_block(text: &str) -> Value {
        json!({"type": "thinking", "thinking": text, "signature": signature::sign(text)})
    }

    #[test]
    fn the_budget_and_max_tokens_rules_follow_the_api() {
        assert!(refusal(&on(json!({})), None).is_none(), "a valid request");
        let low = on(json!({"thinking": {"type": "enabled", "budget_tokens": 1000}}));
        assert_eq!(
            refused(&low, None),
            "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
        );
        let missing = on(json!({"thinking": {"type": "enabled"}}));
        assert_eq!(
            refused(&missing, None),
            "thinking.enabled.budget_tokens: Field required"
        );
        let over = on(json!({"max_tokens": 2048}));
        assert_eq!(
            refused(&over, None),
            "`max_tokens` must be greater than `thinking.budget_tokens`."
        );
        assert!(refusal(&over, INTERLEAVED).is_none(), "interleaved thinking lifts it");
        let adaptive = on(json!({"thinking": {"type": "adaptive"}, "max_tokens": 100}));
        assert!(refusal(&adaptive, None).is_none(), "adaptive has no budget");
        let unknown = on(json!({"thinking": {"type": "sometimes"}}));
        assert!(refused(&unknown, None).contains("Input tag 'sometimes'"));
        let disabled = on(json!({"thinking": {"type": "disabled"}, "temperature": 0.2, "top_k": 5}));
        assert!(refusal(&disabled, None).is_none(), "disabled thinking allows sampling");
    }

    #[test]
    fn sampling_and_forced_tools_are_refused_while_thinking() {
        let hot = on(json!({"temperature": 0.7}));
        assert_eq!(
            refused(&hot, None),
            "`temperature` may only be set to 1 when thinking is enabled. Please consult our documentation at \
             https://docs.claude.com/en/docs/build-with-claude/extended-thinking#important-considerations-when-using-extended-thinking"
        );
        assert!(refusal(&on(json!({"temperature": 1})), None).is_none(), "1 is allowed");
        let top_k = on(json!({"top_k": 5}));
        assert!(refused(&top_k, None).starts_with("`top_k` must be unset when thinking is enabled."));
        let top_p = on(json!({"top_p": 0.9}));
        assert_eq!(
            refused(&top_p, None),
            "`top_p` must be greater than or equal to 0.95 or unset when thinking is enabled."
        );
        assert!(refusal(&on(json!({"top_p": 0.95})), None).is_none(), "0.95 is allowed");
        let adaptive_hot = on(json!({"thinking": {"type": "adaptive"}, "temperature": 0.5}));
        assert!(refused(&adaptive_hot, None).starts_with("`temperature` may only be set to 1"));
        let tools = json!([{"name": "calc", "input_schema": {"type": "object"}}]);
        for choice in [json!({"type": "any"}), json!({"type": "tool", "name": "calc"})] {
            let forced = on(json!({"tools": tools, "tool_choice": choice}));
            assert_eq!(
                refused(&forced, None),
                "Thinking may not be enabled when tool_choice forces tool use."
            );
            let adaptive = on(json!({"tools": tools, "tool_choice": choice, "thinking": {"type": "adaptive"}}));
            assert!(
                refusal(&adaptive, None).is_none(),
                "adaptive thinking allows forced tools"
            );
        }
        let auto = on(json!({"tools": tools, "tool_choice": {"type": "auto"}}));
        assert!(refusal(&auto, None).is_none());
    }

    #[test]
    fn a_prefill_or_a_tool_loop_must_start_with_thinking() {
        let prefill = on(json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello"}
        ]}));
        let message = refused(&prefill, None);
        assert!(
            message.starts_with(
                "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `text`."
            ),
            "{message}"
        );
        let tool_use = json!({"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {}});
        let result =
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12231"}]});
        let bare = on(json!({"messages": [
            {"role": "user", "content": "What is 27 * 453?"},
            {"role": "assistant", "content": [tool_use]},
            result
        ]}));
        assert_eq!(
            refused(&bare, None),
            "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `tool_use`. When \
             `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the \
             lastmost set of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks from \
             previous turns. To avoid this requirement, disable `thinking`. Please consult our documentation at \
             https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
        );
        let kept = on(json!({"messages": [
            {"role": "user", "content": "What is 27 * 453?"},
            {"role": "assistant", "content": [thinking_block("Use the tool."), tool_use]},
            result,
            {"role": "assistant", "content": [tool_use]},
            result
        ]}));
        assert!(
            refusal(&kept, None).is_none(),
            "the turn's first assistant message thinks"
        );
        let redacted = json!({"type": "redacted_thinking", "data": signature::redacted_data("x")});
        let sealed = on(json!({"messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [redacted, tool_use]},
            result
        ]}));
        assert!(refusal(&sealed, None).is_none(), "redacted thinking opens a turn too");
        let earlier = on(json!({"messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [tool_use]},
            result,
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "thanks"}
        ]}));
        assert!(refusal(&earlier, None).is_none(), "only the current turn is checked");
    }

    #[test]
    fn thinking_in_a_final_assistant_message_needs_thinking_on() {
        let body = json!({"max_tokens": 100, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [thinking_block("Greet."), {"type": "text", "text": "Hello"}]}
        ]});
        assert_eq!(
            refused(&body, None),
            "messages.1.content.0: When thinking is disabled, an `assistant` message in the final position cannot \
             contain `thinking`. To use thinking blocks, enable `thinking` in your request."
        );
        let mut history = body.clone();
        if let Some(messages) = history["messages"].as_array_mut() {
            messages.push(json!({"role": "user", "content": "again"}));
        }
        assert!(refusal(&history, None).is_none(), "earlier turns may keep theirs");
    }

    #[test]
    fn signatures_must_be_the_simulators_own_for_exactly_that_text() {
        let with = |block: Value| {
            on(json!({"messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [block, {"type": "text", "text": "Hello."}]},
                {"role": "user", "content": "and now?"}
            ]}))
        };
        assert!(refusal(&with(thinking_block("Greet them.")), None).is_none(), "issued");
        let edited =
            json!({"type": "thinking", "thinking": "Greet them!", "signature": signature::sign("Greet them.")});
        assert_eq!(
            refused(&with(edited), None),
            "messages.1.content.0: Invalid `signature` in `thinking` block"
        );
        let empty = json!({"type": "thinking", "thinking": "Greet them.", "signature": ""});
        assert_eq!(
            refused(&with(empty), None),
            "messages.1.content.0.thinking.signature: Field required"
        );
        let none = json!({"type": "thinking", "thinking": "Greet them."});
        assert_eq!(
            refused(&with(none), None),
            "messages.1.content.0.thinking.signature: Field required"
        );
        let foreign = json!({"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"});
        assert_eq!(
            refused(&with(foreign), None),
            "messages.1.content.0: Invalid `data` in `redacted_thinking` block"
        );
        let blank = json!({"type": "redacted_thinking", "data": ""});
        assert_eq!(
            refused(&with(blank), None),
            "messages.1.content.0.redacted_thinking.data: Field required"
        );
    }
}
