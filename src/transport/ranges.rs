//! Sampling parameters checked against the ranges the real APIs accept, refused as they refuse
//! them: a 400 naming the parameter, in the dialect's own words.
//!
//! Checked at the edge, so a value no upstream of the dialect takes is the client's 400 at once,
//! not an upstream 400 on every route (or, through an adapter that clamps, a silent change).
//! Each dialect's decoder hands its decoded request through here last.
//!
//! | dialect | parameter | range |
//! |---|---|---|
//! | OpenAI (and the native requests, which are OpenAI-shaped) | `temperature` | 0..=2 |
//! | | `top_p` | 0..=1 |
//! | | `presence_penalty`, `frequency_penalty` | -2..=2 |
//! | | `top_logprobs` (kept as the client sent it) | integer 0..=20 |
//! | Anthropic | `temperature`, `top_p` | 0..=1 |
//!
//! A value that is not finite never passes (JSON has none, but a decoded request is checked,
//! not its text).

use super::decode_error::DecodeError;
use crate::types::ChatRequest;

/// `req`, if its sampling parameters are within OpenAI's ranges; else OpenAI's 400
/// (`Invalid 'temperature': decimal above maximum value. ...`, code `decimal_above_max_value`).
pub fn openai(req: ChatRequest) -> Result<ChatRequest, DecodeError> {
    let s = &req.sampling;
    for (param, value, min, max) in [
        ("temperature", s.temperature, 0.0, 2.0),
        ("top_p", s.top_p, 0.0, 1.0),
        ("presence_penalty", s.presence_penalty, -2.0, 2.0),
        ("frequency_penalty", s.frequency_penalty, -2.0, 2.0),
    ] {
        if let Some(refused) = value.and_then(|v| openai_refusal(param, v, min, max)) {
            return Err(refused);
        }
    }
    if let Some(raw) = req.verbatim.as_deref().and_then(|v| v.field("top_logprobs")) {
        top_logprobs(raw.text())?;
    }
    Ok(req)
}

/// OpenAI's check of `top_logprobs`: an integer from 0 to 20 (`null` is no value).
fn top_logprobs(raw: &str) -> Result<(), DecodeError> {
    const PARAM: &str = "top_logprobs";
    let Ok(value) = serde_json::from_str::<serde_json::Value>(raw) else {
        return Ok(()); // the decoder parsed the body: unreachable in practice
    };
    if value.is_null() {
        return Ok(());
    }
    let Some(n) = value.as_i64() else {
        return Err(DecodeError::new(
            PARAM,
            format!("Invalid type for '{PARAM}': expected an integer, but got {value} instead."),
        )
        .with_code("invalid_type"));
    };
    if n > 20 {
        return Err(DecodeError::new(
            PARAM,
            format!("Invalid '{PARAM}': integer above maximum value. Expected a value <= 20, but got {n} instead."),
        )
        .with_code("integer_above_max_value"));
    }
    if n < 0 {
        return Err(DecodeError::new(
            PARAM,
            format!("Invalid '{PARAM}': integer below minimum value. Expected a value >= 0, but got {n} instead."),
        )
        .with_code("integer_below_min_value"));
    }
    Ok(())
}

/// `req`, if its sampling parameters are within Anthropic's ranges; else Anthropic's 400
/// (`temperature: range: 0..1`).
pub fn anthropic(req: ChatRequest) -> Result<ChatRequest, DecodeError> {
    let s = &req.sampling;
    for (param, value) in [("temperature", s.temperature), ("top_p", s.top_p)] {
        if value.is_some_and(|v| !within(v, 0.0, 1.0)) {
            return Err(DecodeError::new(param, format!("{param}: range: 0..1")));
        }
    }
    Ok(req)
}

fn within(value: f64, min: f64, max: f64) -> bool {
    value.is_finite() && (min..=max).contains(&value)
}

