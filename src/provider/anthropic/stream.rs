//! Anthropic Messages SSE events -> `Delta`s.
//!
//! Dispatch is on the `event:` line, as the official SDKs do (T13), falling back to the data's
//! `type`. Text deltas become `Text` (empty ones never, T12); a `tool_use` block becomes a
//! first `ToolFragment` carrying id and name, one fragment per `input_json_delta`, and a
//! `ToolEnd` at its `content_block_stop` (T6). A `thinking` block becomes `Thinking::Text`
//! pieces and its `Thinking::Signature`, a `redacted_thinking` block one `Thinking::Redacted`;
//! a `citations_delta`'s citation becomes an `Extra` for an Anthropic-wire client; server
//! tool blocks are not read yet (`docs/dialects.md`). Usage is cumulative (T9): input from `message_start`,
//! the last `message_delta` count wins. `message_stop` ends the stream; `stop_reason` alone
//! is enough if the body ends after it. `event: error` is an in-band failure (T10).

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::Value;

use super::types::{EventData, WireUsage};
use crate::provider::sse::SseEvent;
use crate::provider::wire_json::WireStr;
use crate::provider::{classify_in_band, Delta, ErrorClass, Progress, ProviderError, ToolFragment, WireDecoder};
use crate::types::{Extra, ExtraField, FinishReason, RawJson, Thinking, Usage, Wire};

#[derive(Debug, Default)]
pub(crate) struct EventDecoder {
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    /// Indices of open `tool_use` blocks; other blocks' JSON deltas (server tools) are not ours.
    tool_blocks: BTreeSet<u32>,
    /// A non-empty input a block's start carried, by index, until its first delta replaces
    /// it (the deltas are the whole input) or its stop sends it (no delta came).
    start_inputs: BTreeMap<u32, String>,
}

impl WireDecoder for EventDecoder {
    fn on_event(&mut self, event: SseEvent, out: &mut Vec<Delta>) -> Result<Progress, ProviderError> {
        match read_direct(&event) {
            Some((name, data)) => self.dispatch(name, data, out),
            None => self.on_tree(&event, out),
        }
    }

    fn finished(&self) -> bool {
        self.finish.is_some()
    }

    fn on_end(&mut self, out: &mut Vec<Delta>) -> Result<(), ProviderError> {
        if self.finish.is_none() {
            return Err(protocol("upstream stream ended before message_stop".to_string()));
        }
        self.flush_usage(out);
        Ok(())
    }
}

impl EventDecoder {
    /// An error event, or data the direct read refused: read as a tree, as the SDKs do, so a
    /// failure is classified (or refused) from what it says, and data the direct read refuses
    /// only for being unusual (a key sent twice) is still read as it always was.
    fn on_tree(&mut self, event: &SseEvent, out: &mut Vec<Delta>) -> Result<Progress, ProviderError> {
        let value: Value = serde_json::from_str(event.data.as_str())
            .map_err(|e| protocol(format!("upstream sent a malformed event: {e}")))?;
        let name = match event.event.as_deref() {
            Some(name) => name,
            None => value.get("type").and_then(Value::as_str).unwrap_or_default(),
        };
        if name == "error" {
            return Err(classify_in_band(&value));
        }
        let data = EventData::deserialize(&value)
            .map_err(|e| protocol(format!("upstream sent a malformed {name} event: {e}")))?;
        self.dispatch(name, data, out)
    }

