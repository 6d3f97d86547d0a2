//! Keeping a request body's top-level fields as the client sent them (`types::Verbatim`): one
//! pass that copies each value's text and parses none of it.

use std::fmt;
use std::sync::Arc;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use axum::http::HeaderMap;

use crate::types::{ChatRequest, RawJson, Verbatim, Wire};

/// The body's fields in its order. A field sent twice keeps its last value, in the place of
/// its first (as the typed decode, which reads the last, sees it).
pub fn from_body(wire: Wire, body: &[u8]) -> Option<Arc<Verbatim>> {
    let fields = serde_json::from_slice::<Ordered>(body).ok()?.0;
    Some(Arc::new(Verbatim {
        wire,
        fields,
        headers: Vec::new(),
    }))
}

/// The fields of a request that arrived inside another JSON message (WebSocket, query string).
pub fn from_value(wire: Wire, object: &Map<String, Value>) -> Option<Arc<Verbatim>> {
    let fields = object
        .iter()
        .map(|(k, v)| {
            Some((
                Box::from(k.as_str()),
                RawJson::new(serde_json::value::to_raw_value(v).ok()?),
            ))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Arc::new(Verbatim {
        wire,
        fields,
        headers: Vec::new(),
    }))
}

/// Keeps the wire's own `names` headers (lowercase, as sent) with the request's fields.
pub fn keep_headers(req: &mut ChatRequest, headers: &HeaderMap, names: &[&'static str]) {
    let Some(verbatim) = req.verbatim.as_mut().and_then(Arc::get_mut) else {
        return;
    };
    for &name in names {
        let values: Vec<&str> = headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).collect();
        if !values.is_empty() {
            verbatim.headers.push((name, values.join(",").into_boxed_str()));
        }
    }
}

struct Ordered(Vec<(Box<str>, RawJson)>);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(OrderedVisitor)
    }
}

struct OrderedVisitor;

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = Ordered;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
        let mut fields: Vec<(Box<str>, RawJson)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = RawJson::new(map.next_value::<Box<RawValue>>()?);
            match fields.iter_mut().find(|(k, _)| **k == *key) {
                Some(slot) => slot.1 = value,
                None => fields.push((key.into_boxed_str(), value)),
            }
        }
        Ok(Ordered(fields))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_keep_their_order_and_their_bytes() {
        let body = br#"{"zeta": 1.50, "model":"m" ,"alpha": {"b": [1, 2],  "a": "\u00e9"}}"#;
        let v = from_body(Wire::OpenAi, body).expect("an object");
        let got: Vec<(&str, &str)> = v.fields.iter().map(|(k, v)| (&**k, v.text())).collect();
        assert_eq!(
            got,
            [
                ("zeta", "1.50"),
                ("model", "\"m\""),
                ("alpha", r#"{"b": [1, 2],  "a": "\u00e9"}"#)
            ]
        );
    }

    #[test]
    fn a_repeated_field_keeps_its_last_value() {
        let v = from_body(Wire::Anthropic, br#"{"a": 1, "b": 2, "a": 3}"#).expect("an object");
        let got: Vec<(&str, &str)> = v.fields.iter().map(|(k, v)| (&**k, v.text())).collect();
        assert_eq!(got, [("a", "3"), ("b", "2")]);
    }

    #[test]
    fn a_body_that_is_not_an_object_keeps_nothing() {
        assert!(from_body(Wire::OpenAi, b"[1]").is_none());
    }
}
