//! The answer a scenario gives: its text tokens (explicit or generated from `seed`), its tool
//! calls cut into fragments, and the remainder left after a prefill.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::scenario::{Scenario, MAX_TOKENS};

const WORDS: &[&str] = &[
    "latency", "stream", "token", "route", "answer", "model", "request", "gateway", "edge", "first", "tail", "budget",
    "hedge", "region", "packet", "signal", "window", "quiet", "river", "stone", "light", "garden", "north", "paper",
    "silver", "morning", "bridge", "harbor", "little", "steady", "simple", "honest", "careful", "bright", "open",
    "calm", "moves", "waits", "returns", "carries", "finds", "keeps", "shows", "brings", "holds", "through", "across",
    "before", "after", "under", "with", "and", "the", "a", "of", "to",
];

/// What a refusing model says.
pub(crate) const REFUSAL_TEXT: &str = "I'm sorry, but I can't help with that request.";

/// The full answer text of a scenario, as tokens whose concatenation is the text.
pub(crate) fn text_tokens(scenario: &Scenario) -> Vec<String> {
    match &scenario.text {
        Some(text) => split_words(text),
        None => generated_tokens(scenario.seed, scenario.tokens.min(MAX_TOKENS)),
    }
}

/// Splits text into tokens that each carry the whitespace in front of their word:
/// `"Hello big world!"` -> `["Hello", " big", " world!"]`. Concatenation gives the text back.
pub(crate) fn split_words(text: &str) -> Vec<String> {
    let mut tokens: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    for c in text.chars() {
        if c.is_whitespace() && in_word {
            tokens.push(std::mem::take(&mut current));
            in_word = false;
        } else if !c.is_whitespace() {
            in_word = true;
        }
        current.push(c);
    }
    if !current.is_empty() {
        match (in_word, tokens.last_mut()) {
            // Trailing whitespace belongs to the last word.
            (false, Some(last)) => last.push_str(&current),
            _ => tokens.push(current),
        }
    }
    tokens
}

/// Sentences from a fixed word list; depends only on `seed` and `count`, so every request of
/// a scenario (and every scenario with the same seed and length) gets the same answer.
fn generated_tokens(seed: u64, count: u32) -> Vec<String> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x7e57_5eed_0fca_1100);
    let mut tokens = Vec::with_capacity(count as usize);
    let mut sentence_left = 0u32;
    for i in 0..count {
        let word = WORDS[rng.random_range(0..WORDS.len())];
        let starts_sentence = sentence_left == 0;
        if starts_sentence {
            sentence_left = rng.random_range(5..=11);
        }
        sentence_left -= 1;
        let mut token = String::with_capacity(word.len() + 2);
        if i > 0 {
            token.push(' ');
        }
        if starts_sentence {
            let mut chars = word.chars();
            if let Some(first) = chars.next() {
                token.extend(first.to_uppercase());
                token.push_str(chars.as_str());
            }
        } else {
            token.push_str(word);
        }
        if sentence_left == 0 || i + 1 == count {
            token.push('.');
            sentence_left = 0;
        }
        tokens.push(token);
    }
    tokens
}

/// The tokens still to send when the client already has `prefill`, or `None` when the
/// prefill is not a prefix of the answer. A prefill ending inside a token sends that token's
/// tail first.
pub(crate) fn remainder_after(tokens: &[String], prefill: &str) -> Option<Vec<String>> {
    let full: String = tokens.concat();
    if prefill.is_empty() || !full.starts_with(prefill) {
        return None;
    }
    let mut consumed = 0usize;
    let mut rest = Vec::new();
    for token in tokens {
        let end = consumed + token.len();
        if end <= prefill.len() {
            consumed = end;
            continue;
        }
        if consumed < prefill.len() {
            // `prefill` is a prefix of `full`, so its end is a char boundary in this token.
            let tail = token.get(prefill.len() - consumed..).unwrap_or_default();
            rest.push(tail.to_owned());
        } else {
            rest.push(token.clone());
        }
        consumed = end;
    }
    Some(rest)
}

