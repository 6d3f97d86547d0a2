//! Connection hygiene against hostile and unlucky clients, on paused time over real sockets:
//! connections that send nothing (or only part of a request line or HTTP/2 preface), idle
//! keep-alive connections, clients that close before their first token, bodies that trickle
//! or stall, oversized bodies, clients that stop reading, batch floods at the stream gate, and
//! the edge's JSON refusals.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::*;
use tailcut::sim::SimEnd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

const QUICK: &str = r#"
[sim.scenarios.quick]
text = "quick"
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 1.0
[sim.scenarios.slow]
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 1000.0
tokens = 1000
"#;

/// `[server]` keys for one test, on top of the harness's.
fn with_server(keys: &str, extra: &str) -> String {
    config_toml(&[("a", "openai", "quick")], &format!("{QUICK}{extra}")).replacen(
        "[server]\n",
        &format!("[server]\n{keys}\n"),
        1,
    )
}

/// Reads until the server closes the connection, or `limit` passes (`None`).
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(out),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
    }
}

/// A raw HTTP/1.1 answer: status, lowercase header lines, body.
struct Raw {
    status: u16,
    head: String,
    body: String,
}

fn parse(bytes: &[u8]) -> Raw {
    let text = String::from_utf8_lossy(bytes).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP status line: {text:?}"));
    Raw {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_string(),
    }
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("a JSON body ({e}): {body:?}"))
}

/// Connects and writes `first` with blocking calls: on paused time, a tokio connect that is
/// not complete the instant the runtime looks lets the clock jump to the next timer.
fn connect_and_send(addr: std::net::SocketAddr, first: &[u8]) -> TcpStream {
    use std::io::Write;
    let mut conn = std::net::TcpStream::connect(addr).expect("connect");
    conn.write_all(first).expect("first bytes");
    conn.set_nonblocking(true).expect("non-blocking");
    TcpStream::from_std(conn).expect("a tokio socket")
}

async fn healthz_over(addr: std::net::SocketAddr) -> u16 {
    let mut conn = connect_and_send(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let reply = read_until_closed(&mut conn, Duration::from_secs(600))
        .await
        .expect("closed after the answer");
    parse(&reply).status
}

#[tokio::test(start_paused = true)]
async fn silent_and_half_open_connections_are_closed_from_accept_so_healthz_is_served() {
    // The 200 beyond max_connections wait in the kernel's backlog: make room for them.
    let server = start_on(
        &with_server("max_connections = 100\nheader_read_timeout_ms = 2000", ""),
        None,
    )
    .await;
    let started = Instant::now();
    // 300 sockets, three kinds, none of which ever finishes a request head.
    let mut idle = Vec::new();
    for i in 0..300 {
        let first: &[u8] = match i % 3 {
            0 => b"",
            1 => b"P",
            _ => b"PRI * HTTP/2.0\r\n",
        };
        idle.push(connect_and_send(server.addr, first));
    }
    let status = tokio::time::timeout(Duration::from_secs(120), healthz_over(server.addr))
        .await
        .expect("/healthz is served once the idle connections are closed");
    assert_eq!(status, 200, "/healthz answers");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited <= Duration::from_secs(8),
        "at most three rounds of 100 held connections, each closed 2 s after its accept: {waited:?}"
    );
    for (i, conn) in idle.iter_mut().enumerate() {
        let closed = read_until_closed(conn, Duration::from_secs(1)).await;
        assert!(closed.is_some(), "idle socket {i} was closed by the server");
    }
}

#[tokio::test(start_paused = true)]
async fn a_keep_alive_connection_idle_between_requests_is_closed_at_the_idle_timeout() {
    let server = start(&with_server(
        "header_read_timeout_ms = 60000\nidle_timeout_ms = 3000",
        "",
    ))
    .await;
    let mut conn = TcpStream::connect(server.addr).await.expect("connect");
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    let mut buf = [0u8; 1024];
    let n = conn.read(&mut buf).await.expect("an answer");
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
        "served, kept alive"
    );
    let answered = Instant::now();
    let closed = read_until_closed(&mut conn, Duration::from_secs(30)).await;
    assert!(closed.is_some(), "an idle keep-alive connection is closed");
    assert_eq!(
        answered.elapsed(),
        Duration::from_secs(3),
        "at idle_timeout_ms after the answer, not the 60 s header timeout"
    );
}

