//! The upstream HTTP client every adapter shares: hyper-util's pooled client over a connector
//! with TCP_NODELAY, one timeout for the whole connect (TCP and TLS), and rustls (ring, the
//! platform's roots) speaking HTTP/2 where the upstream offers it by ALPN, HTTP/1.1 otherwise.
//!
//! No redirects are followed and nothing is retried here (hyper-util's client follows none
//! and retries only a request that never reached a reused connection): a 3xx is an
//! unexpected status, and failover is the mux's call. There is no overall timeout either:
//! the mux owns deadlines and stall detection.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tower_service::Service;

/// How long reaching an upstream may take, TCP and TLS together.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an idle pooled connection is kept.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Idle connections kept per upstream host. An HTTP/2 upstream (the hosted providers offer
/// it by ALPN) multiplexes every stream over one connection, so this bounds only HTTP/1.1
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

type Connector = ConnectTimeout<HttpsConnector<HttpConnector>>;

/// The shared upstream client: cheap to clone, one connection pool for all clones.
#[derive(Clone)]
pub struct HttpClient {
    inner: Client<Connector, RequestBody>,
}

impl HttpClient {
    /// Sends `request`; resolves at the response's head.
    pub(crate) fn request(&self, request: Request<RequestBody>) -> ResponseFuture {
        self.inner.request(request)
    }
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient")
            .field("connect_timeout", &CONNECT_TIMEOUT)
            .field("pool_max_idle_per_host", &POOL_MAX_IDLE_PER_HOST)
            .finish()
    }
}

/// Builds the upstream client (one per process; clones share its pool).
pub fn http_client() -> HttpClient {
    // Other parts of the process (tests' clients) look for a process-wide provider: ring,
    // as here. A second install fails harmlessly.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls_config(Arc::new(rustls::crypto::ring::default_provider())))
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http);
    let connector = ConnectTimeout {
        inner: https,
        timeout: CONNECT_TIMEOUT,
    };
    let inner = Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
        .build(connector);
    HttpClient { inner }
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

/// A connect that took longer than `CONNECT_TIMEOUT`.
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
        let e = classify_transport(&err);
        assert_eq!(e.class, ErrorClass::Unavailable, "{e}");
        assert!(
            e.message.starts_with("could not connect to upstream (TLS)"),
            "{}",
            e.message
        );
    }
}
