//! Mid-stream failures end to end: restart, continue and truncate over the OpenAI SSE dialect
//! and the native SSE dialect, stalls on paused time, and tool calls that fail half-way.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;
use tailcut::sim::SimRecord;

const ANSWER: &str = "One two three four five six seven eight nine ten eleven twelve.";

fn scenarios() -> String {
    format!(
        r#"
[sim.scenarios.dropper]
text = "{ANSWER}"
ttft = {{ median_ms = 5.0, sigma = 0.0 }}
inter_token_ms = 1.0
failure = {{ drop_after_tokens = 4 }}
[sim.scenarios.same]
text = "{ANSWER}"
ttft = {{ median_ms = 5.0, sigma = 0.0 }}
inter_token_ms = 1.0
[sim.scenarios.restarter]
text = "{ANSWER}"
ttft = {{ median_ms = 5.0, sigma = 0.0 }}
inter_token_ms = 1.0
continuation = {{ behaviour = "starts_over" }}
[sim.scenarios.differ]
text = "{ANSWER}"
ttft = {{ median_ms = 5.0, sigma = 0.0 }}
inter_token_ms = 1.0
continuation = {{ behaviour = "diverges", diverge_after_words = 2 }}
[sim.scenarios.other]
text = "A completely different answer from another route."
ttft = {{ median_ms = 5.0, sigma = 0.0 }}
inter_token_ms = 1.0
[sim.scenarios.staller]
text = "{ANSWER}"
ttft = {{ median_ms = 5.0, sigma = 0.0 }}
inter_token_ms = 10.0
failure = {{ stall_after_tokens = 3, stall_ms = 600000 }}
[sim.scenarios.pinging-staller]
text = "{ANSWER}"
ttft = {{ median_ms = 5.0, sigma = 0.0 }}
inter_token_ms = 10.0
keepalive_ms = 50
failure = {{ stall_after_tokens = 3, stall_ms = 600000 }}
[sim.scenarios.tool-dropper]
ttft = {{ median_ms = 5.0, sigma = 0.0 }}
inter_token_ms = 1.0
tool_fragments = 12
tool_calls = [{{ name = "lookup", arguments = '{{"query":"tailcut streaming","limit":5}}' }}]
failure = {{ drop_after_tokens = 6 }}
[sim.scenarios.tool-ok]
ttft = {{ median_ms = 5.0, sigma = 0.0 }}
inter_token_ms = 1.0
tool_fragments = 12
tool_calls = [{{ name = "lookup", arguments = '{{"query":"tailcut streaming","limit":5}}' }}]
"#
    )
}

fn with_policy(routes: &[(&str, &str, &str)], prose: &str) -> String {
    config_toml(routes, &scenarios()) + &format!("[policies]\nprose = {prose}\n")
}

fn headers() -> Vec<(&'static str, &'static str)> {
    vec![("x-tailcut-hedge", "off")]
}

fn count(events: &[(String, Value)], name: &str) -> usize {
    events.iter().filter(|(n, _)| n == name).count()
}

#[tokio::test]
async fn restart_on_native_sse_sends_one_reset_then_one_whole_answer() {
    let server = start(&with_policy(
        &[("a", "openai", "dropper"), ("b", "openai", "other")],
        "[\"restart\"]",
    ))
    .await;
    let (status, events) = post_native(&server.url(""), &chat_body(true), &headers()).await;
    assert_eq!(status, 200);
    assert_eq!(count(&events, "reset"), 1, "one reset: {events:?}");
    assert_eq!(
        native_text(&events),
        "A completely different answer from another route.",
        "{events:?}"
    );
    let done = &events.last().expect("events").1;
    assert_eq!(events.last().map(|e| e.0.as_str()), Some("done"), "{events:?}");
    assert_eq!(done["envelope"]["policy"], "restart");
    assert_eq!(done["envelope"]["resets"], 1);
    assert_eq!(done["envelope"]["route"], "b");
    assert_eq!(done["envelope"]["fell_back_from"][0]["after_tokens"], 4, "{done}");
}

#[tokio::test]
async fn restart_for_an_openai_client_is_invisible_when_the_new_answer_matches() {
    let server = start(&with_policy(
        &[("a", "openai", "dropper"), ("b", "anthropic", "same")],
        "[\"restart\"]",
    ))
    .await;
    let reply = post_sse(&server.url(""), &chat_body(true), &headers()).await;
    assert_eq!(reply.text(), ANSWER, "exactly one copy of the answer: {}", reply.raw);
    assert!(reply.done(), "{}", reply.raw);
    let env = reply.envelope();
    assert_eq!(env["policy"], "restart", "{env}");
    assert_eq!(env["route"], "b", "{env}");
}

