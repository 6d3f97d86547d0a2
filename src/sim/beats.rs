//! An answer's beats before faults and timing are laid over it: text tokens, a JSON answer's
//! tokens, and tool calls opened and streamed as argument fragments.

use rand::rngs::SmallRng;

use super::answer;
use super::plan::{Beat, Step, Stop, Wire};
use super::quality;
use super::request::Format;
use super::scenario::{Scenario, ToolCallSpec};
use super::schema;

pub(super) fn text_beats(tokens: Vec<String>) -> Vec<Beat> {
    tokens.into_iter().map(|t| vec![Step::Text(t)]).collect()
}

/// The text beats with the one holding byte `bytes` split (`answer::cut_at_byte`), and how
/// many beats come before the cut.
pub(super) fn cut_text_beats(beats: &[Beat], bytes: usize) -> Option<(Vec<Beat>, u32)> {
    let tokens: Vec<String> = beats
        .iter()
        .flatten()
        .filter_map(|step| match step {
            Step::Text(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    let (tokens, before) = answer::cut_at_byte(tokens, bytes)?;
    Some((text_beats(tokens), u32::try_from(before).unwrap_or(u32::MAX)))
}

/// A JSON answer as tokens: pretty-printed, so its words stream as a model writes them.
/// JSON mode gets `{"answer": <the scenario's text>}`, a schema an instance of it.
/// `spoiled`: a model of poor quality (`quality.rs`) writes JSON that does not parse.
pub(super) fn json_tokens(format: &Format, scenario: &Scenario, spoiled: bool, rng: &mut SmallRng) -> Vec<String> {
    let value = match format {
        Format::JsonObject => serde_json::json!({"answer": answer::text_tokens(scenario).concat()}),
        Format::JsonSchema(schema) => schema::instance(schema, rng),
    };
    let text = serde_json::to_string_pretty(&value).unwrap_or_else(|_| "{}".to_owned());
    if spoiled {
        return answer::split_words(&quality::spoil_json(&text));
    }
    answer::split_words(&text)
}

/// The calls' beats: an opening, then the arguments in `fragments` pieces. `truncate` stops
/// half-way through the first call; a `limit` (max_tokens) smaller than the fragments stops
/// after that many, both with `length` and the call never closed.
pub(super) fn tool_beats(
    calls: &[ToolCallSpec],
    fragments: u32,
    wire: Wire,
    truncate: bool,
    limit: Option<u32>,
    rng: &mut SmallRng,
    ids: &mut SmallRng,
) -> (Vec<Beat>, Stop) {
    let calls = if truncate { &calls[..1] } else { calls };
    let mut left = limit.map(|m| m as usize);
    let mut beats = Vec::new();
    for (index, call) in (0u32..).zip(calls) {
        let id = match wire {
            Wire::OpenAi => answer::random_id("call_", 24, ids),
            Wire::Anthropic => answer::random_id("toolu_01", 22, ids),
        };
        beats.push(vec![Step::ToolOpen {
            index,
            id,
            name: call.name.clone(),
        }]);
        let mut pieces = answer::fragments(&call.arguments, fragments, rng);
        if let Some(n) = left.filter(|n| pieces.len() > *n) {
            pieces.truncate(n);
            beats.extend(
                pieces
                    .into_iter()
                    .map(|fragment| vec![Step::ToolArgs { index, fragment }]),
            );
            return (beats, Stop::Length);
        }
        left = left.map(|n| n - pieces.len());
        if truncate {
            pieces.truncate(pieces.len().div_ceil(2).min(pieces.len().saturating_sub(1)).max(1));
            beats.extend(
                pieces
                    .into_iter()
                    .map(|fragment| vec![Step::ToolArgs { index, fragment }]),
            );
            return (beats, Stop::Length);
        }
        beats.extend(
            pieces
                .into_iter()
                .map(|fragment| vec![Step::ToolArgs { index, fragment }]),
        );
        if let Some(last) = beats.last_mut() {
            last.push(Step::ToolClose { index });
        }
    }
    (beats, Stop::ToolCalls)
}
