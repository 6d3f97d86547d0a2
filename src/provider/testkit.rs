//! Test support for the provider tests: a loopback HTTP server that replays fixed upstream
//! bytes and records the requests it gets, wire decoders run over fixed reads, and the
//! small builders several test modules need.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::http::header::{HeaderName, HeaderValue};
use axum::http::{HeaderMap, Response, StatusCode, Uri};
use bytes::Bytes;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::{drive, Delta, ErrorClass, ProviderError, UpstreamRequest, WireDecoder};
use crate::types::{ChatRequest, Message, Role, Usage};

/// A loopback listener that takes every connection and never says a byte (an https upstream
/// that never answers the TLS hello), held until the returned task is dropped or ends.
pub(crate) async fn silent_listener() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (addr, held)
}

#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub chunks: Vec<Bytes>,
    /// Keep the connection open after the last chunk instead of ending the body.
    pub hold_open: bool,
}

impl Reply {
    pub fn sse(body: &str) -> Self {
        Reply {
            status: 200,
            headers: vec![("content-type", "text/event-stream".to_string())],
            chunks: vec![Bytes::copy_from_slice(body.as_bytes())],
            hold_open: false,
        }
    }

    pub fn error(status: u16, headers: &[(&'static str, &str)], body: &str) -> Self {
        Reply {
            status,
            headers: headers.iter().map(|(k, v)| (*k, v.to_string())).collect(),
            chunks: vec![Bytes::copy_from_slice(body.as_bytes())],
            hold_open: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: HeaderMap,
    pub body: serde_json::Value,
}

pub struct ReplayServer {
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    body_dropped: Arc<(AtomicBool, Notify)>,
    _server: tokio::task::JoinHandle<()>,
}

impl ReplayServer {
    pub async fn start(reply: Reply) -> Self {
        let requests: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let body_dropped: Arc<(AtomicBool, Notify)> = Arc::default();
        let (recorder, dropped) = (requests.clone(), body_dropped.clone());
        let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
            let (reply, recorder, dropped) = (reply.clone(), recorder.clone(), dropped.clone());
            async move {
                let body = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                recorder.lock().push(Recorded {
                    path: uri.path().to_string(),
                    headers,
                    body,
                });
                respond(reply, dropped)
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ReplayServer {
            base: format!("http://{addr}"),
            requests,
            body_dropped,
            _server: server,
        }
    }

    /// Resolves once the server saw the response body dropped (the client went away).
    pub async fn body_dropped(&self) {
        loop {
            let notified = self.body_dropped.1.notified();
            if self.body_dropped.0.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }
}

struct DropFlag(Arc<(AtomicBool, Notify)>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0 .0.store(true, Ordering::SeqCst);
        self.0 .1.notify_waiters();
    }
}

fn respond(reply: Reply, dropped: Arc<(AtomicBool, Notify)>) -> Response<Body> {
    let flag = DropFlag(dropped);
    let stream = async_stream::stream! {
        let _flag = flag;
        for chunk in reply.chunks {
            yield Ok::<_, Infallible>(chunk);
        }
        if reply.hold_open {
            futures::future::pending::<()>().await;
        }
    };
    let mut response = Response::new(Body::from_stream(stream));
    *response.status_mut() = StatusCode::from_u16(reply.status).expect("valid test status");
    for (name, value) in reply.headers {
        response
            .headers_mut()
            .insert(name, value.parse().expect("valid test header"));
    }
    response
}

/// What a decoder run yields, in order.
pub type Out = Vec<Result<Delta, ProviderError>>;

/// Runs `decoder` over a body that arrives in exactly these reads.
pub async fn decode_chunks<D: WireDecoder>(decoder: D, chunks: Vec<Vec<u8>>) -> Out {
    let body = futures::stream::iter(chunks.into_iter().map(|c| Ok::<_, std::io::Error>(Bytes::from(c))));
    drive(body, decoder).collect().await
}

pub fn text(s: &str) -> Result<Delta, ProviderError> {
    Ok(Delta::Text(s.to_string()))
}

pub fn usage(input: u32, output: u32) -> Result<Delta, ProviderError> {
    Ok(Delta::Usage(Usage::new(input, output)))
}

/// A usage delta with the details a route reported.
pub fn usage_with(
    input: u32,
    output: u32,
    details: (Option<u32>, Option<u32>, Option<u32>),
) -> Result<Delta, ProviderError> {
    let (cache_read_tokens, cache_write_tokens, reasoning_tokens) = details;
    Ok(Delta::Usage(Usage {
        cache_read_tokens,
        cache_write_tokens,
        reasoning_tokens,
        ..Usage::new(input, output)
    }))
}

/// The class of the error a run ended with, if it ended with one.
pub fn error_class(out: &Out) -> Option<ErrorClass> {
    out.last().and_then(|r| r.as_ref().err()).map(|e| e.class)
}

/// One attempt's request, for tests that look only at the body built from it.
pub fn upstream(chat: ChatRequest, prefill: Option<&str>) -> UpstreamRequest {
    UpstreamRequest {
        chat: Arc::new(chat),
        prefill: prefill.map(|text| crate::types::Prefill {
            text: text.to_string(),
            convention: crate::types::PrefillConvention::Assistant,
        }),
        request_id: "req-1".into(),
    }
}

/// One attempt's request continuing `text` under `convention`.
pub fn continuation(chat: ChatRequest, text: &str, convention: crate::types::PrefillConvention) -> UpstreamRequest {
    UpstreamRequest {
        chat: Arc::new(chat),
        prefill: Some(crate::types::Prefill {
            text: text.to_string(),
            convention,
        }),
        request_id: "req-1".into(),
    }
}

/// A user's `hi` as one attempt under `request_id`, for tests of the HTTP exchange.
pub fn hello(request_id: &str) -> UpstreamRequest {
    let chat = ChatRequest {
        model: "chat".into(),
        messages: vec![Message::text(Role::User, "hi")],
        ..ChatRequest::default()
    };
    UpstreamRequest {
        chat: Arc::new(chat),
        prefill: None,
        request_id: request_id.into(),
    }
}

/// Response headers from name/value pairs.
pub fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (k, v) in pairs {
        let name = HeaderName::from_bytes(k.as_bytes()).unwrap_or_else(|e| panic!("test header {k}: {e}"));
        map.insert(
            name,
            HeaderValue::from_str(v).unwrap_or_else(|e| panic!("test value {v}: {e}")),
        );
    }
    map
}

/// A loopback HTTP/1.1 upstream at the socket level, for what `ReplayServer` cannot show:
/// how many connections the client opened and closed, and answers cut mid-body. Each
/// request on a connection gets `answer` (raw bytes: status line, headers, body); `cut`
/// closes the connection after the first answer. With `together` = N, no answer is written
/// before N requests arrived (N streams in flight at once).
pub struct SocketServer {
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub accepted: Arc<std::sync::atomic::AtomicUsize>,
    pub requests: Arc<std::sync::atomic::AtomicUsize>,
    /// Connections the client closed.
    pub closed: Arc<std::sync::atomic::AtomicUsize>,
    _server: tokio::task::JoinHandle<()>,
}

impl SocketServer {
    pub async fn start(answer: &str, cut: bool, together: usize) -> Self {
        use std::sync::atomic::AtomicUsize;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let (accepted, requests, closed) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let barrier = Arc::new(tokio::sync::Barrier::new(together.max(1)));
        let answer = Bytes::copy_from_slice(answer.as_bytes());
        let counts = (accepted.clone(), requests.clone(), closed.clone());
        let server = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counts.0.fetch_add(1, Ordering::SeqCst);
                let (requests, closed, barrier, answer) =
                    (counts.1.clone(), counts.2.clone(), barrier.clone(), answer.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut read = [0u8; 4096];
                    let mut first = true;
                    loop {
                        // One request: its head, then `content-length` bytes of body.
                        let head_end = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            match socket.read(&mut read).await {
                                Ok(0) | Err(_) => {
                                    closed.fetch_add(1, Ordering::SeqCst);
                                    return;
                                }
                                Ok(n) => buf.extend_from_slice(&read[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        while buf.len() < head_end + length {
                            match socket.read(&mut read).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&read[..n]),
                            }
                        }
                        buf.drain(..head_end + length);
                        requests.fetch_add(1, Ordering::SeqCst);
                        if first {
                            barrier.wait().await;
                            first = false;
                        }
                        if socket.write_all(&answer).await.is_err() || cut {
                            return;
                        }
                    }
                });
            }
        });
        SocketServer {
            base: format!("http://{addr}"),
            accepted,
            requests,
            closed,
            _server: server,
        }
    }

    /// Waits (bounded) until `counter` reaches `at_least`; its value then.
    pub async fn reaches(counter: &std::sync::atomic::AtomicUsize, at_least: usize) -> usize {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while counter.load(Ordering::SeqCst) < at_least {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
        counter.load(Ordering::SeqCst)
    }
}

/// An HTTP/1.1 200 answer of `sse` with its length.
pub fn sse_answer(sse: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{sse}",
        sse.len()
    )
}

/// What the test proxy does with a CONNECT.
#[derive(Debug, Clone, Copy)]
pub enum ProxyMode {
    /// Opens the tunnel (and relays absolute-form requests).
    Relay,
    /// Answers every request with this status and closes.
    Refuse(u16),
}

/// What the test proxy saw of one connection: its first request's line and its
/// `proxy-authorization`, if any.
#[derive(Debug, Clone)]
pub struct ProxySaw {
    pub request_line: String,
    pub proxy_authorization: Option<String>,
}

/// A loopback HTTP proxy: takes CONNECT (opens a TCP tunnel to the target and relays bytes
/// both ways) and absolute-form requests (relays the connection to the request's host as
/// is), or refuses everything with one status. Records each connection's first request.
pub struct TestProxy {
    /// `http://127.0.0.1:PORT`
    pub url: String,
    pub saw: Arc<Mutex<Vec<ProxySaw>>>,
    _server: tokio::task::JoinHandle<()>,
}

impl TestProxy {
    pub async fn start(mode: ProxyMode) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let saw: Arc<Mutex<Vec<ProxySaw>>> = Arc::default();
        let recorder = saw.clone();
        let server = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(proxy_one(socket, mode, recorder.clone()));
            }
        });
        TestProxy {
            url: format!("http://{addr}"),
            saw,
            _server: server,
        }
    }

    /// The proxy's URL with `user:pass@` in it.
    pub fn url_with_credentials(&self, user: &str, pass: &str) -> String {
        self.url.replacen("http://", &format!("http://{user}:{pass}@"), 1)
    }
}

