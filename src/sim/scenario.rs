//! `Scenario`: the explicit description of how one simulated upstream behaves (latency,
//! answer, faults), written inline in TOML `[sim.scenarios.NAME]` or sent as JSON.

use serde::{Deserialize, Serialize};

/// Everything the simulator needs to answer a request. Every field has a default, so a
/// scenario names only what it changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    /// Model id reported in the answer. `None` echoes the request's `model` (or "sim-1").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub ttft: Ttft,
    /// Mean gap between two tokens, in ms.
    pub inter_token_ms: f64,
    /// Lognormal jitter of the gap (0 = every gap is exactly `inter_token_ms`).
    pub inter_token_sigma: f64,
    /// Number of text tokens when `text` is not given (at most 100,000).
    pub tokens: u32,
    /// Explicit answer. Its tokens are its words, each with the whitespace in front of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// When non-empty the answer is these tool calls instead of text.
    pub tool_calls: Vec<ToolCallSpec>,
    /// Pieces each call's arguments are cut into (at arbitrary char boundaries).
    pub tool_fragments: u32,
    /// OpenAI: the first tool-call fragment rides in the role chunk (T2).
    pub tool_first_with_role: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cold_start: Option<ColdStart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub brownout: Option<Brownout>,
    pub failure: Failure,
    /// How a request ending with an assistant message (a prefill) is treated.
    pub continuation: Continuation,
    /// Write each SSE event in body chunks of at most this many bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chunk_split: Option<usize>,
    /// During every pause of the body longer than this many ms, the wire's keep-alive each
    /// time it passes (an SSE comment `: ping` on the OpenAI wire, Anthropic's `event: ping`):
    /// a stream that is alive but says nothing, as real servers keep one open.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keepalive_ms: Option<u64>,
    /// Per-request RNG seed: `seed ^ request_number`. The generated text uses `seed` only.
    pub seed: u64,
    /// A schedule: the phases follow each other on the simulator's clock, then repeat, and
    /// each overrides the scenario's `ttft`, `failure` and `continuation` while it lasts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<Phase>,
    /// Play a model that ignores what the request asks for (offered tools, JSON mode or a
    /// schema, max_tokens). Off by default: the answer honours them.
    pub ignores_request: bool,
    /// How the model shows its reasoning when the request turns it on (`reasoning.rs`).
    pub thinking: Thinking,
    /// How well the model answers what it is asked (`quality.rs`): a preset name or rates.
    /// `None` (the default): answers are generated words, tools and JSON always valid.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::quality::deserialize"
    )]
    pub quality: Option<super::quality::Quality>,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            model: None,
            ttft: Ttft::default(),
            inter_token_ms: 10.0,
            inter_token_sigma: 0.0,
            tokens: 16,
            text: None,
            tool_calls: Vec::new(),
            tool_fragments: 12,
            tool_first_with_role: false,
            cold_start: None,
            brownout: None,
            failure: Failure::default(),
            continuation: Continuation::default(),
            chunk_split: None,
            keepalive_ms: None,
            seed: 0,
            ignores_request: false,
            phases: Vec::new(),
            thinking: Thinking::default(),
            quality: None,
        }
    }
}

/// The reasoning a model shows before its answer, when the request asks for it (Anthropic
/// `thinking`) or the model always reasons (OpenAI's reasoning models, DeepSeek-style
/// reasoners; see `reasoning.rs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Thinking {
    /// Reasoning deltas before the answer, each one token (a few words). OpenAI reasoning
    /// models spend as many hidden reasoning tokens.
    pub deltas: u32,
    /// Anthropic: a `redacted_thinking` block follows the thinking block.
    pub redacted: bool,
    /// OpenAI wire: where the model's reasoning goes.
    pub openai: OpenAiReasoning,
}

impl Default for Thinking {
    fn default() -> Self {
        Thinking {
            deltas: 6,
            redacted: false,
            openai: OpenAiReasoning::ByModel,
        }
    }
}

