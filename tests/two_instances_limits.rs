//! Two tailcut processes sharing one Redis: a key's rpm and its concurrent-stream cap hold
//! across both, and a breaker opened on one is skipped by the other (a health hint) while
//! the other's own breaker stays closed.
//!
//! Real processes and real time: every wait is bounded and generous, and nothing asserts how
//! fast anything is. A missing `redis-server` fails the test, saying how to install it.

#[path = "support/instance.rs"]
mod instance;
#[path = "support/redis.rs"]
mod redis_server;

use std::time::Duration;

use instance::{client, Instance};
use redis_server::RedisServer;
use serde_json::{json, Value};
use sha2::Digest as _;

const RPM_KEY: &str = "tc_rpm-key-0123456789abcdef";
const STREAM_KEY: &str = "tc_stream-key-0123456789abcdef";
const ADMIN_ENV: &str = "TAILCUT_TEST_ADMIN_TOKEN";
const ADMIN: &str = "admin-token-for-the-two-instance-test";

fn hash(key: &str) -> String {
    hex::encode(sha2::Sha256::digest(key.as_bytes()))
}

/// `chat` over `a` then `b` (both quick); `slow` over `s` (far longer than any test waits).
/// `rpm-key` may send 4 a minute, `stream-key` stream 2 at once. A breaker stays open 30 s.
fn config(redis_url: &str, instance: &str) -> String {
    format!(
        r#"[server]
admin_token_env = "{ADMIN_ENV}"
sse_keepalive_ms = 600000
drain_grace_ms = 0
[breaker]
cooldown_ms = 30000
max_cooldown_ms = 60000
[sim]
listen = "127.0.0.1:0"
[sim.scenarios.quick]
ttft = {{ median_ms = 2.0, sigma = 0.0 }}
inter_token_ms = 1.0
tokens = 5
[sim.scenarios.endless]
ttft = {{ median_ms = 2.0, sigma = 0.0 }}
inter_token_ms = 20.0
tokens = 4000
[[routes]]
name = "a"
provider = "simulated"
wire = "openai"
scenario = "quick"
model = "model-a"
[[routes]]
name = "b"
provider = "simulated"
wire = "openai"
scenario = "quick"
model = "model-b"
[[routes]]
name = "s"
provider = "simulated"
wire = "openai"
scenario = "endless"
model = "model-s"
[models.chat]
routes = ["a", "b"]
[models.slow]
routes = ["s"]
[tenants.acme]
[auth]
[[auth.keys]]
name = "rpm-key"
sha256 = "{}"
tenant = "acme"
rpm = 4
[[auth.keys]]
name = "stream-key"
sha256 = "{}"
tenant = "acme"
max_streams = 2
[state]
redis_url = "{redis_url}"
instance = "{instance}"
op_timeout_ms = 1000
hint_poll_ms = 100
"#,
        hash(RPM_KEY),
        hash(STREAM_KEY),
    )
}

impl Instance {
    /// Starts an instance on `redis` and waits until it serves and sees Redis (`/readyz`
    /// answers "ready" alone only when Redis answered its ping).
    async fn start(redis: &RedisServer, name: &str) -> Instance {
        let config = config(&redis.url(), name);
        Instance::spawn(&config, name, &[(ADMIN_ENV, ADMIN)], "/readyz", Some("ready")).await
    }

    /// A non-streaming chat with `key`: (status, Retry-After, body).
    async fn chat(&self, key: &str) -> (u16, Option<String>, Value) {
        let body = json!({"model": "chat", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]});
        let resp = client()
            .post(self.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .expect("request sent");
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = tokio::time::timeout(Duration::from_secs(30), resp.json::<Value>())
            .await
            .expect("the answer ends")
            .unwrap_or(Value::Null);
        (status, retry_after, body)
    }

