//! Quality profiles: how well a simulated model answers what it is asked, so a weaker
//! simulated model scores lower in `tailcut eval` and trips the quality gates more often.
//!
//! A scenario with `quality` follows the prompt when it honours the request: a prompt that
//! quotes its answer (`Reply with exactly "4".`) gets that answer, a json_object or
//! json_schema request gets valid JSON for it, offered tools get a call valid against the
//! tool's schema, and a prompt naming one of `refuse_topics` is refused. Each rate is the
//! share of requests that get it wrong instead: a wrong answer (generated words), JSON that
//! does not parse, tool arguments that do not parse, a harmful prompt answered, a harmless
//! one refused. The draws depend only on the scenario's `seed` and the request's messages,
//! so the same prompt to the same scenario always gets the same verdict, in any order and
//! at any concurrency (an eval run is reproducible).
//!
//! `quality = "strong" | "fair" | "weak"` names a preset; a table gives the rates itself
//! (every rate defaults to 0, `refuse_topics` to [`DEFAULT_REFUSE_TOPICS`]).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::bounds::probability;

/// Phrases a simulated model refuses to help with (case-insensitive, anywhere in the prompt):
/// the simulator's stand-in for a safety policy.
pub const DEFAULT_REFUSE_TOPICS: &[&str] = &[
    "pick a lock",
    "neighbour's lock",
    "neighbor's lock",
    "make a bomb",
    "build a weapon",
    "write malware",
    "steal a password",
];

/// The preset names, in documentation order.
pub const PRESETS: &[&str] = &["strong", "fair", "weak"];

/// How often a simulated model gets each kind of answer wrong; see the module doc.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Quality {
    /// A prompt that quotes its answer gets other words.
    pub wrong_answer_rate: f64,
    /// A JSON-mode or json_schema answer does not parse (it is cut before its last brace).
    pub invalid_json_rate: f64,
    /// A tool call's arguments do not parse (cut before their last brace).
    pub invalid_tool_args_rate: f64,
    /// A prompt naming a refuse topic is answered instead of refused.
    pub missed_refusal_rate: f64,
    /// A harmless prompt is refused.
    pub over_refusal_rate: f64,
    pub refuse_topics: Vec<String>,
}

impl Default for Quality {
    fn default() -> Self {
        Quality {
            wrong_answer_rate: 0.0,
            invalid_json_rate: 0.0,
            invalid_tool_args_rate: 0.0,
            missed_refusal_rate: 0.0,
            over_refusal_rate: 0.0,
            refuse_topics: DEFAULT_REFUSE_TOPICS.iter().map(|t| t.to_string()).collect(),
        }
    }
}

impl Quality {
    /// A named preset: `strong` never errs, `fair` errs on a quarter, `weak` on most.
    pub fn preset(name: &str) -> Option<Quality> {
        let rates = |wrong: f64, over: f64| Quality {
            wrong_answer_rate: wrong,
            invalid_json_rate: wrong,
            invalid_tool_args_rate: wrong,
            missed_refusal_rate: wrong,
            over_refusal_rate: over,
            ..Quality::default()
        };
        match name {
            "strong" => Some(Quality::default()),
            "fair" => Some(rates(0.25, 0.0)),
            "weak" => Some(rates(0.6, 0.1)),
            _ => None,
        }
    }

    /// This request's verdicts: `prompt` is its last user message, `digest` a hash of all its
    /// messages, `seed` the scenario's.
    pub(crate) fn judge(&self, prompt: &str, digest: u64, seed: u64) -> Verdict {
        let mut rng = SmallRng::seed_from_u64(digest ^ seed.rotate_left(29) ^ 0x9a1e_7c0d_e5ca_1e00);
        // Every draw is made, in a fixed order, so one rate never shifts another's outcome.
        let mut draw = |rate: f64| rng.random::<f64>() < probability(rate);
        let wrong = draw(self.wrong_answer_rate);
        let bad_json = draw(self.invalid_json_rate);
        let bad_args = draw(self.invalid_tool_args_rate);
        let missed = draw(self.missed_refusal_rate);
        let over = draw(self.over_refusal_rate);
        let lower = prompt.to_lowercase();
        let harmful = self
            .refuse_topics
            .iter()
            .any(|t| !t.is_empty() && lower.contains(&t.to_lowercase()));
        Verdict {
            answer: if wrong { None } else { quoted_answer(prompt) },
            bad_json,
            bad_args,
            refuse: if harmful { !missed } else { over },
        }
    }
}

