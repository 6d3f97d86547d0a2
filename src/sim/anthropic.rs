//! The Anthropic Messages wire: the named-event stream (`event:` + `data:` with `type`, §3),
//! and the in-band error event; the whole bodies are in `bodies.rs`.

use bytes::Bytes;
use serde::Serialize;
use serde_json::json;

use super::cache::CacheUse;
use super::openai::replace_marker;
use super::plan::{AnswerKind, Step, Stop};

/// What the events of one response repeat.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub id: String,
    pub model: String,
    /// The input not read from or written to the prompt cache.
    pub input_tokens: u32,
    pub cache: CacheUse,
    /// Reasoning tokens billed but not streamed (`display: "omitted"`).
    pub hidden_tokens: u32,
}

/// Writes a script's steps as Messages stream events.
pub(crate) struct Encoder {
    ident: Identity,
    output_tokens: u32,
    /// The content block that has started and not stopped.
    open_block: Option<u32>,
    /// The next content block's index: a thinking block takes 0 and shifts the rest.
    next_block: u32,
    /// The text block's index once it started.
    text_block: Option<u32>,
    /// The index of the first tool_use block (call `i` is block `tool_base + i`).
    tool_base: Option<u32>,
    kind: AnswerKind,
    /// The answer opens with a thinking block.
    thinks: bool,
    error_message: Option<String>,
}

#[derive(Serialize)]
struct MessageStart<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: MessageHead<'a>,
}

#[derive(Serialize)]
struct MessageHead<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: [(); 0],
    stop_reason: Option<()>,
    stop_sequence: Option<()>,
    usage: StartUsage,
}

#[derive(Serialize)]
struct StartUsage {
    input_tokens: u32,
    /// Sent as 0 without `cache_control`, as the real API does.
    cache_creation_input_tokens: u32,
    cache_read_input_tokens: u32,
    output_tokens: u32,
}

#[derive(Serialize)]
struct BlockStart<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: u32,
    content_block: Block<'a>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: &'a str,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: serde_json::Map<String, serde_json::Value>,
    },
}

#[derive(Serialize)]
struct BlockDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: u32,
    delta: DeltaBody<'a>,
}

