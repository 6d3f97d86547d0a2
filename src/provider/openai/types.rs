//! OpenAI Chat Completions wire types: the request body we send and the chunks we read.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use smallvec::SmallVec;

use crate::provider::wire_json::{Truthy, WireStr};

// ---- request ----

#[derive(Debug, Serialize)]
pub struct ChatBody {
    pub model: String,
    pub messages: Vec<WireMessage>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<WireTool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// What reasoning models take instead of `max_tokens` (`TokenParameter`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// An Anthropic client's `metadata.user_id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    pub stream: bool,
    pub stream_options: StreamOptions,
    /// vLLM: continue the final assistant message inside its turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continue_final_message: Option<bool>,
    /// vLLM: `false` with `continue_final_message`, so no new assistant turn is opened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub add_generation_prompt: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct StreamOptions {
    pub include_usage: bool,
}

#[derive(Debug, Serialize)]
pub struct WireMessage {
    pub role: &'static str,
    /// `null` for an assistant message that only calls tools.
    pub content: Option<WireContent>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<WireToolCall>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// DeepSeek / Mistral: continue this (final, assistant) message instead of answering it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub prefix: bool,
}

/// Plain text as a string; anything with images as an array of parts.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum WireContent {
    Text(String),
    Parts(Vec<WirePart>),
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WirePart {
    Text { text: String },
    ImageUrl { image_url: ImageUrl },
}

#[derive(Debug, Serialize)]
pub struct ImageUrl {
    pub url: String,
}

#[derive(Debug, Serialize)]
pub struct WireToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: WireFunctionCall,
}

#[derive(Debug, Serialize)]
pub struct WireFunctionCall {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Serialize)]
pub struct WireTool {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: WireFunction,
}

#[derive(Debug, Serialize)]
pub struct WireFunction {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub parameters: Value,
}

// ---- stream ----

