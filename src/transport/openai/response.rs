//! Rendering answers in the OpenAI dialect: `chat.completion.chunk` SSE frames (exactly the
//! shape the openai SDKs parse), the non-streaming `chat.completion`, and error bodies.

use std::io::Write;

use bytes::Bytes;
use serde::Serialize;

use crate::transport::error::ErrorReply;
use crate::transport::events::{served_model, Answer, ThinkingBlock};
use crate::transport::sse_out::{data_frame, Flow, FrameEncoder, Frames, DONE_FRAME};
use serde_json::value::RawValue;

use crate::types::{
    Envelope, ErrorClass, Extra, ExtraField, FinishReason, RawJson, StreamEvent, Thinking, ToolCall, Usage, Wire,
};

/// `chatcmpl-…` from the request id, so logs and responses correlate.
pub fn completion_id(request_id: &str) -> String {
    format!("chatcmpl-{}", request_id.strip_prefix("req_").unwrap_or(request_id))
}

/// OpenAI has no `refusal` or `truncated` finish reason; a refusal is a content filter,
/// and truncation never reaches here (it ends the stream with an error instead).
pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop | FinishReason::Truncated => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::ContentFilter | FinishReason::Refusal => "content_filter",
    }
}

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    #[serde(flatten)]
    fields: &'a RouteFields,
    choices: &'a [ChunkChoice<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<OpenAiUsage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tailcut: Option<&'a Envelope>,
}

/// The chunk-level fields an OpenAI-wire route sent (`types::ExtraField::Chunk`), repeated on
/// every chunk from the one that first carries them, as OpenAI repeats them.
#[derive(Serialize, Default, Debug, Clone)]
struct RouteFields {
    #[serde(skip_serializing_if = "Option::is_none")]
    service_tier: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_fingerprint: Option<Box<RawValue>>,
}

impl RouteFields {
    /// Takes an OpenAI-wire extra's chunk field; `false` for anything else.
    fn take(&mut self, extra: &Extra) -> bool {
        let slot = match (&extra.wire, &extra.field) {
            (Wire::OpenAi, ExtraField::Chunk("service_tier")) => &mut self.service_tier,
            (Wire::OpenAi, ExtraField::Chunk("system_fingerprint")) => &mut self.system_fingerprint,
            _ => return false,
        };
        *slot = Some(extra.value.raw().to_owned());
        true
    }

    fn is_empty(&self) -> bool {
        self.service_tier.is_none() && self.system_fingerprint.is_none()
    }
}

/// The finish of an answer whose route said it refuses (`ExtraField::Refusal`) is OpenAI's
/// own: `stop`, the refusal in its `refusal` field. Otherwise `finish_reason`.
fn refusal_finish(reason: FinishReason, refused: bool) -> &'static str {
    match reason {
        FinishReason::Refusal if refused => "stop",
        other => finish_reason(other),
    }
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: ChunkDelta<'a>,
    logprobs: Option<&'a RawValue>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize, Default)]
struct ChunkDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    /// The route's reasoning, under the name DeepSeek, llama.cpp and most chat frontends
    /// read (`docs/dialects.md`).
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refusal: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[WireToolCall<'a>; 1]>,
}

#[derive(Serialize)]
struct WireToolCall<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<u32>,
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

impl<'a> WireToolCall<'a> {
    fn new(call: &'a ToolCall, with_index: bool) -> Self {
        WireToolCall {
            index: with_index.then_some(call.index),
            id: &call.id,
            kind: "function",
            function: WireFunction {
                name: &call.name,
                arguments: &call.arguments,
            },
        }
    }
}

#[derive(Serialize, Clone, Copy)]
struct OpenAiUsage {
    prompt_tokens: u32,
    completion_tokens: u32,
    total_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Serialize, Clone, Copy)]
struct PromptDetails {
    cached_tokens: u32,
}

#[derive(Serialize, Clone, Copy)]
struct CompletionDetails {
    reasoning_tokens: u32,
}

impl From<Usage> for OpenAiUsage {
    /// Tokens written to an Anthropic route's cache are prompt tokens; OpenAI's usage has no
    /// field of its own for them.
    fn from(u: Usage) -> Self {
        OpenAiUsage {
            prompt_tokens: u.input_tokens,
            completion_tokens: u.output_tokens,
            total_tokens: u.input_tokens.saturating_add(u.output_tokens),
            prompt_tokens_details: u.cache_read_tokens.map(|cached_tokens| PromptDetails { cached_tokens }),
            completion_tokens_details: u
                .reasoning_tokens
                .map(|reasoning_tokens| CompletionDetails { reasoning_tokens }),
        }
    }
}

/// OpenAI's error envelope; `param` and `code` are always present (some SDKs key on them).
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tailcut: Option<&'a Envelope>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: &'a str,
}