/// Where an OpenAI-wire model's reasoning goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpenAiReasoning {
    /// By the model id: OpenAI's reasoning models (`o1`, `o3`, `o4`, `gpt-5`) reason
    /// hidden, counted in `completion_tokens_details.reasoning_tokens`; an id naming a
    /// reasoner (`reasoner`, `r1`: `deepseek-reasoner`, `DeepSeek-R1-Distill`) streams
    /// `delta.reasoning_content` first, as DeepSeek does; others do not reason.
    #[default]
    ByModel,
    /// `delta.reasoning_content` deltas first (DeepSeek, llama.cpp, older vLLM), any model.
    ReasoningContent,
    /// `delta.reasoning` deltas first (vLLM 2026, OpenRouter), any model.
    Reasoning,
    /// No reasoning, whatever the model.
    None,
}

/// One phase of a scenario's schedule: for `ms` milliseconds, these parts replace the
/// scenario's own (the parts not given stay as they are).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Phase {
    pub ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft: Option<Ttft>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continuation: Option<Continuation>,
}

impl Scenario {
    /// The scenario as its schedule has it at `clock_ms`, or `None` without a schedule
    /// (a schedule whose phases are all zero-length counts as none).
    pub fn during(&self, clock_ms: u64) -> Option<Scenario> {
        let total: u64 = self.phases.iter().map(|p| p.ms).fold(0, u64::saturating_add);
        if total == 0 {
            return None;
        }
        let mut at = clock_ms % total;
        let phase = self.phases.iter().find(|p| {
            if at < p.ms {
                return true;
            }
            at -= p.ms;
            false
        })?;
        let mut now = self.clone();
        now.phases = Vec::new();
        if let Some(ttft) = &phase.ttft {
            now.ttft = ttft.clone();
        }
        if let Some(failure) = &phase.failure {
            now.failure = failure.clone();
        }
        if let Some(continuation) = &phase.continuation {
            now.continuation = continuation.clone();
        }
        Some(now)
    }
}

/// Time to first token: lognormal around `median_ms`, plus an occasional uniform stall.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Ttft {
    pub median_ms: f64,
    /// Lognormal sigma (0 = always exactly `median_ms`).
    pub sigma: f64,
    /// Probability of an extra stall before the first token.
    pub stall_prob: f64,
    pub stall_min_ms: f64,
    pub stall_max_ms: f64,
}

impl Default for Ttft {
    fn default() -> Self {
        Ttft {
            median_ms: 50.0,
            sigma: 0.0,
            stall_prob: 0.0,
            stall_min_ms: 0.0,
            stall_max_ms: 0.0,
        }
    }
}

/// One tool call of the answer. `arguments` is the JSON text the model "writes".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolCallSpec {
    pub name: String,
    pub arguments: String,
}

/// The first `requests` requests of the scenario get `extra_ms` more TTFT.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ColdStart {
    pub requests: u64,
    pub extra_ms: f64,
}

/// While `(sim clock % period) < duty * period`, TTFT gets `extra_ms` more. Time-based, so
/// every route on one simulator degrades together.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Brownout {
    pub period_ms: u64,
    pub duty: f64,
    pub extra_ms: f64,
}

/// Injected faults. All off by default; several may combine (the earliest one that ends the
/// stream wins).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Failure {
    /// Answer with this HTTP status and the wire's error body instead of a stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Share of requests that get `status` (when `fail_first_n` is not set).
    pub status_rate: f64,
    /// Only the first N requests get `status`; later ones are healthy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail_first_n: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Error message for status and in-band errors (a wire-typical one otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Abort the connection after this many content tokens (no terminal chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drop_after_tokens: Option<u32>,
    /// Abort the connection once this many bytes of answer text are out (rounded down to a
    /// char boundary). The token holding the cut is split and its first part sent as its
    /// own delta, so the cut can fall inside a word. Text answers only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drop_after_bytes: Option<usize>,
    /// Share of requests that drop (when `drop_after_tokens` or `drop_after_bytes` is set).
    pub drop_rate: f64,
    /// Pause for `stall_ms` after this many content tokens, then carry on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stall_after_tokens: Option<u32>,
    /// Length of that pause (default 60 s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stall_ms: Option<u64>,
    /// Send one event that is not JSON after this many tokens, then end the body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub malformed_after_tokens: Option<u32>,
    /// Send the wire's in-band error event after this many tokens, then end the body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_band_error_after_tokens: Option<u32>,
    /// End the body cleanly after the last token, without the terminal signal (T11).
    pub eof_before_finish: bool,
    /// OpenAI: finish and usage chunks but no `[DONE]`; Anthropic: no `message_stop`.
    pub missing_done: bool,
    /// Start the body with a UTF-8 BOM (T15).
    pub bom: bool,
    /// Send an event with invalid UTF-8 inside after this many tokens, then end the body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid_utf8_after_tokens: Option<u32>,
    /// After the opening events, send one line of this many bytes with no newline, then end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub huge_line_bytes: Option<u64>,
    /// Stop at half of the first tool call with `length` / `max_tokens` (T7, §3.9). A text
    /// answer stops at half its tokens with the same reason.
    pub length_in_tool_call: bool,
    /// Refuse: Anthropic `stop_reason: "refusal"`, OpenAI `refusal` deltas + `stop`.
    pub refusal: bool,
}

