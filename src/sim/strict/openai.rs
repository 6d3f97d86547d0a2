//! OpenAI Chat Completions request rules: the sampling ranges, `top_logprobs`, and what
//! OpenAI's reasoning models refuse, with OpenAI's messages, `param` and `code`.
//!
//! Sources: the range wording and codes as OpenAI returns them (`Invalid 'temperature':
//! decimal above maximum value. Expected a value <= 2, but got 2.1 instead.`, code
//! `decimal_above_max_value`; the integer form for `n`/`top_logprobs`, code
//! `integer_above_max_value`), the reasoning-model errors of providers.md §1.2, and
//! "Unsupported parameter: 'logprobs' is not supported with this model." as reported against
//! gpt-5 models. `top_logprobs` without `logprobs` is *[unverified]*: OpenAI documents the
//! requirement ("`logprobs` must be set to true if this parameter is used"), the wording of
//! its refusal is modelled on its `parallel_tool_calls` one.

use serde_json::Value;

use super::super::plan::StatusError;
use super::super::reasoning::is_openai_reasoning;
use super::written;

/// The sampling fields and their ranges.
const RANGES: &[(&str, f64, f64)] = &[
    ("temperature", 0.0, 2.0),
    ("top_p", 0.0, 1.0),
    ("frequency_penalty", -2.0, 2.0),
    ("presence_penalty", -2.0, 2.0),
];

const TOP_LOGPROBS_MAX: u64 = 20;

pub(super) fn refusal(body: &Value) -> Option<StatusError> {
    ranges(body)
        .or_else(|| top_logprobs(body))
        .or_else(|| reasoning_model(body))
}

fn ranges(body: &Value) -> Option<StatusError> {
    for &(field, min, max) in RANGES {
        let Some(value) = body.get(field).filter(|v| !v.is_null()) else {
            continue;
        };
        let Some(n) = value.as_f64() else {
            let message = format!(
                "Invalid type for '{field}': expected a decimal, but got {} instead.",
                kind(value)
            );
            return Some(StatusError::invalid(message).at(field, "invalid_type"));
        };
        let bound = |b: f64| written(&serde_json::json!(b)).trim_end_matches(".0").to_owned();
        if n > max {
            let message = format!(
                "Invalid '{field}': decimal above maximum value. Expected a value <= {}, but got {} instead.",
                bound(max),
                written(value)
            );
            return Some(StatusError::invalid(message).at(field, "decimal_above_max_value"));
        }
        if n < min {
            let message = format!(
                "Invalid '{field}': decimal below minimum value. Expected a value >= {}, but got {} instead.",
                bound(min),
                written(value)
            );
            return Some(StatusError::invalid(message).at(field, "decimal_below_min_value"));
        }
    }
    None
}

fn top_logprobs(body: &Value) -> Option<StatusError> {
    let value = body.get("top_logprobs").filter(|v| !v.is_null())?;
    let field = "top_logprobs";
    match value.as_i64() {
        Some(n) if n > TOP_LOGPROBS_MAX as i64 => {
            let message = format!(
                "Invalid '{field}': integer above maximum value. Expected a value <= {TOP_LOGPROBS_MAX}, but got {n} instead."
            );
            return Some(StatusError::invalid(message).at(field, "integer_above_max_value"));
        }
        Some(n) if n < 0 => {
            let message =
                format!("Invalid '{field}': integer below minimum value. Expected a value >= 0, but got {n} instead.");
            return Some(StatusError::invalid(message).at(field, "integer_below_min_value"));
        }
        Some(_) => {}
        None => {
            let message = format!(
                "Invalid type for '{field}': expected an integer, but got {} instead.",
                kind(value)
            );
            return Some(StatusError::invalid(message).at(field, "invalid_type"));
        }
    }
    if body.get("logprobs").and_then(Value::as_bool) != Some(true) {
        // [unverified] wording, after OpenAI's `parallel_tool_calls` refusal.
        let message = "Invalid value for 'top_logprobs': 'top_logprobs' is only allowed when 'logprobs' is true.";
        return Some(StatusError::invalid(message).at(field, "invalid_value"));
    }
    None
}

