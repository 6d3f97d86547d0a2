//! Writing SSE to clients: exact frames, the event-to-frame pump, keep-alive while idle,
//! commit headers, and the response that holds the stream's permit until it ends.
//!
//! Frames are written by hand rather than with axum's `Event` so that each dialect's bytes
//! are exactly what its SDK expects and can be tested as strings. Every payload is compact
//! JSON, which escapes CR and LF, so a frame can never be split into extra `data:` lines
//! (T14). No frame ever carries an `id:` or `retry:` field (T13).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use serde::Serialize;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

use crate::types::{Envelope, EventStream, StreamEvent};

/// The OpenAI stream terminator. Not JSON; SDKs match it by prefix.
pub const DONE_FRAME: &[u8] = b"data: [DONE]\n\n";
/// An SSE comment: ignored by every client, keeps idle proxies from closing the stream.
pub const PING_COMMENT: &[u8] = b": ping\n\n";

/// `data: <json>\n\n`: the only frame an OpenAI SDK accepts besides `[DONE]`.
pub fn data_frame<T: Serialize>(value: &T) -> Bytes {
    // Sized for a typical chunk, so a delta's frame is written without regrowing.
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"data: ");
    write_json(&mut out, value);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// `event: <name>\ndata: <json>\n\n`: Anthropic SDKs dispatch on the event name (T13).
pub fn event_frame<T: Serialize>(name: &str, value: &T) -> Bytes {
    let mut out = Vec::with_capacity(name.len() + 64);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    write_json(&mut out, value);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// What `write_json` writes in place of a value that could not be encoded.
const UNENCODABLE: &[u8] =
    br#"{"error":{"message":"tailcut could not encode this event","type":"server_error","param":null,"code":"internal"}}"#;

fn write_json<T: Serialize>(out: &mut Vec<u8>, value: &T) {
    if serde_json::to_writer(&mut *out, value).is_err() {
        // Only a map with non-string keys can fail here; none of our types has one.
        out.extend_from_slice(UNENCODABLE);
    }
}

/// The first block of a stream's frame buffer: several deltas' frames.
const FRAMES_BLOCK: usize = 1024;
/// Room made before each frame, so a typical delta's frame is written without regrowing.
const FRAME_ROOM: usize = 256;

/// One stream's frames, written into one buffer and split off it as `Bytes`. A frame costs
/// no allocation of its own: the block is reused in place once every frame split from it
/// was written to the socket and dropped, and a new one is taken only while the socket
/// still holds earlier frames. (`data_frame` costs two: the `Vec` and the `Bytes`' shared
/// header, since the `Vec`'s length is not its capacity.) Frames are byte-for-byte those
/// of `data_frame` and `event_frame`.
#[derive(Debug, Default)]
pub struct Frames {
    buf: BytesMut,
}

impl Frames {
    fn begin(&mut self) -> &mut BytesMut {
        if self.buf.capacity() == 0 {
            self.buf = BytesMut::with_capacity(FRAMES_BLOCK);
        } else {
            self.buf.reserve(FRAME_ROOM);
        }
        &mut self.buf
    }

    fn json<T: Serialize>(&mut self, value: &T) {
        let mark = self.buf.len();
        if serde_json::to_writer((&mut self.buf).writer(), value).is_err() {
            self.buf.truncate(mark);
            self.buf.extend_from_slice(UNENCODABLE);
        }
    }

    /// `data: <json>\n\n`, as `data_frame`.
    pub fn data<T: Serialize>(&mut self, value: &T) -> Bytes {
        self.begin().extend_from_slice(b"data: ");
        self.json(value);
        self.buf.extend_from_slice(b"\n\n");
        self.buf.split().freeze()
    }

    /// `event: <name>\ndata: <json>\n\n`, as `event_frame`.
    pub fn event<T: Serialize>(&mut self, name: &str, value: &T) -> Bytes {
        let buf = self.begin();
        buf.extend_from_slice(b"event: ");
        buf.extend_from_slice(name.as_bytes());
        buf.extend_from_slice(b"\ndata: ");
        self.json(value);
        self.buf.extend_from_slice(b"\n\n");
        self.buf.split().freeze()
    }

    /// `head`, `mid`, `value` as JSON and `tail`: a frame whose bytes around one serialized
    /// value are known already.
    pub fn around_json<T: Serialize>(&mut self, head: &[u8], mid: &[u8], value: &T, tail: &[u8]) -> Bytes {
        let buf = self.begin();
        buf.extend_from_slice(head);
        buf.extend_from_slice(mid);
        self.json(value);
        self.buf.extend_from_slice(tail);
        self.buf.split().freeze()
    }

    /// A frame whose only varying part is one string: `head`, `text` as a JSON string,
    /// `tail`. For a dialect's text delta, whose bytes around the text are the same all
    /// through a stream, so only the text is encoded per event.
    pub fn around_str(&mut self, head: &[u8], text: &str, tail: &[u8]) -> Bytes {
        self.begin().extend_from_slice(head);
        self.json(&text);
        self.buf.extend_from_slice(tail);
        self.buf.split().freeze()
    }
}

/// What happens after an event was rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// The event was terminal: the response ends and the event stream is dropped.
    End,
}

