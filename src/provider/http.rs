//! An upstream's HTTP endpoint and the steps every adapter takes to open a stream on it:
//! the streaming POST, the route's key as a sensitive header, the send, the status
//! classification, the check that a 2xx answer is an event stream, and the body handed to
//! a wire decoder.

use std::fmt;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::header::{HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use http::{Method, Request, Uri};
use http_body_util::{BodyDataStream, Full};
use serde::Serialize;

use super::client::{HttpClient, RequestBody};
use super::scrub::{scrub, seam_context};
use super::{classify_response, classify_transport, drive, DeltaStream, ErrorClass, ProviderError, WireDecoder};

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Where one route's requests go and who they go as.
pub(crate) struct Endpoint {
    /// The root that request paths are appended to, without a trailing `/`.
    pub base_url: String,
    /// The upstream's model id.
    pub model: String,
    api_key: Option<String>,
    client: HttpClient,
}

impl Endpoint {
    pub fn new(base_url: String, model: String, api_key: Option<String>, client: HttpClient) -> Self {
        let base_url = base_url.trim_end_matches('/').to_string();
        Endpoint {
            base_url,
            model,
            api_key,
            client,
        }
    }

    /// A streaming POST of `body` (serialized once, into the bytes sent) to
    /// `{base_url}{path}`, correlated by `x-request-id`.
    pub fn post(
        &self,
        path: &str,
        request_id: &str,
        body: &impl Serialize,
    ) -> Result<Request<RequestBody>, ProviderError> {
        let uri: Uri = format!("{}{path}", self.base_url)
            .parse()
            .map_err(|_| unbuildable("the route's base_url does not make a valid URL"))?;
        let request_id =
            HeaderValue::from_str(request_id).map_err(|_| unbuildable("the request id is not a valid header value"))?;
        let body = serde_json::to_vec(body).map_err(|e| unbuildable(&format!("the body did not serialize: {e}")))?;
        let mut request = Request::new(Full::new(Bytes::from(body)));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = uri;
        let headers = request.headers_mut();
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(X_REQUEST_ID, request_id);
        Ok(request)
    }

    /// Adds the route's key, if it has one, as the sensitive header `name` whose value
    /// `render` makes from the key. A key that cannot be a header value is an auth error.
    pub fn with_key(
        &self,
        request: &mut Request<RequestBody>,
        name: HeaderName,
        render: impl FnOnce(&str) -> String,
    ) -> Result<(), ProviderError> {
        let Some(key) = &self.api_key else {
            return Ok(());
        };
        let mut value = HeaderValue::from_str(&render(key))
            .map_err(|_| ProviderError::new(ErrorClass::Auth, "the route's api key is not a valid header value"))?;
        // Never indexed by HTTP/2's header compression, and shown as `Sensitive` by `Debug`.
        value.set_sensitive(true);
        request.headers_mut().insert(name, value);
        Ok(())
    }

    /// Sends a prepared request and, once the upstream answers 2xx, runs `decoder` over
    /// its body. A request that could not be prepared, a transport failure and a non-2xx
    /// answer all resolve to a classified `Err`. `committed` is the text the client already
    /// holds of the answer (a continuation's partial answer, else empty), which the answer
    /// is scrubbed on from.
    pub fn open<D: WireDecoder>(
        &self,
        request: Result<Request<RequestBody>, ProviderError>,
        decoder: D,
        committed: &str,
    ) -> BoxFuture<'static, Result<DeltaStream, ProviderError>> {
        let committed = seam_context(committed).to_string();
        let sent = request.map(|request| self.client.request(request));
        Box::pin(async move {
            let response = sent?.await.map_err(|e| classify_transport(&*e))?;
            if !response.status().is_success() {
                return Err(classify_response(response).await);
            }
            if let Some(refused) = not_an_event_stream(response.status().as_u16(), response.headers()) {
                return Err(refused);
            }
            // Route keys out of the answer before the mux records or forwards any of it.
            Ok(scrub(
                drive(BodyDataStream::new(response.into_body()), decoder),
                &committed,
            ))
        })
    }

    /// The fields of an adapter's `Debug`, with the key redacted.
    pub fn debug_as(&self, adapter: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(adapter)
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// At most this many characters of an unexpected content-type are quoted in an error.
const MAX_CONTENT_TYPE_CHARS: usize = 64;

/// A 2xx answer to a streaming request whose content-type is not `text/event-stream` (an
/// HTML login page from a proxy, a JSON body from a server that ignored `stream: true`): a
/// protocol error naming what came instead, bounded to `MAX_CONTENT_TYPE_CHARS` printable
/// ASCII characters (and redacted, as every `ProviderError` message is). `None` for an
/// event stream, whatever its parameters (`; charset=utf-8`).
fn not_an_event_stream(status: u16, headers: &http::HeaderMap) -> Option<ProviderError> {
    let found = match headers.get(CONTENT_TYPE) {
        None => "no content-type".to_string(),
        Some(value) => {
            let media = value.as_bytes().split(|b| *b == b';').next().unwrap_or_default();
            if media.trim_ascii().eq_ignore_ascii_case(b"text/event-stream") {
                return None;
            }
            let mut shown: String = value
                .as_bytes()
                .iter()
                .take(MAX_CONTENT_TYPE_CHARS)
                .map(|&b| if (0x20..0x7f).contains(&b) { b as char } else { '?' })
                .collect();
            if value.len() > MAX_CONTENT_TYPE_CHARS {
                shown.push('…');
            }
            format!("content-type \"{shown}\"")
        }
    };
    Some(
        ProviderError::new(
            ErrorClass::Protocol,
            format!("upstream answered {status} with {found} instead of an event stream (text/event-stream)"),
        )
        .with_status(status),
    )
}

fn unbuildable(why: &str) -> ProviderError {
    ProviderError::new(
        ErrorClass::Internal,
        format!("could not build the upstream request: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::http_client;

    fn endpoint(key: Option<&str>) -> Endpoint {
        Endpoint::new(
            "http://127.0.0.1:0/v1/".into(),
            "m".into(),
            key.map(str::to_string),
            http_client(),
        )
    }

    fn content_type(value: &[u8]) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        let value = HeaderValue::from_bytes(value).expect("a valid test header value");
        headers.insert(CONTENT_TYPE, value);
        headers
    }

    #[test]
    fn an_event_stream_with_parameters_is_an_event_stream() {
        for value in [
            &b"text/event-stream"[..],
            b"text/event-stream; charset=utf-8",
            b" Text/Event-Stream ;charset=UTF-8",
        ] {
            let headers = content_type(value);
            assert!(
                not_an_event_stream(200, &headers).is_none(),
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }

    #[test]
    fn a_2xx_answer_of_another_type_names_the_type_that_came() {
        let e = not_an_event_stream(200, &content_type(b"application/json; charset=utf-8")).expect("refused");
        assert_eq!(e.class, ErrorClass::Protocol, "{e}");
        assert_eq!(e.status, Some(200));
        assert!(
            e.message.contains("content-type \"application/json; charset=utf-8\""),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("text/event-stream"),
            "says what was expected: {}",
            e.message
        );
        let e = not_an_event_stream(204, &http::HeaderMap::new()).expect("refused");
        assert!(e.message.contains("204 with no content-type"), "{}", e.message);
    }

    #[test]
    fn an_unexpected_content_type_is_quoted_bounded_and_printable() {
        let long = format!("text/html; x={}", "a".repeat(500));
        let e = not_an_event_stream(200, &content_type(long.as_bytes())).expect("refused");
        assert!(e.message.len() < 200, "bounded: {}", e.message);
        assert!(e.message.contains("text/html; x=aaa"), "{}", e.message);
        let e = not_an_event_stream(200, &content_type(b"text/html\xff\xfe")).expect("refused");
        assert!(e.message.contains("text/html??"), "{}", e.message);
    }

    #[test]
    fn the_base_url_loses_its_trailing_slash() {
        assert_eq!(
            endpoint(None).base_url,
            "http://127.0.0.1:0/v1",
            "paths are appended to the root"
        );
    }

    #[test]
    fn a_key_that_is_not_a_header_value_is_an_auth_error() {
        let e = endpoint(Some("bad\nkey"));
        let mut request = e.post("/x", "req-1", &serde_json::json!({})).expect("builds");
        let err = e
            .with_key(&mut request, http::header::AUTHORIZATION, |k| format!("Bearer {k}"))
            .err()
            .map(|e| e.class);
        assert_eq!(err, Some(ErrorClass::Auth), "a newline cannot go into a header");
    }

    #[test]
    fn debug_never_shows_the_key() {
        struct Shown(Endpoint);
        impl fmt::Debug for Shown {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.debug_as("Adapter", f)
            }
        }
        let shown = format!("{:?}", Shown(endpoint(Some("sk-secret"))));
        assert!(!shown.contains("sk-secret"), "the key is redacted: {shown}");
        assert!(shown.starts_with("Adapter {"), "named after the adapter: {shown}");
    }

    #[test]
    fn the_key_is_a_sensitive_header_that_debug_never_shows() {
        let e = endpoint(Some("sk-secret-123"));
        let mut request = e.post("/x", "req-1", &serde_json::json!({"a": 1})).expect("builds");
        e.with_key(&mut request, http::header::AUTHORIZATION, |k| format!("Bearer {k}"))
            .expect("a valid key");
        let value = &request.headers()[http::header::AUTHORIZATION];
        assert!(value.is_sensitive(), "never indexed by HTTP/2 header compression");
        let shown = format!("{request:?}");
        assert!(!shown.contains("sk-secret"), "{shown}");
        assert_eq!(request.headers()["x-request-id"], "req-1");
        assert_eq!(request.headers()["content-type"], "application/json");
    }

    mod over_sockets {
        use std::sync::atomic::Ordering;

        use futures::StreamExt;

        use crate::provider::testkit::{hello, sse_answer, SocketServer};
        use crate::provider::{http_client, Delta, ErrorClass, OpenAiProvider, Provider, POOL_MAX_IDLE_PER_HOST};

        const TEXT: &str = include_str!("../../tests/fixtures/openai/text.sse");

        fn provider(server: &SocketServer) -> OpenAiProvider {
            OpenAiProvider::new(format!("{}/v1", server.base), "m".into(), None, http_client())
        }

        async fn answered(provider: &OpenAiProvider) -> Vec<Result<Delta, crate::provider::ProviderError>> {
            match provider.open(hello("req-1")).await {
                Ok(stream) => stream.collect().await,
                Err(e) => vec![Err(e)],
            }
        }

        #[tokio::test]
        async fn an_answered_body_gives_its_connection_back_for_the_next_request() {
            let server = SocketServer::start(&sse_answer(TEXT), false, 1).await;
            let provider = provider(&server);
            for _ in 0..3 {
                let out = answered(&provider).await;
                assert!(out.iter().all(Result::is_ok), "{out:?}");
                // The rest of the body is read in the background for at most this long.
                tokio::time::sleep(crate::provider::DRAIN_FOR).await;
            }
            assert_eq!(server.requests.load(Ordering::SeqCst), 3);
            assert_eq!(server.accepted.load(Ordering::SeqCst), 1, "one pooled connection");
        }

        #[tokio::test]
        async fn after_a_burst_only_the_pool_bound_of_connections_stays_open() {
            let burst = POOL_MAX_IDLE_PER_HOST + 4;
            let server = SocketServer::start(&sse_answer(TEXT), false, burst).await;
            let provider = provider(&server);
            let outs = futures::future::join_all((0..burst).map(|_| answered(&provider))).await;
            assert!(outs.iter().flatten().all(Result::is_ok), "{outs:?}");
            assert_eq!(server.accepted.load(Ordering::SeqCst), burst, "all in flight at once");
            let closed = SocketServer::reaches(&server.closed, burst - POOL_MAX_IDLE_PER_HOST).await;
            assert_eq!(
                closed,
                burst - POOL_MAX_IDLE_PER_HOST,
                "the rest is closed as it comes back"
            );
            tokio::time::sleep(crate::provider::DRAIN_FOR).await;
            assert_eq!(
                server.closed.load(Ordering::SeqCst),
                burst - POOL_MAX_IDLE_PER_HOST,
                "{POOL_MAX_IDLE_PER_HOST} stay idle in the pool"
            );
        }

        #[tokio::test]
        async fn a_2xx_answer_that_is_not_an_event_stream_says_which_content_type_came() {
            let body = r#"{"id":"x","object":"chat.completion","choices":[]}"#;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let server = SocketServer::start(&answer, false, 1).await;
            let e = match provider(&server).open(hello("req-1")).await {
                Err(e) => e,
                Ok(stream) => panic!("a JSON answer opened a stream: {:?}", stream.collect::<Vec<_>>().await),
            };
            assert_eq!(e.class, ErrorClass::Protocol, "{e}");
            assert!(
                e.message.contains("content-type \"application/json\"") && e.message.contains("text/event-stream"),
                "names the type that came and the one expected: {}",
                e.message
            );
        }

        #[tokio::test]
        async fn a_body_cut_before_the_answer_finished_is_unavailable() {
            let head = TEXT.split("\n\n").take(2).collect::<Vec<_>>().join("\n\n") + "\n\n";
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{head}",
                head.len() + 100
            );
            let server = SocketServer::start(&answer, true, 1).await;
            let out = answered(&provider(&server)).await;
            let e = match out.last() {
                Some(Err(e)) => e.clone(),
                other => panic!("the answer never finished: {other:?} in {out:?}"),
            };
            assert_eq!(e.class, ErrorClass::Unavailable, "{e}");
            assert!(e.message.starts_with("upstream body failed"), "{}", e.message);
            assert!(
                out.iter().any(|d| matches!(d, Ok(Delta::Text(_)))),
                "what arrived is kept: {out:?}"
            );
        }

        #[tokio::test]
        async fn a_redirect_is_an_unexpected_status_and_is_not_followed() {
            let answer = "HTTP/1.1 302 Found\r\nlocation: /v1/elsewhere\r\ncontent-length: 0\r\n\r\n";
            let server = SocketServer::start(answer, false, 1).await;
            let e = match provider(&server).open(hello("req-1")).await {
                Ok(_) => panic!("a 302 opens no stream"),
                Err(e) => e,
            };
            assert_eq!((e.class, e.status), (ErrorClass::Protocol, Some(302)), "{e}");
            assert_eq!(
                server.requests.load(Ordering::SeqCst),
                1,
                "nothing followed the location"
            );
        }
    }
}
