//! Reasoning on the wire: Anthropic thinking blocks (streamed and whole, signed, cut by
//! faults, replayed in a tool loop), OpenAI-compatible `reasoning_content` deltas, and the
//! reasoning tokens of OpenAI's reasoning models.

use super::*;

fn thinking_body(stream: bool) -> Value {
    json!({"model": "claude-sonnet-4-5", "stream": stream, "max_tokens": 4096,
           "thinking": {"type": "enabled", "budget_tokens": 2048},
           "messages": [{"role": "user", "content": "What is the GCD of 1071 and 462?"}]})
}

/// The thinking text and signature a stream's thinking block carried.
fn thinking_of(events: &[(String, Value)]) -> (String, String) {
    let thinking = events
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "thinking_delta")
        .filter_map(|(_, d)| d["delta"]["thinking"].as_str())
        .collect();
    let signature = events
        .iter()
        .find(|(_, d)| d["delta"]["type"] == "signature_delta")
        .and_then(|(_, d)| d["delta"]["signature"].as_str())
        .unwrap_or_default()
        .to_owned();
    (thinking, signature)
}

#[tokio::test]
async fn a_thinking_stream_opens_with_a_signed_thinking_block_and_shifts_the_text_block() {
    let handle = sim(vec![("s", quick("The GCD is 21."))]).await;
    let response = anthropic(&handle, "s", thinking_body(true)).await;
    assert_eq!(response.status(), 200, "status");
    let events = anthropic_events(&body_text(response).await);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let deltas = 6;
    let mut want = vec!["message_start", "content_block_start", "ping"];
    want.extend(std::iter::repeat_n("content_block_delta", deltas + 1));
    want.extend(["content_block_stop", "content_block_start"]);
    want.extend(std::iter::repeat_n("content_block_delta", 4));
    want.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, want, "the §3.4 sequence");
    assert_eq!(
        events[1].1,
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        "the thinking block opens empty at index 0"
    );
    let thinking: Vec<&Value> = events[3..3 + deltas].iter().map(|(_, d)| d).collect();
    assert!(
        thinking
            .iter()
            .all(|d| d["index"] == 0 && d["delta"]["type"] == "thinking_delta"),
        "thinking deltas at index 0: {thinking:?}"
    );
    let signature = &events[3 + deltas].1;
    assert_eq!(
        signature["delta"]["type"], "signature_delta",
        "one signature just before the stop"
    );
    assert_eq!(events[4 + deltas].1["index"], 0, "the thinking block stops");
    assert_eq!(
        events[5 + deltas].1,
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        "the text block is index 1"
    );
    let text: Vec<&Value> = events
        .iter()
        .map(|(_, d)| d)
        .filter(|d| d["delta"]["type"] == "text_delta")
        .collect();
    assert!(text.iter().all(|d| d["index"] == 1), "text at index 1");
    let answer: String = text.iter().filter_map(|d| d["delta"]["text"].as_str()).collect();
    assert_eq!(answer, "The GCD is 21.", "the answer after the thinking");
    let (words, sig) = thinking_of(&events);
    assert!(
        words.starts_with("The request asks: \"What is the GCD"),
        "from the prompt: {words}"
    );
    let usage = &events[events.len() - 2].1["usage"];
    assert_eq!(usage["output_tokens"], 6 + 4, "thinking tokens count: {usage}");
    let record = &handle.log()[0];
    assert_eq!(record.tokens_sent, 10, "so does the record");

    let again = anthropic_events(&body_text(anthropic(&handle, "s", thinking_body(true)).await).await);
    assert_eq!(
        thinking_of(&again),
        (words, sig),
        "the same prompt thinks and signs the same"
    );
    handle.shutdown();
}

