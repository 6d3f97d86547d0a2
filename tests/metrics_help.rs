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