#[tokio::test(start_paused = true)]
async fn a_client_that_closes_before_the_first_token_closes_its_upstream_at_once() {
    // Nothing is written before the first token, so only reading the end of the client's
    // stream finds it gone (HTTP/1 half-close stays off for this).
    let late = "[sim.scenarios.late]\nttft = { median_ms = 600000.0, sigma = 0.0 }\ninter_token_ms = 1.0\n";
    let server = start(&config_toml(&[("a", "openai", "late")], late)).await;
    let body = serde_json::json!({"model": "chat", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
        .to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let conn = connect_and_send(server.addr, request.as_bytes());
    wait_for_count(&server, "the request reached the upstream", 1, |_| true).await;
    drop(conn);
    wait_for_log(
        &server,
        "the upstream closed within 5 s, long before its first token",
        |log| log.iter().any(|r| r.end == Some(SimEnd::ClientClosed)),
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_body_sent_a_byte_at_a_time_gets_a_408_at_the_body_timeout_and_the_connection_closes() {
    let server = start(&with_server("body_read_timeout_ms = 2000", "")).await;
    let mut conn = TcpStream::connect(server.addr).await.expect("connect");
    conn.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-request-id: slow-1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n")
        .await
        .expect("head");
    let started = Instant::now();
    let (mut read, mut write) = conn.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..100 {
            if write.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), read.read_to_end(&mut reply))
        .await
        .expect("the server answers and closes")
        .ok();
    trickle.abort();
    let waited = started.elapsed();
    let raw = parse(&reply);
    assert_eq!(raw.status, 408, "request timeout: {}", raw.head);
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(3),
        "at body_read_timeout_ms: {waited:?}"
    );
    assert!(
        raw.head.contains("x-request-id: slow-1"),
        "the request id: {}",
        raw.head
    );
    assert!(
        raw.head.contains("connection: close"),
        "the connection closes: {}",
        raw.head
    );
    let json = json_of(&raw.body);
    assert_eq!(json["error"]["code"], "request_timeout", "OpenAI error shape: {json}");
}

#[tokio::test(start_paused = true)]
async fn a_stalled_body_gets_a_408_in_the_anthropic_shape_under_messages() {
    let server = start(&with_server("body_read_timeout_ms = 1500", "")).await;
    let mut conn = TcpStream::connect(server.addr).await.expect("connect");
    conn.write_all(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\ncontent-length: 50\r\n\r\n{\"model\":")
        .await
        .expect("head and a little body");
    let reply = read_until_closed(&mut conn, Duration::from_secs(60))
        .await
        .expect("answered and closed");
    let raw = parse(&reply);
    assert_eq!(raw.status, 408, "timeout");
    let json = json_of(&raw.body);
    assert_eq!(json["type"], "error", "Anthropic top-level type: {json}");
    assert!(json["error"]["type"].is_string(), "Anthropic nested error type: {json}");
    assert!(raw.head.contains("x-request-id: "), "a request id: {}", raw.head);
}

#[tokio::test(start_paused = true)]
async fn an_oversized_content_length_gets_a_413_before_any_body_byte() {
    let server = start(&with_server("max_body_bytes = 1024", "")).await;
    for (path, anthropic) in [("/v1/chat/completions", false), ("/v1/messages", true)] {
        let mut conn = TcpStream::connect(server.addr).await.expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 10000000\r\n\r\n"
        );
        conn.write_all(head.as_bytes()).await.expect("head only");
        let started = Instant::now();
        let reply = read_until_closed(&mut conn, Duration::from_secs(60))
            .await
            .expect("answered without the body and closed");
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "at once, not after a timeout: {:?}",
            started.elapsed()
        );
        let raw = parse(&reply);
        assert_eq!(raw.status, 413, "too large: {path}");
        assert!(raw.head.contains("x-request-id: "), "a request id: {}", raw.head);
        let json = json_of(&raw.body);
        assert!(
            json["error"]["message"].as_str().is_some_and(|m| m.contains("1024")),
            "names the limit: {json}"
        );
        if anthropic {
            assert_eq!(json["type"], "error", "Anthropic shape under /v1/messages: {json}");
            assert!(json["error"].get("code").is_none(), "no OpenAI fields: {json}");
        } else {
            assert_eq!(json["error"]["code"], "request_too_large", "OpenAI shape: {json}");
            assert!(json.get("type").is_none(), "no Anthropic fields: {json}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_chunked_body_is_cut_at_the_limit() {
    let server = start(&with_server("max_body_bytes = 1024", "")).await;
    let mut conn = TcpStream::connect(server.addr).await.expect("connect");
    conn.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .expect("head");
    let chunk = format!("200\r\n{}\r\n", "x".repeat(0x200));
    for _ in 0..3 {
        let _ = conn.write_all(chunk.as_bytes()).await;
    }
    let reply = read_until_closed(&mut conn, Duration::from_secs(60))
        .await
        .expect("answered and closed without the terminating chunk");
    let raw = parse(&reply);
    assert_eq!(raw.status, 413, "the third 512-byte chunk crosses the 1024-byte limit");
}

#[tokio::test(start_paused = true)]
async fn unknown_paths_and_wrong_methods_get_json_in_the_dialect_with_a_request_id() {
    let server = start(&with_server("", "")).await;
    let get = |path: &str| client().get(server.url(path)).header("x-request-id", "rid-7").send();
    let resp = get("/nope").await.expect("sent");
    assert_eq!(resp.status(), 404, "unknown path");
    assert_eq!(resp.headers()["x-request-id"], "rid-7", "the client's request id");
    let json: Value = resp.json().await.expect("JSON");
    assert_eq!(json["error"]["code"], "not_found", "OpenAI shape: {json}");

    // An id a client's parser or a log reader would trip on is replaced by a fresh one.
    let odd = client()
        .get(server.url("/nope"))
        .header("x-request-id", "abc def")
        .send()
        .await
        .expect("sent");
    let id = odd.headers()["x-request-id"].to_str().unwrap_or_default().to_string();
    assert!(id.starts_with("req_") && !id.contains(' '), "a fresh id: {id}");

    let resp = get("/v1/messages").await.expect("sent");
    assert_eq!(resp.status(), 405, "GET on a POST route");
    assert!(resp.headers().contains_key("allow"), "the allow header is kept");
    assert_eq!(resp.headers()["x-request-id"], "rid-7", "request id");
    let json: Value = resp.json().await.expect("JSON");
    assert_eq!(json["type"], "error", "Anthropic shape under /v1/messages: {json}");

    let resp = client()
        .post(server.url("/v1/messages/batches"))
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 404, "unknown path under /v1/messages");
    assert!(resp.headers().contains_key("x-request-id"), "a fresh request id");
    let json: Value = resp.json().await.expect("JSON");
    assert_eq!(json["type"], "error", "Anthropic shape: {json}");

    let resp = client()
        .post(server.url("/admin/routes/ghost/drill"))
        .send()
        .await
        .expect("sent");
    assert_ne!(resp.status(), 200, "a handler's own answers pass through");
    assert!(resp.headers().contains_key("x-request-id"), "and get a request id");
    let json: Value = resp.json().await.expect("JSON");
    assert!(
        json["error"]["message"].is_string(),
        "OpenAI shape for admin errors too: {json}"
    );

    // A handler's own JSON refusal (a resumable stream that does not exist) gets the id too.
    let resp = get("/v1/streams/nope/events").await.expect("sent");
    assert_eq!(resp.status(), 404, "no such stream");
    assert_eq!(resp.headers()["x-request-id"], "rid-7", "request id");

    // A plain GET on the WebSocket path is not a handshake: a JSON error, not axum's text.
    let resp = get("/v1/ws").await.expect("sent");
    assert_eq!(resp.status(), 400, "not a handshake");
    assert_eq!(resp.headers()["x-request-id"], "rid-7", "request id");
    let json: Value = resp.json().await.expect("JSON");
    assert_eq!(json["code"], "not_a_websocket_handshake", "native shape: {json}");
    let resp = client()
        .get(server.url("/v1/ws"))
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("sec-websocket-version", "8")
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 426, "a version other than 13");
    assert_eq!(
        resp.headers()["sec-websocket-version"],
        "13",
        "the version spoken is named"
    );
}

/// Starts a server whose accepted sockets have a small kernel send buffer (they inherit the
/// listener's): on loopback the autotuned buffer holds megabytes, which a test would have to
/// stream to each non-reading client before its writes block.
async fn start_small_buffers(toml: &str) -> tailcut::server::Running {
    start_on(toml, Some(16 * 1024)).await
}

/// Starts a server on a listener with a backlog of 1024 (tokio's default is 128) and, when
/// given, a small send buffer for its accepted sockets.
async fn start_on(toml: &str, send_buffer: Option<u32>) -> tailcut::server::Running {
    let config = tailcut::config::load_str(toml).unwrap_or_else(|e| panic!("test config must be valid: {e}"));
    let socket = TcpSocket::new_v4().expect("socket");
    if let Some(bytes) = send_buffer {
        socket.set_send_buffer_size(bytes).expect("small send buffer");
    }
    socket.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let listener = socket.listen(1024).expect("listen");
    tailcut::server::start(config, listener).await.expect("server starts")
}

/// A client socket with a tiny receive buffer that sends one streaming chat and never reads.
async fn non_reader(addr: std::net::SocketAddr, body: &Value) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("small receive buffer");
    let mut conn = socket.connect(addr).await.expect("connect");
    let body = body.to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.expect("request");
    conn
}

/// An answer of `words` words of `size` bytes, one every 10 ms: it fills a non-reader's
/// buffers within a second and is still being written seconds later.
fn flood(words: usize, size: usize) -> String {
    let word = "x".repeat(size);
    format!(
        "[sim.scenarios.flood]\nttft = {{ median_ms = 5.0, sigma = 0.0 }}\ninter_token_ms = 10.0\ntext = \"{}\"\n",
        vec![word; words].join(" ")
    )
}

#[tokio::test(start_paused = true)]
async fn non_reading_clients_are_dropped_at_the_write_timeout_and_free_their_slots_and_upstreams() {
    let clients = 200;
    let toml = config_toml(&[("a", "openai", "flood")], &format!("{QUICK}{}", flood(600, 2048))).replacen(
        "[server]\n",
        &format!("[server]\nmax_streams = {clients}\nclient_write_timeout_ms = 2000\n"),
        1,
    );
    let server = start_small_buffers(&toml).await;
    let mut held = Vec::new();
    for _ in 0..clients {
        held.push(non_reader(server.addr, &chat_body(true)).await);
    }
    wait_for_count(&server, "non-readers' upstreams started", clients, |r| {
        r.first_token_at_ms.is_some()
    })
    .await;
    let busy = post_chat(&server, &chat_body(true)).await;
    assert_eq!(
        busy.status(),
        503,
        "while the non-readers hold every slot, others get 503"
    );
    wait_for_count(&server, "non-readers' upstreams closed", clients, |r| {
        r.end == Some(SimEnd::ClientClosed)
    })
    .await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(
        reply.status, 200,
        "once the write timeout passed, a new request is served, not a 503"
    );
    assert!(reply.done(), "and streamed to its end");
    assert_eq!(
        server.state.streams.available_permits(),
        clients,
        "every non-reader's slot came back"
    );
    for conn in held.iter_mut() {
        let mut buf = vec![0u8; 64 * 1024];
        // Drain what the kernel still holds; the server has closed its end.
        let end = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(end.is_ok(), "the server closed a non-reader's connection");
    }
}

#[tokio::test(start_paused = true)]
async fn max_stream_holds_for_a_client_that_does_not_read() {
    let toml = config_toml(&[("a", "openai", "flood")], &format!("{QUICK}{}", flood(1000, 2048))).replacen(
        "[server]\n",
        "[server]\nmax_streams = 1\nclient_write_timeout_ms = 600000\nmax_stream_ms = 3000\n",
        1,
    );
    let server = start_small_buffers(&toml).await;
    let _reader_that_never_reads = non_reader(server.addr, &chat_body(true)).await;
    let started = Instant::now();
    wait_for_count(&server, "the stream started", 1, |r| r.first_token_at_ms.is_some()).await;
    let busy = post_chat(&server, &chat_body(true)).await;
    assert_eq!(busy.status(), 503, "the one slot is held while the stream runs");
    wait_for_count(
        &server,
        "the non-reader's upstream is closed at max_stream_ms",
        1,
        |r| r.end == Some(SimEnd::ClientClosed),
    )
    .await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(3) && elapsed < Duration::from_secs(5),
        "at max_stream_ms, not before and not at the end of the answer: {elapsed:?}"
    );
    let served = post_chat(&server, &chat_body(true)).await;
    assert_eq!(served.status(), 200, "the slot was released without the client reading");
}

