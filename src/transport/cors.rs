//! Which browser pages may call tailcut: the origin allowlist (`[server.cors]`), the refusal of
//! every other browser request before anything runs, and tower-http's CORS layer that answers
//! the allowed origins' preflights.
//!
//! Why the server refuses by itself: CORS only stops a foreign page from *reading* an answer.
//! A "simple" cross-site request (a `text/plain` or form POST, an `<img>` GET) gets no
//! preflight; the browser just sends it, and a chat spends provider keys whether or not the
//! page may read the reply. So every API request passes [`Origins::check`] first:
//!
//! 1. With an `Origin` (every cross-origin fetch, every POST, every WebSocket upgrade): it
//!    must be in the allowlist, exactly. Anything else, `null` included, gets a 403; an
//!    `Origin` sent twice (no browser does) a 400, whatever the values; so does a repeated
//!    `Sec-Fetch-Site`, whether or not an `Origin` came (two differing values would let the
//!    guard read the harmless one and the rest of a stack the other).
//! 2. Without one and without `Sec-Fetch-Site`: not a browser (SDKs, curl, servers): allowed.
//! 3. Without one, from a browser on another site (`Sec-Fetch-Site: cross-site|same-site`:
//!    `<img>`, `<script>`, links): refused.
//! 4. Without one, from a browser on the same origin or typed in (`same-origin|none`): allowed,
//!    except that a loopback server refuses a `Host` that is not one of its own names. That
//!    is a page at a rebound name reading a GET such as `/v1/stream?q=`, which carries no
//!    Origin because the browser sees it as same-origin.
//!
//! Same origin: the allowlist is `allowed_origins` plus, when the server listens on loopback
//! (or on every interface, which includes loopback), the loopback origins that reach its own
//! port: `http://localhost:PORT` and the loopback address it listens on, `http://127.0.0.1:PORT`
//! or `http://[::1]:PORT` (both for `::`; only IPv4 for `0.0.0.0`, since a page at the other
//! one is another socket's). The playground and dashboard served from them keep working. The same
//! server reached under any other name (a LAN address, a public name) must list that origin.
//! `Host` is never compared with `Origin`: under DNS rebinding an attacker's page at
//! evil.example, resolved to 127.0.0.1, sends `Host: evil.example:PORT` and `Origin:
//! http://evil.example:PORT`, a perfect "same-origin" pair.
//!
//! For allowed origins tower-http answers preflights (`Access-Control-Allow-Origin`,
//! `-Methods`, `-Headers` from [`allowed_headers`], `-Max-Age`, and `-Private-Network` for
//! Chrome's private network access) and adds `Access-Control-Allow-Origin` and
//! `-Expose-Headers` ([`EXPOSED_HEADERS`]) to every answer. No credentials: keys and tokens
//! ride in headers or `?token=`, never in cookies.
//!
//! Limits: a browser too old to send `Sec-Fetch-Site` (before 2020-2023, by vendor) counts as
//! a non-browser when it sends no Origin; a server not on loopback cannot know its own names,
//! so rule 4 leaves a rebound Origin-less GET to it to authentication.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderName, Method, Uri};
use axum::response::Response;
use tower_http::cors::{AllowHeaders, AllowOrigin, AllowPrivateNetwork, Cors};

use super::error::ErrorReply;
use super::{anthropic, native_sse, openai};
use crate::types::{Dialect, ErrorClass, RequestCtx};

/// Request headers an allowed page may send besides tailcut's own control headers
/// (`gateway::CONTROL_HEADERS`, see [`allowed_headers`]): the credentials, the request id,
/// and those the OpenAI and Anthropic JavaScript SDKs send from a browser (a preflight
/// naming any other is not answered with it, and the browser gives up).
pub const SDK_HEADERS: [&str; 21] = [
    "authorization",
    "content-type",
    "x-api-key",
    "x-request-id",
    "last-event-id",
    "idempotency-key",
    "anthropic-version",
    "anthropic-beta",
    "anthropic-dangerous-direct-browser-access",
    "openai-organization",
    "openai-project",
    "x-stainless-arch",
    "x-stainless-lang",
    "x-stainless-os",
    "x-stainless-package-version",
    "x-stainless-retry-count",
    "x-stainless-runtime",
    "x-stainless-runtime-version",
    "x-stainless-timeout",
    "x-stainless-helper-method",
    "x-stainless-async",
];

