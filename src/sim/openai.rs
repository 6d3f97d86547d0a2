//! The OpenAI Chat Completions wire: streamed `chat.completion.chunk` events (`data: …`,
//! `[DONE]`, §1) and the in-band error event; the whole bodies are in `bodies.rs`.

use bytes::Bytes;
use serde::Serialize;
use serde_json::json;

use super::logprobs::{self, ChoiceLogprobs, TokenLogprob};
use super::plan::{AnswerKind, ReasoningUsage, Step, Stop};

/// What every chunk of one response repeats.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub input_tokens: u32,
    /// `fp_` and ten hex digits, fixed per model.
    pub system_fingerprint: String,
    /// The tier reported when the request named one (`auto` is served as `default`).
    pub service_tier: Option<String>,
}

/// What the request asked the chunks to carry beyond the answer.
#[derive(Debug, Clone, Default)]
pub(crate) struct Extras {
    pub include_usage: bool,
    /// The first tool-call fragment rides in the role chunk (T2).
    pub role_with_first_tool: bool,
    /// `logprobs: true`, with this many `top_logprobs`.
    pub logprobs: Option<u8>,
    /// The delta field shown reasoning goes in (`reasoning_content` or `reasoning`).
    pub reasoning_field: &'static str,
    pub reasoning: ReasoningUsage,
    /// The model reports `completion_tokens_details.reasoning_tokens` (reasoning models).
    pub reports_reasoning: bool,
}

/// Writes a script's steps as Chat Completions chunks.
pub(crate) struct Encoder {
    ident: Identity,
    extras: Extras,
    role_pending: bool,
    output_tokens: u32,
    /// Answer tokens written so far (the position logprobs are drawn for).
    answer_tokens: u32,
    /// Message of the in-band error event.
    error_message: Option<String>,
}

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_tier: Option<&'a str>,
    system_fingerprint: &'a str,
    choices: Vec<Choice<'a>>,
    /// Absent without `include_usage`; `null` on ordinary chunks with it (§1.11).
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<UsageBody>>,
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<ChoiceLogprobs>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize, Default)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[ToolDelta<'a>; 1]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refusal: Option<Option<&'a str>>,
    /// Shown reasoning, DeepSeek's field (vLLM's older one).
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    /// Shown reasoning, vLLM's and OpenRouter's field.
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<&'a str>,
}

#[derive(Serialize)]
struct ToolDelta<'a> {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionDelta<'a>,
}

#[derive(Serialize)]
struct FunctionDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

#[derive(Serialize, Clone, Copy)]
pub(crate) struct UsageBody {
    prompt_tokens: u32,
    completion_tokens: u32,
    total_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Serialize, Clone, Copy)]
struct CompletionDetails {
    reasoning_tokens: u32,
    audio_tokens: u32,
    accepted_prediction_tokens: u32,
    rejected_prediction_tokens: u32,
}

impl UsageBody {
    /// `streamed` tokens went out; reasoning models add their hidden reasoning, which
    /// `completion_tokens` counts too, and say how much of it was reasoning.
    pub(crate) fn new(input: u32, streamed: u32, extras: &Extras) -> Self {
        let output = streamed.saturating_add(extras.reasoning.hidden);
        UsageBody {
            prompt_tokens: input,
            completion_tokens: output,
            total_tokens: input.saturating_add(output),
            completion_tokens_details: extras.reports_reasoning.then_some(CompletionDetails {
                reasoning_tokens: extras.reasoning.tokens,
                audio_tokens: 0,
                accepted_prediction_tokens: 0,
                rejected_prediction_tokens: 0,
            }),
        }
    }
}

impl Encoder {
    pub fn new(ident: Identity, extras: Extras) -> Self {
        Encoder {
            ident,
            extras,
            role_pending: true,
            output_tokens: 0,
            answer_tokens: 0,
            error_message: None,
        }
    }

    pub fn with_error_message(mut self, message: Option<String>) -> Self {
        self.error_message = message;
        self
    }

    /// What the whole-body answer (`bodies.rs`) is built from.
    pub fn parts(&self) -> (&Identity, &Extras) {
        (&self.ident, &self.extras)
    }

    pub fn error_message(&self) -> Option<&str> {
        self.error_message.as_deref()
    }

