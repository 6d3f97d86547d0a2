//! The built-in named scenarios (`profile("spiky")`), documented in the table of `sim`.

use super::scenario::{Brownout, ColdStart, Failure, Scenario, ToolCallSpec, Ttft};

const NAMES: &[&str] = &[
    "fast-stable",
    "spiky",
    "cold-start",
    "always-429",
    "drop-mid-stream",
    "tool-call",
    "correlated-brownout",
    "slow",
    "hostile-text",
];

/// The `hostile-text` answer: where a seam between a partial answer and its continuation
/// breaks (repeated words, digit groups, a blank line, multi-byte characters).
pub(crate) const HOSTILE_TEXT: &str =
    "The very very old fee was $1,000,000 per year.\n\nNaïve café — 日本語 🎉 and then para two.";

/// Names of every built-in profile, in documentation order.
pub fn profile_names() -> &'static [&'static str] {
    NAMES
}

/// The built-in scenario of that name, if there is one.
pub fn profile(name: &str) -> Option<Scenario> {
    let scenario = match name {
        "fast-stable" => fast_stable(),
        "spiky" => spiky(),
        "cold-start" => Scenario {
            cold_start: Some(ColdStart {
                requests: 3,
                extra_ms: 4000.0,
            }),
            ..fast_stable()
        },
        "always-429" => Scenario {
            failure: Failure {
                status: Some(429),
                retry_after_s: Some(2),
                ..Failure::default()
            },
            ..fast_stable()
        },
        "drop-mid-stream" => Scenario {
            failure: Failure {
                drop_after_tokens: Some(5),
                ..Failure::default()
            },
            ..fast_stable()
        },
        "tool-call" => Scenario {
            tool_calls: vec![ToolCallSpec {
                name: "get_weather".to_owned(),
                arguments: r#"{"city": "Paris", "unit": "celsius"}"#.to_owned(),
            }],
            tool_fragments: 12,
            ..fast_stable()
        },
        "correlated-brownout" => Scenario {
            brownout: Some(Brownout {
                period_ms: 10_000,
                duty: 0.5,
                extra_ms: 2500.0,
            }),
            ..spiky()
        },
        "slow" => Scenario {
            ttft: Ttft {
                median_ms: 3000.0,
                sigma: 0.1,
                ..Ttft::default()
            },
            inter_token_ms: 30.0,
            tokens: 40,
            seed: 8,
            ..Scenario::default()
        },
        "hostile-text" => Scenario {
            text: Some(HOSTILE_TEXT.to_owned()),
            seed: 3,
            ..fast_stable()
        },
        _ => return None,
    };
    Some(scenario)
}

fn fast_stable() -> Scenario {
    Scenario {
        ttft: Ttft {
            median_ms: 80.0,
            sigma: 0.2,
            ..Ttft::default()
        },
        inter_token_ms: 10.0,
        tokens: 40,
        seed: 1,
        ..Scenario::default()
    }
}

fn spiky() -> Scenario {
    Scenario {
        ttft: Ttft {
            median_ms: 550.0,
            sigma: 0.65,
            stall_prob: 0.02,
            stall_min_ms: 3000.0,
            stall_max_ms: 12_000.0,
        },
        inter_token_ms: 25.0,
        tokens: 60,
        seed: 2,
        ..Scenario::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_profile_exists_and_unknown_names_do_not() {
        for name in profile_names() {
            assert!(profile(name).is_some(), "profile {name} is listed but missing");
        }
        assert!(profile("no-such-profile").is_none(), "unknown profile resolved");
    }

    #[test]
    fn tool_call_profile_arguments_are_valid_json() {
        let scenario = profile("tool-call").unwrap_or_default();
        let args = &scenario.tool_calls[0].arguments;
        assert!(
            serde_json::from_str::<serde_json::Value>(args).is_ok(),
            "arguments {args} must be JSON"
        );
    }
}
