//! A stored stream event as one WebSocket message: the same JSON, under the socket's own id
//! for the request, with its `seq`.

use crate::transport::replay::Event;

/// `{"type":T,"id":<local id>, ...the event's fields..., "seq":N}`.
///
/// A stored event is the compact JSON of a `ServerMessage`, which serde writes tag first
/// and then `id` (the stream's request id) as the first field. That prefix is swapped for
/// the local id and `seq` appended, with no reparse; should the prefix ever differ, the
/// JSON is parsed and rewritten instead.
pub fn sequenced(local_id: &str, request_id: &str, seq: u64, event: &Event) -> String {
    let json = String::from_utf8_lossy(&event.json);
    let quoted = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    let prefix = format!("{{\"type\":\"{}\",\"id\":{}", event.name, quoted(request_id));
    match json
        .strip_prefix(prefix.as_str())
        .and_then(|rest| rest.strip_suffix('}'))
    {
        Some(rest) => format!(
            "{{\"type\":\"{}\",\"id\":{}{rest},\"seq\":{seq}}}",
            event.name,
            quoted(local_id)
        ),
        None => reparsed(local_id, seq, &json),
    }
}

fn reparsed(local_id: &str, seq: u64, json: &str) -> String {
    let mut value: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    if let Some(obj) = value.as_object_mut() {
        obj.insert("id".into(), local_id.into());
        obj.insert("seq".into(), seq.into());
    }
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::native::ServerMessage;
    use serde_json::{json, Value};

    fn stored(m: &ServerMessage) -> Event {
        Event {
            name: m.name(),
            terminal: m.is_terminal(),
            json: m.to_json().into(),
        }
    }

    #[test]
    fn the_local_id_replaces_the_request_id_and_seq_is_added() {
        let m = ServerMessage::Delta {
            id: "req_9".into(),
            text: "he said \"hi\"".into(),
        };
        let text = sequenced("my \"id\"", "req_9", 12, &stored(&m));
        let v: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(
            v,
            json!({"type": "delta", "id": "my \"id\"", "text": "he said \"hi\"", "seq": 12}),
            "same fields, local id, seq"
        );
    }

    #[test]
    fn an_unexpected_shape_is_rewritten_by_parsing() {
        let event = Event {
            name: "delta",
            terminal: false,
            json: br#"{"text":"x","type":"delta","id":"req_1"}"#.to_vec().into(),
        };
        let v: Value = serde_json::from_str(&sequenced("c1", "req_1", 3, &event)).expect("JSON");
        assert_eq!(
            v,
            json!({"type": "delta", "id": "c1", "text": "x", "seq": 3}),
            "still right"
        );
    }
}
