//! Rendering answers in the Anthropic dialect: named SSE events (`event:` line plus `type`
//! in the data, T13), the non-streaming `message`, and error bodies.

use bytes::Bytes;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::transport::error::ErrorReply;
use crate::transport::events::{served_model, Answer, ThinkingBlock};
use crate::transport::sse_out::{event_frame, to_json, Flow, FrameEncoder, Frames};
use crate::types::{
    Envelope, ErrorClass, Extra, ExtraField, FinishReason, StreamEvent, Thinking, ToolCall, Usage, Wire,
};

/// `msg_…` from the request id.
pub fn message_id(request_id: &str) -> String {
    format!("msg_{}", request_id.strip_prefix("req_").unwrap_or(request_id))
}

/// Anthropic's `stop_reason`. Truncation never reaches here (it ends with an error).
pub fn stop_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop | FinishReason::Truncated => "end_turn",
        FinishReason::Length => "max_tokens",
        FinishReason::ToolCalls => "tool_use",
        FinishReason::Refusal | FinishReason::ContentFilter => "refusal",
    }
}

/// Anthropic's `error.type` for a class of failure.
pub fn error_type(class: ErrorClass) -> &'static str {
    match class {
        // No route fits the request as asked: a 400, which retrying cannot fix.
        ErrorClass::BadRequest | ErrorClass::ContextLength | ErrorClass::Refusal | ErrorClass::NoRoute => {
            "invalid_request_error"
        }
        ErrorClass::RateLimited => "rate_limit_error",
        ErrorClass::Overloaded => "overloaded_error",
        ErrorClass::Timeout | ErrorClass::ClientTooSlow => "timeout_error",
        ErrorClass::Unauthenticated => "authentication_error",
        ErrorClass::Forbidden => "permission_error",
        _ => "api_error",
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: ErrorDetail<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tailcut: Option<&'a Envelope>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
}

fn error_body(reply: &ErrorReply) -> ErrorBody<'_> {
    ErrorBody {
        kind: "error",
        error: ErrorDetail {
            // A 404 (an unknown model) is Anthropic's `not_found_error` and a 413 its
            // `request_too_large`, whatever the class.
            kind: match reply.status {
                404 => "not_found_error",
                413 => "request_too_large",
                _ => error_type(reply.class),
            },
            message: &reply.message,
        },
        tailcut: reply.envelope.as_deref(),
    }
}

/// `{"type":"error","error":{"type","message"}}`: the HTTP body and the in-band event data.
pub fn error_json(reply: &ErrorReply) -> Vec<u8> {
    to_json(&error_body(reply))
}

/// `event: error`. No `message_stop` follows: the SDKs raise on it.
pub fn error_frame(reply: &ErrorReply) -> Bytes {
    event_frame("error", &error_body(reply))
}

/// Anthropic's usage: `input_tokens` counts only the prompt tokens outside the cache.
#[derive(Serialize, Clone, Copy, Default)]
struct WireUsage {
    input_tokens: u32,
    output_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_creation_input_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_read_input_tokens: Option<u32>,
}

impl From<Usage> for WireUsage {
    fn from(u: Usage) -> Self {
        let cached = u
            .cache_read_tokens
            .unwrap_or(0)
            .saturating_add(u.cache_write_tokens.unwrap_or(0));
        WireUsage {
            input_tokens: u.input_tokens.saturating_sub(cached),
            output_tokens: u.output_tokens,
            cache_creation_input_tokens: u.cache_write_tokens,
            cache_read_input_tokens: u.cache_read_tokens,
        }
    }
}

/// A tool call's arguments as a JSON value, without re-serializing them. The mux only
/// emits calls whose arguments parsed; an empty string means no arguments.
fn tool_input(call: &ToolCall) -> Box<RawValue> {
    let text = if call.arguments.trim().is_empty() {
        "{}"
    } else {
        call.arguments.as_str()
    };
    RawValue::from_string(text.to_string()).unwrap_or_else(|_| empty_input())
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: &'a str,
        /// A whole message's text block lists its citations; a streamed block opens without.
        #[serde(skip_serializing_if = "Option::is_none")]
        citations: Option<Vec<&'a RawValue>>,
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
        input: Box<RawValue>,
    },
}