/// OpenAI's `error.type` for a class of failure. Every 5xx, a timeout included, is
/// `server_error` (§6.1); the `code` says which (`timeout`, `overloaded`, ...).
pub fn error_type(class: ErrorClass) -> &'static str {
    match class {
        // OpenAI's own 401 and 403 bodies say `invalid_request_error` too (the code tells which).
        ErrorClass::BadRequest
        | ErrorClass::ContextLength
        | ErrorClass::Refusal
        | ErrorClass::NoRoute
        | ErrorClass::Unauthenticated
        | ErrorClass::Forbidden
        | ErrorClass::ClientTooSlow => "invalid_request_error",
        ErrorClass::RateLimited => "rate_limit_error",
        _ => "server_error",
    }
}

fn error_code(reply: &ErrorReply) -> &str {
    reply.code.unwrap_or(match reply.class {
        ErrorClass::RateLimited => "rate_limit_exceeded",
        ErrorClass::ContextLength => "context_length_exceeded",
        other => other.as_str(),
    })
}

fn error_body(reply: &ErrorReply) -> ErrorBody<'_> {
    ErrorBody {
        error: ErrorDetail {
            message: &reply.message,
            // A 408 is the client's slowness, not the server's failure.
            kind: if reply.status == 408 {
                "invalid_request_error"
            } else {
                error_type(reply.class)
            },
            param: reply.param.as_deref(),
            code: error_code(reply),
        },
        tailcut: reply.envelope.as_deref(),
    }
}

/// The JSON body of an HTTP error response.
pub fn error_json(reply: &ErrorReply) -> Vec<u8> {
    crate::transport::sse_out::to_json(&error_body(reply))
}

/// The in-band error after commit: the openai SDKs raise `APIError` on a `data:` whose
/// JSON has an `error`. No `[DONE]` follows, so it can never pass for a complete answer.
pub fn error_frame(reply: &ErrorReply) -> Bytes {
    data_frame(&error_body(reply))
}

/// Renders a committed stream as `chat.completion.chunk` frames.
pub struct ChunkEncoder {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    usage: Option<Usage>,
    envelope: Envelope,
    frames: Frames,
    fields: RouteFields,
    /// Log-probabilities for the next text (`ExtraField::Logprobs`), sent with it.
    logprobs: Option<RawJson>,
    /// The route said its text is a refusal (`ExtraField::Refusal`): it goes as
    /// `delta.refusal`, and the answer ends with `stop`, as OpenAI ends one.
    refusal: bool,
    /// A text delta's frame up to its content, the same all through the stream: `data: `,
    /// then `Chunk` with `id`, `object`, `created`, `model` and one choice's delta opened at
    /// `"content":`. A delta's frame is this, the text as a JSON string and `TEXT_TAIL`: the
    /// bytes `frame` would write (a test holds them equal).
    text_head: Vec<u8>,
}

impl ChunkEncoder {
    pub fn new(request_id: &str, alias: &str, created: u64, start: Envelope, include_usage: bool) -> Self {
        let id = completion_id(request_id);
        let model = served_model(&start, alias);
        ChunkEncoder {
            text_head: text_head(&id, created, &model, &RouteFields::default()),
            id,
            created,
            model,
            include_usage,
            usage: None,
            envelope: start,
            frames: Frames::default(),
            fields: RouteFields::default(),
            logprobs: None,
            refusal: false,
        }
    }

    /// An extra of the route's answer: a chunk field from now on, or logprobs for the next
    /// text. Extras of another wire have no place here.
    fn extra(&mut self, extra: Extra, out: &mut Vec<Bytes>) {
        if self.fields.take(&extra) {
            self.text_head = text_head(&self.id, self.created, &self.model, &self.fields);
        } else if extra.wire == Wire::OpenAi && extra.field == ExtraField::Refusal {
            self.refusal = true;
        } else if extra.wire == Wire::OpenAi && extra.field == ExtraField::Logprobs {
            // Two in a row (their text was held or swallowed between): the first goes alone.
            self.flush_logprobs(out);
            self.logprobs = Some(extra.value);
        }
    }

    /// Logprobs still waiting for text, in a chunk of their own with an empty delta.
    fn flush_logprobs(&mut self, out: &mut Vec<Bytes>) {
        if let Some(logprobs) = self.logprobs.take() {
            out.push(self.delta_frame(ChunkDelta::default(), Some(logprobs.raw())));
        }
    }

    /// The first frame after commit: the assistant role with empty content. Written from
    /// `text_head`'s bytes, as `frame` would write it (a test holds them equal).
    pub fn role_frame(&self) -> Bytes {
        let open = self.delta_open();
        let mut frame = Vec::with_capacity(open.len() + ROLE_DELTA.len() + TEXT_TAIL.len());
        frame.extend_from_slice(open);
        frame.extend_from_slice(ROLE_DELTA);
        frame.extend_from_slice(TEXT_TAIL);
        Bytes::from(frame)
    }

    /// `text_head` up to its delta's opening brace: every chunk of the stream starts so.
    fn delta_open(&self) -> &[u8] {
        &self.text_head[..self.text_head.len() - CONTENT_KEY.len()]
    }

