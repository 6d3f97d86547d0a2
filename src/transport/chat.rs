//! The steps every HTTP chat endpoint takes, in order, before its dialect renders the
//! answer: request context, the drain check, access (key or token), decoding, the stream
//! gate, the key's limits, the gateway call, the pump.

use crate::server::ConnHandle;
use std::future::Future;
use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::Response;
use tokio::sync::OwnedSemaphorePermit;

use super::drain::RETRY_AFTER;
use super::error::ErrorReply;
use crate::transport::AppState;
use crate::types::{ChatRequest, Dialect, ErrorClass, EventStream, Priority, RequestCtx};

/// Refuses an `x-tailcut-*` header it cannot read, builds the `RequestCtx` from the headers,
/// refuses new requests while draining (503 with Retry-After, code `draining`), checks the
/// caller's key or token (`auth`; `query_token` only where browsers cannot send headers), runs
/// `prepare` (decode the request, adjust the context, and say how the answer is to be sent),
/// bounds what its tool schemas cost to compile (`transport::tool_cost`), takes a slot at the
/// stream gate for the request's final priority (none left → busy), admits it against the
/// key's models and limits, calls the gateway, and hands its events, driven by a pump
/// (`transport::pump`), to `reply`. Every failure before that is an HTTP error rendered by
/// `error_response`.
///
/// The slot travels with the pump, which releases it at `max_stream_ms`, at the drain's cut,
/// or once the client has taken no event for `client_write_timeout_ms`, even when the client
/// does not read; the permit `reply` is handed holds nothing (the dialects' signature predates
/// the pump).
pub(crate) async fn serve_chat<How, Reply, Replied>(
    state: &AppState,
    asker: Asker<'_>,
    dialect: Dialect,
    error_response: fn(&ErrorReply, &str) -> Response,
    prepare: impl FnOnce(&mut RequestCtx) -> Result<(ChatRequest, How), ErrorReply>,
    reply: Reply,
) -> Response
where
    Reply: FnOnce(EventStream, How, OwnedSemaphorePermit) -> Replied,
    Replied: Future<Output = Response>,
{
    // Boxed, and freed once the stream is open: everything up to the gateway's call (the
    // request, its context, the admission) is needed only until then, and inline it would
    // size the handler's future, which every held stream keeps until its first token.
    let opened = Box::pin(open(state, asker, dialect, error_response, prepare)).await;
    match opened {
        Ok((events, how, no_permit)) => reply(events, how, no_permit).await,
        Err(response) => response,
    }
}

/// `serve_chat` up to the open stream: its events driven by a pump, how to reply, and the
/// permit `reply` is handed; or the HTTP error.
async fn open<How>(
    state: &AppState,
    Asker {
        headers,
        query_token,
        conn,
    }: Asker<'_>,
    dialect: Dialect,
    error_response: fn(&ErrorReply, &str) -> Response,
    prepare: impl FnOnce(&mut RequestCtx) -> Result<(ChatRequest, How), ErrorReply>,
) -> Result<(EventStream, How, OwnedSemaphorePermit), Response> {
    if let Some(refused) = unreadable_header(headers) {
        return Err(error_response(&refused, &RequestCtx::new(dialect).request_id));
    }
    let mut ctx = match RequestCtx::from_headers(headers, dialect) {
        Ok(ctx) => ctx,
        Err(e) => {
            return Err(error_response(
                &ErrorReply::from_gateway(&e),
                &RequestCtx::new(dialect).request_id,
            ))
        }
    };
    if state.drain.is_draining() {
        return Err(error_response(&draining(), &ctx.request_id));
    }
    let caller = match state.access.authorize(headers, query_token, &mut ctx) {
        Ok(caller) => caller,
        Err(refusal) => return Err(error_response(&refusal.reply(), &ctx.request_id)),
    };
    let (req, how) = match prepare(&mut ctx) {
        Ok(prepared) => prepared,
        Err(e) => return Err(error_response(&e, &ctx.request_id)),
    };
    if let Err(e) = super::tool_cost::check(&req, ctx.dialect) {
        return Err(error_response(&e.into(), &ctx.request_id));
    }
    // `prepare` may have set the priority (native options): cap it by the key again, and by
    // the tenant as the gateway will, so the gate sees the priority the request really has.
    if let Err(refusal) = caller.bind(&mut ctx) {
        return Err(error_response(&refusal.reply(), &ctx.request_id));
    }
    let Some(slot) = state.gate.try_enter(gate_priority(state, &ctx)) else {
        return Err(error_response(&ErrorReply::busy(), &ctx.request_id));
    };
    let admission = match caller.admit(&req, &mut ctx).await {
        Ok(admission) => admission,
        Err(refusal) => return Err(error_response(&refusal.reply(), &ctx.request_id)),
    };
    // Zero permits: cannot fail unless the semaphore were closed, which it never is.
    let Ok(no_permit) = Arc::clone(&state.streams).try_acquire_many_owned(0) else {
        return Err(error_response(&ErrorReply::busy(), &ctx.request_id));
    };
    let request_id = ctx.request_id.clone();
    match state.gateway.chat(req, ctx) {
        Ok(events) => {
            let events = state.pumps.pump(
                admission.guard(events),
                slot,
                state.config.server.max_stream,
                state.config.server.client_write_timeout,
                conn,
            );
            Ok((events, how, no_permit))
        }
        Err(e) => Err(error_response(&ErrorReply::from_gateway(&e), &request_id)),
    }
}

/// Who asks: the request's headers, its `?token=` where browsers cannot send headers, and
/// its connection (closed when the stream's client stops reading: `pump`).
pub(crate) struct Asker<'a> {
    pub headers: &'a HeaderMap,
    pub query_token: Option<&'a str>,
    pub conn: Option<ConnHandle>,
}

impl<'a> Asker<'a> {
    pub fn new(headers: &'a HeaderMap, conn: Option<axum::Extension<ConnHandle>>) -> Self {
        Asker {
            headers,
            query_token: None,
            conn: conn.map(|axum::Extension(conn)| conn),
        }
    }
}

/// A 400 naming the first `x-tailcut-*` header whose value is not visible ASCII.
/// `RequestCtx::from_headers` reads such a value as absent, and a header that narrows a
/// request (`x-tailcut-region`, `x-tailcut-tenant`) or steers it would then silently not.
pub(crate) fn unreadable_header(headers: &HeaderMap) -> Option<ErrorReply> {
    let (name, _) = headers
        .iter()
        .find(|(name, value)| name.as_str().starts_with("x-tailcut-") && value.to_str().is_err())?;
    Some(ErrorReply {
        param: Some(name.to_string()),
        ..ErrorReply::bad_request(format!("{name} must be visible ASCII text"))
    })
}

/// The request's priority after its tenant's cap (the gateway applies the same cap later).
pub(crate) fn gate_priority(state: &AppState, ctx: &RequestCtx) -> Priority {
    let cap = ctx
        .tenant
        .as_deref()
        .and_then(|t| state.config.tenant(t))
        .and_then(|t| t.priority);
    cap.map_or(ctx.priority, |cap| ctx.priority.min(cap))
}

/// The refusal while shutting down: a 503 any SDK retries, on another instance.
pub(crate) fn draining() -> ErrorReply {
    ErrorReply {
        status: ErrorClass::Draining.http_status(),
        class: ErrorClass::Draining,
        code: Some("draining"),
        retry_after: Some(RETRY_AFTER),
        ..ErrorReply::bad_request("tailcut is shutting down (draining); retry the request")
    }
}
