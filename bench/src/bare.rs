//! The bare pass-through proxy every figure is measured beside: hyper 1 in, a pooled
//! keep-alive hyper client out, bodies relayed frame by frame with no parsing and no routing.
//! It is the floor: whatever a gateway adds over it is the gateway's own work. Beside it, a
//! WebSocket server that only accepts and reads, the floor for tailcut's `/v1/ws`.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

type Body = BoxBody<Bytes, hyper::Error>;

/// Relays every request on `listener` to `upstream`, path and headers as they came, over
/// HTTP/2 with prior knowledge when `h2c` (every stream over one connection, as hyper-util's
/// pooled client does), else HTTP/1.1.
pub async fn serve(listener: TcpListener, upstream: SocketAddr, h2c: bool) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).http2_only(h2c).build(connector);
    while let Ok((tcp, _)) = listener.accept().await {
        let _ = tcp.set_nodelay(true);
        let client = client.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| relay(client.clone(), upstream, req));
            let _ = http1::Builder::new().serve_connection(TokioIo::new(tcp), service).await;
        });
    }
}

async fn relay(
    client: Client<HttpConnector, Incoming>,
    upstream: SocketAddr,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let uri: Result<Uri, _> = format!("http://{upstream}{path}").parse();
    let Ok(uri) = uri else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    *req.uri_mut() = uri;
    match client.request(req).await {
        Ok(response) => Ok(response.map(BodyExt::boxed)),
        Err(_) => Ok(status(StatusCode::BAD_GATEWAY)),
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()).map_err(|never| match never {}).boxed());
    *response.status_mut() = code;
    response
}

/// Accepts WebSockets and reads them until they close, with `buffer`-byte buffers.
pub async fn serve_ws(listener: TcpListener, buffer: usize) {
    while let Ok((tcp, _)) = listener.accept().await {
        tokio::spawn(async move {
            if let Ok(mut ws) = tokio_tungstenite::accept_async_with_config(tcp, Some(ws_config(buffer))).await {
                while let Some(Ok(_)) = ws.next().await {}
            }
        });
    }
}

pub fn ws_config(buffer: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(buffer)
        .write_buffer_size(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;

    use http_body_util::StreamBody;

    use crate::client::{Conn, Target};
    use hyper::body::Frame;

    /// An upstream that answers every request with `chunks`, one body frame each, and echoes
    /// the request path in a header.
    async fn upstream(chunks: Vec<Bytes>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let chunks = chunks.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| answer(req, chunks.clone()));
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(tcp), service).await;
                });
            }
        });
        addr
    }

    type Frames = StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

    async fn answer(req: Request<Incoming>, chunks: Vec<Bytes>) -> Result<Response<Frames>, Infallible> {
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = chunks.into_iter().map(|c| Ok(Frame::data(c))).collect();
        let mut response = Response::new(StreamBody::new(futures::stream::iter(frames)));
        let path = req.uri().path().parse().expect("header value");
        response.headers_mut().insert("x-path", path);
        Ok(response)
    }

    #[tokio::test]
    async fn relays_every_byte_and_the_path_as_sent() {
        let chunks: Vec<Bytes> = [&b"data: one\n\n"[..], b"data: \xc3\xa9\n\n", b"", b"data: [DONE]\n\n"]
            .into_iter()
            .map(Bytes::from_static)
            .collect();
        let up = upstream(chunks.clone()).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let proxy = listener.local_addr().expect("addr");
        tokio::spawn(serve(listener, up, false));
        let mut conn = Conn::open(proxy).await.expect("connected");
        let target = Target {
            addr: proxy,
            path: "/s/flat/v1/chat/completions?x=1".into(),
            body: Bytes::from_static(b"{}"),
            tailcut: false,
            bearer: None,
        };
        let (_, response) = conn.send(&target).await.expect("relayed");
        assert_eq!(
            response.headers().get("x-path").and_then(|v| v.to_str().ok()),
            Some("/s/flat/v1/chat/completions"),
            "the path reaches the upstream unchanged"
        );
        let body = response.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(body.as_ref(), chunks.concat().as_slice(), "every byte, in order");
    }

    #[tokio::test]
    async fn an_unreachable_upstream_is_a_502() {
        let dead = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let up = dead.local_addr().expect("addr");
        drop(dead);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let proxy = listener.local_addr().expect("addr");
        tokio::spawn(serve(listener, up, false));
        let mut conn = Conn::open(proxy).await.expect("connected");
        let target = Target {
            addr: proxy,
            path: "/".into(),
            body: Bytes::new(),
            tailcut: false,
            bearer: None,
        };
        let refused = conn.send(&target).await.err();
        assert_eq!(refused.as_deref(), Some("status 502 Bad Gateway"));
    }
}