    /// The finish frame: an empty delta, the reason and the envelope. Written from
    /// `text_head`'s bytes with only the envelope serialized, as `frame` would write it (a
    /// test holds them equal).
    fn finish_frame(&mut self, reason: FinishReason, envelope: &Envelope) -> Bytes {
        debug_assert!(self.logprobs.is_none(), "logprobs are flushed before the finish");
        // Every reason is a plain ASCII word: nothing in it to escape.
        let mut mid = Vec::with_capacity(64);
        mid.extend_from_slice(b"},\"logprobs\":null,\"finish_reason\":\"");
        mid.extend_from_slice(refusal_finish(reason, self.refusal).as_bytes());
        mid.extend_from_slice(b"\"}],\"tailcut\":");
        let open = &self.text_head[..self.text_head.len() - CONTENT_KEY.len()];
        self.frames.around_json(open, &mid, envelope, b"}\n\n")
    }

    fn chunk<'a>(&'a self, choices: &'a [ChunkChoice<'a>], tailcut: Option<&'a Envelope>) -> Chunk<'a> {
        Chunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            fields: &self.fields,
            choices,
            usage: None,
            tailcut,
        }
    }

    /// A chunk's frame serialized whole: what the frames written from `text_head` are held to.
    #[cfg(test)]
    fn frame(&self, delta: ChunkDelta<'_>, finish: Option<&'static str>, tailcut: Option<&Envelope>) -> Bytes {
        let choice = [ChunkChoice {
            index: 0,
            delta,
            logprobs: None,
            finish_reason: finish,
        }];
        data_frame(&self.chunk(&choice, tailcut))
    }

    /// A text delta's frame: only the text is encoded (see `text_head`), unless logprobs go
    /// with it.
    fn text_frame(&mut self, text: &str) -> Bytes {
        let logprobs = self.logprobs.take();
        if logprobs.is_none() && !self.refusal {
            return self.frames.around_str(&self.text_head, text, TEXT_TAIL);
        }
        let delta = if self.refusal {
            ChunkDelta {
                refusal: Some(text),
                ..ChunkDelta::default()
            }
        } else {
            ChunkDelta {
                content: Some(text),
                ..ChunkDelta::default()
            }
        };
        self.delta_frame(delta, logprobs.as_ref().map(RawJson::raw))
    }

    /// A chunk of one delta, serialized whole, in the stream's frame buffer.
    fn delta_frame(&mut self, delta: ChunkDelta<'_>, logprobs: Option<&RawValue>) -> Bytes {
        let choice = [ChunkChoice {
            index: 0,
            delta,
            logprobs,
            finish_reason: None,
        }];
        let chunk = Chunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            fields: &self.fields,
            choices: &choice,
            usage: None,
            tailcut: None,
        };
        self.frames.data(&chunk)
    }

    /// The route's reasoning text as `reasoning_content`; a signature or a redacted block has
    /// no place in this dialect (`docs/dialects.md`).
    fn thinking_frame(&mut self, thinking: &Thinking) -> Option<Bytes> {
        match thinking {
            Thinking::Text(text) if !text.is_empty() => {
                let delta = ChunkDelta {
                    reasoning_content: Some(text),
                    ..ChunkDelta::default()
                };
                Some(self.delta_frame(delta, None))
            }
            _ => None,
        }
    }

    /// A tool call's frame, in the stream's frame buffer.
    fn tool_call_frame(&mut self, call: &ToolCall) -> Bytes {
        let delta = ChunkDelta {
            tool_calls: Some([WireToolCall::new(call, true)]),
            ..ChunkDelta::default()
        };
        self.delta_frame(delta, None)
    }

    fn usage_frame(&self, usage: Usage) -> Bytes {
        data_frame(&Chunk {
            usage: Some(usage.into()),
            ..self.chunk(&[], None)
        })
    }

    fn fail(&mut self, reply: ErrorReply, out: &mut Vec<Bytes>) -> Flow {
        out.push(error_frame(&reply));
        Flow::End
    }
}

impl FrameEncoder for ChunkEncoder {
    fn encode(&mut self, event: StreamEvent, out: &mut Vec<Bytes>) -> Flow {
        match event {
            StreamEvent::Start(envelope) => self.envelope = *envelope,
            StreamEvent::TextDelta(text) if text.is_empty() => {}
            StreamEvent::TextDelta(text) => out.push(self.text_frame(&text)),
            StreamEvent::Thinking(thinking) => out.extend(self.thinking_frame(&thinking)),
            StreamEvent::Extra(extra) => self.extra(*extra, out),
            StreamEvent::ToolCall(call) => {
                self.flush_logprobs(out);
                out.push(self.tool_call_frame(&call));
            }
            // This dialect cannot take text back; the mux only resets dialects that can.
            StreamEvent::Reset { reason } => {
                let envelope = Some(self.envelope.clone());
                return self.fail(ErrorReply::reset(&reason, envelope), out);
            }
            StreamEvent::RouteSwitch { .. } => {}
            StreamEvent::Usage(usage) => self.usage = Some(usage),
            StreamEvent::Finish {
                reason: FinishReason::Truncated,
                envelope,
            } => return self.fail(ErrorReply::truncated(*envelope), out),
            StreamEvent::Finish { reason, envelope } => {
                self.flush_logprobs(out);
                out.push(self.finish_frame(reason, &envelope));
                if let Some(usage) = self.usage.filter(|_| self.include_usage) {
                    out.push(self.usage_frame(usage));
                }
                out.push(Bytes::from_static(DONE_FRAME));
                return Flow::End;
            }
            StreamEvent::Error(e) => return self.fail(ErrorReply::from_event(*e), out),
        }
        Flow::Continue
    }