#[tokio::test]
async fn a_thinking_answer_replays_in_a_tool_loop_and_a_forged_one_is_refused() {
    let handle = sim(vec![("tool", tool_scenario())]).await;
    let tools = json!([{"name": "get_weather", "input_schema": {"type": "object"}}]);
    let mut first = thinking_body(true);
    first["tools"] = tools.clone();
    let events = anthropic_events(&body_text(anthropic(&handle, "tool", first.clone()).await).await);
    let tool_start = events
        .iter()
        .find(|(_, d)| d["content_block"]["type"] == "tool_use")
        .map(|(_, d)| d.clone())
        .unwrap_or_else(|| panic!("a tool_use block: {events:?}"));
    assert_eq!(tool_start["index"], 1, "the tool block follows the thinking block");
    let (thinking, signature) = thinking_of(&events);
    let tool_id = tool_start["content_block"]["id"].clone();
    let replay = |thinking: &str, signature: &str| {
        let mut body = first.clone();
        body["messages"] = json!([
            first["messages"][0],
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": thinking, "signature": signature},
                {"type": "tool_use", "id": tool_id, "name": "get_weather", "input": {"city": "Paris"}}
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": "21C"}]}
        ]);
        body
    };
    let response = anthropic(&handle, "tool", replay(&thinking, &signature)).await;
    assert_eq!(response.status(), 200, "the block replayed byte for byte is taken");
    let edited = anthropic(&handle, "tool", replay(&format!("{thinking} "), &signature)).await;
    assert_eq!(edited.status(), 400, "an edited block is refused");
    let body = parse(&body_text(edited).await);
    assert_eq!(body["type"], "error", "Anthropic's envelope: {body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(
        body["error"]["message"], "messages.1.content.0: Invalid `signature` in `thinking` block",
        "{body}"
    );
    let mut dropped = replay(&thinking, &signature);
    if let Some(blocks) = dropped["messages"][1]["content"].as_array_mut() {
        blocks.remove(0);
    }
    let response = anthropic(&handle, "tool", dropped).await;
    assert_eq!(response.status(), 400, "a tool loop without its thinking block");
    let body = parse(&body_text(response).await);
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(
            "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `tool_use`."
        ),
        "{message}"
    );
    let statuses: Vec<u16> = handle.log().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 400, 400], "refusals are logged with their status");
    handle.shutdown();
}

#[tokio::test]
async fn a_non_streaming_thinking_answer_carries_the_block_with_its_signature() {
    let with_redacted = Scenario {
        thinking: Thinking {
            redacted: true,
            ..Thinking::default()
        },
        ..quick("Twenty-one.")
    };
    let handle = sim(vec![("s", quick("Twenty-one.")), ("r", with_redacted)]).await;
    let body = parse(&body_text(anthropic(&handle, "s", thinking_body(false)).await).await);
    let content = body["content"].as_array().cloned().unwrap_or_default();
    assert_eq!(content.len(), 2, "thinking then text: {body}");
    assert_eq!(content[0]["type"], "thinking", "{body}");
    let streamed = anthropic_events(&body_text(anthropic(&handle, "s", thinking_body(true)).await).await);
    let (thinking, signature) = thinking_of(&streamed);
    assert_eq!(
        content[0]["thinking"],
        thinking.as_str(),
        "the same thinking as streamed"
    );
    assert_eq!(content[0]["signature"], signature.as_str(), "and the same signature");
    assert_eq!(content[1], json!({"type": "text", "text": "Twenty-one."}), "{body}");
    assert_eq!(body["usage"]["output_tokens"], 6 + 1, "{body}");

    let body = parse(&body_text(anthropic(&handle, "r", thinking_body(false)).await).await);
    assert_eq!(
        body["content"][1]["type"], "redacted_thinking",
        "a redacted block: {body}"
    );
    let events = anthropic_events(&body_text(anthropic(&handle, "r", thinking_body(true)).await).await);
    let redacted: Vec<&Value> = events
        .iter()
        .filter(|(_, d)| d["content_block"]["type"] == "redacted_thinking")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(redacted.len(), 1, "streamed whole in its block start: {events:?}");
    assert_eq!(redacted[0]["index"], 1, "after the thinking block");
    assert_eq!(
        redacted[0]["content_block"]["data"], body["content"][1]["data"],
        "the same data"
    );
    let text_start = events
        .iter()
        .find(|(_, d)| d["content_block"]["type"] == "text")
        .map(|(_, d)| d["index"].clone());
    assert_eq!(text_start, Some(json!(2)), "the text block shifts past both");
    handle.shutdown();
}

#[tokio::test]
async fn display_omitted_sends_only_the_signature_but_bills_the_thinking() {
    let handle = sim(vec![("s", quick("Done."))]).await;
    let mut body = thinking_body(true);
    body["thinking"]["display"] = json!("omitted");
    let events = anthropic_events(&body_text(anthropic(&handle, "s", body).await).await);
    assert!(
        !events.iter().any(|(_, d)| d["delta"]["type"] == "thinking_delta"),
        "no thinking deltas"
    );
    let (thinking, signature) = thinking_of(&events);
    assert!(thinking.is_empty() && !signature.is_empty(), "a signature alone");
    assert_eq!(events[events.len() - 2].1["usage"]["output_tokens"], 6 + 1, "billed");
    handle.shutdown();
}

#[tokio::test]
async fn a_fault_after_n_tokens_can_cut_inside_the_thinking_block() {
    let drops = Scenario {
        failure: Failure {
            drop_after_tokens: Some(2),
            ..Failure::default()
        },
        ..quick("The answer.")
    };
    let handle = sim(vec![("drop", drops)]).await;
    let (raw, broken) = read_body(anthropic(&handle, "drop", thinking_body(true)).await).await;
    assert!(broken, "dropped: {raw}");
    let events = anthropic_events(&raw);
    let thinking = events
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "thinking_delta")
        .count();
    assert_eq!(thinking, 2, "two thinking deltas are two tokens: {raw}");
    assert!(!raw.contains("text_delta"), "no answer text yet: {raw}");
    assert_eq!(
        handle.log()[0].first_token_at_ms,
        None,
        "thinking is not the answer's first token"
    );
    handle.shutdown();
}