/// Named as Anthropic names them (`text_delta`, ...), hence the shared postfix.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[allow(clippy::enum_variant_names)]
enum BlockDelta<'a> {
    TextDelta { text: &'a str },
    ThinkingDelta { thinking: &'a str },
    SignatureDelta { signature: &'a str },
    CitationsDelta { citation: &'a RawValue },
    InputJsonDelta { partial_json: &'a str },
}

#[derive(Serialize)]
struct StopDelta {
    stop_reason: &'static str,
    stop_sequence: Option<()>,
}

#[derive(Serialize)]
struct DeltaUsage {
    output_tokens: u32,
    #[serde(flatten)]
    input: InputUsage,
}

/// The input side of `WireUsage`, as `message_delta` repeats it.
#[derive(Serialize)]
struct InputUsage {
    input_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_creation_input_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_read_input_tokens: Option<u32>,
}

impl From<Usage> for DeltaUsage {
    fn from(u: Usage) -> Self {
        let wire = WireUsage::from(u);
        DeltaUsage {
            output_tokens: wire.output_tokens,
            input: InputUsage {
                input_tokens: wire.input_tokens,
                cache_creation_input_tokens: wire.cache_creation_input_tokens,
                cache_read_input_tokens: wire.cache_read_input_tokens,
            },
        }
    }
}

/// The events after `message_start`, each named on its `event:` line and in `type`.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event<'a> {
    ContentBlockStart {
        index: u32,
        content_block: Block<'a>,
    },
    ContentBlockDelta {
        index: u32,
        delta: BlockDelta<'a>,
    },
    ContentBlockStop {
        index: u32,
    },
    MessageDelta {
        delta: StopDelta,
        usage: DeltaUsage,
        tailcut: &'a Envelope,
    },
    MessageStop,
}

impl Event<'_> {
    /// The event's frame, written into the stream's frame buffer.
    fn frame(&self, frames: &mut Frames) -> Bytes {
        let name = match self {
            Event::ContentBlockStart { .. } => "content_block_start",
            Event::ContentBlockDelta { .. } => "content_block_delta",
            Event::ContentBlockStop { .. } => "content_block_stop",
            Event::MessageDelta { .. } => "message_delta",
            Event::MessageStop => "message_stop",
        };
        frames.event(name, self)
    }
}

/// The keep-alive Anthropic itself sends.
pub const PING_EVENT: &[u8] = b"event: ping\ndata: {\"type\":\"ping\"}\n\n";

#[derive(Serialize)]
struct MessageBody<'a> {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    content: Vec<Block<'a>>,
    model: String,
    stop_reason: Option<&'static str>,
    stop_sequence: Option<()>,
    usage: WireUsage,
    #[serde(skip_serializing_if = "Option::is_none")]
    tailcut: Option<&'a Envelope>,
}

/// The content block a stream has open: text and thinking arrive in runs of deltas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    Thinking,
}

/// Renders a committed stream as Anthropic events, opening a content block per text run,
/// per thinking block and per tool call, with indices contiguous from 0.
pub struct EventEncoder {
    message_id: String,
    model: String,
    envelope: Envelope,
    next_index: u32,
    open: Option<Open>,
    usage: Option<Usage>,
    frames: Frames,
}

impl EventEncoder {
    pub fn new(request_id: &str, alias: &str, start: Envelope) -> Self {
        EventEncoder {
            message_id: message_id(request_id),
            model: served_model(&start, alias),
            envelope: start,
            next_index: 0,
            open: None,
            usage: None,
            frames: Frames::default(),
        }
    }