/// Renders a dialect's stream: one `StreamEvent` in, zero or more frames out.
pub trait FrameEncoder: Send + 'static {
    fn encode(&mut self, event: StreamEvent, out: &mut Vec<Bytes>) -> Flow;
    /// The event stream ended without `Finish` or `Error`: say so honestly.
    fn encode_unfinished(&mut self, out: &mut Vec<Bytes>);
}

/// Pulls the gateway's events after commit and turns them into frames. Nothing is
/// spawned: dropping the returned stream drops `events`, which cancels the upstream work.
pub fn encoded<E: FrameEncoder>(
    start: Vec<Bytes>,
    mut events: EventStream,
    mut encoder: E,
) -> impl Stream<Item = Bytes> + Send + 'static {
    async_stream::stream! {
        for frame in start {
            yield frame;
        }
        let mut out = Vec::new();
        loop {
            let flow = match events.next().await {
                Some(event) => encoder.encode(event, &mut out),
                None => {
                    encoder.encode_unfinished(&mut out);
                    Flow::End
                }
            };
            for frame in out.drain(..) {
                yield frame;
            }
            if flow == Flow::End {
                break;
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// Yields `ping` whenever `inner` has been silent for `every`; ends when `inner` ends.
    pub struct KeepAlive<S> {
        #[pin]
        inner: S,
        #[pin]
        sleep: Sleep,
        every: Duration,
        ping: Bytes,
    }
}

/// The shortest keep-alive interval honoured: a zero from configuration must not turn
/// into a stream of pings.
pub const MIN_KEEPALIVE: Duration = Duration::from_millis(100);

pub fn with_keepalive<S>(inner: S, every: Duration, ping: Bytes) -> KeepAlive<S>
where
    S: Stream<Item = Bytes>,
{
    let every = every.max(MIN_KEEPALIVE);
    KeepAlive {
        inner,
        sleep: tokio::time::sleep(every),
        every,
        ping,
    }
}

impl<S: Stream<Item = Bytes>> Stream for KeepAlive<S> {
    type Item = Bytes;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let mut this = self.project();
        match this.inner.poll_next(cx) {
            Poll::Ready(Some(frame)) => {
                this.sleep.as_mut().reset(Instant::now() + *this.every);
                Poll::Ready(Some(frame))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                ready!(this.sleep.as_mut().poll(cx));
                this.sleep.as_mut().reset(Instant::now() + *this.every);
                Poll::Ready(Some(this.ping.clone()))
            }
        }
    }
}

/// The response headers tailcut adds, named once at compile time: naming them per response
/// (`HeaderName::from_static` at run time) validated each name again.
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const X_TAILCUT_ROUTE: HeaderName = HeaderName::from_static("x-tailcut-route");
const X_TAILCUT_LEVEL: HeaderName = HeaderName::from_static("x-tailcut-level");
const X_TAILCUT_HEDGED: HeaderName = HeaderName::from_static("x-tailcut-hedged");
const X_ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

/// Room for the envelope's headers, the SSE ones and a dialect's own, so none regrows the map.
const REPLY_HEADERS: usize = 12;

/// Headers that say who served the answer: sent at commit on every successful reply.
pub fn envelope_headers(envelope: &Envelope, request_id: &str) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(REPLY_HEADERS);
    if let Ok(value) = HeaderValue::from_str(request_id) {
        headers.insert(X_REQUEST_ID, value);
    }
    if let Some(Ok(route)) = envelope.route.as_deref().map(HeaderValue::from_str) {
        headers.insert(X_TAILCUT_ROUTE, route);
    }
    headers.insert(X_TAILCUT_LEVEL, HeaderValue::from_static(envelope.level.as_str()));
    headers.insert(
        X_TAILCUT_HEDGED,
        HeaderValue::from_static(if envelope.hedged { "true" } else { "false" }),
    );
    headers
}

/// The `200` streaming response: SSE headers plus `extra`, frames with keep-alive pings,
/// and the stream permit held until the body ends or the client goes away.
pub fn sse_response<S>(
    extra: HeaderMap,
    frames: S,
    keepalive: Duration,
    ping: Bytes,
    permit: OwnedSemaphorePermit,
) -> Response
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    let body = with_keepalive(frames, keepalive, ping).map(move |frame| {
        let _held = &permit;
        Ok::<_, Infallible>(frame)
    });
    let mut response = Response::new(Body::from_stream(body));
    // The map itself becomes the response's: merging it into an empty one rehashed each entry.
    let headers = response.headers_mut();
    *headers = extra;
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(X_ACCEL_BUFFERING, HeaderValue::from_static("no"));
    response
}

/// A JSON response with the given status and headers.
pub fn json_response(status: u16, headers: HeaderMap, body: Vec<u8>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut headers = headers;
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    (status, headers, body).into_response()
}

