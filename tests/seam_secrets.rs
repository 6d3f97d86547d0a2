//! A route key cut by a mid-stream failover: a hostile upstream on the OpenAI wire echoes the
//! route's key into its answer and is cut `k` bytes into it, for every `k`; the route that
//! carries on (a continuation, or a restart) echoes the rest, or starts the answer over. No
//! piece of the key beyond its first three characters may reach the client, and what the
//! client holds is one answer.

mod support;

use std::net::SocketAddr;

use axum::body::{Body, Bytes};
use axum::http::Uri;
use axum::response::Response;
use axum::Json;
use futures::StreamExt;
use serde_json::{json, Value};
use support::{post_native, post_sse, start};

/// The routes' key, OpenAI-shaped: up to `sk-` may go out before it is recognised.
const KEY: &str = "sk-qzCanaryQuokkaWombatZebraXylo7";
const KEY_ENV: &str = "TAILCUT_TEST_SEAM_SECRETS_KEY";
const LEAD: &str = "Your key: ";
const TAIL: &str = " ok";
/// The shortest piece of the key that must never go out (`sk-` may).
const PIECE: usize = 4;

fn answer() -> String {
    format!("{LEAD}{KEY}{TAIL}")
}

fn chunk(content: &str) -> String {
    format!(
        "data: {}\n\n",
        json!({"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]})
    )
}

fn finished(chunks: Vec<String>) -> Response {
    let mut chunks = chunks;
    chunks.push("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n".into());
    chunks.push("data: [DONE]\n\n".into());
    sse(chunks.into_iter().map(|c| Ok(Bytes::from(c))).collect())
}

/// A 200 event stream of `chunks`, each after a short pause, so what comes before a break
/// (an `Err`) reaches tailcut before it.
fn sse(chunks: Vec<Result<Bytes, std::io::Error>>) -> Response {
    let paced = futures::stream::iter(chunks).then(|c| async {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        c
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(paced))
        .unwrap_or_default()
}

/// The text of a request's final assistant message (a continuation's prefill), if it ends
/// with one.
fn prefill(body: &Value) -> Option<String> {
    let last = body["messages"].as_array()?.last()?;
    if last["role"] != "assistant" {
        return None;
    }
    match &last["content"] {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(parts.iter().filter_map(|p| p["text"].as_str()).collect()),
        _ => None,
    }
}

/// Routes by the first word of the path: `cut{k}` streams the answer up to `k` bytes into
/// the key and breaks; `cont{k}` continues the prefill it was sent (or, when the prefill holds
/// a replaced key, carries on with the rest of the key after the cut); any other answers whole.
async fn upstream(uri: Uri, Json(body): Json<Value>) -> Response {
    let answer = answer();
    let word = uri
        .path()
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    if let Some(k) = word.strip_prefix("cut").and_then(|k| k.parse::<usize>().ok()) {
        let at = LEAD.len() + k;
        return sse(vec![
            Ok(Bytes::from(chunk(LEAD))),
            Ok(Bytes::from(chunk(&answer[LEAD.len()..at]))),
            Err(std::io::Error::other("cut")),
        ]);
    }
    if let Some(k) = word.strip_prefix("cont").and_then(|k| k.parse::<usize>().ok()) {
        let sent = prefill(&body).unwrap_or_default();
        let rest = answer.strip_prefix(sent.as_str()).unwrap_or(&answer[LEAD.len() + k..]);
        return finished(vec![chunk(rest)]);
    }
    finished(vec![chunk(LEAD), chunk(KEY), chunk(TAIL)])
}

async fn start_upstream() -> SocketAddr {
    let app = axum::Router::new().fallback(axum::routing::post(upstream));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

fn route(name: &str, upstream: SocketAddr, prefill: bool) -> String {
    let prefill = if prefill { "prefill = \"assistant\"\n" } else { "" };
    format!(
        "[[routes]]\nname = \"{name}\"\nprovider = \"openai\"\nbase_url = \"http://{upstream}/{name}/v1\"\nmodel = \"m-{name}\"\napi_key_env = \"{KEY_ENV}\"\n{prefill}"
    )
}

/// Per cut `k`: model `c{k}` (cut, then a route that continues), `r{k}` (cut, then a route
/// that cannot continue: the prose fallback, a restart) and `s{k}` (cut, then a route sent
/// the prefill that starts over).
fn config(upstream: SocketAddr) -> String {
    let mut toml = String::from(
        "[server]\nlisten = \"127.0.0.1:0\"\nsse_keepalive_ms = 600000\n[limits]\nretry_budget_ratio = 1.0\nretry_budget_floor_per_sec = 1000.0\nblast_radius_floor_per_sec = 1000.0\n",
    );
    toml.push_str(&route("whole", upstream, false));
    // Takes a prefill, and ignores it: answers whole.
    toml.push_str(&route("again", upstream, true));
    for k in 0..=KEY.len() {
        toml.push_str(&route(&format!("cut{k}"), upstream, false));
        toml.push_str(&route(&format!("cont{k}"), upstream, true));
        toml.push_str(&format!("[models.c{k}]\nroutes = [\"cut{k}\", \"cont{k}\"]\n"));
        toml.push_str(&format!("[models.r{k}]\nroutes = [\"cut{k}\", \"whole\"]\n"));
        toml.push_str(&format!("[models.s{k}]\nroutes = [\"cut{k}\", \"again\"]\n"));
    }
    toml
}

fn assert_no_key_piece(what: &str, text: &str) {
    for piece in KEY.as_bytes().windows(PIECE) {
        let piece = std::str::from_utf8(piece).unwrap_or_default();
        assert!(
            !text.contains(piece),
            "{what}: {piece:?} of the key reached the client: {text}"
        );
    }
}

fn body(model: &str) -> Value {
    json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "Echo it."}]})
}

