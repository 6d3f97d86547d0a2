//! Hostile clients the other suites do not play, over real sockets: an HTTP/2 client that
//! never opens one stream's window while its connection stays alive, an HTTP/2 body that
//! stalls, tool schemas built to be expensive to compile, and `x-tailcut-*` headers with
//! bytes that are not visible ASCII.

mod support;

use std::time::Duration;

use futures::StreamExt;

use support::*;
use tailcut::sim::SimEnd;

/// An answer of `words` words of `size` bytes, one every 10 ms.
fn flood(words: usize, size: usize) -> String {
    let word = "x".repeat(size);
    format!(
        "[sim.scenarios.flood]\nttft = {{ median_ms = 5.0, sigma = 0.0 }}\ninter_token_ms = 10.0\ntext = \"{}\"\n",
        vec![word; words].join(" ")
    )
}

fn with_server(scenario: &str, extra: &str, keys: &str) -> String {
    config_toml(&[("a", "openai", scenario)], extra).replacen("[server]\n", &format!("[server]\n{keys}\n"), 1)
}

/// An HTTP/2 (prior knowledge) client whose streams get a small flow-control window that is
/// only reopened as the body is read: a stream whose body is never read stalls at once,
/// while the connection itself stays alive (pings are answered).
fn h2_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .http2_prior_knowledge()
        .http2_initial_stream_window_size(4096)
        .http2_initial_connection_window_size(16 * 1024 * 1024)
        .build()
        .expect("h2 client")
}

#[tokio::test(start_paused = true)]
async fn an_http2_stream_that_is_not_read_is_dropped_at_the_write_timeout_though_its_connection_lives() {
    let streams = 4;
    let toml = with_server(
        "flood",
        &flood(600, 2048),
        &format!("max_streams = {streams}\nclient_write_timeout_ms = 2000\n"),
    );
    let server = start(&toml).await;
    let h2 = h2_client();
    let mut held = Vec::new();
    for _ in 0..streams {
        let resp = h2
            .post(server.url("/v1/chat/completions"))
            .json(&chat_body(true))
            .send()
            .await
            .expect("sent over h2");
        assert_eq!(resp.status(), 200, "served");
        assert_eq!(resp.version(), reqwest::Version::HTTP_2, "over HTTP/2");
        held.push(resp);
    }
    let started = tokio::time::Instant::now();
    let busy = post_chat(&server, &chat_body(true)).await;
    assert_eq!(
        busy.status(),
        503,
        "while the unread streams hold every slot, others get 503"
    );
    wait_for_count(&server, "the unread streams' upstreams closed", streams, |r| {
        r.end == Some(SimEnd::ClientClosed)
    })
    .await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(5),
        "at the write timeout (2 s after the socket filled), not at max_stream_ms: {waited:?}"
    );
    assert_eq!(
        server.state.streams.available_permits(),
        streams,
        "every unread stream's slot came back"
    );
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(
        reply.status, 200,
        "a new request is served once the unread streams were dropped"
    );
    drop(held);
}

/// `count` tools whose schemas each hold one regex that takes tens of milliseconds to
/// compile: a few kilobytes that would cost seconds of a worker thread per attempt.
fn costly_tools(count: usize, anthropic: bool) -> Vec<serde_json::Value> {
    (0..count)
        .map(|i| {
            let schema = serde_json::json!({
                "type": "object",
                // Within the pattern size limit (`\\w{1,200}` nested 200 times is refused on
                // its own, see tool_cost's tests): the count is what this limit is about.
                "properties": {"a": {"type": "string", "pattern": format!("^([a-z0-9]{{1,20}}-){{1,20}}{i}$")}},
            });
            if anthropic {
                serde_json::json!({"name": format!("t{i}"), "input_schema": schema})
            } else {
                serde_json::json!({"type": "function", "function": {"name": format!("t{i}"), "parameters": schema}})
            }
        })
        .collect()
}

fn quick() -> String {
    with_server(
        "quick",
        "[sim.scenarios.quick]\ntext = \"quick\"\nttft = { median_ms = 5.0, sigma = 0.0 }\ninter_token_ms = 1.0\n",
        "",
    )
}

