//! What the simulated upstream does with a prefill (a final assistant message): honour it or
//! not by the wire's convention, then continue exactly, start over, diverge, or refuse, and
//! say in the record which of these happened.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::answer::{self, WORDS};
use super::plan::{StatusError, Wire};
use super::request::Prefill;
use super::scenario::{Behaviour, Continuation, Convention, Scenario};

/// The Anthropic API's answer to a final assistant text that ends in whitespace.
pub(crate) const TRAILING_WHITESPACE: &str = "messages: final assistant content cannot end with trailing whitespace";

/// llama.cpp's refusal of a prefill in thinking mode, the default for `refuses`.
const DEFAULT_REFUSAL: &str = "Assistant response prefill is incompatible with enable_thinking";

/// Mixed into the seed of a diverging answer, so it differs from the generated one.
const DIVERGE_SALT: u64 = 0xd1fe_46e5_0a11_ce00;

/// What the upstream did with a request's prefill, as `SimRecord::continuation` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefillOutcome {
    /// Honoured: only the remainder after the prefill was sent.
    Exact,
    /// Honoured with behaviour `exact`, but the prefill is not a prefix of the answer (or
    /// the answer is not text), so the whole answer was sent.
    NotAPrefix,
    /// Honoured, and ignored: the whole answer from its start (`starts_over`).
    StartsOver,
    /// Honoured, and answered differently from the start (`diverges`).
    Diverges,
    /// Honoured by refusing it: HTTP 400 (`refuses`).
    Refused,
    /// The request's shape is not the scenario's convention: the prefill was history and
    /// the whole answer was sent.
    NotHonoured,
    /// Anthropic wire: the final assistant text ends in whitespace, HTTP 400.
    TrailingWhitespace,
}

impl PrefillOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            PrefillOutcome::Exact => "exact",
            PrefillOutcome::NotAPrefix => "not_a_prefix",
            PrefillOutcome::StartsOver => "starts_over",
            PrefillOutcome::Diverges => "diverges",
            PrefillOutcome::Refused => "refused",
            PrefillOutcome::NotHonoured => "not_honoured",
            PrefillOutcome::TrailingWhitespace => "trailing_whitespace",
        }
    }
}

/// How the prefill shapes the answer of a request that is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reading<'a> {
    /// No prefill: the whole answer, nothing to record.
    Fresh,
    NotHonoured,
    /// The remainder after this text, if it prefixes the answer.
    Exact(&'a str),
    StartsOver,
    /// Repeat this many words of the answer, then say something else.
    Diverges(u32),
}

/// The upstream's verdict on a request's final assistant message, before any answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict<'a> {
    Answer(Reading<'a>),
    Refuse(StatusError, PrefillOutcome),
}

/// Judges a request's prefill by the scenario's `continuation` section and the wire.
pub(crate) fn judge<'a>(rules: &Continuation, wire: Wire, prefill: Option<&'a Prefill>) -> Verdict<'a> {
    let Some(prefill) = prefill else {
        return Verdict::Answer(Reading::Fresh);
    };
    if wire == Wire::Anthropic && prefill.trailing_whitespace {
        return Verdict::Refuse(bad_request(TRAILING_WHITESPACE), PrefillOutcome::TrailingWhitespace);
    }
    let honoured = match wire {
        Wire::Anthropic => true,
        Wire::OpenAi => honours(rules.convention, prefill),
    };
    if !honoured {
        return Verdict::Answer(Reading::NotHonoured);
    }
    match rules.behaviour {
        Behaviour::Exact => Verdict::Answer(Reading::Exact(&prefill.text)),
        Behaviour::StartsOver => Verdict::Answer(Reading::StartsOver),
        Behaviour::Diverges => Verdict::Answer(Reading::Diverges(rules.diverge_after_words)),
        Behaviour::Refuses => {
            let message = rules.refusal_message.as_deref().unwrap_or(DEFAULT_REFUSAL);
            Verdict::Refuse(bad_request(message), PrefillOutcome::Refused)
        }
    }
}

/// Whether an OpenAI-wire upstream following `convention` continues this final message.
fn honours(convention: Convention, prefill: &Prefill) -> bool {
    match convention {
        Convention::Any => true,
        Convention::Assistant => !prefill.prefix && !prefill.continue_final_message,
        Convention::Prefix => prefill.prefix,
        Convention::Vllm => prefill.continue_final_message,
        Convention::None => false,
    }
}

fn bad_request(message: &str) -> StatusError {
    StatusError::invalid(message)
}

