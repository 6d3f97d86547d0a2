//! tailcut: a streaming-first LLM edge server.
//!
//! Clients (chat frontends over WebSocket, browsers over SSE, the official OpenAI and
//! Anthropic SDKs) send a chat request; tailcut streams it to one of several LLM routes
//! (provider + model + region), hedges to a second route when the first is slow to its
//! first token, applies a per-response-type policy when a stream dies mid-answer, never
//! forwards a partial tool call, and says in every response which route served it.
//!
//! # The flow
//!
//! ```text
//! client ─► transport ─► gateway ─► router ─► mux ─► provider ─► upstream
//!           (dialect ->   (one       (which    (race, hedge,  (wire format ->
//!            ChatRequest)  entry)     routes)   commit, policy) Delta)
//!    ◄──────────── StreamEvent stream, pulled by the transport ◄──────────────
//! ```
//!
//! The client's response body polls the gateway's stream (through the transport's pump),
//! which polls the mux, which polls its attempts: no task of its own per stream. One
//! watchdog for the whole server ends a stream whose client stopped reading, or whose
//! `max_stream_ms` or drain cut came. Dropping the client's stream drops every attempt and
//! closes every upstream connection.
//!
//! # Layout
//!
//! In pipeline order:
//! - [`server`]: the HTTP server (edge limits, middleware order, graceful drain).
//! - [`transport`]: client dialects (OpenAI SSE/JSON, Anthropic, WebSocket), who may call
//!   them (client keys, browser tokens, per-key limits) and ops routes.
//! - [`gateway`]: the one transport-agnostic entry point, `ChatRequest -> EventStream`.
//! - [`router`]: pure, synchronous route planning over a snapshot of config, health and the
//!   session's lease, which the gateway takes first.
//! - [`mux`]: attempts, the hedge race, the commit point, mid-stream policies, tool calls.
//! - [`provider`]: upstream adapters (OpenAI, Anthropic) and error classification.
//! - [`health`]: per-route TTFT windows, breakers, admission, and the session lease table;
//!   written by the mux, copied by the gateway for the router.
//! - [`sim`]: the simulated upstream, a real HTTP server driven by explicit scenarios.
//! - [`config`], [`types`], [`telemetry`]: the TOML contract; the
//!   nouns more than one layer uses (the request and its context, the plan, the error class,
//!   the mid-stream policy, the prefill convention, the events, the envelope, the state
//!   hash); metrics, and the rotation metrics with their help text.
//!
//! Every import points down this list: no module imports one above it, and `types` imports
//! no layer. The simulated upstream sits at the flow's far end (it imports nothing of the
//! server's), so `config` may embed its `Scenario`.
//!
//! Outside the library: the `tailcut` binary (`src/main.rs`, a thin CLI), and the load
//! benchmarks, a workspace crate of their own (`bench/`, the `tailcut-bench` binary) that
//! drives [`server`] and [`sim`] through this public API.

pub mod config;
pub mod eval;
pub mod gateway;
pub mod health;
pub mod mux;
pub mod provider;
pub mod router;
pub mod server;
pub mod shared;
pub mod sim;
pub mod telemetry;
pub mod transport;
pub mod types;
