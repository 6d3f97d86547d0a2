//! Loopback tests of the simulator: real sockets on 127.0.0.1:0, real HTTP with reqwest,
//! asserting the exact wire formats, the faults, and the request log.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use super::*;

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .build()
        .unwrap_or_else(|e| panic!("http client: {e}"))
}

/// Quick, deterministic timing so real-time tests stay in milliseconds.
fn quick(text: &str) -> Scenario {
    Scenario {
        ttft: Ttft {
            median_ms: 1.0,
            ..Ttft::default()
        },
        inter_token_ms: 1.0,
        text: Some(text.to_owned()),
        ..Scenario::default()
    }
}

async fn sim(scenarios: Vec<(&str, Scenario)>) -> SimHandle {
    let map: BTreeMap<String, Scenario> = scenarios.into_iter().map(|(n, s)| (n.to_owned(), s)).collect();
    let listen = "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("addr: {e}"));
    SimHandle::start(listen, map)
        .await
        .unwrap_or_else(|e| panic!("sim start: {e}"))
}

async fn post(url: String, body: Value) -> reqwest::Response {
    client()
        .post(url)
        .header("x-request-id", "req-test-1")
        .json(&body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("request failed: {e}"))
}

async fn openai(handle: &SimHandle, scenario: &str, body: Value) -> reqwest::Response {
    post(format!("{}/chat/completions", handle.openai_base_url(scenario)), body).await
}

async fn anthropic(handle: &SimHandle, scenario: &str, body: Value) -> reqwest::Response {
    post(format!("{}/v1/messages", handle.anthropic_base_url(scenario)), body).await
}

fn chat_body(stream: bool) -> Value {
    json!({"model": "m", "stream": stream,
           "messages": [{"role": "user", "content": "say hello please"}]})
}

/// Events as (event name, data) in order; panics on lines that are neither.
fn events(text: &str) -> Vec<(Option<String>, String)> {
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|event| {
            let mut name = None;
            let mut data = None;
            for line in event.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_owned());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(d.to_owned());
                } else {
                    panic!("unexpected SSE line {line:?} in {text:?}");
                }
            }
            (name, data.unwrap_or_else(|| panic!("event without data: {event:?}")))
        })
        .collect()
}

fn parse(data: &str) -> Value {
    serde_json::from_str(data).unwrap_or_else(|e| panic!("not JSON ({e}): {data}"))
}

async fn body_text(response: reqwest::Response) -> String {
    response.text().await.unwrap_or_else(|e| panic!("body: {e}"))
}

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

async fn events_of_plain(handle: &SimHandle) -> Vec<Value> {
    let text = body_text(openai(handle, "s", chat_body(true)).await).await;
    let events = events(&text);
    events[..events.len() - 1].iter().map(|e| parse(&e.1)).collect()
}

