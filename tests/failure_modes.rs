//! Failure modes of the request path on paused time, with scripted in-process providers
//! (no sockets): deadlines that are not the route's fault, long tool calls, hostile
//! Retry-After values, races with empty or fatal answers, recoveries, probes and hung routes.
mod scripted;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use scripted::*;
use tailcut::config;
use tailcut::gateway::Gateway;
use tailcut::provider::{Delta, DeltaStream, Provider, ProviderError, SharedProvider, ToolFragment, UpstreamRequest};
use tailcut::types::{Dialect, ErrorClass, FinishReason, RequestCtx, StreamEvent, ToolSpec};
use tokio::time::Instant;

/// A client with a tight deadline must not make a healthy route look broken.
#[tokio::test(start_paused = true)]
async fn client_deadline_never_opens_a_healthy_routes_breaker() {
    let steps = vec![
        Step::Wait(400),
        text("hello"),
        Step::D(Delta::Finish(FinishReason::Stop)),
    ];
    let (gw, _) = gateway(&toml(&[("a", "L0")], ""), vec![("a", Script::Stream(steps))]);
    for _ in 0..5 {
        let mut ctx = RequestCtx::new(Dialect::OpenAi);
        ctx.deadline = Some(Duration::from_millis(300));
        let evs = collect(&gw, req(), ctx).await;
        let Some(StreamEvent::Error(e)) = evs.last() else {
            panic!("the deadline passes first: {:?}", kinds(&evs))
        };
        assert_eq!(e.status, 504);
    }
    assert_eq!(
        breaker(&gw, "a"),
        "closed",
        "client deadlines must not open a route's breaker"
    );
    let evs = collect(&gw, req(), RequestCtx::new(Dialect::OpenAi)).await;
    assert_eq!(
        kinds(&evs).last().map(String::as_str),
        Some("finish(Stop)"),
        "a normal client is served"
    );
}

/// A long but healthy answer streams past the request deadline (which bounds first tokens).
#[tokio::test(start_paused = true)]
async fn long_answer_streams_past_the_deadline_unblamed() {
    let mut steps = vec![Step::Wait(100)];
    for _ in 0..90 {
        steps.push(text("tok "));
        steps.push(Step::Wait(1000));
    }
    steps.push(Step::D(Delta::Finish(FinishReason::Stop)));
    let (gw, _) = gateway(&toml(&[("a", "L0")], ""), vec![("a", Script::Stream(steps))]);
    let evs = collect(&gw, req(), RequestCtx::new(Dialect::OpenAi)).await;
    let k = kinds(&evs);
    let snap = gw.health().snapshot(Instant::now(), gw.config());
    assert_eq!(snap[0].error_rate, 0.0, "the route is not blamed");
    assert!(
        matches!(k.last().map(String::as_str), Some("finish(Stop)")),
        "a healthy 90 s answer completes: {:?}",
        k.last()
    );
}

/// A tool call whose arguments stream for longer than the stall limit is not a stall.
#[tokio::test(start_paused = true)]
async fn long_tool_call_is_not_a_stall() {
    let mut steps = vec![
        Step::Wait(100),
        Step::D(Delta::tool(ToolFragment {
            index: 0,
            id: Some("call_1".into()),
            name: Some("write_file".into()),
            arguments: "{\"content\": \"".into(),
        })),
    ];
    for _ in 0..30 {
        steps.push(Step::Wait(500));
        steps.push(Step::D(Delta::tool(ToolFragment {
            index: 0,
            id: None,
            name: None,
            arguments: "abc".into(),
        })));
    }
    steps.push(Step::D(Delta::tool(ToolFragment {
        index: 0,
        id: None,
        name: None,
        arguments: "\"}".into(),
    })));
    steps.push(Step::D(Delta::Finish(FinishReason::ToolCalls)));
    let (gw, _) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], ""),
        vec![("a", Script::Stream(steps.clone())), ("b", Script::Stream(steps))],
    );
    let mut r = req();
    r.tools = vec![ToolSpec {
        name: "write_file".into(),
        description: None,
        parameters: serde_json::json!({"type": "object"}),
    }];
    let evs = collect(&gw, r, RequestCtx::new(Dialect::OpenAi)).await;
    let k = kinds(&evs);
    assert!(
        k.iter().any(|e| e.starts_with("tool(")),
        "a 15 s tool call is delivered: {k:?}"
    );
}

