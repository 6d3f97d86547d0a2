//! A request head moved out of the connection's read buffer: its header values and URI copied
//! into one allocation of their own, so what the request keeps does not pin the buffer.
//!
//! hyper parses an HTTP/1 head in place: every header value and the URI are slices of the
//! connection's 8 KiB read buffer. While any of them lives (a handler's `HeaderMap`, a held
//! stream's context), hyper cannot reuse that buffer for its next read and allocates another
//! 8 KiB: a held stream paid for two read buffers. One copy of the head's bytes (a few hundred
//! bytes, one allocation) frees the buffer as soon as hyper has parsed it.

use axum::http::request::Parts;
use axum::http::{HeaderValue, Uri};
use bytes::{Bytes, BytesMut};

/// Re-points `parts`' header values and URI at one fresh copy of their bytes.
pub fn unshare(parts: &mut Parts) {
    let uri = parts.uri.path_and_query().map_or("", |pq| pq.as_str());
    let values: usize = parts.headers.values().map(HeaderValue::len).sum();
    if values == 0 && uri.is_empty() {
        return;
    }
    let mut copy = BytesMut::with_capacity(values + uri.len());
    for value in parts.headers.values() {
        copy.extend_from_slice(value.as_bytes());
    }
    let uri_at = copy.len();
    copy.extend_from_slice(uri.as_bytes());
    let copy: Bytes = copy.freeze();
    let mut at = 0;
    for value in parts.headers.values_mut() {
        let n = value.len();
        // The bytes were a valid value a moment ago; were one refused, it keeps its old bytes.
        if let Ok(mut fresh) = HeaderValue::from_maybe_shared(copy.slice(at..at + n)) {
            fresh.set_sensitive(value.is_sensitive());
            *value = fresh;
        }
        at += n;
    }
    // An origin-form URI (the path and query, as HTTP/1 sends it) is re-parsed from the copy;
    // one with a scheme or authority (HTTP/2, absolute-form) keeps its own.
    if parts.uri.scheme().is_none() && parts.uri.authority().is_none() && uri_at < copy.len() {
        if let Ok(fresh) = Uri::from_maybe_shared(copy.slice(uri_at..)) {
            parts.uri = fresh;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;

    /// A head whose values and URI are slices of `buffer`, as hyper parses one.
    fn head_in(buffer: &Bytes) -> Parts {
        let text = std::str::from_utf8(buffer).expect("ASCII");
        let slice = |s: &str| {
            let at = text.find(s).expect("in the buffer");
            buffer.slice(at..at + s.len())
        };
        let (mut parts, ()) = Request::new(()).into_parts();
        parts.uri = Uri::from_maybe_shared(slice("/v1/chat/completions?x=1")).expect("uri");
        for (name, value) in [
            ("host", "127.0.0.1:8080"),
            ("authorization", "Bearer k"),
            ("x-request-id", "rid-1"),
        ] {
            let mut value = HeaderValue::from_maybe_shared(slice(value)).expect("value");
            value.set_sensitive(name == "authorization");
            parts.headers.append(name, value);
        }
        parts
            .headers
            .append("accept", HeaderValue::from_static("text/event-stream"));
        parts
    }

    #[test]
    fn the_head_no_longer_holds_the_read_buffer_and_says_the_same() {
        let buffer = Bytes::from(
            b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:8080\r\nauthorization: Bearer k\r\nx-request-id: rid-1\r\n\r\n"
                .to_vec(),
        );
        let mut parts = head_in(&buffer);
        assert!(!buffer.is_unique(), "the parsed head shares the buffer");
        let uri = parts.uri.to_string();
        unshare(&mut parts);
        assert!(buffer.is_unique(), "nothing in the head points into the buffer");
        assert_eq!(parts.uri.to_string(), uri, "the same URI");
        assert_eq!(parts.headers["host"], "127.0.0.1:8080");
        assert_eq!(parts.headers["x-request-id"], "rid-1");
        assert_eq!(
            parts.headers["accept"], "text/event-stream",
            "a static value is copied too"
        );
        assert!(parts.headers["authorization"].is_sensitive(), "sensitivity is kept");
        assert!(!parts.headers["host"].is_sensitive());
    }

    #[test]
    fn an_absolute_uri_keeps_its_own_and_a_bare_head_is_unchanged() {
        let (mut parts, ()) = Request::new(()).into_parts();
        parts.uri = Uri::from_static("https://example.com/v1/models");
        parts.headers.append("host", HeaderValue::from_static("example.com"));
        unshare(&mut parts);
        assert_eq!(parts.uri, "https://example.com/v1/models");
        assert_eq!(parts.headers["host"], "example.com");
        let (mut bare, ()) = Request::new(()).into_parts();
        unshare(&mut bare);
        assert_eq!(bare.uri, "/", "the default URI, re-parsed");
    }
}
