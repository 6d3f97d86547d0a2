//! What a chat request body must be before a dialect decodes it: declared as JSON, and
//! bounded in what decoding it costs (message count and decoded size, `[server]`
//! `max_messages` / `max_decoded_bytes`).
//!
//! The cost is measured by a walk over the body that builds nothing (serde's visitor API,
//! strings borrowed or in serde_json's scratch buffer), so a 4 MB body of 120,000 empty
//! messages is refused for the price of reading it once, instead of growing into a tree of
//! 120,000 maps. `serde_json` has no such limit of its own; this walk is the smallest thing
//! that gives one. A body too short to reach either limit, whatever it holds, is not walked
//! ([`within_limits_unread`]): most chat requests are a few KiB.

use std::fmt;

use axum::http::{header, HeaderMap};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::decode_error::DecodeError;
use super::error::ErrorReply;
use crate::config::RequestLimits;

/// `415` unless the body is declared as JSON: `application/json`, or any
/// `application/*+json`, with any parameters. A body without a `content-type` is read as
/// JSON (minimal clients omit it); a form or `text/plain` post never is.
/// Every `content-type` line counts: a request that declares two types is refused unless
/// both are JSON.
pub fn require_json(headers: &HeaderMap) -> Result<(), ErrorReply> {
    for value in headers.get_all(header::CONTENT_TYPE) {
        let text = value.to_str().unwrap_or_default();
        let essence = text.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        let json = essence == "application/json"
            || essence
                .strip_prefix("application/")
                .is_some_and(|sub| sub.ends_with("+json"));
        if !json {
            return Err(ErrorReply::unsupported_media_type(Some(text)));
        }
    }
    Ok(())
}

/// Refuses a body whose decoding would cost more than `limits` allow, with a 400 naming the
/// limit. A body that is not JSON passes: the dialect's decoder then says what is wrong.
pub fn check_cost(body: &[u8], limits: &RequestLimits) -> Result<(), DecodeError> {
    if within_limits_unread(body.len(), limits) {
        return Ok(());
    }
    walk(body, limits)
}

/// The same limits for a request that arrived already parsed, inside a WebSocket frame: its
/// parse was bounded by `ws_max_message_bytes`, but the decode into a chat request and what
/// the gateway does with its messages are not, so a frame of 5,000 one-byte messages is
/// refused here as the same body over HTTP is.
pub fn check_value_cost(request: &serde_json::Value, limits: &RequestLimits) -> Result<(), DecodeError> {
    walk_with(request, limits)
}

/// The walk itself (see the module doc).
fn walk(body: &[u8], limits: &RequestLimits) -> Result<(), DecodeError> {
    walk_with(&mut serde_json::Deserializer::from_slice(body), limits)
}

fn walk_with<'de, D: Deserializer<'de>>(de: D, limits: &RequestLimits) -> Result<(), DecodeError> {
    let walk = Walk {
        limits,
        cost: Cost::default(),
        depth: 0,
    };
    match walk.deserialize(de) {
        Ok(_) => Ok(()),
        Err(e) => match Over::from_message(&e.to_string()) {
            Some(over) => Err(over.error(limits)),
            None => Ok(()),
        },
    }
}

/// Whether any body of `len` bytes is within `limits`, so the walk can be skipped.
/// Every JSON value takes at least one byte of the body of its own (a digit, a pair of
/// brackets or quotes; a key its quotes and colon too) and a string decodes to at most as
/// many bytes as it takes, so the decoded size is at most `DECODED_BYTES_PER_VALUE` per
/// byte of the body; and each message of an array but the last takes at least two bytes
/// (itself and a comma), so there are at most `(len + 1) / 2` of them.
fn within_limits_unread(len: usize, limits: &RequestLimits) -> bool {
    len.div_ceil(2) <= limits.max_messages
        && len.saturating_mul(RequestLimits::DECODED_BYTES_PER_VALUE) <= limits.max_decoded_bytes
}

/// Which limit a walk stopped at (carried out of serde as the error's message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    Messages,
    DecodedBytes,
}

impl Over {
    const MESSAGES: &'static str = "tailcut:max_messages";
    const DECODED: &'static str = "tailcut:max_decoded_bytes";

    fn marker(self) -> &'static str {
        match self {
            Over::Messages => Over::MESSAGES,
            Over::DecodedBytes => Over::DECODED,
        }
    }

    fn from_message(message: &str) -> Option<Self> {
        if message.starts_with(Over::MESSAGES) {
            Some(Over::Messages)
        } else if message.starts_with(Over::DECODED) {
            Some(Over::DecodedBytes)
        } else {
            None
        }
    }

    fn error(self, limits: &RequestLimits) -> DecodeError {
        match self {
            Over::Messages => DecodeError::new(
                "messages",
                format!(
                    "too many messages: at most {} per request (server.max_messages)",
                    limits.max_messages
                ),
            )
            .with_code("max_messages_exceeded"),
            Over::DecodedBytes => DecodeError::body(format!(
                "the request is too large once decoded: at most {} bytes (server.max_decoded_bytes; \
                 every string's bytes plus {} per JSON value)",
                limits.max_decoded_bytes,
                RequestLimits::DECODED_BYTES_PER_VALUE
            ))
            .with_code("max_decoded_bytes_exceeded"),
        }
    }
}

