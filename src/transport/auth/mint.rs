//! `POST /v1/tokens`: an API key mints a short-lived browser token bound to its tenant and to
//! models within its own. A token cannot mint tokens. Body `{"ttl_s": 600, "models": [...]}`
//! (both optional), answer `{"token", "expires_at"}` (Unix seconds); errors in the OpenAI
//! error shape.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::{Deserialize, Serialize};

use super::token::{Claims, DEFAULT_TTL, MAX_TTL};
use super::{refused, Access, Refusal, Via};
use crate::transport::error::insert;
use crate::transport::sse_out::{json_response, to_json};
use crate::transport::AppState;
use crate::types::{Dialect, RequestCtx};

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct MintRequest {
    ttl_s: Option<u64>,
    models: Option<Vec<String>>,
}

#[derive(Debug, Serialize)]
pub struct Minted {
    pub token: String,
    /// Unix seconds.
    pub expires_at: u64,
}

pub async fn mint(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let mut ctx = match RequestCtx::from_headers(&headers, Dialect::OpenAi) {
        Ok(ctx) => ctx,
        Err(_) => RequestCtx::new(Dialect::OpenAi),
    };
    match state.access.mint(&headers, &body, &mut ctx) {
        Ok(minted) => {
            let mut out = HeaderMap::new();
            insert(&mut out, "x-request-id", &ctx.request_id);
            // The body is a credential: no cache may keep it.
            insert(&mut out, "cache-control", "no-store");
            json_response(200, out, to_json(&minted))
        }
        Err(refusal) => {
            refused(&refusal, ctx.key.as_deref());
            crate::transport::openai::error_response(&refusal.reply(), &ctx.request_id)
        }
    }
}

impl Access {
    /// Checks the key, reads the body, and signs the token.
    pub fn mint(&self, headers: &HeaderMap, body: &[u8], ctx: &mut RequestCtx) -> Result<Minted, Refusal> {
        if !self.is_on() {
            return Err(Refusal::TokensOff(self.tokens_off));
        }
        let caller = self.caller(headers, None)?;
        caller.bind(ctx)?;
        if caller.via() == Some(Via::Token) {
            return Err(Refusal::TokenMints);
        }
        let Some(authed) = &caller.authed else {
            return Err(Refusal::MissingKey);
        };
        if self.signer.is_none() {
            return Err(Refusal::TokensOff(self.tokens_off));
        }
        // serde would read the struct from an array of its fields too (`[600, ["chat"]]`).
        crate::transport::decode_error::DecodeError::require_object(body)
            .map_err(|_| Refusal::BadMint("invalid token request: the body must be a JSON object".into()))?;
        let asked: MintRequest = if body.iter().all(u8::is_ascii_whitespace) {
            MintRequest::default()
        } else {
            serde_json::from_slice(body).map_err(|e| {
                Refusal::BadMint(format!(
                    "invalid token request: {}",
                    crate::transport::decode_error::plain_json_error(&e)
                ))
            })?
        };
        let ttl = match asked.ttl_s {
            None => DEFAULT_TTL,
            Some(s) if (1..=MAX_TTL.as_secs()).contains(&s) => Duration::from_secs(s),
            Some(_) => {
                return Err(Refusal::BadMint(format!(
                    "ttl_s must be between 1 and {} seconds",
                    MAX_TTL.as_secs()
                )))
            }
        };
        let models = match asked.models {
            None => authed.key.config.models.clone(),
            Some(list) if list.is_empty() => {
                return Err(Refusal::BadMint(
                    "models must list at least one model (leave it out for all of the key's)".into(),
                ))
            }
            Some(list) => {
                // In the order, and with the answers, of a chat request for the model: a
                // key's list refuses first (403), then a model that does not exist (404).
                for m in &list {
                    if !caller.may_use(m) {
                        return Err(Refusal::Model(m.clone()));
                    }
                    if !self.models.contains(m) {
                        return Err(Refusal::UnknownModel {
                            model: m.clone(),
                            known: self.models.iter().cloned().collect(),
                        });
                    }
                }
                Some(list)
            }
        };
        let expires_at = self.clock.now_unix() + ttl.as_secs();
        let claims = Claims {
            key: authed.key.config.name.clone(),
            tenant: authed.key.config.tenant.clone(),
            models,
            exp: expires_at,
            key_fp: super::token::key_fingerprint(&authed.key.config.sha256),
        };
        let token = self.sign(&claims).ok_or(Refusal::TokensOff(self.tokens_off))?;
        tracing::info!(key = %claims.key, ttl_s = ttl.as_secs(), "browser token minted");
        Ok(Minted { token, expires_at })
    }
}
