//! The state hash: a stable hash of a request's canonical history (system, messages, tool
//! calls and tool results), the same whichever route serves and whichever dialect it came
//! in or went out in.
//!
//! # The canonical form
//! A JSON document `{"v":1,"system":S,"turns":[...]}`, serialized with sorted keys and no
//! whitespace, hashed with SHA-256; the state hash is the first 16 bytes in lowercase hex.
//! - `system`: the text of every system message in order, joined with a blank line
//!   (`"\n\n"`), as the Anthropic wire carries it.
//! - `turns`: the other messages in order. Consecutive user messages, and consecutive
//!   assistant messages, are one turn (the Anthropic wire merges them); tool results are
//!   never merged. A turn is `{"role", "text", "images", "tool_calls", "tool_call_id"}` with
//!   empty members left out:
//!   - `text`: the turn's text parts concatenated, exactly (no trimming);
//!   - `images`: the image URLs in order;
//!   - `tool_calls`: `{"id","name","arguments"}` per call the assistant made, `arguments`
//!     parsed and re-serialized with sorted keys when it is JSON, else kept as text;
//!   - `tool_call_id`: which call a tool result answers.
//!
//! Left out on purpose: the model name, tools offered, sampling, response format, the
//! message `name` field (not every wire carries it) and anything the gateway adds for an
//! attempt (a continuation's prefill is not history: the client's history is hashed).

use std::fmt;

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{ChatRequest, ContentPart, Message, Role, ToolCall};

/// Bytes of the SHA-256 digest kept in the state hash.
const HASH_BYTES: usize = 16;

/// The state hash of `req`'s history (see the module doc). The canonical JSON is written
/// straight into the digest: no `Value` of the history, no buffer of its bytes.
pub fn state_hash(req: &ChatRequest) -> String {
    let mut digest = Sha256::new();
    // Writing into a digest cannot fail, nor can serializing strings, sequences and maps
    // with string keys.
    let _ = serde_json::to_writer(&mut digest, &Canonical(&req.messages));
    hex::encode(&digest.finalize()[..HASH_BYTES])
}

/// The canonical form of a history as a JSON value: what [`state_hash`] hashes, for a
/// reader who wants to see it (the hash itself never builds it).
pub fn canonical_history(messages: &[Message]) -> Value {
    serde_json::to_value(Canonical(messages)).unwrap_or(Value::Null)
}

/// `{"v":1,"system":S,"turns":[...]}`. Every map below writes its keys in sorted order, as
/// serialising a `Value` (sorted maps) did, so the bytes match the documented form.
struct Canonical<'a>(&'a [Message]);

impl Serialize for Canonical<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(3))?;
        map.serialize_entry("system", &Streamed(SystemText(self.0)))?;
        map.serialize_entry("turns", &Turns(self.0))?;
        map.serialize_entry("v", &1u8)?;
        map.end()
    }
}

/// A string written in pieces (`collect_str`: serde_json escapes each piece as it comes,
/// which is the same as escaping the joined string, character by character).
struct Streamed<T>(T);

impl<T: fmt::Display> Serialize for Streamed<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

/// Every system message's text, in order, joined with `"\n\n"`.
struct SystemText<'a>(&'a [Message]);

impl fmt::Display for SystemText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, m) in self.0.iter().filter(|m| m.role == Role::System).enumerate() {
            if i > 0 {
                f.write_str("\n\n")?;
            }
            write_texts(f, &m.content)?;
        }
        Ok(())
    }
}

/// The text parts among `parts`, concatenated.
fn write_texts<'a>(f: &mut fmt::Formatter<'_>, parts: impl IntoIterator<Item = &'a ContentPart>) -> fmt::Result {
    for part in parts {
        if let ContentPart::Text(t) = part {
            f.write_str(t)?;
        }
    }
    Ok(())
}

/// The turns of a history (system messages left out).
struct Turns<'a>(&'a [Message]);

impl Serialize for Turns<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(None)?;
        let mut rest = self.0;
        while let Some((turn, after)) = next_turn(rest) {
            seq.serialize_element(&turn)?;
            rest = after;
        }
        seq.end()
    }
}

/// The first turn of `messages` and what follows it. A turn is the run from its first
/// non-system message up to its last member: consecutive user (or assistant) messages,
/// system messages between them skipped; a tool result is a turn alone.
fn next_turn(messages: &[Message]) -> Option<(Turn<'_>, &[Message])> {
    let start = messages.iter().position(|m| m.role != Role::System)?;
    let role = messages[start].role;
    let mut end = start + 1;
    if role != Role::Tool {
        for (i, m) in messages.iter().enumerate().skip(end) {
            if m.role == role {
                end = i + 1;
            } else if m.role != Role::System {
                break;
            }
        }
    }
    Some((Turn(&messages[start..end]), &messages[end..]))
}

/// One turn: its first message opens it (role, `tool_call_id`); system messages in the
/// slice are not members.
struct Turn<'a>(&'a [Message]);