/// Every request header an allowed page may send: [`SDK_HEADERS`] and the `x-tailcut-*`
/// headers a request is steered by.
pub fn allowed_headers() -> impl Iterator<Item = &'static str> {
    SDK_HEADERS.into_iter().chain(crate::gateway::CONTROL_HEADERS)
}

/// Response headers an allowed page's scripts may read: who served, that a token count is an
/// estimate, the request id (both SDKs' spellings), and the retry hints the SDKs honour.
pub const EXPOSED_HEADERS: [&str; 8] = [
    "x-tailcut-route",
    "x-tailcut-level",
    "x-tailcut-hedged",
    "x-tailcut-estimate",
    "x-request-id",
    "request-id",
    "retry-after",
    "retry-after-ms",
];

/// [`EXPOSED_HEADERS`] as one `Access-Control-Expose-Headers` value, comma-separated as
/// tower-http writes it (the edge adds it itself to answers that skip CORS, `server::app`).
pub const EXPOSED_HEADERS_VALUE: &str =
    "x-tailcut-route,x-tailcut-level,x-tailcut-hedged,x-tailcut-estimate,x-request-id,request-id,retry-after,retry-after-ms";

/// How long a browser may cache a preflight answer (Chrome caps it at 2 hours).
const PREFLIGHT_MAX_AGE: Duration = Duration::from_secs(600);

/// The browser origins allowed to call this server, and on loopback the names it answers to.
#[derive(Debug, Clone)]
pub struct Origins {
    /// Exact origins, lowercase, as browsers send them.
    allowed: Vec<String>,
    /// On a loopback server, the `Host` values that name it (its loopback names and the
    /// listed origins' hosts); `None` elsewhere, where its own names are unknown.
    own_hosts: Option<Vec<String>>,
}

/// Why a browser request was refused (rules 1, 3 and 4 of the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// An `Origin` that is not in the allowlist.
    ForeignOrigin,
    /// A browser request from another site that carries no `Origin` (a no-cors GET).
    CrossSite,
    /// A browser request to a loopback server under a name not its own: DNS rebinding.
    ForeignHost,
    /// `Origin` sent more than once: which page asks is ambiguous.
    RepeatedOrigin,
    /// `Sec-Fetch-Site` sent more than once: where the request comes from is ambiguous.
    RepeatedFetchSite,
}

impl Refusal {
    /// The log label, also the error's `code` (but for a repeated header, whose code is
    /// `bad_request` as for any malformed header).
    pub fn metric_label(self) -> &'static str {
        match self {
            Refusal::ForeignOrigin => "origin_not_allowed",
            Refusal::CrossSite => "cross_site_request",
            Refusal::ForeignHost => "host_not_allowed",
            Refusal::RepeatedOrigin => "origin_repeated",
            Refusal::RepeatedFetchSite => "sec_fetch_site_repeated",
        }
    }

    fn message(self) -> &'static str {
        match self {
            Refusal::ForeignOrigin => "this Origin may not call tailcut; list it in [server.cors] allowed_origins",
            Refusal::CrossSite => "a cross-site browser request without an Origin is refused",
            Refusal::ForeignHost => {
                "a browser request under a name that is not this server's is refused (DNS rebinding); \
                 open tailcut at its loopback address or list the origin in [server.cors] allowed_origins"
            }
            Refusal::RepeatedOrigin => "origin may be sent only once",
            Refusal::RepeatedFetchSite => "sec-fetch-site may be sent only once",
        }
    }

    /// A repeated header is a malformed request (400); the others are refusals (403).
    fn class(self) -> ErrorClass {
        match self {
            Refusal::RepeatedOrigin | Refusal::RepeatedFetchSite => ErrorClass::BadRequest,
            _ => ErrorClass::Forbidden,
        }
    }
}

impl Origins {
    /// `listed` is `[server.cors] allowed_origins` (already normalized by the config);
    /// `local` is the address the server is bound to.
    pub fn new(listed: &[String], local: SocketAddr) -> Self {
        let loopback = loopback_hosts(local);
        let mut allowed = listed.to_vec();
        allowed.extend(loopback.iter().map(|host| format!("http://{host}")));
        let own_hosts = (!loopback.is_empty()).then(|| {
            let listed_hosts = listed
                .iter()
                .filter_map(|o| o.split_once("://"))
                .map(|(_, h)| h.to_string());
            loopback.into_iter().chain(listed_hosts).collect()
        });
        Origins { allowed, own_hosts }
    }