impl Default for Failure {
    fn default() -> Self {
        Failure {
            status: None,
            status_rate: 1.0,
            fail_first_n: None,
            retry_after_s: None,
            retry_after_ms: None,
            message: None,
            drop_after_tokens: None,
            drop_after_bytes: None,
            drop_rate: 1.0,
            stall_after_tokens: None,
            stall_ms: None,
            malformed_after_tokens: None,
            in_band_error_after_tokens: None,
            eof_before_finish: false,
            missing_done: false,
            bom: false,
            invalid_utf8_after_tokens: None,
            huge_line_bytes: None,
            length_in_tool_call: false,
            refusal: false,
        }
    }
}

/// What the upstream does with a prefill: a request whose final message is an assistant
/// message with text. The Anthropic wire always treats it as a prefill (and always refuses
/// one ending in whitespace); on the OpenAI wire `convention` decides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Continuation {
    /// OpenAI wire: which request shape counts as a prefill. Any other shape is history,
    /// and the answer starts over.
    pub convention: Convention,
    /// What an honoured prefill gets.
    #[serde(alias = "behavior")]
    pub behaviour: Behaviour,
    /// `diverges`: words of the answer repeated before it says something else.
    pub diverge_after_words: u32,
    /// `refuses`: the 400's message (llama.cpp's thinking-mode refusal otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal_message: Option<String>,
}

impl Default for Continuation {
    fn default() -> Self {
        Continuation {
            convention: Convention::Any,
            behaviour: Behaviour::Exact,
            diverge_after_words: 3,
            refusal_message: None,
        }
    }
}

/// The OpenAI-wire request shape a simulated upstream continues (see `types::Prefill`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Convention {
    /// Any final assistant message, marked or not.
    #[default]
    Any,
    /// A plain final assistant message; one marked for another convention is history.
    Assistant,
    /// The final assistant message has `"prefix": true` (DeepSeek beta, Mistral).
    Prefix,
    /// The request has `"continue_final_message": true` (vLLM).
    Vllm,
    /// Never (api.openai.com): a final assistant message is history.
    None,
}

/// What an honoured prefill gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Behaviour {
    /// Only the remainder after the prefill (a prefill ending inside a token gets that
    /// token's tail); the whole answer when the prefill is not a prefix of it.
    #[default]
    Exact,
    /// The whole answer from its start, as if there were no prefill.
    StartsOver,
    /// A different answer from the start: the first `diverge_after_words` words of the
    /// answer, then other words.
    Diverges,
    /// HTTP 400 with the wire's error body.
    Refuses,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_cycles_through_its_phases_on_the_clock() {
        let slow = Ttft {
            median_ms: 3000.0,
            ..Ttft::default()
        };
        let drops = Failure {
            drop_after_tokens: Some(3),
            ..Failure::default()
        };
        let s = Scenario {
            phases: vec![
                Phase {
                    ms: 100,
                    ttft: Some(slow.clone()),
                    ..Phase::default()
                },
                Phase {
                    ms: 50,
                    failure: Some(drops.clone()),
                    ..Phase::default()
                },
            ],
            ..Scenario::default()
        };
        let at = |ms| s.during(ms).unwrap_or_default();
        assert_eq!(at(0).ttft, slow, "first phase");
        assert_eq!(at(99).failure, Failure::default(), "first phase keeps the failure");
        assert_eq!(at(100).failure, drops, "second phase");
        assert_eq!(at(100).ttft, Ttft::default(), "second phase keeps the ttft");
        assert_eq!(at(150).ttft, slow, "then the schedule repeats");
        assert!(at(0).phases.is_empty(), "the phase view has no schedule of its own");
        assert_eq!(Scenario::default().during(5), None, "no schedule");
    }
}
