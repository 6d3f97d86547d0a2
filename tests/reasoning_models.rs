//! Reasoning-model routes (OpenAI's o-series and gpt-5) against the simulator's strict rules:
//! a client's token limit reaches them as `max_completion_tokens`, which they take, never as
//! `max_tokens`, which they refuse with a 400; `reasoning_effort` is sent on.

mod support;

use serde_json::json;
use support::{post_chat, start};

fn config(model: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nsse_keepalive_ms = 600000\ndrain_grace_ms = 0\n[sim]\nlisten = \"127.0.0.1:0\"\n\
         [sim.scenarios.quick]\nttft = {{ median_ms = 1.0, sigma = 0.0 }}\ninter_token_ms = 0.0\n\
         [[routes]]\nname = \"r\"\nprovider = \"simulated\"\nwire = \"openai\"\nscenario = \"quick\"\nmodel = \"{model}\"\nregion = \"eu\"\n\
         [models.chat]\nroutes = [\"r\"]\n"
    )
}

#[tokio::test]
async fn a_reasoning_model_route_gets_max_completion_tokens_and_answers() {
    for (model, field) in [
        ("o4-mini", "max_completion_tokens"),
        ("gpt-5-mini", "max_tokens"),
        ("gpt-4o-mini", "max_tokens"),
    ] {
        let server = start(&config(model)).await;
        for stream in [false, true] {
            let body = json!({
                "model": "chat", "stream": stream, field: 12, "reasoning_effort": "low",
                "messages": [{"role": "user", "content": "hi"}],
            });
            let resp = post_chat(&server, &body).await;
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            assert_eq!(
                status, 200,
                "{model} with {field} (stream {stream}) is answered: {text}"
            );
            assert!(!text.contains("Unsupported parameter"), "{text}");
        }
        let sim = server.sim.as_ref().expect("the simulated upstream");
        assert!(
            sim.log().iter().all(|r| r.status == 200),
            "the route never refused a request: {:?}",
            sim.log()
        );
    }
}
