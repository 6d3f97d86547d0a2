//! The upstream HTTP client every adapter shares: hyper-util's pooled clients (in lanes,
//! `lanes`, so no stream waits behind a full HTTP/2 connection) over a connector with
//! TCP_NODELAY, one timeout for the whole connect (TCP and TLS; the route's
//! `connect_timeout_ms`, `with_connect_timeout`), and rustls (ring, the
//! platform's roots) speaking HTTP/2 where the upstream offers it by ALPN, HTTP/1.1 otherwise;
//! a plain-http upstream marked for it is spoken to in HTTP/2 from the first byte (prior
//! knowledge, h2c).
//!
//! No redirects are followed and nothing is retried here (hyper-util's client follows none
//! and retries only a request that never reached a reused connection): a 3xx is an
//! unexpected status, and failover is the mux's call. There is no overall timeout either:
//! the mux owns deadlines and stall detection.
//!
//! An egress proxy is taken from the environment as reqwest and curl read it (`HTTP_PROXY`,
//! `HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY`, and the lower-case forms; hyper-util's
//! `Matcher::from_env`): an https upstream is reached through an HTTP CONNECT tunnel (TLS
//! end to end, SNI the upstream's host), a plain-http one by sending the proxy the request in
//! absolute form (that leg of the connect is `proxy`). Proxy credentials in the proxy's URL go
//! in `Proxy-Authorization`. A failure at the proxy is logged with the proxy's address; the
//! error (which may reach a client) names no address: the proxy is internal infrastructure.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::Scheme;
use http::{Request, Response, Uri};
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tower_service::Service;

use super::lanes::{LaneBody, Lanes};
use super::proxy::ProxyConnector;
pub(crate) use super::proxy::ProxyFailed;

/// How long reaching an upstream may take, TCP and TLS together, unless the route says
/// otherwise (`HttpClient::with_connect_timeout`).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an idle pooled connection is kept.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Idle connections kept per upstream host and lane. An HTTP/2 upstream (the hosted
/// providers offer it by ALPN) multiplexes a lane's streams over one connection, so this
/// bounds only HTTP/1.1
/// upstreams (local servers, the simulated upstream), where each stream in flight holds a
/// connection of its own. After a burst of N streams, N − 8 connections close as they come
/// back instead of idling for `POOL_IDLE_TIMEOUT`; each holds about 25 KiB (hyper's read and
/// write buffers, its dispatch channel and connection task), so a burst of 64 left 1.6 MiB
/// behind. What it trades: the next burst above 8 opens new connections, one TCP connect
/// (and a TLS handshake on https) each, on a loopback or LAN upstream tens of microseconds.
/// Steady traffic of up to 8 streams at once to a host never reconnects.
pub const POOL_MAX_IDLE_PER_HOST: usize = 8;

/// A request's body: serialized once, sent as is.
pub type RequestBody = Full<Bytes>;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) type Connector = ConnectTimeout<HttpsConnector<ProxyConnector>>;

/// The shared upstream client: cheap to clone, one set of connection pools for all clones.
#[derive(Clone)]
pub struct HttpClient {
    lanes: Arc<Lanes>,
    /// Plain-http upstreams are spoken to in HTTP/2 from the first byte (h2c).
    prior_knowledge: bool,
    /// The bound on each new connection's connect (TCP, proxy tunnel and TLS).
    connect_timeout: Duration,
    proxies: Arc<Matcher>,
}

impl HttpClient {
    /// This client (the same lanes), bounding each new connection's connect by `timeout`
    /// instead: a route's `connect_timeout_ms`. Connections under different bounds are
    /// pooled apart (a lane's connector carries one bound).
    pub fn with_connect_timeout(&self, timeout: Duration) -> HttpClient {
        HttpClient {
            connect_timeout: timeout,
            ..self.clone()
        }
    }

    /// This client (the same pools), speaking HTTP/2 with prior knowledge to plain-http
    /// upstreams: no HTTP/1.1, many streams over one connection. An https upstream still
    /// negotiates by ALPN.
    pub fn with_http2_prior_knowledge(&self) -> HttpClient {
        HttpClient {
            prior_knowledge: true,
            ..self.clone()
        }
    }