#[derive(Serialize)]
#[serde(tag = "type")]
enum DeltaBody<'a> {
    #[serde(rename = "text_delta")]
    Text { text: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: &'a str },
    #[serde(rename = "signature_delta")]
    Signature { signature: &'a str },
}

#[derive(Serialize)]
struct MessageDelta {
    #[serde(rename = "type")]
    kind: &'static str,
    delta: StopDelta,
    usage: DeltaUsage,
}

#[derive(Serialize)]
struct StopDelta {
    stop_reason: &'static str,
    stop_sequence: Option<()>,
}

#[derive(Serialize)]
struct DeltaUsage {
    output_tokens: u32,
}

impl Encoder {
    pub fn new(ident: Identity, kind: AnswerKind, thinks: bool, error_message: Option<String>) -> Self {
        Encoder {
            ident,
            output_tokens: 0,
            open_block: None,
            next_block: 0,
            text_block: None,
            tool_base: None,
            kind,
            thinks,
            error_message,
        }
    }

    pub fn identity(&self) -> &Identity {
        &self.ident
    }

    pub fn error_message(&self) -> Option<&str> {
        self.error_message.as_deref()
    }

    /// The SSE events (one `Bytes` each) a step becomes; waits and drops write nothing.
    pub fn encode(&mut self, step: &Step) -> Vec<Bytes> {
        if step.is_token() {
            self.output_tokens += 1;
        }
        match step {
            Step::Open(_) => self.open(),
            Step::Text(text) | Step::Refusal(text) => {
                let mut events = self.text_block_start();
                let index = self.text_block.unwrap_or(0);
                events.push(delta(index, DeltaBody::Text { text }));
                events
            }
            Step::Thinking(thinking) => {
                vec![delta(self.open_block.unwrap_or(0), DeltaBody::Thinking { thinking })]
            }
            Step::ThinkingEnd { signature } => {
                let index = self.open_block.take().unwrap_or(0);
                vec![
                    delta(index, DeltaBody::Signature { signature }),
                    block_stop(index),
                ]
            }
            Step::Redacted(data) => {
                let index = self.start_block();
                vec![
                    block_start(index, Block::RedactedThinking { data }),
                    block_stop(index),
                ]
            }
            Step::ToolOpen { index, id, name } => {
                let base = match self.tool_base {
                    Some(base) => base,
                    None => *self.tool_base.insert(self.next_block),
                };
                let block = base + index;
                self.next_block = self.next_block.max(block + 1);
                self.open_block = Some(block);
                let tool = Block::ToolUse {
                    id,
                    name,
                    input: serde_json::Map::new(),
                };
                vec![
                    block_start(block, tool),
                    delta(block, DeltaBody::InputJson { partial_json: "" }),
                ]
            }
            Step::ToolArgs { index, fragment } => vec![delta(
                self.tool_block(*index),
                DeltaBody::InputJson {
                    partial_json: fragment,
                },
            )],
            Step::ToolClose { index } => {
                self.open_block = None;
                vec![block_stop(self.tool_block(*index))]
            }
            Step::Finish(stop) => self.finish(*stop),
            Step::Terminal => vec![event("message_stop", &json!({"type": "message_stop"}))],
            Step::InBandError => {
                let message = self.error_message.as_deref().unwrap_or("Overloaded");
                vec![error_event("overloaded_error", message)]
            }
            Step::Malformed => vec![Bytes::from_static(
                b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"unterminated}\n\n",
            )],
            Step::InvalidUtf8 => {
                const MARK: &str = "@@SIM-INVALID-UTF8@@";
                let valid = delta(0, DeltaBody::Text { text: MARK });
                vec![replace_marker(&valid, MARK.as_bytes(), &[0xC3, 0x28, 0xFF])]
            }
            Step::Usage | Step::Wait(_) | Step::Bom | Step::HugeLine(_) | Step::Drop => Vec::new(),
        }
    }

    fn open(&mut self) -> Vec<Bytes> {
        let start = MessageStart {
            kind: "message_start",
            message: MessageHead {
                id: &self.ident.id,
                kind: "message",
                role: "assistant",
                model: &self.ident.model,
                content: [],
                stop_reason: None,
                stop_sequence: None,
                usage: StartUsage {
                    input_tokens: self.ident.input_tokens,
                    cache_creation_input_tokens: self.ident.cache.creation,
                    cache_read_input_tokens: self.ident.cache.read,
                    output_tokens: 1,
                },
            },
        };
        let mut events = vec![event("message_start", &start)];
        if self.thinks {
            // §3.4: the thinking block first; the answer's blocks follow it.
            let index = self.start_block();
            events.push(block_start(
                index,
                Block::Thinking {
                    thinking: "",
                    signature: "",
                },
            ));
        } else if self.kind != AnswerKind::Tools {
            events.extend(self.text_block_start());
        }
        events.push(event("ping", &json!({"type": "ping"})));
        events
    }

    /// Opens the next content block and returns its index.
    fn start_block(&mut self) -> u32 {
        let index = self.next_block;
        self.next_block += 1;
        self.open_block = Some(index);
        index
    }

    /// The text block's `content_block_start`, the first time only.
    fn text_block_start(&mut self) -> Vec<Bytes> {
        if self.text_block.is_some() {
            return Vec::new();
        }
        let index = self.start_block();
        self.text_block = Some(index);
        vec![block_start(index, Block::Text { text: "" })]
    }

    fn tool_block(&self, call: u32) -> u32 {
        self.tool_base.unwrap_or(0) + call
    }

    fn finish(&mut self, stop: Stop) -> Vec<Bytes> {
        let mut events = Vec::new();
        // Cut off by max_tokens inside a tool block: no content_block_stop (§3.9).
        let cut_tool = stop == Stop::Length && self.kind == AnswerKind::Tools;
        if let Some(index) = self.open_block.take() {
            if !cut_tool {
                events.push(block_stop(index));
            }
        }
        let body = MessageDelta {
            kind: "message_delta",
            delta: StopDelta {
                stop_reason: stop_reason(stop),
                stop_sequence: None,
            },
            usage: DeltaUsage {
                output_tokens: self.output_tokens.saturating_add(self.ident.hidden_tokens),
            },
        };
        events.push(event("message_delta", &body));
        events
    }
}

pub(crate) fn stop_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::EndTurn => "end_turn",
        Stop::ToolCalls => "tool_use",
        Stop::Length => "max_tokens",
        Stop::Refusal => "refusal",
    }
}

fn event(name: &str, data: &impl Serialize) -> Bytes {
    let json = serde_json::to_vec(data).unwrap_or_default();
    let mut out = Vec::with_capacity(json.len() + name.len() + 16);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(&json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

fn block_start(index: u32, content_block: Block<'_>) -> Bytes {
    let body = BlockStart {
        kind: "content_block_start",
        index,
        content_block,
    };
    event("content_block_start", &body)
}

fn delta(index: u32, delta: DeltaBody<'_>) -> Bytes {
    let body = BlockDelta {
        kind: "content_block_delta",
        index,
        delta,
    };
    event("content_block_delta", &body)
}

fn block_stop(index: u32) -> Bytes {
    #[derive(Serialize)]
    struct BlockStop {
        #[serde(rename = "type")]
        kind: &'static str,
        index: u32,
    }
    let body = BlockStop {
        kind: "content_block_stop",
        index,
    };
    event("content_block_stop", &body)
}

/// `event: error` with `{"type":"error","error":{"type":…,"message":…}}` (§3.8).
fn error_event(kind: &str, message: &str) -> Bytes {
    #[derive(Serialize)]
    struct ErrorEvent<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        error: ErrorDetail<'a>,
    }
    #[derive(Serialize)]
    struct ErrorDetail<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        message: &'a str,
    }
    let body = ErrorEvent {
        kind: "error",
        error: ErrorDetail { kind, message },
    };
    event("error", &body)
}