    fn dispatch(&mut self, name: &str, data: EventData<'_>, out: &mut Vec<Delta>) -> Result<Progress, ProviderError> {
        match name {
            "message_start" => {
                if let Some(usage) = data.message.and_then(|m| m.usage) {
                    self.record_usage(&usage);
                }
            }
            "content_block_start" if self.finish.is_none() => self.on_block_start(data, out)?,
            "content_block_delta" if self.finish.is_none() => self.on_block_delta(data, out)?,
            "content_block_stop" => {
                if let Some(index) = data.index.filter(|i| self.tool_blocks.remove(i)) {
                    if let Some(arguments) = self.start_inputs.remove(&index) {
                        out.push(Delta::tool(ToolFragment {
                            index,
                            id: None,
                            name: None,
                            arguments,
                        }));
                    }
                    out.push(Delta::ToolEnd { index });
                }
            }
            "message_delta" => {
                if let Some(usage) = &data.usage {
                    self.record_usage(usage);
                }
                let stop_reason = data.delta.and_then(|d| d.stop_reason);
                if let (None, Some(reason)) = (self.finish, stop_reason) {
                    self.finish(stop_reason_of(reason.as_str()), out);
                }
            }
            "message_stop" => {
                if self.finish.is_none() {
                    self.finish(FinishReason::Stop, out);
                }
                self.flush_usage(out);
                return Ok(Progress::End);
            }
            // `ping`, and event types added after this was written.
            _ => {}
        }
        Ok(Progress::More)
    }

    fn on_block_start(&mut self, data: EventData<'_>, out: &mut Vec<Delta>) -> Result<(), ProviderError> {
        let Some(block) = data.content_block else {
            return Ok(());
        };
        match block.kind.as_str() {
            "tool_use" => {
                let index = data
                    .index
                    .ok_or_else(|| protocol("tool_use block without an index".to_string()))?;
                self.tool_blocks.insert(index);
                let given = block
                    .input
                    .filter(|v| !v.is_null() && v.as_object().is_none_or(|m| !m.is_empty()));
                if let Some(input) = given {
                    self.start_inputs.insert(index, input.to_string());
                }
                out.push(Delta::tool(ToolFragment {
                    index,
                    id: block.id.map(WireStr::into_string),
                    name: block.name.map(WireStr::into_string),
                    arguments: String::new(),
                }));
            }
            "text" => {
                if let Some(text) = block.text.filter(|t| !t.is_empty()) {
                    out.push(Delta::Text(text.into_string()));
                }
            }
            "thinking" => {
                if let Some(text) = block.thinking.filter(|t| !t.is_empty()) {
                    out.push(Delta::Thinking(Thinking::Text(text.into_string().into())));
                }
                if let Some(signature) = block.signature.filter(|t| !t.is_empty()) {
                    out.push(Delta::Thinking(Thinking::Signature(signature.into_string().into())));
                }
            }
            "redacted_thinking" => {
                let data = block.data.map(WireStr::into_string).unwrap_or_default();
                out.push(Delta::Thinking(Thinking::Redacted(data.into())));
            }
            _ => {}
        }
        Ok(())
    }

