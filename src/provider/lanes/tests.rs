//! Lanes over real loopback sockets: an HTTP/2 upstream that allows two streams per
//! connection and holds every answer open, and an HTTP/1.1 one that does the same.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{Full, StreamBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::LaneBody;
use crate::provider::client::{http_client_taking, RequestBody};
use crate::provider::{classify_transport, ErrorClass, HttpClient, DEFAULT_STREAMS_PER_CONNECTION};

/// A guard against a hang only: a request waiting for a stream slot never gets its head.
const HANG_GUARD: Duration = Duration::from_secs(10);

#[derive(Clone, Copy)]
enum Speaks {
    /// HTTP/2 cleartext, at most this many streams per connection.
    H2c(u32),
    Http1,
}

/// An upstream that answers every request with a head and a body that never ends.
struct HoldingServer {
    base: String,
    accepted: Arc<AtomicUsize>,
    _task: tokio::task::JoinHandle<()>,
}

type Held = StreamBody<futures::stream::Pending<Result<Frame<Bytes>, Infallible>>>;

async fn hold(_: Request<Incoming>) -> Result<Response<Held>, Infallible> {
    Ok(Response::new(StreamBody::new(futures::stream::pending())))
}

impl HoldingServer {
    async fn start(speaks: Speaks) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let io = TokioIo::new(tcp);
                tokio::spawn(async move {
                    let _ = match speaks {
                        Speaks::H2c(streams) => {
                            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                .max_concurrent_streams(streams)
                                .serve_connection(io, service_fn(hold))
                                .await
                        }
                        Speaks::Http1 => {
                            hyper::server::conn::http1::Builder::new()
                                .serve_connection(io, service_fn(hold))
                                .await
                        }
                    };
                });
            }
        });
        HoldingServer {
            base,
            accepted,
            _task: task,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn url(&self) -> String {
        format!("{}/v1/chat/completions", self.base)
    }
}

fn post(url: &str) -> Request<RequestBody> {
    let mut request = Request::new(Full::new(Bytes::from_static(b"{}")));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = url.parse().unwrap_or_else(|e| panic!("test uri {url}: {e}"));
    request
}

/// The response head of one more request, which is then held open by the caller.
async fn head(client: &HttpClient, url: &str) -> Response<LaneBody> {
    match tokio::time::timeout(HANG_GUARD, client.request(post(url))).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => panic!("the request failed: {e}"),
        Err(_) => panic!("no response head: the request waits for a stream slot"),
    }
}

async fn heads(client: &HttpClient, url: &str, n: usize) -> Vec<Response<LaneBody>> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(head(client, url).await);
    }
    held
}

#[tokio::test]
async fn streams_beyond_a_connections_limit_go_over_another_connection() {
    let server = HoldingServer::start(Speaks::H2c(2)).await;
    // The lanes' assumed limit is the default: the peer's 2 is read from its settings.
    let (client, lanes) = http_client_taking(DEFAULT_STREAMS_PER_CONNECTION);
    let client = client.with_http2_prior_knowledge();
    let url = server.url();
    let held = heads(&client, &url, 5).await;
    assert!(held.iter().all(|r| r.version() == http::Version::HTTP_2));
    assert_eq!(server.accepted(), 3, "two streams per connection, five held");
    let uri = url.parse().expect("uri");
    assert_eq!(lanes.to(&uri, true), (3, 5));
    drop(held);
    assert_eq!(lanes.to(&uri, true), (3, 0), "every dropped body gave its place back");
    // The same five again, on the same connections.
    let held = heads(&client, &url, 5).await;
    assert_eq!(server.accepted(), 3, "no new connection");
    assert_eq!(lanes.to(&uri, true), (3, 5));
    drop(held);
}

