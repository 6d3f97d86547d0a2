//! The HTTP/2 pool against an h2 server of the test's own that refuses, resets, holds,
//! floods and closes streams as each test tells it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tokio::sync::mpsc;

use crate::provider::client::{http_client_taking, RequestBody, POOL_IDLE_TIMEOUT};
use crate::provider::lanes::LaneBody;
use crate::provider::{HttpClient, DEFAULT_STREAMS_PER_CONNECTION};

/// A guard against a hang only.
const HANG_GUARD: Duration = Duration::from_secs(10);

#[derive(Clone, Copy)]
enum Behaviour {
    /// Answers `data: ok` to every stream.
    Answer,
    /// Refuses the first stream it is sent (REFUSED_STREAM), answers the rest.
    RefuseFirst,
    /// Closes each connection once it has answered one stream (an idle close with no GOAWAY).
    OnePerConnection,
    /// `/flood` streams get 4 MiB of body, sent as windows allow; others are answered.
    Flood,
    /// Sends a head and never ends the body; tells `resets` how each stream was reset.
    Hold,
    /// Holds the first stream and, as it takes it, starts a graceful shutdown (GOAWAY);
    /// answers the rest (the connection stays open while the first is held).
    GoAwayWhileHolding,
    /// Answers the first stream; takes the second, reads its request, then drops the
    /// connection with no answer and no GOAWAY (a crash after the request arrived).
    DropAfterSecondRequest,
}

struct Server {
    base: String,
    accepted: Arc<AtomicUsize>,
    streams: Arc<AtomicUsize>,
    resets: mpsc::Receiver<Reason>,
    closed: mpsc::Receiver<()>,
}

impl Server {
    async fn start(behaviour: Behaviour) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let (accepted, streams) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (reset_tx, resets) = mpsc::channel(64);
        let (closed_tx, closed) = mpsc::channel(64);
        let (counted, seen) = (Arc::clone(&accepted), Arc::clone(&streams));
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let (seen, reset_tx, closed_tx) = (Arc::clone(&seen), reset_tx.clone(), closed_tx.clone());
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(tcp).await else {
                        return;
                    };
                    while let Some(Ok((request, respond))) = conn.accept().await {
                        let n = seen.fetch_add(1, Ordering::SeqCst);
                        let one_only = matches!(behaviour, Behaviour::OnePerConnection);
                        if matches!(behaviour, Behaviour::GoAwayWhileHolding) && n == 0 {
                            // Before the stream's head is queued, so the GOAWAY goes out first.
                            conn.graceful_shutdown();
                        }
                        if matches!(behaviour, Behaviour::DropAfterSecondRequest) && n == 1 {
                            let (read_tx, read) = tokio::sync::oneshot::channel();
                            tokio::spawn(async move {
                                let mut body = request.into_body();
                                while let Some(Ok(_)) = body.data().await {}
                                let _ = read_tx.send(());
                                // Held so no reset goes out before the connection drops.
                                std::future::pending::<()>().await;
                                drop(respond);
                            });
                            // Drive the connection until the request is read, then drop it.
                            tokio::select! {
                                _ = read => {}
                                _ = conn.accept() => {}
                            }
                            break;
                        }
                        tokio::spawn(serve(behaviour, n, request, respond, reset_tx.clone()));
                        if one_only {
                            // Let the answer out, then drop the socket with no GOAWAY.
                            let _ = tokio::time::timeout(Duration::from_millis(200), conn.accept()).await;
                            break;
                        }
                    }
                    let _ = closed_tx.send(()).await;
                });
            }
        });
        Server {
            base,
            accepted,
            streams,
            resets,
            closed,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// Whether the server holds stream `n` open.
fn behaviour_holds(behaviour: Behaviour, n: usize) -> bool {
    match behaviour {
        Behaviour::Hold => true,
        Behaviour::GoAwayWhileHolding => n == 0,
        _ => false,
    }
}

async fn serve(
    behaviour: Behaviour,
    n: usize,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    resets: mpsc::Sender<Reason>,
) {
    let path = request.uri().path().to_string();
    let mut body = request.into_body();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    if matches!(behaviour, Behaviour::RefuseFirst) && n == 0 {
        respond.send_reset(Reason::REFUSED_STREAM);
        return;
    }
    let head = Response::builder()
        .header("content-type", "text/event-stream")
        .body(())
        .expect("head");
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    match behaviour {
        _ if behaviour_holds(behaviour, n) => {
            if let Ok(reason) = futures::future::poll_fn(|cx| send.poll_reset(cx)).await {
                let _ = resets.send(reason).await;
            }
        }
        Behaviour::Flood if path == "/flood" => {
            let chunk = Bytes::from(vec![b'x'; 16 * 1024]);
            for _ in 0..256 {
                send.reserve_capacity(chunk.len());
                match futures::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                    Some(Ok(_)) => {}
                    _ => return,
                }
                if send.send_data(chunk.clone(), false).is_err() {
                    return;
                }
            }
            let _ = send.send_data(Bytes::new(), true);
        }
        _ => {
            let _ = send.send_data(Bytes::from_static(b"data: ok\n\n"), true);
        }
    }
}