/// Running totals of one walk.
#[derive(Debug, Default, Clone, Copy)]
struct Cost {
    decoded_bytes: usize,
    messages: usize,
}

/// Visits one JSON value, adding to the totals; `depth` 0 is the request object, whose
/// `messages` and `system` arrays count messages.
struct Walk<'l> {
    limits: &'l RequestLimits,
    cost: Cost,
    depth: u32,
}

impl<'l> Walk<'l> {
    fn add<E: de::Error>(&mut self, bytes: usize) -> Result<(), E> {
        self.cost.decoded_bytes = self
            .cost
            .decoded_bytes
            .saturating_add(bytes)
            .saturating_add(RequestLimits::DECODED_BYTES_PER_VALUE);
        if self.cost.decoded_bytes > self.limits.max_decoded_bytes {
            return Err(E::custom(Over::DecodedBytes.marker()));
        }
        Ok(())
    }

    fn child(&self, cost: Cost) -> Walk<'l> {
        Walk {
            limits: self.limits,
            cost,
            depth: self.depth + 1,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = Cost;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Cost, D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// The elements of a top-level `messages` / `system` array are counted as messages.
struct Messages<'l>(Walk<'l>);

impl<'de> DeserializeSeed<'de> for Messages<'_> {
    type Value = Cost;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Cost, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Messages<'_> {
    type Value = Cost;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Cost, A::Error> {
        let mut walk = self.0;
        walk.add::<A::Error>(0)?;
        loop {
            let next = walk.child(walk.cost);
            match seq.next_element_seed(next)? {
                Some(cost) => walk.cost = cost,
                None => return Ok(walk.cost),
            }
            walk.cost.messages += 1;
            if walk.cost.messages > walk.limits.max_messages {
                return Err(de::Error::custom(Over::Messages.marker()));
            }
        }
    }

