//! Strict refusals on the wire: the real APIs' status and error bodies, whatever the
//! scenario, and the accepted forms answered.

use super::*;

#[tokio::test]
async fn openai_refusals_carry_param_and_code() {
    let handle = sim(vec![("s", quick("ok"))]).await;
    let cases = [
        (
            json!({"temperature": 5}),
            "temperature",
            "decimal_above_max_value",
            "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 5 instead.",
        ),
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
            "integer_above_max_value",
            "Invalid 'top_logprobs': integer above maximum value. Expected a value <= 20, but got 21 instead.",
        ),
        (
            json!({"model": "o3", "temperature": 0.2}),
            "temperature",
            "unsupported_value",
            "Unsupported value: 'temperature' does not support 0.2 with this model. Only the default (1) value is supported.",
        ),
        (
            json!({"model": "gpt-5", "logprobs": true}),
            "logprobs",
            "unsupported_parameter",
            "Unsupported parameter: 'logprobs' is not supported with this model.",
        ),
    ];
    for (fields, param, code, message) in cases {
        let mut body = chat_body(true);
        if let (Some(body), Value::Object(fields)) = (body.as_object_mut(), fields) {
            body.extend(fields);
        }
        let response = openai(&handle, "s", body.clone()).await;
        assert_eq!(response.status(), 400, "{body}");
        let error = parse(&body_text(response).await);
        assert_eq!(
            error,
            json!({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}),
            "{body}"
        );
    }
    assert!(handle
        .log()
        .iter()
        .all(|r| r.status == 400 && r.end == Some(SimEnd::ErrorStatus)));
    handle.shutdown();
}

#[tokio::test]
async fn anthropic_refusals_use_the_anthropic_envelope() {
    let handle = sim(vec![("s", quick("ok"))]).await;
    let body = json!({"model": "claude", "max_tokens": 64, "temperature": 1.2, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]});
    let response = anthropic(&handle, "s", body).await;
    assert_eq!(response.status(), 400, "status");
    assert!(response.headers().contains_key("request-id"), "request-id header");
    let error = parse(&body_text(response).await);
    assert_eq!(error["type"], "error", "{error}");
    assert_eq!(
        error["error"],
        json!({"type": "invalid_request_error", "message": "temperature: Input should be less than or equal to 1"}),
        "{error}"
    );
    assert!(error["request_id"].is_string(), "{error}");
    let too_small = json!({"model": "claude", "max_tokens": 64,
                           "thinking": {"type": "enabled", "budget_tokens": 512},
                           "messages": [{"role": "user", "content": "hi"}]});
    let error = parse(&body_text(anthropic(&handle, "s", too_small).await).await);
    assert_eq!(
        error["error"]["message"], "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
        "{error}"
    );
    handle.shutdown();
}

#[tokio::test]
async fn the_interleaved_beta_header_lets_max_tokens_sit_under_the_budget() {
    let handle = sim(vec![("s", quick("ok"))]).await;
    let body = json!({"model": "claude", "max_tokens": 100, "stream": true,
                      "thinking": {"type": "enabled", "budget_tokens": 4000},
                      "messages": [{"role": "user", "content": "hi"}]});
    let url = format!("{}/v1/messages", handle.anthropic_base_url("s"));
    let refused = client()
        .post(&url)
        .json(&body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(refused.status(), 400, "without the beta");
    let taken = client()
        .post(&url)
        .header("anthropic-beta", "interleaved-thinking-2025-05-14")
        .json(&body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(taken.status(), 200, "with it");
    handle.shutdown();
}

#[tokio::test]
async fn documents_are_accepted_in_their_real_forms_on_both_wires() {
    let handle = sim(vec![("s", quick("A summary."))]).await;
    let pdf = "JVBERi0xLjcKJSBzaW0=";
    let anthropic_body = json!({"model": "claude", "max_tokens": 64, "stream": true, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}, "title": "a.pdf"},
        {"type": "document", "source": {"type": "url", "url": "https://example.com/b.pdf"}},
        {"type": "text", "text": "Summarise both."}
    ]}]});
    assert_eq!(
        streamed_text(&handle, "anthropic", "s", anthropic_body).await,
        "A summary.",
        "answered"
    );
    let openai_body = json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Summarise."},
        {"type": "file", "file": {"file_data": format!("data:application/pdf;base64,{pdf}"), "filename": "a.pdf"}}
    ]}]});
    assert_eq!(streamed_text(&handle, "openai", "s", openai_body).await, "A summary.");
    let bad = json!({"model": "claude", "max_tokens": 64, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "image/png", "data": pdf}}
    ]}]});
    let response = anthropic(&handle, "s", bad).await;
    assert_eq!(response.status(), 400, "a non-PDF base64 document");
    handle.shutdown();
}