async fn proxy_one(mut client: tokio::net::TcpStream, mode: ProxyMode, saw: Arc<Mutex<Vec<ProxySaw>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::new();
    let mut read = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match client.read(&mut read).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&read[..n]),
        }
    };
    let text = String::from_utf8_lossy(&head[..head_end]).into_owned();
    let request_line = text.lines().next().unwrap_or_default().to_string();
    let proxy_authorization = text.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("proxy-authorization")
            .then(|| value.trim().to_string())
    });
    saw.lock().push(ProxySaw {
        request_line: request_line.clone(),
        proxy_authorization,
    });
    if let ProxyMode::Refuse(status) = mode {
        let answer = format!("HTTP/1.1 {status} Refused\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        let _ = client.write_all(answer.as_bytes()).await;
        return;
    }
    let mut parts = request_line.split(' ');
    let (method, target) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let (authority, forward) = if method == "CONNECT" {
        (target.to_string(), head[head_end..].to_vec())
    } else {
        // Absolute form: `http://host:port/path`; the request goes on as it came.
        let rest = target.strip_prefix("http://").unwrap_or(target);
        (rest.split('/').next().unwrap_or_default().to_string(), head)
    };
    let Ok(mut upstream) = tokio::net::TcpStream::connect(authority.as_str()).await else {
        let _ = client
            .write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
            .await;
        return;
    };
    if method == "CONNECT"
        && client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
    {
        return;
    }
    if upstream.write_all(&forward).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}