    /// Sends `request`; resolves at the response's head.
    pub(crate) fn request(
        &self,
        mut request: Request<RequestBody>,
    ) -> impl Future<Output = Result<Response<LaneBody>, BoxError>> + Send + 'static {
        // A plain-http request to a proxy carries the proxy's credentials itself (an https
        // one sends them in the CONNECT, see `ProxyConnector`). The header is sensitive:
        // never indexed, never shown by `Debug`.
        let mut proxied = false;
        if request.uri().scheme() == Some(&Scheme::HTTP) {
            let proxy = self.proxies.intercept(request.uri());
            proxied = proxy.is_some();
            if let Some(auth) = proxy.as_ref().and_then(|p| p.basic_auth()) {
                let mut auth = auth.clone();
                auth.set_sensitive(true);
                request.headers_mut().insert(http::header::PROXY_AUTHORIZATION, auth);
            }
        }
        let h2c = self.prior_knowledge && request.uri().scheme() == Some(&Scheme::HTTP);
        self.lanes.send(request, h2c, self.connect_timeout, proxied)
    }
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient")
            .field("connect_timeout", &self.connect_timeout)
            .field("pool_max_idle_per_host", &POOL_MAX_IDLE_PER_HOST)
            .field("http2_prior_knowledge", &self.prior_knowledge)
            // The matcher's `Debug` names the proxies' URLs without their credentials.
            .field("proxies", &self.proxies)
            .finish()
    }
}

/// Builds the upstream client (one per process; clones share its pool), with the egress
/// proxy the environment names, if any.
pub fn http_client() -> HttpClient {
    // The unit tests' clients connect directly whatever the developer's shell sets (the
    // proxy tests pass their own rules to `http_client_with`).
    #[cfg(not(test))]
    let proxies = Matcher::from_env();
    #[cfg(test)]
    let proxies = Matcher::builder().build();
    tracing::info!(?proxies, "upstream egress proxies (from the environment)");
    http_client_with(proxies)
}

/// Builds the upstream client with these proxy rules (tests pass their own: the
/// environment is one for every test thread).
pub(crate) fn http_client_with(proxies: Matcher) -> HttpClient {
    let (connector, proxies) = connector(proxies);
    HttpClient {
        lanes: Arc::new(Lanes::new(connector)),
        prior_knowledge: false,
        connect_timeout: CONNECT_TIMEOUT,
        proxies,
    }
}

/// As `http_client_with` (no proxy), with lanes that take `streams` per connection before
/// the peer's settings say otherwise.
#[cfg(test)]
pub(crate) fn http_client_taking(streams: usize) -> (HttpClient, Arc<Lanes>) {
    let (connector, proxies) = connector(Matcher::builder().build());
    let lanes = Arc::new(Lanes::with_default_limit(connector, streams));
    let client = HttpClient {
        lanes: Arc::clone(&lanes),
        prior_knowledge: false,
        connect_timeout: CONNECT_TIMEOUT,
        proxies,
    };
    (client, lanes)
}

/// The connector every lane shares: proxy, TLS, connect timeout.
pub(crate) fn connector(proxies: Matcher) -> (Connector, Arc<Matcher>) {
    // Other parts of the process (tests' clients) look for a process-wide provider: ring,
    // as here. A second install fails harmlessly.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    let proxies = Arc::new(proxies);
    let tcp = ProxyConnector::new(http, Arc::clone(&proxies));
    // TLS wraps whatever the proxy connector returns: over a CONNECT tunnel it is end to
    // end with the upstream, its SNI the upstream's host.
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls_config(Arc::new(rustls::crypto::ring::default_provider())))
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(tcp);
    let connector = ConnectTimeout {
        inner: https,
        timeout: CONNECT_TIMEOUT,
    };
    (connector, proxies)
}