impl Reading<'_> {
    /// The text tokens a text answer `full` sends under this reading, and what to record.
    pub fn text(self, full: Vec<String>, seed: u64) -> (Vec<String>, Option<PrefillOutcome>) {
        match self {
            Reading::Exact(prefill) => match answer::remainder_after(&full, prefill) {
                Some(rest) => (rest, Some(PrefillOutcome::Exact)),
                None => (full, Some(PrefillOutcome::NotAPrefix)),
            },
            Reading::Diverges(words) => (diverged(&full, words, seed), Some(PrefillOutcome::Diverges)),
            other => (full, other.outcome_without_text()),
        }
    }

    /// What to record when the answer is not text (tool calls, a refusal): it cannot
    /// continue a prefill, so an exact reading sends the whole answer.
    pub fn outcome_without_text(self) -> Option<PrefillOutcome> {
        match self {
            Reading::Fresh => None,
            Reading::NotHonoured => Some(PrefillOutcome::NotHonoured),
            Reading::Exact(_) => Some(PrefillOutcome::NotAPrefix),
            Reading::StartsOver => Some(PrefillOutcome::StartsOver),
            Reading::Diverges(_) => Some(PrefillOutcome::Diverges),
        }
    }
}

/// The tokens a scenario's text answer is sent as (their concatenation is the text).
pub fn answer_tokens(scenario: &Scenario) -> Vec<String> {
    answer::text_tokens(scenario)
}

/// The text a scenario's `diverges` continuation writes instead of its answer (for tests that
/// must know what a coherent replacement looks like).
pub fn diverging_answer(scenario: &Scenario) -> String {
    diverged(
        &answer::text_tokens(scenario),
        scenario.continuation.diverge_after_words,
        scenario.seed,
    )
    .concat()
}

