//! The model's reasoning before its answer: whether a request gets any and how it shows
//! (an Anthropic `thinking` block, an OpenAI-compatible server's `reasoning_content`
//! deltas, or hidden reasoning tokens an OpenAI reasoning model only bills), and the
//! reasoning's deltas, derived from the prompt so the same conversation always thinks the
//! same thoughts and gets the same signature.

use super::answer;
use super::plan::{Beat, Step, Wire};
use super::scenario::{OpenAiReasoning, Thinking};
use super::signature;

/// Words of the prompt the reasoning quotes.
const QUOTED_WORDS: usize = 12;

/// Words per reasoning delta.
const WORDS_PER_DELTA: usize = 3;

/// What the request (its `thinking` field, or the model it names) asks of the reasoning.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Asked {
    /// No thinking asked for, and a model that does not reason on its own.
    #[default]
    Nothing,
    /// Anthropic `thinking` of type `enabled` or `adaptive`; `omitted` with
    /// `display: "omitted"` (the block carries only its signature).
    Thinking { omitted: bool },
    /// An OpenAI reasoning model (`o1`, `o3`, `o4`, `gpt-5` families).
    OpenAiReasoningModel,
    /// A model id naming a reasoner (`reasoner`, or an `r1` part: `deepseek-r1:14b`).
    Reasoner,
}

/// How the answer's reasoning goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Off,
    /// Streamed as deltas before the answer.
    Shown,
    /// Anthropic `display: "omitted"`: a thinking block with no text and a signature.
    Omitted,
    /// Billed, never shown (OpenAI reasoning models).
    Hidden,
}

/// Reasoning of one answer, ready to go in front of its beats.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Thought {
    pub beats: Vec<Beat>,
    /// Reasoning tokens spent, shown or not (usage counts them all).
    pub tokens: u32,
    /// Of those, the ones never streamed (usage adds them to the streamed tokens).
    pub hidden: u32,
}

/// The reasoning mode for a request on `wire`, with the scenario's say on the OpenAI wire.
pub(crate) fn mode(wire: Wire, asked: Asked, knob: OpenAiReasoning) -> Mode {
    match (wire, asked) {
        (Wire::Anthropic, Asked::Thinking { omitted: false }) => Mode::Shown,
        (Wire::Anthropic, Asked::Thinking { omitted: true }) => Mode::Omitted,
        (Wire::Anthropic, _) => Mode::Off,
        (Wire::OpenAi, asked) => match knob {
            OpenAiReasoning::None => Mode::Off,
            OpenAiReasoning::ReasoningContent | OpenAiReasoning::Reasoning => Mode::Shown,
            OpenAiReasoning::ByModel => match asked {
                Asked::OpenAiReasoningModel => Mode::Hidden,
                Asked::Reasoner => Mode::Shown,
                Asked::Nothing | Asked::Thinking { .. } => Mode::Off,
            },
        },
    }
}

/// The OpenAI-wire delta field shown reasoning goes in.
pub(crate) fn openai_field(knob: OpenAiReasoning) -> &'static str {
    match knob {
        OpenAiReasoning::Reasoning => "reasoning",
        _ => "reasoning_content",
    }
}

/// What an OpenAI-wire request's model id says about its reasoning.
pub(crate) fn asked_by_model(model: &str) -> Asked {
    let id = model.rsplit('/').next().unwrap_or(model).to_ascii_lowercase();
    if is_openai_reasoning(&id) {
        return Asked::OpenAiReasoningModel;
    }
    let r1 = id.split(|c: char| !c.is_ascii_alphanumeric()).any(|part| part == "r1");
    if id.contains("reasoner") || r1 {
        Asked::Reasoner
    } else {
        Asked::Nothing
    }
}

/// OpenAI's reasoning models, by id: `o1…`, `o3…`, `o4…`, `gpt-5…` (dated or suffixed,
/// never `o10` or `gpt-50`).
pub(crate) fn is_openai_reasoning(id: &str) -> bool {
    let id = id.rsplit('/').next().unwrap_or(id).to_ascii_lowercase();
    ["o1", "o3", "o4", "gpt-5"].iter().any(|family| {
        id.strip_prefix(family)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', '.']))
    })
}

/// The reasoning text for `prompt`, as the deltas that stream it (at most `deltas`).
pub(crate) fn deltas(prompt: &str, deltas: u32) -> Vec<String> {
    let quote: Vec<&str> = prompt.split_whitespace().take(QUOTED_WORDS).collect();
    let quote = if quote.is_empty() {
        "nothing in particular".to_owned()
    } else {
        quote.join(" ")
    };
    let text = format!(
        "The request asks: \"{quote}\". I will answer it directly, keep the answer short, \
         and check each step before I write it down. The plain answer is the best one here."
    );
    answer::split_words(&text)
        .chunks(WORDS_PER_DELTA)
        .map(|words| words.concat())
        .take(deltas as usize)
        .collect()
}