/// An upstream's huge Retry-After is capped, never a panic.
#[tokio::test(start_paused = true)]
async fn huge_retry_after_does_not_panic() {
    let mut e = ProviderError::new(ErrorClass::RateLimited, "slow down").with_status(429);
    e.retry_after = Some(Duration::from_secs_f64(1e19));
    let (gw, _) = gateway(&toml(&[("a", "L0")], ""), vec![("a", Script::OpenErr(10, e))]);
    let evs = collect(&gw, req(), RequestCtx::new(Dialect::OpenAi)).await;
    let Some(StreamEvent::Error(e)) = evs.last() else {
        panic!("an error: {:?}", kinds(&evs))
    };
    assert_eq!(e.status, 429, "the rate limit is told");
    assert!(
        e.retry_after.is_some_and(|r| r <= Duration::from_secs(3600 * 24 * 365)),
        "{:?}",
        e.retry_after
    );
}

/// A 429 without Retry-After: the same-route retry waits out the default cooling.
#[tokio::test(start_paused = true)]
async fn same_route_retry_of_a_429_without_retry_after_waits_for_the_cooling() {
    let e = ProviderError::new(ErrorClass::RateLimited, "slow down").with_status(429);
    let ok = vec![text("hi"), Step::D(Delta::Finish(FinishReason::Stop))];
    let (gw, calls) = gateway(
        &toml(&[("a", "L0"), ("b", "L1")], ""),
        vec![("a", Script::OpenErr(10, e)), ("b", Script::Stream(ok))],
    );
    let t0 = Instant::now();
    let evs = collect(&gw, req(), RequestCtx::new(Dialect::OpenAi)).await;
    assert_eq!(
        calls.calls("a"),
        2,
        "retried once on the same route before the lower rung"
    );
    assert!(
        t0.elapsed() >= Duration::from_secs(1),
        "after the route's cooling, not before: {:?}",
        t0.elapsed()
    );
    assert_eq!(kinds(&evs).last().map(String::as_str), Some("finish(Stop)"));
}

/// A hedge route with a bad key does not kill the request the primary is about to serve.
#[tokio::test(start_paused = true)]
async fn hedge_auth_error_leaves_a_healthy_primary_running() {
    let e = ProviderError::new(ErrorClass::Auth, "bad key").with_status(401);
    let slow = vec![Step::Wait(2500), text("hi"), Step::D(Delta::Finish(FinishReason::Stop))];
    let (gw, _) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], ""),
        vec![("a", Script::Stream(slow)), ("b", Script::OpenErr(5, e))],
    );
    let evs = collect(&gw, req(), RequestCtx::new(Dialect::OpenAi)).await;
    let k = kinds(&evs);
    assert!(k.contains(&"text(hi)".to_string()), "the primary still serves: {k:?}");
}

/// An empty answer from the hedge does not win the race: the first content token does.
#[tokio::test(start_paused = true)]
async fn empty_finish_from_a_hedge_does_not_win_the_race() {
    let slow = vec![Step::Wait(2500), text("hi"), Step::D(Delta::Finish(FinishReason::Stop))];
    let empty = vec![Step::Wait(5), Step::D(Delta::Finish(FinishReason::ContentFilter))];
    let (gw, _) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], ""),
        vec![("a", Script::Stream(slow)), ("b", Script::Stream(empty))],
    );
    let evs = collect(&gw, req(), RequestCtx::new(Dialect::OpenAi)).await;
    let k = kinds(&evs);
    assert!(
        k.contains(&"text(hi)".to_string()),
        "winner = first content token: {k:?}"
    );
}

