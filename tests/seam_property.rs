//! The seam contract as a property, end to end over loopback: for arbitrary answer text, a
//! cut at an arbitrary byte or token (a dropped connection, or a malformed event), every
//! client dialect (OpenAI SSE, Anthropic SSE, native SSE, WebSocket), both continuation
//! wires, and every continuation behaviour of the simulated upstream (exact, starts over,
//! diverges, refuses the prefill), the client ends with exactly one coherent answer: the
//! original, or the replacement the continuation route wrote. A needless error fails too.
//!
//! `PROPTEST_CASES` sets the number of cases (CI: 10,000; 64 by default here). A second test
//! sweeps every cut point of a 60-token answer (and every byte of a hostile one) for every
//! behaviour, dialect and wire, and prints the count of wrong texts and errors per pair.
mod support;

use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestRunner};
use serde_json::{json, Value};
use tailcut::server::Running;
use tailcut::sim::{self, Behaviour, Continuation, Failure, OpenAiReasoning, Scenario, Thinking, Ttft};
use tokio_tungstenite::tungstenite::Message;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Dialect {
    OpenAi,
    Anthropic,
    NativeSse,
    WebSocket,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Wire {
    OpenAi,
    Anthropic,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Cut {
    /// The connection drops after this many bytes of text.
    Byte(usize),
    /// The connection drops after this many tokens.
    Token(u32),
    /// A malformed event after this many tokens.
    Malformed(u32),
}

#[derive(Debug, Clone)]
struct Case {
    answer: String,
    cut: Cut,
    dialect: Dialect,
    wire: Wire,
    behaviour: Behaviour,
    /// The cut route reasons first (`reasoning_content` deltas, one token each): the answer
    /// can then only restart, which an SDK dialect cannot show (`thinking_check`).
    thinks: bool,
}

/// Words that make seams hard: repeats, digit groups, punctuation that continues a word,
/// multi-byte text, a sentence start that repeats the answer's first word.
const WORDS: &[&str] = &[
    "The",
    "very",
    "very",
    "old",
    "$1,000",
    ",000",
    "per",
    "year.",
    "Naïve",
    "café",
    "—",
    "日本語",
    "🎉",
    "a",
    "a",
    "No.",
    "no",
    "the",
    "The",
    "answer",
    "is",
    "42",
    "über",
    "x",
];
const SEPARATORS: &[&str] = &[" ", " ", " ", " ", "\n\n", ", ", "  ", "\n"];

fn answer() -> impl Strategy<Value = String> {
    (
        prop::sample::select(WORDS),
        prop::collection::vec((prop::sample::select(SEPARATORS), prop::sample::select(WORDS)), 1..30),
    )
        .prop_map(|(first, rest)| {
            let mut s = first.to_string();
            for (sep, w) in rest {
                s.push_str(sep);
                s.push_str(w);
            }
            s
        })
}

fn case() -> impl Strategy<Value = Case> {
    (
        answer(),
        0..3u8,
        1..400usize,
        prop::sample::select(vec![
            Dialect::OpenAi,
            Dialect::Anthropic,
            Dialect::NativeSse,
            Dialect::WebSocket,
        ]),
        prop::sample::select(vec![Wire::OpenAi, Wire::Anthropic]),
        prop::sample::select(vec![
            Behaviour::Exact,
            Behaviour::StartsOver,
            Behaviour::Diverges,
            Behaviour::Refuses,
        ]),
    )
        .prop_map(|(answer, kind, at, dialect, wire, behaviour)| {
            let tokens = sim::answer_tokens(&text_scenario(&answer)).len().max(1);
            let cut = match kind {
                0 => Cut::Byte(1 + at % answer.len().max(1)),
                1 => Cut::Token(1 + (at % tokens) as u32),
                _ => Cut::Malformed(1 + (at % tokens) as u32),
            };
            Case {
                answer,
                cut,
                dialect,
                wire,
                behaviour,
                thinks: false,
            }
        })
}

/// Reasoning deltas the cut route sends before its answer in a `thinks` case.
const THINKING_DELTAS: u32 = 3;

fn text_scenario(text: &str) -> Scenario {
    Scenario {
        text: Some(text.to_string()),
        ttft: Ttft {
            median_ms: 0.0,
            ..Ttft::default()
        },
        inter_token_ms: 0.0,
        ..Scenario::default()
    }
}

const CONFIG: &str = r#"
[server]
listen = "127.0.0.1:0"
sse_keepalive_ms = 600000
[sim]
listen = "127.0.0.1:0"
[sim.scenarios.cut]
tokens = 4
[sim.scenarios.cont]
tokens = 4
[hedge]
enabled = false
[breaker]
consecutive_failures = 0
min_volume = 1000000000
[[routes]]
name = "cut"
provider = "simulated"
wire = "openai"
scenario = "cut"
prefill = "none"
[[routes]]
name = "cont-openai"
provider = "simulated"
wire = "openai"
scenario = "cont"
prefill = "vllm"
[[routes]]
name = "cont-anthropic"
provider = "simulated"
wire = "anthropic"
scenario = "cont"
prefill = "anthropic"
[models.m-openai]
routes = ["cut", "cont-openai"]
[models.m-anthropic]
routes = ["cut", "cont-anthropic"]
"#;

/// What the client ended with.
#[derive(Debug, PartialEq)]
struct Outcome {
    text: String,
    /// An error event, a truncation, or a stream without its terminal event.
    failed: bool,
}

async fn run_case(server: &Running, case: &Case) -> Outcome {
    let sim = server.sim.as_ref().expect("the simulated upstream runs");
    let mut cut = text_scenario(&case.answer);
    cut.failure = match case.cut {
        Cut::Byte(b) => Failure {
            drop_after_bytes: Some(b),
            ..Failure::default()
        },
        Cut::Token(t) => Failure {
            drop_after_tokens: Some(t),
            ..Failure::default()
        },
        Cut::Malformed(t) => Failure {
            malformed_after_tokens: Some(t),
            ..Failure::default()
        },
    };
    if case.thinks {
        cut.thinking = Thinking {
            deltas: THINKING_DELTAS,
            openai: OpenAiReasoning::ReasoningContent,
            ..Thinking::default()
        };
    }
    let mut cont = text_scenario(&case.answer);
    cont.continuation = Continuation {
        behaviour: case.behaviour,
        ..Continuation::default()
    };
    sim.register("cut", cut);
    sim.register("cont", cont);
    let model = match case.wire {
        Wire::OpenAi => "m-openai",
        Wire::Anthropic => "m-anthropic",
    };
    let messages = json!([{"role": "user", "content": "Tell me."}]);
    match case.dialect {
        Dialect::OpenAi => openai(server, model, &messages).await,
        Dialect::Anthropic => anthropic(server, model, &messages).await,
        Dialect::NativeSse => native_sse(server, model, &messages).await,
        Dialect::WebSocket => websocket(server, model, &messages).await,
    }
}

impl Outcome {
    /// Nothing received yet: a stream that ends before its terminal event has failed.
    fn unfinished() -> Self {
        Outcome {
            text: String::new(),
            failed: true,
        }
    }
}

/// POSTs `body` to `path` and reads the answer's SSE events.
async fn post_events(server: &Running, path: &str, body: &Value) -> Vec<(String, String)> {
    let resp = support::client()
        .post(server.url(path))
        .json(body)
        .send()
        .await
        .expect("sent");
    sse(resp).await
}

/// The body as SSE events (name, data), decoded once all bytes are in (a multi-byte
/// character may be split across chunks).
async fn sse(resp: reqwest::Response) -> Vec<(String, String)> {
    let mut bytes = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(b) => bytes.extend_from_slice(&b),
            Err(_) => break,
        }
    }
    let raw = String::from_utf8(bytes).expect("the client receives valid UTF-8");
    raw.split("\n\n")
        .filter_map(|block| {
            let mut name = String::from("message");
            let mut data = None::<String>;
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.get_or_insert_with(String::new).push_str(d);
                }
            }
            data.map(|d| (name, d))
        })
        .collect()
}

