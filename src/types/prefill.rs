//! `Prefill`: how a route is asked to continue a partial answer (the `continue` policy), and
//! the exact text it is sent.

use serde::{Deserialize, Serialize};

/// A route's continuation convention: how the final assistant message is marked so the
/// upstream continues it inside the same turn instead of starting a new answer. A property
/// of the route *and* of the request shape, so it is route config, never a guess.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PrefillConvention {
    /// The route cannot continue: the `continue` policy falls back to restart.
    #[default]
    None,
    /// Anthropic Messages: a final assistant message is continued; it may not end in
    /// whitespace, so trailing whitespace is stripped before sending.
    Anthropic,
    /// A plain final assistant message is continued (llama.cpp, TGI chat templates).
    Assistant,
    /// The final assistant message carries `"prefix": true` (DeepSeek beta, Mistral).
    Prefix,
    /// vLLM: `continue_final_message: true, add_generation_prompt: false` on the request.
    Vllm,
}

impl PrefillConvention {
    pub fn as_str(self) -> &'static str {
        match self {
            PrefillConvention::None => "none",
            PrefillConvention::Anthropic => "anthropic",
            PrefillConvention::Assistant => "assistant",
            PrefillConvention::Prefix => "prefix",
            PrefillConvention::Vllm => "vllm",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "none" => PrefillConvention::None,
            "anthropic" => PrefillConvention::Anthropic,
            "assistant" => PrefillConvention::Assistant,
            "prefix" => PrefillConvention::Prefix,
            "vllm" => PrefillConvention::Vllm,
            _ => return None,
        })
    }

    pub fn can_continue(self) -> bool {
        self != PrefillConvention::None
    }

    /// The part of `partial` this convention actually sends. Anthropic refuses a final
    /// assistant text that ends in whitespace, so it is cut there; the seam later drops the
    /// continuation's re-emission of what was cut, so it is not sent twice.
    pub fn sent_text(self, partial: &str) -> &str {
        match self {
            PrefillConvention::Anthropic => partial.trim_end(),
            _ => partial,
        }
    }

    /// What the client holds of `partial` beyond what this convention sends (whitespace it
    /// had to strip), which a continuation must not send twice.
    pub fn withheld(self, partial: &str) -> &str {
        &partial[self.sent_text(partial).len()..]
    }
}

/// The partial answer a continuation request ends with, and how to mark it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefill {
    /// Everything the client holds of the answer (the adapter sends
    /// `convention.sent_text(&text)`).
    pub text: String,
    pub convention: PrefillConvention,
}

impl Prefill {
    /// The text the upstream sees as its own partial answer.
    pub fn sent(&self) -> &str {
        self.convention.sent_text(&self.text)
    }

    /// What the client holds beyond what was sent (whitespace the convention had to strip).
    pub fn withheld(&self) -> &str {
        self.convention.withheld(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_strips_trailing_whitespace_and_remembers_it() {
        let p = Prefill {
            text: "Hello world\n\n".into(),
            convention: PrefillConvention::Anthropic,
        };
        assert_eq!(p.sent(), "Hello world", "sent without trailing whitespace");
        assert_eq!(p.withheld(), "\n\n", "the stripped whitespace is remembered");
        let v = Prefill {
            text: "Hello ".into(),
            convention: PrefillConvention::Vllm,
        };
        assert_eq!(v.sent(), "Hello ", "other conventions send the text as is");
        assert_eq!(v.withheld(), "");
    }

    #[test]
    fn conventions_round_trip_through_their_names() {
        for c in [
            PrefillConvention::None,
            PrefillConvention::Anthropic,
            PrefillConvention::Assistant,
            PrefillConvention::Prefix,
            PrefillConvention::Vllm,
        ] {
            assert_eq!(PrefillConvention::parse(c.as_str()), Some(c), "{c:?}");
        }
        assert_eq!(PrefillConvention::parse("maybe"), None);
    }
}
