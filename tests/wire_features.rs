//! The request features real applications use, end to end against the strict simulator:
//! what the route received (its log) and what the client got, streamed and not. Extended
//! thinking with its signatures (and a tool round trip that sends them back), prompt caching,
//! logprobs, reasoning text from an OpenAI-compatible server, and a reasoning model's usage.

mod support;

use serde_json::{json, Value};
use support::{client, start};
use tailcut::server::Running;

const CONFIG: &str = r#"[server]
listen = "127.0.0.1:0"
sse_keepalive_ms = 600000
drain_grace_ms = 0
[sim]
listen = "127.0.0.1:0"
[sim.scenarios.quick]
text = "The answer is twenty one."
ttft = { median_ms = 1.0, sigma = 0.0 }
inter_token_ms = 0.0
[sim.scenarios.tools]
ttft = { median_ms = 1.0, sigma = 0.0 }
inter_token_ms = 0.0
tool_calls = [{ name = "get_weather", arguments = '{"city":"Paris"}' }]
[[routes]]
name = "claude"
provider = "simulated"
wire = "anthropic"
scenario = "quick"
model = "claude-sonnet-4-5"
[[routes]]
name = "claude-tools"
provider = "simulated"
wire = "anthropic"
scenario = "tools"
model = "claude-sonnet-4-5"
capabilities = ["tools", "streaming"]
[[routes]]
name = "gpt"
provider = "simulated"
wire = "openai"
scenario = "quick"
model = "gpt-4o-mini"
[[routes]]
name = "o4"
provider = "simulated"
wire = "openai"
scenario = "quick"
model = "o4-mini"
[[routes]]
name = "r1"
provider = "simulated"
wire = "openai"
scenario = "quick"
model = "deepseek-reasoner"
[models.claude]
routes = ["claude"]
[models.claude-tools]
routes = ["claude-tools"]
[models.gpt]
routes = ["gpt"]
[models.o4]
routes = ["o4"]
[models.r1]
routes = ["r1"]
"#;

async fn post(server: &Running, path: &str, body: &Value) -> reqwest::Response {
    client()
        .post(server.url(path))
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .expect("request")
}

/// Each SSE frame's data as JSON (`[DONE]` left out).
async fn sse(resp: reqwest::Response) -> Vec<Value> {
    let text = resp.text().await.expect("body");
    text.split("\n\n")
        .filter_map(|frame| frame.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("JSON data"))
        .collect()
}

fn thinking() -> Value {
    json!({"type": "enabled", "budget_tokens": 1024})
}

/// The bodies the simulated upstream received, newest last.
fn received(server: &Running) -> Vec<Value> {
    server
        .sim
        .as_ref()
        .map(|s| s.log())
        .unwrap_or_default()
        .iter()
        .filter_map(|r| r.body.as_deref().and_then(|b| serde_json::from_str(b).ok()))
        .collect()
}

#[tokio::test]
async fn extended_thinking_streams_its_blocks_and_signature_and_a_whole_message_keeps_them() {
    let server = start(CONFIG).await;
    let ask = |stream: bool| {
        json!({"model": "claude", "max_tokens": 2048, "stream": stream, "thinking": thinking(),
               "messages": [{"role": "user", "content": "What is the GCD of 1071 and 462?"}]})
    };
    let events = sse(post(&server, "/v1/messages", &ask(true)).await).await;
    let sent = received(&server);
    assert_eq!(
        sent.last().map(|b| b["thinking"].clone()),
        Some(thinking()),
        "the route was asked to think"
    );
    let kinds: Vec<String> = events
        .iter()
        .map(|e| {
            let delta = e["delta"]["type"].as_str().or(e["content_block"]["type"].as_str());
            format!(
                "{}{}",
                e["type"].as_str().unwrap_or(""),
                delta.map(|d| format!(":{d}")).unwrap_or_default()
            )
        })
        .collect();
    let first = |k: &str| kinds.iter().position(|x| x == k);
    assert_eq!(first("content_block_start:thinking"), Some(1), "{kinds:?}");
    let signature_at = first("content_block_delta:signature_delta").expect("a signature");
    assert!(
        first("content_block_delta:thinking_delta") < Some(signature_at),
        "{kinds:?}"
    );
    assert!(Some(signature_at) < first("content_block_start:text"), "{kinds:?}");
    let text: String = events.iter().filter_map(|e| e["delta"]["text"].as_str()).collect();
    assert_eq!(text, "The answer is twenty one.");
    assert_eq!(events[signature_at]["index"], 0);
    assert!(events[signature_at]["delta"]["signature"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));

    let whole: Value = post(&server, "/v1/messages", &ask(false))
        .await
        .json()
        .await
        .expect("JSON");
    let content = whole["content"].as_array().cloned().unwrap_or_default();
    assert_eq!(content[0]["type"], "thinking", "{whole}");
    assert!(
        content[0]["signature"].as_str().is_some_and(|s| !s.is_empty()),
        "{whole}"
    );
    assert!(
        content[0]["thinking"].as_str().is_some_and(|s| !s.is_empty()),
        "{whole}"
    );
    assert_eq!(
        content.last().map(|b| b["type"].clone()),
        Some(json!("text")),
        "{whole}"
    );
}

