//! Prefill over loopback: which request shapes each convention continues, and what the
//! behaviours (exact, starts over, diverges, refuses) and the Anthropic whitespace rule send.

use super::*;

const ANSWER: &str = "Hello big wide world";

fn with(continuation: Continuation, text: &str) -> Scenario {
    Scenario {
        continuation,
        ..quick(text)
    }
}

fn convention(convention: Convention) -> Continuation {
    Continuation {
        convention,
        ..Continuation::default()
    }
}

fn behaviour(behaviour: Behaviour) -> Continuation {
    Continuation {
        behaviour,
        ..Continuation::default()
    }
}

/// The conversation, then `partial` as the final assistant message.
fn prefilled(partial: &str) -> Value {
    stream_body(json!([
        {"role": "user", "content": "say hello"},
        {"role": "assistant", "content": partial}
    ]))
}

fn last_record(handle: &SimHandle) -> SimRecord {
    handle.log().last().cloned().unwrap_or_else(|| panic!("no record"))
}

#[tokio::test]
async fn openai_conventions_continue_only_their_own_request_shape() {
    let names = ["any", "assistant", "prefix", "vllm", "none"];
    let conventions = [
        Convention::Any,
        Convention::Assistant,
        Convention::Prefix,
        Convention::Vllm,
        Convention::None,
    ];
    let scenarios = names
        .into_iter()
        .zip(conventions)
        .map(|(n, c)| (n, with(convention(c), ANSWER)))
        .collect();
    let handle = sim(scenarios).await;
    let plain = prefilled("Hello big");
    let mut marked = plain.clone();
    marked["messages"][1]["prefix"] = json!(true);
    let mut vllm = plain.clone();
    vllm["continue_final_message"] = json!(true);
    vllm["add_generation_prompt"] = json!(false);
    // Per scenario: is the plain, the `prefix`-marked, the vLLM-marked request continued?
    let expected = [
        ("any", [true, true, true]),
        ("assistant", [true, false, false]),
        ("prefix", [false, true, false]),
        ("vllm", [false, false, true]),
        ("none", [false, false, false]),
    ];
    for (name, honours) in expected {
        for ((shape, body), honoured) in [("plain", &plain), ("prefix", &marked), ("vllm", &vllm)]
            .into_iter()
            .zip(honours)
        {
            let text = streamed_text(&handle, "openai", name, body.clone()).await;
            let record = last_record(&handle);
            let (want_text, want) = if honoured {
                (" wide world", PrefillOutcome::Exact)
            } else {
                (ANSWER, PrefillOutcome::NotHonoured)
            };
            assert_eq!(text, want_text, "convention {name}, {shape} request");
            assert_eq!(
                record.continuation,
                Some(want),
                "convention {name}, {shape} request: record"
            );
            assert_eq!(record.continued, honoured, "convention {name}, {shape}: continued");
            assert_eq!(record.prefill_chars, 9, "convention {name}, {shape}: prefill chars");
        }
    }
    handle.shutdown();
}

#[tokio::test]
async fn anthropic_continues_a_final_assistant_message_whatever_the_convention() {
    let handle = sim(vec![("none", with(convention(Convention::None), ANSWER))]).await;
    let text = streamed_text(&handle, "anthropic", "none", prefilled("Hello bi")).await;
    assert_eq!(text, "g wide world", "the tail of the cut token, then the rest");
    assert_eq!(last_record(&handle).continuation, Some(PrefillOutcome::Exact), "record");
    handle.shutdown();
}

#[tokio::test]
async fn exact_continues_inside_a_token_on_both_wires_streamed_or_not() {
    let handle = sim(vec![("s", quick(ANSWER))]).await;
    for wire in WIRES {
        let text = streamed_text(&handle, wire, "s", prefilled("Hello bi")).await;
        assert_eq!(text, "g wide world", "{wire}: remainder from inside 'big'");
        let record = last_record(&handle);
        assert_eq!(record.continuation, Some(PrefillOutcome::Exact), "{wire}: record");
        assert!(record.continued, "{wire}: continued");

        let mut whole = prefilled("Hello bi");
        whole["stream"] = json!(false);
        let body = parse(&body_text(send(&handle, wire, "s", whole).await).await);
        let text = match wire {
            "openai" => body["choices"][0]["message"]["content"].clone(),
            _ => body["content"][0]["text"].clone(),
        };
        assert_eq!(text, "g wide world", "{wire}: aggregated remainder: {body}");
    }
    handle.shutdown();
}