    /// `message_start`, with the envelope so far as an extra `tailcut` field.
    pub fn start_frame(&self) -> Bytes {
        #[derive(Serialize)]
        struct MessageStart<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            message: MessageBody<'a>,
            tailcut: &'a Envelope,
        }
        event_frame(
            "message_start",
            &MessageStart {
                kind: "message_start",
                message: MessageBody {
                    id: self.message_id.clone(),
                    kind: "message",
                    role: "assistant",
                    content: Vec::new(),
                    model: self.model.clone(),
                    stop_reason: None,
                    stop_sequence: None,
                    usage: WireUsage::default(),
                    tailcut: None,
                },
                tailcut: &self.envelope,
            },
        )
    }

    fn block_stop(&mut self, out: &mut Vec<Bytes>) {
        out.push(Event::ContentBlockStop { index: self.next_index }.frame(&mut self.frames));
        self.next_index += 1;
    }

    /// Closes the open block, if any.
    fn close(&mut self, out: &mut Vec<Bytes>) {
        if self.open.take().is_some() {
            self.block_stop(out);
        }
    }

    /// Opens a block of `kind` unless one is open: `start` is its empty first form.
    fn open(&mut self, kind: Open, start: Block<'_>, out: &mut Vec<Bytes>) {
        if self.open == Some(kind) {
            return;
        }
        self.close(out);
        let index = self.next_index;
        out.push(
            Event::ContentBlockStart {
                index,
                content_block: start,
            }
            .frame(&mut self.frames),
        );
        self.open = Some(kind);
    }

    /// An Anthropic-wire route's citation: a `citations_delta` in the text block it cites
    /// (opened for it when none is). Another wire's extras have no place here.
    fn extra(&mut self, extra: &Extra, out: &mut Vec<Bytes>) {
        if extra.wire != Wire::Anthropic || extra.field != ExtraField::Citation {
            return;
        }
        self.open(Open::Text, empty_text(), out);
        let index = self.next_index;
        let delta = BlockDelta::CitationsDelta {
            citation: extra.value.raw(),
        };
        out.push(Event::ContentBlockDelta { index, delta }.frame(&mut self.frames));
    }

    /// Thinking as Anthropic streams it: a `thinking` block of `thinking_delta`s, closed by
    /// its `signature_delta`; a redacted block whole.
    fn thinking(&mut self, thinking: &Thinking, out: &mut Vec<Bytes>) {
        let empty = Block::Thinking {
            thinking: "",
            signature: "",
        };
        let delta = match thinking {
            Thinking::Text(text) => BlockDelta::ThinkingDelta { thinking: text },
            Thinking::Signature(signature) => BlockDelta::SignatureDelta { signature },
            Thinking::Redacted(data) => {
                self.close(out);
                let index = self.next_index;
                let content_block = Block::RedactedThinking { data };
                out.push(Event::ContentBlockStart { index, content_block }.frame(&mut self.frames));
                self.block_stop(out);
                return;
            }
        };
        self.open(Open::Thinking, empty, out);
        let index = self.next_index;
        out.push(Event::ContentBlockDelta { index, delta }.frame(&mut self.frames));
        if matches!(thinking, Thinking::Signature(_)) {
            self.close(out);
        }
    }

    fn text(&mut self, text: &str, out: &mut Vec<Bytes>) {
        self.open(Open::Text, empty_text(), out);
        let index = self.next_index;
        out.push(
            Event::ContentBlockDelta {
                index,
                delta: BlockDelta::TextDelta { text },
            }
            .frame(&mut self.frames),
        );
    }

    /// A complete call: start (empty input), one delta carrying all of it, stop.
    fn tool_call(&mut self, call: &ToolCall, out: &mut Vec<Bytes>) {
        self.close(out);
        let index = self.next_index;
        let content_block = Block::ToolUse {
            id: &call.id,
            name: &call.name,
            input: empty_input(),
        };
        out.push(Event::ContentBlockStart { index, content_block }.frame(&mut self.frames));
        let delta = BlockDelta::InputJsonDelta {
            partial_json: &call.arguments,
        };
        out.push(Event::ContentBlockDelta { index, delta }.frame(&mut self.frames));
        self.block_stop(out);
    }

    fn finish(&mut self, reason: FinishReason, envelope: &Envelope, out: &mut Vec<Bytes>) {
        self.close(out);
        let usage = self.usage.unwrap_or_default();
        out.push(
            Event::MessageDelta {
                delta: StopDelta {
                    stop_reason: stop_reason(reason),
                    stop_sequence: None,
                },
                usage: DeltaUsage::from(usage),
                tailcut: envelope,
            }
            .frame(&mut self.frames),
        );
        out.push(Event::MessageStop.frame(&mut self.frames));
    }
}