fn tool_scenario() -> Scenario {
    Scenario {
        ttft: Ttft {
            median_ms: 1.0,
            ..Ttft::default()
        },
        inter_token_ms: 1.0,
        ..profile("tool-call").unwrap_or_default()
    }
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

/// Anthropic events must name their type both in `event:` and in `data.type` (T13).
fn anthropic_events(text: &str) -> Vec<(String, Value)> {
    events(text)
        .into_iter()
        .map(|(name, data)| {
            let name = name.unwrap_or_else(|| panic!("event without name: {data}"));
            let data = parse(&data);
            assert_eq!(data["type"], name.as_str(), "event name matches data.type");
            (name, data)
        })
        .collect()
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
async fn rate_limited_answers_carry_the_wire_error_body_and_retry_after() {
    let handle = sim(vec![]).await;
    let response = openai(&handle, "always-429", chat_body(true)).await;
    assert_eq!(response.status(), 429, "status");
    assert_eq!(response.headers()["retry-after"], "2", "retry-after");
    let body = parse(&body_text(response).await);
    assert_eq!(body["error"]["code"], "rate_limit_exceeded", "code: {body}");
    assert!(body["error"]["message"].is_string(), "message: {body}");
    assert!(body["error"].get("param").is_some(), "param present: {body}");

    let response = anthropic(&handle, "always-429", chat_body(true)).await;
    assert_eq!(response.status(), 429, "status");
    let body = parse(&body_text(response).await);
    assert_eq!(body["type"], "error", "envelope: {body}");
    assert_eq!(body["error"]["type"], "rate_limit_error", "type: {body}");

    let log = handle.log();
    assert!(
        log.iter()
            .all(|r| r.status == 429 && r.end == Some(SimEnd::ErrorStatus)),
        "records: {log:?}"
    );
    handle.shutdown();
}

#[tokio::test]
async fn overloaded_status_uses_529_and_fail_first_n_recovers() {
    let scenario = Scenario {
        failure: Failure {
            status: Some(529),
            fail_first_n: Some(1),
            retry_after_ms: Some(1500),
            ..Failure::default()
        },
        ..quick("fine")
    };
    let handle = sim(vec![("s", scenario)]).await;
    let first = anthropic(&handle, "s", chat_body(false)).await;
    assert_eq!(first.status(), 529, "first request fails");
    assert_eq!(first.headers()["retry-after-ms"], "1500", "retry-after-ms");
    let body = parse(&body_text(first).await);
    assert_eq!(body["error"]["type"], "overloaded_error", "type: {body}");
    let second = anthropic(&handle, "s", chat_body(false)).await;
    assert_eq!(second.status(), 200, "then healthy");
    handle.shutdown();
}

#[tokio::test]
async fn drop_after_tokens_ends_the_body_with_an_error() {
    let scenario = Scenario {
        failure: Failure {
            drop_after_tokens: Some(2),
            ..Failure::default()
        },
        ..quick("a b c d e f")
    };
    let handle = sim(vec![("s", scenario)]).await;
    let response = openai(&handle, "s", chat_body(true)).await;
    let mut body = response.bytes_stream();
    let mut seen = Vec::new();
    let mut failed = false;
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(bytes) => seen.extend_from_slice(&bytes),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(failed, "client must see a broken body, got {text}");
    assert!(
        !text.contains("[DONE]") && !text.contains("finish_reason\":\"stop"),
        "{text}"
    );
    assert_eq!(text.matches("\"content\":\"").count(), 3, "role + 2 tokens: {text}");
    assert_eq!(handle.log()[0].end, Some(SimEnd::Dropped), "recorded as dropped");
    handle.shutdown();
}

#[tokio::test]
async fn a_client_dropping_the_response_mid_stream_is_recorded_as_client_closed() {
    let scenario = Scenario {
        tokens: 2000,
        inter_token_ms: 5.0,
        text: None,
        ..quick("")
    };
    let handle = sim(vec![("long", scenario)]).await;
    let response = openai(&handle, "long", chat_body(true)).await;
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("\"content\":\"") || seen.matches("data: ").count() < 3 {
        match body.next().await {
            Some(Ok(bytes)) => seen.push_str(&String::from_utf8_lossy(&bytes)),
            other => panic!("stream ended early: {other:?}"),
        }
    }
    drop(body);
    let mut end = None;
    for _ in 0..500 {
        end = handle.log()[0].end;
        if end.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(end, Some(SimEnd::ClientClosed), "the simulator saw the close");
    let record = &handle.log()[0];
    assert!(record.tokens_sent < 2000, "stopped early: {}", record.tokens_sent);
    assert!(record.ended_at.is_some(), "end time recorded");
    handle.shutdown();
}

#[tokio::test]
async fn a_client_closing_while_the_first_token_is_pending_is_seen_at_once() {
    // The hedge loser's case: no token written yet, the simulator is waiting out its TTFT.
    let scenario = Scenario {
        ttft: Ttft {
            median_ms: 60_000.0,
            ..Ttft::default()
        },
        ..quick("never sent")
    };
    let handle = sim(vec![("waiting", scenario)]).await;
    let response = openai(&handle, "waiting", chat_body(true)).await;
    assert_eq!(response.status(), 200, "headers arrive before the first token");
    drop(response);
    let mut record = handle.log()[0].clone();
    for _ in 0..500 {
        record = handle.log()[0].clone();
        if record.end.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        record.end,
        Some(SimEnd::ClientClosed),
        "close seen during the TTFT wait"
    );
    assert!(record.first_token_at.is_none(), "no token was written");
    handle.shutdown();
}

#[tokio::test(start_paused = true)]
async fn constant_ttft_is_honoured_in_virtual_time() {
    let scenario = Scenario {
        ttft: Ttft {
            median_ms: 5000.0,
            ..Ttft::default()
        },
        inter_token_ms: 100.0,
        text: Some("slow answer".to_owned()),
        ..Scenario::default()
    };
    let handle = sim(vec![("slow", scenario)]).await;
    let sent_at = tokio::time::Instant::now();
    let response = openai(&handle, "slow", chat_body(true)).await;
    let headers_after = sent_at.elapsed();
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("slow") {
        match body.next().await {
            Some(Ok(bytes)) => seen.push_str(&String::from_utf8_lossy(&bytes)),
            other => panic!("stream ended early: {other:?}"),
        }
    }
    let first_token_after = sent_at.elapsed();
    assert!(
        headers_after < Duration::from_millis(5000),
        "headers before TTFT: {headers_after:?}"
    );
    assert!(
        first_token_after >= Duration::from_millis(5000) && first_token_after < Duration::from_millis(5100),
        "first token at {first_token_after:?}"
    );
    let record = &handle.log()[0];
    let ttft = record.first_token_at.zip(Some(record.accepted_at)).map(|(f, a)| f - a);
    assert_eq!(ttft, Some(Duration::from_millis(5000)), "sim-side TTFT");
    assert_eq!(record.planned_ttft_ms, 5000.0, "planned TTFT");
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

#[tokio::test]
async fn in_band_errors_end_the_stream_without_a_terminal_event() {
    let scenario = Scenario {
        failure: Failure {
            in_band_error_after_tokens: Some(1),
            ..Failure::default()
        },
        ..quick("x y z")
    };
    let handle = sim(vec![("s", scenario)]).await;
    let events_openai = events(&body_text(openai(&handle, "s", chat_body(true)).await).await);
    let last = parse(&events_openai[events_openai.len() - 1].1);
    assert_eq!(last["error"]["type"], "server_error", "OpenAI in-band error: {last}");
    let events = anthropic_events(&body_text(anthropic(&handle, "s", chat_body(true)).await).await);
    let (name, data) = &events[events.len() - 1];
    assert_eq!(name, "error", "Anthropic error event");
    assert_eq!(data["error"]["type"], "overloaded_error", "type: {data}");
    assert!(
        handle.log().iter().all(|r| r.end == Some(SimEnd::InBandError)),
        "recorded"
    );
    handle.shutdown();
}

#[tokio::test]
async fn truncation_inside_a_tool_call_has_no_block_stop_and_refusals_are_wire_exact() {
    let cut = Scenario {
        failure: Failure {
            length_in_tool_call: true,
            ..Failure::default()
        },
        ..tool_scenario()
    };
    let refuse = Scenario {
        failure: Failure {
            refusal: true,
            ..Failure::default()
        },
        ..quick("never said")
    };
    let handle = sim(vec![("cut", cut), ("refuse", refuse)]).await;
    let events = anthropic_events(&body_text(anthropic(&handle, "cut", chat_body(true)).await).await);
    assert!(
        events.iter().all(|(n, _)| n != "content_block_stop"),
        "no block stop (§3.9)"
    );
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens", "stop: {delta}");

    let text = body_text(openai(&handle, "cut", chat_body(true)).await).await;
    assert!(text.contains("\"finish_reason\":\"length\""), "OpenAI length: {text}");

    let events = anthropic_events(&body_text(anthropic(&handle, "refuse", chat_body(true)).await).await);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "refusal sequence (§3.7)"
    );
    assert_eq!(events[4].1["delta"]["stop_reason"], "refusal", "stop reason");

    let events = events_json(&body_text(openai(&handle, "refuse", chat_body(true)).await).await);
    let refusal: String = events
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["refusal"].as_str())
        .collect();
    assert!(refusal.starts_with("I'm sorry"), "refusal text: {refusal}");
    let finish = &events[events.len() - 1]["choices"][0]["finish_reason"];
    assert_eq!(finish, "stop", "refusal finishes with stop");
    handle.shutdown();
}

fn events_json(text: &str) -> Vec<Value> {
    let events = events(text);
    events[..events.len() - 1].iter().map(|e| parse(&e.1)).collect()
}

#[tokio::test]
async fn wire_faults_shape_the_raw_bytes() {
    let with = |failure: Failure| Scenario {
        failure,
        ..quick("p q r")
    };
    let handle = sim(vec![
        (
            "bom",
            with(Failure {
                bom: true,
                ..Failure::default()
            }),
        ),
        (
            "eof",
            with(Failure {
                eof_before_finish: true,
                ..Failure::default()
            }),
        ),
        (
            "nodone",
            with(Failure {
                missing_done: true,
                ..Failure::default()
            }),
        ),
        (
            "utf8",
            with(Failure {
                invalid_utf8_after_tokens: Some(1),
                ..Failure::default()
            }),
        ),
        (
            "huge",
            with(Failure {
                huge_line_bytes: Some(100_000),
                ..Failure::default()
            }),
        ),
        (
            "bad",
            with(Failure {
                malformed_after_tokens: Some(0),
                ..Failure::default()
            }),
        ),
    ])
    .await;
    let raw = |name: &'static str| {
        let handle = handle.clone();
        async move {
            openai(&handle, name, chat_body(true))
                .await
                .bytes()
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        }
    };
    assert!(raw("bom").await.starts_with(b"\xEF\xBB\xBFdata: "), "BOM first");
    let eof = String::from_utf8_lossy(&raw("eof").await).into_owned();
    assert!(
        !eof.contains("finish_reason\":\"stop") && !eof.contains("[DONE]"),
        "{eof}"
    );
    let nodone = String::from_utf8_lossy(&raw("nodone").await).into_owned();
    assert!(
        nodone.contains("finish_reason\":\"stop") && !nodone.contains("[DONE]"),
        "{nodone}"
    );
    assert!(std::str::from_utf8(&raw("utf8").await).is_err(), "invalid UTF-8 inside");
    let huge = raw("huge").await;
    let tail = huge.split(|b| *b == b'\n').next_back().map(<[u8]>::len);
    assert_eq!(tail, Some(100_000), "one unterminated line of the requested size");
    let bad = String::from_utf8_lossy(&raw("bad").await).into_owned();
    let last = bad.trim_end().rsplit("\n\n").next().unwrap_or_default().to_owned();
    assert!(
        serde_json::from_str::<Value>(&last[6..]).is_err(),
        "malformed last: {last}"
    );
    let ends: Vec<_> = handle.log().iter().map(|r| r.end).collect();
    assert!(
        ends.iter()
            .all(|e| *e == Some(SimEnd::Truncated) || *e == Some(SimEnd::Completed)),
        "{ends:?}"
    );
    handle.shutdown();
}

#[tokio::test]
async fn chunk_split_writes_events_in_small_body_chunks() {
    let scenario = Scenario {
        chunk_split: Some(7),
        ..quick("split me please")
    };
    let handle = sim(vec![("s", scenario)]).await;
    let mut body = openai(&handle, "s", chat_body(true)).await.bytes_stream();
    let mut all = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.unwrap_or_else(|e| panic!("body: {e}"));
        assert!(chunk.len() <= 7, "chunk of {} bytes", chunk.len());
        all.extend_from_slice(&chunk);
    }
    let text = String::from_utf8_lossy(&all);
    assert!(text.ends_with("data: [DONE]\n\n"), "complete stream: {text}");
    handle.shutdown();
}

