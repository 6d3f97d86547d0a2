//! One coherent answer whatever fails, on paused time with scripted providers: the
//! continuation contract and its verified seam, routes that survive a refused hedge or a
//! refused prefill, budgets that leak nothing and never leave a healthy fallback idle, and
//! the error a client gets when no route can serve.
mod scripted;

use std::time::Duration;

use scripted::*;
use tailcut::types::{Dialect, ErrorClass, RequestCtx, StreamEvent};

fn openai() -> RequestCtx {
    RequestCtx::new(Dialect::OpenAi)
}

fn native() -> RequestCtx {
    RequestCtx::new(Dialect::Native)
}

fn error(evs: &[StreamEvent]) -> Option<&tailcut::types::ErrorEvent> {
    evs.iter().find_map(|e| match e {
        StreamEvent::Error(e) => Some(&**e),
        _ => None,
    })
}

/// `[hedge]` with a budget of `floor` hedges per second and no share of requests.
fn hedge_budget(floor: f64) -> String {
    format!("[hedge]\nbudget_ratio = 0.0\nbudget_floor_per_sec = {floor}\n")
}

#[tokio::test(start_paused = true)]
async fn a_hedge_refused_by_its_budget_keeps_its_route_for_failover() {
    // The primary is slow past the hedge delay (2 s default), the hedge budget is empty, and
    // then the primary fails before its first token: the route the hedge would have used
    // must still be there for the failover.
    let (gw, seen) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], &hedge_budget(0.0)),
        vec![
            ("a", Script::OpenErr(3000, err(ErrorClass::Unavailable, 503))),
            ("b", answer(50, &["Hello", " there."])),
        ],
    );
    let evs = collect(&gw, req(), openai()).await;
    assert_eq!(
        final_text(&evs),
        "Hello there.",
        "the failover is served by the route the hedge was refused: {:?}",
        kinds(&evs)
    );
    assert_eq!(seen.calls("b"), 1);
    assert!(
        envelope(&evs).is_some_and(|e| !e.hedged),
        "no hedge fired: its budget was empty"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hedge_refused_by_the_retry_budget_leaks_no_hedge_token() {
    // One hedge token in the hedge budget; the retry budget allows half an extra attempt per
    // request, so it refuses the first request's hedge and allows the second's. The first
    // refusal must not have spent the hedge token.
    let extra = format!(
        "{}[limits]\nretry_budget_ratio = 0.5\nretry_budget_floor_per_sec = 0.0\n",
        hedge_budget(0.1)
    );
    let slow = answer(3000, &["slow", " answer."]);
    let fast = answer(50, &["fast", " answer."]);
    let (gw, seen) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], &extra),
        vec![("a", slow), ("b", fast)],
    );
    let first = collect(&gw, req(), openai()).await;
    assert!(
        envelope(&first).is_some_and(|e| !e.hedged),
        "the retry budget refuses the first hedge"
    );
    assert_eq!(seen.calls("b"), 0);
    let second = collect(&gw, req(), openai()).await;
    assert!(
        envelope(&second).is_some_and(|e| e.hedged),
        "the hedge token is still there for the second request: {:?}",
        kinds(&second)
    );
    assert_eq!(final_text(&second), "fast answer.");
}

#[tokio::test(start_paused = true)]
async fn shadows_never_reach_side_effecting_requests_even_with_hedging_disabled() {
    let extra = "[hedge]\nenabled = false\n[limits]\nshadow_share = 1.0\n";
    let (gw, seen) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], extra),
        vec![("a", answer(50, &["done."])), ("b", answer(50, &["shadow."]))],
    );
    let mut ctx = openai();
    ctx.hedge_off = true; // the client says: this request has side effects
    let evs = collect(&gw, req(), ctx).await;
    assert_eq!(final_text(&evs), "done.");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        seen.calls("b"),
        0,
        "no second upstream may see a side-effecting request"
    );
    // Without side effects the shadow does run: the test can see one.
    let _ = collect(&gw, req(), openai()).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(seen.calls("b"), 1, "a request without side effects is shadowed");
}

