//! The control surface and reproducibility: scenario registration, the log, inline TOML
//! scenarios, seeds, the real adapters against the simulator, shutdown.

use super::*;

#[tokio::test]
async fn the_control_routes_register_scenarios_and_serve_the_log() {
    let handle = sim(vec![]).await;
    let base = format!("http://{}", handle.addr());
    let http = client();
    let put = http
        .put(format!("{base}/_sim/scenarios/custom"))
        .json(&json!({"text": "from json", "ttft": {"median_ms": 1.0}, "inter_token_ms": 0.0}))
        .send()
        .await
        .unwrap_or_else(|e| panic!("put: {e}"));
    assert!(put.status().is_success(), "put status {}", put.status());
    let typo = http
        .put(format!("{base}/_sim/scenarios/typo"))
        .json(&json!({"txet": "oops"}))
        .send()
        .await
        .unwrap_or_else(|e| panic!("put: {e}"));
    assert_eq!(typo.status(), 400, "unknown fields are rejected");

    let names: Vec<String> = http
        .get(format!("{base}/_sim/scenarios"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("get: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("json: {e}"));
    assert!(
        names.contains(&"custom".to_owned()) && names.contains(&"spiky".to_owned()),
        "{names:?}"
    );

    let text = body_text(openai(&handle, "custom", chat_body(true)).await).await;
    assert!(text.contains("from") && text.contains(" json"), "custom text: {text}");
    let log: Value = http
        .get(format!("{base}/_sim/log"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("get: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("json: {e}"));
    assert_eq!(log[0]["end"], "completed", "log over HTTP: {log}");
    assert_eq!(log[0]["scenario"], "custom", "scenario: {log}");
    let cleared = http
        .delete(format!("{base}/_sim/log"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("delete: {e}"));
    assert!(cleared.status().is_success(), "delete status");
    assert!(handle.log().is_empty(), "log cleared");
    handle.shutdown();
}

#[test]
fn scenarios_read_from_inline_toml_and_reject_unknown_keys() {
    let toml_text = r#"
        text = "Hi there"
        seed = 9
        [ttft]
        median_ms = 120
        sigma = 0.3
        [failure]
        status = 503
        fail_first_n = 2
        [brownout]
        period_ms = 1000
        duty = 0.25
        extra_ms = 50
        [[tool_calls]]
        name = "lookup"
        arguments = '{"q": "x"}'

    "#;
    let scenario: Scenario = toml::from_str(toml_text).unwrap_or_else(|e| panic!("toml: {e}"));
    assert_eq!(scenario.ttft.median_ms, 120.0, "ttft");
    assert_eq!(scenario.failure.status, Some(503), "status");
    assert_eq!(scenario.failure.status_rate, 1.0, "status rate defaults to 1");
    assert_eq!(scenario.tool_fragments, 12, "defaults fill the rest");
    assert_eq!(scenario.tool_calls[0].arguments, r#"{"q": "x"}"#, "tool call table");
    assert!(
        toml::from_str::<Scenario>("ttft = { median = 5 }").is_err(),
        "typo rejected"
    );
    let json = serde_json::to_string(&scenario).unwrap_or_default();
    let back: Scenario = serde_json::from_str(&json).unwrap_or_else(|e| panic!("json: {e}"));
    assert_eq!(back, scenario, "JSON round trip");
}

#[tokio::test]
async fn the_same_seed_reproduces_the_same_requests() {
    let spiky = profile("spiky").unwrap_or_default();
    let a = sim(vec![("x", spiky.clone())]).await;
    let b = sim(vec![("x", spiky)]).await;
    // Status-free TTFT draws: compare the planned TTFT of the first requests of each.
    for handle in [&a, &b] {
        for _ in 0..3 {
            let _ = openai(handle, "x", chat_body(true)).await;
        }
    }
    let ttfts = |h: &SimHandle| h.log().iter().map(|r| r.planned_ttft_ms).collect::<Vec<_>>();
    assert_eq!(ttfts(&a), ttfts(&b), "same seed, same TTFTs");
    a.shutdown();
    b.shutdown();
}

mod through_the_adapters {
    //! The simulator as tailcut's own adapters read it: every stream decodes without error.
    use std::sync::Arc;

    use super::*;
    use crate::provider::{AnthropicProvider, Delta, OpenAiProvider, Provider, UpstreamRequest};
    use crate::types::{ChatRequest, Message, Role};

    fn request(prefill: Option<&str>) -> UpstreamRequest {
        let chat = ChatRequest {
            model: "chat".to_owned(),
            messages: vec![Message::text(Role::User, "hello there")],
            stream: true,
            include_usage: true,
            ..ChatRequest::default()
        };
        UpstreamRequest {
            chat: Arc::new(chat),
            prefill: prefill.map(|text| crate::types::Prefill {
                text: text.to_owned(),
                convention: crate::types::PrefillConvention::Assistant,
            }),
            request_id: "req-adapter".to_owned(),
        }
    }

    async fn deltas(provider: &dyn Provider, prefill: Option<&str>) -> Vec<Delta> {
        let mut stream = provider
            .open(request(prefill))
            .await
            .unwrap_or_else(|e| panic!("open: {e:?}"));
        let mut out = Vec::new();
        while let Some(item) = stream.next().await {
            out.push(item.unwrap_or_else(|e| panic!("delta error: {e:?} after {out:?}")));
        }
        out
    }

    fn text(deltas: &[Delta]) -> String {
        deltas
            .iter()
            .filter_map(|d| match d {
                Delta::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn both_adapters_decode_text_tools_and_continuations() {
        let handle = sim(vec![("text", quick("Hello big wide world")), ("tool", tool_scenario())]).await;
        for wire in ["openai", "anthropic"] {
            let provider = |scenario: &str| -> Box<dyn Provider> {
                match wire {
                    "openai" => Box::new(OpenAiProvider::new(
                        handle.openai_base_url(scenario),
                        "up".to_owned(),
                        None,
                        crate::provider::http_client(),
                    )),
                    _ => Box::new(AnthropicProvider::new(
                        handle.anthropic_base_url(scenario),
                        "up".to_owned(),
                        None,
                        crate::provider::http_client(),
                    )),
                }
            };
            let got = deltas(provider("text").as_ref(), None).await;
            assert_eq!(text(&got), "Hello big wide world", "{wire}: text {got:?}");
            let got = deltas(provider("text").as_ref(), Some("Hello big")).await;
            assert_eq!(text(&got), " wide world", "{wire}: continuation {got:?}");
            let got = deltas(provider("tool").as_ref(), None).await;
            let args: String = got
                .iter()
                .filter_map(|d| match d {
                    Delta::ToolFragment(f) => Some(f.arguments.as_str()),
                    _ => None,
                })
                .collect();
            assert!(args.contains("Paris"), "{wire}: tool arguments {got:?}");
        }
        handle.shutdown();
    }
}

#[tokio::test]
async fn shutdown_stops_accepting_new_connections() {
    let handle = sim(vec![("s", quick("bye"))]).await;
    assert_eq!(openai(&handle, "s", chat_body(false)).await.status(), 200, "serving");
    handle.shutdown();
    let url = format!("{}/chat/completions", handle.openai_base_url("s"));
    let mut refused = false;
    for _ in 0..200 {
        // A fresh client each time, so no pooled connection hides the closed listener.
        if client().post(&url).json(&chat_body(false)).send().await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(refused, "connections must be refused after shutdown");
}