    fn on_block_delta(&mut self, data: EventData<'_>, out: &mut Vec<Delta>) -> Result<(), ProviderError> {
        let Some(delta) = data.delta else {
            return Ok(());
        };
        match delta.kind.as_ref().map(WireStr::as_str) {
            Some("text_delta") => {
                if let Some(text) = delta.text.filter(|t| !t.is_empty()) {
                    out.push(Delta::Text(text.into_string()));
                }
            }
            Some("input_json_delta") => {
                let Some(index) = data.index.filter(|i| self.tool_blocks.contains(i)) else {
                    return Ok(()); // a server tool's input: executed upstream, not a call for the client
                };
                if let Some(json) = delta.partial_json.filter(|j| !j.is_empty()) {
                    self.start_inputs.remove(&index);
                    out.push(Delta::tool(ToolFragment {
                        index,
                        id: None,
                        name: None,
                        arguments: json.into_string(),
                    }));
                }
            }
            Some("thinking_delta") => {
                if let Some(text) = delta.thinking.filter(|t| !t.is_empty()) {
                    out.push(Delta::Thinking(Thinking::Text(text.into_string().into())));
                }
            }
            Some("signature_delta") => {
                if let Some(signature) = delta.signature.filter(|t| !t.is_empty()) {
                    out.push(Delta::Thinking(Thinking::Signature(signature.into_string().into())));
                }
            }
            Some("citations_delta") => {
                if let Some(citation) = delta.citation {
                    out.push(Delta::Extra(Box::new(Extra {
                        wire: Wire::Anthropic,
                        field: ExtraField::Citation,
                        value: RawJson::new(citation.to_owned()),
                    })));
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn finish(&mut self, reason: FinishReason, out: &mut Vec<Delta>) {
        self.finish = Some(reason);
        out.push(Delta::Finish(reason));
    }

    /// Counts are cumulative: overwrite, never add (T9).
    fn record_usage(&mut self, usage: &WireUsage) {
        let current = self.usage.get_or_insert_with(Usage::default);
        let input_parts = [
            usage.input_tokens,
            usage.cache_creation_input_tokens,
            usage.cache_read_input_tokens,
        ];
        if input_parts.iter().any(Option::is_some) {
            current.input_tokens = input_parts.iter().flatten().sum();
            current.cache_write_tokens = usage.cache_creation_input_tokens;
            current.cache_read_tokens = usage.cache_read_input_tokens;
        }
        if let Some(output) = usage.output_tokens {
            current.output_tokens = output;
        }
    }

    fn flush_usage(&mut self, out: &mut Vec<Delta>) {
        if let Some(usage) = self.usage.take() {
            out.push(Delta::Usage(usage));
        }
    }
}

/// The usual path: the data read straight into what is used, its strings borrowed. `None`
/// for an error event and for data it refuses, which `on_tree` then reads.
fn read_direct(event: &SseEvent) -> Option<(&str, EventData<'_>)> {
    if event.event.as_deref() == Some("error") {
        return None;
    }
    let mut data = serde_json::from_str::<EventData<'_>>(event.data.as_str()).ok()?;
    let name = match event.event.as_deref() {
        Some(name) => name,
        // Borrowed from the data only when it held no escape: an escaped type (never sent in
        // practice) is read the slow way.
        None => match data.kind.take()?.0 {
            std::borrow::Cow::Borrowed(kind) => kind,
            std::borrow::Cow::Owned(_) => return None,
        },
    };
    (name != "error").then_some((name, data))
}

fn stop_reason_of(reason: &str) -> FinishReason {
    match reason {
        "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
        "tool_use" => FinishReason::ToolCalls,
        "refusal" => FinishReason::Refusal,
        // end_turn, stop_sequence, pause_turn, and reasons added later.
        _ => FinishReason::Stop,
    }
}

fn protocol(message: String) -> ProviderError {
    ProviderError::new(ErrorClass::Protocol, message)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::provider::testkit::{decode_chunks, error_class, text, usage, usage_with, Out};

    const TEXT: &str = include_str!("../../../tests/fixtures/anthropic/text.sse");
    const TEXT_DOCS: &str = include_str!("../../../tests/fixtures/anthropic/text_docs.sse");
    const TOOL_USE: &str = include_str!("../../../tests/fixtures/anthropic/tool_use.sse");
    const TOOL_USE_DOCS: &str = include_str!("../../../tests/fixtures/anthropic/tool_use_docs.sse");
    const THINKING: &str = include_str!("../../../tests/fixtures/anthropic/thinking.sse");
    const REFUSAL: &str = include_str!("../../../tests/fixtures/anthropic/refusal.sse");
    const ERROR: &str = include_str!("../../../tests/fixtures/anthropic/error.sse");
    const INCOMPLETE: &str = include_str!("../../../tests/fixtures/anthropic/incomplete_partial_json.sse");

    async fn replay_chunks(chunks: Vec<Vec<u8>>) -> Out {
        decode_chunks(EventDecoder::default(), chunks).await
    }

    async fn replay(text: &str) -> Out {
        replay_chunks(vec![text.as_bytes().to_vec()]).await
    }

    fn fragment(index: u32, args: &str) -> Result<Delta, ProviderError> {
        Ok(Delta::tool(ToolFragment {
            index,
            id: None,
            name: None,
            arguments: args.to_string(),
        }))
    }

    fn tool_use_expected() -> Out {
        vec![
            text("I"),
            text("'ll check the current weather in Paris for you."),
            Ok(Delta::tool(ToolFragment {
                index: 1,
                id: Some("toolu_01NRLabsLyVHZPKxbKvkfSMn".into()),
                name: Some("get_weather".into()),
                arguments: String::new(),
            })),
            fragment(1, "{\"locati"),
            fragment(1, "on\": \"P"),
            fragment(1, "ar"),
            fragment(1, "is\"}"),
            Ok(Delta::ToolEnd { index: 1 }),
            Ok(Delta::Finish(FinishReason::ToolCalls)),
            usage_with(377, 65, (Some(0), Some(0), None)),
        ]
    }

    #[tokio::test]
    async fn a_tool_input_given_whole_in_the_block_start_is_the_calls_arguments() {
        let start = |input: &str| {
            format!(
                "event: content_block_start\ndata: {{\"index\":0,\"content_block\":{{\"type\":\"tool_use\",\"id\":\"toolu_I\",\"name\":\"get_weather\",\"input\":{input}}}}}\n\n"
            )
        };
        let stop = concat!(
            "event: content_block_stop\ndata: {\"index\":0}\n\n",
            "event: message_delta\ndata: {\"delta\":{\"stop_reason\":\"tool_use\"}}\n\n",
            "event: message_stop\ndata: {}\n\n",
        );
        let first = Ok(Delta::tool(ToolFragment {
            index: 0,
            id: Some("toolu_I".into()),
            name: Some("get_weather".into()),
            arguments: String::new(),
        }));
        let end = [
            Ok(Delta::ToolEnd { index: 0 }),
            Ok(Delta::Finish(FinishReason::ToolCalls)),
        ];
        // No delta: the start's input is the call's (servers that send it whole).
        let out = replay(&(start("{\"city\":\"Paris\"}") + stop)).await;
        let mut expected = vec![first.clone(), fragment(0, "{\"city\":\"Paris\"}")];
        expected.extend(end.clone());
        assert_eq!(out, expected);
        // Deltas after it are the whole input (Anthropic's API: the start says `{}`).
        let delta = "event: content_block_delta\ndata: {\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\":\\\"Rome\\\"}\"}}\n\n";
        for given in ["{}", "{\"city\":\"Paris\"}"] {
            let out = replay(&(start(given) + delta + stop)).await;
            let mut expected = vec![first.clone(), fragment(0, "{\"city\":\"Rome\"}")];
            expected.extend(end.clone());
            assert_eq!(out, expected, "start input {given}");
        }
        // `{}` and no delta: no arguments fragment (the assembler makes them `{}`).
        let out = replay(&(start("{}") + stop)).await;
        let mut expected = vec![first];
        expected.extend(end);
        assert_eq!(out, expected);
    }

    #[tokio::test]
    async fn text_fixtures_yield_text_finish_and_usage() {
        let out = replay(TEXT).await;
        assert_eq!(
            out,
            vec![
                text("Hello"),
                text(" there"),
                text("!"),
                Ok(Delta::Finish(FinishReason::Stop)),
                usage(11, 6)
            ],
            "empty block start and ping produce nothing (T12); usage is the last count (T9)"
        );
        let docs = replay(TEXT_DOCS).await;
        assert_eq!(
            docs,
            vec![
                text("Hello"),
                text("!"),
                Ok(Delta::Finish(FinishReason::Stop)),
                usage(25, 15)
            ]
        );
    }

    #[tokio::test]
    async fn tool_use_fixture_yields_fragments_and_a_tool_end() {
        assert_eq!(replay(TOOL_USE).await, tool_use_expected());
        let docs = replay(TOOL_USE_DOCS).await;
        let args: String = docs
            .iter()
            .filter_map(|d| match d {
                Ok(Delta::ToolFragment(f)) => Some(f.arguments.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(args, r#"{"location": "San Francisco, CA"}"#);
        assert!(docs.contains(&Ok(Delta::ToolEnd { index: 1 })));
    }

    #[tokio::test]
    async fn thinking_streams_as_thinking_then_its_signature_before_the_text() {
        let out = replay(THINKING).await;
        let thinking = |t: &str| Ok(Delta::Thinking(Thinking::Text(t.into())));
        assert_eq!(
            out,
            vec![
                thinking(
                    "I need to find the GCD of 1071 and 462 using the Euclidean algorithm.\n\n1071 = 2 × 462 + 147"
                ),
                thinking("\n462 = 3 × 147 + 21"),
                thinking("\n147 = 7 × 21 + 0"),
                thinking("\nThe remainder is 0, so GCD(1071, 462) = 21."),
                Ok(Delta::Thinking(Thinking::Signature(
                    "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds...".into()
                ))),
                text("The greatest common divisor of 1071 and 462 is **21**."),
                Ok(Delta::Finish(FinishReason::Stop))
            ],
            "each delta in order, the signature as sent; no usage in this docs example"
        );
    }

    #[tokio::test]
    async fn a_citation_comes_raw_before_the_text_it_cites() {
        let citation =
            r#"{"type":"char_location","cited_text":"x","document_index":0,"start_char_index":0,"end_char_index":1}"#;
        let events = [
            r#"{"type":"message_start","message":{"usage":{"input_tokens":3,"output_tokens":1}}}"#.to_string(),
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.to_string(),
            format!(
                r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"citations_delta","citation":{citation}}}}}"#
            ),
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}"#.to_string(),
            r#"{"type":"message_stop"}"#.to_string(),
        ];
        let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        let out = replay(&body).await;
        match &out[0] {
            Ok(Delta::Extra(e)) => {
                assert_eq!(
                    (e.wire, &e.field, e.value.text()),
                    (Wire::Anthropic, &ExtraField::Citation, citation)
                );
            }
            other => panic!("a citation first: {other:?}"),
        }
        assert_eq!(out[1], text("x"));
    }

    #[tokio::test]
    async fn a_redacted_block_is_one_piece_and_a_block_start_may_carry_its_thinking() {
        let events = [
            r#"{"type":"message_start","message":{"usage":{"input_tokens":3,"output_tokens":1}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"redacted_thinking","data":"EmwKAhgBEgy3va"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"thinking","thinking":"whole","signature":"sig"}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"thinking_delta","thinking":""}}"#,
            r#"{"type":"content_block_stop","index":2}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":9}}"#,
            r#"{"type":"message_stop"}"#,
        ];
        let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        assert_eq!(
            replay(&body).await,
            vec![
                Ok(Delta::Thinking(Thinking::Redacted("EmwKAhgBEgy3va".into()))),
                Ok(Delta::Thinking(Thinking::Text("whole".into()))),
                Ok(Delta::Thinking(Thinking::Signature("sig".into()))),
                Ok(Delta::Finish(FinishReason::Stop)),
                usage(3, 9)
            ],
            "empty thinking is no delta (T12)"
        );
    }

    #[tokio::test]
    async fn refusal_finishes_as_refusal_without_text() {
        assert_eq!(
            replay(REFUSAL).await,
            vec![Ok(Delta::Finish(FinishReason::Refusal)), usage(20, 0)]
        );
    }

    #[tokio::test]
    async fn truncated_tool_call_has_no_tool_end_and_finishes_with_length() {
        let out = replay(INCOMPLETE).await;
        assert!(
            !out.iter().any(|d| matches!(d, Ok(Delta::ToolEnd { .. }))),
            "T7: no content_block_stop for the tool"
        );
        assert_eq!(out[out.len() - 2], Ok(Delta::Finish(FinishReason::Length)));
        assert_eq!(out[out.len() - 1], usage_with(450, 124, (Some(0), Some(0), None)));
    }

    #[tokio::test]
    async fn error_event_is_classified_unavailable() {
        let out = replay(&format!(
            "{}{}",
            TEXT.split("event: content_block_stop").next().unwrap_or(""),
            ERROR
        ))
        .await;
        assert_eq!(out[0], text("Hello"));
        assert_eq!(
            error_class(&out),
            Some(ErrorClass::Unavailable),
            "overloaded_error, T10: {out:?}"
        );
        let rate = replay(
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"x\"}}\n\n",
        )
        .await;
        assert_eq!(error_class(&rate), Some(ErrorClass::RateLimited));
    }

    #[tokio::test]
    async fn unknown_stop_reason_after_a_complete_answer_is_a_normal_stop() {
        let future = TEXT.replace("\"stop_reason\":\"end_turn\"", "\"stop_reason\":\"compaction_needed\"");
        assert_ne!(future, TEXT, "the fixture's stop_reason was replaced");
        assert_eq!(
            replay(&future).await,
            replay(TEXT).await,
            "a stop reason added after this was written ends the answer like end_turn"
        );
        let paused = TEXT.replace("\"stop_reason\":\"end_turn\"", "\"stop_reason\":\"pause_turn\"");
        assert_eq!(
            replay(&paused).await.get(3),
            Some(&Ok(Delta::Finish(FinishReason::Stop))),
            "pause_turn has no OpenAI equivalent: stop (§9.3)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pings_after_stop_reason_do_not_hold_the_stream_open() {
        use futures::StreamExt;
        let head = TEXT.split("event: message_stop").next().unwrap_or("").to_string();
        let first = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from(head))]);
        let pings = futures::stream::unfold((), |()| async {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            Some((
                Ok(bytes::Bytes::from_static(
                    b"event: ping\ndata: {\"type\": \"ping\"}\n\n",
                )),
                (),
            ))
        });
        let out: Option<Out> = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            crate::provider::drive(first.chain(pings), EventDecoder::default()).collect(),
        )
        .await
        .ok();
        assert_eq!(
            out.as_ref().and_then(|o| o.last()),
            Some(&usage(11, 6)),
            "ends within the grace after stop_reason, usage kept: {out:?}"
        );
    }

