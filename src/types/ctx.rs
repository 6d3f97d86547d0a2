//! `RequestCtx`: everything about a request that is not the chat itself (its id, dialect,
//! deadline, priority, session, region, tenant, task, client key), read by every layer below
//! the edge.

use std::time::Duration;

use super::ResponseType;

/// Which client dialect a request arrived in; decides what the mux may tell the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
    /// WebSocket and the native SSE dialect: can express `reset` and `route_switch`.
    Native,
}

impl Dialect {
    /// Can this dialect tell a client to discard what it has (a `Reset` event)?
    pub fn can_reset(self) -> bool {
        matches!(self, Dialect::Native)
    }

    /// The wire this dialect's clients write, whose answer extras (`types::Extra`) they take;
    /// `None` for the native dialect, which is no provider's.
    pub fn wire(self) -> Option<super::Wire> {
        match self {
            Dialect::OpenAi => Some(super::Wire::OpenAi),
            Dialect::Anthropic => Some(super::Wire::Anthropic),
            Dialect::Native => None,
        }
    }
}

/// Request priority for admission: interactive traffic is shed last.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Batch,
    #[default]
    Interactive,
}

/// Everything about a request that is not the chat itself.
#[derive(Debug, Clone)]
pub struct RequestCtx {
    pub request_id: String,
    pub dialect: Dialect,
    /// `x-tailcut-hedge: off`.
    pub hedge_off: bool,
    /// `x-tailcut-response-type` override.
    pub response_type: Option<ResponseType>,
    /// `x-tailcut-deadline-ms`.
    pub deadline: Option<Duration>,
    /// `x-tailcut-priority`.
    pub priority: Priority,
    /// `x-tailcut-session`: route lease key.
    pub session: Option<String>,
    /// `x-tailcut-region`: only routes in this region are eligible.
    pub region: Option<String>,
    /// `x-tailcut-tenant`: a `[tenants.*]` entry whose rules and defaults apply.
    pub tenant: Option<String>,
    /// `x-tailcut-task`: the task type the quality floor is checked for.
    pub task: Option<String>,
    /// With `[auth]`: the name of the client key the request came with (directly or through
    /// a token minted with it); never the key itself. Its tenant is in `tenant`.
    pub key: Option<String>,
}

impl RequestCtx {
    pub fn new(dialect: Dialect) -> Self {
        RequestCtx {
            request_id: new_request_id(),
            dialect,
            hedge_off: false,
            response_type: None,
            deadline: None,
            priority: Priority::Interactive,
            session: None,
            region: None,
            tenant: None,
            task: None,
            key: None,
        }
    }
}

/// The longest client `x-request-id` taken.
pub const MAX_CLIENT_REQUEST_ID: usize = 128;

/// A client's `x-request-id` when it is usable as ours (trimmed, 1 to
/// `MAX_CLIENT_REQUEST_ID` characters of ASCII letters, digits and `-_.:`): it goes into
/// response ids (`chatcmpl-…`, `msg_…`), headers and logs, where a space, a quote or a
/// control character would surprise a client's parser or a log reader. Anything else gets a
/// fresh id.
pub fn usable_request_id(value: &str) -> Option<&str> {
    let id = value.trim();
    let fits = !id.is_empty()
        && id.len() <= MAX_CLIENT_REQUEST_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    fits.then_some(id)
}

fn new_request_id() -> String {
    format!("req_{}", uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_client_request_ids_are_taken() {
        assert_eq!(usable_request_id(" abc-1_2.3:4 "), Some("abc-1_2.3:4"), "trimmed");
        for bad in ["", "   ", "abc def", "a\"b", "a<b>", "é", &"x".repeat(129)] {
            assert_eq!(usable_request_id(bad), None, "{bad:?}");
        }
        assert!(usable_request_id(&"x".repeat(128)).is_some(), "128 characters fit");
    }
}