    /// Starts a streaming chat on `slow` with `key` and holds it open (its response).
    async fn open_stream(&self, key: &str) -> reqwest::Response {
        let body = json!({"model": "slow", "stream": true, "messages": [{"role": "user", "content": "Go on."}]});
        client()
            .post(self.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .expect("request sent")
    }

    async fn admin_get(&self, path: &str) -> String {
        let resp = client()
            .get(self.url(path))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("request sent");
        resp.text().await.unwrap_or_default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_rpm_holds_across_both_instances() {
    let redis = RedisServer::start();
    let one = Instance::start(&redis, "i-1").await;
    let two = Instance::start(&redis, "i-2").await;
    let mut admitted = 0;
    let mut refused = Vec::new();
    for i in 0..8 {
        let on = if i % 2 == 0 { &one } else { &two };
        let (status, retry_after, body) = on.chat(RPM_KEY).await;
        match status {
            200 => admitted += 1,
            429 => refused.push((i, retry_after, body)),
            other => panic!("request {i}: only 200 or 429, not {other}: {body}"),
        }
    }
    assert_eq!(
        admitted, 4,
        "rpm = 4 across both instances, not 4 each; refused: {refused:?}"
    );
    assert_eq!(refused.len(), 4, "the rest are refused");
    for (i, retry_after, body) in &refused {
        let secs: u64 = retry_after
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("request {i}: a Retry-After in seconds: {retry_after:?}"));
        assert!((1..=60).contains(&secs), "request {i}: waits at most a minute: {secs}");
        assert!(body.to_string().contains("rpm"), "request {i}: names the limit: {body}");
    }
    assert!(
        refused.iter().any(|(i, ..)| i % 2 == 0) && refused.iter().any(|(i, ..)| i % 2 == 1),
        "the limit refuses on either instance: {refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_opened_on_one_instance_is_skipped_on_the_other() {
    let redis = RedisServer::start();
    let one = Instance::start(&redis, "i-1").await;
    let two = Instance::start(&redis, "i-2").await;
    let (status, _, body) = two.chat(STREAM_KEY).await;
    assert_eq!(
        (status, body["tailcut"]["route"].as_str()),
        (200, Some("a")),
        "a leads: {body}"
    );
    let drill = client()
        .post(one.url("/admin/routes/a/drill"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("drill sent");
    assert_eq!(drill.status(), 200, "the drill opens a's breaker on i-1");
    let started = tokio::time::Instant::now();
    let mut served = None;
    for _ in 0..100 {
        let (status, _, body) = two.chat(STREAM_KEY).await;
        assert_eq!(status, 200, "i-2 keeps serving: {body}");
        if body["tailcut"]["route"] == "b" {
            served = Some(body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let served = served.expect("i-2 turned to b within the bounded wait");
    eprintln!("i-2 skipped a {:?} after the drill on i-1", started.elapsed());
    assert!(
        served["tailcut"]["fell_back_from"]
            .as_array()
            .is_none_or(|f| f.is_empty()),
        "b was chosen first, not after a failed try of a: {served}"
    );
    let routes: Value = serde_json::from_str(&two.admin_get("/admin/routes").await).expect("routes JSON");
    let a = routes["routes"]
        .as_array()
        .or(routes.as_array())
        .and_then(|r| r.iter().find(|r| r["name"] == "a"))
        .cloned()
        .unwrap_or_else(|| panic!("route a in {routes}"));
    assert_eq!(a["breaker"], "closed", "the hint never opens i-2's breaker: {a}");
    assert!(
        a["cooling_ms"].as_u64().is_some_and(|ms| ms > 0),
        "a is ranked as cooling: {a}"
    );
    let metrics = two.admin_get("/metrics").await;
    assert!(
        metrics.contains("tailcut_health_hints_total{direction=\"received\",kind=\"breaker_open\"}"),
        "i-2 counted the hint: {}",
        metrics
            .lines()
            .filter(|l| l.contains("hints"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(metrics.contains("# HELP tailcut_health_hints_total"), "described");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrent_stream_cap_holds_across_both_instances() {
    let redis = RedisServer::start();
    let one = Instance::start(&redis, "i-1").await;
    let two = Instance::start(&redis, "i-2").await;
    let first = one.open_stream(STREAM_KEY).await;
    assert_eq!(first.status(), 200, "the first stream, on i-1");
    let second = two.open_stream(STREAM_KEY).await;
    assert_eq!(second.status(), 200, "the second, on i-2");
    for (name, on) in [("i-1", &one), ("i-2", &two)] {
        let third = on.open_stream(STREAM_KEY).await;
        assert_eq!(third.status(), 429, "max_streams = 2 across both: refused on {name}");
        let body = third.text().await.unwrap_or_default();
        assert!(body.contains("max_streams"), "{name}: says which limit: {body}");
    }
    // Closing i-1's stream frees its place (the lease is released when its answer drops).
    drop(first);
    let mut reopened = None;
    for _ in 0..100 {
        let resp = two.open_stream(STREAM_KEY).await;
        if resp.status() == 200 {
            reopened = Some(resp);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        reopened.is_some(),
        "a closed stream's place is free again on the other instance"
    );
    drop(second);
}