    #[tokio::test]
    async fn eof_before_message_stop_is_a_protocol_error_unless_stop_reason_arrived() {
        let cut = TEXT.split("event: message_delta").next().unwrap_or("");
        let out = replay(cut).await;
        assert_eq!(error_class(&out), Some(ErrorClass::Protocol), "T11");
        let cut = TEXT.split("event: message_stop").next().unwrap_or("");
        let out = replay(cut).await;
        assert_eq!(out.last(), Some(&usage(11, 6)), "stop_reason then EOF is a normal end");
    }

    #[tokio::test]
    async fn dispatch_follows_the_event_line_then_the_data_type() {
        let without_event_lines: String = TEXT
            .lines()
            .filter(|l| !l.starts_with("event:"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            replay(&without_event_lines).await,
            replay(TEXT).await,
            "data.type fallback"
        );
        let mislabeled = "event: ping\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n";
        let out = replay(&format!(
            "{mislabeled}event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
        ))
        .await;
        assert_eq!(
            out,
            vec![Ok(Delta::Finish(FinishReason::Stop))],
            "the event line wins (T13)"
        );
    }

    #[tokio::test]
    async fn leading_bom_and_crlf_are_fine() {
        let crlf = format!("\u{feff}{}", TOOL_USE.replace('\n', "\r\n"));
        assert_eq!(replay(&crlf).await, tool_use_expected(), "T15 and CRLF");
    }

    #[tokio::test]
    async fn tool_use_fixture_split_at_every_offset_yields_the_same_deltas() {
        let bytes = TOOL_USE.as_bytes();
        for cut in 0..=bytes.len() {
            let out = replay_chunks(vec![bytes[..cut].to_vec(), bytes[cut..].to_vec()]).await;
            assert_eq!(out, tool_use_expected(), "split at byte {cut}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn tool_use_fixture_in_arbitrary_chunks_yields_the_same_deltas(cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12)) {
            let bytes = TOOL_USE.as_bytes();
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
            points.sort_unstable();
            let mut chunks = Vec::new();
            let mut start = 0;
            for p in points {
                chunks.push(bytes[start..p].to_vec());
                start = p;
            }
            chunks.push(bytes[start..].to_vec());
            let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build();
            let runtime = runtime.map_err(|e| TestCaseError::fail(e.to_string()))?;
            let out = runtime.block_on(replay_chunks(chunks));
            prop_assert_eq!(out, tool_use_expected());
        }
    }

    /// What one event did: its progress (or failure) and its deltas.
    type Step = (Result<Progress, String>, Vec<Delta>);

    /// Every event of `stream` through `on_event` and, on a second decoder, through the tree
    /// reading alone (what `on_event` did for every event before the direct read).
    fn both_ways(stream: &str) -> (Vec<Step>, Vec<Step>) {
        let mut sse = crate::provider::sse::SseDecoder::new(crate::provider::sse::SseLimits::default());
        sse.push(stream.as_bytes());
        let (mut direct, mut tree) = (EventDecoder::default(), EventDecoder::default());
        let (mut a, mut b) = (Vec::new(), Vec::new());
        while let Ok(Some(event)) = sse.next_event() {
            let mut out = Vec::new();
            let progress = direct
                .on_event(event.clone(), &mut out)
                .map_err(|e| format!("{:?}: {}", e.class, e.message));
            a.push((progress, out));
            let mut out = Vec::new();
            let progress = tree
                .on_tree(&event, &mut out)
                .map_err(|e| format!("{:?}: {}", e.class, e.message));
            b.push((progress, out));
        }
        (a, b)
    }

    #[test]
    fn the_direct_read_decodes_every_event_as_the_tree_reading_did() {
        let tricky = concat!(
            // Dispatch on the data's type when there is no event line (T13), escapes decoded.
            "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"a\\nb\\u00e9\"}}\n\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\\\"q\\\" \\ud83d\\ude00\"}}\n\n",
            "data: {\"type\":\"content_block_\\u0064elta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"escaped type\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"ping\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"line wins\"}}\n\n",
            // A key sent twice: the tree reading keeps the last one, and so must we.
            "event: content_block_delta\ndata: {\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"first\"},\"delta\":{\"type\":\"text_delta\",\"text\":\"last\"}}\n\n",
            // Unknown fields, types and blocks pass; wrong types are refused with the event's name.
            "event: content_block_start\ndata: {\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{}},\"extra\":[1,{\"a\":null}]}\n\n",
            "event: content_block_delta\ndata: {\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"ci\"}}\n\n",
            "event: content_block_delta\ndata: {\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"server tool\"}}\n\n",
            "event: content_block_delta\ndata: {\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hm\"}}\n\n",
            "event: content_block_stop\ndata: {\"index\":1}\n\n",
            "event: future_event\ndata: {\"anything\":true}\n\n",
            "data: {\"no_type\":1}\n\n",
            "data: {\"type\":5}\n\n",
            "event: content_block_delta\ndata: {\"index\":\"0\"}\n\n",
            "event: message_delta\ndata: {\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":7}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let errors = [
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
            "data: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"slow down\"}}\n\n",
            "event: error\ndata: not json\n\n",
            "data: {\"type\":\"message_start\",\n\n",
            "event: message_start\ndata: {\"message\":{\"usage\":{\"input_tokens\":-1}}}\n\n",
        ];
        let streams = [
            TEXT,
            TEXT_DOCS,
            TOOL_USE,
            TOOL_USE_DOCS,
            THINKING,
            REFUSAL,
            ERROR,
            INCOMPLETE,
            tricky,
        ];
        for stream in streams.into_iter().chain(errors) {
            let (direct, tree) = both_ways(stream);
            assert!(!direct.is_empty(), "{stream}");
            assert_eq!(direct, tree, "{stream}");
        }
        let (direct, _) = both_ways(tricky);
        assert_eq!(
            direct[4].1,
            vec![Delta::Text("last".into())],
            "the last of two keys, as before"
        );
        assert_eq!(direct[0].1, vec![Delta::Text("a\nbé".into())], "escapes decoded");
    }
}
