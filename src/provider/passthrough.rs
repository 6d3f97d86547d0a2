//! A same-wire body: a route that speaks the client's wire receives the client's own
//! top-level fields and messages byte for byte, with only the fields tailcut owns written
//! anew (each adapter lists its own) and the ones its model refuses left out.

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::value::{to_raw_value, RawValue};

use super::{ErrorClass, ProviderError};
use crate::types::{ModelRules, Verbatim};

/// One value of the body: as the client sent it, written by tailcut, or an array of both
/// (the messages).
pub(crate) enum Piece<'a> {
    Sent(&'a RawValue),
    Made(Box<RawValue>),
    Array(Vec<Piece<'a>>),
}

impl Piece<'_> {
    /// `value` written as JSON.
    pub fn made(value: &impl Serialize) -> Result<Self, ProviderError> {
        to_raw_value(value)
            .map(Piece::Made)
            .map_err(|e| ProviderError::new(ErrorClass::BadRequest, format!("the body did not serialize: {e}")))
    }
}

impl Serialize for Piece<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Piece::Sent(raw) => raw.serialize(s),
            Piece::Made(raw) => raw.serialize(s),
            Piece::Array(pieces) => {
                let mut seq = s.serialize_seq(Some(pieces.len()))?;
                for piece in pieces {
                    seq.serialize_element(piece)?;
                }
                seq.end()
            }
        }
    }
}

/// The body: the client's fields in its order, then the owned ones.
pub(crate) struct SameWire<'a> {
    fields: Vec<(&'a str, Piece<'a>)>,
}

impl<'a> SameWire<'a> {
    /// The client's fields except those in `owned` and those the route's model drops. A
    /// field it refuses is sent as the client wrote it: the route's own 400 then says so,
    /// rather than an answer that silently lacks what was asked for.
    pub fn new(verbatim: &'a Verbatim, owned: &[&[&str]], rules: &ModelRules) -> Self {
        let fields = verbatim
            .fields
            .iter()
            .filter(|(k, _)| !owned.iter().any(|list| list.contains(&&**k)) && !rules.drops(k))
            .map(|(k, v)| (&**k, Piece::Sent(v.raw())))
            .collect();
        SameWire { fields }
    }

    /// Adds an owned field.
    pub fn set(&mut self, key: &'a str, value: Piece<'a>) {
        self.fields.push((key, value));
    }
}

impl Serialize for SameWire<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.fields.len()))?;
        for (k, v) in &self.fields {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{RawJson, Wire};

    fn raw(text: &str) -> RawJson {
        RawJson::new(RawValue::from_string(text.to_string()).unwrap_or_else(|e| panic!("{e}")))
    }

    #[test]
    fn the_clients_fields_keep_their_bytes_and_owned_ones_are_rewritten() {
        let verbatim = Verbatim {
            wire: Wire::OpenAi,
            fields: vec![
                ("model".into(), raw("\"alias\"")),
                ("logit_bias".into(), raw("{\"50256\": -100}")),
                ("x".into(), raw("1.50")),
                ("temperature".into(), raw("0.2")),
            ],
            headers: Vec::new(),
        };
        let rules = ModelRules::for_model(Wire::OpenAi, "o4-mini");
        let mut body = SameWire::new(&verbatim, &[&["model"]], &rules);
        body.set("model", Piece::made(&"o4-mini").unwrap_or_else(|e| panic!("{e}")));
        let text = serde_json::to_string(&body).unwrap_or_default();
        assert_eq!(
            text, r#"{"x":1.50,"model":"o4-mini"}"#,
            "logit_bias and temperature are dropped for o4-mini"
        );
    }
}