/// One `chat.completion.chunk`, as much of it as the decoder reads: every other field (`id`,
/// `object`, `model`, `logprobs`, ...) is skipped unread. Every field is optional: usage
/// chunks have no choices, Azure's first chunk has empty ones, vLLM may send `null` (T8). We
/// never ask for `n > 1`, so the one choice is kept inline: no allocation for the list per
/// upstream chunk. Strings borrow from the event's data unless they hold an escape.
#[derive(Debug, Default, Deserialize)]
pub struct Chunk<'a> {
    #[serde(default, borrow)]
    pub choices: Option<SmallVec<[Choice<'a>; 1]>>,
    #[serde(default)]
    pub usage: Option<WireUsage>,
    /// A truthy top-level `error` is an in-band failure (T10); only then is the event parsed
    /// again to read it.
    #[serde(default)]
    pub error: Option<Truthy>,
    /// Fields carried to an OpenAI-wire client as sent (`types::Extra`).
    #[serde(default, borrow)]
    pub system_fingerprint: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub service_tier: Option<&'a RawValue>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Choice<'a> {
    #[serde(default)]
    pub index: u32,
    #[serde(default, borrow)]
    pub delta: Option<ChoiceDelta<'a>>,
    #[serde(default, borrow)]
    pub finish_reason: Option<WireStr<'a>>,
    /// The log-probabilities of this chunk's tokens, as sent (`types::ExtraField::Logprobs`).
    #[serde(default, borrow)]
    pub logprobs: Option<&'a RawValue>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ChoiceDelta<'a> {
    #[serde(default, borrow)]
    pub content: Option<WireStr<'a>>,
    #[serde(default, borrow)]
    pub refusal: Option<WireStr<'a>>,
    /// An OpenAI-compatible server's reasoning text: `reasoning_content` (DeepSeek, older
    /// vLLM, llama.cpp) or `reasoning` (vLLM since 2025, OpenRouter). Read raw: a server that
    /// puts an object there has its chunk read all the same (only a string is reasoning text).
    #[serde(default, borrow)]
    pub reasoning_content: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub reasoning: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub tool_calls: Option<Vec<ToolCallDelta<'a>>>,
    /// The deprecated single-call form (no index).
    #[serde(default, borrow)]
    pub function_call: Option<FunctionDelta<'a>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ToolCallDelta<'a> {
    /// Required by OpenAI; some compatible servers omit it (§1.14).
    #[serde(default)]
    pub index: Option<u32>,
    #[serde(default, borrow)]
    pub id: Option<WireStr<'a>>,
    #[serde(default, borrow)]
    pub function: Option<FunctionDelta<'a>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct FunctionDelta<'a> {
    #[serde(default, borrow)]
    pub name: Option<WireStr<'a>>,
    #[serde(default, borrow)]
    pub arguments: Option<WireStr<'a>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct WireUsage {
    #[serde(default)]
    pub prompt_tokens: u32,
    #[serde(default)]
    pub completion_tokens: u32,
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    pub completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Debug, Deserialize)]
pub struct PromptDetails {
    #[serde(default)]
    pub cached_tokens: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionDetails {
    #[serde(default)]
    pub reasoning_tokens: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_with_one_choice_keeps_it_inline() {
        let data = r#"{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}"#;
        let chunk: Chunk = serde_json::from_str(data).unwrap_or_default();
        let choices = chunk.choices.unwrap_or_default();
        assert_eq!(choices.len(), 1);
        assert!(!choices.spilled(), "one choice must not allocate a list");
        assert_eq!(
            choices[0]
                .delta
                .as_ref()
                .and_then(|d| d.content.as_ref())
                .map(WireStr::as_str),
            Some("hi")
        );
    }

    #[test]
    fn extra_choices_are_still_read_in_order() {
        let data = r#"{"choices":[{"index":1,"delta":{"content":"b"}},{"index":0,"delta":{"content":"a"}}]}"#;
        let chunk: Chunk = serde_json::from_str(data).unwrap_or_default();
        let indices: Vec<u32> = chunk.choices.into_iter().flatten().map(|c| c.index).collect();
        assert_eq!(indices, [1, 0]);
    }

    /// The chunk types as they were before strings were borrowed and `error` was only tested
    /// for truthiness: the new ones must read every chunk exactly as these did.
    mod before {
        use serde::Deserialize;
        use serde_json::Value;
        use smallvec::SmallVec;

        #[derive(Debug, Default, Deserialize)]
        pub struct Chunk {
            #[serde(default)]
            pub choices: Option<SmallVec<[Choice; 1]>>,
            #[serde(default)]
            pub usage: Option<super::WireUsage>,
            #[serde(default)]
            pub error: Option<Value>,
        }

        #[derive(Debug, Default, Deserialize)]
        pub struct Choice {
            #[serde(default)]
            pub index: u32,
            #[serde(default)]
            pub delta: Option<ChoiceDelta>,
            #[serde(default)]
            pub finish_reason: Option<String>,
        }

        #[derive(Debug, Default, Deserialize)]
        pub struct ChoiceDelta {
            #[serde(default)]
            pub content: Option<String>,
            #[serde(default)]
            pub refusal: Option<String>,
            #[serde(default)]
            pub tool_calls: Option<Vec<ToolCallDelta>>,
            #[serde(default)]
            pub function_call: Option<FunctionDelta>,
        }

        #[derive(Debug, Default, Deserialize)]
        pub struct ToolCallDelta {
            #[serde(default)]
            pub index: Option<u32>,
            #[serde(default)]
            pub id: Option<String>,
            #[serde(default)]
            pub function: Option<FunctionDelta>,
        }

        #[derive(Debug, Default, Deserialize)]
        pub struct FunctionDelta {
            #[serde(default)]
            pub name: Option<String>,
            #[serde(default)]
            pub arguments: Option<String>,
        }

        pub fn is_truthy(value: &Value) -> bool {
            !matches!(value, Value::Null | Value::Bool(false))
                && value.as_str() != Some("")
                && value.as_object().is_none_or(|o| !o.is_empty())
        }
    }

    type Function = (Option<String>, Option<String>);
    type Call = (Option<u32>, Option<String>, Option<Function>);
    type Read = (
        Vec<(
            u32,
            Option<(Option<String>, Option<String>, Option<Vec<Call>>, Option<Function>)>,
            Option<String>,
        )>,
        Option<bool>,
        Option<(u32, u32)>,
        bool,
    );

    /// Everything the decoder takes from a chunk read the old way, or `None` if it was refused.
    fn read_before(data: &str) -> Option<Read> {
        let c: before::Chunk = serde_json::from_str(data).ok()?;
        let function = |f: before::FunctionDelta| (f.name, f.arguments);
        let choices = c.choices.map(|list| {
            list.into_iter()
                .map(|ch| {
                    let delta = ch.delta.map(|d| {
                        let calls = d.tool_calls.map(|calls| {
                            calls
                                .into_iter()
                                .map(|t| (t.index, t.id, t.function.map(function)))
                                .collect()
                        });
                        (d.content, d.refusal, calls, d.function_call.map(function))
                    });
                    (ch.index, delta, ch.finish_reason)
                })
                .collect::<Vec<_>>()
        });
        Some((
            choices.clone().unwrap_or_default(),
            choices.map(|_| true),
            c.usage.map(|u| (u.prompt_tokens, u.completion_tokens)),
            c.error.as_ref().is_some_and(before::is_truthy),
        ))
    }

    /// The same, read with today's types.
    fn read_now(data: &str) -> Option<Read> {
        let c: Chunk<'_> = serde_json::from_str(data).ok()?;
        let s = |w: WireStr<'_>| w.into_string();
        let function = |f: FunctionDelta<'_>| (f.name.map(s), f.arguments.map(s));
        let choices = c.choices.map(|list| {
            list.into_iter()
                .map(|ch| {
                    let delta = ch.delta.map(|d| {
                        let calls = d.tool_calls.map(|calls| {
                            calls
                                .into_iter()
                                .map(|t| (t.index, t.id.map(s), t.function.map(function)))
                                .collect()
                        });
                        (d.content.map(s), d.refusal.map(s), calls, d.function_call.map(function))
                    });
                    (ch.index, delta, ch.finish_reason.map(s))
                })
                .collect::<Vec<_>>()
        });
        Some((
            choices.clone().unwrap_or_default(),
            choices.map(|_| true),
            c.usage.map(|u| (u.prompt_tokens, u.completion_tokens)),
            c.error.is_some_and(|t| t.0),
        ))
    }

    #[test]
    fn every_fixture_chunk_and_tricky_case_reads_as_before() {
        let fixtures = [
            include_str!("../../../tests/fixtures/openai/text.sse"),
            include_str!("../../../tests/fixtures/openai/tool_calls_parallel.sse"),
            include_str!("../../../tests/fixtures/openai/tool_call_single.sse"),
            include_str!("../../../tests/fixtures/openai/refusal.sse"),
            include_str!("../../../tests/fixtures/openai/length.sse"),
        ];
        let mut cases: Vec<&str> = fixtures
            .iter()
            .flat_map(|f| f.lines())
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| d.starts_with('{'))
            .collect();
        cases.extend([
            // T8: empty, null and missing choices; Azure's filter results.
            r#"{"id":"","choices":[],"created":0,"model":"","object":"","prompt_filter_results":[{"prompt_index":0}]}"#,
            r#"{"choices":null,"usage":{"prompt_tokens":3,"completion_tokens":4}}"#,
            r#"{"object":"chat.completion.chunk"}"#,
            // T12: role-only and empty deltas.
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"refusal":""}}]}"#,
            // Escapes: decoded, so owned, and equal to what `String` read.
            r#"{"choices":[{"index":0,"delta":{"content":"a\nb\"c\\d\u00e9\ud83d\ude00"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"ci"}}]}}]}"#,
            // T1-T3: first fragments with id and name, a missing index, parallel calls.
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":""}},{"index":1,"id":"b","function":{"name":"g"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"function_call":{"name":"legacy","arguments":"{}"}},"finish_reason":"function_call"}]}"#,
            // T10: errors of every truthiness.
            r#"{"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}"#,
            r#"{"error":null,"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"error":{}}"#,
            r#"{"error":""}"#,
            r#"{"error":false}"#,
            r#"{"error":0}"#,
            r#"{"error":[]}"#,
            r#"{"error":"rate limited"}"#,
            // Finish reasons, empty ones, other choices.
            r#"{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":""}]}"#,
            r#"{"choices":[{"index":1,"delta":{"content":"b"}},{"index":0,"delta":{"content":"a"},"finish_reason":"eos_token"}]}"#,
            // Refused the same way: wrong types, duplicate fields, bad escapes, bad JSON.
            r#"{"choices":[{"index":0,"delta":{"content":5}}]}"#,
            r#"{"choices":[{"index":-1,"delta":{"content":"x"}}]}"#,
            r#"{"choices":{"index":0}}"#,
            r#"{"choices":[],"choices":[]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"a","content":"b"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"\ud800"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"\x"}}]}"#,
            r#"{"usage":{"prompt_tokens":1.5}}"#,
            r#"{"choices":["#,
            "[]",
            "null",
        ]);
        for case in cases {
            assert_eq!(read_now(case), read_before(case), "{case}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_chunk_reads_as_before(value in arb_chunk()) {
            let text = value.to_string();
            proptest::prop_assert_eq!(read_now(&text), read_before(&text), "{}", text);
        }
    }

    /// Chunks of the real shape with every field present, missing, `null`, empty or of the
    /// wrong type, strings with and without escapes, and unknown fields beside them.
    fn arb_chunk() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let text = prop_oneof![
            Just(Value::Null),
            Just(Value::from("")),
            "[a-z \"\\\\\n\té€😀{}]{0,12}".prop_map(Value::from),
            any::<u8>().prop_map(Value::from),
            Just(Value::Bool(false)),
        ];
        let maybe = |v: BoxedStrategy<Value>| prop_oneof![Just(None), v.prop_map(Some)].boxed();
        let object = |fields: Vec<(&'static str, BoxedStrategy<Option<Value>>)>| {
            fields
                .into_iter()
                .map(|(k, v)| v.prop_map(move |v| v.map(|v| (k.to_string(), v))))
                .collect::<Vec<_>>()
                .prop_map(|pairs| Value::Object(pairs.into_iter().flatten().collect()))
        };
        let index = prop_oneof![
            Just(Value::from(0)),
            Just(Value::from(1)),
            Just(Value::Null),
            Just(Value::from("0"))
        ]
        .boxed();
        let function = object(vec![
            ("name", maybe(text.clone().boxed())),
            ("arguments", maybe(text.clone().boxed())),
        ])
        .boxed();
        let call = object(vec![
            ("index", maybe(index.clone())),
            ("id", maybe(text.clone().boxed())),
            ("type", maybe(Just(Value::from("function")).boxed())),
            ("function", maybe(function.clone())),
        ]);
        let delta = object(vec![
            ("role", maybe(Just(Value::from("assistant")).boxed())),
            ("content", maybe(text.clone().boxed())),
            ("refusal", maybe(text.clone().boxed())),
            (
                "tool_calls",
                maybe(prop::collection::vec(call, 0..3).prop_map(Value::from).boxed()),
            ),
            ("function_call", maybe(function)),
        ]);
        let choice = object(vec![
            ("index", maybe(index)),
            (
                "delta",
                maybe(prop_oneof![delta.boxed(), Just(Value::Null).boxed()].boxed()),
            ),
            ("logprobs", maybe(Just(Value::Null).boxed())),
            ("finish_reason", maybe(text.clone().boxed())),
        ]);
        let usage = object(vec![
            ("prompt_tokens", maybe(any::<u16>().prop_map(Value::from).boxed())),
            ("completion_tokens", maybe(any::<u16>().prop_map(Value::from).boxed())),
        ]);
        let error = prop_oneof![
            text.boxed(),
            Just(serde_json::json!({})),
            Just(serde_json::json!({"message": "m", "type": "server_error"})),
            Just(serde_json::json!([])),
        ];
        object(vec![
            ("id", maybe(Just(Value::from("chatcmpl-1")).boxed())),
            ("object", maybe(Just(Value::from("chat.completion.chunk")).boxed())),
            ("created", maybe(Just(Value::from(1727346168u64)).boxed())),
            (
                "choices",
                maybe(
                    prop_oneof![
                        prop::collection::vec(choice, 0..3).prop_map(Value::from).boxed(),
                        Just(Value::Null).boxed()
                    ]
                    .boxed(),
                ),
            ),
            (
                "usage",
                maybe(prop_oneof![usage.boxed(), Just(Value::Null).boxed()].boxed()),
            ),
            ("error", maybe(error.boxed())),
            (
                "prompt_filter_results",
                maybe(Just(serde_json::json!([{"prompt_index": 0, "content_filter_results": {}}])).boxed()),
            ),
        ])
    }
}