#[tokio::test]
async fn tool_schemas_with_too_many_regexes_are_a_400_naming_the_limit_before_any_upstream() {
    let server = start(&quick()).await;
    let limit = tailcut::types::MAX_SCHEMA_PATTERNS;
    let mut openai = chat_body(true);
    openai["tools"] = serde_json::Value::Array(costly_tools(limit + 1, false));
    let resp = post_chat(&server, &openai).await;
    assert_eq!(resp.status(), 400, "refused");
    let body: serde_json::Value = resp.json().await.expect("a JSON error");
    assert_eq!(
        body["error"]["code"], "invalid_tool_schema",
        "the OpenAI error has the schema's code: {body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("regular expressions")),
        "and names the limit: {body}"
    );
    assert_eq!(
        body["error"]["param"],
        format!("tools[{limit}].function.parameters"),
        "and the tool that passed it: {body}"
    );

    let anthropic = serde_json::json!({
        "model": "chat", "max_tokens": 16, "stream": true,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": costly_tools(limit + 1, true),
    });
    let resp = client()
        .post(server.url("/v1/messages"))
        .json(&anthropic)
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 400, "refused in the Anthropic dialect too");
    let text = resp.text().await.unwrap_or_default();
    assert!(text.contains("pattern"), "the Anthropic error names the limit: {text}");

    let mut ws = ws_connect(&server, None).await.expect("ws connects");
    let chat = serde_json::json!({"type": "chat", "id": "c1", "request": openai});
    futures::SinkExt::send(&mut ws, tokio_tungstenite::tungstenite::Message::text(chat.to_string()))
        .await
        .expect("ws send");
    let reply = ws_next(&mut ws).await;
    assert_eq!(reply["type"], "error", "the WebSocket refuses it too: {reply}");
    assert!(
        reply.to_string().contains("regular expressions"),
        "naming the limit: {reply}"
    );

    let sim = server.sim.as_ref().expect("the simulated upstream");
    assert!(sim.log().is_empty(), "no upstream was asked: {:?}", sim.log());

    // At the limit the request is served.
    let mut ok = chat_body(true);
    ok["tools"] = serde_json::Value::Array(costly_tools(limit, false));
    let reply = post_sse(&server.url(""), &ok, &[]).await;
    assert_eq!(reply.status, 200, "at the limit it is served");
}

#[tokio::test]
async fn more_tools_than_openai_allows_is_a_400_naming_the_limit() {
    let server = start(&quick()).await;
    let limit = tailcut::transport::tool_cost::MAX_TOOLS;
    let tools: Vec<serde_json::Value> = (0..=limit)
        .map(|i| serde_json::json!({"type": "function", "function": {"name": format!("t{i}"), "parameters": {"type": "object"}}}))
        .collect();
    let mut body = chat_body(true);
    body["tools"] = serde_json::Value::Array(tools);
    let resp = post_chat(&server, &body).await;
    assert_eq!(resp.status(), 400, "refused");
    let json: serde_json::Value = resp.json().await.expect("a JSON error");
    assert_eq!(json["error"]["code"], "max_tools_exceeded", "names the limit: {json}");
}

#[tokio::test]
async fn a_tailcut_header_that_is_not_visible_ascii_is_a_400_naming_it_not_ignored() {
    // `x-tailcut-region` narrows where a request may go: read as absent, it would silently
    // widen the request to every region.
    let server = start(&quick()).await;
    for name in ["x-tailcut-region", "x-tailcut-response-type", "x-tailcut-priority"] {
        let value = reqwest::header::HeaderValue::from_bytes(b"eu\xff").expect("obs-text is a valid header value");
        let resp = client()
            .post(server.url("/v1/chat/completions"))
            .header(name, value.clone())
            .json(&chat_body(true))
            .send()
            .await
            .expect("sent");
        assert_eq!(resp.status(), 400, "{name} with a non-ASCII byte is refused");
        let body: serde_json::Value = resp.json().await.expect("a JSON error");
        assert!(
            body["error"]["message"].as_str().unwrap_or_default().contains(name),
            "the error names {name}: {body}"
        );

        let url = server.url("/v1/ws").replacen("http://", "ws://", 1);
        let mut req =
            tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url).expect("a ws request");
        req.headers_mut().insert(name, value);
        let refused = tokio_tungstenite::connect_async(req).await;
        assert!(
            refused.is_err(),
            "the WebSocket upgrade refuses {name} with a non-ASCII byte too"
        );
    }
    let sim = server.sim.as_ref().expect("the simulated upstream");
    assert!(sim.log().is_empty(), "no upstream was asked: {:?}", sim.log());
}

#[tokio::test(start_paused = true)]
async fn an_http2_request_body_that_stalls_gets_a_408_at_the_body_timeout() {
    let server = start(&with_server(
        "quick",
        "[sim.scenarios.quick]\ntext = \"quick\"\nttft = { median_ms = 5.0, sigma = 0.0 }\ninter_token_ms = 1.0\n",
        "body_read_timeout_ms = 2000\n",
    ))
    .await;
    // Half a JSON body, then nothing, with the stream left open.
    let part = futures::stream::iter([Ok::<_, std::io::Error>(bytes_of("{\"model\": \"chat\", \"mess"))])
        .chain(futures::stream::pending());
    let started = tokio::time::Instant::now();
    let resp = tokio::time::timeout(
        Duration::from_secs(60),
        h2_client()
            .post(server.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(part))
            .send(),
    )
    .await
    .expect("answered, not held")
    .expect("sent over h2");
    assert_eq!(resp.version(), reqwest::Version::HTTP_2, "over HTTP/2");
    assert_eq!(resp.status(), 408, "a stalled body is a 408");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(4),
        "at the body timeout: {waited:?}"
    );
}

fn bytes_of(text: &'static str) -> bytes::Bytes {
    bytes::Bytes::from_static(text.as_bytes())
}
