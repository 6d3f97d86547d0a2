//! The WebSocket protocol's client messages (`chat`, `cancel`, `resume`): parsing one text frame into
//! a message, or into an error that names the request id when the frame had one.

use serde_json::Value;

use crate::transport::native::ChatOptions;

/// Longest client-chosen request id accepted.
pub const MAX_ID_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq)]
pub enum ClientMessage {
    /// Start a request; `request` is an OpenAI-style chat body. With `session`, its
    /// messages are the new turn and the session's history is projected in before them.
    Chat {
        id: String,
        request: Value,
        options: ChatOptions,
        session: Option<String>,
    },
    /// Stop a request at once.
    Cancel { id: String },
    /// Continue a registered stream under the socket-local `id`, from after seq `after`.
    Resume {
        id: String,
        stream: String,
        token: String,
        after: u64,
    },
}

/// A frame that is not a valid client message. The socket stays open.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ProtocolError {
    /// The frame's `id`, when it had a usable one, so the client can correlate the error.
    pub id: Option<String>,
    pub message: String,
}

impl ProtocolError {
    fn new(id: Option<&str>, message: impl Into<String>) -> Self {
        ProtocolError {
            id: id.map(str::to_string),
            message: message.into(),
        }
    }
}

pub fn parse(text: &str) -> Result<ClientMessage, ProtocolError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| ProtocolError::new(None, format!("the message is not valid JSON: {e}")))?;
    let Value::Object(mut obj) = value else {
        return Err(ProtocolError::new(
            None,
            "the message must be a JSON object with a \"type\"",
        ));
    };
    let id = match obj.get("id") {
        Some(Value::String(id)) if !id.is_empty() && id.len() <= MAX_ID_LEN => Some(id.clone()),
        Some(_) => {
            return Err(ProtocolError::new(
                None,
                format!("\"id\" must be a non-empty string of at most {MAX_ID_LEN} bytes"),
            ))
        }
        None => None,
    };
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or_default().to_string();
    let need_id = || {
        id.clone()
            .ok_or_else(|| ProtocolError::new(None, format!("a {kind:?} message needs an \"id\"")))
    };
    match kind.as_str() {
        "chat" => {
            let id = need_id()?;
            let request = match obj.remove("request") {
                Some(request @ Value::Object(_)) => request,
                _ => {
                    return Err(ProtocolError::new(
                        Some(&id),
                        "a chat message needs a \"request\" object",
                    ))
                }
            };
            let options = match obj.remove("options") {
                None | Some(Value::Null) => ChatOptions::default(),
                Some(v) => serde_json::from_value(v)
                    .map_err(|e| ProtocolError::new(Some(&id), format!("invalid options: {e}")))?,
            };
            let session = match obj.remove("session") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_ID_LEN => Some(s),
                Some(_) => {
                    return Err(ProtocolError::new(
                        Some(&id),
                        format!("\"session\" must be a non-empty string of at most {MAX_ID_LEN} bytes"),
                    ))
                }
            };
            Ok(ClientMessage::Chat {
                id,
                request,
                options,
                session,
            })
        }
        "cancel" => Ok(ClientMessage::Cancel { id: need_id()? }),
        "resume" => {
            let id = need_id()?;
            let text = |key: &str| match obj.get(key) {
                Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                _ => Err(ProtocolError::new(
                    Some(&id),
                    format!("a resume message needs a non-empty string \"{key}\""),
                )),
            };
            let (stream, token) = (text("stream")?, text("token")?);
            let after = match obj.get("after") {
                None => 0,
                Some(v) => v.as_u64().ok_or_else(|| {
                    ProtocolError::new(Some(&id), "\"after\" must be a whole number (the last seq received)")
                })?,
            };
            Ok(ClientMessage::Resume {
                id,
                stream,
                token,
                after,
            })
        }
        "" => Err(ProtocolError::new(
            id.as_deref(),
            "the message has no \"type\"; expected chat, cancel or resume",
        )),
        other => Err(ProtocolError::new(
            id.as_deref(),
            format!("unknown message type {other:?}; expected chat, cancel or resume"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_message_parses_with_request_and_options() {
        let text = json!({
            "type": "chat", "id": "c1",
            "request": {"model": "chat", "messages": []},
            "options": {"hedge": false, "response_type": "voice", "deadline_ms": 900}
        })
        .to_string();
        let msg = parse(&text).expect("valid chat message");
        assert_eq!(
            msg,
            ClientMessage::Chat {
                id: "c1".into(),
                request: json!({"model": "chat", "messages": []}),
                options: ChatOptions {
                    hedge: Some(false),
                    response_type: Some("voice".into()),
                    deadline_ms: Some(900),
                    ..ChatOptions::default()
                },
                session: None,
            },
            "every part of the chat message"
        );
    }

    #[test]
    fn chat_message_may_name_a_session_for_its_history() {
        let text = json!({"type": "chat", "id": "c2", "session": "s1", "request": {"model": "chat", "messages": []}});
        let Ok(ClientMessage::Chat { session, .. }) = parse(&text.to_string()) else {
            panic!("a chat message with a session parses")
        };
        assert_eq!(session.as_deref(), Some("s1"));
        let e = parse(r#"{"type":"chat","id":"c2","session":7,"request":{}}"#).expect_err("numeric session");
        assert!(e.message.contains("session"), "names the field: {}", e.message);
    }

    #[test]
    fn cancel_message_parses() {
        let msg = parse(r#"{"type":"cancel","id":"c1"}"#);
        assert_eq!(msg, Ok(ClientMessage::Cancel { id: "c1".into() }), "cancel");
    }

    #[test]
    fn resume_message_parses_and_needs_stream_and_token() {
        let msg = parse(r#"{"type":"resume","id":"r2","stream":"st_a","token":"t","after":7}"#);
        assert_eq!(
            msg,
            Ok(ClientMessage::Resume {
                id: "r2".into(),
                stream: "st_a".into(),
                token: "t".into(),
                after: 7
            }),
            "resume"
        );
        let e = parse(r#"{"type":"resume","id":"r2","stream":"st_a"}"#).expect_err("no token");
        assert!(e.message.contains("token"), "names the field: {}", e.message);
        let e = parse(r#"{"type":"resume","id":"r2","stream":"st_a","token":"t","after":-1}"#).expect_err("bad after");
        assert!(e.message.contains("after"), "names the field: {}", e.message);
    }

    #[test]
    fn invalid_json_is_an_error_without_id() {
        let e = parse("{nope").expect_err("bad JSON");
        assert_eq!(e.id, None, "no id to report");
        assert!(e.message.contains("not valid JSON"), "message: {}", e.message);
    }

    #[test]
    fn unknown_type_is_an_error_for_that_id() {
        let e = parse(r#"{"type":"generate","id":"c7"}"#).expect_err("unknown type");
        assert_eq!(e.id.as_deref(), Some("c7"), "the error names the id");
        assert!(e.message.contains("generate"), "message names the type: {}", e.message);
    }

    #[test]
    fn chat_without_request_or_id_is_rejected() {
        let e = parse(r#"{"type":"chat","id":"c1"}"#).expect_err("no request");
        assert_eq!(e.id.as_deref(), Some("c1"), "names the id");
        let e = parse(r#"{"type":"chat","request":{}}"#).expect_err("no id");
        assert!(e.message.contains("id"), "says the id is missing: {}", e.message);
        let e = parse(r#"{"type":"chat","id":5,"request":{}}"#).expect_err("numeric id");
        assert!(e.message.contains("id"), "says the id is wrong: {}", e.message);
    }

    #[test]
    fn unknown_option_is_rejected_rather_than_ignored() {
        let e = parse(r#"{"type":"chat","id":"c1","request":{},"options":{"hedging":false}}"#).expect_err("typo");
        assert!(e.message.contains("hedging"), "names the bad option: {}", e.message);
    }
}
