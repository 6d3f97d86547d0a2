//! The answer a scenario gives: its text tokens (explicit or generated from `seed`), its tool
//! calls cut into fragments, the remainder left after a prefill, and the cut at a byte.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::bounds::MAX_TOKENS;
use super::scenario::Scenario;

/// The vocabulary of generated (and diverging) answers.
pub(crate) const WORDS: &[&str] = &[
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

/// The tokens with the one holding byte `bytes` of their text split in two, and how many
/// of them hold exactly the text before the cut (rounded down to a char boundary). `None`
/// when the text is shorter than `bytes`: the cut is never reached.
pub(crate) fn cut_at_byte(mut tokens: Vec<String>, bytes: usize) -> Option<(Vec<String>, usize)> {
    let total: usize = tokens.iter().map(String::len).sum();
    if bytes > total {
        return None;
    }
    let mut consumed = 0usize;
    for (i, token) in tokens.iter().enumerate() {
        let end = consumed + token.len();
        if bytes <= consumed {
            return Some((tokens, i));
        }
        if bytes < end {
            let mut at = bytes - consumed;
            while !token.is_char_boundary(at) {
                at -= 1;
            }
            if at == 0 {
                return Some((tokens, i));
            }
            let tail = token[at..].to_owned();
            tokens[i].truncate(at);
            tokens.insert(i + 1, tail);
            return Some((tokens, i + 1));
        }
        consumed = end;
    }
    let count = tokens.len();
    Some((tokens, count))
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

    /// Repeated words, digit groups, a blank line and multi-byte text: where seams break.
    const HOSTILE: &[&str] = &[
        "The very very old",
        "$1,000,000 per year",
        "para one.\n\npara two",
        "Naïve café — 日本語 🎉",
    ];

    #[test]
    fn hostile_texts_split_into_words_that_concatenate_back() {
        for text in HOSTILE {
            let tokens = split_words(text);
            assert_eq!(tokens.concat(), *text, "round trip of {text:?}: {tokens:?}");
            assert!(tokens.iter().all(|t| !t.is_empty()), "no empty token: {tokens:?}");
        }
        assert_eq!(
            split_words("The very very old"),
            ["The", " very", " very", " old"],
            "repeats"
        );
        assert_eq!(split_words("$1,000,000 per year")[0], "$1,000,000", "one digit group");
        assert_eq!(
            split_words("para one.\n\npara two"),
            ["para", " one.", "\n\npara", " two"],
            "the blank line leads the next word"
        );
    }

    #[test]
    fn a_cut_at_every_byte_sends_exactly_the_text_before_it() {
        for text in HOSTILE {
            for bytes in 0..=text.len() {
                let Some((tokens, k)) = cut_at_byte(split_words(text), bytes) else {
                    panic!("{text:?}: a cut at {bytes} inside the text must be reached");
                };
                let mut floor = bytes;
                while !text.is_char_boundary(floor) {
                    floor -= 1;
                }
                assert_eq!(tokens[..k].concat(), text[..floor], "{text:?} cut at {bytes}");
                assert_eq!(tokens.concat(), *text, "{text:?} cut at {bytes}: nothing lost");
                assert!(tokens.iter().all(|t| !t.is_empty()), "{text:?} at {bytes}: {tokens:?}");
            }
            assert_eq!(cut_at_byte(split_words(text), text.len() + 1), None, "beyond the end");
        }
        let (tokens, k) = cut_at_byte(split_words("Naïve café"), 3).unwrap_or_default();
        assert_eq!((tokens[0].as_str(), k), ("Na", 1), "inside 'ï' rounds down: {tokens:?}");
        let (tokens, k) = cut_at_byte(split_words("ab cd"), 4).unwrap_or_default();
        assert_eq!(
            (&tokens[..k], &tokens[k..]),
            (&["ab".to_owned(), " c".to_owned()][..], &["d".to_owned()][..])
        );
    }

    #[test]
    fn remainder_after_every_prefix_is_the_rest_of_the_text() {
        for text in HOSTILE {
            let tokens = split_words(text);
            for (at, _) in text.char_indices().skip(1) {
                let prefill = &text[..at];
                // The Anthropic adapter strips trailing whitespace; the remainder re-emits it.
                for sent in [prefill, prefill.trim_end()] {
                    if sent.is_empty() {
                        continue;
                    }
                    let rest = remainder_after(&tokens, sent).unwrap_or_else(|| panic!("{text:?} after {sent:?}"));
                    assert_eq!(format!("{sent}{}", rest.concat()), *text, "{text:?} after {sent:?}");
                    assert!(rest.iter().all(|t| !t.is_empty()), "{text:?} after {sent:?}: {rest:?}");
                }
            }
        }
        let tokens = split_words("Hello world");
        assert_eq!(
            remainder_after(&tokens, "Hello"),
            Some(vec![" world".to_owned()]),
            "stripped prefill"
        );
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