fn empty_text() -> Block<'static> {
    Block::Text {
        text: "",
        citations: None,
    }
}

fn empty_input() -> Box<RawValue> {
    RawValue::from_string("{}".to_string()).unwrap_or_default()
}

impl FrameEncoder for EventEncoder {
    fn encode(&mut self, event: StreamEvent, out: &mut Vec<Bytes>) -> Flow {
        match event {
            StreamEvent::Start(envelope) => self.envelope = *envelope,
            StreamEvent::TextDelta(text) if text.is_empty() => {}
            StreamEvent::TextDelta(text) => self.text(&text, out),
            StreamEvent::Thinking(thinking) => self.thinking(&thinking, out),
            StreamEvent::Extra(extra) => self.extra(&extra, out),
            StreamEvent::ToolCall(call) => self.tool_call(&call, out),
            // This dialect cannot take text back; the mux only resets dialects that can.
            StreamEvent::Reset { reason } => {
                out.push(error_frame(&ErrorReply::reset(&reason, Some(self.envelope.clone()))));
                return Flow::End;
            }
            StreamEvent::RouteSwitch { .. } => {}
            StreamEvent::Usage(usage) => self.usage = Some(usage),
            StreamEvent::Finish {
                reason: FinishReason::Truncated,
                envelope,
            } => {
                out.push(error_frame(&ErrorReply::truncated(*envelope)));
                return Flow::End;
            }
            StreamEvent::Finish { reason, envelope } => {
                self.finish(reason, &envelope, out);
                return Flow::End;
            }
            StreamEvent::Error(e) => {
                out.push(error_frame(&ErrorReply::from_event(*e)));
                return Flow::End;
            }
        }
        Flow::Continue
    }

    fn encode_unfinished(&mut self, out: &mut Vec<Bytes>) {
        let reply = ErrorReply::broken_stream("ended without a finish", Some(self.envelope.clone()));
        out.push(error_frame(&reply));
    }
}