const NO_HEDGE: [(&str, &str); 1] = [("x-tailcut-hedge", "off")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_cut_at_every_offset_by_a_failover_never_reaches_the_client() {
    // Edition 2021: `set_var` is safe. No other test in this binary reads this variable.
    std::env::set_var(KEY_ENV, KEY);
    let server = start(&config(start_upstream().await)).await;
    let base = server.url("");
    for k in 0..=KEY.len() {
        let model = format!("c{k}");
        let reply = post_sse(&base, &body(&model), &NO_HEDGE).await;
        assert_no_key_piece(&format!("{model}, continued"), &reply.raw);
        assert!(reply.done(), "{model}: {}", reply.raw);
        let env = reply.envelope();
        assert_eq!(
            (env["policy"].as_str(), env["route"].as_str()),
            (Some("continue"), Some(format!("cont{k}").as_str())),
            "{model}: {env}"
        );
        // Up to `sk-` went out before the cut and is kept; nothing is said twice.
        let shown = if k < PIECE { &KEY[..k] } else { "" };
        assert_eq!(reply.text(), format!("{LEAD}{shown}[redacted]{TAIL}"), "{model}");

        let model = format!("r{k}");
        let (status, events) = post_native(&base, &body(&model), &NO_HEDGE).await;
        let seen = format!("{events:?}");
        assert_no_key_piece(&format!("{model}, restarted (native)"), &seen);
        assert_eq!(status, 200, "{model}: {seen}");
        assert_eq!(
            support::native_text(&events),
            format!("{LEAD}[redacted]{TAIL}"),
            "{model}: the restart's answer replaces the partial: {seen}"
        );
        let done = events
            .last()
            .map(|(name, data)| (name.as_str(), data["envelope"]["policy"].as_str()));
        assert_eq!(done, Some(("done", Some("restart"))), "{model}: {seen}");
        let reply = post_sse(&base, &body(&model), &NO_HEDGE).await;
        assert_no_key_piece(&format!("{model}, restarted (OpenAI)"), &reply.raw);

        if k >= PIECE {
            // The continuation starts over: it repeats all the client holds (the key replaced
            // as before the cut), so the repeat is swallowed, never spliced on.
            let model = format!("s{k}");
            let reply = post_sse(&base, &body(&model), &NO_HEDGE).await;
            assert_no_key_piece(&format!("{model}, started over"), &reply.raw);
            assert!(reply.done(), "{model}: {}", reply.raw);
            assert_eq!(
                reply.text(),
                format!("{LEAD}[redacted]{TAIL}"),
                "{model}: {}",
                reply.raw
            );
        }
    }
    server.shutdown().await;
}
