//! The HTTP/1.1 pool against a loopback server of the test's own, written on the socket, that
//! records each request's head and answers whole, holds its answer open, or closes each
//! connection after one answer, as each test tells it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::provider::classify_transport;
use crate::provider::client::{http_client_taking, RequestBody, POOL_IDLE_TIMEOUT};
use crate::provider::lanes::{LaneBody, Lanes};
use crate::provider::{HttpClient, DEFAULT_STREAMS_PER_CONNECTION};
use crate::types::ErrorClass;

/// A guard against a hang only.
const HANG_GUARD: Duration = Duration::from_secs(10);

const ANSWER: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 14\r\n\r\ndata: [DONE]\n\n";

/// The same answer as a streamed one is framed: chunked, no length.
const CHUNKED: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";

#[derive(Clone, Copy, PartialEq)]
enum Behaviour {
    /// Answers each request whole and keeps the connection.
    Answer,
    /// Answers each request whole, chunked, and keeps the connection.
    AnswerChunked,
    /// Sends a head and the start of a body that never ends.
    Hold,
    /// Answers each request whole, then closes the connection without saying so.
    CloseAfterEach,
}

struct Server {
    base: String,
    accepted: Arc<AtomicUsize>,
    /// Connections the client closed (read end of file).
    closed: Arc<AtomicUsize>,
    heads: Arc<Mutex<Vec<String>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(behaviour: Behaviour) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let (accepted, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let (a, c, h) = (Arc::clone(&accepted), Arc::clone(&closed), Arc::clone(&heads));
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let (c, h) = (Arc::clone(&c), Arc::clone(&h));
                tokio::spawn(async move {
                    serve(tcp, behaviour, &h).await;
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        Server {
            base,
            accepted,
            closed,
            heads,
            _task: task,
        }
    }

    fn url(&self) -> String {
        format!("{}/v1/chat/completions?x=1", self.base)
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    async fn closes(&self, n: usize) {
        let waited = tokio::time::timeout(HANG_GUARD, async {
            while self.closed.load(Ordering::SeqCst) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "the client closed {n} connection(s)");
    }
}

/// Serves one connection until the client closes it (returns then) or `behaviour` ends it.
async fn serve(mut tcp: TcpStream, behaviour: Behaviour, heads: &Mutex<Vec<String>>) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = read_head(&mut tcp, &mut buf).await else {
            return;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        let length = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap_or(0))
            })
            .unwrap_or(0usize);
        while buf.len() < end + length {
            let mut more = [0u8; 4096];
            match tcp.read(&mut more).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&more[..n]),
            }
        }
        buf.drain(..end + length);
        heads.lock().push(head);
        match behaviour {
            Behaviour::AnswerChunked => {
                if tcp.write_all(CHUNKED).await.is_err() {
                    return;
                }
            }
            Behaviour::Answer | Behaviour::CloseAfterEach => {
                if tcp.write_all(ANSWER).await.is_err() {
                    return;
                }
                if behaviour == Behaviour::CloseAfterEach {
                    return;
                }
            }
            Behaviour::Hold => {
                let _ = tcp
                    .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n")
                    .await;
                // Until the client closes.
                let mut rest = [0u8; 64];
                while matches!(tcp.read(&mut rest).await, Ok(n) if n > 0) {}
                return;
            }
        }
    }
}

/// Reads up to the end of a request head; its length with the blank line, or `None` at EOF.
async fn read_head(tcp: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(at + 4);
        }
        let mut more = [0u8; 4096];
        match tcp.read(&mut more).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&more[..n]),
        }
    }
}

fn post(url: &str) -> Request<RequestBody> {
    let mut request = Request::new(Full::new(Bytes::from_static(b"{\"a\":1}")));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = url.parse().unwrap_or_else(|e| panic!("test uri {url}: {e}"));
    request
}

async fn head(client: &HttpClient, url: &str) -> http::Response<LaneBody> {
    match tokio::time::timeout(HANG_GUARD, client.request(post(url))).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => panic!("the request failed: {e}"),
        Err(_) => panic!("no response head"),
    }
}

async fn whole(client: &HttpClient, url: &str) -> Bytes {
    let body = head(client, url).await.into_body();
    tokio::time::timeout(HANG_GUARD, body.collect())
        .await
        .expect("the body ends")
        .expect("a whole body")
        .to_bytes()
}

fn client() -> (HttpClient, Arc<Lanes>) {
    http_client_taking(DEFAULT_STREAMS_PER_CONNECTION)
}

fn uri(url: &str) -> http::Uri {
    url.parse().expect("uri")
}

#[tokio::test]
async fn answers_one_after_another_share_one_keep_alive_connection() {
    for framing in [Behaviour::Answer, Behaviour::AnswerChunked] {
        let server = Server::start(framing).await;
        let (client, lanes) = client();
        for _ in 0..3 {
            assert_eq!(
                &whole(&client, &server.url()).await[..],
                b"data: [DONE]\n\n",
                "the answer"
            );
        }
        assert_eq!(
            server.accepted(),
            1,
            "one connection, kept alive between the answers (chunked: {})",
            framing == Behaviour::AnswerChunked
        );
        assert_eq!(
            lanes.h1(&uri(&server.url())),
            Some((1, 0)),
            "idle in the pool, no answer holding it"
        );
    }
}