#[tokio::test]
async fn a_tool_round_trip_with_thinking_sends_the_signed_block_back_and_the_route_takes_it() {
    let server = start(CONFIG).await;
    let tools = json!([{"name": "get_weather", "description": "Weather for a city",
                        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let question = json!({"role": "user", "content": "Weather in Paris?"});
    let first: Value = post(
        &server,
        "/v1/messages",
        &json!({"model": "claude-tools", "max_tokens": 2048, "thinking": thinking(), "tools": tools,
                "messages": [question]}),
    )
    .await
    .json()
    .await
    .expect("JSON");
    let content = first["content"].as_array().cloned().unwrap_or_default();
    assert_eq!(content[0]["type"], "thinking", "{first}");
    let call = content
        .iter()
        .find(|b| b["type"] == "tool_use")
        .cloned()
        .expect("a tool call");
    let result =
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "18 C"}]});
    let second = |assistant: Vec<Value>| {
        json!({"model": "claude-tools", "max_tokens": 2048, "thinking": thinking(), "tools": tools,
               "messages": [question, {"role": "assistant", "content": assistant}, result]})
    };
    // The whole turn, signed thinking first, as the SDK sends it back.
    let resp = post(&server, "/v1/messages", &second(content.clone())).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap_or_default());
    let sent = received(&server);
    let history = &sent.last().expect("a body")["messages"][1]["content"][0];
    assert_eq!(history, &content[0], "the signed block reached the route byte for byte");
    // Without its thinking block the real API refuses the turn, and so does the simulator:
    // the client gets that 400, not an answer.
    let resp = post(&server, "/v1/messages", &second(vec![call])).await;
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.expect("JSON");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("Expected `thinking` or `redacted_thinking`"), "{body}");
}

#[tokio::test]
async fn prompt_caching_reaches_the_route_and_its_usage_reaches_the_client() {
    let server = start(CONFIG).await;
    let long = "You answer questions about arithmetic. ".repeat(40);
    let ask = json!({"model": "claude", "max_tokens": 64,
                     "system": [{"type": "text", "text": long, "cache_control": {"type": "ephemeral"}}],
                     "messages": [{"role": "user", "content": "Hi"}]});
    let first: Value = post(&server, "/v1/messages", &ask).await.json().await.expect("JSON");
    assert!(
        first["usage"]["cache_creation_input_tokens"].as_u64() > Some(0),
        "{first}"
    );
    let sent = received(&server);
    assert_eq!(
        sent.last().map(|b| b["system"][0]["cache_control"].clone()),
        Some(json!({"type": "ephemeral"}))
    );
    let second: Value = post(&server, "/v1/messages", &ask).await.json().await.expect("JSON");
    assert!(
        second["usage"]["cache_read_input_tokens"].as_u64() > Some(0),
        "{second}"
    );
    // An OpenAI client of the same route sees the cache read as cached_tokens.
    let streamed = sse(post(
        &server,
        "/v1/messages",
        &json!({"stream": true, "model": "claude", "max_tokens": 64,
        "system": ask["system"], "messages": ask["messages"]}),
    )
    .await)
    .await;
    let last_usage = streamed
        .iter()
        .rev()
        .find_map(|e| e.get("usage").cloned())
        .unwrap_or_default();
    assert!(last_usage["cache_read_input_tokens"].as_u64() > Some(0), "{streamed:?}");
}