/// The non-streaming `message` body, with the envelope as an extra `tailcut` field.
pub fn message_json(request_id: &str, alias: &str, answer: &Answer) -> Vec<u8> {
    let mut content = Vec::new();
    for block in &answer.thinking {
        content.push(match block {
            ThinkingBlock::Thinking { text, signature } => Block::Thinking {
                thinking: text,
                signature: signature.as_deref().unwrap_or_default(),
            },
            ThinkingBlock::Redacted(data) => Block::RedactedThinking { data },
        });
    }
    if !answer.text.is_empty() {
        let citations: Vec<&RawValue> = answer
            .extras
            .iter()
            .filter(|e| e.wire == Wire::Anthropic && e.field == ExtraField::Citation)
            .map(|e| e.value.raw())
            .collect();
        content.push(Block::Text {
            text: &answer.text,
            citations: (!citations.is_empty()).then_some(citations),
        });
    }
    for call in &answer.tool_calls {
        content.push(Block::ToolUse {
            id: &call.id,
            name: &call.name,
            input: tool_input(call),
        });
    }
    to_json(&MessageBody {
        id: message_id(request_id),
        kind: "message",
        role: "assistant",
        content,
        model: served_model(&answer.envelope, alias),
        stop_reason: Some(stop_reason(answer.finish)),
        stop_sequence: None,
        usage: answer.usage.map(WireUsage::from).unwrap_or_default(),
        tailcut: Some(&answer.envelope),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ErrorEvent;

    fn start() -> Envelope {
        Envelope {
            route: Some("anthropic-eu".into()),
            model: Some("claude-x".into()),
            ..Envelope::default()
        }
    }

    fn encoder() -> EventEncoder {
        EventEncoder::new("req_abc", "chat", start())
    }

    fn run(enc: &mut EventEncoder, events: Vec<StreamEvent>) -> (String, Flow) {
        let mut out = Vec::new();
        let mut flow = Flow::Continue;
        for e in events {
            flow = enc.encode(e, &mut out);
        }
        (
            out.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect(),
            flow,
        )
    }

    fn env_json(env: &Envelope) -> String {
        serde_json::to_string(env).expect("envelope serializes")
    }

    #[test]
    fn message_start_carries_id_served_model_usage_and_envelope() {
        let frame = String::from_utf8_lossy(&encoder().start_frame()).into_owned();
        assert_eq!(
            frame,
            format!(
                "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_abc\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-x\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":0,\"output_tokens\":0}}}},\"tailcut\":{}}}\n\n",
                env_json(&start())
            ),
            "message_start golden"
        );
    }

    #[test]
    fn text_then_tool_call_then_finish_is_the_full_event_sequence() {
        let call = ToolCall {
            index: 0,
            id: "toolu_1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into(),
        };
        let (text, flow) = run(
            &mut encoder(),
            vec![
                StreamEvent::TextDelta("Hi".into()),
                StreamEvent::TextDelta("!".into()),
                StreamEvent::ToolCall(Box::new(call)),
                StreamEvent::Usage(Usage::new(10, 4)),
                StreamEvent::Finish {
                    reason: FinishReason::ToolCalls,
                    envelope: Box::new(start()),
                },
            ],
        );
        let expected = format!(
            "event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
             event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"Hi\"}}}}\n\n\
             event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"!\"}}}}\n\n\
             event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":0}}\n\n\
             event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":1,\"content_block\":{{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{{}}}}}}\n\n\
             event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":1,\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":\"{{\\\"city\\\":\\\"Paris\\\"}}\"}}}}\n\n\
             event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":1}}\n\n\
             event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"tool_use\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":4,\"input_tokens\":10}},\"tailcut\":{}}}\n\n\
             event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n",
            env_json(&start())
        );
        assert_eq!(text, expected, "Anthropic event sequence golden");
        assert_eq!(flow, Flow::End, "finish ends the stream");
    }

    #[test]
    fn text_after_a_tool_call_opens_a_new_block() {
        let call = ToolCall {
            index: 0,
            id: "t".into(),
            name: "f".into(),
            arguments: "{}".into(),
        };
        let (text, _) = run(
            &mut encoder(),
            vec![
                StreamEvent::ToolCall(Box::new(call)),
                StreamEvent::TextDelta("x".into()),
            ],
        );
        assert!(
            text.contains("\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\""),
            "the text block takes the next index: {text}"
        );
    }

    /// Each frame's data, parsed, after checking its `event:` line names its `type` (T13).
    fn datas(text: &str) -> Vec<serde_json::Value> {
        text.split("\n\n")
            .filter(|f| !f.is_empty())
            .map(|frame| {
                let (event, data) = frame.split_once('\n').expect("two lines");
                let data: serde_json::Value =
                    serde_json::from_str(data.strip_prefix("data: ").expect("data line")).expect("JSON data");
                assert_eq!(event.strip_prefix("event: "), data["type"].as_str(), "{frame}");
                data
            })
            .collect()
    }

    #[test]
    fn thinking_streams_as_a_thinking_block_closed_by_its_signature() {
        let (text, _) = run(
            &mut encoder(),
            vec![
                StreamEvent::Thinking(Thinking::Text("Let me".into())),
                StreamEvent::Thinking(Thinking::Text(" see.".into())),
                StreamEvent::Thinking(Thinking::Signature("sig==".into())),
                StreamEvent::Thinking(Thinking::Redacted("opaque".into())),
                StreamEvent::TextDelta("Yes.".into()),
                StreamEvent::Thinking(Thinking::Text("More".into())),
                StreamEvent::Finish {
                    reason: FinishReason::Stop,
                    envelope: Box::new(start()),
                },
            ],
        );
        let got = datas(&text);
        let expected = serde_json::json!([
            {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Let me"}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": " see."}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig=="}},
            {"type": "content_block_stop", "index": 0},
            {"type": "content_block_start", "index": 1, "content_block": {"type": "redacted_thinking", "data": "opaque"}},
            {"type": "content_block_stop", "index": 1},
            {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}},
            {"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "Yes."}},
            {"type": "content_block_stop", "index": 2},
            {"type": "content_block_start", "index": 3, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
            {"type": "content_block_delta", "index": 3, "delta": {"type": "thinking_delta", "thinking": "More"}},
            {"type": "content_block_stop", "index": 3},
        ]);
        assert_eq!(serde_json::Value::from(got[..13].to_vec()), expected);
        assert_eq!(got[13]["type"], "message_delta");
    }

    #[test]
    fn a_citation_is_a_citations_delta_in_its_text_block_and_a_whole_message_lists_them() {
        let citation = r#"{"type":"char_location","cited_text":"The sky is blue.","document_index":0,"start_char_index":0,"end_char_index":16}"#;
        let extra = |wire| {
            StreamEvent::Extra(Box::new(Extra {
                wire,
                field: ExtraField::Citation,
                value: crate::types::RawJson::new(RawValue::from_string(citation.into()).expect("JSON")),
            }))
        };
        let (text, _) = run(
            &mut encoder(),
            vec![
                extra(Wire::Anthropic),
                StreamEvent::TextDelta("Blue.".into()),
                extra(Wire::OpenAi),
            ],
        );
        let got = datas(&text);
        assert_eq!(got[0]["content_block"], serde_json::json!({"type": "text", "text": ""}));
        assert_eq!(got[1]["delta"]["type"], "citations_delta");
        assert_eq!(
            got[1]["delta"]["citation"],
            serde_json::from_str::<serde_json::Value>(citation).expect("JSON")
        );
        assert_eq!(
            (got[1]["index"].clone(), got[2]["index"].clone()),
            (0.into(), 0.into()),
            "one block"
        );
        assert_eq!(got.len(), 3, "another wire's extra has no place: {text}");
        let StreamEvent::Extra(e) = extra(Wire::Anthropic) else {
            unreachable!()
        };
        let answer = Answer {
            extras: vec![*e],
            ..Answer::stopped("Blue.", start())
        };
        let json: serde_json::Value = serde_json::from_slice(&message_json("req_a", "chat", &answer)).expect("JSON");
        assert_eq!(
            json["content"][0]["citations"][0]["cited_text"], "The sky is blue.",
            "{json}"
        );
    }

    #[test]
    fn a_whole_message_shows_its_thinking_blocks_first_with_their_signatures() {
        let answer = Answer {
            thinking: vec![
                ThinkingBlock::Thinking {
                    text: "GCD".into(),
                    signature: Some("sig".into()),
                },
                ThinkingBlock::Redacted("opaque".into()),
            ],
            ..Answer::stopped("21.", start())
        };
        let json: serde_json::Value = serde_json::from_slice(&message_json("req_a", "chat", &answer)).expect("JSON");
        assert_eq!(
            json["content"],
            serde_json::json!([
                {"type": "thinking", "thinking": "GCD", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "21."},
            ])
        );
    }

    #[test]
    fn stop_reasons_map_to_anthropic_values() {
        assert_eq!(stop_reason(FinishReason::Stop), "end_turn", "stop");
        assert_eq!(stop_reason(FinishReason::Length), "max_tokens", "length");
        assert_eq!(stop_reason(FinishReason::ToolCalls), "tool_use", "tool calls");
        assert_eq!(stop_reason(FinishReason::Refusal), "refusal", "refusal");
    }

    #[test]
    fn error_after_commit_is_an_error_event_without_message_stop() {
        let (text, flow) = run(
            &mut encoder(),
            vec![
                StreamEvent::TextDelta("par".into()),
                StreamEvent::Error(Box::new(ErrorEvent {
                    code: None,
                    class: ErrorClass::Unavailable,
                    status: 502,
                    message: "route died".into(),
                    retry_after: None,
                    envelope: start(),
                })),
            ],
        );
        let expected_tail = format!(
            "event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"api_error\",\"message\":\"route died\"}},\"tailcut\":{}}}\n\n",
            env_json(&start())
        );
        assert!(text.ends_with(&expected_tail), "error event golden: {text}");
        assert!(!text.contains("message_stop"), "no message_stop after an error");
        assert_eq!(flow, Flow::End, "the error ends the stream");
    }

    #[test]
    fn truncation_and_reset_end_with_an_error_event() {
        let (text, flow) = run(
            &mut encoder(),
            vec![StreamEvent::Finish {
                reason: FinishReason::Truncated,
                envelope: Box::new(start()),
            }],
        );
        assert!(text.starts_with("event: error\n"), "truncation is an error: {text}");
        assert_eq!(flow, Flow::End, "and ends the stream");
        let (text, _) = run(&mut encoder(), vec![StreamEvent::Reset { reason: "x".into() }]);
        assert!(text.starts_with("event: error\n"), "reset is an error: {text}");
    }

    #[test]
    fn error_types_follow_anthropic_names() {
        assert_eq!(error_type(ErrorClass::RateLimited), "rate_limit_error", "429");
        assert_eq!(error_type(ErrorClass::Overloaded), "overloaded_error", "busy");
        assert_eq!(error_type(ErrorClass::BadRequest), "invalid_request_error", "400");
        assert_eq!(error_type(ErrorClass::Timeout), "timeout_error", "504");
        assert_eq!(error_type(ErrorClass::Unavailable), "api_error", "5xx");
        assert_eq!(
            error_type(ErrorClass::NoRoute),
            "invalid_request_error",
            "no route is a 400, not an overload to retry"
        );
        let json: serde_json::Value = serde_json::from_slice(&error_json(&ErrorReply::busy())).expect("JSON");
        assert_eq!(json["type"], "error", "top-level type");
        assert_eq!(json["error"]["type"], "overloaded_error", "nested type");
    }

    #[test]
    fn message_json_has_blocks_with_parsed_tool_input() {
        let answer = Answer {
            text: "Let me check.".into(),
            thinking: Vec::new(),
            extras: Vec::new(),
            tool_calls: vec![ToolCall {
                index: 0,
                id: "toolu_1".into(),
                name: "f".into(),
                arguments: r#"{"a":1}"#.into(),
            }],
            usage: Some(Usage::new(3, 5)),
            finish: FinishReason::ToolCalls,
            envelope: start(),
        };
        let json: serde_json::Value = serde_json::from_slice(&message_json("req_abc", "chat", &answer)).expect("JSON");
        assert_eq!(json["id"], "msg_abc", "message id");
        assert_eq!(json["type"], "message", "type");
        assert_eq!(
            json["content"][0],
            serde_json::json!({"type": "text", "text": "Let me check."}),
            "text block"
        );
        assert_eq!(
            json["content"][1]["input"],
            serde_json::json!({"a": 1}),
            "input is an object, not a string"
        );
        assert_eq!(json["stop_reason"], "tool_use", "stop reason");
        assert_eq!(json["usage"]["output_tokens"], 5, "usage");
        assert_eq!(json["tailcut"]["route"], "anthropic-eu", "envelope");
    }
}
