//! `tailcut_active_streams` counts a client stream from its planning until it ends or is
//! dropped, whether it is read to its end or abandoned unread.

mod support;

use futures::StreamExt;
use support::*;
use tailcut::types::{ChatRequest, Dialect, Message, RequestCtx, Role, StreamEvent};

const SCENARIOS: &str = r#"
[sim.scenarios.text]
text = "A short answer, token by token."
ttft = { median_ms = 5.0, sigma = 0.0 }
inter_token_ms = 1.0
"#;

fn request() -> ChatRequest {
    ChatRequest {
        model: "chat".into(),
        messages: vec![Message::text(Role::User, "Hello")],
        stream: true,
        ..ChatRequest::default()
    }
}

fn active(handle: &metrics_exporter_prometheus::PrometheusHandle) -> f64 {
    handle
        .render()
        .lines()
        .find_map(|line| line.strip_prefix("tailcut_active_streams "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_stream_is_counted_until_it_ends_or_is_dropped() {
    let handle = tailcut::telemetry::install().expect("the first recorder in this process");
    let server = start(&config_toml(&[("oa", "openai", "text")], SCENARIOS)).await;
    let gateway = &server.state.gateway;
    let before = active(&handle);

    let mut read = gateway
        .chat(request(), RequestCtx::new(Dialect::Native))
        .expect("planned");
    let abandoned = gateway
        .chat(request(), RequestCtx::new(Dialect::Native))
        .expect("planned");
    assert_eq!(active(&handle), before + 2.0, "counted from planning, before any poll");

    drop(abandoned);
    assert_eq!(
        active(&handle),
        before + 1.0,
        "an unread stream is uncounted when dropped"
    );

    let first = read.next().await;
    assert!(matches!(first, Some(StreamEvent::Start(..))), "{first:?}");
    assert_eq!(active(&handle), before + 1.0, "a stream being read stays counted");

    let events: Vec<StreamEvent> = read.collect().await;
    assert!(matches!(events.last(), Some(StreamEvent::Finish { .. })), "{events:?}");
    assert_eq!(active(&handle), before, "a stream read to its end is uncounted");
}