/// The reasoning beats for `mode`, cut to `limit` tokens (max_tokens counts reasoning too):
/// shown deltas then the block's end with its signature (and a redacted block when the
/// scenario asks), an omitted block's signature alone, or nothing for hidden reasoning.
pub(crate) fn think(mode: Mode, prompt: &str, knob: &Thinking, limit: Option<u32>) -> Thought {
    let spent = knob.deltas.min(limit.unwrap_or(u32::MAX));
    let mut beats: Vec<Beat> = Vec::new();
    let hidden = match mode {
        Mode::Off => return Thought::default(),
        Mode::Hidden => spent,
        Mode::Omitted => {
            beats.push(vec![Step::ThinkingEnd {
                signature: signature::sign(""),
            }]);
            spent
        }
        Mode::Shown => {
            let shown = deltas(prompt, spent);
            let signature = signature::sign(&shown.concat());
            beats.extend(shown.into_iter().map(|d| vec![Step::Thinking(d)]));
            match beats.last_mut() {
                Some(last) => last.push(Step::ThinkingEnd { signature }),
                None => beats.push(vec![Step::ThinkingEnd { signature }]),
            }
            0
        }
    };
    if knob.redacted && mode != Mode::Hidden {
        if let Some(last) = beats.last_mut() {
            last.push(Step::Redacted(signature::redacted_data(prompt)));
        }
    }
    let streamed = beats.iter().flatten().filter(|s| s.is_token()).count();
    Thought {
        beats,
        tokens: u32::try_from(streamed).unwrap_or(u32::MAX).saturating_add(hidden),
        hidden,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_say_how_an_openai_wire_model_reasons() {
        for id in ["o1", "o3-mini", "o4-mini", "gpt-5", "gpt-5.1-codex", "openai/o3-pro"] {
            assert_eq!(asked_by_model(id), Asked::OpenAiReasoningModel, "{id}");
        }
        for id in [
            "deepseek-reasoner",
            "deepseek-r1:14b",
            "DeepSeek-R1-Distill-Qwen-7B",
            "r1",
        ] {
            assert_eq!(asked_by_model(id), Asked::Reasoner, "{id}");
        }
        for id in ["gpt-4o", "o10", "gpt-50", "deepseek-chat", "llama-3-r10", "chatr1x"] {
            assert_eq!(asked_by_model(id), Asked::Nothing, "{id}");
        }
    }

    #[test]
    fn the_scenario_decides_the_openai_wire_and_the_request_the_anthropic_one() {
        let by_model = OpenAiReasoning::ByModel;
        assert_eq!(mode(Wire::OpenAi, Asked::OpenAiReasoningModel, by_model), Mode::Hidden);
        assert_eq!(mode(Wire::OpenAi, Asked::Reasoner, by_model), Mode::Shown);
        assert_eq!(mode(Wire::OpenAi, Asked::Nothing, by_model), Mode::Off);
        let shown = OpenAiReasoning::Reasoning;
        assert_eq!(mode(Wire::OpenAi, Asked::Nothing, shown), Mode::Shown, "forced on");
        assert_eq!(openai_field(shown), "reasoning");
        assert_eq!(openai_field(by_model), "reasoning_content");
        let none = OpenAiReasoning::None;
        assert_eq!(mode(Wire::OpenAi, Asked::OpenAiReasoningModel, none), Mode::Off);
        let thinking = Asked::Thinking { omitted: false };
        assert_eq!(
            mode(Wire::Anthropic, thinking, none),
            Mode::Shown,
            "the request decides"
        );
        assert_eq!(mode(Wire::Anthropic, Asked::Nothing, shown), Mode::Off);
    }

    #[test]
    fn shown_reasoning_is_deltas_then_a_signature_over_their_text() {
        let knob = Thinking::default();
        let thought = think(Mode::Shown, "What is the GCD of 1071 and 462?", &knob, None);
        assert_eq!(thought.tokens, 6, "one token per delta");
        assert_eq!(thought.hidden, 0, "all shown");
        let text: String = thought
            .beats
            .iter()
            .flatten()
            .filter_map(|s| match s {
                Step::Thinking(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert!(text.starts_with("The request asks: \"What is"), "{text}");
        let last = thought.beats.last().and_then(|b| b.last());
        let Some(Step::ThinkingEnd { signature: sig }) = last else {
            panic!("the block ends with its signature: {last:?}");
        };
        assert!(signature::verifies(&text, sig), "signed over the streamed text");
        assert_eq!(
            think(Mode::Shown, "What is the GCD of 1071 and 462?", &knob, None),
            thought,
            "the same prompt thinks the same"
        );
    }

    #[test]
    fn a_limit_cuts_the_reasoning_and_hidden_reasoning_streams_nothing() {
        let knob = Thinking::default();
        let cut = think(Mode::Shown, "hi", &knob, Some(2));
        assert_eq!(cut.tokens, 2, "max_tokens counts reasoning");
        let hidden = think(Mode::Hidden, "hi", &knob, None);
        assert!(hidden.beats.is_empty(), "nothing streamed");
        assert_eq!((hidden.tokens, hidden.hidden), (6, 6), "but billed");
        let omitted = think(Mode::Omitted, "hi", &knob, None);
        assert_eq!(omitted.beats.len(), 1, "one beat: the signature");
        assert_eq!((omitted.tokens, omitted.hidden), (6, 6), "billed, not shown");
        let redacted = Thinking {
            redacted: true,
            ..Thinking::default()
        };
        let with = think(Mode::Shown, "hi", &redacted, None);
        let sealed = with
            .beats
            .iter()
            .flatten()
            .any(|s| matches!(s, Step::Redacted(d) if signature::seals(d)));
        assert!(sealed, "a redacted block after the thinking one");
        assert_eq!(think(Mode::Off, "hi", &redacted, None), Thought::default(), "off");
    }
}