    /// Is `origin` (an `Origin` header value) one of the allowed origins?
    pub fn allows(&self, origin: &str) -> bool {
        self.allowed.iter().any(|a| a.eq_ignore_ascii_case(origin))
    }

    /// The guard's decision for one request (the numbered rules of the module doc).
    pub fn check(&self, headers: &HeaderMap, uri: &Uri) -> Result<(), Refusal> {
        if headers.get_all(header::ORIGIN).iter().nth(1).is_some() {
            return Err(Refusal::RepeatedOrigin);
        }
        if headers.get_all("sec-fetch-site").iter().nth(1).is_some() {
            return Err(Refusal::RepeatedFetchSite);
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            return match origin.to_str() {
                Ok(origin) if self.allows(origin) => Ok(()),
                _ => Err(Refusal::ForeignOrigin),
            };
        }
        let Some(site) = headers.get("sec-fetch-site") else {
            return Ok(());
        };
        if matches!(site.as_bytes(), b"cross-site" | b"same-site") {
            return Err(Refusal::CrossSite);
        }
        let Some(own) = &self.own_hosts else {
            return Ok(());
        };
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| uri.authority().map(|a| a.as_str()));
        match host {
            Some(host) if own.iter().any(|o| o.eq_ignore_ascii_case(host)) => Ok(()),
            _ => Err(Refusal::ForeignHost),
        }
    }
}

/// `host:port` of each loopback name that reaches a server bound to `local`; none when it
/// is not bound to loopback.
fn loopback_hosts(local: SocketAddr) -> Vec<String> {
    let port = local.port();
    let ip = local.ip();
    let mut hosts = match ip {
        // `::` is dual-stack, so IPv4 loopback reaches it too.
        _ if ip.is_unspecified() && ip.is_ipv6() => vec![format!("127.0.0.1:{port}"), format!("[::1]:{port}")],
        _ if ip.is_unspecified() => vec![format!("127.0.0.1:{port}")],
        _ if ip.is_loopback() => vec![local.to_string()],
        _ => return Vec::new(),
    };
    hosts.push(format!("localhost:{port}"));
    hosts
}

/// `inner` behind tower-http's CORS service for `origins`: it answers allowed preflights and
/// adds `Access-Control-Allow-Origin` to allowed answers. The origin guard ([`guard`]) runs
/// before it (`server::app`), and handlers find the `Origins` in an extension (the WebSocket
/// upgrade checks it again).
pub fn cors<S>(inner: S, origins: &Arc<Origins>) -> Cors<S> {
    let allowed = |origins: &Arc<Origins>| {
        let origins = Arc::clone(origins);
        move |origin: &axum::http::HeaderValue, _: &axum::http::request::Parts| {
            origin.to_str().is_ok_and(|o| origins.allows(o))
        }
    };
    Cors::new(inner)
        .allow_origin(AllowOrigin::predicate(allowed(origins)))
        .allow_private_network(AllowPrivateNetwork::predicate(allowed(origins)))
        // DELETE: a page stops a resumable stream with `DELETE /v1/streams/{id}`.
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers(AllowHeaders::list(allowed_headers().map(HeaderName::from_static)))
        .expose_headers(EXPOSED_HEADERS.map(HeaderName::from_static))
        .max_age(PREFLIGHT_MAX_AGE)
}

/// The origin guard for one request: the 403 to answer (logged) when `origins` refuses it
/// (the numbered rules of the module doc), `None` when it may go on.
pub fn guard(origins: &Origins, headers: &HeaderMap, uri: &Uri) -> Option<Response> {
    origins.check(headers, uri).err().map(|refusal| {
        let path = uri.path();
        tracing::info!(
            reason = refusal.metric_label(),
            path,
            origin = ?headers.get(header::ORIGIN),
            "browser request refused"
        );
        refused(path, refusal)
    })
}