#[tokio::test]
async fn the_control_routes_register_scenarios_and_serve_the_log() {
    let handle = sim(vec![]).await;
    let base = format!("http://{}", handle.addr());
    let http = client();
    let put = http
        .put(format!("{base}/_sim/scenarios/custom"))
        .json(&json!({"text": "from json", "ttft": {"median_ms": 1.0}, "inter_token_ms": 0.0}))
        .send()
        .await
        .unwrap_or_else(|e| panic!("put: {e}"));
    assert!(put.status().is_success(), "put status {}", put.status());
    let typo = http
        .put(format!("{base}/_sim/scenarios/typo"))
        .json(&json!({"txet": "oops"}))
        .send()
        .await
        .unwrap_or_else(|e| panic!("put: {e}"));
    assert_eq!(typo.status(), 400, "unknown fields are rejected");

    let names: Vec<String> = http
        .get(format!("{base}/_sim/scenarios"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("get: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("json: {e}"));
    assert!(
        names.contains(&"custom".to_owned()) && names.contains(&"spiky".to_owned()),
        "{names:?}"
    );

    let text = body_text(openai(&handle, "custom", chat_body(true)).await).await;
    assert!(text.contains("from") && text.contains(" json"), "custom text: {text}");
    let log: Value = http
        .get(format!("{base}/_sim/log"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("get: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("json: {e}"));
    assert_eq!(log[0]["end"], "completed", "log over HTTP: {log}");
    assert_eq!(log[0]["scenario"], "custom", "scenario: {log}");
    let cleared = http
        .delete(format!("{base}/_sim/log"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("delete: {e}"));
    assert!(cleared.status().is_success(), "delete status");
    assert!(handle.log().is_empty(), "log cleared");
    handle.shutdown();
}

#[test]
fn scenarios_read_from_inline_toml_and_reject_unknown_keys() {
    let toml_text = r#"
        text = "Hi there"
        seed = 9
        [ttft]
        median_ms = 120
        sigma = 0.3
        [failure]
        status = 503
        fail_first_n = 2
        [brownout]
        period_ms = 1000
        duty = 0.25
        extra_ms = 50
        [[tool_calls]]
        name = "lookup"
        arguments = '{"q": "x"}'

    "#;
    let scenario: Scenario = toml::from_str(toml_text).unwrap_or_else(|e| panic!("toml: {e}"));
    assert_eq!(scenario.ttft.median_ms, 120.0, "ttft");
    assert_eq!(scenario.failure.status, Some(503), "status");
    assert_eq!(scenario.failure.status_rate, 1.0, "status rate defaults to 1");
    assert_eq!(scenario.tool_fragments, 12, "defaults fill the rest");
    assert_eq!(scenario.tool_calls[0].arguments, r#"{"q": "x"}"#, "tool call table");
    assert!(
        toml::from_str::<Scenario>("ttft = { median = 5 }").is_err(),
        "typo rejected"
    );
    let json = serde_json::to_string(&scenario).unwrap_or_default();
    let back: Scenario = serde_json::from_str(&json).unwrap_or_else(|e| panic!("json: {e}"));
    assert_eq!(back, scenario, "JSON round trip");
}

#[tokio::test]
async fn the_same_seed_reproduces_the_same_requests() {
    let spiky = profile("spiky").unwrap_or_default();
    let a = sim(vec![("x", spiky.clone())]).await;
    let b = sim(vec![("x", spiky)]).await;
    // Status-free TTFT draws: compare the planned TTFT of the first requests of each.
    for handle in [&a, &b] {
        for _ in 0..3 {
            let _ = openai(handle, "x", chat_body(true)).await;
        }
    }
    let ttfts = |h: &SimHandle| h.log().iter().map(|r| r.planned_ttft_ms).collect::<Vec<_>>();
    assert_eq!(ttfts(&a), ttfts(&b), "same seed, same TTFTs");
    a.shutdown();
    b.shutdown();
}

mod through_the_adapters {
    //! The simulator as tailcut's own adapters read it: every stream decodes without error.
    use std::sync::Arc;

    use super::*;
    use crate::provider::{AnthropicProvider, Delta, OpenAiProvider, Provider, UpstreamRequest};
    use crate::types::{ChatRequest, Message, Role};

    fn request(prefill: Option<&str>) -> UpstreamRequest {
        let chat = ChatRequest {
            model: "chat".to_owned(),
            messages: vec![Message::text(Role::User, "hello there")],
            stream: true,
            include_usage: true,
            ..ChatRequest::default()
        };
        UpstreamRequest {
            chat: Arc::new(chat),
            prefill: prefill.map(str::to_owned),
            request_id: "req-adapter".to_owned(),
        }
    }

    async fn deltas(provider: &dyn Provider, prefill: Option<&str>) -> Vec<Delta> {
        let mut stream = provider
            .open(request(prefill))
            .await
            .unwrap_or_else(|e| panic!("open: {e:?}"));
        let mut out = Vec::new();
        while let Some(item) = stream.next().await {
            out.push(item.unwrap_or_else(|e| panic!("delta error: {e:?} after {out:?}")));
        }
        out
    }

    fn text(deltas: &[Delta]) -> String {
        deltas
            .iter()
            .filter_map(|d| match d {
                Delta::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn both_adapters_decode_text_tools_and_continuations() {
        let handle = sim(vec![("text", quick("Hello big wide world")), ("tool", tool_scenario())]).await;
        for wire in ["openai", "anthropic"] {
            let provider = |scenario: &str| -> Box<dyn Provider> {
                match wire {
                    "openai" => Box::new(OpenAiProvider::new(
                        handle.openai_base_url(scenario),
                        "up".to_owned(),
                        None,
                        client(),
                    )),
                    _ => Box::new(AnthropicProvider::new(
                        handle.anthropic_base_url(scenario),
                        "up".to_owned(),
                        None,
                        client(),
                    )),
                }
            };
            let got = deltas(provider("text").as_ref(), None).await;
            assert_eq!(text(&got), "Hello big wide world", "{wire}: text {got:?}");
            let got = deltas(provider("text").as_ref(), Some("Hello big")).await;
            assert_eq!(text(&got), " wide world", "{wire}: continuation {got:?}");
            let got = deltas(provider("tool").as_ref(), None).await;
            let args: String = got
                .iter()
                .filter_map(|d| match d {
                    Delta::ToolFragment(f) => Some(f.arguments.as_str()),
                    _ => None,
                })
                .collect();
            assert!(args.contains("Paris"), "{wire}: tool arguments {got:?}");
        }
        handle.shutdown();
    }
}

#[tokio::test]
async fn shutdown_stops_accepting_new_connections() {
    let handle = sim(vec![("s", quick("bye"))]).await;
    assert_eq!(openai(&handle, "s", chat_body(false)).await.status(), 200, "serving");
    handle.shutdown();
    let url = format!("{}/chat/completions", handle.openai_base_url("s"));
    let mut refused = false;
    for _ in 0..200 {
        // A fresh client each time, so no pooled connection hides the closed listener.
        if client().post(&url).json(&chat_body(false)).send().await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(refused, "connections must be refused after shutdown");
}
