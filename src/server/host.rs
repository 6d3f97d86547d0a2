//! The Host rule of RFC 9112 §3.2: an HTTP/1.1 request without a Host header, or any request
//! with more than one, is refused with a 400 (`bad_host`) before anything reads it.
//!
//! Why: the edge routes nothing by host, but what sits in front of it (a CDN, a load balancer)
//! may, and two Host lines are read differently by different parsers, the start of a request
//! smuggled past a front proxy's rules. hyper passes both cases through. HTTP/2 and HTTP/1.0
//! requests may go without one (`:authority`, or the older protocol's rule).

use axum::http::{header, HeaderMap, Version};

/// The number of Host header lines `headers` has when `version` refuses it, `None` when the
/// request may go on.
pub fn refused_host_count(version: Version, headers: &HeaderMap) -> Option<usize> {
    match headers.get_all(header::HOST).iter().count() {
        0 if version == Version::HTTP_11 => Some(0),
        0 | 1 => None,
        many => Some(many),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn hosts(n: usize) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for i in 0..n {
            let value = HeaderValue::from_str(&format!("h{i}.example")).expect("value");
            headers.append(header::HOST, value);
        }
        headers
    }

    #[test]
    fn one_host_passes_and_none_or_two_are_refused_on_http1_1() {
        assert_eq!(refused_host_count(Version::HTTP_11, &hosts(1)), None);
        assert_eq!(refused_host_count(Version::HTTP_11, &hosts(0)), Some(0));
        assert_eq!(refused_host_count(Version::HTTP_11, &hosts(2)), Some(2));
        assert_eq!(refused_host_count(Version::HTTP_11, &hosts(3)), Some(3));
    }

    #[test]
    fn http2_and_http1_0_may_go_without_one_but_never_with_two() {
        for version in [Version::HTTP_2, Version::HTTP_10] {
            assert_eq!(refused_host_count(version, &hosts(0)), None, "{version:?}");
            assert_eq!(refused_host_count(version, &hosts(1)), None, "{version:?}");
            assert_eq!(refused_host_count(version, &hosts(2)), Some(2), "{version:?}");
        }
    }
}