// On real time: nothing here is timing logic, and on paused time the clock jumped to the
// held answers' next token whenever the runtime waited on the 300 sockets, so under load
// some 1,000 s answers finished mid-test and gave their slots to interactive requests.
#[tokio::test]
async fn batch_may_hold_only_its_share_so_interactive_gets_the_rest() {
    let toml = config_toml(&[("a", "openai", "slow")], QUICK).replacen(
        "[server]\n",
        "[server]\nmax_streams = 100\nbatch_max_share = 0.8\n",
        1,
    );
    let server = start(&toml).await;
    let send = |priority: &'static str| {
        let url = server.url("/v1/chat/completions");
        async move {
            client()
                .post(url)
                .header("x-tailcut-priority", priority)
                .json(&chat_body(true))
                .send()
                .await
                .expect("sent")
        }
    };
    let mut open = Vec::new();
    let batch = futures::future::join_all((0..150).map(|_| send("batch"))).await;
    let batch_ok = tally(batch, &mut open);
    let interactive = futures::future::join_all((0..150).map(|_| send("interactive"))).await;
    let interactive_ok = tally(interactive, &mut open);
    assert_eq!(batch_ok, 80, "batch stops at 80% of max_streams");
    assert_eq!(interactive_ok, 20, "interactive gets the 20 slots batch may not take");
}

