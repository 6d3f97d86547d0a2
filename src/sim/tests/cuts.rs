//! Cuts over loopback: a drop at every byte of a hostile text, the exact continuation after
//! each cut, and a malformed event in the middle of an answer, on both wires.

use super::*;
use crate::sim::answer::split_words;
use crate::sim::profiles::HOSTILE_TEXT;

fn cut_at(bytes: usize) -> Scenario {
    Scenario {
        failure: Failure {
            drop_after_bytes: Some(bytes),
            ..Failure::default()
        },
        ..instant(HOSTILE_TEXT)
    }
}

fn floor_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

#[tokio::test]
async fn the_hostile_text_profile_streams_back_exactly_on_both_wires() {
    for needle in ["very very", "$1,000,000", ".\n\n", "Naïve café — 日本語 🎉"] {
        assert!(HOSTILE_TEXT.contains(needle), "the profile has {needle:?}");
    }
    let fast = Scenario {
        text: profile("hostile-text").and_then(|s| s.text),
        ..instant("")
    };
    let handle = sim(vec![("s", fast)]).await;
    for wire in WIRES {
        let text = streamed_text(&handle, wire, "s", chat_body(true)).await;
        assert_eq!(text, HOSTILE_TEXT, "{wire}: round trip");
    }
    handle.shutdown();
}

#[tokio::test]
async fn drop_after_bytes_cuts_at_every_byte_and_the_continuation_completes_the_text() {
    let handle = sim(vec![("whole", instant(HOSTILE_TEXT))]).await;
    let words = split_words(HOSTILE_TEXT);
    for bytes in 0..=HOSTILE_TEXT.len() {
        handle.register("cut", cut_at(bytes));
        let floor = floor_boundary(HOSTILE_TEXT, bytes);
        let partial = &HOSTILE_TEXT[..floor];
        for wire in WIRES {
            let at = format!("{wire}, cut at byte {bytes}");
            let (raw, broken) = read_body(send(&handle, wire, "cut", chat_body(true)).await).await;
            assert!(broken, "{at}: the connection is aborted: {raw}");
            let deltas = text_deltas(wire, &raw);
            assert_eq!(deltas.concat(), partial, "{at}: exactly the text before the cut");
            if let Some((last, whole)) = deltas.split_last() {
                assert_eq!(whole, &words[..whole.len()], "{at}: whole words before the cut token");
                let cut_word = &words[whole.len()];
                assert!(cut_word.starts_with(last.as_str()), "{at}: {last:?} heads {cut_word:?}");
            }
            let record = handle
                .log()
                .last()
                .cloned()
                .unwrap_or_else(|| panic!("{at}: no record"));
            assert_eq!(record.end, Some(SimEnd::Dropped), "{at}: recorded as dropped");

            // What a gateway then sends: the partial answer (Anthropic without its trailing
            // whitespace), and what it must get back.
            let sent = if wire == "anthropic" {
                partial.trim_end()
            } else {
                partial
            };
            if sent.is_empty() {
                continue;
            }
            let body = stream_body(json!([
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": sent}
            ]));
            let rest = streamed_text(&handle, wire, "whole", body).await;
            assert_eq!(format!("{sent}{rest}"), HOSTILE_TEXT, "{at}: partial + continuation");
        }
    }
    handle.shutdown();
}

#[tokio::test]
async fn drop_after_bytes_breaks_a_non_streaming_body_too() {
    let handle = sim(vec![("cut", cut_at(10))]).await;
    for wire in WIRES {
        let url = match wire {
            "openai" => format!("{}/chat/completions", handle.openai_base_url("cut")),
            _ => format!("{}/v1/messages", handle.anthropic_base_url("cut")),
        };
        let mut body = chat_body(true);
        body["stream"] = json!(false);
        // The body fails before its first byte, so the headers may never leave either.
        let broken = match client().post(url).json(&body).send().await {
            Ok(response) => read_body(response).await.1,
            Err(_) => true,
        };
        assert!(broken, "{wire}: the connection is aborted");
        let record = handle.log().last().cloned().unwrap_or_else(|| panic!("no record"));
        assert_eq!(record.end, Some(SimEnd::Dropped), "{wire}: recorded");
    }
    handle.shutdown();
}

#[tokio::test]
async fn a_malformed_event_mid_answer_ends_the_stream_on_both_wires() {
    let scenario = Scenario {
        failure: Failure {
            malformed_after_tokens: Some(2),
            ..Failure::default()
        },
        ..quick("one two three four five")
    };
    let handle = sim(vec![("s", scenario)]).await;
    for wire in WIRES {
        let (raw, broken) = read_body(send(&handle, wire, "s", chat_body(true)).await).await;
        assert!(!broken, "{wire}: the body ends cleanly after the bad event");
        assert_eq!(
            text_deltas(wire, &raw).concat(),
            "one two",
            "{wire}: two tokens before it"
        );
        let events = events(&raw);
        let (last, before) = events.split_last().unwrap_or_else(|| panic!("{wire}: no events"));
        assert!(
            serde_json::from_str::<Value>(&last.1).is_err(),
            "{wire}: the last event is not JSON: {last:?}"
        );
        assert!(
            before
                .iter()
                .all(|(_, data)| serde_json::from_str::<Value>(data).is_ok()),
            "{wire}: every event before it is JSON: {raw}"
        );
        assert!(
            !raw.contains("[DONE]") && !raw.contains("message_stop"),
            "{wire}: no terminal event: {raw}"
        );
        let record = handle.log().last().cloned().unwrap_or_else(|| panic!("no record"));
        assert_eq!(
            (record.end, record.tokens_sent),
            (Some(SimEnd::Truncated), 2),
            "{wire}: record"
        );
    }
    handle.shutdown();
}
