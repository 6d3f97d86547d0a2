//! Edge limits and lifecycle: slowloris headers, oversized headers and bodies, graceful drain,
//! and `check-config` listing every problem.

mod support;

use std::time::Duration;

use futures::StreamExt;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const QUICK: &str = r#"
[sim.scenarios.quick]
text = "quick"
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 1.0
[sim.scenarios.steady]
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 20.0
tokens = 30
"#;

/// Reads until the server closes the connection (or `limit` passes); the bytes read.
async fn read_until_closed(stream: &mut tokio::net::TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(out),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
    }
}

#[tokio::test]
async fn slow_headers_are_cut_off() {
    let toml = config_toml(&[("a", "openai", "quick")], QUICK).replacen(
        "[server]\n",
        "[server]\nheader_read_timeout_ms = 300\n",
        1,
    );
    let server = start(&toml).await;
    let mut conn = tokio::net::TcpStream::connect(server.addr).await.expect("connect");
    conn.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("partial headers");
    let closed = read_until_closed(&mut conn, Duration::from_secs(10)).await;
    assert!(
        closed.is_some(),
        "a client that never finishes its headers is disconnected"
    );
}

#[tokio::test]
async fn oversized_headers_are_refused() {
    let server = start(&config_toml(&[("a", "openai", "quick")], QUICK)).await;
    let mut conn = tokio::net::TcpStream::connect(server.addr).await.expect("connect");
    let big = "a".repeat(420 * 1024);
    let req = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nx-big: {big}\r\n\r\n");
    let _ = conn.write_all(req.as_bytes()).await;
    let reply = read_until_closed(&mut conn, Duration::from_secs(10))
        .await
        .unwrap_or_default();
    let head = String::from_utf8_lossy(&reply);
    assert!(
        !head.starts_with("HTTP/1.1 200"),
        "a 420 KB header is not served: {head}"
    );
}

#[tokio::test]
async fn oversized_body_is_a_413_with_a_json_error() {
    let toml =
        config_toml(&[("a", "openai", "quick")], QUICK).replacen("[server]\n", "[server]\nmax_body_bytes = 1024\n", 1);
    let server = start(&toml).await;
    let mut body = chat_body(true);
    body["messages"][0]["content"] = serde_json::Value::String("x".repeat(4096));
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 413);
    let json: serde_json::Value = resp.json().await.expect("a JSON error body");
    assert!(
        json["error"]["message"].as_str().is_some_and(|m| m.contains("1024")),
        "{json}"
    );
}

