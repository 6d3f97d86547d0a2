//! The answers that are one JSON body rather than a stream: the non-streaming
//! `chat.completion` (§1) and Messages bodies (§3), folded from a script's `Aggregate`, and
//! each wire's error envelope for a status (§6.1, §6.3).

use serde_json::{json, Value};

use super::aggregate::Aggregate;
use super::answer::split_words;
use super::logprobs::{self, ChoiceLogprobs, TokenLogprob};
use super::plan::Stop;
use super::{anthropic, openai};

/// The non-streaming `chat.completion` body.
pub(crate) fn openai_completion(encoder: &openai::Encoder, agg: &Aggregate) -> Value {
    let (ident, extras) = encoder.parts();
    let tool_calls: Vec<Value> = agg
        .tool_calls
        .iter()
        .map(|c| {
            json!({"id": c.id, "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect();
    let mut message = json!({
        "role": "assistant",
        "content": if agg.tool_calls.is_empty() && agg.refusal.is_none() {
            json!(agg.text)
        } else {
            json!(null)
        },
        "refusal": agg.refusal,
        "annotations": [],
    });
    if !tool_calls.is_empty() {
        message["tool_calls"] = json!(tool_calls);
    }
    if !agg.thinking.is_empty() {
        message[extras.reasoning_field] = json!(agg.thinking);
    }
    let logprobs = extras.logprobs.map(|top| {
        let entries = |tokens: &[String]| -> Vec<TokenLogprob> {
            (0u32..)
                .zip(tokens)
                .map(|(position, t)| logprobs::entry(t, position, top))
                .collect()
        };
        match &agg.refusal {
            Some(refusal) => ChoiceLogprobs::refusal(entries(&split_words(refusal))),
            None => ChoiceLogprobs::content(entries(&agg.text_tokens)),
        }
    });
    let mut body = json!({
        "id": ident.id,
        "object": "chat.completion",
        "created": ident.created,
        "model": ident.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": openai::finish_reason(agg.stop.unwrap_or(Stop::EndTurn)),
        }],
        "usage": openai::UsageBody::new(ident.input_tokens, agg.output_tokens, extras),
        "system_fingerprint": ident.system_fingerprint,
    });
    if let Some(tier) = &ident.service_tier {
        body["service_tier"] = json!(tier);
    }
    body
}

/// The error envelope for an HTTP status (§6.1); `param` and `code` replace the status's
/// defaults when given.
pub(crate) fn openai_error(
    status: u16,
    message: Option<&str>,
    param: Option<&str>,
    code: Option<&'static str>,
) -> Value {
    let (kind, default_code, default_message) = match status {
        401 => (
            "invalid_request_error",
            Some("invalid_api_key"),
            "Incorrect API key provided.",
        ),
        403 => (
            "invalid_request_error",
            Some("unsupported_country_region_territory"),
            "Country, region, or territory not supported.",
        ),
        404 => (
            "invalid_request_error",
            Some("model_not_found"),
            "The model does not exist or you do not have access to it.",
        ),
        429 => (
            "requests",
            Some("rate_limit_exceeded"),
            "Rate limit reached for requests. Please try again later.",
        ),
        503 => (
            "server_error",
            Some("server_is_overloaded"),
            "The engine is currently overloaded, please try again later",
        ),
        500..=599 => (
            "server_error",
            None,
            "The server had an error while processing your request. Sorry about that!",
        ),
        _ => ("invalid_request_error", None, "Invalid request."),
    };
    json!({"error": {
        "message": message.unwrap_or(default_message),
        "type": kind, "param": param, "code": code.or(default_code)
    }})
}

/// The non-streaming message body.
pub(crate) fn anthropic_message(ident: &anthropic::Identity, agg: &Aggregate) -> Value {
    let stop = agg.stop.unwrap_or(Stop::EndTurn);
    let mut content = Vec::new();
    if let Some(signature) = &agg.signature {
        content.push(json!({"type": "thinking", "thinking": agg.thinking, "signature": signature}));
    }
    for data in &agg.redacted {
        content.push(json!({"type": "redacted_thinking", "data": data}));
    }
    if !agg.text.is_empty() {
        content.push(json!({"type": "text", "text": agg.text}));
    }
    for call in &agg.tool_calls {
        // A call cut off by max_tokens has no valid input; the API leaves it out.
        let Ok(input) = serde_json::from_str::<Value>(&call.arguments) else {
            continue;
        };
        content.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
    }
    json!({
        "id": ident.id,
        "type": "message",
        "role": "assistant",
        "model": ident.model,
        "content": content,
        "stop_reason": anthropic::stop_reason(stop),
        "stop_sequence": null,
        "usage": {
            "input_tokens": ident.input_tokens,
            "cache_creation_input_tokens": ident.cache.creation,
            "cache_read_input_tokens": ident.cache.read,
            "output_tokens": agg.output_tokens.saturating_add(ident.hidden_tokens),
        },
    })
}

/// The error envelope for an HTTP status (§6.3).
pub(crate) fn anthropic_error(status: u16, message: Option<&str>, request_id: &str) -> Value {
    let (kind, default_message) = match status {
        401 => ("authentication_error", "invalid x-api-key"),
        402 => ("billing_error", "Your credit balance is too low."),
        403 => ("permission_error", "Your API key does not have permission."),
        404 => ("not_found_error", "Not found"),
        413 => (
            "request_too_large",
            "Request exceeds the maximum allowed number of bytes.",
        ),
        429 => (
            "rate_limit_error",
            "This request would exceed the rate limit for your organization.",
        ),
        504 => ("timeout_error", "Request timed out"),
        529 => ("overloaded_error", "Overloaded"),
        500..=599 => ("api_error", "Internal server error"),
        _ => ("invalid_request_error", "Invalid request"),
    };
    json!({
        "type": "error",
        "error": {"type": kind, "message": message.unwrap_or(default_message)},
        "request_id": request_id,
    })
}
