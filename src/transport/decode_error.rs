//! A request body a dialect could not decode: the error (always a 400), the field it names
//! in the dialect's own style, and serde's messages put in the API's words.

use serde_json::Value;

/// A request body the dialect could not turn into a `ChatRequest`. Always a 400.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct DecodeError {
    /// Says what is wrong and where, in words a client can act on.
    pub message: String,
    /// The request field at fault (OpenAI's `param`), when there is one.
    pub param: Option<String>,
    /// A code more specific than `invalid_request_error` (a request cost limit).
    pub code: Option<&'static str>,
}

impl DecodeError {
    pub fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        DecodeError {
            message: message.into(),
            param: Some(param.into()),
            code: None,
        }
    }

    pub fn body(message: impl Into<String>) -> Self {
        DecodeError {
            message: message.into(),
            param: None,
            code: None,
        }
    }

    pub fn with_code(self, code: &'static str) -> Self {
        DecodeError {
            code: Some(code),
            ..self
        }
    }

    /// A body that did not parse: JSON of the wrong shape, or not JSON at all.
    pub fn from_json(e: serde_json::Error) -> Self {
        match e.classify() {
            serde_json::error::Category::Data => {
                DecodeError::body(format!("invalid request: {}", plain_json_error(&e)))
            }
            _ => DecodeError::body(format!("the request body is not valid JSON: {e}")),
        }
    }

    /// As `from_json`, naming the field at fault as `param` (`temperature`,
    /// `messages[0].content`; `messages.0.content` in `Style::Dotted`). The body is decoded
    /// as `T` once more, tracking the path, only after the fast decode failed.
    pub fn from_json_in<'de, T, D>(e: serde_json::Error, again: D, style: PathStyle) -> Self
    where
        T: serde::Deserialize<'de>,
        D: serde::Deserializer<'de, Error = serde_json::Error>,
    {
        DecodeError::located::<T, D>(e, again, style, "")
    }

    /// Decodes `T` from `value`, found at `at` in the request (`messages[2]`); an error names
    /// the field inside it (`messages[2].role`).
    pub fn decode_at<T: serde::de::DeserializeOwned>(value: &Value, at: &str, style: PathStyle) -> Result<T, Self> {
        T::deserialize(value).map_err(|e| DecodeError::located::<T, _>(e, value, style, at))
    }

    /// As `decode_at`, from the JSON text of the part (kept unparsed by the outer decode, so
    /// it is parsed once, straight into `T`, with no `Value` between).
    pub fn decode_raw_at<'a, T: serde::Deserialize<'a>>(
        raw: &'a serde_json::value::RawValue,
        at: &str,
        style: PathStyle,
    ) -> Result<T, Self> {
        serde_json::from_str(raw.get()).map_err(|e| {
            if !matches!(e.classify(), serde_json::error::Category::Data) {
                // What the outer decode only skipped (a lone surrogate, a number out of range)
                // fails here; its line and column would count from the part, so the part is
                // named instead.
                let text = e.to_string();
                let text = text.rfind(" at line ").map_or(text.as_str(), |i| &text[..i]);
                return DecodeError::new(at, format!("the request body is not valid JSON in '{at}': {text}"));
            }
            let again = &mut serde_json::Deserializer::from_str(raw.get());
            DecodeError::located::<T, _>(e, again, style, at)
        })
    }

    fn located<'de, T, D>(e: serde_json::Error, again: D, style: PathStyle, at: &str) -> Self
    where
        T: serde::Deserialize<'de>,
        D: serde::Deserializer<'de, Error = serde_json::Error>,
    {
        if !matches!(e.classify(), serde_json::error::Category::Data) {
            return DecodeError::from_json(e);
        }
        let (inner, param) = match serde_path_to_error::deserialize::<_, T>(again) {
            Err(tracked) => {
                let param = style.render(at, Some(tracked.path()));
                (tracked.into_inner(), param)
            }
            // Not reproduced (cannot happen: the same input): the first error, at `at`.
            Ok(_) => (e, style.render(at, None)),
        };
        let Some(param) = param else {
            return DecodeError::from_json(inner);
        };
        let text = plain_json_error(&inner);
        // Where in the body is said by the field's name now, not a line and column.
        let text = text.rfind(" at line ").map_or(text.as_str(), |at| &text[..at]);
        let message = match style {
            PathStyle::Brackets => format!("invalid '{param}': {text}"),
            PathStyle::Dotted => format!("{param}: {text}"),
        };
        DecodeError::new(param, message)
    }

    /// A request body must be one JSON object: serde would also read a struct from an array
    /// of its fields in order (`["chat", [...]]`), which no client means.
    pub fn require_object(body: &[u8]) -> Result<(), DecodeError> {
        match body.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{') | None => Ok(()),
            Some(b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => {
                Err(DecodeError::body("the request body must be a JSON object"))
            }
            // Not JSON at all: the decoder says where.
            Some(_) => Ok(()),
        }
    }
}