#[tokio::test]
async fn without_thinking_the_stream_is_as_before_with_zero_cache_fields() {
    let handle = sim(vec![("s", quick("Hi."))]).await;
    let mut body = thinking_body(true);
    body["thinking"] = json!({"type": "disabled"});
    let events = anthropic_events(&body_text(anthropic(&handle, "s", body).await).await);
    assert_eq!(events[1].1["content_block"]["type"], "text", "no thinking block");
    let usage = &events[0].1["message"]["usage"];
    assert_eq!(usage["cache_creation_input_tokens"], 0, "{usage}");
    assert_eq!(usage["cache_read_input_tokens"], 0, "{usage}");
    handle.shutdown();
}

#[tokio::test]
async fn a_reasoner_model_streams_reasoning_content_before_the_content() {
    let vllm = Scenario {
        thinking: Thinking {
            openai: OpenAiReasoning::Reasoning,
            ..Thinking::default()
        },
        ..quick("Paris.")
    };
    let handle = sim(vec![("s", quick("Paris.")), ("vllm", vllm)]).await;
    let mut body = chat_body(true);
    body["model"] = json!("deepseek-reasoner");
    body["stream_options"] = json!({"include_usage": true});
    let chunks = events_json(&body_text(openai(&handle, "s", body.clone()).await).await);
    let reasoning: Vec<usize> = (0..chunks.len())
        .filter(|&i| chunks[i]["choices"][0]["delta"]["reasoning_content"].is_string())
        .collect();
    let content: Vec<usize> = (0..chunks.len())
        .filter(|&i| {
            chunks[i]["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        })
        .collect();
    assert_eq!(reasoning.len(), 6, "six reasoning chunks: {chunks:?}");
    assert!(
        reasoning.iter().max() < content.iter().min(),
        "reasoning first: {chunks:?}"
    );
    let first = &chunks[reasoning[0]]["choices"][0]["delta"];
    assert_eq!(first["content"], Value::Null, "DeepSeek's reasoning chunk: {first}");
    let usage = &chunks[chunks.len() - 1]["usage"];
    assert_eq!(usage["completion_tokens"], 6 + 1, "reasoning counts: {usage}");
    assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 6, "{usage}");

    let plain = events_json(&body_text(openai(&handle, "s", chat_body(true)).await).await);
    assert!(
        plain
            .iter()
            .all(|c| c["choices"][0]["delta"].get("reasoning_content").is_none()),
        "another model does not reason"
    );
    let field = events_json(&body_text(openai(&handle, "vllm", chat_body(true)).await).await);
    assert!(
        field.iter().any(|c| c["choices"][0]["delta"]["reasoning"].is_string()),
        "the scenario picks vLLM's field for any model"
    );
    body["stream"] = json!(false);
    let whole = parse(&body_text(openai(&handle, "s", body).await).await);
    let message = &whole["choices"][0]["message"];
    assert!(message["reasoning_content"].is_string(), "non-streaming too: {whole}");
    assert_eq!(message["content"], "Paris.", "{whole}");
    handle.shutdown();
}

#[tokio::test]
async fn an_openai_reasoning_model_bills_hidden_reasoning_tokens() {
    let handle = sim(vec![("s", quick("one two three"))]).await;
    let body = json!({"model": "o4-mini", "stream": true, "stream_options": {"include_usage": true},
                      "max_completion_tokens": 100,
                      "messages": [{"role": "user", "content": "count"}]});
    let chunks = events_json(&body_text(openai(&handle, "s", body.clone()).await).await);
    assert!(
        chunks
            .iter()
            .all(|c| c["choices"][0]["delta"].get("reasoning_content").is_none()),
        "hidden reasoning is never streamed"
    );
    let usage = &chunks[chunks.len() - 1]["usage"];
    assert_eq!(usage["completion_tokens"], 3 + 6, "visible plus reasoning: {usage}");
    assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 6, "{usage}");
    assert_eq!(handle.log()[0].tokens_sent, 3, "the record counts what was written");

    let mut tight = body;
    tight["max_completion_tokens"] = json!(8);
    let chunks = events_json(&body_text(openai(&handle, "s", tight).await).await);
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        content, "one two",
        "the limit counts reasoning: 8 - 6 left for the answer"
    );
    let finish = chunks.iter().find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("length"), "cut by the limit");
    handle.shutdown();
}
