//! Drain as load balancers and SDKs see it, on paused time: `/readyz` fails at once, new chat
//! requests get 503 with Retry-After during the grace while the listener stays open, then new
//! connections are refused; in-flight streams finish, and those still running at the end of
//! the drain end with an in-band `draining` error in their dialect, never a bare EOF.

mod support;

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use support::*;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

const SCENARIOS: &str = r#"
[sim.scenarios.slow]
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 100.0
tokens = 100
"#;

fn config(grace_ms: u64, drain_ms: u64) -> String {
    config_toml(&[("a", "openai", "slow")], SCENARIOS)
        .replacen("drain_grace_ms = 0\n", &format!("drain_grace_ms = {grace_ms}\n"), 1)
        .replacen("[server]\n", &format!("[server]\ndrain_ms = {drain_ms}\n"), 1)
}

/// Connects with a blocking call (on paused time a pending tokio connect lets the clock jump)
/// and sends `request`; `None` when the connection is refused.
fn send_raw(addr: std::net::SocketAddr, request: &str) -> Option<TcpStream> {
    use std::io::Write;
    let mut conn = std::net::TcpStream::connect(addr).ok()?;
    conn.write_all(request.as_bytes()).expect("request written");
    conn.set_nonblocking(true).expect("non-blocking");
    Some(TcpStream::from_std(conn).expect("a tokio socket"))
}

/// One `Connection: close` exchange: the status line and the rest.
async fn exchange(addr: std::net::SocketAddr, request: &str) -> Option<String> {
    let mut conn = send_raw(addr, request)?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut out))
        .await
        .expect("answered")
        .ok();
    Some(String::from_utf8_lossy(&out).into_owned())
}

fn post(path: &str, body: &Value) -> String {
    let body = body.to_string();
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

const READYZ: &str = "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

/// Reads a streamed body to its end.
async fn read_all(resp: reqwest::Response) -> String {
    let mut raw = String::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(b) => raw.push_str(&String::from_utf8_lossy(&b)),
            Err(_) => break,
        }
    }
    raw
}

#[tokio::test(start_paused = true)]
async fn shutdown_fails_readyz_at_once_refuses_new_chats_during_the_grace_then_closes_the_listener() {
    let server = start(&config(2_000, 60_000)).await;
    let addr = server.addr;
    let ready = exchange(addr, READYZ).await.expect("connected");
    assert!(ready.starts_with("HTTP/1.1 200"), "ready before shutdown: {ready}");
    let in_flight = post_chat(&server, &chat_body(true)).await;
    assert_eq!(in_flight.status(), 200, "a stream in flight");
    let begun = Instant::now();
    let shutdown = tokio::spawn(server.shutdown());
    tokio::task::yield_now().await;

    let ready = exchange(addr, READYZ).await.expect("the listener is still open");
    assert!(ready.starts_with("HTTP/1.1 503"), "/readyz fails at once: {ready}");
    let refused = exchange(addr, &post("/v1/chat/completions", &chat_body(true)))
        .await
        .expect("the listener is still open during the grace");
    assert!(refused.starts_with("HTTP/1.1 503"), "new chats get 503: {refused}");
    let head = refused.to_ascii_lowercase();
    assert!(head.contains("retry-after: 1\r\n"), "with Retry-After: {refused}");
    assert!(head.contains("x-request-id: "), "with a request id: {refused}");
    let body = refused.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    let json: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("JSON ({e}): {body}"));
    assert_eq!(json["error"]["code"], "draining", "OpenAI error code: {json}");
    assert!(
        begun.elapsed() < Duration::from_secs(2),
        "all of that within the grace: {:?}",
        begun.elapsed()
    );

    tokio::time::sleep_until(begun + Duration::from_millis(2_100)).await;
    assert!(
        send_raw(addr, READYZ).is_none(),
        "after the grace new connections are refused"
    );
    let raw = read_all(in_flight).await;
    assert!(
        raw.ends_with("data: [DONE]\n\n"),
        "the in-flight stream finished whole: {raw}"
    );
    assert!(!raw.contains("draining"), "and was not cut");
    tokio::time::timeout(Duration::from_secs(120), shutdown)
        .await
        .expect("shutdown ends once the streams are done")
        .expect("shutdown task");
}

