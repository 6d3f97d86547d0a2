//! Client-facing transports: each dialect decodes its request into a `ChatRequest`, calls
//! the gateway, and renders the `StreamEvent` stream back in its own wire format.
//!
//! Every chat endpoint follows the same steps: build the `RequestCtx` from the headers,
//! decode the body, take a slot at the stream gate (none left for its priority → 503 with
//! `retry-after: 1`), call the gateway, wait for the first event. `Error` first means nothing was committed: the
//! client gets a real HTTP status. `Start` first commits: response headers go out with
//! the envelope, and the rest of the stream is mapped to frames as the client reads them.
//! The response body polls the event stream through its pump (`pump`), which the server's
//! one watchdog ends from outside when the client stops reading; when the client goes away
//! the body is dropped, and with it the event stream and every upstream attempt. Resumable streams (`/v1/streams` and every
//! WebSocket request) also keep going without a reader, by design: one task per answer,
//! bounded by the replay buffer, `detached_cancel_ms` and the stream slot it holds.
//!
//! Layout:
//! - `openai`: `POST /v1/chat/completions`, `GET /v1/models`, `GET /v1/models/{id}`
//!   (request decoding, chunks).
//! - `anthropic`: `POST /v1/messages` (request decoding, named events), and
//!   `POST /v1/messages/count_tokens` (tailcut's own estimate; no upstream is asked).
//! - `ws`: `GET /v1/ws`, many requests multiplexed per socket (docs/ws-protocol.md).
//! - `native_sse`: `POST|GET /v1/stream`, the native events over SSE for browsers.
//! - `native`: the native messages shared by `ws` and `native_sse`.
//! - `streams`, `replay`: resumable streams (`/v1/streams`), each answer driven by its own
//!   task into a bounded replay buffer, read over SSE or the WebSocket (docs/streams.md).
//! - `chat`: the steps before the answer that every HTTP chat endpoint shares.
//! - `pump`: the stream a body reads, which owns its slot and upstream, and the watchdog
//!   that makes `max_stream_ms`, the stall and the drain's cut hold for a client that does
//!   not read.
//! - `drain`: the shutdown signal (begun, cut) and the in-band `draining` error.
//! - `body`: what a chat body must be before decoding (JSON, within the cost limits).
//! - `tool_cost`: what a decoded request's tool schemas may cost to compile.
//! - `ranges`: sampling parameters checked against the ranges the real APIs accept.
//! - `events`: the commit point, and draining a stream for non-streaming replies.
//! - `sse_out`: frames, keep-alive, commit headers, the streaming response.
//! - `error`: errors as clients see them, rendered by each dialect.
//! - `cors`: which browser origins may call (the allowlist, refusals, preflights).
//! - `auth`: client keys, browser tokens (`POST /v1/tokens`), per-key limits, the admin token.
//! - `ops`: health, readiness and metrics routes (mounted by the server).

pub mod anthropic;
pub mod auth;
pub mod body;
mod chat;
pub mod cors;
pub mod decode_error;
pub mod drain;
pub mod error;
pub mod events;
pub mod native;
pub mod native_sse;
pub mod openai;
pub mod ops;
pub mod pump;
pub mod ranges;
pub mod replay;
pub mod sse_out;
mod state;
pub mod streams;
pub mod tool_cost;
mod verbatim;
pub mod ws;

use axum::routing::{any, delete, get, post};
use axum::Router;

pub use state::{AppState, StreamGate, StreamSlot};

/// The chat endpoints of every dialect.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/models", get(openai::list_models))
        // Model names are config keys and may hold `/` (`meta/llama-3`): the rest of the path.
        .route("/v1/models/{*id}", get(openai::get_model))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/ws", any(ws::upgrade))
        .route("/v1/stream", post(native_sse::post_stream).get(native_sse::get_stream))
        .route("/v1/tokens", post(auth::mint))
        .route("/v1/streams", post(streams::open_stream))
        .route("/v1/streams/{id}/events", get(streams::read_events))
        .route("/v1/streams/{id}", delete(streams::delete_stream))
}