/// What a reasoning model refuses: `max_tokens`, then the sampling fields.
fn reasoning_model(body: &Value) -> Option<StatusError> {
    let model = body.get("model").and_then(Value::as_str)?;
    if !is_openai_reasoning(model) {
        return None;
    }
    let set = |field: &str| body.get(field).filter(|v| !v.is_null());
    if set("max_tokens").is_some() {
        let message = "Unsupported parameter: 'max_tokens' is not supported with this model. Use \
                       'max_completion_tokens' instead.";
        return Some(StatusError::invalid(message).at("max_tokens", "unsupported_parameter"));
    }
    let unsupported = |field: &str| {
        let message = format!("Unsupported parameter: '{field}' is not supported with this model.");
        Some(StatusError::invalid(message).at(field, "unsupported_parameter"))
    };
    let takes_sampling = takes_sampling(model, body);
    let logprobs_on = body.get("logprobs").and_then(Value::as_bool) == Some(true);
    if first_generation(model) {
        for field in [
            "temperature",
            "top_p",
            "frequency_penalty",
            "presence_penalty",
            "logit_bias",
        ] {
            if set(field).is_some() {
                return unsupported(field);
            }
        }
    } else if !takes_sampling {
        for field in ["temperature", "top_p"] {
            if let Some(value) = set(field).filter(|v| v.as_f64() != Some(1.0)) {
                let message = format!(
                    "Unsupported value: '{field}' does not support {} with this model. Only the default (1) value is supported.",
                    written(value)
                );
                return Some(StatusError::invalid(message).at(field, "unsupported_value"));
            }
        }
    }
    for field in ["frequency_penalty", "presence_penalty", "logit_bias"] {
        if set(field).is_some() && !takes_sampling {
            return unsupported(field);
        }
    }
    if logprobs_on && !takes_sampling {
        return unsupported("logprobs");
    }
    if set("top_logprobs").is_some() && !takes_sampling {
        return unsupported("top_logprobs");
    }
    None
}

/// `o1` and `o3-mini`, which refuse a sampling field whatever its value.
fn first_generation(model: &str) -> bool {
    let id = model.rsplit('/').next().unwrap_or(model).to_ascii_lowercase();
    id == "o1" || id.starts_with("o1-") || id.starts_with("o1.") || id.starts_with("o3-mini")
}