/// A failure after tool calls were sent never sends them twice.
#[tokio::test(start_paused = true)]
async fn failure_after_a_sent_tool_call_never_doubles_it() {
    let frag = |args: &str, head: bool| {
        Step::D(Delta::tool(ToolFragment {
            index: 0,
            id: head.then(|| "call_1".to_string()),
            name: head.then(|| "get_weather".to_string()),
            arguments: args.into(),
        }))
    };
    let a = vec![
        text("Let me check."),
        frag("{\"city\":", true),
        frag("\"Paris\"}", false),
        Step::D(Delta::Finish(FinishReason::ToolCalls)),
        Step::Hang, // a provider that does not end after its finish signal
    ];
    let b = vec![
        text("Let me check."),
        frag("{\"city\":", true),
        frag("\"Paris\"}", false),
        Step::D(Delta::Finish(FinishReason::ToolCalls)),
    ];
    let (gw, _) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], ""),
        vec![("a", Script::Stream(a)), ("b", Script::Stream(b))],
    );
    let mut r = req();
    r.tools = vec![ToolSpec {
        name: "get_weather".into(),
        description: None,
        parameters: serde_json::json!({"type": "object"}),
    }];
    let evs = collect(&gw, r, RequestCtx::new(Dialect::OpenAi)).await;
    let k = kinds(&evs);
    assert!(
        k.iter().filter(|e| e.starts_with("tool(")).count() <= 1,
        "doubled tool call: {k:?}"
    );
}