/// How a dialect names a field inside the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathStyle {
    /// OpenAI's: `messages[0].content`.
    Brackets,
    /// Anthropic's: `messages.0.content`.
    Dotted,
}

impl PathStyle {
    /// The field `path` names below `at` (the request itself when empty), or `None` when
    /// both are empty (the body itself is at fault).
    fn render(self, at: &str, path: Option<&serde_path_to_error::Path>) -> Option<String> {
        use serde_path_to_error::Segment;
        let mut out = at.to_string();
        for segment in path.into_iter().flatten() {
            match (segment, self) {
                (Segment::Seq { index }, PathStyle::Brackets) => out.push_str(&format!("[{index}]")),
                (Segment::Seq { index }, PathStyle::Dotted) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(&index.to_string());
                }
                (Segment::Map { key }, _) | (Segment::Enum { variant: key }, _) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(key);
                }
                // An untagged or otherwise unnamed step: the path so far is all we know.
                (Segment::Unknown, _) => break,
            }
        }
        (!out.is_empty()).then_some(out)
    }
}

/// serde's message for a value of the wrong type, in the API's words rather than the Rust
/// type's: `expected struct RawRequest` is `expected a JSON object`, `expected u32` is
/// `expected a non-negative integer`. Other messages are kept as they are.
pub fn plain_json_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let (head, place) = match text.rfind(" at line ") {
        Some(at) => text.split_at(at),
        None => (text.as_str(), ""),
    };
    let Some(at) = head.find(", expected ") else {
        return text;
    };
    let (found, expected) = head.split_at(at);
    let expected = &expected[", expected ".len()..];
    let words = if expected.starts_with("struct ") || expected == "a map" {
        "a JSON object"
    } else if expected == "a sequence" || expected.starts_with("a sequence") {
        "an array"
    } else {
        match expected {
            "u8" | "u16" | "u32" | "u64" | "usize" => "a non-negative integer",
            "i8" | "i16" | "i32" | "i64" | "isize" => "an integer",
            "f32" | "f64" => "a number",
            _ => return text,
        }
    };
    format!("{found}, expected {words}{place}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_that_is_not_an_object_is_refused_before_serde_reads_it_as_fields() {
        for body in [&b"[\"chat\", []]"[..], b"  \"chat\"", b"12", b"null", b"true"] {
            let err = DecodeError::require_object(body).expect_err("not an object");
            assert_eq!(err.message, "the request body must be a JSON object");
        }
        for body in [&b"{}"[..], b" \n{\"model\": 1}", b"", b"<xml/>"] {
            assert!(
                DecodeError::require_object(body).is_ok(),
                "left to the decoder: {body:?}"
            );
        }
    }

    #[test]
    fn type_errors_speak_of_json_not_of_rust_types() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct RawThing {
            n: Option<u32>,
            t: Option<f64>,
            list: Option<Vec<u8>>,
        }
        let message = |text: &str| plain_json_error(&serde_json::from_str::<RawThing>(text).expect_err("a type error"));
        assert_eq!(
            message("null"),
            "invalid type: null, expected a JSON object at line 1 column 4"
        );
        assert_eq!(
            message(r#"{"n": -1}"#),
            "invalid value: integer `-1`, expected a non-negative integer at line 1 column 8"
        );
        assert_eq!(
            message(r#"{"t": "x"}"#),
            "invalid type: string \"x\", expected a number at line 1 column 9"
        );
        assert!(
            !message(r#"{"list": 3}"#).contains("sequence"),
            "{}",
            message(r#"{"list": 3}"#)
        );
        let other = serde_json::from_str::<RawThing>(r#"{"n": 1, "n": 2}"#).expect_err("duplicate");
        assert_eq!(plain_json_error(&other), other.to_string(), "other messages are kept");
    }
}
