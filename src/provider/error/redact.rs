//! Secrets out of error messages: an upstream error body (or a transport error's URL) may
//! echo our credentials, and every `ProviderError` message reaches a client and a log.
//!
//! Replaced by `[redacted]`: every secret registered with `register_secret` (the routes'
//! configured keys, wherever they appear, and an echo cut short after its first
//! `FRAGMENT_CHARS`); a credential-looking word after `Bearer` / `Basic`; the value of a
//! header or field named `authorization`, `x-api-key`, `api-key`, `api_key` or `apikey`
//! (followed by `:` or `=`); a `key=` query parameter; and any `sk-…` token of 8 characters
//! or more (which also covers `sk-ant-…`). Words that merely name a header ("invalid
//! x-api-key") are left alone. Redacting twice changes nothing.

use std::borrow::Cow;
use std::sync::{PoisonError, RwLock};

pub(crate) const REDACTED: &str = "[redacted]";

/// Header and field names whose value is a credential. `api-key` also finds `x-api-key`
/// and `x-goog-api-key`; `authorization` also finds `proxy-authorization`.
const SECRET_FIELDS: [&str; 4] = ["authorization", "api-key", "api_key", "apikey"];

/// Authorization schemes whose next word is the credential.
const SCHEMES: [&str; 2] = ["bearer", "basic"];

/// The shortest `sk-…` tail taken for a key (shorter ones are words like "sk-learn").
const MIN_KEY_TAIL: usize = 8;

/// The shortest secret `register_secret` takes. A shorter one would match ordinary words
/// and numbers in upstream messages, and whatever a client can get echoed into an error
/// would tell it, by what comes back redacted, whether it guessed the key: an oracle that
/// only a long secret makes useless.
pub const MIN_SECRET_CHARS: usize = 8;

/// Registered secrets are also found by their first this-many characters, so an upstream
/// that cuts its echo short (a bounded log line, a truncated header dump) leaks no prefix.
pub(crate) const FRAGMENT_CHARS: usize = 12;

/// At most this many secrets are kept (one per configured key; routes are few).
const MAX_SECRETS: usize = 1024;

/// The configured secrets, exact. Written at startup, read by every `redact`.
static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Makes every later `redact` replace `secret` wherever it appears. Returns whether it is
/// registered (now or before): a secret shorter than `MIN_SECRET_CHARS` is not, and neither
/// is one past `MAX_SECRETS`.
pub fn register_secret(secret: &str) -> bool {
    // One inside the marker itself would make redacting never settle.
    if secret.chars().count() < MIN_SECRET_CHARS || REDACTED.contains(secret) {
        return false;
    }
    let mut secrets = SECRETS.write().unwrap_or_else(PoisonError::into_inner);
    if secrets.iter().any(|s| s == secret) {
        return true;
    }
    if secrets.len() >= MAX_SECRETS {
        return false;
    }
    secrets.push(secret.to_string());
    true
}

/// `text` with every credential it carries replaced by `[redacted]`.
pub fn redact(text: &str) -> Cow<'_, str> {
    // ASCII lowercasing keeps byte offsets, so spans found in `lower` apply to `text`.
    let lower = text.to_ascii_lowercase();
    let mut spans: Vec<(usize, usize)> = registered_spans(text);
    for field in SECRET_FIELDS {
        for (at, _) in lower.match_indices(field) {
            spans.extend(field_value(&lower, at + field.len()));
        }
    }
    for scheme in SCHEMES {
        for (at, _) in lower.match_indices(scheme) {
            if starts_word(&lower, at) {
                let after = at + scheme.len();
                let rest = &lower[after..];
                let gap = rest.len() - rest.trim_start_matches([' ', '\t']).len();
                if gap > 0 {
                    let value = value_at(&lower, after + gap);
                    spans.extend(value.filter(|(start, end)| looks_like_a_credential(&text[*start..*end])));
                }
            }
        }
    }
    for (at, _) in lower.match_indices("key=") {
        if at > 0 && matches!(lower.as_bytes()[at - 1], b'?' | b'&') {
            spans.extend(value_at(&lower, at + "key=".len()));
        }
    }
    for (at, _) in lower.match_indices("sk-") {
        if starts_word(&lower, at) {
            let tail = lower[at + 3..]
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'*'))
                .count();
            if tail >= MIN_KEY_TAIL {
                spans.push((at, at + 3 + tail));
            }
        }
    }
    if spans.is_empty() {
        return Cow::Borrowed(text);
    }
    Cow::Owned(replace_spans(text, spans, 0).0)
}

