//! The lean client: hyper 1 over pre-opened keep-alive connections, on the caller's
//! (current-thread) runtime, timing each OpenAI-style SSE answer as it arrives: the instant
//! of every content delta and its text.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// One keep-alive connection to a server.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    host: String,
}

/// What a request is sent as: the path, the JSON body, and whether tailcut-only headers go.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub path: String,
    pub body: Bytes,
    pub tailcut: bool,
    /// An `authorization: Bearer` key (a peer proxy's master key).
    pub bearer: Option<String>,
}

/// One answer as the client saw it.
#[derive(Debug, Default, Clone)]
pub struct Timeline {
    /// Each content delta: when its body frame arrived (since the request was sent) and its text.
    pub deltas: Vec<(Duration, String)>,
}

impl Timeline {
    pub fn ttft(&self) -> Option<Duration> {
        self.deltas.first().map(|d| d.0)
    }

    /// Gaps between consecutive content deltas.
    pub fn gaps(&self) -> impl Iterator<Item = Duration> + '_ {
        self.deltas.windows(2).map(|w| w[1].0.saturating_sub(w[0].0))
    }
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Result<Conn, String> {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, connection) = http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| format!("handshake with {addr}: {e}"))?;
        tokio::spawn(connection);
        Ok(Conn {
            sender,
            host: addr.to_string(),
        })
    }

    /// Sends `target`'s request and reads the answer to its end.
    pub async fn chat(&mut self, target: &Target) -> Result<Timeline, String> {
        let (start, response) = self.send(target).await?;
        let mut body = response.into_body();
        let mut timeline = Timeline::default();
        let mut parser = SseContent::default();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("body: {e}"))?;
            let at = start.elapsed();
            if let Some(data) = frame.data_ref() {
                for text in parser.push(data) {
                    timeline.deltas.push((at, text));
                }
            }
        }
        Ok(timeline)
    }

    /// Sends `target`'s request; the answer is left to the caller (held streams). A status
    /// other than 2xx is an error.
    pub async fn send(&mut self, target: &Target) -> Result<(Instant, hyper::Response<hyper::body::Incoming>), String> {
        let mut builder = Request::post(target.path.as_str())
            .header("host", self.host.as_str())
            .header("content-type", "application/json");
        if target.tailcut {
            builder = builder.header("x-tailcut-hedge", "off");
        }
        if let Some(key) = &target.bearer {
            builder = builder.header("authorization", format!("Bearer {key}"));
        }
        let request = builder
            .body(Full::new(target.body.clone()))
            .map_err(|e| e.to_string())?;
        self.sender.ready().await.map_err(|e| format!("connection: {e}"))?;
        let start = Instant::now();
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(|e| format!("request: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("status {}", response.status()));
        }
        Ok((start, response))
    }
}

/// Pulls the non-empty `choices[0].delta.content` strings out of OpenAI SSE bytes.
#[derive(Debug, Default)]
pub struct SseContent {
    buf: BytesMut,
}

impl SseContent {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
            let line = self.buf.split_to(end + 1);
            let Some(data) = line.strip_prefix(b"data:") else {
                continue;
            };
            let Ok(value) = serde_json::from_slice::<serde_json::Value>(data.trim_ascii()) else {
                continue;
            };
            if let Some(text) = value["choices"][0]["delta"]["content"].as_str() {
                if !text.is_empty() {
                    out.push(text.to_string());
                }
            }
        }
        out
    }
}

/// A chat request's JSON body.
pub fn chat_body(model: &str) -> Bytes {
    let body = serde_json::json!({
        "model": model, "stream": true,
        "messages": [{"role": "user", "content": "Tell me something."}],
    });
    Bytes::from(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_deltas_are_found_across_frame_cuts() {
        let mut p = SseContent::default();
        let mut got = p.push(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"con");
        assert!(got.is_empty(), "an empty role delta and half an event are not content");
        got = p.push(b"tent\":\"Hi\"}}]}\n\n: ping\n\ndata: [DONE]\n\n");
        assert_eq!(got, vec!["Hi".to_string()], "the completed event, once");
    }
}
