//! OpenAI Chat Completions SSE events -> `Delta`s: the per-answer state machine of §1.15.
//!
//! Only choice 0 is read (we never ask for `n > 1`). Role-only and empty deltas are dropped
//! (T12); empty, `null` or missing `choices` mean "no delta" (T8); tool-call fragments pass
//! through raw, keyed by `index` (T1-T4), for the mux's assembler. The answer is over at
//! `finish_reason`; the usage chunk and `[DONE]` that usually follow are optional, because
//! many OpenAI-compatible servers never send `[DONE]`. An unknown `finish_reason` is a
//! normal stop; only `"error"` (OpenRouter's failed generation) fails the attempt.

use std::borrow::Cow;

use serde_json::json;
use serde_json::value::RawValue;

use super::types::{ChoiceDelta, Chunk, FunctionDelta, ToolCallDelta, WireUsage};
use crate::provider::sse::SseEvent;
use crate::provider::wire_json::WireStr;
use crate::provider::{classify_in_band, Delta, ErrorClass, Progress, ProviderError, ToolFragment, WireDecoder};
use crate::types::{Extra, ExtraField, FinishReason, RawJson, Thinking, Usage, Wire};

#[derive(Debug, Default)]
pub(crate) struct ChunkDecoder {
    finish: Option<FinishReason>,
    /// The latest usage seen (last one wins).
    usage: Option<Usage>,
    /// The answer streamed `refusal` text: its `stop` is a refusal.
    refused: bool,
    /// Index of the tool call the last fragment belonged to, for servers that omit `index`.
    last_tool_index: Option<u32>,
    next_tool_index: u32,
    /// The chunk-level extras last said (`system_fingerprint`, `service_tier`), as sent:
    /// each is said again only when it changes.
    said: [Option<Box<str>>; CHUNK_EXTRAS.len()],
}

/// The chunk fields carried to an OpenAI-wire client (`types::ExtraField::Chunk`).
const CHUNK_EXTRAS: [&str; 2] = ["system_fingerprint", "service_tier"];

impl WireDecoder for ChunkDecoder {
    fn on_event(&mut self, event: SseEvent, out: &mut Vec<Delta>) -> Result<Progress, ProviderError> {
        let data = event.data.as_str().trim();
        if data.starts_with("[DONE]") {
            if self.finish.is_none() {
                return Err(protocol("upstream sent [DONE] before finish_reason"));
            }
            self.flush_usage(out);
            return Ok(Progress::End);
        }
        let chunk: Chunk<'_> =
            serde_json::from_str(data).map_err(|e| protocol(&format!("upstream sent a malformed chunk: {e}")))?;
        if chunk.error.is_some_and(|truthy| truthy.0) {
            return Err(in_band_error(data));
        }
        let usage_arrived = chunk.usage.is_some();
        if self.finish.is_none() {
            self.chunk_extras([chunk.system_fingerprint, chunk.service_tier], out);
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(neutral_usage(&usage));
        }
        for choice in chunk.choices.into_iter().flatten().filter(|c| c.index == 0) {
            if self.finish.is_some() {
                break; // nothing after the finish signal is part of the answer
            }
            if let Some(logprobs) = choice.logprobs.filter(|raw| raw.get() != "null") {
                out.push(extra(ExtraField::Logprobs, logprobs));
            }
            if let Some(delta) = choice.delta {
                self.on_delta(delta, out);
            }
            // Some compatible servers send `""` on every chunk that does not finish.
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                let reason = self.finish_reason(reason.as_str())?;
                self.finish = Some(reason);
                out.push(Delta::Finish(reason));
            }
        }
        if self.finish.is_some() && usage_arrived {
            self.flush_usage(out);
            return Ok(Progress::End);
        }
        Ok(Progress::More)
    }

    fn finished(&self) -> bool {
        self.finish.is_some()
    }

    fn on_end(&mut self, out: &mut Vec<Delta>) -> Result<(), ProviderError> {
        if self.finish.is_none() {
            return Err(protocol("upstream stream ended before finish_reason"));
        }
        self.flush_usage(out);
        Ok(())
    }
}

