//! Folds a script into the one answer a non-streaming (`stream: false`) response carries.

use std::time::Duration;

use super::plan::{Step, Stop};

/// A complete tool call of an aggregated answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FullToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// How an aggregated answer goes wrong, if it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    Drop,
    InBandError,
    Malformed,
}

/// The whole answer of a script, and how long producing it takes.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Aggregate {
    pub text: String,
    /// The text as the tokens it streamed in (what logprobs are given for).
    pub text_tokens: Vec<String>,
    /// Shown reasoning, its signature (once the block ended) and redacted blocks.
    pub thinking: String,
    pub signature: Option<String>,
    pub redacted: Vec<String>,
    pub refusal: Option<String>,
    pub tool_calls: Vec<FullToolCall>,
    pub stop: Option<Stop>,
    pub fault: Option<Fault>,
    pub output_tokens: u32,
    pub total_wait: Duration,
}

impl Aggregate {
    pub fn of(steps: &[Step]) -> Self {
        let mut agg = Aggregate::default();
        for step in steps {
            match step {
                Step::Wait(d) => agg.total_wait += *d,
                Step::Text(t) => {
                    agg.text.push_str(t);
                    agg.text_tokens.push(t.clone());
                }
                Step::Thinking(t) => agg.thinking.push_str(t),
                Step::ThinkingEnd { signature } => agg.signature = Some(signature.clone()),
                Step::Redacted(data) => agg.redacted.push(data.clone()),
                Step::Refusal(t) => agg.refusal.get_or_insert_with(String::new).push_str(t),
                Step::ToolOpen { id, name, .. } => agg.tool_calls.push(FullToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                }),
                Step::ToolArgs { fragment, .. } => {
                    if let Some(call) = agg.tool_calls.last_mut() {
                        call.arguments.push_str(fragment);
                    }
                }
                Step::Finish(stop) => agg.stop = Some(*stop),
                Step::Drop => agg.fault = Some(Fault::Drop),
                Step::InBandError => agg.fault = Some(Fault::InBandError),
                Step::Malformed | Step::InvalidUtf8 | Step::HugeLine(_) => agg.fault = Some(Fault::Malformed),
                Step::Bom | Step::Open(_) | Step::ToolClose { .. } | Step::Usage | Step::Terminal => {}
            }
            if step.is_token() {
                agg.output_tokens += 1;
            }
        }
        agg
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::plan::AnswerKind;

    #[test]
    fn folds_text_tools_waits_and_the_stop() {
        let steps = vec![
            Step::Open(AnswerKind::Tools),
            Step::Wait(Duration::from_millis(5)),
            Step::ToolOpen {
                index: 0,
                id: "call_1".to_owned(),
                name: "f".to_owned(),
            },
            Step::Wait(Duration::from_millis(7)),
            Step::ToolArgs {
                index: 0,
                fragment: "{\"a\"".to_owned(),
            },
            Step::ToolArgs {
                index: 0,
                fragment: ":1}".to_owned(),
            },
            Step::ToolClose { index: 0 },
            Step::Finish(Stop::ToolCalls),
        ];
        let agg = Aggregate::of(&steps);
        assert_eq!(agg.total_wait, Duration::from_millis(12), "waits add up");
        assert_eq!(agg.tool_calls[0].arguments, "{\"a\":1}", "arguments joined");
        assert_eq!(agg.stop, Some(Stop::ToolCalls), "stop");
        assert_eq!(agg.output_tokens, 2, "fragments count as tokens");
        assert_eq!(agg.fault, None, "no fault");
    }
}