/// One pool over `connector` (a lane): idle connections kept `POOL_IDLE_TIMEOUT`, at most
/// `POOL_MAX_IDLE_PER_HOST`; every connection HTTP/2 from its first byte when
/// `prior_knowledge`.
pub(crate) fn pooled<C>(connector: C, prior_knowledge: bool) -> Client<C, RequestBody>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
        .http2_only(prior_knowledge)
        .build(connector)
}

/// TLS 1.2 and 1.3 over ring, certificates checked by the platform verifier (on Linux:
/// webpki over the system's roots). Without any root on the system, https upstreams fail at
/// connect (unknown issuer) and plain-http ones still work.
fn tls_config(provider: Arc<rustls::crypto::CryptoProvider>) -> rustls::ClientConfig {
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("ring supports TLS 1.2 and 1.3");
    match rustls_platform_verifier::Verifier::new(provider) {
        Ok(verifier) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth(),
        Err(e) => {
            tracing::warn!(error = %e, "no CA certificates could be loaded; https upstreams will fail");
            builder
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        }
    }
}

/// A connect that took longer than its bound (`CONNECT_TIMEOUT` or the route's).
#[derive(Debug, thiserror::Error)]
#[error("connect timed out after {0:?}")]
pub(crate) struct ConnectTimedOut(pub Duration);

/// Bounds a whole connect (hyper-util's `HttpConnector` timeout covers the TCP connect only,
/// not the TLS handshake after it).
#[derive(Clone)]
pub(crate) struct ConnectTimeout<C> {
    inner: C,
    timeout: Duration,
}

impl<C> ConnectTimeout<C> {
    /// The same connector under another bound.
    pub(crate) fn with_timeout(&self, timeout: Duration) -> Self
    where
        C: Clone,
    {
        ConnectTimeout {
            inner: self.inner.clone(),
            timeout,
        }
    }
}

impl<C> Service<Uri> for ConnectTimeout<C>
where
    C: Service<Uri>,
    C::Future: Unpin,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = TimedConnect<C::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        TimedConnect {
            inner: self.inner.call(uri),
            deadline: Box::pin(tokio::time::sleep(self.timeout)),
            timeout: self.timeout,
        }
    }
}

