//! `Thinking`: the reasoning a route streams beside its answer, and `Extra`: a field of a
//! route's answer that tailcut carries to a client of the same wire without reading it.
//!
//! Thinking is content (it commits the stream and wins a hedge race: it proves the route is
//! answering) but not answer text: the seam, the continuation prefill and the tool-call gate
//! never see it. How each dialect shows it, and what a failure inside it does, is written in
//! `docs/dialects.md` ("Thinking").

use super::verbatim::{RawJson, Wire};

/// One piece of a route's reasoning, in the order the route streamed it. (`Box<str>`, not
/// `String`: a delta is moved by value through every layer, and this keeps it two words.)
#[derive(Debug, Clone, PartialEq)]
pub enum Thinking {
    /// Reasoning text: Anthropic `thinking_delta`, an OpenAI-compatible server's
    /// `reasoning_content` or `reasoning`.
    Text(Box<str>),
    /// The signature that closes a thinking block (Anthropic `signature_delta`). Opaque: it
    /// must reach the client byte for byte, since the client sends it back with the block.
    Signature(Box<str>),
    /// A whole redacted block (Anthropic `redacted_thinking`'s `data`), as opaque.
    Redacted(Box<str>),
}

impl Thinking {
    /// Bytes this piece adds to an answer, for the bounds on what is gathered.
    pub fn len(&self) -> usize {
        match self {
            Thinking::Text(s) | Thinking::Signature(s) | Thinking::Redacted(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A field of a route's answer that no part of tailcut acts on. It reaches a client of the
/// route's wire as the route sent it, and no other client (another wire has no place for it).
#[derive(Debug, Clone, PartialEq)]
pub struct Extra {
    pub wire: Wire,
    pub field: ExtraField,
    pub value: RawJson,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ExtraField {
    /// A field the route repeats on its chunks (OpenAI `system_fingerprint`,
    /// `service_tier`): said when it changes; the latest value holds from then on.
    Chunk(&'static str),
    /// The log-probabilities of the text that follows (OpenAI `choices[0].logprobs`: its
    /// `content` and `refusal` token lists).
    Logprobs,
    /// From here on the answer's text is the route's refusal (OpenAI `delta.refusal`), said
    /// once, before its first text; the value is `true`.
    Refusal,
    /// A citation of the text that follows (Anthropic `citations_delta`'s `citation`).
    Citation,
}

impl Extra {
    pub fn len(&self) -> usize {
        self.value.text().len()
    }

    pub fn is_empty(&self) -> bool {
        self.value.text().is_empty()
    }
}
