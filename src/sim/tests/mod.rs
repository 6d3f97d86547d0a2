//! Loopback tests of the simulator: real sockets on 127.0.0.1:0, real HTTP with reqwest,
//! asserting the exact wire formats, the faults, and the request log.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use super::*;

mod caching;
mod continuation;
mod control;
mod cuts;
mod faults;
mod openai_extras;
mod strict;
mod thinking;
mod wire;

/// Both wire formats, by the name a record gives them.
const WIRES: [&str; 2] = ["openai", "anthropic"];

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

fn events_json(text: &str) -> Vec<Value> {
    let events = events(text);
    events[..events.len() - 1].iter().map(|e| parse(&e.1)).collect()
}

/// No waits at all, for tests that send hundreds of requests.
fn instant(text: &str) -> Scenario {
    Scenario {
        ttft: Ttft {
            median_ms: 0.0,
            ..Ttft::default()
        },
        inter_token_ms: 0.0,
        ..quick(text)
    }
}

/// A request on `wire` ("openai" or "anthropic").
async fn send(handle: &SimHandle, wire: &str, scenario: &str, body: Value) -> reqwest::Response {
    match wire {
        "openai" => openai(handle, scenario, body).await,
        _ => anthropic(handle, scenario, body).await,
    }
}

/// A streamed request whose messages are `messages`.
fn stream_body(messages: Value) -> Value {
    json!({"model": "m", "stream": true, "messages": messages})
}

/// The body's bytes up to its end, and whether it ended broken (a simulated drop).
async fn read_body(response: reqwest::Response) -> (String, bool) {
    let mut body = response.bytes_stream();
    let mut seen = Vec::new();
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(bytes) => seen.extend_from_slice(&bytes),
            Err(_) => return (String::from_utf8_lossy(&seen).into_owned(), true),
        }
    }
    (String::from_utf8_lossy(&seen).into_owned(), false)
}

/// The text deltas of a stream on `wire`, in order (role chunks and non-JSON events skipped).
fn text_deltas(wire: &str, raw: &str) -> Vec<String> {
    raw.split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter_map(|v| {
            let text = match wire {
                "openai" => v["choices"][0]["delta"]["content"].as_str(),
                _ => v["delta"]["text"].as_str(),
            };
            text.filter(|t| !t.is_empty()).map(str::to_owned)
        })
        .collect()
}

/// The whole text a streamed request on `wire` gets.
async fn streamed_text(handle: &SimHandle, wire: &str, scenario: &str, body: Value) -> String {
    let response = send(handle, wire, scenario, body).await;
    assert_eq!(response.status(), 200, "{wire}: status");
    let (raw, broken) = read_body(response).await;
    assert!(!broken, "{wire}: body must end cleanly: {raw}");
    text_deltas(wire, &raw).concat()
}
