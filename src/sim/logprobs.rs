//! OpenAI `logprobs`: the log probability of each answer token and its `top_logprobs`
//! alternatives, deterministic (a hash of the token and its position), so the same answer
//! always carries the same numbers. Every value is ≤ 0, the chosen token is the likeliest of
//! its alternatives, and `bytes` are the token's UTF-8 bytes, as OpenAI writes them
//! (`chat_completion_token_logprob.py`).

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::answer::WORDS;

/// `choices[0].logprobs` of one chunk (or of a whole answer).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct ChoiceLogprobs {
    pub content: Option<Vec<TokenLogprob>>,
    pub refusal: Option<Vec<TokenLogprob>>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct TokenLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<Alternative>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Alternative {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
}

impl ChoiceLogprobs {
    pub fn content(entries: Vec<TokenLogprob>) -> Self {
        ChoiceLogprobs {
            content: Some(entries),
            refusal: None,
        }
    }

    pub fn refusal(entries: Vec<TokenLogprob>) -> Self {
        ChoiceLogprobs {
            content: None,
            refusal: Some(entries),
        }
    }
}

/// The entry for `token`, the answer's token number `position`, with `top` alternatives
/// (the token itself first).
pub(crate) fn entry(token: &str, position: u32, top: u8) -> TokenLogprob {
    let h = hash(token, position);
    // Between -2 and 0, most tokens likely: what a confident model looks like.
    let chosen = round(-((h % 2_000_000) as f64 / 1_000_000.0).powi(2) / 2.0);
    let mut alternatives = Vec::with_capacity(usize::from(top));
    if top > 0 {
        alternatives.push(Alternative {
            token: token.to_owned(),
            logprob: chosen,
            bytes: token.as_bytes().to_vec(),
        });
    }
    let lead = if token.starts_with(' ') { " " } else { "" };
    let mut k = 0usize;
    while alternatives.len() < usize::from(top) {
        let word = WORDS[(h as usize).wrapping_add(k * 7) % WORDS.len()];
        k += 1;
        let candidate = format!("{lead}{word}");
        if alternatives.iter().any(|a| a.token == candidate) && k < WORDS.len() * 2 {
            continue;
        }
        let rank = alternatives.len() as f64;
        alternatives.push(Alternative {
            bytes: candidate.as_bytes().to_vec(),
            token: candidate,
            logprob: round(chosen - 1.5 * rank - ((h >> (rank as u32 % 32)) & 0xff) as f64 / 1000.0),
        });
    }
    TokenLogprob {
        token: token.to_owned(),
        logprob: chosen,
        bytes: token.as_bytes().to_vec(),
        top_logprobs: alternatives,
    }
}

fn hash(token: &str, position: u32) -> u64 {
    let mut h = Sha256::new();
    h.update(position.to_le_bytes());
    h.update(token.as_bytes());
    let out = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&out[..8]);
    u64::from_le_bytes(first)
}

/// Six decimals, as the API's values look; never positive.
fn round(value: f64) -> f64 {
    ((value * 1e6).round() / 1e6).min(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_deterministic_non_positive_and_leads_its_alternatives() {
        let e = entry(" café", 3, 5);
        assert_eq!(e, entry(" café", 3, 5), "deterministic");
        assert_eq!(e.bytes, " café".as_bytes(), "UTF-8 bytes");
        assert!(e.logprob <= 0.0, "{e:?}");
        assert_eq!(e.top_logprobs.len(), 5, "k alternatives");
        assert_eq!(e.top_logprobs[0].token, " café", "the chosen token first");
        assert!(
            e.top_logprobs.windows(2).all(|w| w[0].logprob >= w[1].logprob),
            "in order: {e:?}"
        );
        assert!(e.top_logprobs.iter().all(|a| a.logprob <= 0.0), "{e:?}");
        assert!(entry("x", 0, 0).top_logprobs.is_empty(), "top_logprobs 0");
        assert_eq!(entry("x", 0, 20).top_logprobs.len(), 20, "up to 20");
    }
}