/// How many were served (kept open in `open`); every other one must be a 503.
fn tally(resps: Vec<reqwest::Response>, open: &mut Vec<reqwest::Response>) -> usize {
    let mut ok = 0;
    for r in resps {
        if r.status() == 200 {
            ok += 1;
            open.push(r);
        } else {
            assert_eq!(r.status(), 503, "a refusal is a 503");
        }
    }
    ok
}

#[tokio::test(start_paused = true)]
async fn an_http1_1_request_with_no_host_or_two_is_refused_and_the_connection_closed() {
    let server = start(&with_server("", "")).await;
    let body = r#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#;
    let requests = [
        (format!("POST /v1/chat/completions HTTP/1.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len()), 0),
        (format!("POST /v1/messages HTTP/1.1\r\nHost: a\r\nHost: b\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len()), 2),
    ];
    for (request, count) in requests {
        let mut conn = connect_and_send(server.addr, request.as_bytes());
        let reply = read_until_closed(&mut conn, Duration::from_secs(60))
            .await
            .expect("answered and closed");
        let raw = parse(&reply);
        assert_eq!(raw.status, 400, "{count} Host lines: {}", raw.head);
        assert!(raw.head.contains("connection: close"), "{}", raw.head);
        assert!(raw.head.contains("x-request-id: "), "{}", raw.head);
        let json = json_of(&raw.body);
        let code = if count == 0 {
            &json["error"]["code"]
        } else {
            &json["error"]["type"]
        };
        let expected = if count == 0 {
            "bad_host"
        } else {
            "invalid_request_error"
        };
        assert_eq!(code, expected, "in the path's dialect: {json}");
        assert!(json.to_string().contains(&format!("has {count}")), "{json}");
    }
    // HTTP/1.0 may go without one.
    let mut conn = connect_and_send(server.addr, b"GET /healthz HTTP/1.0\r\n\r\n");
    let reply = read_until_closed(&mut conn, Duration::from_secs(60))
        .await
        .expect("answered and closed");
    assert_eq!(parse(&reply).status, 200);
}

#[tokio::test(start_paused = true)]
async fn an_http2_client_that_never_opens_a_streams_window_loses_its_connection_at_the_write_timeout() {
    // A client over h2c that keeps its connection alive (the h2 library answers pings) but
    // never gives one stream's answer any window: hyper never polls that stream's body, so
    // only the pump's stall can end it, and then the whole connection is closed.
    let toml = config_toml(&[("a", "openai", "flood")], &format!("{QUICK}{}", flood(600, 64))).replacen(
        "[server]\n",
        "[server]\nclient_write_timeout_ms = 2000\nidle_timeout_ms = 600000\n",
        1,
    );
    let server = start(&toml).await;
    let tcp = TcpStream::connect(server.addr).await.expect("connect");
    let (mut send, connection) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .expect("h2c handshake");
    let connection = tokio::spawn(connection);
    let body = chat_body(true).to_string();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{}/v1/chat/completions", server.addr))
        .header("content-type", "application/json")
        .body(())
        .expect("request");
    let (response, mut body_tx) = send.send_request(request, false).expect("stream opened");
    body_tx.send_data(bytes::Bytes::from(body), true).expect("body sent");
    let response = tokio::time::timeout(Duration::from_secs(30), response)
        .await
        .expect("a head")
        .expect("a response");
    assert_eq!(response.status(), 200);
    // Held, never read, never given a window: the connection ends (and with it the stream).
    let ended = tokio::time::timeout(Duration::from_secs(120), connection).await;
    assert!(ended.is_ok(), "the connection is still open two minutes later");
    drop(response);
}
