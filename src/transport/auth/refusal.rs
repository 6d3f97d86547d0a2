//! `Refusal`: why access was refused (401, 403, 429, or a 400 for a request no limit can
//! ever admit), turned into the `ErrorReply` every dialect renders in its own error body.
//! Messages never hold the credential.

use std::time::Duration;

use super::limits::{Exceeded, Limit};
use crate::transport::error::ErrorReply;
use crate::types::{Envelope, ErrorClass, ErrorEvent, EventStream, Level, StreamEvent};

/// Why a request was not let in.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("missing API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`")]
    MissingKey,
    /// A header that is not text, or a key that matches no `[[auth.keys]]` hash.
    #[error("invalid API key")]
    BadKey,
    /// Not signed by this server, damaged, or minted with a key that is gone.
    #[error("invalid token")]
    BadToken,
    #[error("token expired; mint a new one (POST /v1/tokens)")]
    ExpiredToken,
    #[error("API keys are not accepted in URLs; pass a token from POST /v1/tokens as ?token=")]
    KeyInUrl,
    /// `x-tailcut-tenant` names another tenant, or none that exists: the same refusal, so
    /// tenant names cannot be probed.
    #[error("this key may not act for the tenant named in x-tailcut-tenant")]
    Tenant,
    #[error("this key may not use the model {0:?}")]
    Model(String),
    /// Worded and answered (404) as a chat request for the model is.
    #[error("unknown model {model:?}; known models: {}", known.join(", "))]
    UnknownModel { model: String, known: Vec<String> },
    #[error("this key's {} limit ({per_minute} per minute) is reached; retry in {} ms", limit.as_str(), wait.as_millis())]
    RateLimited {
        limit: Limit,
        per_minute: u32,
        wait: Duration,
    },
    #[error("this request alone counts about {cost} tokens (input estimate plus max_tokens), more than this key's tpm of {tpm}: lower max_tokens or shorten it")]
    TooLarge { cost: u64, tpm: u32 },
    #[error("this key already has {0} answers streaming (its max_streams); retry when one ends")]
    Streams(u32),
    #[error("a token cannot mint tokens; use an API key")]
    TokenMints,
    #[error("browser tokens are off: {0}")]
    TokensOff(&'static str),
    #[error("{0}")]
    BadMint(String),
    /// A credential header sent more than once (`Authorization`, `x-api-key`): refused as a
    /// repeated `x-tailcut-*` header is.
    #[error("{0} may be sent only once")]
    Repeated(&'static str),
}

impl Refusal {
    pub fn class(&self) -> ErrorClass {
        match self {
            Refusal::MissingKey | Refusal::BadKey | Refusal::BadToken | Refusal::ExpiredToken | Refusal::KeyInUrl => {
                ErrorClass::Unauthenticated
            }
            Refusal::Tenant | Refusal::Model(_) | Refusal::TokenMints | Refusal::TokensOff(_) => ErrorClass::Forbidden,
            Refusal::RateLimited { .. } | Refusal::Streams(_) => ErrorClass::RateLimited,
            Refusal::TooLarge { .. } | Refusal::UnknownModel { .. } | Refusal::BadMint(_) | Refusal::Repeated(_) => {
                ErrorClass::BadRequest
            }
        }
    }

    pub fn status(&self) -> u16 {
        match self {
            // As OpenAI and Anthropic answer it, and tailcut's chat endpoints.
            Refusal::UnknownModel { .. } => 404,
            _ => self.class().http_status(),
        }
    }

    /// The more specific code OpenAI clients read (`error.code`), and the metric label.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::MissingKey => "missing_api_key",
            Refusal::BadKey | Refusal::KeyInUrl => "invalid_api_key",
            Refusal::BadToken => "invalid_token",
            Refusal::ExpiredToken => "token_expired",
            Refusal::Tenant => "tenant_forbidden",
            Refusal::Model(_) => "model_forbidden",
            Refusal::UnknownModel { .. } => "model_not_found",
            Refusal::RateLimited { limit: Limit::Rpm, .. } => "rpm_exceeded",
            Refusal::RateLimited { limit: Limit::Tpm, .. } => "tpm_exceeded",
            Refusal::TooLarge { .. } => "request_exceeds_tpm",
            Refusal::Streams(_) => "max_streams_exceeded",
            Refusal::TokenMints => "token_cannot_mint",
            Refusal::TokensOff(_) => "tokens_off",
            Refusal::BadMint(_) | Refusal::Repeated(_) => "bad_request",
        }
    }

    pub fn metric_label(&self) -> &'static str {
        self.code()
    }

    /// How long to wait before the same request can pass; `None` when waiting cannot help.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Refusal::RateLimited { wait, .. } => Some(*wait),
            // Nothing says when a stream will end; a second is a short, honest guess.
            Refusal::Streams(_) => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    pub fn reply(&self) -> ErrorReply {
        ErrorReply {
            status: self.status(),
            class: self.class(),
            message: self.to_string(),
            retry_after: self.retry_after(),
            param: match self {
                Refusal::Model(_) | Refusal::UnknownModel { .. } => Some("model".to_string()),
                Refusal::Repeated(name) => Some((*name).to_string()),
                _ => None,
            },
            code: Some(self.code()),
            envelope: None,
        }
    }

    /// The refusal as an answer stream that ends at once with its error: how a WebSocket
    /// session, which renders every request's outcome from its events, tells the client.
    pub fn into_events(self, request_id: String) -> EventStream {
        let event = StreamEvent::Error(Box::new(ErrorEvent {
            class: self.class(),
            status: self.status(),
            message: self.to_string(),
            retry_after: self.retry_after(),
            code: Some(self.code()),
            envelope: Envelope {
                request_id,
                level: Level::L4,
                ..Envelope::default()
            },
        }));
        Box::pin(futures::stream::iter([event]))
    }
}

