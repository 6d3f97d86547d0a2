//! The canary key: real `openai` and `anthropic` routes whose keys are canaries, pointed at a
//! hostile upstream that echoes our request headers into every way an upstream can fail,
//! run through every client dialect; no client-visible byte and no log line may hold a key.
//!
//! Logs are captured by a `tracing` subscriber (every target, TRACE, `log` records too)
//! installed for this test process, writing into a buffer that is grepped at the end.

#[path = "secrets/hostile.rs"]
mod hostile;
mod support;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use hostile::FAILURES;
use serde_json::{json, Value};
use support::{client, start, ws_connect};
use tailcut::server::Running;
use tokio_tungstenite::tungstenite::Message;

/// The routes' keys. Neither has a known key shape (`sk-…`), so only the registry of
/// configured keys can find them bare.
const OPENAI_CANARY: &str = "tcCanaryOpenAI7f3a9c2e41d84b6f0a2e";
const ANTHROPIC_CANARY: &str = "tcCanaryAnthropic5b1d8e0f93c247aa";
const OPENAI_ENV: &str = "TAILCUT_TEST_SECRETS_OPENAI_KEY";
const ANTHROPIC_ENV: &str = "TAILCUT_TEST_SECRETS_ANTHROPIC_KEY";

const PROVIDERS: [&str; 2] = ["openai", "anthropic"];

/// The client paths: OpenAI streamed and whole, Anthropic streamed and whole, native SSE,
/// WebSocket.
const DIALECTS: [&str; 6] = ["oais", "oaiw", "ants", "antw", "nsse", "ws"];

/// Routes of the failover model (`fo-…`): two failures, then an answer.
const FAILOVER: [(&str, &str); 3] = [("s500", "openai"), ("malformed", "anthropic"), ("ok", "openai")];

/// Routes of the exhausted model (`ex-…`): every one fails (four: `limits.max_attempts`).
const EXHAUSTED: [(&str, &str); 4] = [
    ("s429", "anthropic"),
    ("inband", "openai"),
    ("garbage", "anthropic"),
    ("cutbody", "openai"),
];

// ---------------------------------------------------------------- log capture

static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogBuffer;

impl Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    let installed = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(|| LogBuffer)
        .try_init();
    assert!(installed.is_ok(), "the test's log capture is the process's subscriber");
}

// ---------------------------------------------------------------- tailcut config

fn route_toml(name: &str, provider: &str, upstream: SocketAddr) -> String {
    let env = if provider == "openai" {
        OPENAI_ENV
    } else {
        ANTHROPIC_ENV
    };
    let base = if provider == "openai" {
        format!("http://{upstream}/{name}/v1")
    } else {
        format!("http://{upstream}/{name}")
    };
    format!("[[routes]]\nname = \"{name}\"\nprovider = \"{provider}\"\nbase_url = \"{base}\"\nmodel = \"m-{name}\"\napi_key_env = \"{env}\"\n")
}

/// Every route of the test, by model: one model per (failure, provider, dialect), and per
/// dialect a failover model and an exhausted one.
fn models() -> Vec<(String, Vec<(String, &'static str)>)> {
    let mut models = Vec::new();
    for dialect in DIALECTS {
        for failure in FAILURES {
            for provider in PROVIDERS {
                let name = format!("{failure}-{provider}-{dialect}");
                models.push((name.clone(), vec![(name, provider)]));
            }
        }
        for (model, routes) in [("fo", &FAILOVER[..]), ("ex", &EXHAUSTED[..])] {
            let routes = routes
                .iter()
                .map(|(failure, provider)| (format!("{failure}-{provider}-{model}{dialect}"), *provider))
                .collect();
            models.push((format!("{model}-{dialect}"), routes));
        }
    }
    models
}

fn config(upstream: SocketAddr) -> String {
    // Failover is what is tested here, not the fleet's retry budget: give it room.
    let mut toml = String::from(
        "[server]\nlisten = \"127.0.0.1:0\"\nsse_keepalive_ms = 600000\n[limits]\nretry_budget_ratio = 1.0\nretry_budget_floor_per_sec = 1000.0\nblast_radius_floor_per_sec = 1000.0\n",
    );
    let models = models();
    for (_, routes) in &models {
        for (name, provider) in routes {
            toml.push_str(&route_toml(name, provider, upstream));
        }
    }
    for (model, routes) in &models {
        let names: Vec<String> = routes.iter().map(|(n, _)| format!("\"{n}\"")).collect();
        toml.push_str(&format!("[models.{model}]\nroutes = [{}]\n", names.join(", ")));
    }
    toml
}

// ---------------------------------------------------------------- clients

/// Everything a client saw of one exchange: status, headers and body, as text.
struct Seen {
    status: u16,
    text: String,
}

fn headers_text(headers: &reqwest::header::HeaderMap) -> String {
    headers
        .iter()
        .map(|(k, v)| format!("{k}: {}\n", String::from_utf8_lossy(v.as_bytes())))
        .collect()
}

async fn http(url: String, body: Value) -> Seen {
    let resp = client().post(url).json(&body).send().await.expect("request sent");
    let status = resp.status().as_u16();
    let mut text = headers_text(resp.headers());
    let mut stream = resp.bytes_stream();
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(b) => text.push_str(&String::from_utf8_lossy(&b)),
                Err(e) => {
                    text.push_str(&format!("\n<client read error: {e}>"));
                    break;
                }
            }
        }
        text
    })
    .await
    .expect("the reply ends");
    Seen { status, text: read }
}