/// `text[from..]` with every span (byte ranges of `text`, in any order, overlapping or not)
/// replaced by one `[redacted]`, a span starting before `from` cut at it; and the end of the
/// last span replaced (`None` when none was).
pub(crate) fn replace_spans(text: &str, mut spans: Vec<(usize, usize)>, from: usize) -> (String, Option<usize>) {
    spans.sort_unstable();
    let mut out = String::with_capacity(text.len() - from);
    let mut copied = from;
    let mut last_end = None;
    for (start, end) in spans {
        if end <= copied {
            continue; // inside a span already replaced, or before `from`
        }
        let start = start.max(copied);
        out.push_str(&text[copied..start]);
        if start > copied || !out.ends_with(REDACTED) {
            out.push_str(REDACTED);
        }
        copied = end;
        last_end = Some(end);
    }
    out.push_str(&text[copied..]);
    (out, last_end)
}

/// Whether any secret is registered (a process without route keys scans nothing).
pub(crate) fn any_registered() -> bool {
    !SECRETS.read().unwrap_or_else(PoisonError::into_inner).is_empty()
}

/// Whether `text` ends with a whole registered secret.
pub(crate) fn ends_with_registered(text: &str) -> bool {
    let secrets = SECRETS.read().unwrap_or_else(PoisonError::into_inner);
    secrets.iter().any(|s| text.ends_with(s.as_str()))
}

/// Whether `word` could be the rest of a registered secret whose first `FRAGMENT_CHARS`
/// were already found: it appears in a secret after that fragment (an empty word does).
pub(crate) fn continues_registered(word: &str) -> bool {
    let secrets = SECRETS.read().unwrap_or_else(PoisonError::into_inner);
    secrets
        .iter()
        .any(|secret| match secret.char_indices().nth(FRAGMENT_CHARS) {
            Some((cut, _)) => secret[cut..].contains(word),
            None => word.is_empty(),
        })
}

/// The longest start of `word` that ends a registered secret past its first `FRAGMENT_CHARS`
/// (the rest of a key cut short, with text glued after it: "XYZ." for a key ending "XYZ"), in
/// bytes; 0 when none does.
pub(crate) fn registered_end_in(word: &str) -> usize {
    let secrets = SECRETS.read().unwrap_or_else(PoisonError::into_inner);
    secrets
        .iter()
        .filter_map(|secret| {
            let (cut, _) = secret.char_indices().nth(FRAGMENT_CHARS)?;
            let tail = &secret[cut..];
            (1..=tail.len().min(word.len()))
                .rev()
                .find(|&len| word.is_char_boundary(len) && tail.ends_with(&word[..len]))
        })
        .max()
        .unwrap_or(0)
}

/// How many bytes at the start of `text` are the rest of a registered secret whose first
/// characters are `word` (an echo found by its fragment, cut by the end of a piece): the
/// secret's remainder when `text` holds all of it, all of `text` when `text` ends inside it;
/// `None` when no secret starting with `word` goes on as `text` does.
pub(crate) fn rest_of_registered(word: &str, text: &str) -> Option<usize> {
    let secrets = SECRETS.read().unwrap_or_else(PoisonError::into_inner);
    secrets
        .iter()
        .filter_map(|secret| {
            let rest = secret.strip_prefix(word)?;
            if text.starts_with(rest) {
                Some(rest.len())
            } else {
                rest.starts_with(text).then_some(text.len())
            }
        })
        .max()
}

