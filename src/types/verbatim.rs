//! What a request keeps of the client's own JSON, so that a route speaking the client's wire
//! receives it unchanged: the top-level fields as they were sent, and each message's own JSON.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// A wire format: the dialect a client's body is written in, or the one a route speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Wire {
    /// OpenAI Chat Completions (also every OpenAI-compatible server).
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
}

impl Wire {
    pub fn as_str(self) -> &'static str {
        match self {
            Wire::OpenAi => "openai",
            Wire::Anthropic => "anthropic",
        }
    }
}

/// One JSON value exactly as the client sent it (its bytes, whitespace included). Shared, so a
/// request cloned for a retry or a repair copies no text.
#[derive(Debug, Clone)]
pub struct RawJson(Arc<RawValue>);

impl RawJson {
    pub fn new(raw: Box<RawValue>) -> Self {
        RawJson(Arc::from(raw))
    }

    pub fn raw(&self) -> &RawValue {
        &self.0
    }

    pub fn text(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

/// The client's top-level fields, in the order it sent them, each value as sent. A route of
/// the same wire receives every one of them except the fields tailcut owns for that wire
/// (the adapter's list: `model`, `messages`, `stream`, token limits, ...); a route of another
/// wire gets the typed view, and the fields it has no rule for are dropped with a note or
/// make it ineligible (`router::fidelity`).
#[derive(Debug, Clone, PartialEq)]
pub struct Verbatim {
    pub wire: Wire,
    pub fields: Vec<(Box<str>, RawJson)>,
    /// The wire's own request headers that change what the body means (Anthropic's
    /// `anthropic-beta`), by lowercase name: a route of the same wire receives them.
    pub headers: Vec<(&'static str, Box<str>)>,
}

impl Verbatim {
    pub fn field(&self, name: &str) -> Option<&RawJson> {
        self.fields.iter().find(|(k, _)| &**k == name).map(|(_, v)| v)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| &**v)
    }
}

/// A message's own JSON, when it came from a client.
#[derive(Debug, Clone, PartialEq)]
pub enum MessageJson {
    /// The message as sent: an OpenAI message object; an Anthropic turn (for a system
    /// message, the body's `system` value).
    Own(Wire, RawJson),
    /// One of the messages an Anthropic turn was split into (its tool results, the text
    /// around them), after the first: the turn is written once, with the first.
    SameTurn,
}

impl MessageJson {
    /// The message's JSON when it was written in `wire`.
    pub fn in_wire(&self, wire: Wire) -> Option<&RawJson> {
        match self {
            MessageJson::Own(w, raw) if *w == wire => Some(raw),
            _ => None,
        }
    }

    /// The wire the message was written in (`None` for `SameTurn`).
    pub fn wire(&self) -> Option<Wire> {
        match self {
            MessageJson::Own(w, _) => Some(*w),
            MessageJson::SameTurn => None,
        }
    }
}
