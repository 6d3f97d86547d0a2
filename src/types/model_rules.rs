//! What a route's upstream model takes and refuses: the field that carries the token limit,
//! the request fields it does not accept (dropped, and said so), and the ones whose answer
//! it cannot give (the route is not eligible). Defaults by model family; a route's config
//! can override them.

use super::verbatim::Wire;

/// Which field carries the answer's token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenParameter {
    /// `max_tokens`: every OpenAI-compatible server, OpenAI's non-reasoning models, and the
    /// Anthropic Messages API.
    MaxTokens,
    /// `max_completion_tokens`: OpenAI's reasoning models (the o-series, gpt-5), which
    /// answer `max_tokens` with a 400 ("Unsupported parameter: 'max_tokens' is not supported
    /// with this model. Use 'max_completion_tokens' instead."). The limit counts their
    /// reasoning tokens too, as OpenAI documents.
    MaxCompletionTokens,
}

impl TokenParameter {
    pub fn field(self) -> &'static str {
        match self {
            TokenParameter::MaxTokens => "max_tokens",
            TokenParameter::MaxCompletionTokens => "max_completion_tokens",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "max_tokens" => Some(TokenParameter::MaxTokens),
            "max_completion_tokens" => Some(TokenParameter::MaxCompletionTokens),
            _ => None,
        }
    }
}

/// The sampling fields OpenAI's reasoning models refuse with a 400 ("Unsupported parameter:
/// 'temperature' is not supported with this model."): they change how a model samples, not
/// what the answer is, so they are dropped and the envelope says so (`dropped`).
pub const REASONING_DROPS: &[&str] = &[
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
];

/// What the same models cannot give at all: an answer asked for with them would lack what
/// the client asked for, so such a request never goes to such a route.
pub const REASONING_REFUSES: &[&str] = &["logprobs", "top_logprobs"];

/// One route's rules. `drops` and `refuses` name request fields in the route's wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRules {
    pub token_parameter: TokenParameter,
    /// Fields the model refuses that change no answer's meaning: never sent, noted.
    pub drops: Vec<Box<str>>,
    /// Fields the model refuses that the answer depends on: a request carrying one is not
    /// routed here.
    pub refuses: Vec<Box<str>>,
}

impl ModelRules {
    /// The defaults for `model` on a route of `wire`, by family name: on the OpenAI wire,
    /// `o1`, `o3`, `o4` and `gpt-5` ids (dated or with a suffix: `o4-mini`,
    /// `gpt-5-2025-08-07`, `o3-pro`; with or without an `openai/` prefix, as routers write it)
    /// take `max_completion_tokens` and refuse the sampling fields. Every other model takes
    /// `max_tokens` and everything.
    pub fn for_model(wire: Wire, model: &str) -> Self {
        if wire == Wire::OpenAi && is_openai_reasoning(model) {
            ModelRules {
                token_parameter: TokenParameter::MaxCompletionTokens,
                drops: REASONING_DROPS.iter().map(|&f| Box::from(f)).collect(),
                refuses: REASONING_REFUSES.iter().map(|&f| Box::from(f)).collect(),
            }
        } else {
            ModelRules {
                token_parameter: TokenParameter::MaxTokens,
                drops: Vec::new(),
                refuses: Vec::new(),
            }
        }
    }

    pub fn drops(&self, field: &str) -> bool {
        self.drops.iter().any(|f| &**f == field)
    }

    pub fn refuses(&self, field: &str) -> bool {
        self.refuses.iter().any(|f| &**f == field)
    }
}

fn is_openai_reasoning(model: &str) -> bool {
    let id = model.rsplit('/').next().unwrap_or(model).to_ascii_lowercase();
    let family = |prefix: &str| {
        id.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', '.']))
    };
    ["o1", "o3", "o4", "gpt-5"].into_iter().any(family)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_families_take_max_completion_tokens_and_refuse_sampling() {
        for model in [
            "o1",
            "o3-mini",
            "o4-mini",
            "gpt-5",
            "gpt-5-2025-08-07",
            "gpt-5.1",
            "openai/o3-pro",
            "O4-MINI",
        ] {
            let rules = ModelRules::for_model(Wire::OpenAi, model);
            assert_eq!(rules.token_parameter, TokenParameter::MaxCompletionTokens, "{model}");
            assert!(rules.drops("temperature") && rules.refuses("logprobs"), "{model}");
        }
        for model in ["gpt-4o", "gpt-4.1-mini", "o10", "gpt-50", "llama-3-o1", "claude-opus-4"] {
            let rules = ModelRules::for_model(Wire::OpenAi, model);
            assert_eq!(rules.token_parameter, TokenParameter::MaxTokens, "{model}");
            assert!(rules.drops.is_empty() && rules.refuses.is_empty(), "{model}");
        }
    }

    #[test]
    fn the_anthropic_wire_always_takes_max_tokens() {
        let rules = ModelRules::for_model(Wire::Anthropic, "o4-mini");
        assert_eq!(rules.token_parameter, TokenParameter::MaxTokens);
    }
}