/// Cuts `arguments` into at most `pieces` non-empty fragments at random char boundaries
/// (never inside a UTF-8 character, often inside a key or an escape sequence, T4).
pub(crate) fn fragments(arguments: &str, pieces: u32, rng: &mut SmallRng) -> Vec<String> {
    let boundaries: Vec<usize> = arguments.char_indices().map(|(i, _)| i).filter(|&i| i > 0).collect();
    let wanted_cuts = (pieces.max(1) as usize - 1).min(boundaries.len());
    let mut cuts: Vec<usize> = rand::seq::index::sample(rng, boundaries.len(), wanted_cuts)
        .into_iter()
        .map(|k| boundaries[k])
        .collect();
    cuts.sort_unstable();
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for cut in cuts.into_iter().chain(std::iter::once(arguments.len())) {
        if let Some(piece) = arguments.get(start..cut) {
            if !piece.is_empty() {
                out.push(piece.to_owned());
            }
        }
        start = cut;
    }
    out
}

/// A random alphanumeric id of `len` characters after `prefix` (`call_…`, `msg_…`).
pub(crate) fn random_id(prefix: &str, len: usize, rng: &mut SmallRng) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut id = String::with_capacity(prefix.len() + len);
    id.push_str(prefix);
    for _ in 0..len {
        id.push(char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]));
    }
    id
}

/// A rough token count of request text: its whitespace-separated words.
pub(crate) fn estimate_tokens(text: &str) -> u32 {
    u32::try_from(text.split_whitespace().count()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_words_keeps_the_space_in_front_and_round_trips() {
        let tokens = split_words("Hello big  world!\n");
        assert_eq!(tokens, vec!["Hello", " big", "  world!\n"], "split");
        assert_eq!(split_words("  lead"), vec!["  lead"], "leading space stays on the word");
        assert!(split_words("").is_empty(), "empty text has no tokens");
    }

    #[test]
    fn generated_text_depends_only_on_seed_and_length() {
        let a = generated_tokens(7, 30);
        assert_eq!(a, generated_tokens(7, 30), "same seed, same text");
        assert_ne!(a, generated_tokens(8, 30), "another seed, another text");
        assert_eq!(a.len(), 30, "token count");
        assert!(a.iter().skip(1).all(|t| t.starts_with(' ')), "leading spaces: {a:?}");
        assert!(a.concat().ends_with('.'), "ends a sentence");
    }

    #[test]
    fn remainder_after_prefill_continues_mid_token() {
        let tokens = split_words("Hello big world");
        assert_eq!(
            remainder_after(&tokens, "Hello b"),
            Some(vec!["ig".to_owned(), " world".to_owned()]),
            "tail of the cut token, then the rest"
        );
        assert_eq!(
            remainder_after(&tokens, "Hello"),
            Some(vec![" big".to_owned(), " world".to_owned()]),
            "whole tokens"
        );
        assert_eq!(remainder_after(&tokens, "Goodbye"), None, "not a prefix");
        assert_eq!(remainder_after(&tokens, ""), None, "empty prefill is no prefill");
    }

    #[test]
    fn fragments_concatenate_to_the_arguments_at_char_boundaries() {
        let args = r#"{"city": "Zürich", "note": "a\"b"}"#;
        for seed in 0..50 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let parts = fragments(args, 12, &mut rng);
            assert_eq!(parts.concat(), args, "seed {seed}: concatenation");
            assert_eq!(parts.len(), 12, "seed {seed}: piece count");
        }
        let mut rng = SmallRng::seed_from_u64(1);
        assert_eq!(fragments("{}", 12, &mut rng).len(), 2, "never more pieces than chars");
        assert!(fragments("", 12, &mut rng).is_empty(), "empty arguments, no pieces");
    }
}
