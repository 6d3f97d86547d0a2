//! Test harness: a tailcut server with its in-process simulated upstream on loopback port 0,
//! and small clients for the OpenAI SSE dialect.
#![allow(dead_code)]

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tailcut::config;
use tailcut::server::{self, Running};
use tailcut::sim::SimRecord;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// Routes and models for a test, over the built-in simulated upstream.
pub fn config_toml(routes: &[(&str, &str, &str)], extra: &str) -> String {
    let mut s = String::from(
        "[server]\nlisten = \"127.0.0.1:0\"\nsse_keepalive_ms = 600000\ndrain_grace_ms = 0\n[sim]\nlisten = \"127.0.0.1:0\"\n",
    );
    for (name, wire, scenario) in routes {
        s.push_str(&format!(
            "[[routes]]\nname = \"{name}\"\nprovider = \"simulated\"\nwire = \"{wire}\"\nscenario = \"{scenario}\"\nmodel = \"model-{name}\"\nregion = \"eu\"\n"
        ));
    }
    let names: Vec<String> = routes.iter().map(|r| format!("\"{}\"", r.0)).collect();
    s.push_str(&format!("[models.chat]\nroutes = [{}]\n", names.join(", ")));
    s.push_str(extra);
    s
}

pub async fn start(toml: &str) -> Running {
    let config = config::load_str(toml).unwrap_or_else(|e| panic!("test config must be valid: {e}"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    server::start(config, listener).await.expect("server starts")
}

pub fn client() -> reqwest::Client {
    // TCP_NODELAY: without it a request's header and body writes wait on delayed ACKs.
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .build()
        .expect("client")
}

/// POSTs `body` to the server's OpenAI endpoint.
pub async fn post_chat(server: &Running, body: &Value) -> reqwest::Response {
    client()
        .post(server.url("/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("request sent")
}

pub fn chat_body(stream: bool) -> Value {
    serde_json::json!({
        "model": "chat",
        "stream": stream,
        "messages": [{"role": "user", "content": "Say something."}],
    })
}

/// One SSE response read to its end: status, headers, and each `data:` payload.
pub struct SseReply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub data: Vec<String>,
    /// Raw body text, for framing checks.
    pub raw: String,
}

impl SseReply {
    /// The JSON chunks (everything but `[DONE]`).
    pub fn chunks(&self) -> Vec<Value> {
        self.data
            .iter()
            .filter(|d| d.as_str() != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("chunk is not JSON ({e}): {d}")))
            .collect()
    }

    pub fn text(&self) -> String {
        self.chunks()
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
            .collect()
    }

    pub fn done(&self) -> bool {
        self.data.last().is_some_and(|d| d == "[DONE]")
    }

    pub fn envelope(&self) -> Value {
        self.chunks()
            .iter()
            .rev()
            .find_map(|c| c.get("tailcut").cloned())
            .unwrap_or(Value::Null)
    }
}

pub async fn post_sse(base: &str, body: &Value, headers: &[(&str, &str)]) -> SseReply {
    let mut req = client().post(format!("{base}/v1/chat/completions")).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let mut raw = String::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(b) => raw.push_str(&String::from_utf8_lossy(&b)),
            Err(_) => break,
        }
    }
    let data = raw
        .split("\n\n")
        .flat_map(|event| {
            event
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    SseReply {
        status,
        headers,
        data,
        raw,
    }
}

/// Polls the simulated upstream's log until `pred` holds (bounded), returning the log.
pub async fn wait_for_log(running: &Running, what: &str, pred: impl Fn(&[SimRecord]) -> bool) -> Vec<SimRecord> {
    let sim = running.sim.as_ref().expect("test servers run the simulated upstream");
    for _ in 0..500 {
        let log = sim.log();
        if pred(&log) {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "timed out waiting for the simulated upstream log: {what}; log: {:?}",
        sim.log()
    );
}

/// The native SSE dialect (`POST /v1/stream`): each event's name and JSON data.
pub async fn post_native(base: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, Vec<(String, Value)>) {
    let mut req = client().post(format!("{base}/v1/stream")).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let raw = resp.text().await.unwrap_or_default();
    let mut events = Vec::new();
    for block in raw.split("\n\n") {
        let mut name = String::from("message");
        let mut data = String::new();
        for line in block.lines() {
            if let Some(n) = line.strip_prefix("event: ") {
                name = n.to_string();
            } else if let Some(d) = line.strip_prefix("data: ") {
                data.push_str(d);
            }
        }
        if !data.is_empty() {
            let value = serde_json::from_str(&data).unwrap_or(Value::String(data));
            events.push((name, value));
        }
    }
    (status, events)
}

/// The text a native client ends with, honouring `reset` events.
pub fn native_text(events: &[(String, Value)]) -> String {
    let mut text = String::new();
    for (name, data) in events {
        match name.as_str() {
            "delta" => text.push_str(data["text"].as_str().unwrap_or_default()),
            "reset" => text.clear(),
            _ => {}
        }
    }
    text
}

pub type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub async fn ws_connect(server: &tailcut::server::Running, origin: Option<&str>) -> Result<Ws, String> {
    let url = server.url("/v1/ws").replacen("http://", "ws://", 1);
    let mut req = url.into_client_request().map_err(|e| e.to_string())?;
    if let Some(origin) = origin {
        req.headers_mut()
            .insert("origin", origin.parse().map_err(|_| "bad origin".to_string())?);
    }
    tokio_tungstenite::connect_async(req)
        .await
        .map(|(ws, _)| ws)
        .map_err(|e| e.to_string())
}

pub fn ws_chat(id: &str) -> Message {
    let msg = serde_json::json!({"type": "chat", "id": id, "request": {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}});
    Message::text(msg.to_string())
}

/// The next JSON text message (pings are skipped).
pub async fn ws_next(ws: &mut Ws) -> Value {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("no hang")
            .expect("socket open")
            .expect("no socket error");
        if let Message::Text(t) = msg {
            return serde_json::from_str(t.as_str()).expect("server sends JSON");
        }
    }
}

/// Waits (bounded, on the tokio clock) until `count` of the simulated upstream's requests
/// satisfy `pred`; says how many did if they never do.
pub async fn wait_for_count(server: &Running, what: &str, count: usize, pred: impl Fn(&SimRecord) -> bool) {
    let sim = server.sim.as_ref().expect("the simulated upstream");
    let mut seen = 0;
    for _ in 0..2000 {
        seen = sim.log().iter().filter(|r| pred(r)).count();
        if seen >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: {seen} of {count}");
}
