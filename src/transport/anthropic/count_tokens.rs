//! `POST /v1/messages/count_tokens`: a Messages request's input tokens, by tailcut's own
//! estimate, with no upstream asked and no model run.
//!
//! The body is a Messages request without `max_tokens` (model, messages, system, tools,
//! tool_choice; anything else is read as `/v1/messages` reads it, `thinking` ignored). The
//! answer is `{"input_tokens": N}` with `x-tailcut-estimate: true`: the router's estimate for a
//! route without a known tokenizer (four bytes of text a token plus 10%, and a fixed overhead
//! per request, message, tool and image; `router::PromptSize`), not Anthropic's count. Asking
//! the model's upstream for its exact count is future work.
//!
//! Access is that of `/v1/messages`: with `[auth]` a missing or wrong key is a 401, another
//! tenant a 403, a model off the key's list a 403; then an unknown model is a 404. Counting
//! takes nothing from the key's rpm, tpm or streams, and no stream slot.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Serialize;
use serde_json::value::RawValue;

use super::{decode_request, error_response, with_anthropic_id};
use crate::gateway::GatewayError;
use crate::router::{Counter, PromptSize};
use crate::transport::body::{check_cost, require_json};
use crate::transport::chat::unreadable_header;
use crate::transport::decode_error::DecodeError;
use crate::transport::error::{insert, ErrorReply};
use crate::transport::sse_out::{json_response, to_json};
use crate::transport::AppState;
use crate::types::{ChatRequest, Dialect, RequestCtx};

#[derive(Serialize)]
struct Count {
    input_tokens: u64,
}

pub async fn count_tokens(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refused) = unreadable_header(&headers) {
        return error_response(&refused, &RequestCtx::new(Dialect::Anthropic).request_id);
    }
    let mut ctx = match RequestCtx::from_headers(&headers, Dialect::Anthropic) {
        Ok(ctx) => ctx,
        Err(e) => {
            let request_id = RequestCtx::new(Dialect::Anthropic).request_id;
            return error_response(&ErrorReply::from_gateway(&e), &request_id);
        }
    };
    match count(&state, &headers, &body, &mut ctx) {
        Ok(input_tokens) => {
            let mut headers = with_anthropic_id(HeaderMap::new(), &ctx.request_id);
            insert(&mut headers, "x-request-id", &ctx.request_id);
            insert(&mut headers, "x-tailcut-estimate", "true");
            json_response(200, headers, to_json(&Count { input_tokens }))
        }
        Err(e) => error_response(&e, &ctx.request_id),
    }
}

/// The steps in order: the caller, the body, the key's models, the model itself, the estimate.
fn count(state: &AppState, headers: &HeaderMap, body: &[u8], ctx: &mut RequestCtx) -> Result<u64, ErrorReply> {
    let caller = state
        .access
        .authorize(headers, None, ctx)
        .map_err(|refusal| refusal.reply())?;
    require_json(headers)?;
    check_cost(body, &state.config.server.request_limits)?;
    let req = decode(body)?;
    caller.check_model(&req.model).map_err(|refusal| refusal.reply())?;
    if !state.config.models.contains_key(&req.model) {
        return Err(ErrorReply::from_gateway(&GatewayError::UnknownModel {
            model: req.model,
            known: state.config.models.keys().cloned().collect(),
        }));
    }
    Ok(estimate(&req))
}

/// The Messages decoder requires `max_tokens`, which this endpoint does not take: the body is
/// decoded with it set to 1 (any the client sent is dropped), and nothing reads it. Each field
/// stays the client's JSON text, so the decoder's errors name the field as `/v1/messages` does.
fn decode(body: &[u8]) -> Result<ChatRequest, DecodeError> {
    DecodeError::require_object(body)?;
    let mut fields: BTreeMap<String, Box<RawValue>> = match serde_json::from_slice(body) {
        Ok(fields) => fields,
        // Not one JSON object: the decoder says what is wrong, in `/v1/messages`' words.
        Err(e) => return Err(decode_request(body).err().unwrap_or_else(|| DecodeError::from_json(e))),
    };
    let one = serde_json::value::to_raw_value(&1u32).map_err(DecodeError::from_json)?;
    fields.insert("max_tokens".to_string(), one);
    let body = serde_json::to_vec(&fields).map_err(DecodeError::from_json)?;
    decode_request(&body)
}

/// The input tokens of `req` by the router's estimate (`router::tokens`).
fn estimate(req: &ChatRequest) -> u64 {
    PromptSize::new(req).measure(Counter::Estimate, 0).0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decoded(v: serde_json::Value) -> Result<ChatRequest, DecodeError> {
        decode(v.to_string().as_bytes())
    }

    #[test]
    fn a_messages_request_without_max_tokens_decodes() {
        let req =
            decoded(json!({"model": "chat", "system": "be brief", "messages": [{"role": "user", "content": "hi"}]}))
                .expect("no max_tokens needed");
        assert_eq!(req.model, "chat", "model");
        assert_eq!(req.messages.len(), 2, "the system prompt and the turn");
        let req = decoded(json!({"model": "chat", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}));
        assert!(req.is_ok(), "a max_tokens sent anyway is not read: {req:?}");
    }

    #[test]
    fn a_bad_body_is_refused_naming_the_field_as_the_messages_decoder_does() {
        let e =
            decoded(json!({"model": "chat", "messages": [{"role": "user", "content": 5}]})).expect_err("bad content");
        assert_eq!(e.param.as_deref(), Some("messages.0.content"), "{e:?}");
        let e = decoded(json!({"model": "chat"})).expect_err("no messages");
        assert_eq!(e.param.as_deref(), Some("messages"), "{e:?}");
        let e = decode(b"{nope").expect_err("not JSON");
        assert!(e.message.contains("not valid JSON"), "{e:?}");
        let e = decode(b"[1]").expect_err("not an object");
        assert_eq!(e.message, "the request body must be a JSON object", "{e:?}");
    }

    #[test]
    fn the_estimate_is_the_routers_and_grows_with_the_prompt() {
        let req = |text: &str| {
            decoded(json!({"model": "chat", "messages": [{"role": "user", "content": text}]})).expect("decodes")
        };
        // 4,000 bytes: 1,000 tokens + 10%, plus 3 for the request and 4 for the message.
        assert_eq!(
            estimate(&req(&"x".repeat(4_000))),
            1_107,
            "four bytes a token + 10% + overhead"
        );
        let tools = decoded(json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]}))
        .expect("decodes");
        assert!(estimate(&tools) > estimate(&req("hi")), "tools count");
    }
}