#[tokio::test(start_paused = true)]
async fn same_route_retries_do_not_cost_the_last_route_its_turn() {
    // Two unreachable routes on higher rungs, each retried once on the same route, and a
    // healthy third: with max_attempts = 3 the third must still be tried.
    let extra = "[limits]\nmax_attempts = 3\n";
    let down = || Script::OpenErr(5, err(ErrorClass::Unavailable, 502));
    let (gw, seen) = gateway(
        &toml(&[("a", "L0"), ("b", "L1"), ("c", "L2")], extra),
        vec![("a", down()), ("b", down()), ("c", answer(50, &["served."]))],
    );
    let evs = collect(&gw, req(), openai()).await;
    assert_eq!(final_text(&evs), "served.", "{:?}", kinds(&evs));
    assert_eq!(
        (seen.calls("a"), seen.calls("b"), seen.calls("c")),
        (2, 2, 1),
        "each failing route is retried once, and the last route is tried"
    );
}

#[tokio::test(start_paused = true)]
async fn a_single_route_model_retries_a_transient_failure_once() {
    let (gw, seen) = gateway(
        &toml(&[("a", "L0")], ""),
        vec![(
            "a",
            Script::Seq(vec![
                Script::OpenErr(5, err(ErrorClass::Unavailable, 502)),
                answer(50, &["second", " try."]),
            ]),
        )],
    );
    let evs = collect(&gw, req(), openai()).await;
    assert_eq!(final_text(&evs), "second try.", "{:?}", kinds(&evs));
    assert_eq!(seen.calls("a"), 2);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_too_short_for_every_route_is_a_timeout_not_overload() {
    let (gw, seen) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], ""),
        vec![("a", answer(50, &["x"])), ("b", answer(50, &["y"]))],
    );
    let mut ctx = openai();
    ctx.deadline = Some(Duration::from_millis(1));
    let evs = collect(&gw, req(), ctx).await;
    let e = error(&evs).expect("no route can answer in 1 ms");
    assert_eq!(e.status, 504, "{e:?}");
    assert_eq!(e.class, ErrorClass::Timeout);
    assert_eq!(e.retry_after, None, "a retry of the same request cannot do better");
    assert_eq!(seen.calls("a") + seen.calls("b"), 0, "no route was started");
}

#[tokio::test(start_paused = true)]
async fn context_length_on_every_route_is_the_clients_error() {
    let too_long = || Script::OpenErr(5, err(ErrorClass::ContextLength, 400));
    let (gw, _) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], ""),
        vec![("a", too_long()), ("b", too_long())],
    );
    let evs = collect(&gw, req(), openai()).await;
    let e = error(&evs).expect("every route said the prompt is too long");
    assert_eq!((e.status, e.class), (400, ErrorClass::ContextLength), "{e:?}");
}

#[tokio::test(start_paused = true)]
async fn a_midstream_recovery_is_not_refused_by_the_fleet_budgets() {
    // No retry budget and no blast-radius allowance at all: a committed answer that breaks
    // is still recovered on the healthy route (a per-request bound limits recoveries).
    let extra = "[limits]\nretry_budget_ratio = 0.0\nretry_budget_floor_per_sec = 0.0\nblast_radius = 0.0\nblast_radius_floor_per_sec = 0.0\n";
    let (gw, _) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], extra),
        vec![
            ("a", dropped_after(&["Hello", " big"])),
            ("b", answer(50, &[" wide", " world."])),
        ],
    );
    let evs = collect(&gw, req(), openai()).await;
    assert_eq!(final_text(&evs), "Hello big wide world.", "{:?}", kinds(&evs));
    assert!(error(&evs).is_none(), "not truncated: {:?}", kinds(&evs));
}

#[tokio::test(start_paused = true)]
async fn a_continuation_request_ends_with_the_partial_answer() {
    let (gw, seen) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], ""),
        vec![
            ("a", dropped_after(&["The", " very"])),
            ("b", answer(50, &[" very", " old", " tree."])),
        ],
    );
    let evs = collect(&gw, req(), openai()).await;
    assert_eq!(
        seen.prefills("b"),
        vec![Some("The very".to_string())],
        "the continuation carries exactly what the client holds"
    );
    assert_eq!(
        final_text(&evs),
        "The very very old tree.",
        "a continuation that repeats the last word on purpose keeps it"
    );
}

