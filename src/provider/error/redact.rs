//! Secrets out of error messages: an upstream error body (or a transport error's URL) may
//! echo our credentials, and every `ProviderError` message reaches a client and a log.
//!
//! Replaced by `[redacted]`: a credential-looking word after `Bearer` / `Basic`; the value of a header or
//! field named `authorization`, `x-api-key`, `api-key`, `api_key` or `apikey` (followed by
//! `:` or `=`); a `key=` query parameter; and any `sk-…` token of 8 characters or more.
//! Words that merely name a header ("invalid x-api-key") are left alone. Redacting twice
//! changes nothing.

use std::borrow::Cow;

const REDACTED: &str = "[redacted]";

/// Header and field names whose value is a credential. `api-key` also finds `x-api-key`
/// and `x-goog-api-key`; `authorization` also finds `proxy-authorization`.
const SECRET_FIELDS: [&str; 4] = ["authorization", "api-key", "api_key", "apikey"];

/// Authorization schemes whose next word is the credential.
const SCHEMES: [&str; 2] = ["bearer", "basic"];

/// The shortest `sk-…` tail taken for a key (shorter ones are words like "sk-learn").
const MIN_KEY_TAIL: usize = 8;

/// `text` with every credential it carries replaced by `[redacted]`.
pub fn redact(text: &str) -> Cow<'_, str> {
    // ASCII lowercasing keeps byte offsets, so spans found in `lower` apply to `text`.
    let lower = text.to_ascii_lowercase();
    let mut spans: Vec<(usize, usize)> = Vec::new();
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
    spans.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (start, end) in spans {
        if end <= copied {
            continue; // inside a span already replaced
        }
        let start = start.max(copied);
        out.push_str(&text[copied..start]);
        if start > copied || !out.ends_with(REDACTED) {
            out.push_str(REDACTED);
        }
        copied = end;
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
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
    let len = rest
        .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ';' | '&' | '}' | ')' | ']' | '<' | '>'))
        .unwrap_or(rest.len());
    (len > 0).then_some((start, start + len))
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