impl ChunkDecoder {
    /// The chunk's `system_fingerprint` and `service_tier`, each when it differs from the
    /// value last said.
    fn chunk_extras(&mut self, values: [Option<&RawValue>; CHUNK_EXTRAS.len()], out: &mut Vec<Delta>) {
        for ((name, value), said) in CHUNK_EXTRAS.iter().zip(values).zip(&mut self.said) {
            let Some(value) = value.filter(|raw| raw.get() != "null") else {
                continue;
            };
            if said.as_deref() != Some(value.get()) {
                *said = Some(value.get().into());
                out.push(extra(ExtraField::Chunk(name), value));
            }
        }
    }

    fn on_delta(&mut self, delta: ChoiceDelta<'_>, out: &mut Vec<Delta>) {
        // Reasoning comes before the answer text of the same chunk, as servers stream it. A
        // server in transition sends both names with the same text: the first that holds
        // text is read.
        if let Some(reasoning) = reasoning_text(delta.reasoning_content).or_else(|| reasoning_text(delta.reasoning)) {
            out.push(Delta::Thinking(Thinking::Text(reasoning.into())));
        }
        if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
            out.push(Delta::Text(text.into_string()));
        }
        if let Some(text) = delta.refusal.filter(|t| !t.is_empty()) {
            if !self.refused {
                let marker = RawValue::from_string("true".to_owned()).ok();
                out.extend(marker.map(|m| extra(ExtraField::Refusal, &m)));
            }
            self.refused = true;
            out.push(Delta::Text(text.into_string()));
        }
        for call in delta.tool_calls.into_iter().flatten() {
            if let Some(fragment) = self.tool_fragment(call) {
                out.push(Delta::tool(fragment));
            }
        }
        if let Some(call) = delta.function_call {
            // The deprecated single-call form: call 0, with a made-up id on its first fragment.
            let id = call.name.as_ref().map(|_| WireStr(Cow::Borrowed("call_0")));
            let call = ToolCallDelta {
                index: Some(0),
                id,
                function: Some(call),
            };
            if let Some(fragment) = self.tool_fragment(call) {
                out.push(Delta::tool(fragment));
            }
        }
    }

    fn tool_fragment(&mut self, call: ToolCallDelta<'_>) -> Option<ToolFragment> {
        let index = match call.index {
            Some(index) => index,
            // No index (older Ollama builds): a fragment with an id starts a new call,
            // anything else continues the last one.
            None if call.id.is_some() => self.next_tool_index,
            None => self.last_tool_index.unwrap_or(0),
        };
        self.last_tool_index = Some(index);
        self.next_tool_index = self.next_tool_index.max(index.saturating_add(1));
        let FunctionDelta { name, arguments } = call.function.unwrap_or_default();
        let arguments = arguments.unwrap_or_default();
        if call.id.is_none() && name.is_none() && arguments.is_empty() {
            return None;
        }
        Some(ToolFragment {
            index,
            id: call.id.map(WireStr::into_string),
            name: name.map(WireStr::into_string),
            arguments: arguments.into_string(),
        })
    }

    fn finish_reason(&self, reason: &str) -> Result<FinishReason, ProviderError> {
        Ok(match reason {
            "stop" | "end_turn" | "stop_sequence" | "eos" if self.refused => FinishReason::Refusal,
            "stop" | "end_turn" | "stop_sequence" | "eos" => FinishReason::Stop,
            "length" | "max_tokens" => FinishReason::Length,
            "tool_calls" | "function_call" | "tool_use" => FinishReason::ToolCalls,
            "content_filter" => FinishReason::ContentFilter,
            "refusal" => FinishReason::Refusal,
            // OpenRouter and some inference servers end a failed generation this way.
            "error" => {
                return Err(ProviderError::new(
                    ErrorClass::Unavailable,
                    "upstream ended the answer with finish_reason \"error\"",
                ))
            }
            // A reason added after this was written ends a complete answer like `stop`
            // would (§1.10 calls unknown values abnormal, but the answer is already whole:
            // failing it over would throw a good answer away).
            other => {
                tracing::debug!(finish_reason = other, "unknown finish_reason read as stop");
                if self.refused {
                    FinishReason::Refusal
                } else {
                    FinishReason::Stop
                }
            }
        })
    }

    fn flush_usage(&mut self, out: &mut Vec<Delta>) {
        if let Some(usage) = self.usage.take() {
            out.push(Delta::Usage(usage));
        }
    }
}

