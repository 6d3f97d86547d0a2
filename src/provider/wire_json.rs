//! JSON pieces the upstream event decoders share: a string borrowed from the event's data
//! whenever it holds no escape, and a value read only for whether it is truthy.
//!
//! Both exist because serde's own types do the wrong thing here: `Option<Cow<'a, str>>`
//! never borrows (serde's `Cow` impl always allocates), and reading a field only to test it
//! as `serde_json::Value` builds a tree of maps and strings that is thrown away at once.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A JSON string as the wire sent it: borrowed from the event's data, or owned when the
/// string held an escape (`\n`, `\"`, `\u00e9`) that had to be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WireStr<'a>(pub Cow<'a, str>);

impl<'a> WireStr<'a> {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The string as an owned `String`: one allocation if it was borrowed, none if it was
    /// already decoded into one.
    pub fn into_string(self) -> String {
        self.0.into_owned()
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for WireStr<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor;

        impl<'de> Visitor<'de> for StrVisitor {
            type Value = WireStr<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(WireStr(Cow::Borrowed(v)))
            }

            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(WireStr(Cow::Owned(v.to_owned())))
            }

            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(WireStr(Cow::Owned(v)))
            }
        }

        deserializer.deserialize_str(StrVisitor)
    }
}

/// Whether a JSON value is truthy the way the OpenAI SDKs test an in-band `error` (T10):
/// anything but `null`, `false`, `""` and `{}`. The value is skipped, not kept; a caller
/// that needs it parses the event again (only on that rare path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Truthy(pub bool);

impl<'de> Deserialize<'de> for Truthy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TruthyVisitor;

        impl<'de> Visitor<'de> for TruthyVisitor {
            type Value = Truthy;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }

            fn visit_unit<E>(self) -> Result<Truthy, E> {
                Ok(Truthy(false))
            }

            fn visit_none<E>(self) -> Result<Truthy, E> {
                Ok(Truthy(false))
            }

            fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Truthy, D::Error> {
                Truthy::deserialize(deserializer)
            }

            fn visit_bool<E>(self, v: bool) -> Result<Truthy, E> {
                Ok(Truthy(v))
            }

            fn visit_i64<E>(self, _: i64) -> Result<Truthy, E> {
                Ok(Truthy(true))
            }

            fn visit_u64<E>(self, _: u64) -> Result<Truthy, E> {
                Ok(Truthy(true))
            }

            fn visit_f64<E>(self, _: f64) -> Result<Truthy, E> {
                Ok(Truthy(true))
            }

            fn visit_str<E>(self, v: &str) -> Result<Truthy, E> {
                Ok(Truthy(!v.is_empty()))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Truthy, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Truthy(true))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Truthy, A::Error> {
                let mut entries = false;
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
                    entries = true;
                }
                Ok(Truthy(entries))
            }
        }

        deserializer.deserialize_any(TruthyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn a_plain_string_is_borrowed_and_an_escaped_one_decoded() {
        let plain: WireStr = serde_json::from_str(r#""hello""#).unwrap_or_default();
        assert!(matches!(plain.0, Cow::Borrowed("hello")), "{plain:?}");
        let escaped: WireStr = serde_json::from_str(r#""a\nb\u00e9""#).unwrap_or_default();
        assert!(matches!(&escaped.0, Cow::Owned(s) if s == "a\nbé"), "{escaped:?}");
        let inside: Option<WireStr> = serde_json::from_str(r#""x""#).ok().flatten();
        assert!(
            matches!(inside.map(|s| s.0), Some(Cow::Borrowed("x"))),
            "an optional one is borrowed too (serde's own Cow never is)"
        );
        assert!(serde_json::from_str::<WireStr>("1").is_err(), "a number is no string");
    }

    /// The rule the decoders used before, on a `serde_json::Value`.
    fn truthy_as_value(value: &Value) -> bool {
        !matches!(value, Value::Null | Value::Bool(false))
            && value.as_str() != Some("")
            && value.as_object().is_none_or(|o| !o.is_empty())
    }

    #[test]
    fn truthiness_is_the_rule_the_sdks_apply() {
        let cases = [
            "null",
            "false",
            "true",
            "0",
            "1",
            "-3",
            "0.5",
            "\"\"",
            "\"x\"",
            "\"\\u0000\"",
            "{}",
            "{\"message\":\"m\"}",
            "[]",
            "[null]",
            "{\"a\":{}}",
        ];
        for case in cases {
            let value: Value = serde_json::from_str(case).unwrap_or_default();
            let truthy: Option<Truthy> = serde_json::from_str(case).unwrap_or_default();
            assert_eq!(truthy.unwrap_or_default().0, truthy_as_value(&value), "{case}");
        }
    }
}