#[tokio::test]
async fn a_new_lane_takes_the_limit_already_read_from_the_peer() {
    let server = HoldingServer::start(Speaks::H2c(1)).await;
    let (client, lanes) = http_client_taking(DEFAULT_STREAMS_PER_CONNECTION);
    let client = client.with_http2_prior_knowledge();
    let url = server.url();
    // The first stream's connection reads the peer's limit of 1.
    let first = head(&client, &url).await;
    // A burst, each taking its lane before any new connection has read a preface: each new
    // lane assumes 1, not the default, so none queues behind another on one connection.
    let burst = futures::future::join_all((0..4).map(|_| head(&client, &url))).await;
    assert_eq!(server.accepted(), 5, "one connection per stream");
    assert_eq!(lanes.to(&url.parse().expect("uri"), true), (5, 5));
    drop((first, burst));
}

#[tokio::test]
async fn streams_below_the_limit_share_one_connection() {
    let server = HoldingServer::start(Speaks::H2c(8)).await;
    let (client, lanes) = http_client_taking(DEFAULT_STREAMS_PER_CONNECTION);
    let client = client.with_http2_prior_knowledge();
    let url = server.url();
    let held = heads(&client, &url, 8).await;
    assert_eq!(server.accepted(), 1);
    assert_eq!(lanes.to(&url.parse().expect("uri"), true), (1, 8));
    drop(held);
}

#[tokio::test]
async fn a_finished_body_a_failed_request_and_a_dropped_one_give_their_place_back() {
    use http_body_util::BodyExt;
    let server = HoldingServer::start(Speaks::H2c(2)).await;
    let (client, lanes) = http_client_taking(DEFAULT_STREAMS_PER_CONNECTION);
    let client = client.with_http2_prior_knowledge();
    let uri: http::Uri = server.url().parse().expect("uri");

    // Dropped before its head (a hedge's loser): no place kept.
    let sent = client.request(post(&server.url()));
    assert_eq!(lanes.to(&uri, true).1, 1);
    drop(sent);
    assert_eq!(lanes.to(&uri, true).1, 0);

    // A body that ends.
    let answered =
        crate::provider::testkit::ReplayServer::start(crate::provider::testkit::Reply::sse("data: [DONE]\n\n")).await;
    let url = format!("{}/v1/chat/completions", answered.base);
    let answered_uri: http::Uri = url.parse().expect("uri");
    let mut body = head(&client, &url).await.into_body();
    assert_eq!(lanes.to(&answered_uri, true).1, 1);
    while let Some(frame) = body.frame().await {
        frame.expect("a whole body");
    }
    assert_eq!(
        lanes.to(&answered_uri, true).1,
        0,
        "released at the body's end, not its drop"
    );
    drop(body);

    // A request that fails.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let dead = format!("http://{}/v1/chat/completions", listener.local_addr().expect("addr"));
    drop(listener);
    let err = client.request(post(&dead)).await.expect_err("nothing listens");
    assert_eq!(classify_transport(&*err).class, ErrorClass::Unavailable);
    assert_eq!(lanes.to(&dead.parse().expect("uri"), true).1, 0);
}

#[tokio::test]
async fn an_http1_upstream_keeps_one_pool_that_opens_a_connection_per_stream() {
    let server = HoldingServer::start(Speaks::Http1).await;
    // Lanes that would take two each: an HTTP/1.1 upstream is known from its first answer
    // and stays on one.
    let (client, lanes) = http_client_taking(2);
    let url = server.url();
    let held = heads(&client, &url, 5).await;
    assert!(held.iter().all(|r| r.version() == http::Version::HTTP_11));
    assert_eq!(server.accepted(), 5, "a connection per stream in flight");
    assert_eq!(lanes.to(&url.parse().expect("uri"), false), (1, 5));
    drop(held);
}

#[tokio::test]
async fn prior_knowledge_to_an_http1_only_upstream_fails_as_unavailable() {
    let server = HoldingServer::start(Speaks::Http1).await;
    let (client, _) = http_client_taking(DEFAULT_STREAMS_PER_CONNECTION);
    let sent = client.with_http2_prior_knowledge().request(post(&server.url()));
    let err = match tokio::time::timeout(HANG_GUARD, sent).await {
        Ok(Err(err)) => err,
        Ok(Ok(_)) => panic!("an HTTP/1.1 server answered HTTP/2"),
        Err(_) => panic!("no answer"),
    };
    let e = classify_transport(&*err);
    assert_eq!(e.class, ErrorClass::Unavailable, "{e}");
}