#[tokio::test]
async fn restart_for_an_openai_client_that_diverges_ends_with_an_honest_error() {
    let server = start(&with_policy(
        &[("a", "openai", "dropper"), ("b", "openai", "other")],
        "[\"restart\"]",
    ))
    .await;
    let reply = post_sse(&server.url(""), &chat_body(true), &headers()).await;
    assert!(!reply.done(), "never [DONE] on a spliced answer: {}", reply.raw);
    let text = reply.text();
    assert!(
        ANSWER.starts_with(&text) && !text.is_empty(),
        "only the first route's prefix was sent: {text:?}"
    );
    let last = reply.chunks().last().cloned().expect("chunks");
    assert!(
        last["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("diverged")),
        "{last}"
    );
}

#[tokio::test]
async fn continue_joins_the_partial_and_the_continuation_without_repeating() {
    let server = start(&with_policy(
        &[("a", "openai", "dropper"), ("b", "openai", "same")],
        "[\"continue\", \"restart\"]",
    ))
    .await;
    let reply = post_sse(&server.url(""), &chat_body(true), &headers()).await;
    assert!(reply.done(), "{}", reply.raw);
    assert_eq!(reply.text(), ANSWER, "partial + continuation, nothing twice");
    let env = reply.envelope();
    assert_eq!(env["policy"], "continue", "{env}");
    assert_eq!(env["route_switches"], 1, "{env}");
    let log = server.sim.as_ref().expect("sim").log();
    let cont: Vec<&SimRecord> = log.iter().filter(|r| r.scenario == "same").collect();
    assert!(
        cont[0].prefill_chars > 0,
        "the continuation request carried the partial answer"
    );
}

#[tokio::test]
async fn continue_on_native_sse_announces_the_route_switch() {
    let server = start(&with_policy(
        &[("a", "openai", "dropper"), ("b", "anthropic", "same")],
        "[\"continue\", \"restart\"]",
    ))
    .await;
    let (_, events) = post_native(&server.url(""), &chat_body(true), &headers()).await;
    assert_eq!(count(&events, "route_switch"), 1, "{events:?}");
    assert_eq!(count(&events, "reset"), 0, "{events:?}");
    assert_eq!(native_text(&events), ANSWER);
}

#[tokio::test]
async fn a_continuation_that_cannot_be_verified_is_a_reset_with_no_route_switch_before_it() {
    // b repeats the answer's first words and then differs: nothing of it is sent, and the
    // restart is said with a `reset` alone (a `route_switch` would have told the client to
    // keep text it is about to replace).
    let server = start(&with_policy(
        &[("a", "openai", "dropper"), ("b", "openai", "differ")],
        "[\"continue\", \"restart\"]",
    ))
    .await;
    let (status, events) = post_native(&server.url(""), &chat_body(true), &headers()).await;
    assert_eq!(status, 200);
    assert_eq!(count(&events, "reset"), 1, "{events:?}");
    assert_eq!(count(&events, "route_switch"), 0, "{events:?}");
    let (name, done) = events.last().cloned().expect("events");
    assert_eq!(name, "done", "{events:?}");
    assert_eq!(done["envelope"]["route_switches"].as_u64().unwrap_or(0), 0, "{done}");
    assert_eq!(done["envelope"]["resets"], 1, "{done}");
    assert_eq!(done["envelope"]["policy"], "restart", "{done}");
    assert_eq!(native_text(&events), ANSWER, "{events:?}");
}

#[tokio::test]
async fn a_continuation_after_the_clients_own_prefill_is_judged_against_prefill_and_answer() {
    // The client's request ends with its own prefill; the first route continues it and is
    // cut, the next continues (or starts the whole message over): either way the client ends
    // with the rest of the answer once, with no reset.
    let prefill = "One two";
    for next in ["same", "restarter"] {
        let server = start(&with_policy(
            &[("a", "openai", "dropper"), ("b", "openai", next)],
            "[\"continue\", \"restart\"]",
        ))
        .await;
        let mut body = chat_body(true);
        body["messages"] = json!([
            {"role": "user", "content": "Count."},
            {"role": "assistant", "content": prefill},
        ]);
        let (status, events) = post_native(&server.url(""), &body, &headers()).await;
        assert_eq!(status, 200);
        assert_eq!(count(&events, "reset"), 0, "{next}: {events:?}");
        assert_eq!(count(&events, "route_switch"), 1, "{next}: {events:?}");
        assert_eq!(native_text(&events), &ANSWER[prefill.len()..], "{next}: {events:?}");
    }
}

#[tokio::test]
async fn a_voice_answer_whose_continuation_cannot_be_verified_is_truncated_not_restarted() {
    // Voice is "continue, else truncate": a continuation that repeats the answer's start and
    // then differs is dropped, and the answer ends with what the client holds, no reset.
    let server = start(&with_policy(
        &[("a", "openai", "dropper"), ("b", "openai", "differ")],
        "[\"continue\", \"restart\"]",
    ))
    .await;
    let mut h = headers();
    h.push(("x-tailcut-response-type", "voice"));
    let (status, events) = post_native(&server.url(""), &chat_body(true), &h).await;
    assert_eq!(status, 200);
    assert_eq!(count(&events, "reset"), 0, "{events:?}");
    let (name, done) = events.last().cloned().expect("events");
    assert_eq!(name, "done", "{events:?}");
    assert_eq!(done["finish_reason"], "truncated", "{done}");
    assert_eq!(done["envelope"]["policy"], "truncate", "{done}");
    let text = native_text(&events);
    assert!(!text.is_empty() && ANSWER.starts_with(&text), "{text:?}");
}

#[tokio::test]
async fn prose_whose_only_route_keeps_dying_ends_with_an_error_not_a_truncate_it_has_not() {
    // Prose is "continue, else restart": when no route can carry the answer on, it is an
    // honest error, and the envelope names no truncate policy. Voice ("continue, else
    // truncate") keeps what the client holds and ends truncated.
    let server = start(&with_policy(
        &[("a", "openai", "dropper")],
        "[\"continue\", \"restart\"]",
    ))
    .await;
    let (status, events) = post_native(&server.url(""), &chat_body(true), &headers()).await;
    assert_eq!(status, 200);
    let (name, end) = events.last().cloned().expect("events");
    assert_eq!(name, "error", "{events:?}");
    assert_eq!(end["class"], "unavailable", "{end}");
    assert_ne!(end["envelope"]["policy"], "truncate", "{end}");
    assert!(
        end["envelope"]["fell_back_from"]
            .as_array()
            .is_some_and(|f| !f.is_empty()),
        "{end}"
    );
    assert!(!native_text(&events).is_empty(), "the partial text was sent first");
    assert_eq!(
        count(&events, "route_switch"),
        0,
        "a continuation on the same route is no switch"
    );

    let reply = post_sse(&server.url(""), &chat_body(true), &headers()).await;
    let last = reply.chunks().last().cloned().unwrap_or_default();
    assert_eq!(last["error"]["code"], "unavailable", "{}", reply.raw);

    let mut h = headers();
    h.push(("x-tailcut-response-type", "voice"));
    let (_, events) = post_native(&server.url(""), &chat_body(true), &h).await;
    let (name, done) = events.last().cloned().expect("events");
    assert_eq!(name, "done", "{events:?}");
    assert_eq!(done["finish_reason"], "truncated", "{done}");
    assert_eq!(done["envelope"]["policy"], "truncate", "{done}");
}

#[tokio::test]
async fn truncate_keeps_the_partial_and_ends_honestly() {
    let server = start(&with_policy(
        &[("a", "openai", "dropper"), ("b", "openai", "same")],
        "\"truncate\"",
    ))
    .await;
    let reply = post_sse(&server.url(""), &chat_body(true), &headers()).await;
    assert!(
        !reply.done(),
        "a truncated answer never ends with [DONE]: {}",
        reply.raw
    );
    assert!(ANSWER.starts_with(&reply.text()) && !reply.text().is_empty());
    assert!(
        reply.chunks().last().is_some_and(|c| c.get("error").is_some()),
        "{}",
        reply.raw
    );

    let (_, events) = post_native(&server.url(""), &chat_body(true), &headers()).await;
    let (name, done) = events.last().cloned().expect("events");
    assert_eq!(name, "done", "{events:?}");
    assert_eq!(done["finish_reason"], "truncated", "{done}");
    assert_eq!(done["envelope"]["policy"], "truncate");
    let log = server.sim.as_ref().expect("sim").log();
    assert!(log.iter().all(|r| r.scenario != "same"), "truncate asks no other route");
}

#[tokio::test(start_paused = true)]
async fn stall_applies_the_policy_after_the_stall_limit_not_before() {
    let toml = with_policy(&[("a", "openai", "staller"), ("b", "openai", "other")], "[\"restart\"]")
        .replace("name = \"a\"\n", "name = \"a\"\nstall_timeout_ms = 2000\n");
    let server = start(&toml).await;
    let (_, events) = post_native(&server.url(""), &chat_body(true), &headers()).await;
    assert_eq!(
        native_text(&events),
        "A completely different answer from another route."
    );
    let log = server.sim.as_ref().expect("sim").log();
    let stalled = log.iter().find(|r| r.scenario == "staller").expect("primary");
    let next = log.iter().find(|r| r.scenario == "other").expect("restart");
    let first = stalled.first_token_at.expect("first token");
    // 3 tokens 10 ms apart: the last token left ~20 ms after the first; then 2 s of silence.
    let waited = next.accepted_at.saturating_duration_since(first);
    assert!(
        waited >= Duration::from_millis(2020),
        "not before the stall limit: {waited:?}"
    );
    assert!(
        waited <= Duration::from_millis(2030),
        "right at the stall limit: {waited:?}"
    );
    let done = &events.last().expect("events").1;
    assert_eq!(done["envelope"]["fell_back_from"][0]["class"], "timeout", "{done}");
}

#[tokio::test]
async fn keep_alives_alone_never_reset_the_stall_limit_on_either_wire() {
    // The route goes silent after three tokens but keeps its stream alive: an SSE comment
    // every 50 ms (OpenAI-compatible servers) or Anthropic's `event: ping`. Neither is a
    // token: the stall limit fires as if the stream were silent, and the answer restarts.
    for wire in ["openai", "anthropic"] {
        let toml = with_policy(
            &[("a", wire, "pinging-staller"), ("b", "openai", "other")],
            "[\"restart\"]",
        )
        .replace("name = \"a\"\n", "name = \"a\"\nstall_timeout_ms = 500\n");
        let server = start(&toml).await;
        let (_, events) = tokio::time::timeout(
            Duration::from_secs(30),
            post_native(&server.url(""), &chat_body(true), &headers()),
        )
        .await
        .unwrap_or_else(|_| panic!("{wire}: keep-alives held the stall limit off"));
        assert_eq!(
            native_text(&events),
            "A completely different answer from another route.",
            "{wire}"
        );
        let done = &events.last().expect("events").1;
        assert_eq!(
            done["envelope"]["fell_back_from"][0]["class"], "timeout",
            "{wire}: {done}"
        );
        let log = server.sim.as_ref().expect("sim").log();
        assert!(
            log.iter().any(|r| r.scenario == "pinging-staller"),
            "{wire}: the stalled route was asked"
        );
    }
}

#[tokio::test]
async fn a_tool_call_that_dies_half_way_is_never_sent_and_restarts_seamlessly() {
    let server = start(&config_toml(
        &[("a", "openai", "tool-dropper"), ("b", "openai", "tool-ok")],
        &scenarios(),
    ))
    .await;
    let body = json!({
        "model": "chat", "stream": true,
        "messages": [{"role": "user", "content": "search"}],
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    });
    let (_, events) = post_native(&server.url(""), &body, &headers()).await;
    assert_eq!(
        count(&events, "reset"),
        0,
        "nothing visible was sent, so no reset: {events:?}"
    );
    let calls: Vec<&Value> = events
        .iter()
        .filter(|(n, _)| n == "tool_call")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(calls.len(), 1, "{events:?}");
    let args: Value = serde_json::from_str(calls[0]["call"]["arguments"].as_str().expect("args")).expect("JSON");
    assert_eq!(args, json!({"query": "tailcut streaming", "limit": 5}));
    let done = &events.last().expect("events").1;
    assert_eq!(done["envelope"]["route"], "b", "{done}");

    let reply = post_sse(&server.url(""), &body, &headers()).await;
    assert!(reply.done(), "an OpenAI client never noticed: {}", reply.raw);
    let deltas: Vec<Value> = reply
        .chunks()
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(deltas.len(), 1, "one whole tool call: {}", reply.raw);
}

/// `with_policy`'s routes, counting tokens with o200k (a word of `ANSWER` a token).
fn counted_by_o200k(routes: &[(&str, &str, &str)], prose: &str) -> String {
    let mut toml = with_policy(routes, prose);
    for (name, _, _) in routes {
        let model = format!("model = \"model-{name}\"\n");
        toml = toml.replace(&model, &format!("{model}tokenizer = \"o200k\"\n"));
    }
    toml
}

fn completion_tokens(chunks: &[Value]) -> Option<Value> {
    chunks
        .iter()
        .find_map(|c| c.get("usage").filter(|u| u.is_object()))
        .map(|u| u["completion_tokens"].clone())
}

#[tokio::test]
async fn a_continuation_asks_only_for_what_is_left_of_max_tokens_and_usage_counts_the_whole_answer() {
    let server = start(&counted_by_o200k(
        &[("a", "openai", "dropper"), ("b", "openai", "same")],
        "[\"continue\", \"restart\"]",
    ))
    .await;
    let mut body = chat_body(true);
    body["max_tokens"] = json!(10);
    body["stream_options"] = json!({"include_usage": true});
    let reply = post_sse(&server.url(""), &body, &headers()).await;
    assert!(reply.done(), "{}", reply.raw);
    assert_eq!(reply.envelope()["policy"], "continue", "{}", reply.raw);
    // Four words before the cut, then the six left of the ten asked for.
    assert_eq!(
        reply.text(),
        "One two three four five six seven eight nine ten",
        "{}",
        reply.raw
    );
    let chunks = reply.chunks();
    let finish = chunks
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str().map(str::to_string));
    assert_eq!(finish.as_deref(), Some("length"), "{}", reply.raw);
    assert_eq!(
        completion_tokens(&chunks),
        Some(json!(10)),
        "usage counts the cut attempt's delivered tokens too: {}",
        reply.raw
    );

    body["stream"] = json!(false);
    let whole: Value = post_chat(&server, &body).await.json().await.expect("a JSON completion");
    assert_eq!(
        whole["choices"][0]["message"]["content"], "One two three four five six seven eight nine ten",
        "{whole}"
    );
    assert_eq!(whole["usage"]["completion_tokens"], 10, "{whole}");
    // The usage adds up: each attempt's tokens are listed, and the client's usage is their
    // sum. The cut attempt never reported its own: it is estimated (the prompt it was sent,
    // with the per-message framing, and the four words the client got).
    let billed = whole["tailcut"]["attempt_usage"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(billed.len(), 2, "{whole}");
    assert_eq!(
        (&billed[0]["route"], &billed[0]["estimated"]),
        (&json!("a"), &json!(true)),
        "{whole}"
    );
    assert_eq!(billed[0]["usage"]["output_tokens"], 4, "{whole}");
    assert_eq!(billed[1]["route"], "b");
    assert_eq!(
        billed[1].get("estimated"),
        None,
        "the continuation reported its own: {whole}"
    );
    assert_eq!(
        billed[1]["usage"]["input_tokens"], 6,
        "the continuation was billed its prompt and the four words it carried on from: {whole}"
    );
    assert!(billed.iter().all(|b| b["in_answer"] == true), "{whole}");
    let sum = |key: &str| billed.iter().filter_map(|b| b["usage"][key].as_u64()).sum::<u64>();
    assert_eq!(
        whole["usage"]["prompt_tokens"].as_u64(),
        Some(sum("input_tokens")),
        "{whole}"
    );
    assert_eq!(
        whole["usage"]["completion_tokens"].as_u64(),
        Some(sum("output_tokens")),
        "{whole}"
    );
}

#[tokio::test]
async fn a_continuation_with_nothing_left_of_max_tokens_ends_with_length_and_no_attempt() {
    // Routes without a known tokenizer estimate four bytes a token plus 10%: the 18 bytes of
    // "One two three four" count as 6, all of the 5 asked for.
    let server = start(&with_policy(
        &[("a", "openai", "dropper"), ("b", "openai", "same")],
        "[\"continue\", \"restart\"]",
    ))
    .await;
    let mut body = chat_body(true);
    body["max_tokens"] = json!(5);
    let reply = post_sse(&server.url(""), &body, &headers()).await;
    assert!(reply.done(), "{}", reply.raw);
    assert_eq!(reply.text(), "One two three four", "{}", reply.raw);
    let finish = reply
        .chunks()
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str().map(str::to_string));
    assert_eq!(finish.as_deref(), Some("length"), "{}", reply.raw);
    let log = server.sim.as_ref().expect("sim").log();
    assert!(
        log.iter().all(|r| r.scenario != "same"),
        "no continuation was asked for nothing: {log:?}"
    );
}
