//! The header-size limit (`server.max_header_bytes`), enforced exactly by the edge so that a
//! request over it gets the JSON 431 (`headers_too_large`) in its dialect, on HTTP/1.1 and
//! HTTP/2 alike.
//!
//! Why here and not in hyper: hyper's HTTP/1 limit is its read buffer (never below 8 KiB,
//! and it counts the request line too), and an HTTP/2 header list over h2's
//! `max_header_list_size` gets a bare 431 from h2 and a reset stream; neither can answer in
//! the project's error envelope. So the protocol limits are set above the configured one
//! (`protocol_limit`), and this check, the edge's first step, applies the configured one.
//!
//! What counts: each header field as HTTP/1.1 writes it, `name: value` and its CRLF
//! (`field_bytes`), summed over the request's headers. The request line, HTTP/2
//! pseudo-headers and HPACK's per-entry overhead do not count, so one request is measured the
//! same over either protocol.

use axum::http::HeaderMap;

/// The bytes of one header field as an HTTP/1.1 line: `name`, `": "`, `value`, CRLF.
fn field_bytes(name: &str, value: &[u8]) -> usize {
    name.len() + value.len() + 4
}

/// The size of `headers` as HTTP/1.1 field lines.
pub fn header_block_bytes(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(name, value)| field_bytes(name.as_str(), value.as_bytes()))
        .sum()
}

/// Whether `headers` are over `max_header_bytes`.
pub fn over_limit(headers: &HeaderMap, max_header_bytes: usize) -> bool {
    header_block_bytes(headers) > max_header_bytes
}

/// The limit handed to hyper (HTTP/1's read buffer) and h2 (`max_header_list_size`) for a
/// configured `max_header_bytes` and `max_headers`: room for the request line (or HTTP/2's
/// pseudo-headers, an 8 KiB URI included) and for HPACK's 32 bytes per entry beyond the
/// configured limit, so a head just over it reaches the edge, which answers the JSON 431
/// instead of the protocol's bare one. A head far over it (past twice the limit) is still
/// refused by the protocol layer before it is buffered whole.
pub fn protocol_limit(max_header_bytes: usize, max_headers: usize) -> usize {
    max_header_bytes
        .saturating_mul(2)
        .saturating_add(max_headers.saturating_mul(32))
        .saturating_add(8 * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(fields: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in fields {
            map.append(*name, HeaderValue::from_str(value).expect("a valid test value"));
        }
        map
    }

    #[test]
    fn the_block_counts_each_field_as_an_http1_line() {
        // "host: a\r\n" is 9 bytes, "x-b: cc\r\n" 9.
        let h = headers(&[("host", "a"), ("x-b", "cc")]);
        assert_eq!(header_block_bytes(&h), 18, "name, colon and space, value, CRLF");
    }

    #[test]
    fn a_block_of_exactly_the_limit_passes_and_one_byte_more_does_not() {
        let h = headers(&[("x-pad", &"p".repeat(91))]);
        assert_eq!(header_block_bytes(&h), 100);
        assert!(!over_limit(&h, 100), "at the limit");
        assert!(over_limit(&h, 99), "one byte over");
    }

    #[test]
    fn repeated_fields_each_count() {
        let h = headers(&[("x-a", "1"), ("x-a", "2")]);
        assert_eq!(header_block_bytes(&h), 16, "two lines of 8 bytes");
    }

    #[test]
    fn the_protocol_limit_leaves_room_above_the_configured_one() {
        let limit = protocol_limit(4096, 100);
        assert!(limit >= 2 * 4096 + 100 * 32, "{limit}");
        assert_eq!(protocol_limit(usize::MAX, usize::MAX), usize::MAX, "saturates");
    }
}
