//! The exact wire formats: OpenAI chunks, Anthropic events, tool-call fragments, usage,
//! continuations, non-streaming bodies and unknown scenarios.

use super::*;

#[tokio::test]
async fn openai_text_stream_has_the_exact_framing() {
    let handle = sim(vec![("s", quick("Hello big world!"))]).await;
    let response = openai(&handle, "s", chat_body(true)).await;
    assert_eq!(response.status(), 200, "status");
    let content_type = response.headers()["content-type"].to_str().unwrap_or_default();
    assert!(
        content_type.starts_with("text/event-stream"),
        "content type {content_type}"
    );
    let text = body_text(response).await;
    assert!(
        !text.contains("event:") && !text.contains("\nid:"),
        "no event/id lines: {text}"
    );
    let events = events(&text);
    assert!(events.iter().all(|(name, _)| name.is_none()), "no event names");
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("[DONE]"), "[DONE] last");

    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| parse(&e.1)).collect();
    let first = &chunks[0]["choices"][0]["delta"];
    assert_eq!(first["role"], "assistant", "role chunk first: {first}");
    assert_eq!(first["content"], "", "role chunk has empty content: {first}");
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk", "object: {chunk}");
        assert_eq!(chunk["id"], chunks[0]["id"], "same id: {chunk}");
        assert_eq!(chunk["created"], chunks[0]["created"], "same created: {chunk}");
        assert_eq!(chunk["model"], "m", "model echoed: {chunk}");
        assert!(chunk.get("usage").is_none(), "no usage without include_usage: {chunk}");
    }
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "Hello big world!", "content");
    assert_eq!(chunks.len(), 1 + 3 + 1, "role + one chunk per token + finish");
    let last = &chunks[chunks.len() - 1]["choices"][0];
    assert_eq!(last["finish_reason"], "stop", "finish: {last}");
    assert_eq!(last["delta"], json!({}), "finish delta empty: {last}");

    let record = &handle.log()[0];
    assert_eq!(record.end, Some(SimEnd::Completed), "record end");
    assert_eq!(record.tokens_sent, 3, "tokens recorded");
    assert_eq!(record.request_id.as_deref(), Some("req-test-1"), "x-request-id kept");
    assert_eq!(record.wire, "openai", "wire");
    handle.shutdown();
}

#[tokio::test]
async fn usage_chunk_with_empty_choices_only_when_include_usage() {
    let handle = sim(vec![("s", quick("one two three"))]).await;
    let mut body = chat_body(true);
    body["stream_options"] = json!({"include_usage": true});
    let events = events(&body_text(openai(&handle, "s", body).await).await);
    let usage = parse(&events[events.len() - 2].1);
    assert_eq!(usage["choices"], json!([]), "usage chunk has empty choices: {usage}");
    assert_eq!(usage["usage"]["completion_tokens"], 3, "completion tokens: {usage}");
    assert_eq!(usage["usage"]["prompt_tokens"], 3, "prompt words: {usage}");
    let earlier = parse(&events[1].1);
    assert_eq!(earlier["usage"], Value::Null, "usage null on other chunks: {earlier}");

    let plain = events_of_plain(&handle).await;
    assert!(
        plain.iter().all(|c| c["choices"] != json!([])),
        "no empty-choices chunk without include_usage"
    );
    handle.shutdown();
}

#[tokio::test]
async fn openai_tool_call_fragments_name_the_call_only_first() {
    let scenario = tool_scenario();
    let arguments = scenario.tool_calls[0].arguments.clone();
    let with_role = Scenario {
        tool_first_with_role: true,
        ..scenario.clone()
    };
    let handle = sim(vec![("tool", scenario), ("tool-role", with_role)]).await;

    let chunks = events_json(&body_text(openai(&handle, "tool", chat_body(true)).await).await);
    assert_eq!(
        chunks[0]["choices"][0]["delta"]["content"],
        Value::Null,
        "role chunk content null"
    );
    let fragments: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert_eq!(fragments.len(), 13, "header fragment + 12 argument pieces");
    let head = fragments[0];
    assert!(
        head["id"].as_str().is_some_and(|id| id.starts_with("call_")),
        "id: {head}"
    );
    assert_eq!(head["type"], "function", "type: {head}");
    assert_eq!(head["function"]["name"], "get_weather", "name: {head}");
    assert_eq!(head["function"]["arguments"], "", "first arguments empty: {head}");
    for f in &fragments[1..] {
        assert!(f.get("id").is_none() && f.get("type").is_none(), "only index+args: {f}");
        assert!(f["function"].get("name").is_none(), "no name later: {f}");
        assert_eq!(f["index"], 0, "index: {f}");
    }
    let joined: String = fragments
        .iter()
        .filter_map(|f| f["function"]["arguments"].as_str())
        .collect();
    assert_eq!(joined, arguments, "fragments concatenate to the arguments");
    let finish = &chunks[chunks.len() - 1]["choices"][0]["finish_reason"];
    assert_eq!(finish, "tool_calls", "finish reason");

    let events = events(&body_text(openai(&handle, "tool-role", chat_body(true)).await).await);
    let first = parse(&events[0].1);
    let delta = &first["choices"][0]["delta"];
    assert_eq!(
        delta["role"], "assistant",
        "role rides with the first fragment: {delta}"
    );
    assert_eq!(delta["tool_calls"][0]["function"]["name"], "get_weather", "T2: {delta}");
    handle.shutdown();
}