fn client() -> (HttpClient, Arc<crate::provider::lanes::Lanes>) {
    let (client, lanes) = http_client_taking(DEFAULT_STREAMS_PER_CONNECTION);
    (client.with_http2_prior_knowledge(), lanes)
}

fn post(url: &str) -> Request<RequestBody> {
    let mut request = Request::new(Full::new(Bytes::from_static(b"{\"model\":\"m\"}")));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = url.parse().unwrap_or_else(|e| panic!("test uri {url}: {e}"));
    request
}

async fn head(client: &HttpClient, url: &str) -> Response<LaneBody> {
    match tokio::time::timeout(HANG_GUARD, client.request(post(url))).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => panic!("the request failed: {e}"),
        Err(_) => panic!("no response head"),
    }
}

async fn text(response: Response<LaneBody>) -> String {
    let body = tokio::time::timeout(HANG_GUARD, response.into_body().collect())
        .await
        .expect("the body ends")
        .expect("a whole body");
    String::from_utf8_lossy(&body.to_bytes()).into_owned()
}

#[tokio::test]
async fn a_refused_stream_is_sent_again_and_answered() {
    let server = Server::start(Behaviour::RefuseFirst).await;
    let (client, _) = client();
    let response = head(&client, &server.url("/v1/chat/completions")).await;
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(text(response).await, "data: ok\n\n");
    assert_eq!(server.streams.load(Ordering::SeqCst), 2, "refused once, then answered");
}

