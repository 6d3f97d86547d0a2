//! What OpenAI chunks carry beside the answer: `logprobs` per token (streamed and
//! aggregated), `system_fingerprint` and `service_tier` on every chunk.

use super::*;

fn logprobs_body(stream: bool, top: u8) -> Value {
    let mut body = chat_body(stream);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(top);
    body
}

#[tokio::test]
async fn every_content_chunk_carries_one_logprob_entry_per_token() {
    let handle = sim(vec![("s", quick("Naïve café works"))]).await;
    let chunks = events_json(&body_text(openai(&handle, "s", logprobs_body(true, 2)).await).await);
    let content: Vec<&Value> = chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .collect();
    assert_eq!(content.len(), 3, "three tokens");
    for chunk in &content {
        let choice = &chunk["choices"][0];
        let token = choice["delta"]["content"].as_str().unwrap_or_default();
        let logprobs = &choice["logprobs"];
        assert_eq!(logprobs["refusal"], Value::Null, "{logprobs}");
        let entries = logprobs["content"].as_array().cloned().unwrap_or_default();
        assert_eq!(entries.len(), 1, "one entry for the chunk's one token: {logprobs}");
        let entry = &entries[0];
        assert_eq!(entry["token"], token, "{entry}");
        let bytes: Vec<u8> = entry["bytes"]
            .as_array()
            .map(|b| {
                b.iter()
                    .filter_map(|x| x.as_u64())
                    .filter_map(|x| u8::try_from(x).ok())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(bytes, token.as_bytes(), "UTF-8 bytes: {entry}");
        assert!(entry["logprob"].as_f64().is_some_and(|l| l <= 0.0), "{entry}");
        let top = entry["top_logprobs"].as_array().cloned().unwrap_or_default();
        assert_eq!(top.len(), 2, "k alternatives: {entry}");
        assert!(
            top.iter().all(|a| a["token"].is_string() && a["bytes"].is_array()),
            "{entry}"
        );
    }
    let others: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"]["content"].as_str().is_none_or(str::is_empty))
        .collect();
    assert!(
        others.iter().all(|c| c["choices"][0]["logprobs"].is_null()),
        "role and finish chunks carry none: {others:?}"
    );

    let again = events_json(&body_text(openai(&handle, "s", logprobs_body(true, 2)).await).await);
    let of = |chunks: &[Value]| -> Vec<Value> { chunks.iter().map(|c| c["choices"][0]["logprobs"].clone()).collect() };
    assert_eq!(of(&again), of(&chunks), "deterministic");

    let whole = parse(&body_text(openai(&handle, "s", logprobs_body(false, 2)).await).await);
    let entries = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let streamed: Vec<Value> = content
        .iter()
        .map(|c| c["choices"][0]["logprobs"]["content"][0].clone())
        .collect();
    assert_eq!(entries, streamed, "the aggregate holds the streamed entries: {whole}");

    let plain = events_json(&body_text(openai(&handle, "s", chat_body(true)).await).await);
    assert!(
        plain.iter().all(|c| c["choices"][0]["logprobs"].is_null()),
        "none unasked"
    );
    let whole = parse(&body_text(openai(&handle, "s", chat_body(false)).await).await);
    assert_eq!(whole["choices"][0]["logprobs"], Value::Null, "{whole}");
    handle.shutdown();
}

#[tokio::test]
async fn a_refusal_carries_its_logprobs_under_refusal() {
    let refuses = Scenario {
        failure: Failure {
            refusal: true,
            ..Failure::default()
        },
        ..quick("x")
    };
    let handle = sim(vec![("s", refuses)]).await;
    let chunks = events_json(&body_text(openai(&handle, "s", logprobs_body(true, 0)).await).await);
    let refusal = chunks
        .iter()
        .find(|c| {
            c["choices"][0]["delta"]["refusal"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .map(|c| c["choices"][0]["logprobs"].clone())
        .unwrap_or_default();
    assert_eq!(refusal["content"], Value::Null, "{refusal}");
    assert_eq!(
        refusal["refusal"][0]["top_logprobs"],
        json!([]),
        "top_logprobs 0: {refusal}"
    );
    handle.shutdown();
}

#[tokio::test]
async fn every_chunk_carries_the_fingerprint_and_the_tier_asked_for() {
    let handle = sim(vec![("s", quick("one two"))]).await;
    let mut body = chat_body(true);
    body["service_tier"] = json!("auto");
    body["stream_options"] = json!({"include_usage": true});
    let chunks = events_json(&body_text(openai(&handle, "s", body.clone()).await).await);
    let fingerprint = chunks[0]["system_fingerprint"].as_str().unwrap_or_default().to_owned();
    assert!(
        fingerprint.starts_with("fp_") && fingerprint.len() == 13,
        "fp_ and ten hex digits: {fingerprint}"
    );
    for chunk in &chunks {
        assert_eq!(
            chunk["system_fingerprint"],
            fingerprint.as_str(),
            "on every chunk: {chunk}"
        );
        assert_eq!(chunk["service_tier"], "default", "auto is served by default: {chunk}");
    }
    body["service_tier"] = json!("flex");
    body["stream"] = json!(false);
    let whole = parse(&body_text(openai(&handle, "s", body).await).await);
    assert_eq!(whole["service_tier"], "flex", "echoed: {whole}");
    assert_eq!(whole["system_fingerprint"], fingerprint.as_str(), "fixed per model");
    let plain = events_json(&body_text(openai(&handle, "s", chat_body(true)).await).await);
    assert!(plain.iter().all(|c| c.get("service_tier").is_none()), "absent unasked");
    let mut other = chat_body(true);
    other["model"] = json!("another-model");
    let chunks = events_json(&body_text(openai(&handle, "s", other).await).await);
    assert_ne!(chunks[0]["system_fingerprint"], fingerprint.as_str(), "per model");
    handle.shutdown();
}
