//! Finding the credential a request presents (`Authorization: Bearer`, `x-api-key`, or a
//! `?token=` where a browser cannot set headers), comparing secrets in constant time, and
//! keeping tokens out of logged URLs.

use std::borrow::Cow;

use axum::extract::Query;
use axum::http::{header, HeaderMap, Uri};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::token::TOKEN_PREFIX;

/// What a request presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presented<'a> {
    Nothing,
    /// A header that is there but not readable text.
    Unreadable,
    Key(&'a str),
    Token(&'a str),
    /// `?token=` carrying something that is not a token: API keys never ride in URLs, where
    /// proxies and browser histories keep them.
    KeyInUrl,
    /// A credential header sent more than once: which key is meant is ambiguous, and a
    /// check must never read one value while something else reads another.
    Repeated(&'static str),
}

/// The headers that carry a credential; each may be sent once.
const CREDENTIAL_HEADERS: [&str; 2] = ["authorization", "x-api-key"];

/// The first of `names` that `headers` holds more than once.
pub fn repeated(headers: &HeaderMap, names: &[&'static str]) -> Option<&'static str> {
    names
        .iter()
        .find(|name| headers.get_all(**name).iter().nth(1).is_some())
        .copied()
}

/// The request's credential: the headers first, then `query_token` (passed only by the
/// endpoints browsers reach without headers: `GET /v1/stream` and the `GET /v1/ws` upgrade).
pub fn presented<'a>(headers: &'a HeaderMap, query_token: Option<&'a str>) -> Presented<'a> {
    if let Some(name) = repeated(headers, &CREDENTIAL_HEADERS) {
        return Presented::Repeated(name);
    }
    let from_header = match headers.get(header::AUTHORIZATION) {
        Some(v) => match v.to_str() {
            Ok(text) => bearer(text),
            Err(_) => return Presented::Unreadable,
        },
        None => None,
    };
    let from_header = match from_header {
        Some(c) => Some(c),
        None => match headers.get("x-api-key") {
            Some(v) => match v.to_str() {
                Ok(text) => Some(text.trim()).filter(|t| !t.is_empty()),
                Err(_) => return Presented::Unreadable,
            },
            None => None,
        },
    };
    if let Some(credential) = from_header {
        return if credential.starts_with(TOKEN_PREFIX) {
            Presented::Token(credential)
        } else {
            Presented::Key(credential)
        };
    }
    match query_token.map(str::trim).filter(|t| !t.is_empty()) {
        Some(t) if t.starts_with(TOKEN_PREFIX) => Presented::Token(t),
        Some(_) => Presented::KeyInUrl,
        None => Presented::Nothing,
    }
}

/// The credential of `Bearer <credential>` (scheme case-insensitive).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(rest.trim())
        .filter(|c| !c.is_empty())
}

#[derive(Deserialize)]
struct TokenParam {
    token: Option<String>,
}

/// The `?token=` of a URL, if any.
pub fn query_token(uri: &Uri) -> Option<String> {
    Query::<TokenParam>::try_from_uri(uri).ok().and_then(|q| q.0.token)
}

pub fn sha256(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// Whether `given` is `expected`, in time that depends on neither (both are hashed first, so
/// not even the length shows).
pub fn same_secret(given: &str, expected: &str) -> bool {
    sha256(given).ct_eq(&sha256(expected)).into()
}

/// The admin bearer token of a request (`Authorization: Bearer <token>`); none when the
/// header is sent more than once.
pub fn admin_bearer(headers: &HeaderMap) -> Option<&str> {
    if repeated(headers, &["authorization"]).is_some() {
        return None;
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
}

/// `text` (a URL, or a log line holding one) with every `token=` value replaced by
/// `[redacted]`, for anything that logs request URLs.
pub fn redact_token_param(text: &str) -> Cow<'_, str> {
    const NEEDLE: &str = "token=";
    if !text.contains(NEEDLE) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(NEEDLE) {
        let value_start = at + NEEDLE.len();
        // Only a parameter named exactly `token` (after `?`, `&` or at the start).
        let is_param = at == 0 || rest[..at].ends_with(['?', '&']);
        out.push_str(&rest[..value_start]);
        let tail = &rest[value_start..];
        let end = tail.find(['&', ' ', '#', '"', '\'']).unwrap_or(tail.len());
        if is_param && end > 0 {
            out.push_str("[redacted]");
        } else {
            out.push_str(&tail[..end]);
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("header value"));
        }
        h
    }

    #[test]
    fn bearer_and_x_api_key_both_present_a_key() {
        let h = headers(&[("authorization", "Bearer tc_abc")]);
        assert_eq!(presented(&h, None), Presented::Key("tc_abc"), "OpenAI SDKs");
        let h = headers(&[("authorization", "bearer  tc_abc ")]);
        assert_eq!(presented(&h, None), Presented::Key("tc_abc"), "scheme case, spaces");
        let h = headers(&[("x-api-key", "tc_abc")]);
        assert_eq!(presented(&h, None), Presented::Key("tc_abc"), "Anthropic SDKs");
        let h = headers(&[("authorization", "Basic dXNlcjpwdw=="), ("x-api-key", "tc_abc")]);
        assert_eq!(
            presented(&h, None),
            Presented::Key("tc_abc"),
            "a non-bearer scheme is not a key"
        );
        let h = headers(&[("authorization", "Bearer tct_x.y")]);
        assert_eq!(presented(&h, None), Presented::Token("tct_x.y"), "a token as bearer");
        assert_eq!(presented(&HeaderMap::new(), None), Presented::Nothing, "nothing");
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_bytes(b"\xff\xfe").expect("opaque bytes"));
        assert_eq!(presented(&h, None), Presented::Unreadable, "not text");
    }

    #[test]
    fn a_credential_header_sent_twice_is_refused_whatever_the_values() {
        for name in CREDENTIAL_HEADERS {
            for second in ["Bearer tc_abc", "Bearer tc_other"] {
                let mut h = HeaderMap::new();
                h.append(name, HeaderValue::from_static("Bearer tc_abc"));
                h.append(name, HeaderValue::from_str(second).expect("value"));
                assert_eq!(presented(&h, None), Presented::Repeated(name), "{name}: {second}");
            }
        }
        let mut h = headers(&[("authorization", "Bearer admin")]);
        assert_eq!(admin_bearer(&h), Some("admin"), "once");
        h.append("authorization", HeaderValue::from_static("Bearer other"));
        assert_eq!(admin_bearer(&h), None, "twice: no admin token");
    }

    #[test]
    fn a_url_may_carry_a_token_but_never_a_key() {
        let none = HeaderMap::new();
        assert_eq!(presented(&none, Some("tct_x.y")), Presented::Token("tct_x.y"), "token");
        assert_eq!(presented(&none, Some("tc_key")), Presented::KeyInUrl, "key in URL");
        let h = headers(&[("x-api-key", "tc_key")]);
        assert_eq!(
            presented(&h, Some("tct_x.y")),
            Presented::Key("tc_key"),
            "headers first"
        );
        let uri: Uri = "/v1/stream?q=%7B%7D&token=tct_a.b".parse().expect("uri");
        assert_eq!(query_token(&uri).as_deref(), Some("tct_a.b"), "from the query");
        let uri: Uri = "/v1/ws".parse().expect("uri");
        assert_eq!(query_token(&uri), None, "no query");
    }

    #[test]
    fn secrets_compare_equal_only_when_equal() {
        assert!(same_secret("admin-secret", "admin-secret"), "equal");
        assert!(!same_secret("admin-secreT", "admin-secret"), "one character off");
        assert!(!same_secret("admin", "admin-secret"), "a prefix");
        assert!(!same_secret("", "admin-secret"), "empty");
    }

    #[test]
    fn logged_urls_lose_their_token() {
        assert_eq!(
            redact_token_param("GET /v1/stream?q=%7B%7D&token=tct_abc.def&x=1"),
            "GET /v1/stream?q=%7B%7D&token=[redacted]&x=1",
            "the value only"
        );
        assert_eq!(
            redact_token_param("/v1/ws?token=tct_a.b"),
            "/v1/ws?token=[redacted]",
            "first param"
        );
        assert_eq!(
            redact_token_param("/v1/ws?max_token=5"),
            "/v1/ws?max_token=5",
            "another param"
        );
        assert!(
            matches!(redact_token_param("/v1/models"), Cow::Borrowed(_)),
            "nothing to redact"
        );
    }
}