/// A reasoning field's text, when it is a non-empty string.
fn reasoning_text(raw: Option<&RawValue>) -> Option<String> {
    let text = serde_json::from_str::<WireStr<'_>>(raw?.get()).ok()?;
    (!text.is_empty()).then(|| text.into_string())
}

fn extra(field: ExtraField, value: &RawValue) -> Delta {
    Delta::Extra(Box::new(Extra {
        wire: Wire::OpenAi,
        field,
        value: RawJson::new(value.to_owned()),
    }))
}

fn neutral_usage(usage: &WireUsage) -> Usage {
    Usage {
        input_tokens: usage.prompt_tokens,
        output_tokens: usage.completion_tokens,
        cache_read_tokens: usage.prompt_tokens_details.as_ref().and_then(|d| d.cached_tokens),
        cache_write_tokens: None,
        reasoning_tokens: usage
            .completion_tokens_details
            .as_ref()
            .and_then(|d| d.reasoning_tokens),
    }
}

/// The in-band failure a chunk with a truthy `error` carries (T10), classified from the
/// error itself: the chunk is parsed a second time, as a tree, on this path only.
fn in_band_error(data: &str) -> ProviderError {
    let error = serde_json::from_str::<serde_json::Value>(data)
        .ok()
        .and_then(|mut chunk| chunk.get_mut("error").map(serde_json::Value::take))
        .unwrap_or_default();
    classify_in_band(&json!({ "error": error }))
}