/// A connect racing its deadline. hyper-util wants connect futures `Unpin`, so the timer
/// is boxed (one allocation per new connection, none per request).
pub(crate) struct TimedConnect<F> {
    inner: F,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

impl<F, T, E> Future for TimedConnect<F>
where
    F: Future<Output = Result<T, E>> + Unpin,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(connected) = Pin::new(&mut self.inner).poll(cx) {
            return Poll::Ready(connected.map_err(Into::into));
        }
        ready!(self.deadline.as_mut().poll(cx));
        Poll::Ready(Err(Box::new(ConnectTimedOut(self.timeout))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{classify_transport, ErrorClass};
    use hyper_util::rt::TokioIo;

    /// A connector whose connects never finish (an upstream that drops SYNs).
    #[derive(Clone)]
    struct Blackhole;

    impl Service<Uri> for Blackhole {
        type Response = TokioIo<tokio::net::TcpStream>;
        type Error = std::io::Error;
        type Future = futures::future::Pending<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Uri) -> Self::Future {
            futures::future::pending()
        }
    }

    fn post(uri: &str) -> Request<RequestBody> {
        let mut request = Request::new(Full::new(Bytes::from_static(b"{}")));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = uri.parse().unwrap_or_else(|e| panic!("test uri {uri}: {e}"));
        request
    }

    #[tokio::test(start_paused = true)]
    async fn a_connect_that_never_finishes_times_out_as_a_timeout() {
        let client: Client<_, RequestBody> = Client::builder(TokioExecutor::new()).build(ConnectTimeout {
            inner: Blackhole,
            timeout: CONNECT_TIMEOUT,
        });
        let sent = client.request(post("http://upstream.invalid/v1/chat/completions"));
        let err = match tokio::time::timeout(CONNECT_TIMEOUT * 2, sent).await {
            Ok(Err(err)) => err,
            Ok(Ok(_)) => panic!("a black hole cannot answer"),
            Err(_) => panic!("the connect timeout did not fire"),
        };
        let e = classify_transport(&err);
        assert_eq!(e.class, ErrorClass::Timeout, "{e}");
        assert!(e.message.starts_with("upstream timed out"), "{}", e.message);
    }

    #[tokio::test(start_paused = true)]
    async fn a_routes_connect_timeout_bounds_the_connect_instead_of_the_default() {
        // An https upstream that takes the connection and never answers the TLS hello.
        let (addr, _held) = crate::provider::testkit::silent_listener().await;
        let bound = Duration::from_millis(300);
        let default = http_client();
        let client = default.with_connect_timeout(bound);
        assert!(format!("{client:?}").contains("300ms"), "{client:?}");
        let started = tokio::time::Instant::now();
        let sent = client.request(post(&format!("https://{addr}/v1/chat/completions")));
        let err = match tokio::time::timeout(CONNECT_TIMEOUT * 2, sent).await {
            Ok(Err(err)) => err,
            Ok(Ok(_)) => panic!("a silent upstream cannot answer"),
            Err(_) => panic!("the connect timeout did not fire"),
        };
        let waited = started.elapsed();
        let e = classify_transport(&*err);
        assert_eq!(e.class, ErrorClass::Timeout, "{e}");
        assert!(
            waited >= bound && waited < CONNECT_TIMEOUT,
            "the connect gave up after {waited:?}, not the route's {bound:?}"
        );
        // The same lanes without the route's bound keep the default: their connects to
        // that upstream go through lanes of their own.
        let started = tokio::time::Instant::now();
        let sent = default.request(post(&format!("https://{addr}/v1/chat/completions")));
        let _ = tokio::time::timeout(CONNECT_TIMEOUT * 2, sent).await;
        assert!(
            started.elapsed() >= CONNECT_TIMEOUT,
            "the default-bound connect gave up after {:?}: it shared the route's lanes",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_tls_handshake_with_a_server_that_speaks_no_tls_fails_to_connect() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            if let Ok((mut socket, _)) = listener.accept().await {
                let mut hello = [0u8; 512];
                let _ = socket.read(&mut hello).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        let err = http_client()
            .request(post(&format!("https://{addr}/v1/chat/completions")))
            .await
            .expect_err("plain HTTP is no TLS handshake");
        let e = classify_transport(&*err);
        assert_eq!(e.class, ErrorClass::Unavailable, "{e}");
        assert!(
            e.message.starts_with("could not connect to upstream (TLS)"),
            "{}",
            e.message
        );
    }

    mod through_a_proxy {
        use super::*;
        use crate::provider::testkit::{ProxyMode, ReplayServer, Reply, TestProxy};

        fn via(proxy: &str, no_proxy: &str) -> HttpClient {
            http_client_with(Matcher::builder().http(proxy).https(proxy).no(no_proxy).build())
        }

        #[tokio::test]
        async fn an_http_upstream_is_asked_in_absolute_form_with_the_proxys_credentials() {
            let upstream = ReplayServer::start(Reply::sse("data: [DONE]\n\n")).await;
            let proxy = TestProxy::start(ProxyMode::Relay).await;
            let client = via(&proxy.url_with_credentials("user", "s3cret"), "");
            let url = format!("{}/v1/chat/completions", upstream.base);
            let response = client.request(post(&url)).await.expect("relayed through the proxy");
            assert_eq!(response.status(), 200);
            let saw = proxy.saw.lock().clone();
            assert_eq!(saw.len(), 1, "{saw:?}");
            assert_eq!(saw[0].request_line, format!("POST {url} HTTP/1.1"));
            // base64("user:s3cret")
            assert_eq!(saw[0].proxy_authorization.as_deref(), Some("Basic dXNlcjpzM2NyZXQ="));
            assert_eq!(upstream.requests.lock().len(), 1);
            assert_eq!(upstream.requests.lock()[0].path, "/v1/chat/completions");
        }

        #[tokio::test]
        async fn an_https_upstream_gets_a_connect_tunnel_with_tls_to_the_upstream_inside() {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            // The upstream speaks no TLS: what it receives through the tunnel is the client's
            // TLS hello, which names the upstream (SNI), not the proxy.
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind loopback");
            let port = listener.local_addr().expect("addr").port();
            let hello = tokio::spawn(async move {
                let (mut socket, _) = listener.accept().await.expect("accept");
                let mut hello = vec![0u8; 2048];
                let n = socket.read(&mut hello).await.unwrap_or(0);
                hello.truncate(n);
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                    .await;
                hello
            });
            let proxy = TestProxy::start(ProxyMode::Relay).await;
            let client = via(&proxy.url_with_credentials("user", "s3cret"), "");
            let sent = client.request(post(&format!("https://localhost:{port}/v1/chat/completions")));
            let err = sent.await.expect_err("the upstream speaks no TLS");
            let saw = proxy.saw.lock().clone();
            assert_eq!(saw.len(), 1, "{saw:?}");
            assert_eq!(saw[0].request_line, format!("CONNECT localhost:{port} HTTP/1.1"));
            assert_eq!(saw[0].proxy_authorization.as_deref(), Some("Basic dXNlcjpzM2NyZXQ="));
            let hello = hello.await.expect("upstream task");
            assert_eq!(
                hello.first(),
                Some(&0x16),
                "a TLS handshake record came through the tunnel"
            );
            assert!(
                hello.windows(b"localhost".len()).any(|w| w == b"localhost"),
                "the hello's SNI names the upstream"
            );
            let e = classify_transport(&*err);
            assert_eq!(e.class, ErrorClass::Unavailable, "{e}");
            assert!(
                e.message.starts_with("could not connect to upstream (TLS)"),
                "{}",
                e.message
            );
        }

        #[tokio::test]
        async fn a_refused_connect_is_a_failed_connect_that_names_the_proxy_not_its_credentials() {
            for status in [407, 403, 502] {
                let proxy = TestProxy::start(ProxyMode::Refuse(status)).await;
                let client = via(&proxy.url_with_credentials("user", "s3cret"), "");
                let err = client
                    .request(post("https://upstream.invalid/v1/chat/completions"))
                    .await
                    .expect_err("the proxy refuses");
                let e = classify_transport(&*err);
                assert_eq!(e.class, ErrorClass::Unavailable, "{status}: {e}");
                assert!(
                    e.message
                        .starts_with("could not connect to upstream (the proxy refused)"),
                    "{status}: {}",
                    e.message
                );
                // The proxy is internal: the message (which can reach a client) names no address.
                let at = proxy.url.trim_start_matches("http://");
                assert!(!e.message.contains(at), "{status}: {}", e.message);
                assert!(!e.message.contains("127.0.0.1"), "{status}: {}", e.message);
                assert!(
                    !e.message.contains("s3cret") && !e.message.contains("dXNlcjpzM2NyZXQ"),
                    "{}",
                    e.message
                );
                assert_eq!(proxy.saw.lock().len(), 1);
            }
        }

        #[tokio::test]
        async fn a_proxy_that_cannot_be_reached_is_a_failed_connect() {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
            let addr = listener.local_addr().expect("local addr");
            drop(listener);
            let client = via(&format!("http://user:s3cret@{addr}"), "");
            for url in ["https://upstream.invalid/v1/x", "http://upstream.invalid/v1/x"] {
                let err = client.request(post(url)).await.expect_err("nothing listens there");
                let e = classify_transport(&*err);
                assert_eq!(e.class, ErrorClass::Unavailable, "{url}: {e}");
                assert!(
                    e.message
                        .starts_with("could not connect to upstream (the proxy could not be reached)"),
                    "{url}: {}",
                    e.message
                );
                assert!(!e.message.contains(&addr.to_string()), "{}", e.message);
                assert!(!e.message.contains("s3cret"), "{}", e.message);
            }
        }

        #[tokio::test]
        async fn no_proxy_hosts_connect_directly() {
            let upstream = ReplayServer::start(Reply::sse("data: [DONE]\n\n")).await;
            let proxy = TestProxy::start(ProxyMode::Refuse(403)).await;
            let client = via(
                &proxy.url_with_credentials("user", "s3cret"),
                "example.com, 127.0.0.0/8",
            );
            let url = format!("{}/v1/chat/completions", upstream.base);
            let response = client.request(post(&url)).await.expect("straight to the upstream");
            assert_eq!(response.status(), 200);
            assert!(
                proxy.saw.lock().is_empty(),
                "the proxy was asked: {:?}",
                proxy.saw.lock()
            );
            assert_eq!(upstream.requests.lock().len(), 1);
            assert!(
                !upstream.requests.lock()[0].headers.contains_key("proxy-authorization"),
                "the proxy's credentials went to the upstream"
            );
            // Without the rule, loopback is proxied like any host (as `Matcher::from_env` reads it).
            let proxied = via(&proxy.url, "example.com").request(post(&url)).await;
            assert_eq!(proxied.map(|r| r.status().as_u16()).ok(), Some(403));
            assert_eq!(proxy.saw.lock().len(), 1);
        }

        #[tokio::test]
        async fn a_proxy_of_another_scheme_fails_the_connect_instead_of_going_around_it() {
            let upstream = ReplayServer::start(Reply::sse("data: [DONE]\n\n")).await;
            for proxy in ["https://user:s3cret@127.0.0.1:9", "socks5://user:s3cret@127.0.0.1:9"] {
                let err = via(proxy, "")
                    .request(post(&format!("{}/v1/chat/completions", upstream.base)))
                    .await
                    .expect_err("no way through that proxy");
                let e = classify_transport(&*err);
                assert_eq!(e.class, ErrorClass::Unavailable, "{proxy}: {e}");
                assert!(
                    e.message
                        .starts_with("could not connect to upstream (unsupported proxy)"),
                    "{proxy}: {}",
                    e.message
                );
                assert!(!e.message.contains("s3cret"), "{}", e.message);
            }
            assert!(upstream.requests.lock().is_empty(), "a request went around the proxy");
        }

        #[test]
        fn the_clients_debug_names_the_proxy_without_its_credentials() {
            let shown = format!("{:?}", via("http://user:s3cret@127.0.0.1:3128", "internal.example"));
            assert!(shown.contains("127.0.0.1:3128"), "{shown}");
            assert!(!shown.contains("s3cret") && !shown.contains("user"), "{shown}");
        }

        #[tokio::test(start_paused = true)]
        async fn the_connect_timeout_covers_a_proxy_that_never_answers_the_connect() {
            // A proxy that takes the connection and never answers.
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind loopback");
            let addr = listener.local_addr().expect("addr");
            let asked = Arc::new(tokio::sync::Notify::new());
            let told = Arc::clone(&asked);
            let _held = tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut held = Vec::new();
                while let Ok((mut socket, _)) = listener.accept().await {
                    let mut head = [0u8; 1024];
                    if socket
                        .read(&mut head)
                        .await
                        .is_ok_and(|n| head[..n].starts_with(b"CONNECT "))
                    {
                        told.notify_one();
                    }
                    held.push(socket);
                }
            });
            let client = via(&format!("http://{addr}"), "");
            let sent = client.request(post("https://upstream.invalid/v1/chat/completions"));
            let err = match tokio::time::timeout(CONNECT_TIMEOUT * 2, sent).await {
                Ok(Err(err)) => err,
                Ok(Ok(_)) => panic!("a silent proxy cannot answer"),
                Err(_) => panic!("the connect timeout did not fire"),
            };
            let e = classify_transport(&*err);
            assert_eq!(e.class, ErrorClass::Timeout, "{e}");
            // The deadline fired while the proxy held the CONNECT, not before it arrived.
            tokio::select! {
                biased;
                () = asked.notified() => {}
                () = std::future::ready(()) => panic!("the proxy never got the CONNECT"),
            }
        }
    }
}