/// Serializes a reply body; see `write_json` for why this cannot really fail.
pub fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    write_json(&mut out, value);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use serde_json::json;

    #[test]
    fn data_frame_is_one_data_line_and_a_blank_line() {
        let frame = data_frame(&json!({"a": "x\r\ny"}));
        assert_eq!(
            &frame[..],
            b"data: {\"a\":\"x\\r\\ny\"}\n\n",
            "compact JSON with CR/LF escaped, no event: or id: line"
        );
    }

    #[test]
    fn event_frame_names_the_event_before_its_data() {
        let frame = event_frame("ping", &json!({"type": "ping"}));
        assert_eq!(
            &frame[..],
            b"event: ping\ndata: {\"type\":\"ping\"}\n\n",
            "event line then data line"
        );
    }

    #[test]
    fn frames_are_the_bytes_of_data_frame_and_event_frame() {
        let mut frames = Frames::default();
        let value = json!({"a": "x\r\ny", "b": [1, 2], "c": "é\u{1}\""});
        assert_eq!(frames.data(&value), data_frame(&value), "data frame");
        assert_eq!(frames.event("ping", &value), event_frame("ping", &value), "event frame");
        let long = json!({"text": "w".repeat(5000)});
        assert_eq!(frames.data(&long), data_frame(&long), "a frame larger than the block");
        assert_eq!(
            &frames.around_str(b"<", "a\"b\n", b">")[..],
            b"<\"a\\\"b\\n\">",
            "the string JSON-escaped between its parts"
        );
    }

    #[test]
    fn frames_reuse_their_block_once_the_earlier_frames_are_dropped() {
        let mut frames = Frames::default();
        let first = frames.data(&json!({"content": "hello"}));
        let block = first.as_ptr() as usize;
        let mut end = block + first.len();
        drop(first);
        let mut advanced = 0;
        for i in 0..200 {
            let frame = frames.data(&json!({"content": "hello", "i": i}));
            let at = frame.as_ptr() as usize;
            // Each frame follows the one before in the block, or the block is taken again
            // from its start; never a new allocation (which a freed-and-reused `Vec` would
            // also pass for, were it not for `advanced`).
            assert!(at == end || at == block, "frame {i} was written into a new allocation");
            advanced += usize::from(at == end);
            end = at + frame.len();
        }
        assert!(
            advanced > 100,
            "frames share the block: {advanced} of 200 followed the one before"
        );
        // While a frame is still held, the next ones go to a new block; nothing is overwritten.
        let held: Vec<Bytes> = (0..20).map(|i| frames.data(&json!({"i": i}))).collect();
        for (i, frame) in held.iter().enumerate() {
            assert_eq!(frame, &data_frame(&json!({"i": i})), "held frame {i} intact");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn keepalive_pings_while_the_stream_is_idle() {
        let idle = stream::pending::<Bytes>();
        let mut s = Box::pin(with_keepalive(
            idle,
            Duration::from_secs(15),
            Bytes::from_static(PING_COMMENT),
        ));
        let started = Instant::now();
        let first = s.next().await;
        assert_eq!(
            first.as_deref(),
            Some(PING_COMMENT),
            "an idle stream gets a ping comment"
        );
        assert_eq!(started.elapsed(), Duration::from_secs(15), "after exactly one interval");
        let second = s.next().await;
        assert_eq!(second.as_deref(), Some(PING_COMMENT), "and again every interval");
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(30),
            "the timer re-arms after a ping"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_keepalive_interval_is_floored_not_a_ping_storm() {
        let mut s = Box::pin(with_keepalive(
            stream::pending::<Bytes>(),
            Duration::ZERO,
            Bytes::from_static(PING_COMMENT),
        ));
        let started = Instant::now();
        s.next().await;
        assert_eq!(
            started.elapsed(),
            MIN_KEEPALIVE,
            "the first ping waits the minimum interval"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn keepalive_passes_frames_through_and_ends_with_the_stream() {
        let frames = stream::iter(vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
        let out: Vec<Bytes> = with_keepalive(frames, Duration::from_secs(1), Bytes::from_static(PING_COMMENT))
            .collect()
            .await;
        assert_eq!(
            out,
            vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")],
            "no pings between ready frames"
        );
    }

    #[test]
    fn envelope_headers_name_route_level_and_hedge() {
        let env = Envelope {
            route: Some("openai-eu".into()),
            hedged: true,
            ..Envelope::default()
        };
        let h = envelope_headers(&env, "req_9");
        let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
        assert_eq!(get("x-tailcut-route").as_deref(), Some("openai-eu"), "route header");
        assert_eq!(get("x-tailcut-level").as_deref(), Some("L0"), "level header");
        assert_eq!(get("x-tailcut-hedged").as_deref(), Some("true"), "hedged header");
        assert_eq!(get("x-request-id").as_deref(), Some("req_9"), "request id header");
    }
}
