//! Hostile clients the other suites do not play: an HTTP/2 client that stops reading one
//! stream while its connection stays alive, oversized and too many headers, hostile
//! WebSocket frames, and malformed resume requests.

mod support;

use std::time::Duration;

use support::*;
use tailcut::sim::SimEnd;

/// An answer of `words` words of `size` bytes, one every 10 ms.
fn flood(words: usize, size: usize) -> String {
    let word = "x".repeat(size);
    format!(
        "[sim.scenarios.flood]\nttft = {{ median_ms = 5.0, sigma = 0.0 }}\ninter_token_ms = 10.0\ntext = \"{}\"\n",
        vec![word; words].join(" ")
    )
}

fn with_server(scenario: &str, extra: &str, keys: &str) -> String {
    config_toml(&[("a", "openai", scenario)], extra).replacen("[server]\n", &format!("[server]\n{keys}\n"), 1)
}

/// Waits (bounded, on the tokio clock) until `count` of the simulated upstream's requests
/// satisfy `pred`; says how many did if they never do.
async fn wait_for_count(
    server: &tailcut::server::Running,
    what: &str,
    count: usize,
    pred: impl Fn(&tailcut::sim::SimRecord) -> bool,
) {
    let sim = server.sim.as_ref().expect("the simulated upstream");
    let mut seen = 0;
    for _ in 0..2000 {
        seen = sim.log().iter().filter(|r| pred(r)).count();
        if seen >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: {seen} of {count}");
}

/// An HTTP/2 (prior knowledge) client whose streams get a small flow-control window that is
/// only reopened as the body is read: a stream whose body is never read stalls at once,
/// while the connection itself stays alive (pings are answered).
fn h2_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .http2_prior_knowledge()
        .http2_initial_stream_window_size(4096)
        .http2_initial_connection_window_size(16 * 1024 * 1024)
        .build()
        .expect("h2 client")
}

#[tokio::test(start_paused = true)]
async fn an_http2_stream_that_is_not_read_is_dropped_at_the_write_timeout_though_its_connection_lives() {
    let streams = 4;
    let toml = with_server(
        "flood",
        &flood(600, 2048),
        &format!("max_streams = {streams}\nclient_write_timeout_ms = 2000\n"),
    );
    let server = start(&toml).await;
    let h2 = h2_client();
    let mut held = Vec::new();
    for _ in 0..streams {
        let resp = h2
            .post(server.url("/v1/chat/completions"))
            .json(&chat_body(true))
            .send()
            .await
            .expect("sent over h2");
        assert_eq!(resp.status(), 200, "served");
        assert_eq!(resp.version(), reqwest::Version::HTTP_2, "over HTTP/2");
        held.push(resp);
    }
    let busy = post_chat(&server, &chat_body(true)).await;
    assert_eq!(
        busy.status(),
        503,
        "while the unread streams hold every slot, others get 503"
    );
    wait_for_count(&server, "the unread streams' upstreams closed", streams, |r| {
        r.end == Some(SimEnd::ClientClosed)
    })
    .await;
    assert_eq!(
        server.state.streams.available_permits(),
        streams,
        "every unread stream's slot came back"
    );
    let reply = post_sse(&server.url(""), &chat_body(true), &[]).await;
    assert_eq!(
        reply.status, 200,
        "a new request is served once the unread streams were dropped"
    );
    drop(held);
}
