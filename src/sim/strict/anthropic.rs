//! Anthropic Messages request rules outside thinking and documents: the sampling ranges and
//! the limit of four `cache_control` breakpoints, with Anthropic's messages.
//!
//! Sources: the schema wording Anthropic's API returns for a value out of range
//! ("temperature: Input should be less than or equal to 1", "top_p: Input should be greater
//! than or equal to 0"), and the breakpoint limit's full body (tghamm/Anthropic.SDK#50,
//! providers.md §2.3).

use serde_json::Value;

use super::super::cache;
use super::super::plan::StatusError;

const MAX_BREAKPOINTS: usize = 4;

pub(super) fn refusal(body: &Value) -> Option<StatusError> {
    for field in ["temperature", "top_p"] {
        let Some(n) = body.get(field).and_then(Value::as_f64) else {
            continue;
        };
        if n > 1.0 {
            return Some(StatusError::invalid(format!(
                "{field}: Input should be less than or equal to 1"
            )));
        }
        if n < 0.0 {
            return Some(StatusError::invalid(format!(
                "{field}: Input should be greater than or equal to 0"
            )));
        }
    }
    let found = cache::markers(body);
    if found > MAX_BREAKPOINTS {
        return Some(StatusError::invalid(format!(
            "A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {found}."
        )));
    }
    None
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn message(body: Value) -> Option<String> {
        refusal(&body).and_then(|e| e.message)
    }

    #[test]
    fn sampling_outside_zero_to_one_is_refused_in_anthropics_words() {
        assert_eq!(
            message(json!({"temperature": 1.5})).as_deref(),
            Some("temperature: Input should be less than or equal to 1")
        );
        assert_eq!(
            message(json!({"temperature": -0.1})).as_deref(),
            Some("temperature: Input should be greater than or equal to 0")
        );
        assert_eq!(
            message(json!({"top_p": 2})).as_deref(),
            Some("top_p: Input should be less than or equal to 1")
        );
        assert_eq!(message(json!({"temperature": 1, "top_p": 0})), None, "the bounds pass");
    }

    #[test]
    fn a_fifth_cache_breakpoint_is_refused() {
        let block = json!({"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}});
        let four = json!({"messages": [{"role": "user", "content": [block, block, block, block]}]});
        assert_eq!(message(four.clone()), None, "four are allowed");
        let mut five = four;
        five["cache_control"] = json!({"type": "ephemeral"});
        assert_eq!(
            message(five).as_deref(),
            Some("A maximum of 4 blocks with cache_control may be provided. Found 5."),
            "automatic caching takes a slot"
        );
    }
}