#[tokio::test]
async fn an_anthropic_prefill_stripped_of_whitespace_gets_the_whitespace_back_first() {
    let handle = sim(vec![
        ("words", quick("Hello world")),
        ("paras", quick("para one.\n\npara two")),
    ])
    .await;
    // The gateway sent "Hello " as "Hello" and "para one.\n\n" as "para one.".
    let text = streamed_text(&handle, "anthropic", "words", prefilled("Hello")).await;
    assert_eq!(text, " world", "the remainder starts with the stripped space");
    let text = streamed_text(&handle, "anthropic", "paras", prefilled("para one.")).await;
    assert_eq!(
        text, "\n\npara two",
        "the remainder starts with the stripped blank line"
    );
    handle.shutdown();
}

#[tokio::test]
async fn anthropic_refuses_a_final_assistant_text_ending_in_whitespace() {
    let handle = sim(vec![("s", quick(ANSWER))]).await;
    for partial in ["Hello ", "Hello big\n\n", " "] {
        let response = anthropic(&handle, "s", prefilled(partial)).await;
        assert_eq!(response.status(), 400, "{partial:?}: status");
        let body = parse(&body_text(response).await);
        assert_eq!(body["type"], "error", "{partial:?}: envelope {body}");
        assert_eq!(
            body["error"],
            json!({"type": "invalid_request_error",
                   "message": "messages: final assistant content cannot end with trailing whitespace"}),
            "{partial:?}: the API's error"
        );
        let record = last_record(&handle);
        assert_eq!(
            (record.status, record.end, record.continuation),
            (400, Some(SimEnd::ErrorStatus), Some(PrefillOutcome::TrailingWhitespace)),
            "{partial:?}: record"
        );
    }
    let text = streamed_text(&handle, "openai", "s", prefilled("Hello ")).await;
    assert_eq!(text, "big wide world", "the OpenAI wire has no such rule");
    handle.shutdown();
}

#[tokio::test]
async fn a_user_message_asking_to_continue_gets_the_whole_answer() {
    let handle = sim(vec![("s", quick(ANSWER))]).await;
    let body = stream_body(json!([
        {"role": "user", "content": "say hello"},
        {"role": "assistant", "content": "Hello big"},
        {"role": "user", "content": "Continue exactly where you stopped."}
    ]));
    for wire in WIRES {
        let text = streamed_text(&handle, wire, "s", body.clone()).await;
        assert_eq!(text, ANSWER, "{wire}: an instruction is not a prefill");
        let record = last_record(&handle);
        assert_eq!(
            (record.continuation, record.prefill_chars),
            (None, 0),
            "{wire}: no prefill"
        );
    }
    handle.shutdown();
}

#[tokio::test]
async fn starts_over_sends_the_whole_answer_on_both_wires() {
    let handle = sim(vec![("s", with(behaviour(Behaviour::StartsOver), ANSWER))]).await;
    for wire in WIRES {
        let text = streamed_text(&handle, wire, "s", prefilled("Hello big")).await;
        assert_eq!(text, ANSWER, "{wire}: from the start");
        let record = last_record(&handle);
        assert_eq!(record.continuation, Some(PrefillOutcome::StartsOver), "{wire}: record");
        assert!(!record.continued, "{wire}: not continued");
    }
    handle.shutdown();
}

#[tokio::test]
async fn diverges_repeats_the_first_words_then_parts_on_both_wires() {
    let original = "The very very old house stood by the quiet river";
    let two = Continuation {
        diverge_after_words: 2,
        ..behaviour(Behaviour::Diverges)
    };
    let handle = sim(vec![
        ("three", with(behaviour(Behaviour::Diverges), original)),
        ("two", with(two, original)),
    ])
    .await;
    for wire in WIRES {
        for (name, shared) in [("three", "The very very"), ("two", "The very")] {
            let text = streamed_text(&handle, wire, name, prefilled("The very")).await;
            assert!(text.starts_with(shared), "{wire}/{name}: repeats {shared:?}: {text:?}");
            let next = |s: &str| s[shared.len()..].trim_start().chars().next();
            assert_ne!(
                next(&text),
                next(original),
                "{wire}/{name}: parts right after: {text:?}"
            );
            assert_eq!(
                text.split(' ').count(),
                original.split(' ').count(),
                "{wire}/{name}: length"
            );
            let record = last_record(&handle);
            assert_eq!(
                record.continuation,
                Some(PrefillOutcome::Diverges),
                "{wire}/{name}: record"
            );
        }
    }
    let again = streamed_text(&handle, "openai", "three", prefilled("The")).await;
    let other = streamed_text(&handle, "anthropic", "three", prefilled("The")).await;
    assert_eq!(again, other, "a diverging answer is reproducible");
    handle.shutdown();
}