#[tokio::test]
async fn anthropic_text_stream_follows_the_event_sequence() {
    let handle = sim(vec![("s", quick("Hello there!"))]).await;
    let response = anthropic(&handle, "s", chat_body(true)).await;
    assert!(response.headers().contains_key("request-id"), "request-id header");
    let events = anthropic_events(&body_text(response).await);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "sequence"
    );
    let start = &events[0].1["message"];
    assert_eq!(start["content"], json!([]), "empty content: {start}");
    assert_eq!(start["usage"]["input_tokens"], 3, "input tokens: {start}");
    assert_eq!(
        events[1].1["content_block"],
        json!({"type": "text", "text": ""}),
        "text block"
    );
    let text: String = events.iter().filter_map(|(_, d)| d["delta"]["text"].as_str()).collect();
    assert_eq!(text, "Hello there!", "text");
    let delta = &events[6].1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn", "stop reason: {delta}");
    assert_eq!(delta["usage"]["output_tokens"], 2, "cumulative output tokens: {delta}");
    handle.shutdown();
}

#[tokio::test]
async fn anthropic_tool_use_streams_partial_json_between_start_and_stop() {
    let scenario = tool_scenario();
    let arguments = scenario.tool_calls[0].arguments.clone();
    let handle = sim(vec![("tool", scenario)]).await;
    let events = anthropic_events(&body_text(anthropic(&handle, "tool", chat_body(true)).await).await);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..3], ["message_start", "ping", "content_block_start"], "opening");
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let block = &events[2].1["content_block"];
    assert_eq!(block["type"], "tool_use", "block: {block}");
    assert_eq!(block["name"], "get_weather", "name: {block}");
    assert_eq!(block["input"], json!({}), "input starts empty: {block}");
    let partials: Vec<&str> = events
        .iter()
        .filter_map(|(_, d)| d["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(partials[0], "", "first partial_json is empty");
    assert_eq!(partials.concat(), arguments, "partials concatenate to the arguments");
    assert_eq!(events[events.len() - 2].1["delta"]["stop_reason"], "tool_use", "stop");
    handle.shutdown();
}

#[tokio::test]
async fn a_prefill_that_prefixes_the_answer_gets_only_the_remainder() {
    let handle = sim(vec![("s", quick("Hello big wide world"))]).await;
    let body = json!({"stream": true, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello big"}
    ]});
    let events = anthropic_events(&body_text(anthropic(&handle, "s", body).await).await);
    let text: String = events.iter().filter_map(|(_, d)| d["delta"]["text"].as_str()).collect();
    assert_eq!(text, " wide world", "remainder only");
    let record = &handle.log()[0];
    assert_eq!(record.prefill_chars, 9, "prefill chars");
    assert!(record.continued, "continued");
    assert_eq!(
        record.continuation,
        Some(PrefillOutcome::Exact),
        "what the upstream did"
    );
    handle.shutdown();
}

#[tokio::test]
async fn non_streaming_requests_get_one_aggregated_body() {
    let handle = sim(vec![("s", quick("All at once.")), ("tool", tool_scenario())]).await;
    let body = parse(&body_text(openai(&handle, "s", chat_body(false)).await).await);
    assert_eq!(body["object"], "chat.completion", "object: {body}");
    assert_eq!(
        body["choices"][0]["message"]["content"], "All at once.",
        "content: {body}"
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "finish: {body}");
    assert_eq!(body["usage"]["completion_tokens"], 3, "usage: {body}");

    let body = parse(&body_text(anthropic(&handle, "tool", chat_body(false)).await).await);
    assert_eq!(body["type"], "message", "type: {body}");
    assert_eq!(body["stop_reason"], "tool_use", "stop: {body}");
    let input = &body["content"][0]["input"];
    assert_eq!(input["city"], "Paris", "tool input parsed: {body}");
    assert!(
        handle.log().iter().all(|r| r.end == Some(SimEnd::Completed)),
        "completed"
    );
    handle.shutdown();
}

#[tokio::test]
async fn unknown_scenarios_get_a_404_in_the_wire_format() {
    let handle = sim(vec![]).await;
    let response = openai(&handle, "nope", chat_body(true)).await;
    assert_eq!(response.status(), 404, "status");
    let body = parse(&body_text(response).await);
    assert!(
        body["error"]["message"].as_str().is_some_and(|m| m.contains("nope")),
        "{body}"
    );
    let response = anthropic(&handle, "nope", chat_body(true)).await;
    let body = parse(&body_text(response).await);
    assert_eq!(body["error"]["type"], "not_found_error", "type: {body}");
    handle.shutdown();
}