/// gpt-5.1 and later take the sampling fields and `logprobs` when they do not reason
/// (`reasoning_effort: "none"`), per OpenAI's guide as the Vercel SDK cites it.
fn takes_sampling(model: &str, body: &Value) -> bool {
    let id = model.rsplit('/').next().unwrap_or(model).to_ascii_lowercase();
    let minor = id
        .strip_prefix("gpt-5.")
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<u32>().ok());
    minor.is_some_and(|m| m >= 1) && body.get("reasoning_effort").and_then(Value::as_str) == Some("none")
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::String(_) => "a string",
        Value::Bool(_) => "a boolean",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
        Value::Number(_) => "a number",
        Value::Null => "null",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[track_caller]
    fn refused(body: Value) -> (String, Option<String>, Option<&'static str>) {
        let error = refusal(&body).unwrap_or_else(|| panic!("refused: {body}"));
        assert_eq!(error.status, 400, "{error:?}");
        (error.message.unwrap_or_default(), error.param, error.code)
    }

    #[test]
    fn sampling_ranges_are_refused_in_openais_words() {
        let (message, param, code) = refused(json!({"model": "gpt-4o", "temperature": 5}));
        assert_eq!(
            message,
            "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 5 instead."
        );
        assert_eq!(
            (param.as_deref(), code),
            (Some("temperature"), Some("decimal_above_max_value"))
        );
        let (message, _, code) = refused(json!({"model": "gpt-4o", "top_p": -0.5}));
        assert_eq!(
            message,
            "Invalid 'top_p': decimal below minimum value. Expected a value >= 0, but got -0.5 instead."
        );
        assert_eq!(code, Some("decimal_below_min_value"));
        let (message, param, _) = refused(json!({"model": "gpt-4o", "presence_penalty": 2.5}));
        assert!(message.contains("Expected a value <= 2, but got 2.5"), "{message}");
        assert_eq!(param.as_deref(), Some("presence_penalty"));
        let (message, _, _) = refused(json!({"model": "gpt-4o", "frequency_penalty": -3}));
        assert!(message.contains("Expected a value >= -2, but got -3"), "{message}");
        let (_, _, code) = refused(json!({"model": "gpt-4o", "temperature": "hot"}));
        assert_eq!(code, Some("invalid_type"));
        for body in [
            json!({"model": "gpt-4o", "temperature": 2, "top_p": 0, "frequency_penalty": -2, "presence_penalty": 2}),
            json!({"model": "gpt-4o", "temperature": null}),
        ] {
            assert!(refusal(&body).is_none(), "at the bounds: {body}");
        }
    }

    #[test]
    fn top_logprobs_needs_logprobs_and_stays_within_twenty() {
        let (message, param, code) = refused(json!({"model": "gpt-4o", "top_logprobs": 3}));
        assert!(message.contains("only allowed when 'logprobs' is true"), "{message}");
        assert_eq!((param.as_deref(), code), (Some("top_logprobs"), Some("invalid_value")));
        refused(json!({"model": "gpt-4o", "logprobs": false, "top_logprobs": 3}));
        let (message, _, code) = refused(json!({"model": "gpt-4o", "logprobs": true, "top_logprobs": 21}));
        assert_eq!(
            message,
            "Invalid 'top_logprobs': integer above maximum value. Expected a value <= 20, but got 21 instead."
        );
        assert_eq!(code, Some("integer_above_max_value"));
        for body in [
            json!({"model": "gpt-4o", "logprobs": true, "top_logprobs": 20}),
            json!({"model": "gpt-4o", "logprobs": true, "top_logprobs": 0}),
            json!({"model": "gpt-4o", "logprobs": true}),
        ] {
            assert!(refusal(&body).is_none(), "{body}");
        }
    }

    #[test]
    fn a_reasoning_model_refuses_max_tokens_and_takes_max_completion_tokens() {
        let (message, param, code) = refused(json!({"model": "o4-mini", "max_tokens": 200}));
        assert!(message.contains("Use 'max_completion_tokens' instead"), "{message}");
        assert_eq!(
            (param.as_deref(), code),
            (Some("max_tokens"), Some("unsupported_parameter"))
        );
        for body in [
            json!({"model": "o4-mini", "max_completion_tokens": 200}),
            json!({"model": "gpt-4o-mini", "max_tokens": 200}),
            json!({"model": "gpt-5", "max_tokens": null}),
        ] {
            assert!(refusal(&body).is_none(), "{body}");
        }
    }

    #[test]
    fn reasoning_models_refuse_sampling_as_each_generation_does() {
        let (message, _, code) = refused(json!({"model": "o1", "temperature": 1}));
        assert_eq!(
            message,
            "Unsupported parameter: 'temperature' is not supported with this model."
        );
        assert_eq!(code, Some("unsupported_parameter"));
        let (message, _, code) = refused(json!({"model": "o3-mini", "top_p": 0.5}));
        assert_eq!(
            message,
            "Unsupported parameter: 'top_p' is not supported with this model."
        );
        assert_eq!(code, Some("unsupported_parameter"));
        let (message, param, code) = refused(json!({"model": "gpt-5", "temperature": 0.2}));
        assert_eq!(
            message,
            "Unsupported value: 'temperature' does not support 0.2 with this model. Only the default (1) value is supported."
        );
        assert_eq!(
            (param.as_deref(), code),
            (Some("temperature"), Some("unsupported_value"))
        );
        let (message, _, _) = refused(json!({"model": "o4-mini", "presence_penalty": 0.1}));
        assert_eq!(
            message,
            "Unsupported parameter: 'presence_penalty' is not supported with this model."
        );
        let (message, _, _) = refused(json!({"model": "o3", "logit_bias": {"50256": -100}}));
        assert_eq!(
            message,
            "Unsupported parameter: 'logit_bias' is not supported with this model."
        );
        let (message, param, _) = refused(json!({"model": "gpt-5-mini", "logprobs": true}));
        assert_eq!(
            message,
            "Unsupported parameter: 'logprobs' is not supported with this model."
        );
        assert_eq!(param.as_deref(), Some("logprobs"));
        for body in [
            json!({"model": "gpt-5", "temperature": 1}),
            json!({"model": "o4-mini", "logprobs": false}),
            json!({"model": "gpt-5.1", "reasoning_effort": "none", "temperature": 0.2, "logprobs": true}),
            json!({"model": "gpt-4o", "temperature": 0.2, "logit_bias": {"1": 2}, "logprobs": true}),
        ] {
            assert!(refusal(&body).is_none(), "accepted: {body}");
        }
        refused(json!({"model": "gpt-5.1", "reasoning_effort": "low", "temperature": 0.2}));
        refused(json!({"model": "gpt-5", "reasoning_effort": "none", "temperature": 0.2}));
    }
}