fn protocol(message: &str) -> ProviderError {
    ProviderError::new(ErrorClass::Protocol, message)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;
    use futures::StreamExt;

    use super::*;
    use crate::provider::drive;
    use crate::provider::testkit::{decode_chunks, error_class, text, usage, usage_with, Out};

    const TEXT: &str = include_str!("../../../tests/fixtures/openai/text.sse");
    const TOOLS: &str = include_str!("../../../tests/fixtures/openai/tool_calls_parallel.sse");
    const SINGLE_TOOL: &str = include_str!("../../../tests/fixtures/openai/tool_call_single.sse");
    const REFUSAL: &str = include_str!("../../../tests/fixtures/openai/refusal.sse");
    const LENGTH: &str = include_str!("../../../tests/fixtures/openai/length.sse");

    /// The answer's text, tool calls, finish and usage: the extras every real chunk carries
    /// (`system_fingerprint`) are left out here and tested on their own.
    async fn replay_chunks(chunks: Vec<Vec<u8>>) -> Out {
        let out = decode_chunks(ChunkDecoder::default(), chunks).await;
        out.into_iter().filter(|d| !matches!(d, Ok(Delta::Extra(_)))).collect()
    }

    async fn replay(text: &str) -> Out {
        replay_chunks(vec![text.as_bytes().to_vec()]).await
    }

    fn fragment(index: u32, id: Option<&str>, name: Option<&str>, args: &str) -> Result<Delta, ProviderError> {
        Ok(Delta::tool(ToolFragment {
            index,
            id: id.map(str::to_string),
            name: name.map(str::to_string),
            arguments: args.to_string(),
        }))
    }

    #[tokio::test]
    async fn text_fixture_skips_the_role_chunk_and_ends_with_finish_then_usage() {
        let out = replay(TEXT).await;
        assert_eq!(
            out,
            vec![
                text("I'm"),
                text(" unable"),
                text("."),
                Ok(Delta::Finish(FinishReason::Stop)),
                usage_with(14, 30, (None, None, Some(0)))
            ],
            "role-only chunk with empty content is not a token (T12); usage after finish (T8)"
        );
    }

    #[tokio::test]
    async fn parallel_tool_calls_pass_through_as_raw_fragments() {
        let out = replay(TOOLS).await;
        assert_eq!(
            out[0],
            fragment(0, Some("call_JMW1whyEaYG438VE1OIflxA2"), Some("GetWeatherArgs"), ""),
            "T1"
        );
        assert_eq!(out[1], fragment(0, None, None, "{\"ci"), "T4: fragments are raw");
        let args = |index: u32| -> String {
            out.iter()
                .filter_map(|d| match d {
                    Ok(Delta::ToolFragment(f)) if f.index == index => Some(f.arguments.clone()),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(args(0), r#"{"city": "Edinburgh", "country": "GB", "units": "c"}"#);
        assert_eq!(args(1), r#"{"ticker": "AAPL", "exchange": "NASDAQ"}"#);
        assert_eq!(out[out.len() - 2], Ok(Delta::Finish(FinishReason::ToolCalls)));
        assert_eq!(out[out.len() - 1], usage_with(149, 60, (None, None, Some(0))));
    }

    #[tokio::test]
    async fn first_tool_fragment_in_the_role_chunk_is_kept() {
        let out = replay(SINGLE_TOOL).await;
        assert_eq!(
            out[0],
            fragment(0, Some("call_4XzlGBLtUe9dy3GVNV4jhq7h"), Some("get_weather"), ""),
            "T2"
        );
        assert_eq!(out[1], fragment(0, None, None, "{\""));
    }

    fn extra_of(d: &Result<Delta, ProviderError>) -> Option<(ExtraField, &str)> {
        match d {
            Ok(Delta::Extra(e)) if e.wire == Wire::OpenAi => Some((e.field.clone(), e.value.text())),
            _ => None,
        }
    }

    #[tokio::test]
    async fn chunk_fields_are_said_once_each_until_they_change() {
        let out = decode_chunks(ChunkDecoder::default(), vec![TEXT.as_bytes().to_vec()]).await;
        let extras: Vec<_> = out.iter().filter_map(extra_of).collect();
        assert_eq!(
            extras,
            [(ExtraField::Chunk("system_fingerprint"), "\"fp_5050236cbd\"")],
            "every chunk repeats it; it is said once, as sent"
        );
        assert!(matches!(out[0], Ok(Delta::Extra(_))), "before the first text: {out:?}");
        let chunks = [
            r#"{"service_tier":"default","system_fingerprint":"fp_a","choices":[{"index":0,"delta":{"content":"a"}}]}"#,
            r#"{"service_tier":"default","system_fingerprint":"fp_b","choices":[{"index":0,"delta":{"content":"b"}}]}"#,
            r#"{"service_tier":null,"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        ];
        let body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        let out = decode_chunks(ChunkDecoder::default(), vec![body.into_bytes()]).await;
        let extras: Vec<_> = out.iter().filter_map(extra_of).collect();
        assert_eq!(
            extras,
            [
                (ExtraField::Chunk("system_fingerprint"), "\"fp_a\""),
                (ExtraField::Chunk("service_tier"), "\"default\""),
                (ExtraField::Chunk("system_fingerprint"), "\"fp_b\""),
            ],
            "a change is said again; null says nothing"
        );
    }

    #[tokio::test]
    async fn logprobs_come_raw_before_the_text_they_belong_to() {
        let logprobs =
            r#"{"content":[{"token":"Hi","logprob":-0.01,"bytes":[72,105],"top_logprobs":[]}],"refusal":null}"#;
        let body = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"Hi\"}},\"logprobs\":{logprobs}}}]}}\n\n\
             data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"stop\"}}]}}\n\n"
        );
        let out = decode_chunks(ChunkDecoder::default(), vec![body.into_bytes()]).await;
        assert_eq!(
            extra_of(&out[0]),
            Some((ExtraField::Logprobs, logprobs)),
            "byte for byte: {out:?}"
        );
        assert_eq!(out[1], text("Hi"));
        assert_eq!(out[2], Ok(Delta::Finish(FinishReason::Stop)));
        assert_eq!(out.len(), 3, "a null logprobs is nothing");
    }

    #[tokio::test]
    async fn reasoning_text_comes_as_thinking_under_either_name_once_and_an_object_is_not_read() {
        let chunks = [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"Let me"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning":" think."}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning":{"summary":"x"},"reasoning_content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":" Both","reasoning":" Both"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":null,"content":"Yes."}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        ];
        let body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        let thinking = |t: &str| Ok(Delta::Thinking(Thinking::Text(t.into())));
        assert_eq!(
            replay(&body).await,
            vec![
                thinking("Let me"),
                thinking(" think."),
                thinking(" Both"),
                text("Yes."),
                Ok(Delta::Finish(FinishReason::Stop))
            ]
        );
    }

    #[tokio::test]
    async fn refusal_text_streams_and_finishes_as_refusal() {
        let out = replay(REFUSAL).await;
        assert_eq!(out[0], text("I'm"), "the empty refusal in the role chunk is skipped");
        assert_eq!(out[out.len() - 2], Ok(Delta::Finish(FinishReason::Refusal)));
    }

    #[tokio::test]
    async fn length_fixture_finishes_with_length() {
        let out = replay(LENGTH).await;
        assert_eq!(
            out,
            vec![
                text("{\""),
                Ok(Delta::Finish(FinishReason::Length)),
                usage_with(79, 1, (None, None, Some(0)))
            ]
        );
    }

    #[tokio::test]
    async fn eof_before_finish_reason_is_a_protocol_error() {
        let cut = TEXT.split("data: {\"id\":\"chatcmpl-ABfw031mOJeYCSHe4yI2ZjOA6kMJL\",\"object\":\"chat.completion.chunk\",\"created\":1727346168,\"model\":\"gpt-4o-2024-08-06\",\"system_fingerprint\":\"fp_5050236cbd\",\"choices\":[{\"index\":0,\"delta\":{},").next().unwrap_or("");
        let out = replay(cut).await;
        assert_eq!(out[0], text("I'm"));
        assert_eq!(error_class(&out), Some(ErrorClass::Protocol), "T11: {out:?}");
        let message = out.last().and_then(|r| r.as_ref().err()).map(|e| e.message.clone());
        assert_eq!(message.as_deref(), Some("upstream stream ended before finish_reason"));
    }

    #[tokio::test]
    async fn eof_after_finish_reason_without_done_is_a_normal_end_with_usage() {
        let without_done = TEXT.replace("data: [DONE]\n\n", "");
        let out = replay(&without_done).await;
        assert_eq!(
            out.last(),
            Some(&usage_with(14, 30, (None, None, Some(0)))),
            "no [DONE] is fine after finish_reason"
        );
        let only_finish = TEXT.split("data: {\"id\":\"chatcmpl-ABfw031mOJeYCSHe4yI2ZjOA6kMJL\",\"object\":\"chat.completion.chunk\",\"created\":1727346168,\"model\":\"gpt-4o-2024-08-06\",\"system_fingerprint\":\"fp_5050236cbd\",\"choices\":[],").next().unwrap_or("");
        let out = replay(only_finish).await;
        assert_eq!(
            out.last(),
            Some(&Ok(Delta::Finish(FinishReason::Stop))),
            "no usage, no [DONE]: still fine"
        );
    }

    /// A body whose end arrives `after` the `[DONE]` it follows; `ended` is set once it was
    /// read to its end (as a pooled connection must be, to be reused).
    fn body_ending_later(
        after: Duration,
        ended: Arc<AtomicBool>,
    ) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
        let finish = r#"data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}"#;
        let first = futures::stream::iter([Ok(Bytes::from(format!("{finish}\n\ndata: [DONE]\n\n")))]);
        let end = futures::stream::once(async move {
            tokio::time::sleep(after).await;
            ended.store(true, Ordering::SeqCst);
        })
        .filter_map(|()| async { None });
        first.chain(end)
    }

    #[tokio::test(start_paused = true)]
    async fn an_answered_body_is_read_to_its_end_after_the_reader_is_done() {
        let ended = Arc::new(AtomicBool::new(false));
        let body = body_ending_later(Duration::from_millis(5), Arc::clone(&ended));
        let started = tokio::time::Instant::now();
        let out: Out = drive(body, ChunkDecoder::default()).collect().await;
        assert_eq!(out, vec![text("hi"), Ok(Delta::Finish(FinishReason::Stop))]);
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "the reader never waits for the body's end"
        );
        assert!(!ended.load(Ordering::SeqCst), "not yet: the end is 5 ms away");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            ended.load(Ordering::SeqCst),
            "read to its end, so the connection can be reused"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_never_ends_is_dropped_after_the_drain_bound() {
        let ended = Arc::new(AtomicBool::new(false));
        let body = body_ending_later(Duration::from_secs(3600), Arc::clone(&ended));
        let out: Out = drive(body, ChunkDecoder::default()).collect().await;
        assert_eq!(out.len(), 2, "the answer is whole: {out:?}");
        tokio::time::sleep(crate::provider::DRAIN_FOR * 2).await;
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(
            !ended.load(Ordering::SeqCst),
            "dropped at the bound, never read further"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn silence_after_finish_reason_ends_the_stream_after_the_grace_period() {
        let finish = r#"data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}"#;
        let first = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from(format!("{finish}\n\n")))]);
        let body = first.chain(futures::stream::pending());
        let started = tokio::time::Instant::now();
        let out: Out = drive(body, ChunkDecoder::default()).collect().await;
        assert_eq!(out, vec![text("hi"), Ok(Delta::Finish(FinishReason::Stop))]);
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(1),
            "ends after exactly the grace period"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn events_after_finish_reason_do_not_extend_the_grace_period() {
        let finish = r#"data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}"#;
        let first = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from(format!("{finish}\n\n")))]);
        // An upstream that never sends usage or [DONE] but keeps sending empty chunks.
        let keep_alive = futures::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            Some((Ok(Bytes::from_static(b"data: {\"choices\":[]}\n\n")), ()))
        });
        let started = tokio::time::Instant::now();
        let out: Option<Out> = tokio::time::timeout(
            Duration::from_secs(30),
            drive(first.chain(keep_alive), ChunkDecoder::default()).collect(),
        )
        .await
        .ok();
        assert_eq!(
            out,
            Some(vec![text("hi"), Ok(Delta::Finish(FinishReason::Stop))]),
            "the stream ends although events keep coming"
        );
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(1),
            "the grace is counted from the finish, not from the last event"
        );
    }

    #[tokio::test]
    async fn unknown_finish_reason_after_a_complete_answer_is_a_normal_stop() {
        let stream = concat!(
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Paris.\"},\"finish_reason\":\"\"}]}\n\n",
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"eos_token\"}]}\n\n",
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n",
        );
        let out = replay(stream).await;
        assert_eq!(
            out,
            vec![text("Paris."), Ok(Delta::Finish(FinishReason::Stop)), usage(9, 2)],
            "an empty finish_reason is no finish; an unknown one is a stop, never a failure"
        );
        let refused = replay(concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"refusal\":\"No.\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"safety_stop\"}]}\n\n",
        ))
        .await;
        assert_eq!(
            refused.last(),
            Some(&Ok(Delta::Finish(FinishReason::Refusal))),
            "after refusal text an unknown reason is still a refusal"
        );
    }

    #[tokio::test]
    async fn done_before_finish_reason_is_a_protocol_error() {
        let out = replay("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata:[DONE]\n\n").await;
        assert_eq!(error_class(&out), Some(ErrorClass::Protocol));
    }

    #[tokio::test]
    async fn empty_null_and_missing_choices_are_no_delta() {
        let stream = concat!(
            "data: {\"id\":\"\",\"choices\":[],\"prompt_filter_results\":[]}\n\n",
            "data: {\"choices\":null}\n\n",
            "data: {\"object\":\"chat.completion.chunk\"}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n",
            "data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"other choice\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"never read\"}}]}\n\n",
        );
        let out = replay(stream).await;
        assert_eq!(
            out,
            vec![text("ok"), Ok(Delta::Finish(FinishReason::Stop)), usage(1, 2)],
            "T8/T12, other choices ignored, usage on the finish chunk ends the stream at once"
        );
    }

    #[tokio::test]
    async fn in_band_error_is_classified_and_ends_the_stream() {
        let stream = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
            "data: {\"error\": {\"message\": \"The server had an error\", \"type\": \"server_error\", \"param\": null, \"code\": null}}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n",
        );
        let out = replay(stream).await;
        assert_eq!(out.len(), 2, "nothing after the error: {out:?}");
        assert_eq!(error_class(&out), Some(ErrorClass::Unavailable), "T10");
        let null_error =
            replay("data: {\"error\":null,\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
                .await;
        assert_eq!(
            null_error,
            vec![Ok(Delta::Finish(FinishReason::Stop))],
            "a null error is no error"
        );
    }

    #[tokio::test]
    async fn malformed_json_and_bad_bytes_are_protocol_errors() {
        let out = replay("data: {\"choices\":[\n\n").await;
        assert_eq!(error_class(&out), Some(ErrorClass::Protocol));
        let out = replay_chunks(vec![b"data: {\"x\":\"\xFF\"}\n\n".to_vec()]).await;
        assert_eq!(error_class(&out), Some(ErrorClass::Protocol), "invalid UTF-8");
        let out = replay_chunks(vec![b"\xEF\xBB\xBF".to_vec(), TEXT.as_bytes().to_vec()]).await;
        assert_eq!(out.first(), Some(&text("I'm")), "a leading BOM is fine (T15)");
    }

    #[tokio::test]
    async fn a_ten_megabyte_line_is_a_protocol_error() {
        let mut chunks = vec![b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"".to_vec()];
        chunks.extend(std::iter::repeat_n(vec![b'a'; 64 * 1024], 160));
        let out = replay_chunks(chunks).await;
        assert_eq!(out.len(), 1, "one error, nothing else");
        assert_eq!(error_class(&out), Some(ErrorClass::Protocol));
    }

    #[tokio::test]
    async fn transport_failure_mid_body_is_unavailable() {
        let chunks = vec![
            Ok(Bytes::from_static(
                b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
            )),
            Err(std::io::Error::other("connection reset")),
        ];
        let out: Out = drive(futures::stream::iter(chunks), ChunkDecoder::default())
            .collect()
            .await;
        assert_eq!(out[0], text("a"));
        assert_eq!(error_class(&out), Some(ErrorClass::Unavailable));
    }

    #[tokio::test]
    async fn utf8_split_across_reads_and_any_two_way_split_decode_the_same() {
        let whole = replay(TOOLS).await;
        let bytes = TOOLS.as_bytes();
        for cut in (0..bytes.len()).step_by(7) {
            let out = replay_chunks(vec![bytes[..cut].to_vec(), bytes[cut..].to_vec()]).await;
            assert_eq!(out, whole, "split at {cut}");
        }
        let euro = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"€\"},\"finish_reason\":\"stop\"}]}\n\n"
            .as_bytes();
        let at = euro.iter().position(|b| *b == 0xE2).unwrap_or(0) + 1;
        let out = replay_chunks(vec![euro[..at].to_vec(), euro[at..].to_vec()]).await;
        assert_eq!(out[0], text("€"), "T5");
    }

    #[tokio::test]
    async fn tool_fragments_without_index_get_one_by_appearance() {
        let stream = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"id\":\"a\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"id\":\"b\",\"function\":{\"name\":\"g\",\"arguments\":\"{\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
        );
        let out = replay(stream).await;
        assert_eq!(out[0], fragment(0, Some("a"), Some("f"), "{}"));
        assert_eq!(out[1], fragment(1, Some("b"), Some("g"), "{"));
        assert_eq!(out[2], fragment(1, None, None, "}"), "continues the last call");
    }

    #[tokio::test]
    async fn finish_reason_error_is_unavailable() {
        let out = replay("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"error\"}]}\n\n").await;
        assert_eq!(error_class(&out), Some(ErrorClass::Unavailable));
    }
}
