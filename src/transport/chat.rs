//! The steps every HTTP chat endpoint takes, in order, before its dialect renders the
//! answer: request context, access (key or token), stream permit, decoding, the key's
//! limits, the gateway call.

use std::future::Future;

use axum::http::HeaderMap;
use axum::response::Response;
use tokio::sync::OwnedSemaphorePermit;

use super::error::ErrorReply;
use crate::transport::AppState;
use crate::types::{ChatRequest, Dialect, EventStream, RequestCtx};

/// Builds the `RequestCtx` from the headers, checks the caller's key or token (`auth`;
/// `query_token` only where browsers cannot send headers), takes a stream permit (none left
/// → busy), runs `prepare` (decode the request, adjust the context, and say how the answer
/// is to be sent), admits it against the key's models and limits, calls the gateway, and
/// hands its events and the permit to `reply`. Every failure before that is an HTTP error
/// rendered by `error_response`.
pub(crate) async fn serve_chat<How, Reply, Replied>(
    state: &AppState,
    headers: &HeaderMap,
    query_token: Option<&str>,
    dialect: Dialect,
    error_response: fn(&ErrorReply, &str) -> Response,
    prepare: impl FnOnce(&mut RequestCtx) -> Result<(ChatRequest, How), ErrorReply>,
    reply: Reply,
) -> Response
where
    Reply: FnOnce(EventStream, How, OwnedSemaphorePermit) -> Replied,
    Replied: Future<Output = Response>,
{
    let mut ctx = match RequestCtx::from_headers(headers, dialect) {
        Ok(ctx) => ctx,
        Err(e) => return error_response(&ErrorReply::from_gateway(&e), &RequestCtx::new(dialect).request_id),
    };
    let caller = match state.access.authorize(headers, query_token, &mut ctx) {
        Ok(caller) => caller,
        Err(refusal) => return error_response(&refusal.reply(), &ctx.request_id),
    };
    let Ok(permit) = state.streams.clone().try_acquire_owned() else {
        return error_response(&ErrorReply::busy(), &ctx.request_id);
    };
    let (req, how) = match prepare(&mut ctx) {
        Ok(prepared) => prepared,
        Err(e) => return error_response(&e, &ctx.request_id),
    };
    let admission = match caller.admit(&req, &mut ctx) {
        Ok(admission) => admission,
        Err(refusal) => return error_response(&refusal.reply(), &ctx.request_id),
    };
    let request_id = ctx.request_id.clone();
    match state.gateway.chat(req, ctx) {
        Ok(events) => reply(admission.guard(events), how, permit).await,
        Err(e) => error_response(&ErrorReply::from_gateway(&e), &request_id),
    }
}