/// A half-open probe proves its route at its first token, not at the end of a long stream.
#[tokio::test(start_paused = true)]
async fn half_open_probe_closes_the_breaker_at_its_first_token() {
    let e = ProviderError::new(ErrorClass::Unavailable, "boom").with_status(503);
    let mut long = vec![Step::Wait(50)];
    for _ in 0..40 {
        long.push(text("tok "));
        long.push(Step::Wait(1000));
    }
    long.push(Step::D(Delta::Finish(FinishReason::Stop)));
    let extra = "[breaker]\nconsecutive_failures = 1\ncooldown_ms = 1000\n";
    let (gw, _) = gateway(
        &toml(&[("a", "L0")], extra),
        vec![(
            "a",
            Script::Seq(vec![
                Script::OpenErr(5, e),
                Script::Stream(long.clone()),
                Script::Stream(long),
            ]),
        )],
    );
    let evs = collect(&gw, req(), RequestCtx::new(Dialect::OpenAi)).await;
    assert_eq!(
        breaker(&gw, "a"),
        "open",
        "one failure opens it here: {:?}",
        kinds(&evs)
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut probe = gw.chat(req(), RequestCtx::new(Dialect::OpenAi)).expect("stream");
    let first = probe.next().await;
    assert!(
        matches!(first, Some(StreamEvent::Start(_))),
        "the probe committed: {first:?}"
    );
    tokio::time::sleep(Duration::from_millis(5000)).await;
    let evs = collect(&gw, req(), RequestCtx::new(Dialect::OpenAi)).await;
    assert_eq!(
        breaker(&gw, "a"),
        "closed",
        "the probe's first token closed the breaker"
    );
    assert_eq!(
        kinds(&evs)[0],
        "start",
        "route proved healthy at the probe's first token"
    );
}

/// A failed hedge does not start a third attempt beside a running primary.
#[tokio::test(start_paused = true)]
async fn failed_hedge_starts_no_third_attempt_beside_a_running_primary() {
    let e = ProviderError::new(ErrorClass::Unavailable, "boom").with_status(503);
    let slow = vec![Step::Wait(3000), text("hi"), Step::D(Delta::Finish(FinishReason::Stop))];
    let (gw, calls) = gateway(
        &toml(&[("a", "L0"), ("b", "L0"), ("c", "L0")], ""),
        vec![
            ("a", Script::Stream(slow.clone())),
            ("b", Script::OpenErr(5, e)),
            ("c", Script::Stream(slow)),
        ],
    );
    let evs = collect(&gw, req(), RequestCtx::new(Dialect::OpenAi)).await;
    let Some(StreamEvent::Finish { envelope, .. }) = evs.last() else {
        panic!("served: {:?}", kinds(&evs))
    };
    assert_eq!(envelope.attempts, 2, "the primary and one hedge");
    assert_eq!(calls.calls("c"), 0, "one hedge per request; c is not a hedge");
}

/// Continue cannot start (the only prefill route is down): prose should fall back to restart.
#[tokio::test(start_paused = true)]
async fn prose_falls_back_to_restart_when_continue_cannot_start() {
    let drop = vec![
        Step::Wait(50),
        text("Hello "),
        text("world "),
        Step::Err(ProviderError::new(ErrorClass::Unavailable, "reset")),
    ];
    let full = vec![
        Step::Wait(50),
        text("Hello "),
        text("world "),
        text("again."),
        Step::D(Delta::Finish(FinishReason::Stop)),
    ];
    let (gw, calls) = gateway(
        &toml(&[("a", "L0"), ("b", "L0"), ("nc", "L0")], ""),
        vec![
            ("a", Script::Stream(drop)),
            ("b", Script::Stream(full.clone())),
            ("nc", Script::Stream(full)),
        ],
    );
    gw.health().force_open("b", Instant::now());
    let mut ctx = RequestCtx::new(Dialect::OpenAi);
    ctx.hedge_off = true;
    let evs = collect(&gw, req(), ctx).await;
    assert_eq!(
        kinds(&evs).last().map(String::as_str),
        Some("finish(Stop)"),
        "restart on nc completes the answer"
    );
    assert_eq!(calls.calls("nc"), 1, "the non-prefill route restarted it");
}

/// A route's hedge_floor_ms above the global ceiling never panics.
#[tokio::test(start_paused = true)]
async fn route_hedge_floor_above_the_global_ceiling_is_harmless() {
    let ok = vec![text("hi"), Step::D(Delta::Finish(FinishReason::Stop))];
    let t = toml(&[("a", "L0"), ("b", "L0")], "").replace(
        "level = \"L0\"\ncapabilities",
        "level = \"L0\"\nhedge_floor_ms = 6000\ncapabilities",
    );
    let (gw, _) = gateway(&t, vec![("a", Script::Stream(ok.clone())), ("b", Script::Stream(ok))]);
    let evs = collect(&gw, req(), RequestCtx::new(Dialect::OpenAi)).await;
    assert_eq!(
        kinds(&evs).last().map(String::as_str),
        Some("finish(Stop)"),
        "{:?}",
        kinds(&evs)
    );
    let snap = gw.health().snapshot(Instant::now(), gw.config());
    assert_eq!(snap.len(), 2, "the admin view renders too");
}

struct DropMark(Arc<parking_lot::Mutex<Option<Instant>>>);
impl Drop for DropMark {
    fn drop(&mut self) {
        *self.0.lock() = Some(Instant::now());
    }
}

struct Stalling(Arc<parking_lot::Mutex<Option<Instant>>>);
impl Provider for Stalling {
    fn open(&self, _req: UpstreamRequest) -> BoxFuture<'static, Result<DeltaStream, ProviderError>> {
        let mark = DropMark(Arc::clone(&self.0));
        async move {
            let s = async_stream::stream! {
                let _mark = mark;
                tokio::time::sleep(Duration::from_millis(50)).await;
                yield Ok(Delta::Text("Hello ".into()));
                std::future::pending::<()>().await;
            };
            Ok(Box::pin(s) as DeltaStream)
        }
        .boxed()
    }
}

