//! End to end over loopback: `server.max_header_bytes` is enforced exactly, with a JSON 431
//! (`headers_too_large`) in the path's dialect, over HTTP/1.1 and over HTTP/2 (prior
//! knowledge), for heads the protocol libraries alone would have let through (HTTP/1: under
//! hyper's 8 KiB buffer floor) or reset bare (HTTP/2: over h2's header-list limit).

mod support;

use serde_json::Value;
use support::*;
use tailcut::server::Running;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LIMIT: usize = 4096;

async fn start_limited() -> Running {
    let toml = config_toml(&[("a", "openai", "fast-stable")], "").replacen(
        "[server]\n",
        &format!("[server]\nmax_header_bytes = {LIMIT}\n"),
        1,
    );
    start(&toml).await
}

/// One HTTP/1.1 GET of `path` whose header fields (`host`, `x-pad`, `connection`) come to
/// exactly `block` bytes as HTTP/1.1 lines; returns the status and the body.
async fn raw_get(server: &Running, path: &str, block: usize) -> (u16, String) {
    let host = "host: t\r\n";
    let close = "connection: close\r\n";
    // "x-pad: " + value + CRLF.
    let pad = block - host.len() - close.len() - "x-pad: \r\n".len();
    let head = format!("GET {path} HTTP/1.1\r\n{host}x-pad: {}\r\n{close}\r\n", "p".repeat(pad));
    let mut socket = tokio::net::TcpStream::connect(server.addr).await.expect("connect");
    socket.write_all(head.as_bytes()).await.expect("request written");
    let mut answer = Vec::new();
    socket.read_to_end(&mut answer).await.expect("answer read");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"));
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (status, body)
}

#[tokio::test]
async fn an_http1_head_of_exactly_the_limit_passes_and_one_byte_more_is_a_json_431() {
    let server = start_limited().await;
    let (status, body) = raw_get(&server, "/healthz", LIMIT).await;
    assert_eq!(status, 200, "a head of exactly max_header_bytes is served: {body}");

    let (status, body) = raw_get(&server, "/healthz", LIMIT + 1).await;
    assert_eq!(status, 431, "one byte over max_header_bytes: {body}");
    let json: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("a JSON body ({e}): {body:?}"));
    assert_eq!(json["error"]["code"], "headers_too_large", "OpenAI shape: {json}");
    let message = json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("max_header_bytes"), "names the setting: {message}");
}

#[tokio::test]
async fn an_http1_head_over_the_limit_is_refused_in_the_paths_dialect_with_the_clients_id() {
    let server = start_limited().await;
    let resp = client()
        .post(server.url("/v1/messages"))
        .header("x-request-id", "rid-431")
        .header("x-pad", "p".repeat(LIMIT))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 431, "over max_header_bytes");
    assert_eq!(
        resp.headers().get("x-request-id").and_then(|v| v.to_str().ok()),
        Some("rid-431"),
        "the client's request id"
    );
    let json: Value = resp.json().await.expect("JSON");
    assert_eq!(json["type"], "error", "Anthropic shape: {json}");
    assert_eq!(
        json["error"]["message"]
            .as_str()
            .map(|m| m.contains("max_header_bytes")),
        Some(true),
        "{json}"
    );
}

fn h2_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .http2_prior_knowledge()
        .build()
        .expect("h2 client")
}

#[tokio::test]
async fn an_http2_header_list_over_the_limit_is_a_json_431_not_a_reset_stream() {
    let server = start_limited().await;
    let client = h2_client();
    let resp = client
        .get(server.url("/v1/models"))
        .header("x-pad", "p".repeat(LIMIT))
        .send()
        .await
        .expect("an answer, not a reset stream");
    assert_eq!(resp.version(), reqwest::Version::HTTP_2, "spoken over h2c");
    assert_eq!(resp.status(), 431, "over max_header_bytes");
    let json: Value = resp.json().await.expect("JSON");
    assert_eq!(json["error"]["code"], "headers_too_large", "{json}");

    // The connection serves the next request: only the stream was refused.
    let resp = client
        .get(server.url("/healthz"))
        .header("x-pad", "p".repeat(LIMIT / 2))
        .send()
        .await
        .expect("served");
    assert_eq!(resp.status(), 200, "under the limit");
}