/// A 403 (or 400) in the error shape of the endpoint's dialect (OpenAI's for the ops
/// endpoints).
fn refused(path: &str, refusal: Refusal) -> Response {
    let reply = ErrorReply {
        status: refusal.class().http_status(),
        class: refusal.class(),
        code: Some(match refusal {
            Refusal::RepeatedOrigin | Refusal::RepeatedFetchSite => "bad_request",
            _ => refusal.metric_label(),
        }),
        param: match refusal {
            Refusal::RepeatedOrigin => Some("origin".to_string()),
            Refusal::RepeatedFetchSite => Some("sec-fetch-site".to_string()),
            _ => None,
        },
        ..ErrorReply::bad_request(refusal.message())
    };
    let request_id = RequestCtx::new(Dialect::OpenAi).request_id;
    if path.starts_with("/v1/messages") {
        anthropic::error_response(&reply, &request_id)
    } else if path.starts_with("/v1/stream") || path.starts_with("/v1/ws") {
        native_sse::error_response(&reply, &request_id)
    } else {
        openai::error_response(&reply, &request_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposed_headers_value_lists_every_exposed_header() {
        assert_eq!(EXPOSED_HEADERS_VALUE, EXPOSED_HEADERS.join(","));
    }

    #[tokio::test]
    async fn a_refused_origin_is_the_clients_error_in_each_dialect() {
        use http_body_util::BodyExt;
        for (path, kind) in [
            ("/v1/chat/completions", "invalid_request_error"),
            ("/v1/messages", "permission_error"),
        ] {
            let resp = refused(path, Refusal::ForeignOrigin);
            assert_eq!(resp.status(), 403);
            let bytes = resp.into_body().collect().await.expect("body").to_bytes();
            let body: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
            assert_eq!(body["error"]["type"], kind, "{path}: {body}");
        }
    }

    #[tokio::test]
    async fn an_origin_sent_twice_is_a_400_in_each_dialect_whatever_the_values() {
        use http_body_util::BodyExt;
        let o = origins(&[], "127.0.0.1:8080");
        for second in ["http://127.0.0.1:8080", "https://evil.example"] {
            let mut h = headers(&[("origin", "http://127.0.0.1:8080")]);
            h.append("origin", second.parse().expect("value"));
            assert_eq!(
                o.check(&h, &Uri::from_static("/v1/chat/completions")),
                Err(Refusal::RepeatedOrigin),
                "an allowed first value does not let {second} by"
            );
        }
        for (path, kind) in [
            ("/v1/chat/completions", "invalid_request_error"),
            ("/v1/messages", "invalid_request_error"),
        ] {
            let resp = refused(path, Refusal::RepeatedOrigin);
            assert_eq!(resp.status(), 400, "{path}");
            let bytes = resp.into_body().collect().await.expect("body").to_bytes();
            let body: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
            assert_eq!(body["error"]["type"], kind, "{path}: {body}");
            assert!(
                body["error"]["message"].as_str().is_some_and(|m| m.contains("origin")),
                "{path}: {body}"
            );
        }
        let resp = refused("/v1/stream", Refusal::RepeatedOrigin);
        assert_eq!(resp.status(), 400, "native");
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
        assert_eq!(body["class"], "bad_request", "native shape: {body}");
    }

    #[tokio::test]
    async fn a_sec_fetch_site_sent_twice_is_a_400_whatever_the_values() {
        use http_body_util::BodyExt;
        let o = origins(&[], "127.0.0.1:8080");
        for (first, second) in [
            ("same-origin", "cross-site"),
            ("none", "none"),
            ("cross-site", "same-origin"),
        ] {
            let mut h = headers(&[("sec-fetch-site", first), ("host", "127.0.0.1:8080")]);
            h.append("sec-fetch-site", second.parse().expect("value"));
            assert_eq!(
                o.check(&h, &Uri::from_static("/v1/chat/completions")),
                Err(Refusal::RepeatedFetchSite),
                "{first}, then {second}"
            );
            // With an allowed Origin too: the repeat is still malformed.
            h.insert("origin", "http://127.0.0.1:8080".parse().expect("value"));
            assert_eq!(
                o.check(&h, &Uri::from_static("/v1/chat/completions")),
                Err(Refusal::RepeatedFetchSite),
                "{first}, then {second}, with an allowed origin"
            );
        }
        let resp = refused("/v1/chat/completions", Refusal::RepeatedFetchSite);
        assert_eq!(resp.status(), 400);
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("sec-fetch-site")),
            "{body}"
        );
    }

    fn origins(listed: &[&str], local: &str) -> Origins {
        let listed: Vec<String> = listed.iter().map(|s| s.to_string()).collect();
        Origins::new(&listed, local.parse().expect("address"))
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().expect("header value"));
        }
        h
    }

    fn check(o: &Origins, pairs: &[(&'static str, &str)]) -> Result<(), Refusal> {
        o.check(&headers(pairs), &Uri::from_static("/v1/stream"))
    }

    #[test]
    fn a_loopback_server_allows_its_own_loopback_origins_only() {
        let o = origins(&[], "127.0.0.1:8080");
        assert!(o.allows("http://127.0.0.1:8080"), "its own address");
        assert!(o.allows("http://localhost:8080"), "localhost");
        assert!(
            !o.allows("http://[::1]:8080"),
            "not bound to IPv6: another socket's page"
        );
        assert!(!o.allows("http://127.0.0.1:9999"), "another port is another origin");
        assert!(!o.allows("https://127.0.0.1:8080"), "another scheme is another origin");
        let dual = origins(&[], "[::]:8080");
        assert!(
            dual.allows("http://[::1]:8080") && dual.allows("http://127.0.0.1:8080"),
            "dual stack"
        );
    }

    #[test]
    fn a_public_server_allows_only_its_list() {
        let o = origins(&["https://app.example"], "10.0.0.5:8080");
        assert!(o.allows("https://app.example"), "listed");
        assert!(o.allows("https://APP.example"), "case-insensitive");
        assert!(!o.allows("http://127.0.0.1:8080"), "no loopback origins off loopback");
        assert!(!o.allows("null"), "opaque origin");
    }

    #[test]
    fn a_dns_rebinding_origin_is_refused_even_when_it_matches_host() {
        let o = origins(&[], "127.0.0.1:8080");
        assert_eq!(
            check(
                &o,
                &[("origin", "http://evil.example:8080"), ("host", "evil.example:8080")]
            ),
            Err(Refusal::ForeignOrigin),
            "Origin equal to Host proves nothing"
        );
    }

    #[test]
    fn requests_without_origin_are_judged_by_fetch_metadata() {
        let o = origins(&["https://app.example"], "127.0.0.1:8080");
        assert_eq!(
            check(&o, &[("host", "anything:1")]),
            Ok(()),
            "no Sec-Fetch-Site: not a browser"
        );
        assert_eq!(
            check(&o, &[("sec-fetch-site", "cross-site"), ("host", "127.0.0.1:8080")]),
            Err(Refusal::CrossSite),
            "an <img> GET from another site"
        );
        assert_eq!(
            check(&o, &[("sec-fetch-site", "same-origin"), ("host", "localhost:8080")]),
            Ok(()),
            "the playground's own GET"
        );
        assert_eq!(
            check(&o, &[("sec-fetch-site", "same-origin"), ("host", "app.example")]),
            Ok(()),
            "a listed origin's host"
        );
        assert_eq!(
            check(&o, &[("sec-fetch-site", "same-origin"), ("host", "evil.example:8080")]),
            Err(Refusal::ForeignHost),
            "a rebound name's same-origin GET"
        );
        let public = origins(&[], "10.0.0.5:8080");
        assert_eq!(
            check(
                &public,
                &[("sec-fetch-site", "same-origin"), ("host", "tailcut.example")]
            ),
            Ok(()),
            "off loopback the server's names are unknown"
        );
    }

    /// A new `x-tailcut-*` header would be refused by browsers' preflights if it were not
    /// listed, and could be sent twice unnoticed: every one the gateway reads is a control
    /// header (allowed, and refused when repeated).
    #[test]
    fn every_tailcut_header_is_allowed_or_exposed() {
        let names = |source: &str, prefix: &str| -> Vec<String> {
            source
                .split(prefix)
                .skip(1)
                .filter_map(|rest| rest.split('"').next())
                .map(|name| format!("x-tailcut-{name}"))
                .collect()
        };
        for name in names(include_str!("../gateway.rs"), "get(\"x-tailcut-") {
            assert!(
                crate::gateway::CONTROL_HEADERS.contains(&name.as_str()),
                "{name} is a control header: allowed to browsers, refused when repeated"
            );
            assert!(
                allowed_headers().any(|allowed| allowed == name),
                "{name} is a request header browsers may send"
            );
        }
        for name in names(include_str!("sse_out.rs"), "\"x-tailcut-") {
            assert!(
                EXPOSED_HEADERS.contains(&name.as_str()),
                "{name} is a response header scripts may read"
            );
        }
    }
}
