//! End-to-end over real sockets for the client dialects beyond OpenAI SSE: Anthropic
//! Messages (streamed and whole), the WebSocket protocol (multiplexing, cancel, origin,
//! size limit, reset), native SSE for browsers, and the stream-permit 503.

mod support;

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use support::*;
use tailcut::sim::SimEnd;
use tokio_tungstenite::tungstenite::Message;

const TEXT: &str = "Hello from the simulated upstream, streamed token by token.";

const QUICK: &str = r#"
[sim.scenarios.quick]
text = "Hello from the simulated upstream, streamed token by token."
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 1.0
"#;

const LONG: &str = r#"
[sim.scenarios.long]
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 20.0
tokens = 2000
"#;

fn anthropic_body(stream: bool) -> Value {
    json!({
        "model": "chat", "max_tokens": 256, "stream": stream,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Say something."}],
    })
}

/// Named SSE events of a whole body: (event name, data JSON).
fn named_events(raw: &str) -> Vec<(String, Value)> {
    raw.split("\n\n")
        .filter(|e| !e.trim().is_empty() && !e.starts_with(':'))
        .map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or_default()
                .to_string();
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or("null");
            (
                name,
                serde_json::from_str(data).unwrap_or_else(|err| panic!("data is not JSON ({err}): {data}")),
            )
        })
        .collect()
}