/// The length of the longest end of `text` that is the start of a registered secret's
/// `FRAGMENT_CHARS`-character fragment, counting only ends of at least `min` bytes: what a
/// stream must hold back, as an echo may go on in its next piece.
pub(crate) fn fragment_start_at_end(text: &str, min: usize) -> usize {
    let secrets = SECRETS.read().unwrap_or_else(PoisonError::into_inner);
    let mut longest = 0;
    for secret in secrets.iter() {
        let fragment = match secret.char_indices().nth(FRAGMENT_CHARS) {
            Some((cut, _)) => &secret[..cut],
            None => secret.as_str(),
        };
        // Shorter than the fragment itself: a whole fragment is already a match.
        for len in (min.max(longest + 1)..fragment.len()).rev() {
            if len <= text.len()
                && text.is_char_boundary(text.len() - len)
                && fragment.starts_with(&text[text.len() - len..])
            {
                longest = len;
                break;
            }
        }
    }
    longest
}

/// Where a registered secret, or its first `FRAGMENT_CHARS`, appears in `text` (case
/// kept: keys are case-sensitive). A fragment's span runs to the end of the word it starts,
/// so what comes back redacted never says how much of a guess matched.
pub(crate) fn registered_spans(text: &str) -> Vec<(usize, usize)> {
    let secrets = SECRETS.read().unwrap_or_else(PoisonError::into_inner);
    let mut spans = Vec::new();
    for secret in secrets.iter() {
        let fragment = match secret.char_indices().nth(FRAGMENT_CHARS) {
            Some((cut, _)) => &secret[..cut],
            None => secret.as_str(),
        };
        for (at, _) in text.match_indices(fragment) {
            let end = if text[at..].starts_with(secret.as_str()) {
                at + secret.len()
            } else {
                let after = at + fragment.len();
                after + text[after..].find(ends_value).unwrap_or(text.len() - after)
            };
            spans.push((at, end));
        }
    }
    spans
}

/// The value of a `name: value` / `"name":"value"` / `name=value` whose name ends at `at`.
fn field_value(lower: &str, at: usize) -> Option<(usize, usize)> {
    let rest = &lower[at..];
    let after_name = rest.trim_start_matches(['"', '\'']);
    let after_name = after_name.trim_start_matches([' ', '\t']);
    let after_sep = after_name.strip_prefix([':', '='])?;
    let value = after_sep.trim_start_matches([' ', '\t', '"', '\'']);
    let mut start = lower.len() - value.len();
    // `authorization: Bearer <token>`: the scheme stays, the token goes.
    for scheme in SCHEMES {
        if let Some(token) = value.strip_prefix(scheme) {
            let trimmed = token.trim_start_matches([' ', '\t']);
            if trimmed.len() < token.len() {
                start = lower.len() - trimmed.len();
            }
        }
    }
    value_at(lower, start)
}

/// The credential that starts at `start`: up to whitespace, a quote or a separator.
fn value_at(lower: &str, start: usize) -> Option<(usize, usize)> {
    let rest = &lower[start..];
    if rest.starts_with(REDACTED) {
        return None;
    }
    let len = rest.find(ends_value).unwrap_or(rest.len());
    (len > 0).then_some((start, start + len))
}

/// Whitespace, a quote or a separator: where a credential-looking value stops.
pub(crate) fn ends_value(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ';' | '&' | '}' | ')' | ']' | '<' | '>')
}

/// After a bare `Bearer` / `Basic` (no field name to go by): long, and not a plain word
/// ("the bearer of bad news", "bearer authentication").
fn looks_like_a_credential(value: &str) -> bool {
    let inner_upper = value.chars().skip(1).any(|c| c.is_ascii_uppercase());
    let marked = value
        .chars()
        .any(|c| c.is_ascii_digit() || matches!(c, '-' | '_' | '.' | '+' | '/' | '='));
    value.len() >= MIN_KEY_TAIL && (inner_upper || marked)
}