    fn encode_unfinished(&mut self, out: &mut Vec<Bytes>) {
        let envelope = Some(self.envelope.clone());
        out.push(error_frame(&ErrorReply::broken_stream(
            "ended without a finish",
            envelope,
        )));
    }
}

/// The key `text_head` ends with, after the delta's opening brace.
const CONTENT_KEY: &[u8] = b"\"content\":";

/// The role frame's delta, inside its braces.
const ROLE_DELTA: &[u8] = b"\"role\":\"assistant\",\"content\":\"\"";

/// What follows a text delta's content in its frame: the rest of the chunk, and the blank
/// line that ends the frame.
const TEXT_TAIL: &[u8] = b"},\"logprobs\":null,\"finish_reason\":null}]}\n\n";

/// The bytes of a text delta's frame before its text (`ChunkEncoder::text_head`), written as
/// `Chunk`'s derived `Serialize` writes them: its fields in order, strings JSON-escaped.
fn text_head(id: &str, created: u64, model: &str, fields: &RouteFields) -> Vec<u8> {
    let mut head = Vec::with_capacity(128 + id.len() + model.len());
    head.extend_from_slice(b"data: {\"id\":");
    write_str(&mut head, id);
    head.extend_from_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
    let _ = write!(head, "{created}");
    head.extend_from_slice(b",\"model\":");
    write_str(&mut head, model);
    if !fields.is_empty() {
        // The fields as `Chunk` serializes them: `,"service_tier":…,"system_fingerprint":…`.
        let object = crate::transport::sse_out::to_json(fields);
        head.push(b',');
        head.extend_from_slice(&object[1..object.len() - 1]);
    }
    head.extend_from_slice(b",\"choices\":[{\"index\":0,\"delta\":{\"content\":");
    head
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    // A string always serializes.
    let _ = serde_json::to_writer(&mut *out, s);
}

#[derive(Serialize)]
struct Completion<'a> {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    #[serde(flatten)]
    fields: RouteFields,
    choices: [CompletionChoice<'a>; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<OpenAiUsage>,
    tailcut: &'a Envelope,
}

#[derive(Serialize)]
struct CompletionChoice<'a> {
    index: u32,
    message: CompletionMessage<'a>,
    logprobs: Option<Logprobs>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct CompletionMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    refusal: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tool_calls: Vec<WireToolCall<'a>>,
}

/// A whole answer's log-probabilities: every chunk's `content` and `refusal` token lists,
/// joined in order.
#[derive(Serialize, Default)]
struct Logprobs {
    content: Option<Vec<Box<RawValue>>>,
    refusal: Option<Vec<Box<RawValue>>>,
}

impl Logprobs {
    /// The answer's logprobs, if its route sent any. A list that does not read as
    /// `{content: [...], refusal: [...]}` adds nothing.
    fn joined(extras: &[Extra]) -> Option<Logprobs> {
        #[derive(serde::Deserialize)]
        struct Piece {
            #[serde(default)]
            content: Option<Vec<Box<RawValue>>>,
            #[serde(default)]
            refusal: Option<Vec<Box<RawValue>>>,
        }
        let mut all: Option<Logprobs> = None;
        for extra in extras
            .iter()
            .filter(|e| e.wire == Wire::OpenAi && e.field == ExtraField::Logprobs)
        {
            let joined = all.get_or_insert_with(Logprobs::default);
            if let Ok(piece) = serde_json::from_str::<Piece>(extra.value.text()) {
                for (list, more) in [
                    (&mut joined.content, piece.content),
                    (&mut joined.refusal, piece.refusal),
                ] {
                    if let Some(more) = more {
                        list.get_or_insert_with(Vec::new).extend(more);
                    }
                }
            }
        }
        all
    }
}