async fn ask(server: &Running, ws: &mut support::Ws, dialect: &str, model: &str) -> Seen {
    let messages = json!([{"role": "user", "content": "Say something."}]);
    match dialect {
        "oais" | "oaiw" => {
            let body = json!({"model": model, "stream": dialect == "oais", "messages": messages});
            http(server.url("/v1/chat/completions"), body).await
        }
        "ants" | "antw" => {
            let body = json!({"model": model, "stream": dialect == "ants", "max_tokens": 64, "messages": messages});
            http(server.url("/v1/messages"), body).await
        }
        "nsse" => http(server.url("/v1/stream"), json!({"model": model, "messages": messages})).await,
        _ => {
            let id = format!("id-{model}");
            let frame = json!({"type": "chat", "id": id, "request": {"model": model, "messages": messages}});
            ws.send(Message::text(frame.to_string())).await.expect("ws send");
            let mut text = String::new();
            loop {
                let msg = tokio::time::timeout(Duration::from_secs(30), ws.next())
                    .await
                    .expect("the WebSocket answers")
                    .expect("socket open")
                    .expect("no socket error");
                let Message::Text(t) = msg else { continue };
                text.push_str(t.as_str());
                text.push('\n');
                let value: Value = serde_json::from_str(t.as_str()).unwrap_or_default();
                if value["id"] == id.as_str() && matches!(value["type"].as_str(), Some("done" | "error" | "cancelled"))
                {
                    break;
                }
            }
            Seen { status: 101, text }
        }
    }
}

async fn get(server: &Running, path: &str) -> String {
    let resp = client().get(server.url(path)).send().await.expect("request sent");
    let mut text = headers_text(resp.headers());
    text.push_str(&resp.text().await.unwrap_or_default());
    text
}

/// Neither canary, nor any 12-character piece of one, is in `text`.
fn assert_clean(what: &str, text: &str) {
    for canary in [OPENAI_CANARY, ANTHROPIC_CANARY] {
        for piece in canary.as_bytes().windows(12) {
            let piece = std::str::from_utf8(piece).unwrap_or_default();
            if let Some(at) = text.find(piece) {
                let from = text[..at].char_indices().rev().nth(200).map_or(0, |(i, _)| i);
                panic!(
                    "{what}: a canary key leaked ({piece:?}) in: …{}…",
                    &text[from..(at + 200).min(text.len())]
                );
            }
        }
    }
}

fn failed_visibly(seen: &Seen) -> bool {
    seen.status >= 400 || seen.text.contains("error")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_canary_key_reaches_no_client_byte_and_no_log_line() {
    capture_logs();
    // Edition 2021: `set_var` is safe. No other test in this binary reads these variables.
    std::env::set_var(OPENAI_ENV, OPENAI_CANARY);
    std::env::set_var(ANTHROPIC_ENV, ANTHROPIC_CANARY);
    let (upstream, hostile) = hostile::start().await;
    let server = start(&config(upstream)).await;
    let mut ws = ws_connect(&server, None).await.expect("WebSocket upgrade");

    for dialect in DIALECTS {
        for failure in FAILURES {
            for provider in PROVIDERS {
                let model = format!("{failure}-{provider}-{dialect}");
                let seen = ask(&server, &mut ws, dialect, &model).await;
                assert_clean(&model, &seen.text);
                assert!(
                    failed_visibly(&seen),
                    "{model}: the failure reaches the client: {}",
                    seen.text
                );
                if let Some(code) = failure.strip_prefix('s') {
                    assert!(
                        seen.text.contains(&format!("upstream answered {code}")),
                        "{model}: tailcut's own words for the failure: {}",
                        seen.text
                    );
                }
            }
        }
        let failover = format!("fo-{dialect}");
        let seen = ask(&server, &mut ws, dialect, &failover).await;
        assert_clean(&failover, &seen.text);
        assert!(
            seen.text.contains("fine"),
            "{failover}: the third route answers: {}",
            seen.text
        );
        assert!(
            seen.text.contains("upstream answered 500"),
            "{failover}: the failed attempts reach the client in the envelope: {}",
            seen.text
        );
        let exhausted = format!("ex-{dialect}");
        let seen = ask(&server, &mut ws, dialect, &exhausted).await;
        assert_clean(&exhausted, &seen.text);
        assert!(failed_visibly(&seen), "{exhausted}: every route failed: {}", seen.text);
    }

    // Every failure ran in every dialect, and every route of the failover and exhausted
    // models was tried (fresh routes rank in the order they are listed).
    let hits = hostile.hits.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (_, routes) in models() {
        for (route, provider) in routes {
            let path = if provider == "openai" {
                format!("/{route}/v1/chat/completions")
            } else {
                format!("/{route}/v1/messages")
            };
            assert!(
                hits.get(&path).is_some_and(|n| *n > 0),
                "the hostile upstream was asked on {path}: {hits:?}"
            );
        }
    }

    for (path, shows) in [
        ("/admin/routes", "\"failures\""),
        ("/metrics", "tailcut_upstream_errors_total"),
        ("/v1/models", "fo-ws"),
        ("/readyz", "ready"),
    ] {
        let text = get(&server, path).await;
        assert!(text.contains(shows), "{path} answered with its content: {text}");
        assert_clean(path, &text);
    }
    drop(ws);
    server.shutdown().await;

    let logs = String::from_utf8_lossy(&LOGS.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
    assert!(
        logs.contains("request decided"),
        "the decision records were captured ({} bytes of logs)",
        logs.len()
    );
    if let Ok(path) = std::env::var("TAILCUT_TEST_SECRETS_DUMP") {
        let _ = std::fs::write(path, &logs);
    }
    for line in logs.lines() {
        assert_clean("a log line", line);
    }
}