fn starts_word(lower: &str, at: usize) -> bool {
    at == 0 || !lower.as_bytes()[at - 1].is_ascii_alphanumeric()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn bearer_tokens_and_api_key_headers_are_redacted() {
        let cases = [
            (
                "bad header authorization: Bearer sk-proj-abcdef1234567890",
                "bad header authorization: Bearer [redacted]",
            ),
            ("x-api-key: sk-ant-api03-SECRETSECRET", "x-api-key: [redacted]"),
            (
                r#"echo {"x-api-key":"abc123secret","model":"m"}"#,
                r#"echo {"x-api-key":"[redacted]","model":"m"}"#,
            ),
            ("Authorization=Basic dXNlcjpwYXNz;", "Authorization=Basic [redacted];"),
            ("api-key: 0123456789abcdef", "api-key: [redacted]"),
            ("token Bearer eyJhbGciOi.x.y end", "token Bearer [redacted] end"),
            (
                "Incorrect API key provided: sk-abc12***************xyz9.",
                "Incorrect API key provided: [redacted].",
            ),
            (
                "GET https://h/v1/models?key=AIzaSyA-secret&alt=sse failed",
                "GET https://h/v1/models?key=[redacted]&alt=sse failed",
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(redact(input), expected, "input {input:?}");
        }
    }

    #[test]
    fn a_registered_secret_is_redacted_wherever_it_appears() {
        let key = "tc-unit-Zq81xWv4Lm02Pn77";
        assert!(register_secret(key), "a long secret is registered");
        assert!(register_secret(key), "registering again is harmless");
        let cases = [
            (
                format!("echo {{\"h\":\"{key}\"}}"),
                "echo {\"h\":\"[redacted]\"}".to_string(),
            ),
            (
                format!("invalid type: string \"{key}\", expected u32"),
                "invalid type: string \"[redacted]\", expected u32".to_string(),
            ),
            (format!("{key}{key}"), "[redacted]".to_string()),
            (
                format!("cut short: {}", &key[..15]),
                "cut short: [redacted]".to_string(),
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(redact(&input), expected, "input {input:?}");
        }
        assert_eq!(
            redact(&key.to_ascii_uppercase()),
            key.to_ascii_uppercase(),
            "keys are case-sensitive: only the exact key is one"
        );
        assert_eq!(
            redact(&format!("{}Q", &key[..FRAGMENT_CHARS - 1])),
            format!("{}Q", &key[..FRAGMENT_CHARS - 1]),
            "less than a fragment is not the key"
        );
    }

    #[test]
    fn short_secrets_are_not_registered() {
        assert!(!register_secret("short"), "under MIN_SECRET_CHARS");
        assert!(!register_secret("redacted"), "inside the marker");
        assert_eq!(redact("a short word"), "a short word", "short words stay");
    }

    #[test]
    fn names_without_values_and_ordinary_words_are_kept() {
        for text in [
            "invalid x-api-key",
            "upstream rejected our credentials (check the route's api key)",
            "the bearer of bad news",
            "this endpoint requires bearer authentication",
            "use sk-learn",
            "Rate limit reached for gpt-4o in organization org-xyz",
        ] {
            assert!(
                matches!(redact(text), Cow::Borrowed(_)),
                "nothing to redact in {text:?}"
            );
        }
    }

    #[test]
    fn redacting_twice_changes_nothing() {
        let once = redact("authorization: Bearer sk-proj-abcdef1234567890, x-api-key=sk-ant-0123456789").into_owned();
        assert_eq!(
            once, "authorization: Bearer [redacted], x-api-key=[redacted]",
            "overlapping rules give one marker"
        );
        assert_eq!(redact(&once), once, "idempotent");
    }

    #[test]
    fn multibyte_text_around_a_secret_survives() {
        assert_eq!(
            redact("clé é Bearer sk-ééééééééé fin"),
            "clé é Bearer [redacted] fin",
            "offsets stay on character boundaries"
        );
    }

    proptest! {
        #[test]
        fn any_text_is_safe_to_redact_and_redacting_is_idempotent(text in "\\PC{0,80}") {
            let once = redact(&text).into_owned();
            prop_assert_eq!(redact(&once).into_owned(), once);
        }

        #[test]
        fn an_echoed_key_never_survives(
            before in "[ -~é]{0,30}",
            after in "[ -~é]{0,30}",
            key in "[A-Za-z0-9]{20,40}",
            form in 0usize..4,
        ) {
            let echoed = match form {
                0 => format!("authorization: Bearer sk-{key}"),
                1 => format!("\"x-api-key\":\"{key}\""),
                2 => format!("Bearer sk-proj-{key}"),
                _ => format!("https://host/v1?key={key}"),
            };
            let text = format!("{before} {echoed} {after}");
            let clean = redact(&text);
            prop_assert!(!clean.contains(&key), "{} -> {}", text, clean);
        }
    }
}