async fn post_raw(url: String, body: &Value) -> (u16, reqwest::header::HeaderMap, String) {
    let resp = client().post(url).json(body).send().await.expect("request sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let raw = tokio::time::timeout(Duration::from_secs(20), resp.text())
        .await
        .expect("no hang")
        .unwrap_or_default();
    (status, headers, raw)
}

#[tokio::test]
async fn anthropic_stream_is_named_events_an_sdk_accepts() {
    let server = start(&config_toml(&[("a", "openai", "quick")], QUICK)).await;
    let (status, headers, raw) = post_raw(server.url("/v1/messages"), &anthropic_body(true)).await;
    assert_eq!(status, 200, "{raw}");
    assert_eq!(headers["content-type"], "text/event-stream");
    let events = named_events(&raw);
    assert!(
        events
            .iter()
            .all(|(name, data)| !name.is_empty() && data["type"] == *name),
        "event: line matches data.type: {raw}"
    );
    assert_eq!(events[0].0, "message_start", "{raw}");
    assert_eq!(events[0].1["message"]["model"], "model-a", "the served upstream model");
    assert_eq!(events[0].1["tailcut"]["route"], "a", "envelope in message_start");
    let text: String = events
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && d["delta"]["type"] == "text_delta")
        .filter_map(|(_, d)| d["delta"]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, TEXT, "text equals the upstream text");
    let delta = events
        .iter()
        .find(|(n, _)| n == "message_delta")
        .expect("a message_delta");
    assert_eq!(delta.1["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta.1["tailcut"]["route"], "a", "envelope in message_delta");
    assert_eq!(
        events.last().map(|e| e.0.as_str()),
        Some("message_stop"),
        "ends with message_stop"
    );
}

#[tokio::test]
async fn anthropic_non_streaming_request_gets_one_message() {
    let server = start(&config_toml(&[("a", "anthropic", "quick")], QUICK)).await;
    let (status, _, raw) = post_raw(server.url("/v1/messages"), &anthropic_body(false)).await;
    assert_eq!(status, 200, "{raw}");
    let body: Value = serde_json::from_str(&raw).expect("JSON");
    assert_eq!(body["type"], "message");
    assert_eq!(body["content"][0]["text"], TEXT);
    assert_eq!(body["stop_reason"], "end_turn");
}

#[tokio::test]
async fn anthropic_errors_before_commit_are_anthropic_error_bodies() {
    let extra = "[sim.scenarios.limited]\nfailure = { status = 429, retry_after_s = 3 }\n";
    let server = start(&config_toml(&[("a", "openai", "limited")], extra)).await;
    let (status, headers, raw) = post_raw(server.url("/v1/messages"), &anthropic_body(true)).await;
    assert_eq!(status, 429, "{raw}");
    assert!(headers.contains_key("retry-after"), "retry-after is passed on");
    let body: Value = serde_json::from_str(&raw).expect("JSON");
    assert_eq!(
        (&body["type"], &body["error"]["type"]),
        (&json!("error"), &json!("rate_limit_error")),
        "{body}"
    );

    let (status, _, raw) = post_raw(server.url("/v1/messages"), &json!({"model": "chat", "messages": []})).await;
    assert_eq!(status, 400, "{raw}");
    let body: Value = serde_json::from_str(&raw).expect("JSON");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
}

#[tokio::test]
async fn anthropic_truncated_answer_ends_with_an_error_event_not_message_stop() {
    let extra = "[sim.scenarios.bad]\nttft = { median_ms = 5.0, sigma = 0.0 }\ninter_token_ms = 1.0\ntokens = 8\nfailure = { drop_after_tokens = 3, drop_rate = 1.0 }\n";
    let toml = config_toml(&[("a", "openai", "bad")], extra) + "[policies]\nprose = \"truncate\"\n";
    let server = start(&toml).await;
    let (status, _, raw) = post_raw(server.url("/v1/messages"), &anthropic_body(true)).await;
    assert_eq!(status, 200, "committed before the failure: {raw}");
    let events = named_events(&raw);
    assert_eq!(
        events.last().map(|e| e.0.as_str()),
        Some("error"),
        "ends with an error event: {raw}"
    );
    assert!(
        !raw.contains("message_stop"),
        "never message_stop for a cut answer: {raw}"
    );
}

#[tokio::test]
async fn websocket_multiplexes_two_requests_by_id() {
    let server = start(&config_toml(&[("a", "openai", "quick")], QUICK)).await;
    let mut ws = ws_connect(&server, None).await.expect("upgrade");
    ws.send(ws_chat("r1")).await.expect("send");
    ws.send(ws_chat("r2")).await.expect("send");
    let mut text = std::collections::HashMap::<String, String>::new();
    let mut done = 0;
    while done < 2 {
        let m = ws_next(&mut ws).await;
        let id = m["id"].as_str().expect("every message names its id").to_string();
        match m["type"].as_str() {
            Some("start") => assert_eq!(m["route"], "a", "{m}"),
            Some("delta") => text
                .entry(id)
                .or_default()
                .push_str(m["text"].as_str().unwrap_or_default()),
            Some("done") => {
                assert_eq!(m["finish_reason"], "stop", "{m}");
                done += 1;
            }
            Some("usage" | "accepted") => {}
            other => panic!("unexpected message {other:?}: {m}"),
        }
    }
    assert_eq!(text.get("r1").map(String::as_str), Some(TEXT), "r1's text is whole");
    assert_eq!(text.get("r2").map(String::as_str), Some(TEXT), "r2's text is whole");
}

#[tokio::test]
async fn websocket_cancel_closes_the_upstream_connection() {
    let server = start(&config_toml(&[("a", "openai", "long")], LONG)).await;
    let mut ws = ws_connect(&server, None).await.expect("upgrade");
    ws.send(ws_chat("r1")).await.expect("send");
    assert_eq!(ws_next(&mut ws).await["type"], "accepted");
    assert_eq!(ws_next(&mut ws).await["type"], "start");
    ws.send(Message::text(json!({"type": "cancel", "id": "r1"}).to_string()))
        .await
        .expect("send");
    loop {
        let m = ws_next(&mut ws).await;
        if m["type"] == "cancelled" {
            assert_eq!(m["id"], "r1");
            break;
        }
        assert_eq!(
            m["type"], "delta",
            "only deltas already queued may precede the confirmation: {m}"
        );
    }
    let log = wait_for_log(&server, "upstream closed", |log| {
        log.iter().any(|r| r.end == Some(SimEnd::ClientClosed))
    })
    .await;
    assert!(log[0].tokens_sent < 2000, "the upstream did not finish the answer");
}

/// Closing the socket detaches its requests (they could be resumed on another socket);
/// with no reader for `detached_cancel_ms` they are cancelled.
#[tokio::test]
async fn websocket_close_cancels_every_request_once_detached() {
    let extra = format!("{LONG}\n[server.streams]\ndetached_cancel_ms = 200\n");
    let server = start(&config_toml(&[("a", "openai", "long")], &extra)).await;
    let mut ws = ws_connect(&server, None).await.expect("upgrade");
    ws.send(ws_chat("r1")).await.expect("send");
    ws.send(ws_chat("r2")).await.expect("send");
    let mut started = 0;
    while started < 2 {
        if ws_next(&mut ws).await["type"] == "start" {
            started += 1;
        }
    }
    drop(ws);
    wait_for_log(&server, "both upstreams closed", |log| {
        log.iter().filter(|r| r.end == Some(SimEnd::ClientClosed)).count() == 2
    })
    .await;
}

#[tokio::test]
async fn websocket_from_a_foreign_origin_is_refused() {
    let server = start(&config_toml(&[("a", "openai", "quick")], QUICK)).await;
    let refused = ws_connect(&server, Some("https://evil.example")).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("403")),
        "cross-site upgrade refused: {:?}",
        refused.err()
    );
    let same = server.url("").trim_end_matches('/').to_string();
    assert!(
        ws_connect(&server, Some(&same)).await.is_ok(),
        "same-origin upgrade allowed"
    );
}

#[tokio::test]
async fn websocket_oversized_message_closes_with_1009() {
    let extra = format!("{QUICK}\n[server.ws]\nmax_message_bytes = 1024\n");
    let server = start(&config_toml(&[("a", "openai", "quick")], &extra)).await;
    let mut ws = ws_connect(&server, None).await.expect("upgrade");
    ws.send(Message::text("x".repeat(4096))).await.expect("send");
    let close = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(msg) = ws.next().await {
            if let Ok(Message::Close(frame)) = msg {
                return frame.map(|f| u16::from(f.code));
            }
        }
        None
    })
    .await
    .expect("no hang");
    assert_eq!(close, Some(1009), "closed as too big");
}