async fn openai(server: &Running, model: &str, messages: &Value) -> Outcome {
    let body = json!({"model": model, "stream": true, "messages": messages});
    let mut out = Outcome::unfinished();
    for (_, data) in post_events(server, "/v1/chat/completions", &body).await {
        if data == "[DONE]" {
            out.failed = false;
            continue;
        }
        let v: Value = serde_json::from_str(&data).expect("OpenAI clients get JSON events");
        if v.get("error").is_some() {
            return Outcome { failed: true, ..out };
        }
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            out.text.push_str(t);
        }
    }
    out
}

async fn anthropic(server: &Running, model: &str, messages: &Value) -> Outcome {
    let body = json!({"model": model, "stream": true, "max_tokens": 1024, "messages": messages});
    let mut out = Outcome::unfinished();
    for (name, data) in post_events(server, "/v1/messages", &body).await {
        let v: Value = serde_json::from_str(&data).expect("Anthropic clients get JSON events");
        match name.as_str() {
            "error" => return Outcome { failed: true, ..out },
            "message_stop" => out.failed = false,
            "content_block_delta" if v["delta"]["type"] == "text_delta" => {
                out.text.push_str(v["delta"]["text"].as_str().unwrap_or_default());
            }
            _ => {}
        }
    }
    out
}