impl From<Exceeded> for Refusal {
    fn from(e: Exceeded) -> Self {
        match e {
            Exceeded::Wait {
                limit,
                per_minute,
                wait,
            } => Refusal::RateLimited {
                limit,
                per_minute,
                wait,
            },
            Exceeded::TooLarge { cost, tpm } => Refusal::TooLarge { cost, tpm },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refusal_told_in_the_stream_carries_its_code_as_over_http() {
        // The WebSocket's two-step admission (shared limits) refuses after `accepted`, in
        // the answer's stream: the error message there has the code HTTP gives.
        use futures::StreamExt;
        let refusals = [
            (Refusal::Streams(2), "max_streams_exceeded"),
            (
                Refusal::RateLimited {
                    limit: Limit::Rpm,
                    per_minute: 4,
                    wait: Duration::from_secs(9),
                },
                "rpm_exceeded",
            ),
        ];
        for (refusal, code) in refusals {
            let mut events = refusal.into_events("req-1".into());
            let Some(StreamEvent::Error(e)) = events.next().await else {
                panic!("a refusal is one error event");
            };
            let message = crate::transport::native::ServerMessage::from_error_event(Some("c1".into()), *e);
            let json = serde_json::to_value(&message).expect("serializes");
            assert_eq!(json["code"], code, "{json}");
        }
    }

    #[test]
    fn each_refusal_has_its_status_and_retry_hint() {
        let cases = [
            (Refusal::MissingKey, 401, None),
            (Refusal::BadKey, 401, None),
            (Refusal::ExpiredToken, 401, None),
            (Refusal::KeyInUrl, 401, None),
            (Refusal::Tenant, 403, None),
            (Refusal::Model("chat".into()), 403, None),
            (Refusal::TokenMints, 403, None),
            (
                Refusal::RateLimited {
                    limit: Limit::Rpm,
                    per_minute: 2,
                    wait: Duration::from_secs(30),
                },
                429,
                Some(Duration::from_secs(30)),
            ),
            (Refusal::Streams(2), 429, Some(Duration::from_secs(1))),
            (Refusal::TooLarge { cost: 9, tpm: 1 }, 400, None),
            (Refusal::Repeated("authorization"), 400, None),
            (
                Refusal::UnknownModel {
                    model: "gpt-9".into(),
                    known: vec!["chat".into()],
                },
                404,
                None,
            ),
        ];
        for (refusal, status, wait) in cases {
            let reply = refusal.reply();
            assert_eq!(reply.status, status, "{refusal:?}");
            assert_eq!(reply.retry_after, wait, "{refusal:?}");
            assert_eq!(reply.code, Some(refusal.code()), "{refusal:?}");
        }
    }
}