impl<'a> Turn<'a> {
    fn members(&self) -> impl Iterator<Item = &'a Message> {
        self.0.iter().filter(|m| m.role != Role::System)
    }

    fn parts(&self) -> impl Iterator<Item = &'a ContentPart> {
        self.members().flat_map(|m| &m.content)
    }
}

impl Serialize for Turn<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Some(first) = self.0.first() else {
            return s.serialize_map(Some(0))?.end();
        };
        let role = match first.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        };
        let mut map = s.serialize_map(None)?;
        if self.parts().any(|p| matches!(p, ContentPart::ImageUrl { .. })) {
            map.serialize_entry("images", &Images(self))?;
        }
        map.serialize_entry("role", role)?;
        if self.parts().any(|p| matches!(p, ContentPart::Text(t) if !t.is_empty())) {
            map.serialize_entry("text", &Streamed(TurnText(self)))?;
        }
        if let Some(id) = &first.tool_call_id {
            map.serialize_entry("tool_call_id", id)?;
        }
        if self.members().any(|m| !m.tool_calls.is_empty()) {
            map.serialize_entry("tool_calls", &Calls(self))?;
        }
        map.end()
    }
}

struct TurnText<'t, 'a>(&'t Turn<'a>);

impl fmt::Display for TurnText<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_texts(f, self.0.parts())
    }
}

struct Images<'t, 'a>(&'t Turn<'a>);

impl Serialize for Images<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.parts().filter_map(|p| match p {
            ContentPart::ImageUrl { url } => Some(url),
            // Parts tailcut does not read (documents, thinking blocks) are not hashed.
            ContentPart::Text(_) | ContentPart::Opaque { .. } => None,
        }))
    }
}

struct Calls<'t, 'a>(&'t Turn<'a>);

impl Serialize for Calls<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.members().flat_map(|m| &m.tool_calls).map(Call))
    }
}

/// `{"arguments","id","name"}`; `arguments` parsed and re-serialized (sorted keys, no
/// whitespace) when it is JSON, else the text as it is.
struct Call<'a>(&'a ToolCall);