/// A native event (`delta`, `reset`, `done`, `error`, ...) applied to what the client holds;
/// `true` when it ends the answer.
fn native_event(out: &mut Outcome, kind: &str, v: &Value) -> bool {
    match kind {
        "delta" => out.text.push_str(v["text"].as_str().unwrap_or_default()),
        "reset" => out.text.clear(),
        "done" => {
            out.failed = v["finish_reason"] == "truncated";
            return true;
        }
        "error" => {
            out.failed = true;
            return true;
        }
        _ => {}
    }
    false
}

async fn native_sse(server: &Running, model: &str, messages: &Value) -> Outcome {
    let body = json!({"model": model, "messages": messages});
    let mut out = Outcome::unfinished();
    for (name, data) in post_events(server, "/v1/stream", &body).await {
        let v: Value = serde_json::from_str(&data).expect("native events are JSON");
        if native_event(&mut out, &name, &v) {
            break;
        }
    }
    out
}

async fn websocket(server: &Running, model: &str, messages: &Value) -> Outcome {
    let mut ws = support::ws_connect(server, None).await.expect("upgrade");
    let chat = json!({"type": "chat", "id": "p", "request": {"model": model, "messages": messages}});
    ws.send(Message::text(chat.to_string())).await.expect("send");
    let mut out = Outcome::unfinished();
    loop {
        let v = support::ws_next(&mut ws).await;
        let kind = v["type"].as_str().unwrap_or_default().to_string();
        if native_event(&mut out, &kind, &v) {
            break;
        }
    }
    let _ = ws.close(None).await;
    out
}

/// What the client held when the first route failed.
fn held_at_cut(case: &Case) -> String {
    let tokens = sim::answer_tokens(&text_scenario(&case.answer));
    // A token cut counts the reasoning deltas too; a byte cut only the answer's text.
    let thought = if case.thinks { THINKING_DELTAS } else { 0 };
    match case.cut {
        Cut::Token(t) | Cut::Malformed(t) if case.thinks => tokens
            .iter()
            .take(t.saturating_sub(thought) as usize)
            .map(String::as_str)
            .collect(),
        Cut::Byte(b) => {
            let mut end = b.min(case.answer.len());
            while !case.answer.is_char_boundary(end) {
                end -= 1;
            }
            case.answer[..end].to_string()
        }
        Cut::Token(t) | Cut::Malformed(t) => tokens.iter().take(t as usize).map(String::as_str).collect(),
    }
}

/// The texts that count as one coherent answer for this case, and whether the case is one
/// of the two that text alone cannot decide (see `mux::seam`'s known limits).
fn coherent(case: &Case) -> (Vec<String>, bool) {
    let held = held_at_cut(case);
    let mut ok = vec![case.answer.clone()];
    if case.behaviour == Behaviour::Diverges {
        let mut cont = text_scenario(&case.answer);
        cont.continuation.behaviour = Behaviour::Diverges;
        // A replacement that repeats everything the client holds is a whole answer too.
        ok.push(sim::diverging_answer(&cont));
    }
    // Known limit: an exact continuation that begins with the whole of the client's text is
    // taken for a restart that matched, and the client misses that one repeat.
    let sent = match case.wire {
        Wire::OpenAi => held.as_str(),
        Wire::Anthropic => held.trim_end(),
    };
    let continuation = &case.answer[sent.len()..];
    let ambiguous = case.behaviour == Behaviour::Exact && !held.is_empty() && continuation.starts_with(&held);
    if ambiguous {
        ok.push(format!("{held}{}", &continuation[held.len()..]));
    }
    (ok, ambiguous)
}

fn check(case: &Case, got: &Outcome) -> Result<(), TestCaseError> {
    let (ok, _) = coherent(case);
    prop_assert!(
        !got.failed,
        "a healthy fallback was available, yet the client got an error: {case:?} -> {got:?}"
    );
    prop_assert!(
        ok.contains(&got.text),
        "not one coherent answer: {case:?}\n got: {:?}\n want one of: {ok:?}",
        got.text
    );
    Ok(())
}

fn runtime() -> Arc<tokio::runtime::Runtime> {
    Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime"),
    )
}

