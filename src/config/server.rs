//! `[server]`, as validated: the listener, the edge's limits and timeouts, the WebSocket
//! settings, the request cost bounds and the resumable streams (`[server.streams]`).

use std::net::SocketAddr;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// How long in-flight streams may run after the drain grace before they are cut.
    pub drain: Duration,
    /// After SIGTERM, how long the listener stays open (new chat requests get 503 with
    /// Retry-After) so load balancers see `/readyz` fail before connections are refused.
    pub drain_grace: Duration,
    /// Counted from accept: a connection that has not sent a whole request head by then is
    /// closed (whatever it sent: nothing, part of a request line, part of the HTTP/2 preface).
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed (HTTP/1.1 keep-alive
    /// and HTTP/2 alike).
    pub idle_timeout: Duration,
    /// The whole request body must arrive within this, or the request gets a 408.
    pub body_read_timeout: Duration,
    /// A client socket that accepts no byte for this long is disconnected.
    pub client_write_timeout: Duration,
    /// The share of `max_streams` batch requests may hold, so interactive ones always have room.
    pub batch_max_share: f64,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub max_body_bytes: usize,
    /// The most a non-streaming answer (text and tool calls) may gather before it is refused:
    /// an upstream that ignores `max_tokens` must not cost its whole answer in memory.
    pub max_answer_bytes: usize,
    pub max_connections: usize,
    pub max_streams: usize,
    /// SSE `: ping` comment interval.
    pub sse_keepalive: Duration,
    /// `[server.cors] allowed_origins`, each normalized as a browser sends it
    /// (`scheme://host[:port]`, lowercase, no default port): the browser origins allowed to
    /// call the API and open WebSockets (`transport::cors` adds the loopback ones).
    pub cors_allowed_origins: Vec<String>,
    pub ws_max_message_bytes: usize,
    pub ws_buffer_bytes: usize,
    /// Outgoing WS messages queued per socket before a non-reading client is disconnected.
    pub ws_send_queue: usize,
    pub ws_ping_interval: Duration,
    /// Name of the env var holding the bearer token for `/admin` writes (and, with `[auth]`,
    /// for every `/admin` route and `/metrics`).
    pub admin_token_env: Option<String>,
    /// Serve a non-loopback address with no `[auth]` (anyone reaching it spends the keys).
    pub allow_unauthenticated: bool,
    /// With `[auth]`, serve `/metrics` without the admin token.
    pub metrics_public: bool,
    /// Default deadline per logical request: it bounds the time to every first token (the
    /// first attempt's, failovers', hedges' and mid-stream recoveries'). It is also the most a
    /// client may ask for with `x-tailcut-deadline-ms`.
    pub deadline: Duration,
    /// The longest a single answer may stream once committed; past it, the answer ends as
    /// truncated without blaming the route.
    pub max_stream: Duration,
    /// `[server.streams]`: the registry of resumable streams and their replay buffers.
    pub streams: StreamsConfig,
    /// What decoding one chat request body may cost (`max_messages`, `max_decoded_bytes`).
    pub request_limits: RequestLimits,
}

/// Bounds on what one chat request costs to decode, checked before it is decoded, so a
/// small body cannot grow into a large tree (`[server] max_messages`, `max_decoded_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Messages in one request (`messages`, plus Anthropic's `system` blocks).
    pub max_messages: usize,
    /// The request's size once decoded: the bytes of every string (keys included) plus
    /// `DECODED_BYTES_PER_VALUE` for every JSON value.
    pub max_decoded_bytes: usize,
}

impl RequestLimits {
    /// What one JSON value (object, array, string, number, ...) is counted as, besides its
    /// text: about what a decoded `serde_json::Value` and its map entry take.
    pub const DECODED_BYTES_PER_VALUE: usize = 64;
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_messages: 2048,
            max_decoded_bytes: 8 * 1024 * 1024,
        }
    }
}

/// `[server.streams]`: bounds and timers of resumable streams (`transport::streams`).
#[derive(Debug, Clone, PartialEq)]
pub struct StreamsConfig {
    /// Streams the registry holds at once (running or finished-and-kept); beyond, 503.
    pub max_open: usize,
    /// Events one stream's replay buffer retains; older ones are dropped.
    pub max_events: usize,
    /// Bytes (serialized events) one stream's replay buffer retains; older ones are dropped.
    pub max_bytes: usize,
    /// How long a finished stream stays readable (then 410).
    pub keep_after_done: Duration,
    /// A running stream with no reader for this long is cancelled.
    pub detached_cancel: Duration,
    /// The `retry:` hint sent to EventSource readers.
    pub retry: Duration,
}