    // Anything else (a string `system`, a wrong type) is an ordinary value.
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Cost, E> {
        self.0.visit_str(v)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Cost, A::Error> {
        self.0.visit_map(map)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Cost, E> {
        self.0.visit_bool(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Cost, E> {
        self.0.visit_i64(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Cost, E> {
        self.0.visit_u64(v)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Cost, E> {
        self.0.visit_f64(v)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Cost, E> {
        self.0.visit_unit()
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = Cost;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(mut self, _: bool) -> Result<Cost, E> {
        self.add(0)?;
        Ok(self.cost)
    }

    fn visit_i64<E: de::Error>(mut self, _: i64) -> Result<Cost, E> {
        self.add(0)?;
        Ok(self.cost)
    }

    fn visit_u64<E: de::Error>(mut self, _: u64) -> Result<Cost, E> {
        self.add(0)?;
        Ok(self.cost)
    }

    fn visit_f64<E: de::Error>(mut self, _: f64) -> Result<Cost, E> {
        self.add(0)?;
        Ok(self.cost)
    }

    fn visit_str<E: de::Error>(mut self, v: &str) -> Result<Cost, E> {
        self.add(v.len())?;
        Ok(self.cost)
    }

    fn visit_unit<E: de::Error>(mut self) -> Result<Cost, E> {
        self.add(0)?;
        Ok(self.cost)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Cost, A::Error> {
        self.add::<A::Error>(0)?;
        while let Some(cost) = seq.next_element_seed(self.child(self.cost))? {
            self.cost = cost;
        }
        Ok(self.cost)
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Cost, A::Error> {
        self.add::<A::Error>(0)?;
        while let Some(key) = map.next_key::<KeyName>()? {
            self.add::<A::Error>(key.len)?;
            let counts_messages = self.depth == 0 && key.messages;
            let child = self.child(self.cost);
            self.cost = if counts_messages {
                map.next_value_seed(Messages(child))?
            } else {
                map.next_value_seed(child)?
            };
        }
        Ok(self.cost)
    }
}

/// A map key's length, and whether it names an array of messages.
struct KeyName {
    len: usize,
    messages: bool,
}

impl<'de> de::Deserialize<'de> for KeyName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = KeyName;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyName, E> {
                Ok(KeyName {
                    len: v.len(),
                    messages: v == "messages" || v == "system",
                })
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn limits(max_messages: usize, max_decoded_bytes: usize) -> RequestLimits {
        RequestLimits {
            max_messages,
            max_decoded_bytes,
        }
    }

    fn messages(n: usize) -> Vec<u8> {
        let one = r#"{"role":"user","content":""}"#;
        format!(r#"{{"model":"chat","messages":[{}]}}"#, vec![one; n].join(",")).into_bytes()
    }

    #[test]
    fn message_count_is_capped_at_the_limit() {
        let at = limits(3, usize::MAX);
        assert_eq!(
            check_cost(&messages(3), &at),
            Ok(()),
            "three messages fit a cap of three"
        );
        let err = check_cost(&messages(4), &at).err();
        assert_eq!(
            err.as_ref().and_then(|e| e.code),
            Some("max_messages_exceeded"),
            "four do not: {err:?}"
        );
        assert!(
            err.is_some_and(|e| e.message.contains("server.max_messages") && e.param.as_deref() == Some("messages")),
            "the message names the limit and the field"
        );
    }

    #[test]
    fn decoded_size_counts_strings_and_values() {
        let body = br#"{"model":"chat","messages":[],"metadata":{"k":"0123456789"}}"#;
        // Nine values (two objects, an array, two strings and four keys) and 36 bytes of text.
        let cost = 9 * RequestLimits::DECODED_BYTES_PER_VALUE + 36;
        assert_eq!(
            check_cost(body, &limits(10, cost)),
            Ok(()),
            "exactly at the limit passes"
        );
        let err = check_cost(body, &limits(10, cost - 1)).err();
        assert_eq!(
            err.and_then(|e| e.code),
            Some("max_decoded_bytes_exceeded"),
            "one byte over is refused"
        );
    }

    #[test]
    fn a_parsed_request_is_held_to_the_same_limits() {
        let at = limits(3, usize::MAX);
        let value = |n| serde_json::from_slice::<serde_json::Value>(&messages(n)).expect("JSON");
        assert!(
            check_value_cost(&value(3), &at).is_ok(),
            "three messages fit a cap of three"
        );
        let err = check_value_cost(&value(4), &at).err();
        assert_eq!(err.and_then(|e| e.code), Some("max_messages_exceeded"));
        let big = serde_json::json!({"model": "chat", "messages": [], "metadata": {"k": "x".repeat(100)}});
        let err = check_value_cost(&big, &limits(10, 50)).err();
        assert_eq!(err.and_then(|e| e.code), Some("max_decoded_bytes_exceeded"));
    }

    #[test]
    fn only_top_level_messages_and_system_count_as_messages() {
        let nested = br#"{"model":"chat","messages":[{"role":"user","content":[1,2,3,4,5]}],"tools":[1,2,3,4]}"#;
        assert_eq!(
            check_cost(nested, &limits(1, usize::MAX)),
            Ok(()),
            "parts and tools are not messages"
        );
        let system =
            br#"{"model":"chat","system":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"messages":[]}"#;
        assert!(
            check_cost(system, &limits(1, usize::MAX)).is_err(),
            "system blocks count"
        );
    }

    #[test]
    fn a_body_skipped_as_short_could_not_have_reached_a_limit() {
        // The densest bodies there are: one-byte messages, empty strings, empty keys.
        let list = |item: &str, n: usize| vec![item; n].join(",");
        let bodies = [
            format!(r#"{{"messages":[{}]}}"#, list("0", 500)),
            format!("[{}]", list(r#""""#, 500)),
            format!("{{{}}}", list(r#""":0"#, 500)),
            format!("[{}]", list("[]", 500)),
            format!(r#"{{"system":[{}],"messages":[{}]}}"#, list("0", 300), list("0", 300)),
        ];
        for body in bodies {
            let len = body.len();
            let tightest = limits(len.div_ceil(2), len * RequestLimits::DECODED_BYTES_PER_VALUE);
            assert!(within_limits_unread(len, &tightest));
            assert_eq!(walk(body.as_bytes(), &tightest), Ok(()), "{len} bytes: the walk agrees");
            let messages = limits(len.div_ceil(2) - 1, usize::MAX);
            let decoded = limits(usize::MAX, len * RequestLimits::DECODED_BYTES_PER_VALUE - 1);
            assert!(!within_limits_unread(len, &messages) && !within_limits_unread(len, &decoded));
        }
        let defaults = RequestLimits::default();
        assert!(within_limits_unread(4095, &defaults), "a 4 KiB request is not walked");
        assert!(
            !within_limits_unread(4097, &defaults),
            "past 2,048 possible messages it is"
        );
    }

    #[test]
    fn a_body_that_is_not_json_is_left_to_the_decoder() {
        assert_eq!(
            check_cost(b"{not json", &limits(1, 1024)),
            Ok(()),
            "the decoder reports it"
        );
        assert_eq!(check_cost(b"", &limits(1, 1024)), Ok(()), "empty body too");
    }

    #[test]
    fn only_json_content_types_are_read() {
        let with = |t: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(t));
            h
        };
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/vnd.api+json",
        ] {
            assert!(require_json(&with(ok)).is_ok(), "{ok} is JSON");
        }
        assert!(
            require_json(&HeaderMap::new()).is_ok(),
            "no content-type is read as JSON"
        );
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ] {
            let err = require_json(&with(bad)).err();
            assert_eq!(err.map(|e| e.status), Some(415), "{bad} is a 415");
        }
    }
}