#[test]
fn every_cut_ends_in_one_coherent_answer_in_every_dialect() {
    let rt = runtime();
    let server = rt.block_on(support::start(CONFIG));
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(RunnerConfig {
        cases,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let ambiguous = std::sync::atomic::AtomicU32::new(0);
    let result = runner.run(&case(), |case| {
        if coherent(&case).1 {
            ambiguous.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let got = rt.block_on(run_case(&server, &case));
        check(&case, &got)
    });
    eprintln!(
        "{cases} cases; {} were an exact continuation that begins with the whole of what the client held",
        ambiguous.load(std::sync::atomic::Ordering::Relaxed)
    );
    rt.block_on(server.shutdown());
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn every_cut_point_of_a_60_token_answer_is_coherent() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = rt.block_on(support::start(CONFIG));
    let generated = sim::answer_tokens(&Scenario {
        tokens: 60,
        seed: 7,
        ..Scenario::default()
    })
    .concat();
    let hostile = "The very very old fee was $1,000,000 per year.\n\nNaïve café — 日本語 🎉 and then para two.";
    let tokens: Vec<(&str, Cut)> = (1..=60).map(|t| (generated.as_str(), Cut::Token(t))).collect();
    let bytes: Vec<(&str, Cut)> = (1..hostile.len()).map(|b| (hostile, Cut::Byte(b))).collect();
    let behaviours = [
        Behaviour::Exact,
        Behaviour::StartsOver,
        Behaviour::Diverges,
        Behaviour::Refuses,
    ];
    let dialects = [
        Dialect::OpenAi,
        Dialect::Anthropic,
        Dialect::NativeSse,
        Dialect::WebSocket,
    ];
    let mut failures = Vec::new();
    for behaviour in behaviours {
        for dialect in dialects {
            let (mut wrong, mut errors, mut count) = (0, 0, 0);
            // Every byte of the hostile answer for the strictest client (an SDK, which cannot
            // be told to reset); the random cases cover bytes in the other dialects.
            let cuts: Vec<&(&str, Cut)> = match dialect {
                Dialect::OpenAi => tokens.iter().chain(&bytes).collect(),
                _ => tokens.iter().collect(),
            };
            for wire in [Wire::OpenAi, Wire::Anthropic] {
                for (answer, cut) in &cuts {
                    count += 1;
                    let case = Case {
                        answer: answer.to_string(),
                        cut: *cut,
                        dialect,
                        wire,
                        behaviour,
                        thinks: false,
                    };
                    let got = rt.block_on(run_case(&server, &case));
                    let (ok, _) = coherent(&case);
                    if got.failed {
                        errors += 1;
                    }
                    if !ok.contains(&got.text) {
                        wrong += 1;
                        failures.push(format!("{case:?} -> {got:?}"));
                    }
                }
            }
            eprintln!("{behaviour:?} / {dialect:?}: {count} cuts, {wrong} wrong texts, {errors} errors");
            assert_eq!(errors, 0, "{behaviour:?} / {dialect:?}: needless errors");
        }
    }
    rt.block_on(server.shutdown());
    assert!(failures.is_empty(), "wrong texts: {failures:#?}");
}

/// A thinking-first answer cut anywhere (inside its reasoning or in its text): it is never
/// continued. A client that can be told gets a reset and the whole new answer; an SDK
/// dialect, which cannot take the shown reasoning back, gets exactly the text it held and an
/// honest error, never a second answer glued to the first one's reasoning.
fn thinking_check(case: &Case, got: &Outcome) -> Result<(), TestCaseError> {
    match case.dialect {
        Dialect::NativeSse | Dialect::WebSocket => {
            prop_assert!(!got.failed, "a restart was possible: {case:?} -> {got:?}");
            prop_assert_eq!(&got.text, &case.answer, "{:?}", case);
        }
        Dialect::OpenAi | Dialect::Anthropic => {
            prop_assert!(got.failed, "an honest end: {case:?} -> {got:?}");
            prop_assert_eq!(&got.text, &held_at_cut(case), "{:?}", case);
        }
    }
    Ok(())
}

#[test]
fn every_cut_of_a_thinking_first_answer_restarts_or_ends_honestly() {
    let rt = runtime();
    // The cut route always first (a lower rung for the others): a route whose answers keep
    // failing ranks last among equals, and the case would then test nothing.
    let config = CONFIG.replace("scenario = \"cont\"", "scenario = \"cont\"\nlevel = \"L1\"");
    let server = rt.block_on(support::start(&config));
    // A tenth of the text cases' count (at least 32): each is one restart, not a seam.
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .map_or(32, |n| (n / 10).max(32));
    let mut runner = TestRunner::new(RunnerConfig {
        cases,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let strategy = case().prop_map(|case| Case { thinks: true, ..case });
    let result = runner.run(&strategy, |case| {
        let got = rt.block_on(run_case(&server, &case));
        thinking_check(&case, &got)
    });
    rt.block_on(server.shutdown());
    if let Err(e) = result {
        panic!("{e}");
    }
}