#[tokio::test]
async fn a_request_goes_in_origin_form_with_the_host_header() {
    let server = Server::start(Behaviour::Answer).await;
    let (client, _) = client();
    whole(&client, &server.url()).await;
    let heads = server.heads.lock().clone();
    let addr = server.base.trim_start_matches("http://");
    for head in &heads {
        assert!(
            head.starts_with("POST /v1/chat/completions?x=1 HTTP/1.1\r\n"),
            "origin form: {head}"
        );
        assert!(
            head.to_ascii_lowercase().contains(&format!("\r\nhost: {addr}\r\n")),
            "Host: {head}"
        );
    }
}

#[tokio::test]
async fn answers_at_once_each_take_a_connection_of_their_own() {
    let server = Server::start(Behaviour::Hold).await;
    let (client, lanes) = client();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(head(&client, &server.url()).await);
    }
    assert_eq!(server.accepted(), 3, "a connection per answer in flight");
    assert_eq!(lanes.h1(&uri(&server.url())), Some((0, 3)));
    drop(held);
    server.closes(3).await;
    assert_eq!(lanes.h1(&uri(&server.url())), Some((0, 0)), "nothing kept of them");
}

#[tokio::test]
async fn a_body_dropped_before_its_end_closes_its_connection_and_is_never_reused() {
    let server = Server::start(Behaviour::Hold).await;
    let (client, lanes) = client();
    let mut body = head(&client, &server.url()).await.into_body();
    let first = tokio::time::timeout(HANG_GUARD, body.frame()).await.expect("a frame");
    assert!(matches!(first, Some(Ok(_))), "the start of the body");
    drop(body);
    server.closes(1).await;
    let _second = head(&client, &server.url()).await;
    assert_eq!(server.accepted(), 2, "the next request opened a new connection");
    assert_eq!(lanes.h1(&uri(&server.url())), Some((0, 1)));
}

#[tokio::test]
async fn a_connection_the_peer_closes_after_each_answer_is_never_sent_to_again() {
    let server = Server::start(Behaviour::CloseAfterEach).await;
    let (client, _) = client();
    for i in 1..=4 {
        assert_eq!(
            &whole(&client, &server.url()).await[..],
            b"data: [DONE]\n\n",
            "answer {i}"
        );
        // The peer's close reaches the idle connection before the next request, or the
        // request comes back unsent and goes on a new connection: either way it is served.
    }
    assert_eq!(server.accepted(), 4, "a new connection for each answer");
    assert_eq!(server.heads.lock().len(), 4, "and each request sent once");
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_closes_after_the_idle_timeout() {
    let server = Server::start(Behaviour::Answer).await;
    let (client, lanes) = client();
    whole(&client, &server.url()).await;
    assert_eq!(lanes.h1(&uri(&server.url())), Some((1, 0)), "idle");
    tokio::time::sleep(POOL_IDLE_TIMEOUT / 2).await;
    assert_eq!(server.closed.load(Ordering::SeqCst), 0, "kept before its idle timeout");
    tokio::time::sleep(POOL_IDLE_TIMEOUT).await;
    server.closes(1).await;
    assert_eq!(lanes.h1(&uri(&server.url())), Some((0, 0)), "and out of the pool");
}

#[test]
fn the_host_header_names_the_host_and_a_port_other_than_80_never_a_userinfo() {
    use hyper_util::client::proxy::matcher::Matcher;
    let host = |target: &str| {
        let (connector, _) = crate::provider::client::connector(Matcher::builder().build());
        super::H1Pool::new("u".into(), target.parse().expect("uri"), connector)
            .map(|pool| pool.host.to_str().expect("ascii").to_string())
    };
    assert_eq!(host("http://user:pw@llm.lan:8000/").as_deref(), Some("llm.lan:8000"));
    assert_eq!(host("http://llm.lan:80/").as_deref(), Some("llm.lan"));
    assert_eq!(host("http://llm.lan/").as_deref(), Some("llm.lan"));
    assert_eq!(host("http://[::1]:9000/").as_deref(), Some("[::1]:9000"));
}

#[tokio::test]
async fn a_refused_connect_is_a_failed_connect() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let dead = format!("http://{}/v1/chat/completions", listener.local_addr().expect("addr"));
    drop(listener);
    let (client, lanes) = client();
    let err = client.request(post(&dead)).await.expect_err("nothing listens");
    let e = classify_transport(&*err);
    assert_eq!(e.class, ErrorClass::Unavailable, "{e}");
    assert!(e.message.starts_with("could not connect to upstream"), "{}", e.message);
    assert_eq!(lanes.h1(&uri(&dead)), Some((0, 0)));
}