    /// The SSE events (one `Bytes` each) a step becomes; waits and drops write nothing.
    pub fn encode(&mut self, step: &Step) -> Vec<Bytes> {
        if step.is_token() {
            self.output_tokens += 1;
        }
        let delta = match step {
            Step::Open(kind) => match kind {
                AnswerKind::Tools if self.extras.role_with_first_tool => return Vec::new(),
                AnswerKind::Tools => self.role_delta(Some(None), None),
                AnswerKind::Text => self.role_delta(Some(Some("")), Some(None)),
                AnswerKind::Refusal => self.role_delta(Some(None), Some(Some(""))),
            },
            Step::Text(t) => {
                let logprobs = self.logprobs(t).map(ChoiceLogprobs::content);
                let delta = Delta {
                    content: Some(Some(t)),
                    ..Delta::default()
                };
                return vec![self.chunk_with(delta, logprobs, None)];
            }
            Step::Refusal(t) => {
                let logprobs = self.logprobs(t).map(ChoiceLogprobs::refusal);
                let delta = Delta {
                    refusal: Some(Some(t)),
                    ..Delta::default()
                };
                return vec![self.chunk_with(delta, logprobs, None)];
            }
            Step::Thinking(t) => {
                // DeepSeek's reasoning chunks carry `content: null` beside the reasoning.
                let mut delta = Delta {
                    content: Some(None),
                    ..Delta::default()
                };
                match self.extras.reasoning_field {
                    "reasoning" => delta.reasoning = Some(t),
                    _ => delta.reasoning_content = Some(t),
                }
                delta
            }
            Step::ToolOpen { index, id, name } => {
                let mut delta = if self.role_pending {
                    self.role_delta(Some(None), None)
                } else {
                    Delta::default()
                };
                delta.tool_calls = Some([ToolDelta {
                    index: *index,
                    id: Some(id),
                    kind: Some("function"),
                    function: FunctionDelta {
                        name: Some(name),
                        arguments: "",
                    },
                }]);
                delta
            }
            Step::ToolArgs { index, fragment } => Delta {
                tool_calls: Some([ToolDelta {
                    index: *index,
                    id: None,
                    kind: None,
                    function: FunctionDelta {
                        name: None,
                        arguments: fragment,
                    },
                }]),
                ..Delta::default()
            },
            Step::Finish(stop) => {
                return vec![self.chunk(Delta::default(), Some(finish_reason(*stop)))];
            }
            Step::Usage if self.extras.include_usage => {
                let usage = UsageBody::new(self.ident.input_tokens, self.output_tokens, &self.extras);
                return vec![self.usage_chunk(usage)];
            }
            Step::Terminal => return vec![Bytes::from_static(b"data: [DONE]\n\n")],
            Step::InBandError => return vec![in_band_error(self.error_message.as_deref())],
            Step::Malformed => {
                return vec![Bytes::from_static(
                    b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"unterminated}\n\n",
                )]
            }
            Step::InvalidUtf8 => return vec![self.invalid_utf8_chunk()],
            Step::Usage
            | Step::ToolClose { .. }
            | Step::ThinkingEnd { .. }
            | Step::Redacted(_)
            | Step::Wait(_)
            | Step::Bom
            | Step::HugeLine(_)
            | Step::Drop => return Vec::new(),
        };
        vec![self.chunk(delta, None)]
    }

    fn role_delta<'a>(&mut self, content: Option<Option<&'a str>>, refusal: Option<Option<&'a str>>) -> Delta<'a> {
        self.role_pending = false;
        Delta {
            role: Some("assistant"),
            content,
            refusal,
            ..Delta::default()
        }
    }

    /// The logprobs entry of the next answer token, when the request asked for them.
    fn logprobs(&mut self, token: &str) -> Option<Vec<TokenLogprob>> {
        let position = self.answer_tokens;
        self.answer_tokens += 1;
        let top = self.extras.logprobs?;
        Some(vec![logprobs::entry(token, position, top)])
    }

    fn chunk(&self, delta: Delta<'_>, finish_reason: Option<&'static str>) -> Bytes {
        self.chunk_with(delta, None, finish_reason)
    }

    fn chunk_with(
        &self,
        delta: Delta<'_>,
        logprobs: Option<ChoiceLogprobs>,
        finish_reason: Option<&'static str>,
    ) -> Bytes {
        let choice = Choice {
            index: 0,
            delta,
            logprobs,
            finish_reason,
        };
        self.frame(vec![choice], self.extras.include_usage.then_some(None))
    }

    fn usage_chunk(&self, usage: UsageBody) -> Bytes {
        self.frame(Vec::new(), Some(Some(usage)))
    }

    fn frame(&self, choices: Vec<Choice<'_>>, usage: Option<Option<UsageBody>>) -> Bytes {
        let chunk = Chunk {
            id: &self.ident.id,
            object: "chat.completion.chunk",
            created: self.ident.created,
            model: &self.ident.model,
            service_tier: self.ident.service_tier.as_deref(),
            system_fingerprint: &self.ident.system_fingerprint,
            choices,
            usage,
        };
        sse_data(&serde_json::to_vec(&chunk).unwrap_or_default())
    }

    /// A text chunk whose content holds bytes that are not UTF-8.
    fn invalid_utf8_chunk(&self) -> Bytes {
        const MARK: &str = "@@SIM-INVALID-UTF8@@";
        let valid = self.chunk(
            Delta {
                content: Some(Some(MARK)),
                ..Delta::default()
            },
            None,
        );
        replace_marker(&valid, MARK.as_bytes(), &[0xC3, 0x28, 0xFF])
    }
}

pub(crate) fn finish_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::EndTurn | Stop::Refusal => "stop",
        Stop::ToolCalls => "tool_calls",
        Stop::Length => "length",
    }
}

fn sse_data(json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

pub(crate) fn replace_marker(bytes: &[u8], marker: &[u8], with: &[u8]) -> Bytes {
    match bytes.windows(marker.len()).position(|w| w == marker) {
        Some(at) => {
            let mut out = Vec::with_capacity(bytes.len());
            out.extend_from_slice(&bytes[..at]);
            out.extend_from_slice(with);
            out.extend_from_slice(&bytes[at + marker.len()..]);
            Bytes::from(out)
        }
        None => Bytes::copy_from_slice(bytes),
    }
}

/// `data: {"error":{…}}`, the shape both official SDKs raise on (§1.12).
fn in_band_error(message: Option<&str>) -> Bytes {
    let default = "The server had an error while processing your request. Sorry about that!";
    let body = json!({"error": {
        "message": message.unwrap_or(default),
        "type": "server_error", "param": null, "code": null
    }});
    sse_data(body.to_string().as_bytes())
}

/// `fp_` and ten hex digits of a hash of the model: fixed per model, as OpenAI's are per
/// backend configuration.
pub(crate) fn fingerprint(model: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(model.as_bytes());
    format!("fp_{}", &hex::encode(digest)[..10])
}

/// The tier a response reports for the tier asked: `auto` is served by `default`, and
/// `fast` is reported as `priority` (§1.5).
pub(crate) fn served_tier(asked: &str) -> String {
    match asked {
        "auto" => "default",
        "fast" => "priority",
        other => other,
    }
    .to_owned()
}