#[tokio::test]
async fn refuses_answers_400_with_the_wire_error_body_and_only_for_a_prefill() {
    let custom = Continuation {
        refusal_message: Some("prefill not supported".to_owned()),
        ..behaviour(Behaviour::Refuses)
    };
    let handle = sim(vec![
        ("s", with(behaviour(Behaviour::Refuses), ANSWER)),
        ("custom", with(custom, ANSWER)),
    ])
    .await;
    let response = openai(&handle, "s", prefilled("Hello big")).await;
    assert_eq!(response.status(), 400, "OpenAI status");
    let body = parse(&body_text(response).await);
    assert_eq!(body["error"]["type"], "invalid_request_error", "OpenAI type: {body}");
    assert_eq!(
        body["error"]["message"], "Assistant response prefill is incompatible with enable_thinking",
        "llama.cpp's message: {body}"
    );
    let response = anthropic(&handle, "custom", prefilled("Hello big")).await;
    assert_eq!(response.status(), 400, "Anthropic status");
    let body = parse(&body_text(response).await);
    assert_eq!(
        (&body["type"], &body["error"]["type"], &body["error"]["message"]),
        (
            &json!("error"),
            &json!("invalid_request_error"),
            &json!("prefill not supported")
        ),
        "Anthropic envelope: {body}"
    );
    assert!(
        handle
            .log()
            .iter()
            .all(|r| r.continuation == Some(PrefillOutcome::Refused) && r.status == 400),
        "records: {:?}",
        handle.log()
    );
    let text = streamed_text(&handle, "anthropic", "s", chat_body(true)).await;
    assert_eq!(text, ANSWER, "a request without a prefill is answered");
    handle.shutdown();
}

#[tokio::test]
async fn a_prefill_that_is_not_a_prefix_of_the_answer_starts_over() {
    let handle = sim(vec![("s", quick(ANSWER))]).await;
    for wire in WIRES {
        let text = streamed_text(&handle, wire, "s", prefilled("Goodbye")).await;
        assert_eq!(text, ANSWER, "{wire}: whole answer");
        let record = last_record(&handle);
        assert_eq!(record.continuation, Some(PrefillOutcome::NotAPrefix), "{wire}: record");
    }
    handle.shutdown();
}

#[test]
fn the_continuation_section_reads_from_toml_and_json_and_rejects_unknown_keys() {
    let scenario: Scenario = toml::from_str(
        r#"
        text = "x"
        [continuation]
        convention = "vllm"
        behaviour = "diverges"
        diverge_after_words = 5
        refusal_message = "no"
        "#,
    )
    .unwrap_or_else(|e| panic!("toml: {e}"));
    let want = Continuation {
        convention: Convention::Vllm,
        behaviour: Behaviour::Diverges,
        diverge_after_words: 5,
        refusal_message: Some("no".to_owned()),
    };
    assert_eq!(scenario.continuation, want, "section");
    let json: Scenario = serde_json::from_value(json!({"continuation": {"behavior": "starts_over"}}))
        .unwrap_or_else(|e| panic!("json: {e}"));
    assert_eq!(
        json.continuation.behaviour,
        Behaviour::StartsOver,
        "US spelling accepted"
    );
    assert_eq!(json.continuation.diverge_after_words, 3, "default words");
    assert_eq!(json.continuation.convention, Convention::Any, "default convention");
    assert!(
        toml::from_str::<Scenario>("[continuation]\nconvension = \"any\"").is_err(),
        "typo rejected"
    );
    assert!(
        toml::from_str::<Scenario>("[continuation]\nbehaviour = \"sometimes\"").is_err(),
        "unknown behaviour rejected"
    );
    assert!(
        toml::from_str::<Scenario>("[failure]\ndrop_after_bytes = 7")
            .is_ok_and(|s| s.failure.drop_after_bytes == Some(7)),
        "byte cut key"
    );
}
