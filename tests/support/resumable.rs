//! Clients for resumable streams: `POST /v1/streams`, and an SSE reader of
//! `GET /v1/streams/{id}/events` that yields one event at a time (so a test can drop the
//! connection mid-answer).
#![allow(dead_code)]

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tailcut::server::Running;

/// Routes over one simulated scenario `long` of `tokens` text tokens: with `start`, `usage`
/// and `done` the stream has `tokens + 3` events.
pub fn config(tokens: u32, inter_token_ms: f64, extra: &str) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
sse_keepalive_ms = 600000
{extra}
[sim]
listen = "127.0.0.1:0"
[sim.scenarios.long]
ttft = {{ median_ms = 5.0, sigma = 0.0 }}
inter_token_ms = {inter_token_ms:?}
tokens = {tokens}
[[routes]]
name = "a"
provider = "simulated"
wire = "openai"
scenario = "long"
model = "model-a"
region = "eu"
[models.chat]
routes = ["a"]
"#
    )
}

pub fn chat() -> Value {
    serde_json::json!({"model": "chat", "messages": [{"role": "user", "content": "Tell me a long story."}]})
}

/// `POST /v1/streams`: status and JSON body.
pub async fn open(server: &Running, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
    let resp = super::support::client()
        .post(server.url("/v1/streams"))
        .json(body)
        .send()
        .await
        .expect("request sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.json().await.unwrap_or(Value::Null);
    (status, headers, body)
}

/// Opens a stream and returns (id, events_url, token).
pub async fn open_ok(server: &Running) -> (String, String, String) {
    let (status, _, body) = open(server, &chat()).await;
    assert_eq!(status, 201, "stream created: {body}");
    let s = |k: &str| body[k].as_str().unwrap_or_else(|| panic!("{k} in {body}")).to_string();
    (s("id"), s("events_url"), s("token"))
}

#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub seq: Option<u64>,
    pub name: String,
    pub data: Value,
}

/// One open `GET .../events` response, read event by event.
pub struct EventReader {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub retry: Option<u64>,
    body: Option<futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>>,
    buf: String,
    pub raw: String,
}

impl EventReader {
    /// GETs `url` (relative to the server), with `Last-Event-ID: after` when given.
    pub async fn get(server: &Running, url: &str, after: Option<u64>) -> EventReader {
        EventReader::get_with(&super::support::client(), server, url, after).await
    }

    /// The same with a given client (one connection pool across reconnects).
    pub async fn get_with(client: &reqwest::Client, server: &Running, url: &str, after: Option<u64>) -> EventReader {
        let mut req = client.get(server.url(url));
        if let Some(n) = after {
            req = req.header("last-event-id", n.to_string());
        }
        let resp = req.send().await.expect("request sent");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        EventReader {
            status,
            headers,
            retry: None,
            body: Some(resp.bytes_stream().boxed()),
            buf: String::new(),
            raw: String::new(),
        }
    }

    /// The next event; `None` at the end of the response. Comments and `retry:` are taken
    /// in passing.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(at) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..at + 2).collect();
                if let Some(event) = self.parse(&block) {
                    return Some(event);
                }
                continue;
            }
            let body = self.body.as_mut()?;
            let chunk = tokio::time::timeout(Duration::from_secs(20), body.next())
                .await
                .expect("no hang waiting for an event");
            match chunk {
                Some(Ok(bytes)) => {
                    let text = String::from_utf8_lossy(&bytes).to_string();
                    self.raw.push_str(&text);
                    self.buf.push_str(&text);
                }
                _ => {
                    self.body = None;
                    return None;
                }
            }
        }
    }

    fn parse(&mut self, block: &str) -> Option<Event> {
        let (mut seq, mut name, mut data) = (None, None, String::new());
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("retry: ") {
                self.retry = v.parse().ok();
            } else if let Some(v) = line.strip_prefix("id: ") {
                seq = Some(v.parse().expect("numeric id"));
            } else if let Some(v) = line.strip_prefix("event: ") {
                name = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("data: ") {
                data.push_str(v);
            }
        }
        let name = name?;
        let data = serde_json::from_str(&data).unwrap_or_else(|e| panic!("data is JSON ({e}): {data}"));
        Some(Event { seq, name, data })
    }

    pub async fn rest(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Some(e) = self.next().await {
            out.push(e);
        }
        out
    }
}

/// Reads `url` from `after` to the end.
pub async fn read_all(server: &Running, url: &str, after: Option<u64>) -> (u16, Vec<Event>) {
    let mut reader = EventReader::get(server, url, after).await;
    let events = reader.rest().await;
    (reader.status, events)
}

/// The text a client ends with, honouring `reset`.
pub fn text(events: &[Event]) -> String {
    let mut out = String::new();
    for e in events {
        match e.name.as_str() {
            "delta" => out.push_str(e.data["text"].as_str().unwrap_or_default()),
            "reset" => out.clear(),
            _ => {}
        }
    }
    out
}

pub fn seqs(events: &[Event]) -> Vec<u64> {
    events.iter().filter_map(|e| e.seq).collect()
}
