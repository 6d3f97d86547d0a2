//! `/metrics` describes every series it serves: each `# TYPE` has its `# HELP` line.

mod support;

use support::*;

#[tokio::test]
async fn every_metric_served_has_a_help_line() {
    let server = start(&config_toml(&[("a", "openai", "fast-stable")], "")).await;
    let ok = post_chat(&server, &chat_body(false)).await;
    assert_eq!(ok.status(), 200, "a request to fill some series");
    let mut unknown = chat_body(false);
    unknown["model"] = "nope".into();
    let _ = post_chat(&server, &unknown).await;
    let text = client()
        .get(server.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default();
    let typed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        typed.contains(&"tailcut_requests_total"),
        "some series were served: {text}"
    );
    for name in typed {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("# HELP {name} "))),
            "{name} has a # HELP line: {text}"
        );
    }
}

#[test]
fn metrics_named_outside_telemetry_keep_their_names() {
    // telemetry/help.rs describes these two by value.
    assert_eq!(tailcut::mux::probe::PROBES_TOTAL, "tailcut_breaker_probes_total");
    assert_eq!(
        tailcut::transport::auth::AUTH_REFUSALS_TOTAL,
        "tailcut_auth_refusals_total"
    );
}

#[tokio::test]
async fn a_streamed_answer_counts_in_the_client_ttft_series() {
    // The sample is recorded after the first events are flushed (`mux::run::after_send`),
    // so it must still be there once the answer has been read.
    let server = start(&config_toml(&[("a", "openai", "fast-stable")], "")).await;
    for stream in [true, false] {
        let answer = post_chat(&server, &chat_body(stream)).await;
        assert_eq!(answer.status(), 200, "stream={stream}");
        let _ = answer.text().await;
    }
    let text = client()
        .get(server.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default();
    let count: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("tailcut_client_ttft_seconds_count "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(count >= 2.0, "one sample per answer: {count} in {text}");
}