#[tokio::test(start_paused = true)]
async fn streams_running_at_the_end_of_the_drain_end_with_a_draining_error_in_their_dialect() {
    let server = start(&config(100, 1_000)).await;
    let base = server.url("");
    let openai = post_chat(&server, &chat_body(true)).await;
    let anthropic = client()
        .post(format!("{base}/v1/messages"))
        .json(&json!({"model": "chat", "max_tokens": 100, "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("sent");
    let native = client()
        .post(format!("{base}/v1/stream"))
        .json(&chat_body(true))
        .send()
        .await
        .expect("sent");
    for resp in [&openai, &anthropic, &native] {
        assert_eq!(resp.status(), 200, "every stream committed");
    }
    let begun = Instant::now();
    let shutdown = tokio::spawn(server.shutdown());
    let (openai, anthropic, native) = tokio::join!(read_all(openai), read_all(anthropic), read_all(native));
    let cut_after = begun.elapsed();
    assert!(
        cut_after >= Duration::from_millis(1_100) && cut_after < Duration::from_secs(3),
        "cut at grace + drain, long before the 10 s answers end: {cut_after:?}"
    );

    let last = |raw: &str| raw.trim_end().rsplit("\n\n").next().unwrap_or_default().to_string();
    let openai_last = last(&openai);
    let chunk: Value = openai_last
        .strip_prefix("data: ")
        .and_then(|d| serde_json::from_str(d).ok())
        .unwrap_or_else(|| panic!("OpenAI ends with an error chunk an SDK raises: {openai_last:?}"));
    assert_eq!(chunk["error"]["code"], "draining", "OpenAI code: {chunk}");
    assert!(!openai.contains("[DONE]"), "no [DONE] after a cut answer");

    let anthropic_last = last(&anthropic);
    assert!(
        anthropic_last.starts_with("event: error\n"),
        "Anthropic ends with an error event: {anthropic_last:?}"
    );
    assert!(anthropic_last.contains("shutting down"), "says why: {anthropic_last}");
    assert!(!anthropic.contains("message_stop"), "not a clean stop");

    let native_last = last(&native);
    assert!(
        native_last.starts_with("event: error\n") && native_last.contains("\"class\":\"draining\""),
        "native ends with an error of class draining: {native_last:?}"
    );
    tokio::time::timeout(Duration::from_secs(10), shutdown)
        .await
        .expect("shutdown ends after the cut")
        .expect("shutdown task");
}

#[test]
fn fly_kill_timeout_covers_the_grace_the_drain_and_the_cut() {
    let config = tailcut::config::load_str(tailcut::config::DEFAULT_TOML).expect("default config");
    let fly = include_str!("../fly.toml");
    let kill = fly
        .lines()
        .find_map(|l| l.trim().strip_prefix("kill_timeout = \""))
        .and_then(|v| v.strip_suffix("s\""))
        .and_then(|v| v.parse::<u64>().ok())
        .expect("fly.toml sets kill_timeout in seconds");
    let needed = config.server.drain_grace + config.server.drain + tailcut::server::CUT_FLUSH;
    assert_eq!(
        Duration::from_secs(kill),
        needed,
        "kill_timeout = drain_grace_ms + drain_ms + the cut's flush"
    );
}

#[tokio::test(start_paused = true)]
async fn a_websocket_answer_gets_the_whole_drain_and_then_a_draining_error() {
    // Only a WebSocket answer runs: the socket is no connection of hyper's after its
    // upgrade, so the drain must wait for the answer itself, then cut it in band.
    let server = start(&config(100, 1_000)).await;
    let mut ws = ws_connect(&server, None).await.expect("upgraded");
    ws.send(ws_chat("w1")).await.expect("sent");
    loop {
        let msg = ws_next(&mut ws).await;
        if msg["type"] == "delta" {
            break;
        }
    }
    let begun = Instant::now();
    let shutdown = tokio::spawn(server.shutdown());
    let error = loop {
        let msg = ws_next(&mut ws).await;
        assert_ne!(
            msg["type"], "done",
            "a 10 s answer cannot finish within the drain: {msg}"
        );
        if msg["type"] == "error" {
            break msg;
        }
    };
    assert_eq!(error["code"], "draining", "{error}");
    assert!(
        begun.elapsed() >= Duration::from_millis(1_100),
        "the answer ran through grace + drain: {:?}",
        begun.elapsed()
    );
    tokio::time::timeout(Duration::from_secs(10), shutdown)
        .await
        .expect("shutdown ends after the cut")
        .expect("shutdown task");
}

#[tokio::test(start_paused = true)]
async fn a_websocket_chat_sent_during_the_drain_is_refused_with_the_draining_code() {
    // The refusal names itself as over HTTP (`code: draining`, a retry hint), so a client
    // that reads the code asks another instance, whatever the class.
    let server = start(&config(1_000, 1_000)).await;
    let mut ws = ws_connect(&server, None).await.expect("upgraded");
    ws.send(ws_chat("w1")).await.expect("sent");
    loop {
        if ws_next(&mut ws).await["type"] == "delta" {
            break;
        }
    }
    let shutdown = tokio::spawn(server.shutdown());
    tokio::time::sleep(Duration::from_millis(10)).await;
    ws.send(ws_chat("w2")).await.expect("sent");
    let refusal = loop {
        let msg = ws_next(&mut ws).await;
        if msg["id"] == "w2" {
            break msg;
        }
    };
    assert_eq!(
        (&refusal["type"], &refusal["class"], &refusal["code"]),
        (&json!("error"), &json!("draining"), &json!("draining")),
        "{refusal}"
    );
    assert_eq!(refusal["retry_after_ms"], 1_000, "{refusal}");
    assert!(
        refusal.get("seq").is_none(),
        "a refusal is not part of a stream: {refusal}"
    );
    tokio::time::timeout(Duration::from_secs(30), shutdown)
        .await
        .expect("shutdown ends after the cut")
        .expect("shutdown task");
}