#[tokio::test(start_paused = true)]
async fn a_continuation_that_starts_over_is_never_glued_onto_the_partial_answer() {
    // b ignores the prefill and answers from the beginning; the client holds 40 words.
    let words: Vec<String> = (0..60)
        .map(|i| if i == 0 { "w0".into() } else { format!(" w{i}") })
        .collect();
    let all: Vec<&str> = words.iter().map(String::as_str).collect();
    for ctx in [openai(), native()] {
        let dialect = ctx.dialect;
        let (gw, _) = gateway(
            &toml(&[("a", "L0"), ("b", "L0")], ""),
            vec![("a", dropped_after(&all[..40])), ("b", answer(50, &all))],
        );
        let evs = collect(&gw, req(), ctx).await;
        assert_eq!(
            final_text(&evs),
            all.concat(),
            "{dialect:?}: the repeat is swallowed, nothing doubled: {:?}",
            kinds(&evs)
        );
        assert!(
            !evs.iter().any(|e| matches!(e, StreamEvent::Reset { .. })),
            "{dialect:?}: a matching restart needs no reset"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_continuation_that_begins_like_the_answer_and_differs_becomes_a_restart() {
    // b's continuation repeats the answer's first word and then differs: it is dropped, and a
    // restart (no prefill) is asked instead; here it reproduces the answer, so even an SDK
    // client gets the whole answer without a seam.
    let (gw, seen) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], ""),
        vec![
            ("a", dropped_after(&["Hello", " big"])),
            (
                "b",
                Script::Seq(vec![
                    answer(50, &["Hello", " there", " friend."]),
                    answer(50, &["Hello", " big", " wide", " world."]),
                ]),
            ),
        ],
    );
    let evs = collect(&gw, req(), openai()).await;
    assert_eq!(final_text(&evs), "Hello big wide world.", "{:?}", kinds(&evs));
    assert_eq!(
        seen.prefills("b"),
        vec![Some("Hello big".to_string()), None],
        "a continuation, then a restart on the same healthy route"
    );
}