/// The non-streaming `chat.completion` body.
pub fn completion_json(request_id: &str, alias: &str, created: u64, answer: &Answer) -> Vec<u8> {
    let refused = answer
        .extras
        .iter()
        .any(|e| e.wire == Wire::OpenAi && e.field == ExtraField::Refusal);
    let (content, refusal) = if refused {
        (None, Some(answer.text.as_str()))
    } else if answer.text.is_empty() && !answer.tool_calls.is_empty() {
        (None, None)
    } else {
        (Some(answer.text.as_str()), None)
    };
    let mut fields = RouteFields::default();
    for extra in &answer.extras {
        fields.take(extra);
    }
    let body = Completion {
        id: completion_id(request_id),
        object: "chat.completion",
        created,
        model: served_model(&answer.envelope, alias),
        fields,
        choices: [CompletionChoice {
            index: 0,
            message: CompletionMessage {
                role: "assistant",
                content,
                refusal,
                reasoning_content: ThinkingBlock::joined_text(&answer.thinking),
                tool_calls: answer.tool_calls.iter().map(|c| WireToolCall::new(c, false)).collect(),
            },
            logprobs: Logprobs::joined(&answer.extras),
            finish_reason: refusal_finish(answer.finish, refused),
        }],
        usage: answer.usage.map(OpenAiUsage::from),
        tailcut: &answer.envelope,
    };
    crate::transport::sse_out::to_json(&body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ErrorEvent;

    fn start() -> Envelope {
        Envelope {
            route: Some("openai-eu".into()),
            model: Some("gpt-4o-mini".into()),
            request_id: "req_abc".into(),
            ..Envelope::default()
        }
    }

    fn encoder(include_usage: bool) -> ChunkEncoder {
        ChunkEncoder::new("req_abc", "chat", 1700000000, start(), include_usage)
    }

    fn run(enc: &mut ChunkEncoder, events: Vec<StreamEvent>) -> (String, Flow) {
        let mut out = Vec::new();
        let mut flow = Flow::Continue;
        for e in events {
            flow = enc.encode(e, &mut out);
        }
        let text = out.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect();
        (text, flow)
    }

    const HEAD: &str = r#"data: {"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"delta":"#;

    #[test]
    fn role_chunk_is_exactly_what_openai_sends_first() {
        let frame = encoder(false).role_frame();
        assert_eq!(
            String::from_utf8_lossy(&frame),
            format!(
                "{HEAD}{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
            ),
            "role chunk golden"
        );
    }

    #[test]
    fn text_delta_is_one_content_chunk() {
        let (text, flow) = run(&mut encoder(false), vec![StreamEvent::TextDelta("Hel\nlo".into())]);
        assert_eq!(
            text,
            format!("{HEAD}{{\"content\":\"Hel\\nlo\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"),
            "content chunk golden, newline escaped"
        );
        assert_eq!(flow, Flow::Continue, "text does not end the stream");
    }

    #[test]
    fn a_text_frame_is_the_bytes_of_the_serialized_chunk() {
        let odd = Envelope {
            model: Some("m\"odel\\é\u{1}".into()),
            ..start()
        };
        let mut with_fields = encoder(false);
        for (field, value) in [("service_tier", r#""de\"fault""#), ("system_fingerprint", r#""fp_1""#)] {
            let StreamEvent::Extra(e) = extra(ExtraField::Chunk(field), value) else {
                unreachable!()
            };
            with_fields.extra(*e, &mut Vec::new());
        }
        for mut enc in [
            encoder(false),
            ChunkEncoder::new("req_\"q\n", "chat", u64::MAX, odd, false),
            with_fields,
        ] {
            for text in [
                "Hel\nlo",
                "",
                "\"quoted\" back\\slash",
                "é 日本 \u{1}\u{1f}\u{7f} \u{2028}",
                "</script>\t",
            ] {
                let serialized = enc.frame(
                    ChunkDelta {
                        content: Some(text),
                        ..ChunkDelta::default()
                    },
                    None,
                    None,
                );
                assert_eq!(
                    String::from_utf8_lossy(&enc.text_frame(text)),
                    String::from_utf8_lossy(&serialized),
                    "text {text:?}"
                );
            }
        }
    }

    #[test]
    fn role_and_finish_frames_are_the_bytes_of_the_serialized_chunk() {
        let odd = Envelope {
            model: Some("m\"odel\\é\u{1}".into()),
            route: Some("r\"oute".into()),
            hedged: true,
            ..start()
        };
        for mut enc in [
            encoder(false),
            ChunkEncoder::new("req_\"q\n", "chat", u64::MAX, odd.clone(), true),
        ] {
            let role = enc.frame(
                ChunkDelta {
                    role: Some("assistant"),
                    content: Some(""),
                    ..ChunkDelta::default()
                },
                None,
                None,
            );
            assert_eq!(
                String::from_utf8_lossy(&enc.role_frame()),
                String::from_utf8_lossy(&role)
            );
            for reason in [
                FinishReason::Stop,
                FinishReason::Length,
                FinishReason::ToolCalls,
                FinishReason::ContentFilter,
                FinishReason::Refusal,
            ] {
                for envelope in [start(), odd.clone()] {
                    let serialized = enc.frame(ChunkDelta::default(), Some(finish_reason(reason)), Some(&envelope));
                    assert_eq!(
                        String::from_utf8_lossy(&enc.finish_frame(reason, &envelope)),
                        String::from_utf8_lossy(&serialized),
                        "{reason:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn empty_text_delta_sends_nothing() {
        let (text, _) = run(&mut encoder(false), vec![StreamEvent::TextDelta(String::new())]);
        assert_eq!(text, "", "no empty content chunks");
    }

    fn extra(field: ExtraField, value: &str) -> StreamEvent {
        let raw = RawValue::from_string(value.to_string()).expect("JSON");
        StreamEvent::Extra(Box::new(Extra {
            wire: Wire::OpenAi,
            field,
            value: RawJson::new(raw),
        }))
    }

    fn chunks(text: &str) -> Vec<serde_json::Value> {
        text.split("\n\n")
            .filter_map(|f| f.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).expect("JSON chunk"))
            .collect()
    }

    #[test]
    fn route_fields_ride_on_every_chunk_from_the_first_that_has_them_and_logprobs_on_their_text() {
        let logprobs =
            r#"{"content":[{"token":"Hi","logprob":-0.5,"bytes":[72,105],"top_logprobs":[]}],"refusal":null}"#;
        let mut enc = encoder(true);
        let (text, _) = run(
            &mut enc,
            vec![
                StreamEvent::TextDelta("a".into()),
                extra(ExtraField::Chunk("system_fingerprint"), r#""fp_1""#),
                extra(ExtraField::Chunk("service_tier"), r#""default""#),
                extra(ExtraField::Logprobs, logprobs),
                StreamEvent::TextDelta("Hi".into()),
                StreamEvent::TextDelta("!".into()),
                extra(ExtraField::Logprobs, logprobs),
                StreamEvent::Usage(Usage::new(1, 2)),
                StreamEvent::Finish {
                    reason: FinishReason::Stop,
                    envelope: Box::new(start()),
                },
            ],
        );
        let got = chunks(&text);
        assert!(
            got[0].get("system_fingerprint").is_none(),
            "not before it came: {}",
            got[0]
        );
        assert_eq!(got[0]["choices"][0]["logprobs"], serde_json::Value::Null);
        for chunk in &got[1..] {
            assert_eq!(chunk["system_fingerprint"], "fp_1", "{chunk}");
            assert_eq!(chunk["service_tier"], "default", "{chunk}");
        }
        let expected: serde_json::Value = serde_json::from_str(logprobs).expect("JSON");
        assert_eq!(got[1]["choices"][0]["delta"]["content"], "Hi");
        assert_eq!(
            got[1]["choices"][0]["logprobs"], expected,
            "with the text it came before"
        );
        assert_eq!(got[2]["choices"][0]["logprobs"], serde_json::Value::Null, "once");
        assert_eq!(got[3]["choices"][0]["delta"], serde_json::json!({}), "left over: alone");
        assert_eq!(got[3]["choices"][0]["logprobs"], expected);
        assert_eq!(got[4]["choices"][0]["finish_reason"], "stop");
        assert_eq!(got.len(), 6, "and the usage chunk");
        let order: Vec<&str> = text.lines().nth(2).map(|l| l.split(',').collect()).unwrap_or_default();
        let at = |key: &str| order.iter().position(|f| f.contains(key));
        assert!(
            at("\"model\"") < at("service_tier") && at("service_tier") < at("system_fingerprint"),
            "in OpenAI's order: {order:?}"
        );
    }

    #[test]
    fn a_routes_refusal_is_openais_own_refusal_field_and_stop() {
        let events = || {
            vec![
                extra(ExtraField::Refusal, "true"),
                StreamEvent::TextDelta("I can't".into()),
                StreamEvent::TextDelta(" help.".into()),
                StreamEvent::Finish {
                    reason: FinishReason::Refusal,
                    envelope: Box::new(start()),
                },
            ]
        };
        let (text, _) = run(&mut encoder(false), events());
        let got = chunks(&text);
        assert_eq!(got[0]["choices"][0]["delta"], serde_json::json!({"refusal": "I can't"}));
        assert_eq!(got[1]["choices"][0]["delta"], serde_json::json!({"refusal": " help."}));
        assert_eq!(got[2]["choices"][0]["finish_reason"], "stop");
        let StreamEvent::Extra(marker) = extra(ExtraField::Refusal, "true") else {
            unreachable!()
        };
        let answer = Answer {
            extras: vec![*marker],
            finish: FinishReason::Refusal,
            ..Answer::stopped("I can't help.", start())
        };
        let json: serde_json::Value =
            serde_json::from_slice(&completion_json("req_abc", "chat", 1, &answer)).expect("JSON");
        let choice = &json["choices"][0];
        assert_eq!(choice["message"]["refusal"], "I can't help.");
        assert_eq!(choice["message"]["content"], serde_json::Value::Null);
        assert_eq!(choice["finish_reason"], "stop");
        // A refusal from a route of another wire keeps tailcut's mapping.
        let (text, _) = run(&mut encoder(false), events().split_off(1));
        let got = chunks(&text);
        assert_eq!(got[0]["choices"][0]["delta"], serde_json::json!({"content": "I can't"}));
        assert_eq!(got[2]["choices"][0]["finish_reason"], "content_filter");
    }

    #[test]
    fn thinking_text_is_reasoning_content_and_signatures_have_no_place() {
        let (text, _) = run(
            &mut encoder(false),
            vec![
                StreamEvent::Thinking(Thinking::Text("Let me see.".into())),
                StreamEvent::Thinking(Thinking::Signature("sig".into())),
                StreamEvent::Thinking(Thinking::Redacted("opaque".into())),
                StreamEvent::TextDelta("Yes.".into()),
            ],
        );
        let got = chunks(&text);
        assert_eq!(got.len(), 2, "{text}");
        assert_eq!(
            got[0]["choices"][0]["delta"],
            serde_json::json!({"reasoning_content": "Let me see."})
        );
        assert_eq!(got[1]["choices"][0]["delta"], serde_json::json!({"content": "Yes."}));
    }

    #[test]
    fn a_whole_completion_joins_reasoning_and_logprobs_and_keeps_the_route_fields() {
        let piece = |t: &str| {
            let value = format!(
                r#"{{"content":[{{"token":"{t}","logprob":-1.0,"bytes":[],"top_logprobs":[]}}],"refusal":null}}"#
            );
            let StreamEvent::Extra(e) = extra(ExtraField::Logprobs, &value) else {
                unreachable!()
            };
            *e
        };
        let StreamEvent::Extra(fingerprint) = extra(ExtraField::Chunk("system_fingerprint"), r#""fp_9""#) else {
            unreachable!()
        };
        let answer = Answer {
            thinking: vec![ThinkingBlock::Thinking {
                text: "hmm".into(),
                signature: None,
            }],
            extras: vec![*fingerprint, piece("a"), piece("b")],
            ..Answer::stopped("ab", start())
        };
        let json: serde_json::Value =
            serde_json::from_slice(&completion_json("req_abc", "chat", 1, &answer)).expect("JSON");
        assert_eq!(json["system_fingerprint"], "fp_9");
        let choice = &json["choices"][0];
        assert_eq!(choice["message"]["reasoning_content"], "hmm");
        let tokens: Vec<&str> = choice["logprobs"]["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["token"].as_str())
            .collect();
        assert_eq!(tokens, ["a", "b"]);
        assert_eq!(choice["logprobs"]["refusal"], serde_json::Value::Null);
    }

    #[test]
    fn tool_call_is_one_whole_call_in_one_chunk() {
        let call = ToolCall {
            index: 1,
            id: "call_9".into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into(),
        };
        let (text, _) = run(&mut encoder(false), vec![StreamEvent::ToolCall(Box::new(call))]);
        assert_eq!(
            text,
            format!(
                "{HEAD}{{\"tool_calls\":[{{\"index\":1,\"id\":\"call_9\",\"type\":\"function\",\"function\":{{\"name\":\"get_weather\",\"arguments\":\"{{\\\"city\\\":\\\"Paris\\\"}}\"}}}}]}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
            ),
            "tool call chunk golden"
        );
    }

    #[test]
    fn finish_sends_reason_with_envelope_then_usage_then_done() {
        let env = Envelope { attempts: 2, ..start() };
        let env_json = serde_json::to_string(&env).expect("envelope serializes");
        let usage = Usage::new(5, 7);
        let (text, flow) = run(
            &mut encoder(true),
            vec![
                StreamEvent::Usage(usage),
                StreamEvent::Finish {
                    reason: FinishReason::Stop,
                    envelope: Box::new(env),
                },
            ],
        );
        let expected = format!(
            "{HEAD}{{}},\"logprobs\":null,\"finish_reason\":\"stop\"}}],\"tailcut\":{env_json}}}\n\n\
             data: {{\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":7,\"total_tokens\":12}}}}\n\n\
             data: [DONE]\n\n"
        );
        assert_eq!(text, expected, "finish chunk, usage chunk, [DONE]");
        assert_eq!(flow, Flow::End, "finish ends the stream");
    }

    #[test]
    fn usage_chunk_only_when_asked_for() {
        let (text, _) = run(
            &mut encoder(false),
            vec![
                StreamEvent::Usage(Usage::new(1, 1)),
                StreamEvent::Finish {
                    reason: FinishReason::Length,
                    envelope: Box::new(start()),
                },
            ],
        );
        assert!(
            !text.contains("\"usage\""),
            "no usage chunk without include_usage: {text}"
        );
        assert!(text.contains("\"finish_reason\":\"length\""), "length is kept: {text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "still ends with [DONE]");
    }

    #[test]
    fn in_band_error_has_error_and_envelope_and_no_done() {
        let env = start();
        let env_json = serde_json::to_string(&env).expect("envelope serializes");
        let (text, flow) = run(
            &mut encoder(false),
            vec![StreamEvent::Error(Box::new(ErrorEvent {
                code: None,
                class: ErrorClass::Unavailable,
                status: 502,
                message: "every route failed".into(),
                retry_after: None,
                envelope: env,
            }))],
        );
        assert_eq!(
            text,
            format!("data: {{\"error\":{{\"message\":\"every route failed\",\"type\":\"server_error\",\"param\":null,\"code\":\"unavailable\"}},\"tailcut\":{env_json}}}\n\n"),
            "error frame golden"
        );
        assert_eq!(flow, Flow::End, "an error ends the stream");
    }

    #[test]
    fn truncated_finish_is_an_error_never_done() {
        let (text, flow) = run(
            &mut encoder(false),
            vec![StreamEvent::Finish {
                reason: FinishReason::Truncated,
                envelope: Box::new(start()),
            }],
        );
        assert!(
            text.starts_with("data: {\"error\":"),
            "truncation is an in-band error: {text}"
        );
        assert!(text.contains("\"code\":\"truncated\""), "with its own code: {text}");
        assert!(!text.contains("[DONE]"), "never [DONE] for a truncated answer");
        assert_eq!(flow, Flow::End, "and the stream ends");
    }

    #[test]
    fn reset_cannot_be_expressed_so_it_ends_with_an_error() {
        let (text, flow) = run(
            &mut encoder(false),
            vec![StreamEvent::Reset {
                reason: "route died".into(),
            }],
        );
        assert!(
            text.contains("\"code\":\"restarted\""),
            "reset becomes an error: {text}"
        );
        assert_eq!(flow, Flow::End, "and ends the stream");
    }

    #[test]
    fn route_switch_is_invisible() {
        let (text, flow) = run(
            &mut encoder(false),
            vec![StreamEvent::RouteSwitch {
                from: "a".into(),
                to: "b".into(),
            }],
        );
        assert_eq!(
            (text.as_str(), flow),
            ("", Flow::Continue),
            "a continue is seamless for this dialect"
        );
    }

    #[test]
    fn unfinished_stream_ends_with_an_error() {
        let mut out = Vec::new();
        encoder(false).encode_unfinished(&mut out);
        let text = String::from_utf8_lossy(&out[0]).into_owned();
        assert!(text.starts_with("data: {\"error\":"), "an error frame: {text}");
    }

    #[test]
    fn model_is_the_served_upstream_model() {
        let env = Envelope {
            model: None,
            route: Some("r1".into()),
            ..Envelope::default()
        };
        assert_eq!(served_model(&start(), "chat"), "gpt-4o-mini", "the envelope's model");
        assert_eq!(served_model(&env, "chat"), "r1", "else the route");
    }

    #[test]
    fn finish_reasons_map_to_openai_values() {
        assert_eq!(finish_reason(FinishReason::Stop), "stop", "stop");
        assert_eq!(finish_reason(FinishReason::Length), "length", "length");
        assert_eq!(finish_reason(FinishReason::ToolCalls), "tool_calls", "tool calls");
        assert_eq!(finish_reason(FinishReason::Refusal), "content_filter", "refusal");
        assert_eq!(finish_reason(FinishReason::ContentFilter), "content_filter", "filter");
    }

    #[test]
    fn completion_json_has_message_tools_usage_and_envelope() {
        let answer = Answer {
            text: String::new(),
            thinking: Vec::new(),
            extras: Vec::new(),
            tool_calls: vec![ToolCall {
                index: 0,
                id: "call_1".into(),
                name: "f".into(),
                arguments: "{}".into(),
            }],
            usage: Some(Usage::new(2, 3)),
            finish: FinishReason::ToolCalls,
            envelope: start(),
        };
        let json: serde_json::Value =
            serde_json::from_slice(&completion_json("req_abc", "chat", 1, &answer)).expect("valid JSON");
        assert_eq!(json["object"], "chat.completion", "object");
        assert_eq!(json["model"], "gpt-4o-mini", "served model");
        let msg = &json["choices"][0]["message"];
        assert!(msg["content"].is_null(), "content is null when only tools were called");
        assert_eq!(msg["tool_calls"][0]["function"]["name"], "f", "tool call");
        assert!(
            msg["tool_calls"][0].get("index").is_none(),
            "no index in a whole message"
        );
        assert_eq!(json["choices"][0]["finish_reason"], "tool_calls", "finish");
        assert_eq!(json["usage"]["total_tokens"], 5, "usage totals");
        assert_eq!(json["tailcut"]["route"], "openai-eu", "envelope");
    }

    #[test]
    fn error_json_is_openais_envelope() {
        let mut reply = ErrorReply::bad_request("bad n");
        reply.param = Some("n".into());
        let json: serde_json::Value = serde_json::from_slice(&error_json(&reply)).expect("valid JSON");
        assert_eq!(
            json,
            serde_json::json!({"error": {"message": "bad n", "type": "invalid_request_error", "param": "n", "code": "bad_request"}}),
            "error envelope"
        );
    }
}