impl Serialize for Call<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(3))?;
        // The arguments' own `Value`: sorting an object's keys needs it whole, and parsing
        // them as today keeps every number's and escape's output the same.
        match serde_json::from_str::<Value>(&self.0.arguments) {
            Ok(parsed) => map.serialize_entry("arguments", &parsed)?,
            Err(_) => map.serialize_entry("arguments", &self.0.arguments)?,
        }
        map.serialize_entry("id", &self.0.id)?;
        map.serialize_entry("name", &self.0.name)?;
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ToolCall;

    fn req(messages: Vec<Message>) -> ChatRequest {
        ChatRequest {
            model: "chat".into(),
            messages,
            ..ChatRequest::default()
        }
    }

    fn history() -> Vec<Message> {
        let mut call = Message::text(Role::Assistant, "");
        call.tool_calls.push(ToolCall {
            index: 0,
            id: "call_1".into(),
            name: "weather".into(),
            arguments: r#"{"city": "Oslo", "unit": "c"}"#.into(),
        });
        let mut result = Message::text(Role::Tool, "4 degrees");
        result.tool_call_id = Some("call_1".into());
        vec![
            Message::text(Role::System, "Be brief."),
            Message::text(Role::User, "Weather in Oslo?"),
            call,
            result,
        ]
    }

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            index: 0,
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    fn with_calls(text: &str, calls: Vec<ToolCall>) -> Message {
        let mut m = Message::text(Role::Assistant, text);
        m.tool_calls = calls;
        m
    }

    fn result(id: Option<&str>, text: &str) -> Message {
        let mut m = Message::text(Role::Tool, text);
        m.tool_call_id = id.map(String::from);
        m
    }

    fn parts(role: Role, content: Vec<ContentPart>) -> Message {
        let mut m = Message::text(role, "");
        m.content = content;
        m
    }

    fn text(t: &str) -> ContentPart {
        ContentPart::Text(t.into())
    }

    fn image(url: &str) -> ContentPart {
        ContentPart::ImageUrl { url: url.into() }
    }

    /// Varied histories: every member of the canonical form, empty and present, merged and
    /// not, and text that JSON must escape.
    fn cases() -> Vec<(&'static str, Vec<Message>)> {
        let mut odd_user = Message::text(Role::User, "tagged");
        odd_user.tool_call_id = Some("not-a-result".into());
        vec![
            ("empty", vec![]),
            (
                "only systems",
                vec![Message::text(Role::System, "A"), Message::text(Role::System, "")],
            ),
            ("one user", vec![Message::text(Role::User, "hi")]),
            ("tool round trip", history()),
            (
                "multi-part and merged",
                vec![
                    parts(Role::User, vec![text("Look "), image("https://x/a.png"), text("here")]),
                    parts(Role::User, vec![image("data:image/png;base64,AAAA"), text("")]),
                    Message::text(Role::Assistant, "A cat."),
                    Message::text(Role::Assistant, " Two."),
                ],
            ),
            (
                "unicode and escapes",
                vec![
                    Message::text(Role::System, "Réponds en français 🇫🇷\n"),
                    Message::text(
                        Role::User,
                        "\"quoted\" \\ back\u{0}\u{1f}\t\r\n\u{7f}\u{2028}é\u{301}日本語 😀",
                    ),
                ],
            ),
            (
                "arguments of every JSON shape",
                vec![
                    Message::text(Role::User, "go"),
                    with_calls(
                        "",
                        vec![
                            call(
                                "c1",
                                "f",
                                r#"{"b": [1, 1.0, 1e3, -0, 18446744073709551616, -9223372036854775809], "a": {"z": null, "y": true}}"#,
                            ),
                            call("c2", "g", "not json {"),
                            call("c3", "h", ""),
                            call("c4", "i", r#"{"k": 1, "k": 2, "\u00e9": "\ud83d\ude00"}"#),
                            call("c5", "j", "  [ ]  "),
                            call("c6", "k", "\"a string\""),
                            call("c7", "l", "3.14159265358979323846"),
                        ],
                    ),
                    result(Some("c1"), "one"),
                    result(Some("c2"), "two"),
                    result(None, ""),
                ],
            ),
            (
                "empty turns and odd members",
                vec![
                    parts(Role::Assistant, vec![]),
                    odd_user,
                    Message::text(Role::System, "late system"),
                    Message::text(Role::User, " merged across it"),
                    with_calls("calling", vec![call("a", "one", "{}")]),
                    with_calls("", vec![call("b", "two", "[1,2]")]),
                ],
            ),
        ]
    }

    /// Today's hashes of `cases()`, pinned: clients may compute the hash themselves
    /// (docs/routing.md), so any change of output is a breaking change.
    const PINNED: &[(&str, &str)] = &[
        ("empty", "90b52605c5223482c2697767beb2398a"),
        ("only systems", "d405a1dc236e45be7e9e53f0bc87f056"),
        ("one user", "ca1afa4945b0c1fb948b5f20138b996a"),
        ("tool round trip", "e6e3717bfb366372efa73b5d991204db"),
        ("multi-part and merged", "cb4e684518e4ab84e0806a4b21a24946"),
        ("unicode and escapes", "18880b15d07534a172fc40494e4575cf"),
        ("arguments of every JSON shape", "f6b0847491b6e212938434881b1dced6"),
        ("empty turns and odd members", "916dab5cb60c625d037058c1dd48dd34"),
    ];

    #[test]
    fn the_hashes_of_varied_histories_are_pinned() {
        assert_eq!(cases().len(), PINNED.len());
        for ((name, messages), (pinned_name, pinned)) in cases().into_iter().zip(PINNED) {
            assert_eq!(name, *pinned_name);
            assert_eq!(state_hash(&req(messages)), *pinned, "{name}");
        }
    }

    #[test]
    fn the_same_history_has_the_same_hash_and_a_different_one_does_not() {
        let a = state_hash(&req(history()));
        assert_eq!(a.len(), 32, "16 bytes in hex: {a}");
        assert_eq!(a, state_hash(&req(history())), "stable");
        let mut other = history();
        other.push(Message::text(Role::User, "And tomorrow?"));
        assert_ne!(a, state_hash(&req(other)), "a new turn changes it");
        let mut changed = history();
        changed[3] = Message::text(Role::Tool, "5 degrees");
        changed[3].tool_call_id = Some("call_1".into());
        assert_ne!(a, state_hash(&req(changed)), "a tool result is history");
    }

    #[test]
    fn wire_shapes_that_carry_the_same_history_hash_the_same() {
        let base = state_hash(&req(history()));
        // Anthropic merges consecutive user messages and splits nothing else; key order and
        // whitespace of JSON arguments are not history; nor are the model and sampling.
        let mut shaped = history();
        if let Some(call) = shaped[2].tool_calls.first_mut() {
            call.arguments = r#"{"unit":"c","city":"Oslo"}"#.into();
        }
        let mut r = req(shaped);
        r.model = "other".into();
        r.sampling.temperature = Some(0.2);
        assert_eq!(base, state_hash(&r));
        let split = vec![
            Message::text(Role::User, "Weather "),
            Message::text(Role::User, "in Oslo?"),
        ];
        let joined = vec![Message::text(Role::User, "Weather in Oslo?")];
        assert_eq!(state_hash(&req(split)), state_hash(&req(joined)));
        let two_systems = vec![
            Message::text(Role::System, "A"),
            Message::text(Role::System, "B"),
            Message::text(Role::User, "hi"),
        ];
        let one_system = vec![Message::text(Role::System, "A\n\nB"), Message::text(Role::User, "hi")];
        assert_eq!(state_hash(&req(two_systems)), state_hash(&req(one_system)));
    }
}