/// What one request gets from a model of some quality.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Verdict {
    /// The text answer the prompt asked for, when it quoted one and the model got it right.
    pub answer: Option<String>,
    pub bad_json: bool,
    pub bad_args: bool,
    pub refuse: bool,
}

/// The last double-quoted phrase of `prompt` (straight or curly quotes), if any.
pub(crate) fn quoted_answer(prompt: &str) -> Option<String> {
    let normal = prompt.replace(['\u{201c}', '\u{201d}'], "\"");
    let parts: Vec<&str> = normal.split('"').collect();
    // Quoted phrases are the odd parts of a split with an even number of quotes around them.
    let quoted = parts.len().saturating_sub(1) / 2;
    (0..quoted)
        .rev()
        .map(|k| parts[2 * k + 1].trim())
        .find(|p| !p.is_empty())
        .map(str::to_string)
}

/// JSON text cut before its last character, so it no longer parses.
pub(crate) fn spoil_json(text: &str) -> String {
    let trimmed = text.trim_end();
    let mut chars = trimmed.chars();
    chars.next_back();
    chars.as_str().to_string()
}

/// `quality = "weak"` or `quality = { invalid_json_rate = 0.5 }`.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Quality>, D::Error> {
    struct QualityVisitor;
    impl<'de> Visitor<'de> for QualityVisitor {
        type Value = Quality;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a quality preset ({}) or a table of rates", PRESETS.join(", "))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Quality, E> {
            Quality::preset(v)
                .ok_or_else(|| E::custom(format!("unknown quality preset {v:?} (known: {})", PRESETS.join(", "))))
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Quality, A::Error> {
            Quality::deserialize(de::value::MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_any(QualityVisitor).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quoted_answer_is_the_last_quoted_phrase() {
        assert_eq!(quoted_answer("Reply with exactly \"4\"."), Some("4".into()));
        assert_eq!(
            quoted_answer("Not \"this\" but \u{201c}Paris\u{201d}"),
            Some("Paris".into())
        );
        assert_eq!(quoted_answer("No quotes here"), None);
        assert_eq!(quoted_answer("An \"unclosed quote"), None);
    }

    #[test]
    fn a_strong_model_follows_the_prompt_and_refuses_harmful_ones() {
        let q = Quality::preset("strong").unwrap_or_default();
        for digest in 0..50 {
            let v = q.judge("Say \"hello\".", digest, 1);
            assert_eq!(v.answer.as_deref(), Some("hello"), "digest {digest}");
            assert!(!v.bad_json && !v.bad_args && !v.refuse, "digest {digest}: {v:?}");
            assert!(q.judge("How to pick a neighbour's lock?", digest, 1).refuse);
        }
    }

    #[test]
    fn verdicts_are_deterministic_and_rates_show() {
        let q = Quality::preset("weak").unwrap_or_default();
        let a: Vec<Verdict> = (0..200).map(|d| q.judge("Say \"hi\".", d, 7)).collect();
        let b: Vec<Verdict> = (0..200).map(|d| q.judge("Say \"hi\".", d, 7)).collect();
        assert_eq!(a, b, "same request, same verdict");
        let wrong = a.iter().filter(|v| v.answer.is_none()).count();
        assert!((80..=160).contains(&wrong), "about 60% wrong: {wrong}/200");
    }

    #[test]
    fn presets_and_tables_deserialize_and_unknown_names_are_named() {
        #[derive(Deserialize)]
        struct S {
            #[serde(deserialize_with = "deserialize")]
            quality: Option<Quality>,
        }
        let s: S = toml::from_str("quality = \"fair\"").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.quality, Quality::preset("fair"));
        let s: S = toml::from_str("quality = { invalid_json_rate = 1.0 }").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.quality.map(|q| q.invalid_json_rate), Some(1.0));
        let err = toml::from_str::<S>("quality = \"great\"")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("unknown quality preset") && err.contains("strong"),
            "{err}"
        );
        let err = toml::from_str::<S>("quality = { nope = 1 }")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("nope"), "{err}");
    }

    #[test]
    fn spoiled_json_no_longer_parses() {
        let text = "{\n  \"city\": \"Oslo\"\n}";
        assert!(serde_json::from_str::<serde_json::Value>(&spoil_json(text)).is_err());
        assert!(serde_json::from_str::<serde_json::Value>(&spoil_json("{}")).is_err());
    }
}
