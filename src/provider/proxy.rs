//! The egress proxy's leg of an upstream connect: straight to the upstream, a CONNECT tunnel
//! through the proxy for an https upstream, or a connection to the proxy for a plain-http one
//! (requests then in absolute form); a failure at the proxy named as such, its address logged
//! and kept out of the error.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::uri::Scheme;
use http::Uri;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioIo;
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The TCP leg of a connect: straight to the upstream, or to the proxy the matcher names for
/// it (`NO_PROXY` hosts and upstreams of a scheme without a proxy connect directly). An
/// https upstream behind a proxy gets a CONNECT tunnel; a plain-http one a connection to the
/// proxy marked as proxied, so the client sends its requests in absolute form.
#[derive(Clone)]
pub(crate) struct ProxyConnector {
    tcp: HttpConnector,
    proxies: Arc<Matcher>,
}

impl ProxyConnector {
    pub fn new(tcp: HttpConnector, proxies: Arc<Matcher>) -> Self {
        ProxyConnector { tcp, proxies }
    }
}

type Connecting = Pin<Box<dyn Future<Output = Result<ProxiedIo, BoxError>> + Send>>;

impl Service<Uri> for ProxyConnector {
    type Response = ProxiedIo;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.tcp.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let Some(proxy) = self.proxies.intercept(&dst) else {
            let connecting = self.tcp.call(dst);
            return Box::pin(async move { Ok(ProxiedIo::direct(connecting.await?)) });
        };
        // The matcher strips the credentials from the proxy's URL: this names host and port.
        let at = proxy.uri().authority().map_or_else(String::new, ToString::to_string);
        if proxy.uri().scheme() != Some(&Scheme::HTTP) {
            let scheme = proxy.uri().scheme_str().unwrap_or_default().to_string();
            let failed = ProxyFailed::Unsupported { proxy: at, scheme };
            failed.log();
            return Box::pin(async move { Err(failed.into()) });
        }
        let mut to_proxy = ToProxy {
            tcp: self.tcp.clone(),
            at: at.clone(),
        };
        if dst.scheme() == Some(&Scheme::HTTPS) {
            let mut tunnel = Tunnel::new(proxy.uri().clone(), to_proxy);
            if let Some(auth) = proxy.basic_auth() {
                tunnel = tunnel.with_auth(auth.clone());
            }
            // `Tunnel` is ready whenever its TCP connector is, and `HttpConnector` always is.
            let connecting = tunnel.call(dst);
            return Box::pin(async move {
                let failed: BoxError = match connecting.await {
                    Ok(io) => return Ok(ProxiedIo::direct(io)),
                    Err(e) => e.into(),
                };
                // A proxy that could not be reached is named so by `ToProxy`, inside the
                // tunnel's error; any other tunnel failure is the proxy's answer.
                if failed.source().is_some_and(|inner| inner.is::<ProxyFailed>()) {
                    return Err(failed);
                }
                let failed = ProxyFailed::Refused {
                    proxy: at,
                    source: failed,
                };
                failed.log();
                Err(failed.into())
            });
        }
        let connecting = to_proxy.call(proxy.uri().clone());
        Box::pin(async move {
            Ok(ProxiedIo {
                io: connecting.await?,
                absolute_form: true,
            })
        })
    }
}

/// The TCP connect to a proxy; its failure says that the proxy could not be reached.
#[derive(Clone)]
struct ToProxy {
    tcp: HttpConnector,
    at: String,
}

impl Service<Uri> for ToProxy {
    type Response = TokioIo<tokio::net::TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.tcp.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, proxy: Uri) -> Self::Future {
        let (connecting, at) = (self.tcp.call(proxy), self.at.clone());
        Box::pin(async move {
            connecting.await.map_err(|e| {
                let failed = ProxyFailed::Unreachable {
                    proxy: at,
                    source: e.into(),
                };
                failed.log();
                failed.into()
            })
        })
    }
}

/// A connect through the egress proxy that failed at the proxy. Its message names no
/// address (it can reach a client in an error body, and the proxy is internal); `proxy`, its
/// host and port (never its credentials), goes to the log, once, where it failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyFailed {
    #[error("could not reach the egress proxy")]
    Unreachable {
        proxy: String,
        #[source]
        source: BoxError,
    },
    #[error("the egress proxy refused the tunnel")]
    Refused {
        proxy: String,
        #[source]
        source: BoxError,
    },
    #[error("the egress proxy is a {scheme}:// proxy; only http:// proxies are supported")]
    Unsupported { proxy: String, scheme: String },
}

impl ProxyFailed {
    fn log(&self) {
        let (ProxyFailed::Unreachable { proxy, .. }
        | ProxyFailed::Refused { proxy, .. }
        | ProxyFailed::Unsupported { proxy, .. }) = self;
        let cause = std::error::Error::source(self).map(ToString::to_string);
        tracing::warn!(%proxy, error = %self, cause = cause.as_deref(), "upstream connect failed at the egress proxy");
    }
}

/// A TCP connection to the upstream (maybe through a tunnel) or to a proxy that takes
/// absolute-form requests; tells hyper-util's client which.
pub(crate) struct ProxiedIo {
    io: TokioIo<tokio::net::TcpStream>,
    absolute_form: bool,
}

impl ProxiedIo {
    fn direct(io: TokioIo<tokio::net::TcpStream>) -> Self {
        ProxiedIo {
            io,
            absolute_form: false,
        }
    }
}

impl Connection for ProxiedIo {
    fn connected(&self) -> Connected {
        self.io.connected().proxy(self.absolute_form)
    }
}

impl hyper::rt::Read for ProxiedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for ProxiedIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
