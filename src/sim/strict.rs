//! The request rules real APIs enforce that the simulated upstream enforces too, each with
//! the real API's status and message: a request a real provider refuses is refused here, so
//! tests against the simulator see what a real route would answer.
//!
//! Written from the providers' published behaviour (OpenAI's reasoning-model guide and its
//! error for the field), independently of what the provider adapters send, so a test catches
//! an adapter that gets it wrong. The rules:
//! - OpenAI wire, a reasoning model (`o1`, `o3`, `o4`, `gpt-5` families): `max_tokens` is
//!   refused; they take `max_completion_tokens`.

use serde_json::Value;

use super::plan::{StatusError, Wire};

/// The real API's refusal of `body` on `wire`, when it breaks one of the rules above.
pub(crate) fn refusal(wire: Wire, body: &Value) -> Option<StatusError> {
    match wire {
        Wire::OpenAi => openai(body),
        Wire::Anthropic => None,
    }
}

fn openai(body: &Value) -> Option<StatusError> {
    let model = body.get("model").and_then(Value::as_str)?;
    if is_reasoning_model(model) && body.get("max_tokens").is_some_and(|v| !v.is_null()) {
        return Some(StatusError {
            status: 400,
            message: Some(
                "Unsupported parameter: 'max_tokens' is not supported with this model. Use \
                 'max_completion_tokens' instead."
                    .to_owned(),
            ),
            retry_after_s: None,
            retry_after_ms: None,
        });
    }
    None
}

/// OpenAI's reasoning models, by id: `o1…`, `o3…`, `o4…`, `gpt-5…`.
fn is_reasoning_model(model: &str) -> bool {
    let model = model.to_ascii_lowercase();
    ["o1", "o3", "o4", "gpt-5"].iter().any(|family| {
        model
            .strip_prefix(family)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', '.']))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_reasoning_model_refuses_max_tokens_and_takes_max_completion_tokens() {
        let refused = refusal(Wire::OpenAi, &json!({"model": "o4-mini", "max_tokens": 200}));
        let error = refused.expect("refused as OpenAI refuses it");
        assert_eq!(error.status, 400);
        assert!(
            error
                .message
                .as_deref()
                .is_some_and(|m| m.contains("Use 'max_completion_tokens' instead")),
            "{error:?}"
        );
        for body in [
            json!({"model": "o4-mini", "max_completion_tokens": 200}),
            json!({"model": "gpt-4o-mini", "max_tokens": 200}),
            json!({"model": "gpt-5", "max_tokens": null}),
        ] {
            assert!(refusal(Wire::OpenAi, &body).is_none(), "{body}");
        }
        assert!(refusal(Wire::Anthropic, &json!({"model": "o3", "max_tokens": 5})).is_none());
    }
}
