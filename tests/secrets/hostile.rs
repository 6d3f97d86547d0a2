//! The hostile upstream of the canary test: one axum server on loopback port 0 that answers
//! every request by failing the way the first word of its path names (a route's base_url
//! picks it), echoing the request's headers and the bare key into the failure.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use serde_json::{json, Value};

/// The hostile upstream's ways to fail, named by the first word of a route's name (its
/// base_url path), each echoing the request headers and the bare key.
pub const FAILURES: [&str; 10] = [
    "s401",      // 401 JSON error echoing the headers
    "s400",      // 400 JSON error echoing the headers, and a `headers` object beside it
    "s500",      // 500 plain-text dump of the headers
    "s429",      // 429 JSON error with Retry-After, and the key in a response header
    "inband",    // 200 stream whose first event is an in-band error echoing the headers
    "inbandmid", // 200 stream: one text delta, then the in-band error
    "malformed", // 200 stream whose event has the key where a number belongs
    "garbage",   // 200 stream with a `data:` line that is not JSON, holding the headers
    "cutbody",   // 502 error body cut mid-way (Content-Length promises more)
    "cutstream", // 200 stream: one text delta, then an event cut mid-line holding the headers
];

#[derive(Clone, Default)]
pub struct Hostile {
    /// Requests seen, by path.
    pub hits: Arc<Mutex<HashMap<String, u32>>>,
}

pub async fn start() -> (SocketAddr, Hostile) {
    let hostile = Hostile::default();
    let app = axum::Router::new().fallback(answer).with_state(hostile.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, hostile)
}

async fn answer(State(hostile): State<Hostile>, uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path().to_string();
    *hostile
        .hits
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(path.clone())
        .or_default() += 1;
    let scenario = path
        .trim_start_matches('/')
        .split(['-', '/'])
        .next()
        .unwrap_or_default()
        .to_string();
    let anthropic = path.ends_with("/v1/messages");
    let dump: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {}", String::from_utf8_lossy(v.as_bytes())))
        .collect::<Vec<_>>()
        .join("\n");
    let key = headers
        .get("x-api-key")
        .or_else(|| headers.get("authorization"))
        .map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .trim_start_matches("Bearer ")
                .to_string()
        })
        .unwrap_or_default();
    let echo = format!("the key value was {key} (raw); we were sent {dump}");
    let json_error = |kind: &str| {
        if anthropic {
            json!({"type": "error", "error": {"type": kind, "message": echo}})
        } else {
            json!({"error": {"message": echo, "type": kind, "code": key}})
        }
    };
    match scenario.as_str() {
        "s401" => reply(401, &[], json_error("authentication_error").to_string()),
        "s400" => {
            let mut body = json_error("invalid_request_error");
            let fields: serde_json::Map<String, Value> = headers
                .iter()
                .map(|(k, v)| (k.to_string(), Value::from(String::from_utf8_lossy(v.as_bytes()))))
                .collect();
            body["headers"] = Value::Object(fields);
            reply(400, &[], body.to_string())
        }
        "s500" => reply(500, &[], format!("internal error\n{dump}\nkey={key}")),
        "s429" => reply(
            429,
            &[("retry-after-ms", "50".into()), ("x-echo-key", key.clone())],
            json_error("rate_limit_error").to_string(),
        ),
        "inband" => sse(vec![in_band(anthropic, &echo, &key)], false),
        "inbandmid" => sse(vec![first_text(anthropic), in_band(anthropic, &echo, &key)], false),
        "malformed" => {
            let event = if anthropic {
                format!("event: content_block_delta\ndata: {}\n\n", json!({"type": "content_block_delta", "index": key, "delta": {"type": "text_delta", "text": "x"}}))
            } else {
                format!("data: {}\n\n", json!({"choices": [{"index": key, "delta": {"content": "x"}}]}))
            };
            sse(vec![event], false)
        }
        "garbage" => sse(vec![format!("data: {{not json {}\n\n", echo.replace('\n', " "))], false),
        "cutbody" => {
            let partial = format!("{{\"error\":{{\"message\":\"{}", echo.replace('\n', " "));
            let chunks = vec![Ok(Bytes::from(partial)), Err(std::io::Error::other("cut"))];
            Response::builder()
                .status(502)
                .header("content-type", "application/json")
                .header("content-length", "100000")
                .body(Body::from_stream(futures::stream::iter(chunks)))
                .unwrap_or_default()
        }
        "cutstream" => {
            let cut = format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}", echo.replace('\n', " "));
            sse(vec![first_text(anthropic), cut], true)
        }
        "ok" => sse(
            vec![
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"fine\"},\"finish_reason\":null}]}\n\n".into(),
                "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n".into(),
                "data: [DONE]\n\n".into(),
            ],
            false,
        ),
        _ => reply(404, &[], format!("no scenario {scenario}")),
    }
}

fn reply(status: u16, headers: &[(&str, String)], body: String) -> Response {
    let mut builder = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json");
    for (name, value) in headers {
        builder = builder.header(*name, value.as_str());
    }
    builder.body(Body::from(body)).unwrap_or_default()
}

/// A 200 event stream of `events`; `cut` ends it with a broken connection.
fn sse(events: Vec<String>, cut: bool) -> Response {
    let mut chunks: Vec<Result<Bytes, std::io::Error>> = events.into_iter().map(|e| Ok(Bytes::from(e))).collect();
    if cut {
        chunks.push(Err(std::io::Error::other("cut")));
    }
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .unwrap_or_default()
}

fn in_band(anthropic: bool, echo: &str, key: &str) -> String {
    if anthropic {
        let data = json!({"type": "error", "error": {"type": "overloaded_error", "message": echo}});
        format!("event: error\ndata: {data}\n\n")
    } else {
        format!(
            "data: {}\n\n",
            json!({"error": {"message": echo, "type": key, "code": "server_error"}})
        )
    }
}

/// The start of an answer, so a failure after it is a mid-stream one.
fn first_text(anthropic: bool) -> String {
    if anthropic {
        concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"usage\":{\"input_tokens\":1,\"output_tokens\":0}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Partial answer \"}}\n\n",
        )
        .to_string()
    } else {
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Partial answer \"},\"finish_reason\":null}]}\n\n".to_string()
    }
}