#[tokio::test(start_paused = true)]
async fn a_route_that_refuses_the_prefill_serves_the_restart() {
    // b answers the continuation request with a 400 (it cannot take a prefill): that is not
    // the client's fault and b is healthy, so the restart runs there.
    for ctx in [openai(), native()] {
        let dialect = ctx.dialect;
        let (gw, seen) = gateway(
            &toml(&[("a", "L0"), ("b", "L0")], ""),
            vec![
                ("a", dropped_after(&["Hello", " big"])),
                (
                    "b",
                    Script::Seq(vec![
                        Script::OpenErr(5, err(ErrorClass::BadRequest, 400)),
                        answer(50, &["Hello", " big", " wide", " world."]),
                    ]),
                ),
            ],
        );
        let evs = collect(&gw, req(), ctx).await;
        assert_eq!(
            final_text(&evs),
            "Hello big wide world.",
            "{dialect:?}: {:?}",
            kinds(&evs)
        );
        assert!(error(&evs).is_none(), "{dialect:?}: no needless error");
        assert_eq!(seen.calls("b"), 2, "{dialect:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_restart_that_diverges_is_a_reset_for_native_clients_and_an_error_for_sdks() {
    // Neither route can continue (names starting with n): restart. b's answer differs.
    for (ctx, reset) in [(native(), true), (openai(), false)] {
        let dialect = ctx.dialect;
        let (gw, _) = gateway(
            &toml(&[("na", "L0"), ("nb", "L0")], ""),
            vec![
                ("na", dropped_after(&["Hello", " big"])),
                ("nb", answer(50, &["Howdy", " partner."])),
            ],
        );
        let evs = collect(&gw, req(), ctx).await;
        if reset {
            assert_eq!(final_text(&evs), "Howdy partner.", "{dialect:?}: {:?}", kinds(&evs));
        } else {
            assert_eq!(final_text(&evs), "Hello big", "{dialect:?}: nothing spliced");
            assert!(error(&evs).is_some(), "{dialect:?}: an honest error: {:?}", kinds(&evs));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_prompt_too_long_for_every_window_is_a_context_length_error() {
    let text = toml(&[("a", "L0"), ("b", "L0")], "").replace("capabilities", "context_window = 64\ncapabilities");
    let (gw, seen) = gateway(&text, vec![("a", answer(50, &["x"])), ("b", answer(50, &["y"]))]);
    let mut long = req();
    long.messages = vec![tailcut::types::Message::text(
        tailcut::types::Role::User,
        "word ".repeat(2000),
    )];
    let evs = collect(&gw, long, openai()).await;
    let e = error(&evs).expect("no window fits");
    assert_eq!(
        (e.status, e.class),
        (400, ErrorClass::ContextLength),
        "the client must shorten the prompt: {e:?}"
    );
    assert_eq!(seen.calls("a") + seen.calls("b"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_primary_that_always_dies_mid_answer_never_leaves_the_fallback_idle() {
    // Default budgets. Every stream of `a` dies after two words; `b` is healthy. Sequential
    // requests: each is recovered (never truncated), and `a`'s breaker opens so that later
    // requests go to `b` first, as its normal traffic.
    let (gw, seen) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], ""),
        vec![
            ("a", dropped_after(&["Hello", " big"])),
            ("b", answer(50, &["Hello", " big", " wide", " world."])),
        ],
    );
    let mut first_try_on_b = 0;
    for i in 0..30 {
        let evs = collect(&gw, req(), openai()).await;
        assert_eq!(
            final_text(&evs),
            "Hello big wide world.",
            "request {i}: {:?}",
            kinds(&evs)
        );
        assert!(error(&evs).is_none(), "request {i} is not truncated");
        if envelope(&evs).is_some_and(|e| e.fell_back_from.is_empty()) {
            first_try_on_b += 1;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        seen.calls("a") < 30,
        "the broken route stops being tried first: {} calls",
        seen.calls("a")
    );
    assert!(first_try_on_b > 0, "traffic moved to the healthy route");
}

// ---- thinking-first answers ----

fn thinks(t: &str) -> Step {
    Step::D(tailcut::provider::Delta::Thinking(tailcut::types::Thinking::Text(
        t.into(),
    )))
}

fn signs(s: &str) -> Step {
    Step::D(tailcut::provider::Delta::Thinking(tailcut::types::Thinking::Signature(
        s.into(),
    )))
}

/// Reasoning, its signature, then `words`, each 10 ms apart after `ttft_ms`, and a finish.
fn reasoned(ttft_ms: u64, thinking: &[&str], words: &[&str]) -> Script {
    let mut steps = vec![Step::Wait(ttft_ms)];
    for t in thinking {
        steps.extend([thinks(t), Step::Wait(10)]);
    }
    steps.extend([signs("sig"), Step::Wait(10)]);
    for w in words {
        steps.extend([text(w), Step::Wait(10)]);
    }
    steps.push(finish());
    Script::Stream(steps)
}

/// Reasoning that is cut before its signature: the connection drops.
fn cut_while_thinking(thinking: &[&str]) -> Script {
    let mut steps = vec![Step::Wait(10)];
    for t in thinking {
        steps.extend([thinks(t), Step::Wait(10)]);
    }
    steps.push(Step::Err(err(ErrorClass::Unavailable, 502)));
    Script::Stream(steps)
}

fn thinking_text(evs: &[StreamEvent]) -> String {
    let mut out = String::new();
    for e in evs {
        match e {
            StreamEvent::Thinking(tailcut::types::Thinking::Text(t)) => out.push_str(t),
            StreamEvent::Reset { .. } => out.clear(),
            _ => {}
        }
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_first_thinking_delta_wins_the_hedge_race_and_commits() {
    // The primary's first text comes after the hedge delay (2 s); the hedge only thinks at
    // first, and that reasoning is what proves it is answering.
    let (gw, _) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], ""),
        vec![
            ("a", answer(4000, &["slow."])),
            ("b", reasoned(100, &["Let me", " think."], &["fast."])),
        ],
    );
    let evs = collect(&gw, req(), native()).await;
    let env = envelope(&evs).expect("an envelope");
    assert!(env.hedged, "{:?}", kinds(&evs));
    assert_eq!(env.route.as_deref(), Some("b"), "the hedge won with its thinking");
    assert_eq!(thinking_text(&evs), "Let me think.");
    assert_eq!(final_text(&evs), "fast.");
    let first_content = evs.iter().position(|e| matches!(e, StreamEvent::Thinking(_)));
    let first_text = evs.iter().position(|e| matches!(e, StreamEvent::TextDelta(_)));
    assert!(
        first_content < first_text,
        "thinking streams before the text: {:?}",
        kinds(&evs)
    );
}

#[tokio::test(start_paused = true)]
async fn an_answer_cut_inside_its_thinking_restarts_for_a_client_that_can_be_told() {
    // Prose continues by default, but an answer that showed thinking cannot be continued: the
    // second route is asked afresh (no prefill) and the client is told to replace the first.
    let (gw, seen) = gateway(
        &toml(&[("a", "L0"), ("b", "L1")], ""),
        vec![
            ("a", cut_while_thinking(&["First", " idea"])),
            ("b", reasoned(50, &["Second", " idea."], &["Answer."])),
        ],
    );
    let evs = collect(&gw, req(), native()).await;
    let resets = evs.iter().filter(|e| matches!(e, StreamEvent::Reset { .. })).count();
    assert_eq!(resets, 1, "{:?}", kinds(&evs));
    assert_eq!(
        thinking_text(&evs),
        "Second idea.",
        "only the new answer's reasoning remains"
    );
    assert_eq!(final_text(&evs), "Answer.");
    assert_eq!(seen.prefills("b"), [None], "a restart, not a continuation");
    assert!(matches!(evs.last(), Some(StreamEvent::Finish { .. })));
}

#[tokio::test(start_paused = true)]
async fn an_answer_cut_after_its_thinking_ends_honestly_for_a_dialect_that_cannot_reset() {
    // The OpenAI and Anthropic dialects cannot take shown reasoning back, and a new answer's
    // reasoning cannot pass for it: the stream ends with an in-band error, never a second
    // answer glued to the first one's reasoning, and no route is asked in vain.
    let mut cut = match reasoned(10, &["Partial"], &["Half"]) {
        Script::Stream(steps) => steps,
        _ => unreachable!(),
    };
    cut.pop(); // no finish: the connection drops after the first word
    cut.push(Step::Err(err(ErrorClass::Unavailable, 502)));
    for dialect in [Dialect::OpenAi, Dialect::Anthropic] {
        let (gw, seen) = gateway(
            &toml(&[("a", "L0"), ("b", "L1")], ""),
            vec![
                ("a", Script::Stream(cut.clone())),
                ("b", reasoned(50, &["Other"], &["Whole answer."])),
            ],
        );
        let evs = collect(&gw, req(), RequestCtx::new(dialect)).await;
        assert_eq!(thinking_text(&evs), "Partial", "{dialect:?}: {:?}", kinds(&evs));
        assert_eq!(final_text(&evs), "Half", "{dialect:?}: nothing of another answer");
        assert!(error(&evs).is_some(), "{dialect:?}: an honest end: {:?}", kinds(&evs));
        assert_eq!(seen.calls("b"), 0, "{dialect:?}: no attempt that could not be used");
    }
}

#[tokio::test(start_paused = true)]
async fn a_continuation_carries_the_text_on_without_its_own_reasoning() {
    // The first answer showed no thinking, so it is continued; the continuation's reasoning is
    // about resuming, not the answer, and is not forwarded.
    let (gw, seen) = gateway(
        &toml(&[("a", "L0"), ("b", "L1")], ""),
        vec![
            ("a", dropped_after(&["The", " sky"])),
            ("b", reasoned(50, &["Resume", " here."], &[" is", " blue."])),
        ],
    );
    let evs = collect(&gw, req(), openai()).await;
    assert_eq!(final_text(&evs), "The sky is blue.", "{:?}", kinds(&evs));
    assert_eq!(thinking_text(&evs), "", "{:?}", kinds(&evs));
    assert_eq!(seen.prefills("b"), [Some("The sky".to_string())]);
}

#[tokio::test(start_paused = true)]
async fn no_continuation_goes_to_an_anthropic_route_asked_to_think() {
    // Anthropic refuses a prefill while thinking is on: the prose answer is restarted there.
    let routes = toml(&[("a", "L0"), ("b", "L1")], "").replace("wire = \"openai\"", "wire = \"anthropic\"");
    let (gw, seen) = gateway(
        &routes,
        vec![
            ("a", dropped_after(&["The", " sky"])),
            ("b", answer(50, &["The sky is blue."])),
        ],
    );
    let mut asks = req();
    let thinking = serde_json::value::RawValue::from_string(r#"{"type":"enabled","budget_tokens":1024}"#.into());
    asks.verbatim = Some(std::sync::Arc::new(tailcut::types::Verbatim {
        wire: tailcut::types::Wire::Anthropic,
        fields: vec![("thinking".into(), tailcut::types::RawJson::new(thinking.expect("JSON")))],
        headers: Vec::new(),
    }));
    let evs = collect(&gw, asks, native()).await;
    assert_eq!(seen.prefills("b"), [None], "{:?}", kinds(&evs));
    assert_eq!(final_text(&evs), "The sky is blue.");
    // Without thinking the same failure is continued.
    let (gw, seen) = gateway(
        &routes,
        vec![
            ("a", dropped_after(&["The", " sky"])),
            ("b", answer(50, &[" is blue."])),
        ],
    );
    let evs = collect(&gw, req(), native()).await;
    assert_eq!(seen.prefills("b"), [Some("The sky".to_string())], "{:?}", kinds(&evs));
}

#[tokio::test(start_paused = true)]
async fn a_restarted_answer_is_billed_both_attempts_and_told_the_new_ones_usage() {
    let mut b = match answer(50, &["Fresh", " answer."]) {
        Script::Stream(steps) => steps,
        _ => unreachable!(),
    };
    b.push(Step::D(tailcut::provider::Delta::Usage(tailcut::types::Usage::new(
        9, 2,
    ))));
    let extra = "[policies]\nprose = [\"restart\", \"truncate\"]\n";
    let (gw, _) = gateway(
        &toml(&[("a", "L0"), ("b", "L1")], extra),
        vec![("a", dropped_after(&["Old", " words"])), ("b", Script::Stream(b))],
    );
    let mut ask = req();
    ask.include_usage = true;
    let evs = collect(&gw, ask, native()).await;
    assert_eq!(final_text(&evs), "Fresh answer.", "{:?}", kinds(&evs));
    let usage = evs.iter().find_map(|e| match e {
        StreamEvent::Usage(u) => Some(*u),
        _ => None,
    });
    assert_eq!(
        usage,
        Some(tailcut::types::Usage::new(9, 2)),
        "only the answer the client kept"
    );
    let billed = &envelope(&evs).expect("an envelope").attempt_usage;
    assert_eq!(billed.len(), 2, "{billed:?}");
    assert!(
        billed[0].estimated && !billed[0].in_answer && billed[0].route == "a",
        "{billed:?}"
    );
    assert!(
        billed[0].usage.output_tokens > 0,
        "the replaced words were billed: {billed:?}"
    );
    assert!(!billed[1].estimated && billed[1].in_answer, "{billed:?}");
}

fn logprobs_of(token: &str) -> Step {
    let value =
        format!(r#"{{"content":[{{"token":{token:?},"logprob":-0.1,"bytes":[],"top_logprobs":[]}}],"refusal":null}}"#);
    let raw = serde_json::value::RawValue::from_string(value).expect("JSON");
    Step::D(tailcut::provider::Delta::Extra(Box::new(tailcut::types::Extra {
        wire: tailcut::types::Wire::OpenAi,
        field: tailcut::types::ExtraField::Logprobs,
        value: tailcut::types::RawJson::new(raw),
    })))
}

#[tokio::test(start_paused = true)]
async fn a_held_answers_logprobs_wait_for_its_text_and_a_native_client_gets_none() {
    // A structured answer is held until it is judged: its logprobs are not sent ahead of it
    // (an answer that failed its gate would leave them behind), they come with its text.
    let routes = toml(&[("a", "L0")], "").replace("\"streaming\"", "\"streaming\", \"json_schema\"");
    let script = Script::Stream(vec![
        Step::Wait(10),
        logprobs_of("{\"x\":"),
        text("{\"x\":"),
        logprobs_of("1}"),
        text("1}"),
        finish(),
    ]);
    let mut ask = req();
    ask.response_format = Some(tailcut::types::ResponseFormat::JsonObject);
    let (gw, _) = gateway(&routes, vec![("a", script.clone())]);
    let evs = collect(&gw, ask.clone(), openai()).await;
    let order = kinds(&evs);
    let text_at = order.iter().position(|k| k.starts_with("text(")).expect("the text");
    let extras: Vec<usize> = order
        .iter()
        .enumerate()
        .filter(|(_, k)| k.starts_with("extra("))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(extras.len(), 2, "{order:?}");
    assert!(
        extras.iter().all(|i| *i == text_at - 2 || *i == text_at - 1),
        "right before the text: {order:?}"
    );
    let (gw, _) = gateway(&routes, vec![("a", script)]);
    let evs = collect(&gw, ask, native()).await;
    assert!(
        !kinds(&evs).iter().any(|k| k.starts_with("extra(")),
        "{:?}",
        kinds(&evs)
    );
}