/// A different answer with the shape of `full`: its first `words` words (at most all but
/// the last), then as many other words, each keeping the whitespace in front of the word it
/// replaces and starting with a different letter, so the texts part right after the shared
/// words. Depends only on its inputs.
pub(crate) fn diverged(full: &[String], words: u32, seed: u64) -> Vec<String> {
    let keep = usize::try_from(words)
        .unwrap_or(usize::MAX)
        .min(full.len().saturating_sub(1));
    let mut rng = SmallRng::seed_from_u64(seed ^ DIVERGE_SALT);
    let mut out: Vec<String> = full[..keep].to_vec();
    let replaced = &full[keep..];
    for (i, original) in replaced.iter().enumerate() {
        let word_at = original.len() - original.trim_start().len();
        let (lead, word) = original.split_at(word_at);
        let avoid = word.chars().next().map(|c| c.to_lowercase().collect::<String>());
        let mut pick = WORDS[rng.random_range(0..WORDS.len())];
        while avoid.as_deref().is_some_and(|a| pick.starts_with(a)) {
            pick = WORDS[rng.random_range(0..WORDS.len())];
        }
        let mut token = String::with_capacity(lead.len() + pick.len() + 1);
        token.push_str(lead);
        match pick.chars().next() {
            Some(first) if word.starts_with(char::is_uppercase) => {
                token.extend(first.to_uppercase());
                token.push_str(&pick[first.len_utf8()..]);
            }
            _ => token.push_str(pick),
        }
        if i + 1 == replaced.len() {
            token.push('.');
        }
        out.push(token);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::answer::split_words;

    fn prefill(prefix: bool, continue_final_message: bool) -> Prefill {
        Prefill {
            text: "Hello big".to_owned(),
            prefix,
            continue_final_message,
            trailing_whitespace: false,
        }
    }

    fn rules(convention: Convention, behaviour: Behaviour) -> Continuation {
        Continuation {
            convention,
            behaviour,
            ..Continuation::default()
        }
    }

    #[test]
    fn each_openai_convention_honours_only_its_own_shape() {
        let plain = prefill(false, false);
        let marked = prefill(true, false);
        let vllm = prefill(false, true);
        let cases = [
            (Convention::Any, [true, true, true]),
            (Convention::Assistant, [true, false, false]),
            (Convention::Prefix, [false, true, false]),
            (Convention::Vllm, [false, false, true]),
            (Convention::None, [false, false, false]),
        ];
        for (convention, expected) in cases {
            for (shape, honoured) in [&plain, &marked, &vllm].into_iter().zip(expected) {
                let verdict = judge(&rules(convention, Behaviour::Exact), Wire::OpenAi, Some(shape));
                let want = if honoured {
                    Verdict::Answer(Reading::Exact("Hello big"))
                } else {
                    Verdict::Answer(Reading::NotHonoured)
                };
                assert_eq!(verdict, want, "{convention:?} on {shape:?}");
            }
        }
    }

    #[test]
    fn anthropic_always_honours_and_refuses_trailing_whitespace_first() {
        let none = rules(Convention::None, Behaviour::StartsOver);
        let plain = prefill(false, false);
        assert_eq!(
            judge(&none, Wire::Anthropic, Some(&plain)),
            Verdict::Answer(Reading::StartsOver),
            "the convention is an OpenAI-wire setting"
        );
        let spaced = Prefill {
            trailing_whitespace: true,
            ..plain.clone()
        };
        let Verdict::Refuse(error, outcome) = judge(&Continuation::default(), Wire::Anthropic, Some(&spaced)) else {
            panic!("trailing whitespace must be refused");
        };
        assert_eq!((error.status, outcome), (400, PrefillOutcome::TrailingWhitespace));
        assert_eq!(error.message.as_deref(), Some(TRAILING_WHITESPACE), "message");
        assert_eq!(
            judge(&Continuation::default(), Wire::OpenAi, Some(&spaced)),
            Verdict::Answer(Reading::Exact("Hello big")),
            "OpenAI wire accepts it"
        );
        assert_eq!(
            judge(&none, Wire::Anthropic, None),
            Verdict::Answer(Reading::Fresh),
            "no prefill"
        );
    }

    #[test]
    fn refuses_answers_400_with_the_configured_or_default_message() {
        let mut refusing = rules(Convention::Any, Behaviour::Refuses);
        let shape = prefill(false, false);
        let Verdict::Refuse(error, outcome) = judge(&refusing, Wire::OpenAi, Some(&shape)) else {
            panic!("refuses must refuse");
        };
        assert_eq!((error.status, outcome), (400, PrefillOutcome::Refused));
        assert_eq!(error.message.as_deref(), Some(DEFAULT_REFUSAL), "llama.cpp's message");
        refusing.refusal_message = Some("no".to_owned());
        let Verdict::Refuse(error, _) = judge(&refusing, Wire::Anthropic, Some(&shape)) else {
            panic!("refuses must refuse on Anthropic too");
        };
        assert_eq!(error.message.as_deref(), Some("no"), "configured message");
    }

    #[test]
    fn a_diverging_answer_shares_the_first_words_then_parts() {
        for text in [
            "The very very old house stood here",
            "Naïve café — 日本語 🎉",
            "para one.\n\npara two",
        ] {
            let full = split_words(text);
            for words in 0..=4u32 {
                let other = diverged(&full, words, 5);
                let keep = (words as usize).min(full.len() - 1);
                assert_eq!(other.len(), full.len(), "{text:?}/{words}: same length");
                assert_eq!(other[..keep], full[..keep], "{text:?}/{words}: shared words");
                let shared = full[..keep].concat().len();
                let (a, b) = (full.concat(), other.concat());
                let next = |s: &str| {
                    s[shared..]
                        .trim_start()
                        .chars()
                        .next()
                        .map(|c| c.to_lowercase().to_string())
                };
                assert_ne!(next(&a), next(&b), "{text:?}/{words}: parts right after: {b:?}");
                assert_eq!(other, diverged(&full, words, 5), "reproducible");
            }
        }
        assert!(diverged(&[], 3, 0).is_empty(), "no answer, nothing to diverge");
    }

    #[test]
    fn readings_record_what_was_sent() {
        let full = split_words("Hello big world");
        let (rest, outcome) = Reading::Exact("Hello b").text(full.clone(), 0);
        assert_eq!(
            (rest.concat(), outcome),
            ("ig world".to_owned(), Some(PrefillOutcome::Exact))
        );
        let (all, outcome) = Reading::Exact("Goodbye").text(full.clone(), 0);
        assert_eq!((all, outcome), (full.clone(), Some(PrefillOutcome::NotAPrefix)));
        let (all, outcome) = Reading::StartsOver.text(full.clone(), 0);
        assert_eq!((all, outcome), (full.clone(), Some(PrefillOutcome::StartsOver)));
        assert_eq!(Reading::Fresh.text(full.clone(), 0), (full, None), "no prefill");
        assert_eq!(
            Reading::Exact("x").outcome_without_text(),
            Some(PrefillOutcome::NotAPrefix)
        );
    }
}
