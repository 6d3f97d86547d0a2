//! Injected faults and timing: error statuses, drops, client closes seen at once, virtual-time
//! TTFT, in-band errors, truncation, raw-byte faults and split chunks.

use super::*;

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
async fn a_pause_carries_the_wires_keep_alive_and_nothing_else() {
    let scenario = Scenario {
        keepalive_ms: Some(20),
        failure: Failure {
            stall_after_tokens: Some(1),
            stall_ms: Some(110),
            ..Failure::default()
        },
        ..quick("one two three")
    };
    let handle = sim(vec![("s", scenario)]).await;
    let openai_body = body_text(openai(&handle, "s", chat_body(true)).await).await;
    let pings = openai_body.matches(": ping\n\n").count();
    assert!(
        pings >= 3,
        "an SSE comment every 20 ms of the 110 ms pause: {openai_body}"
    );
    assert!(openai_body.contains("[DONE]"), "and the answer goes on: {openai_body}");
    let anthropic_body = body_text(anthropic(&handle, "s", chat_body(true)).await).await;
    let pings = anthropic_body
        .matches("event: ping\ndata: {\"type\":\"ping\"}\n\n")
        .count();
    assert!(
        pings >= 4,
        "the pause's pings, besides the one after message_start: {anthropic_body}"
    );
    handle.shutdown();
}