#[tokio::test]
async fn logprobs_reach_an_openai_client_on_the_text_they_belong_to() {
    let server = start(CONFIG).await;
    let ask = |stream: bool| {
        json!({"model": "gpt", "stream": stream, "logprobs": true, "top_logprobs": 2,
               "messages": [{"role": "user", "content": "hi"}]})
    };
    let chunks = sse(post(&server, "/v1/chat/completions", &ask(true)).await).await;
    let mut text = String::new();
    let mut tokens = String::new();
    for c in &chunks {
        let choice = &c["choices"][0];
        let content = choice["delta"]["content"].as_str().unwrap_or_default();
        text.push_str(content);
        let listed: Vec<&Value> = choice["logprobs"]["content"].as_array().into_iter().flatten().collect();
        for entry in &listed {
            tokens.push_str(entry["token"].as_str().unwrap_or_default());
            assert_eq!(entry["top_logprobs"].as_array().map(Vec::len), Some(2), "{entry}");
        }
        if !content.is_empty() {
            assert!(!listed.is_empty(), "every text chunk carries its tokens: {c}");
        }
        assert!(c["system_fingerprint"].as_str().is_some() || content.is_empty(), "{c}");
    }
    assert_eq!(text, "The answer is twenty one.");
    assert_eq!(tokens, text, "the tokens spell the text");
    let whole: Value = post(&server, "/v1/chat/completions", &ask(false))
        .await
        .json()
        .await
        .expect("JSON");
    let listed = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let joined: String = listed.iter().filter_map(|t| t["token"].as_str()).collect();
    assert_eq!(joined, "The answer is twenty one.", "{whole}");
    assert!(
        whole["system_fingerprint"]
            .as_str()
            .is_some_and(|f| f.starts_with("fp_")),
        "{whole}"
    );
}

#[tokio::test]
async fn an_openai_compatible_servers_reasoning_reaches_the_client_as_reasoning_content() {
    let server = start(CONFIG).await;
    let ask = |stream: bool| json!({"model": "r1", "stream": stream, "messages": [{"role": "user", "content": "hi"}]});
    let chunks = sse(post(&server, "/v1/chat/completions", &ask(true)).await).await;
    let reasoning: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str())
        .collect();
    assert!(!reasoning.is_empty(), "{chunks:?}");
    let first_reasoning = chunks
        .iter()
        .position(|c| c["choices"][0]["delta"]["reasoning_content"].is_string());
    let first_text = chunks.iter().position(|c| {
        c["choices"][0]["delta"]["content"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
    });
    assert!(first_reasoning < first_text, "reasoning first: {chunks:?}");
    let whole: Value = post(&server, "/v1/chat/completions", &ask(false))
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(
        whole["choices"][0]["message"]["reasoning_content"],
        json!(reasoning),
        "{whole}"
    );
    assert_eq!(whole["choices"][0]["message"]["content"], "The answer is twenty one.");
}

#[tokio::test]
async fn a_reasoning_models_usage_keeps_its_reasoning_tokens() {
    let server = start(CONFIG).await;
    let whole: Value = post(
        &server,
        "/v1/chat/completions",
        &json!({"model": "o4", "max_completion_tokens": 200, "reasoning_effort": "low",
                "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await
    .json()
    .await
    .expect("JSON");
    let details = &whole["usage"]["completion_tokens_details"];
    assert!(details["reasoning_tokens"].as_u64() > Some(0), "{whole}");
    let sent = received(&server);
    let body = sent.last().expect("a body");
    assert_eq!(body["reasoning_effort"], "low");
    assert_eq!(body["max_completion_tokens"], 200);
    assert_eq!(body.get("max_tokens"), None);
}