#[tokio::test]
async fn shutdown_drains_in_flight_streams_and_stops_accepting() {
    let server = start(&config_toml(&[("a", "openai", "steady")], QUICK)).await;
    let addr = server.addr;
    let resp = post_chat(&server, &chat_body(true)).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut raw = String::new();
    if let Some(Ok(first)) = body.next().await {
        raw.push_str(&String::from_utf8_lossy(&first));
    }
    let shutdown = tokio::spawn(server.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = tokio::net::TcpStream::connect(addr).await;
    assert!(refused.is_err(), "no new connections once draining");
    while let Some(chunk) = body.next().await {
        raw.push_str(&String::from_utf8_lossy(
            &chunk.expect("the in-flight stream is not cut"),
        ));
    }
    assert!(raw.contains("[DONE]"), "the in-flight stream finished: {raw}");
    shutdown.await.expect("shutdown completes");
}

#[test]
fn check_config_lists_every_problem_and_fails() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("broken.toml");
    std::fs::write(
        &path,
        "[server]\nlisten = \"nowhere\"\n[[routes]]\nname = \"a\"\nprovider = \"openia\"\n[models.chat]\nroutes = [\"a\", \"ghost\"]\n",
    )
    .expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tailcut"))
        .arg("check-config")
        .arg(&path)
        .output()
        .expect("run tailcut");
    assert!(!out.status.success(), "a broken file exits non-zero");
    let err = String::from_utf8_lossy(&out.stderr);
    for path in ["server.listen", "routes[0].provider", "models.chat.routes[1]"] {
        assert!(err.contains(path), "{path} is reported: {err}");
    }
    let ok = std::process::Command::new(env!("CARGO_BIN_EXE_tailcut"))
        .args([
            "check-config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/default.toml"),
        ])
        .output()
        .expect("run tailcut");
    assert!(
        ok.status.success(),
        "the default config checks clean: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

#[tokio::test]
async fn a_non_streaming_answer_past_max_answer_bytes_is_a_502_and_a_streamed_one_is_whole() {
    let toml =
        config_toml(&[("a", "openai", "steady")], QUICK).replacen("[server]\n", "[server]\nmax_answer_bytes = 16\n", 1);
    let server = start(&toml).await;
    let resp = post_chat(&server, &chat_body(false)).await;
    assert_eq!(resp.status(), 502);
    let json: serde_json::Value = resp.json().await.expect("a JSON error body");
    assert_eq!(json["error"]["code"], "answer_too_large", "{json}");
    assert!(
        json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_answer_bytes")),
        "{json}"
    );

    let resp = client()
        .post(server.url("/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .json(&serde_json::json!({
            "model": "chat",
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "Say something."}],
        }))
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 502);
    let json: serde_json::Value = resp.json().await.expect("a JSON error body");
    assert_eq!(json["type"], "error", "{json}");
    assert!(
        json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_answer_bytes")),
        "{json}"
    );

    // Streamed, the same answer is relayed as it comes, not gathered: the limit does not apply.
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.status, 200);
    assert!(reply.done(), "{}", reply.raw);
    assert!(reply.text().len() > 16, "{}", reply.text());
}

#[tokio::test]
async fn a_websocket_keeps_its_connections_place_under_max_connections() {
    let toml =
        config_toml(&[("a", "openai", "quick")], QUICK).replacen("[server]\n", "[server]\nmax_connections = 2\n", 1);
    let server = start(&toml).await;
    let first = ws_connect(&server, None).await.expect("first socket");
    let second = ws_connect(&server, None).await.expect("second socket");
    // Both places are held by the sockets (no HTTP connection is left after an upgrade): a
    // third connection waits in the kernel's backlog, unanswered.
    let mut third = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connects (backlog)");
    third
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("written");
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(500), third.read(&mut byte)).await;
    assert!(early.is_err(), "answered while two sockets held both places: {early:?}");
    // A socket that closes gives its place back, and the waiting connection is served.
    drop(second);
    let answer = read_until_closed(&mut third, Duration::from_secs(10))
        .await
        .unwrap_or_default();
    let answer = format!("{}{}", byte[0] as char, String::from_utf8_lossy(&answer));
    assert!(answer.contains(" 200 "), "{answer}");
    drop(first);
}

#[tokio::test]
async fn readyz_never_waits_on_a_hung_redis_and_names_no_host() {
    // A Redis that accepts and never answers, with a minute's op_timeout: a check that waited
    // on it would hold the load balancer's probe for that long.
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = hung.local_addr().expect("addr");
    let _accepting = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hung.accept().await {
            held.push(socket);
        }
    });
    let extra = format!("{QUICK}\n[state]\nredis_url = \"redis://{addr}\"\nop_timeout_ms = 60000\n");
    let server = start(&config_toml(&[("a", "openai", "quick")], &extra)).await;
    for _ in 0..3 {
        let resp = client()
            .get(server.url("/readyz"))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .expect("answered without waiting for Redis");
        assert_eq!(resp.status(), 200, "Redis never makes the instance unready");
        let text = resp.text().await.unwrap_or_default();
        assert!(text.contains("unreachable"), "{text}");
        assert!(
            !text.contains(&addr.to_string()) && !text.contains("127.0.0.1"),
            "a public page names no host: {text}"
        );
    }
}
