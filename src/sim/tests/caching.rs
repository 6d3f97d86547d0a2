//! Anthropic prompt caching on the wire: the usage of a request with `cache_control`,
//! written the first time and read after, streamed and not.

use super::*;

fn cached_body(stream: bool, question: &str) -> Value {
    json!({"model": "claude", "max_tokens": 64, "stream": stream,
           "system": [{"type": "text", "text": "You answer from a long and careful manual of many words",
                       "cache_control": {"type": "ephemeral"}}],
           "messages": [{"role": "user", "content": question}]})
}

#[tokio::test]
async fn a_cached_prefix_is_written_then_read_and_input_counts_the_rest() {
    let handle = sim(vec![("s", quick("Yes.")), ("t", quick("Yes."))]).await;
    let first = anthropic_events(&body_text(anthropic(&handle, "s", cached_body(true, "is it done")).await).await);
    let usage = &first[0].1["message"]["usage"];
    assert_eq!(
        usage["cache_creation_input_tokens"], 11,
        "the system prompt is written: {usage}"
    );
    assert_eq!(usage["cache_read_input_tokens"], 0, "{usage}");
    assert_eq!(usage["input_tokens"], 3, "only the question: {usage}");

    let second = parse(&body_text(anthropic(&handle, "s", cached_body(false, "and is it good")).await).await);
    let usage = &second["usage"];
    assert_eq!(usage["cache_read_input_tokens"], 11, "then read: {usage}");
    assert_eq!(usage["cache_creation_input_tokens"], 0, "{usage}");
    assert_eq!(usage["input_tokens"], 4, "{usage}");

    let elsewhere = parse(&body_text(anthropic(&handle, "t", cached_body(false, "is it done")).await).await);
    assert_eq!(
        elsewhere["usage"]["cache_creation_input_tokens"], 11,
        "another upstream has its own cache: {elsewhere}"
    );
    let plain = parse(&body_text(anthropic(&handle, "s", chat_body(false)).await).await);
    assert_eq!(
        (
            &plain["usage"]["cache_creation_input_tokens"],
            &plain["usage"]["cache_read_input_tokens"]
        ),
        (&json!(0), &json!(0)),
        "no cache_control: both 0: {plain}"
    );
    handle.shutdown();
}