/// A stalled attempt is dropped (its upstream closed) when the stall is declared.
#[tokio::test(start_paused = true)]
async fn stalled_attempt_is_dropped_when_the_stall_is_declared() {
    let cfg = config::load_str(&toml(&[("a", "L0"), ("b", "L0")], "")).unwrap();
    let dropped = Arc::new(parking_lot::Mutex::new(None));
    let mut providers: HashMap<String, SharedProvider> = HashMap::new();
    providers.insert("a".into(), Arc::new(Stalling(Arc::clone(&dropped))));
    let slow = vec![
        Step::Wait(8000),
        text("Hello "),
        text("there"),
        Step::D(Delta::Finish(FinishReason::Stop)),
    ];
    providers.insert("b".into(), Arc::new(Fake::new(Script::Stream(slow))));
    let gw = Gateway::with_providers(Arc::new(cfg), providers);
    let t0 = Instant::now();
    let mut ctx = RequestCtx::new(Dialect::Native);
    ctx.hedge_off = true;
    let evs = collect(&gw, req(), ctx).await;
    assert_eq!(
        kinds(&evs).last().map(String::as_str),
        Some("finish(Stop)"),
        "{:?}",
        kinds(&evs)
    );
    let at = dropped.lock().map(|d| d - t0);
    assert!(
        at.is_some_and(|d| d < Duration::from_millis(10_100)),
        "dropped at the stall (10.05 s), not at b's commit: {at:?}"
    );
}

/// Without a hedge, a primary that accepts and never sends a token is failed over.
#[tokio::test(start_paused = true)]
async fn hung_primary_without_a_hedge_is_failed_over() {
    let ok = vec![text("hi"), Step::D(Delta::Finish(FinishReason::Stop))];
    let (gw, calls) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], ""),
        vec![("a", Script::Stream(vec![Step::Hang])), ("b", Script::Stream(ok))],
    );
    let mut ctx = RequestCtx::new(Dialect::OpenAi);
    ctx.hedge_off = true;
    let t0 = Instant::now();
    let evs = collect(&gw, req(), ctx).await;
    assert_eq!(calls.calls("b"), 1, "b was asked");
    assert!(
        t0.elapsed() >= Duration::from_secs(30),
        "after the first-token timeout: {:?}",
        t0.elapsed()
    );
    assert!(
        kinds(&evs).contains(&"text(hi)".to_string()),
        "b serves once a is presumed hung"
    );
}

/// A reader that pauses longer than the stall limit does not make the upstream a staller:
/// while nobody reads, the attempt is not read either, and the pause is the reader's.
#[tokio::test(start_paused = true)]
async fn a_reader_pausing_past_the_stall_limit_is_not_an_upstream_stall() {
    let mut steps = vec![Step::Wait(100)];
    for _ in 0..40 {
        steps.push(text("tok "));
        steps.push(Step::Wait(10));
    }
    steps.push(Step::D(Delta::Finish(FinishReason::Stop)));
    let (gw, _) = gateway(
        &toml(&[("a", "L0"), ("b", "L0")], ""),
        vec![("a", Script::Stream(steps.clone())), ("b", Script::Stream(steps))],
    );
    let mut events = gw.chat(req(), RequestCtx::new(Dialect::OpenAi)).expect("planned");
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(events.next().await.expect("an event"));
    }
    // The reader looks away for longer than the route's stall limit (10 s at most).
    tokio::time::sleep(Duration::from_secs(12)).await;
    while let Some(event) = events.next().await {
        got.push(event);
    }
    let k = kinds(&got);
    assert_eq!(k.last().map(String::as_str), Some("finish(Stop)"), "completed: {k:?}");
    match got.last() {
        Some(StreamEvent::Finish { envelope, .. }) => {
            assert!(envelope.fell_back_from.is_empty(), "no failed attempt: {envelope:?}");
            assert_eq!(envelope.route.as_deref(), Some("a"), "served by a, no switch");
        }
        other => panic!("a finish, not {other:?}"),
    }
    let snap = gw.health().snapshot(Instant::now(), gw.config());
    assert_eq!(snap[0].error_rate, 0.0, "the route is not blamed");
}