#[tokio::test]
async fn a_connection_the_peer_closed_is_replaced() {
    let mut server = Server::start(Behaviour::OnePerConnection).await;
    let (client, lanes) = client();
    let url = server.url("/v1/chat/completions");
    let uri: http::Uri = url.parse().expect("uri");
    assert_eq!(text(head(&client, &url).await).await, "data: ok\n\n");
    tokio::time::timeout(HANG_GUARD, server.closed.recv())
        .await
        .expect("the peer closes");
    // Its task sees the close and takes it out of the pool (a stream sent in the meantime
    // would fail: it may have reached the peer, so it is not sent twice).
    let seen = async {
        while lanes.to(&uri, true).0 > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(HANG_GUARD, seen)
        .await
        .expect("the closed connection leaves the pool");
    assert_eq!(text(head(&client, &url).await).await, "data: ok\n\n");
    assert_eq!(
        server.accepted.load(Ordering::SeqCst),
        2,
        "a new connection for the second"
    );
}

#[tokio::test]
async fn a_dropped_body_resets_its_stream_and_gives_its_place_back() {
    let mut server = Server::start(Behaviour::Hold).await;
    let (client, lanes) = client();
    let url = server.url("/v1/chat/completions");
    let uri: http::Uri = url.parse().expect("uri");
    let held = head(&client, &url).await;
    assert_eq!(lanes.to(&uri, true), (1, 1));
    drop(held);
    let reason = tokio::time::timeout(HANG_GUARD, server.resets.recv())
        .await
        .expect("a reset");
    assert_eq!(reason, Some(Reason::CANCEL));
    assert_eq!(lanes.to(&uri, true), (1, 0));
    // Dropped before its head (a hedge's loser): reset too, no place kept.
    let sent = client.request(post(&url));
    assert_eq!(lanes.to(&uri, true).1, 1);
    drop(sent);
    assert_eq!(lanes.to(&uri, true).1, 0);
}

#[tokio::test]
async fn streams_nobody_reads_never_stall_the_others_on_their_connection() {
    let server = Server::start(Behaviour::Flood).await;
    let (client, lanes) = client();
    // Three 4 MiB answers nobody reads: each stops at its stream window, far below the
    // connection's, so a fourth stream still gets its answer.
    let mut unread = Vec::new();
    for _ in 0..3 {
        unread.push(head(&client, &server.url("/flood")).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(text(head(&client, &server.url("/small")).await).await, "data: ok\n\n");
    assert_eq!(server.accepted.load(Ordering::SeqCst), 1, "all on one connection");
    assert_eq!(lanes.to(&server.url("/flood").parse().expect("uri"), true), (1, 3));
    // And one of them, read now, is whole.
    let body = tokio::time::timeout(HANG_GUARD, unread.remove(0).into_body().collect())
        .await
        .expect("the body ends")
        .expect("a whole body");
    assert_eq!(body.to_bytes().len(), 4 * 1024 * 1024);
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_closes_after_the_idle_timeout() {
    let mut server = Server::start(Behaviour::Answer).await;
    let (client, lanes) = client();
    let url = server.url("/v1/chat/completions");
    let uri: http::Uri = url.parse().expect("uri");
    assert_eq!(text(head(&client, &url).await).await, "data: ok\n\n");
    tokio::time::sleep(POOL_IDLE_TIMEOUT - Duration::from_secs(1)).await;
    assert!(server.closed.try_recv().is_err(), "still open before the timeout");
    assert_eq!(lanes.to(&uri, true), (1, 0));
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.closed.recv().await.expect("closed after the timeout");
    assert_eq!(lanes.to(&uri, true), (0, 0));
}

#[tokio::test]
async fn a_connection_going_away_is_left_for_a_new_one_while_its_streams_finish() {
    let server = Server::start(Behaviour::GoAwayWhileHolding).await;
    let (client, _) = client();
    let url = server.url("/v1/chat/completions");
    // The held stream's head comes after the GOAWAY: the client has read it by now.
    let _held = head(&client, &url).await;
    // h2 keeps the connection running for the held stream; the next requests are not sent
    // on it (it refuses them unsent) but on a new connection, the first of them once only.
    for _ in 0..2 {
        assert_eq!(text(head(&client, &url).await).await, "data: ok\n\n");
    }
    assert_eq!(server.accepted.load(Ordering::SeqCst), 2, "one new connection");
    assert_eq!(
        server.streams.load(Ordering::SeqCst),
        3,
        "each request reached the server once"
    );
}

#[tokio::test]
async fn a_request_whose_connection_broke_after_it_went_out_is_not_sent_again() {
    let server = Server::start(Behaviour::DropAfterSecondRequest).await;
    let (client, _) = client();
    let url = server.url("/v1/chat/completions");
    assert_eq!(text(head(&client, &url).await).await, "data: ok\n\n");
    // The second, on the now reused connection, reaches the server, which then dies: the
    // server may have acted on it, so it fails instead of going out a second time.
    let sent = tokio::time::timeout(HANG_GUARD, client.request(post(&url)))
        .await
        .expect("an answer or an error");
    let err = sent.expect_err("the connection died under the request");
    let e = crate::provider::classify_transport(&*err);
    assert_eq!(e.class, crate::provider::ErrorClass::Unavailable, "{e}");
    assert_eq!(
        server.streams.load(Ordering::SeqCst),
        2,
        "the second request went out once"
    );
    assert_eq!(
        server.accepted.load(Ordering::SeqCst),
        1,
        "no connection for a second try"
    );
}

#[tokio::test(start_paused = true)]
async fn an_h2_connect_that_times_out_fails_as_a_timeout() {
    // An https upstream that takes the connection and never answers the TLS hello.
    let (addr, _held) = crate::provider::testkit::silent_listener().await;
    let bound = Duration::from_millis(300);
    let (connector, _) =
        crate::provider::client::connector(hyper_util::client::proxy::matcher::Matcher::builder().build());
    let target: http::Uri = format!("https://{addr}/").parse().expect("uri");
    let pool = Arc::new(super::H2Pool::new(
        addr.to_string(),
        target,
        false,
        connector.with_timeout(bound),
    ));
    let sent = pool.send(post(&format!("https://{addr}/v1/chat/completions")));
    let err = match tokio::time::timeout(bound * 10, sent).await {
        Ok(Err(super::Sending::Failed(err))) => err,
        Ok(Err(super::Sending::NotH2(_))) => panic!("no TLS handshake finished"),
        Ok(Ok(_)) => panic!("a silent upstream cannot answer"),
        Err(_) => panic!("the connect bound did not fire"),
    };
    let e = crate::provider::classify_transport(&*err);
    assert_eq!(e.class, crate::provider::ErrorClass::Timeout, "{e}");
}

#[tokio::test]
async fn upstreams_past_the_own_sets_limit_share_the_pooled_overflow_set() {
    let server = Server::start(Behaviour::Answer).await;
    let (client, lanes) = client();
    // Every own set taken by other upstreams (no connection is opened for them).
    for i in 0..super::super::lanes::MAX_UPSTREAMS {
        let other: http::Uri = format!("http://upstream-{i}.invalid/").parse().expect("uri");
        let _ = lanes.to(&other, true);
    }
    // This one shares the overflow set, which has no one target: its request goes the
    // pooled way (h2c by prior knowledge there too), not to a connection of no address.
    let response = head(&client, &server.url("/v1/chat/completions")).await;
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(text(response).await, "data: ok\n\n");
}