/// OpenAI's words for `value` outside `min..=max`; `None` within it.
fn openai_refusal(param: &str, value: f64, min: f64, max: f64) -> Option<DecodeError> {
    if within(value, min, max) {
        return None;
    }
    let refused = if !value.is_finite() {
        DecodeError::new(
            param,
            format!("Invalid '{param}': expected a finite number, but got {value} instead."),
        )
    } else if value > max {
        DecodeError::new(
            param,
            format!(
                "Invalid '{param}': decimal above maximum value. Expected a value <= {max}, but got {value} instead."
            ),
        )
        .with_code("decimal_above_max_value")
    } else {
        DecodeError::new(
            param,
            format!(
                "Invalid '{param}': decimal below minimum value. Expected a value >= {min}, but got {value} instead."
            ),
        )
        .with_code("decimal_below_min_value")
    };
    Some(refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Sampling;

    fn with(sampling: Sampling) -> ChatRequest {
        ChatRequest {
            sampling,
            ..ChatRequest::default()
        }
    }

    fn temperature(t: f64) -> ChatRequest {
        with(Sampling {
            temperature: Some(t),
            ..Sampling::default()
        })
    }

    #[test]
    fn top_logprobs_is_an_integer_from_0_to_20() {
        let with_top = |raw: &str| {
            let value = serde_json::value::RawValue::from_string(raw.to_string()).expect("JSON");
            ChatRequest {
                verbatim: Some(std::sync::Arc::new(crate::types::Verbatim {
                    wire: crate::types::Wire::OpenAi,
                    fields: vec![("top_logprobs".into(), crate::types::RawJson::new(value))],
                    headers: Vec::new(),
                })),
                ..ChatRequest::default()
            }
        };
        for ok in ["0", "20", "5", "null"] {
            assert!(openai(with_top(ok)).is_ok(), "{ok}");
        }
        let e = openai(with_top("21")).expect_err("over 20");
        assert_eq!(
            (e.param.as_deref(), e.message.as_str(), e.code),
            (
                Some("top_logprobs"),
                "Invalid 'top_logprobs': integer above maximum value. Expected a value <= 20, but got 21 instead.",
                Some("integer_above_max_value")
            )
        );
        assert_eq!(
            openai(with_top("-1")).expect_err("under 0").code,
            Some("integer_below_min_value")
        );
        assert_eq!(
            openai(with_top("2.5")).expect_err("not an integer").code,
            Some("invalid_type")
        );
    }

    #[test]
    fn openai_refuses_out_of_range_in_openais_words() {
        let e = openai(temperature(5.0)).expect_err("5 is over 2");
        assert_eq!(e.param.as_deref(), Some("temperature"), "{e:?}");
        assert_eq!(
            e.message, "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 5 instead.",
            "OpenAI's message"
        );
        assert_eq!(e.code, Some("decimal_above_max_value"), "OpenAI's code");
        let e = openai(temperature(-1.0)).expect_err("-1 is under 0");
        assert_eq!(
            e.message, "Invalid 'temperature': decimal below minimum value. Expected a value >= 0, but got -1 instead.",
            "OpenAI's message"
        );
        assert_eq!(e.code, Some("decimal_below_min_value"), "OpenAI's code");
        let e = openai(with(Sampling {
            presence_penalty: Some(-2.5),
            ..Sampling::default()
        }))
        .expect_err("-2.5 is under -2");
        assert_eq!(
            (e.param.as_deref(), e.message.as_str()),
            (
                Some("presence_penalty"),
                "Invalid 'presence_penalty': decimal below minimum value. Expected a value >= -2, but got -2.5 instead."
            ),
            "a penalty"
        );
        for (sampling, param) in [
            (
                Sampling {
                    top_p: Some(1.01),
                    ..Sampling::default()
                },
                "top_p",
            ),
            (
                Sampling {
                    frequency_penalty: Some(2.01),
                    ..Sampling::default()
                },
                "frequency_penalty",
            ),
        ] {
            let e = openai(with(sampling)).expect_err("over its maximum");
            assert_eq!(e.param.as_deref(), Some(param), "{e:?}");
        }
    }

    #[test]
    fn the_bounds_themselves_pass() {
        for t in [0.0, 1.5, 2.0] {
            assert!(openai(temperature(t)).is_ok(), "OpenAI temperature {t}");
        }
        for t in [0.0, 1.0] {
            assert!(anthropic(temperature(t)).is_ok(), "Anthropic temperature {t}");
        }
        let edges = Sampling {
            temperature: Some(2.0),
            top_p: Some(0.0),
            presence_penalty: Some(-2.0),
            frequency_penalty: Some(2.0),
            ..Sampling::default()
        };
        assert!(openai(with(edges)).is_ok(), "every OpenAI bound at once");
        assert!(openai(ChatRequest::default()).is_ok(), "nothing set");
        assert!(anthropic(ChatRequest::default()).is_ok(), "nothing set");
    }

    #[test]
    fn anthropic_refuses_out_of_range_in_anthropics_words() {
        let e = anthropic(temperature(1.5)).expect_err("1.5 is over 1");
        assert_eq!(
            (e.param.as_deref(), e.message.as_str()),
            (Some("temperature"), "temperature: range: 0..1"),
            "Anthropic's message"
        );
        let e = anthropic(with(Sampling {
            top_p: Some(-0.1),
            ..Sampling::default()
        }))
        .expect_err("under 0");
        assert_eq!(e.message, "top_p: range: 0..1", "top_p");
    }

    #[test]
    fn a_value_that_is_not_finite_never_passes() {
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let e = openai(temperature(v)).expect_err("not finite");
            assert_eq!(e.param.as_deref(), Some("temperature"), "OpenAI {v}: {e:?}");
            let e = anthropic(temperature(v)).expect_err("not finite");
            assert_eq!(e.param.as_deref(), Some("temperature"), "Anthropic {v}: {e:?}");
        }
    }
}