#[tokio::test]
async fn websocket_restart_is_a_reset_message() {
    let extra = format!(
        "{QUICK}\n[sim.scenarios.dies]\nttft = {{ median_ms = 5.0, sigma = 0.0 }}\ninter_token_ms = 1.0\ntokens = 8\nfailure = {{ drop_after_tokens = 3, drop_rate = 1.0 }}\n"
    );
    let toml =
        config_toml(&[("a", "openai", "dies"), ("b", "openai", "quick")], &extra) + "[policies]\nprose = \"restart\"\n";
    let server = start(&toml).await;
    let mut ws = ws_connect(&server, None).await.expect("upgrade");
    ws.send(ws_chat("r1")).await.expect("send");
    let mut kinds = Vec::new();
    let mut text = String::new();
    loop {
        let m = ws_next(&mut ws).await;
        let kind = m["type"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "delta" => text.push_str(m["text"].as_str().unwrap_or_default()),
            "reset" => text.clear(),
            _ => {}
        }
        kinds.push(kind.clone());
        if kind == "done" || kind == "error" {
            break;
        }
    }
    assert!(
        kinds.contains(&"reset".to_string()),
        "the client is told to discard: {kinds:?}"
    );
    assert_eq!(kinds.last().map(String::as_str), Some("done"), "{kinds:?}");
    assert_eq!(
        text, TEXT,
        "after the reset the client holds exactly the second route's answer"
    );
}

#[tokio::test]
async fn native_sse_get_streams_named_events_for_event_source() {
    let server = start(&config_toml(&[("a", "openai", "quick")], QUICK)).await;
    let request = json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let url = reqwest::Url::parse_with_params(
        &server.url("/v1/stream"),
        &[("q", request.as_str()), ("hedge", "false")],
    )
    .expect("valid URL");
    let resp = client().get(url).send().await.expect("sent");
    assert_eq!(resp.status(), 200);
    let raw = resp.text().await.expect("body");
    let events = named_events(&raw);
    assert_eq!(events.first().map(|e| e.0.as_str()), Some("start"), "{raw}");
    assert_eq!(events.last().map(|e| e.0.as_str()), Some("done"), "{raw}");
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "delta")
        .filter_map(|(_, d)| d["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, TEXT);
}

#[tokio::test]
async fn native_sse_post_with_a_bad_body_is_a_400() {
    let server = start(&config_toml(&[("a", "openai", "quick")], QUICK)).await;
    let (status, _, raw) = post_raw(server.url("/v1/stream"), &json!({"model": "chat"})).await;
    assert_eq!(status, 400, "{raw}");
    let body: Value = serde_json::from_str(&raw).expect("JSON");
    assert_eq!(
        (&body["type"], &body["class"]),
        (&json!("error"), &json!("bad_request")),
        "{body}"
    );
}

#[tokio::test]
async fn no_free_stream_permit_is_a_503_with_retry_after() {
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmax_streams = 1\n[sim]\nlisten = \"127.0.0.1:0\"\n{LONG}\n\
         [[routes]]\nname = \"a\"\nprovider = \"simulated\"\nwire = \"openai\"\nscenario = \"long\"\nmodel = \"m\"\nregion = \"eu\"\n\
         [models.chat]\nroutes = [\"a\"]\n"
    );
    let server = start(&toml).await;
    let first = post_chat(&server, &chat_body(true)).await;
    assert_eq!(first.status(), 200, "the first stream takes the only permit");
    let second = post_chat(&server, &chat_body(true)).await;
    assert_eq!(second.status(), 503, "no permit left");
    assert_eq!(second.headers()["retry-after"], "1");
    let body: Value = second.json().await.expect("JSON");
    assert_eq!(body["error"]["type"], "server_error", "{body}");
    drop(first);
    let mut freed = false;
    for _ in 0..200 {
        let again = client().get(server.url("/v1/models")).send().await.expect("sent");
        assert_eq!(again.status(), 200);
        if server.state.streams.available_permits() == 1 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "dropping the first stream gave its permit back");
}

#[tokio::test]
async fn a_client_prefill_cut_for_the_anthropic_wire_is_not_given_its_whitespace_twice() {
    // The Messages API refuses a final assistant text that ends in whitespace, so the adapter
    // cuts it; the answer then starts by re-emitting it, which the client already holds.
    let server = start(&config_toml(&[("a", "anthropic", "quick")], QUICK)).await;
    let prefill = "Hello from ";
    let mut body = chat_body(true);
    body["messages"] = json!([
        {"role": "user", "content": "Greet."},
        {"role": "assistant", "content": prefill},
    ]);
    let (status, events) = post_native(&server.url(""), &body, &[]).await;
    assert_eq!(status, 200, "{events:?}");
    assert_eq!(native_text(&events), &TEXT[prefill.len()..], "{events:?}");
    let log = server.sim.as_ref().expect("sim").log();
    assert!(
        log.iter()
            .all(|r| r.prefill_chars == prefill.trim_end().chars().count()),
        "{log:?}"
    );
}
