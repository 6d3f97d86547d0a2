//! End to end over real sockets: a route with `http2_prior_knowledge = true` reaches the
//! simulated upstream over HTTP/2 cleartext, many streams over one connection, and the
//! client still gets a correct streamed answer. A relay in front of the upstream sees each
//! connection's first bytes.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use support::*;
use tailcut::sim::{Scenario, SimHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TEXT: &str = "Hello from the simulated upstream, streamed token by token.";

/// The first bytes a client sends on an HTTP/2 connection with prior knowledge.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Relays every connection to `upstream`, keeping each one's first bytes.
async fn relay(upstream: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    let openings: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let seen = Arc::clone(&openings);
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                    return;
                };
                let mut first = vec![0u8; PREFACE.len()];
                if inbound.read_exact(&mut first).await.is_err() {
                    return;
                }
                seen.lock().push(first.clone());
                if outbound.write_all(&first).await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (addr, openings)
}

fn config(base_url: &str, prior_knowledge: bool) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nsse_keepalive_ms = 600000\ndrain_grace_ms = 0\n\
         [[routes]]\nname = \"a\"\nprovider = \"openai\"\nbase_url = \"{base_url}\"\nmodel = \"m\"\n\
         http2_prior_knowledge = {prior_knowledge}\n[models.chat]\nroutes = [\"a\"]\n"
    )
}

async fn sim() -> SimHandle {
    let quick: Scenario = serde_json::from_value(serde_json::json!({
        "text": TEXT,
        "ttft": { "median_ms": 5.0, "sigma": 0.0 },
        "inter_token_ms": 1.0
    }))
    .expect("a scenario");
    SimHandle::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        BTreeMap::from([("quick".to_string(), quick)]),
    )
    .await
    .expect("the simulated upstream starts")
}

#[tokio::test]
async fn a_prior_knowledge_route_streams_over_one_http2_connection() {
    let sim = sim().await;
    let (relay, openings) = relay(sim.addr()).await;
    let server = start(&config(&format!("http://{relay}/s/quick/v1"), true)).await;
    let (url, body) = (server.url(""), chat_body(true));
    let replies = futures::future::join_all((0..4).map(|_| post_sse(&url, &body, &[]))).await;
    for reply in &replies {
        assert_eq!(reply.status, 200, "body: {}", reply.raw);
        assert_eq!(reply.text(), TEXT);
        assert!(reply.done(), "a complete stream ends with [DONE]");
    }
    assert_eq!(sim.log().len(), 4, "every request reached the upstream");
    let openings = openings.lock().clone();
    assert_eq!(openings.len(), 1, "four streams, one connection");
    assert_eq!(openings[0], PREFACE, "HTTP/2 from the first byte");
    sim.shutdown();
}

#[tokio::test]
async fn without_it_the_same_route_speaks_http1() {
    let sim = sim().await;
    let (relay, openings) = relay(sim.addr()).await;
    let server = start(&config(&format!("http://{relay}/s/quick/v1"), false)).await;
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(reply.status, 200, "body: {}", reply.raw);
    assert_eq!(reply.text(), TEXT);
    let openings = openings.lock().clone();
    assert_eq!(openings.len(), 1);
    assert!(
        openings[0].starts_with(b"POST /s/quick/v1/"),
        "an HTTP/1.1 request line: {:?}",
        String::from_utf8_lossy(&openings[0])
    );
    sim.shutdown();
}
