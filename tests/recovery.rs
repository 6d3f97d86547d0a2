//! Breaker recovery on paused time, with scripted in-process providers: mid-stream failures
//! open a breaker, the background prober finds a recovered route within seconds, users never
//! reach a half-open route, probes run one at a time per route, and dropping the prober
//! cancels it.
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use parking_lot::Mutex;
use tailcut::config;
use tailcut::gateway::Gateway;
use tailcut::mux::probe::Prober;
use tailcut::provider::{Delta, DeltaStream, Provider, ProviderError, SharedProvider, UpstreamRequest};
use tailcut::types::{ChatRequest, Dialect, ErrorClass, FinishReason, Message, RequestCtx, Role, StreamEvent};
use tokio::time::Instant;

/// Who sent a request: the prober's request ids start with `probe_`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    User,
    Probe,
}

/// What a scripted upstream does with one request.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// A 503 after this many ms.
    Fail(u64),
    /// "hello" after this many ms, then a normal finish.
    Ok(u64),
    /// "hello" after this many ms, then the connection drops.
    DropMidStream(u64),
    /// Accepts and never sends anything.
    Hang,
}

#[derive(Debug, Clone, Copy)]
struct Call {
    /// Since the test's start.
    at: Duration,
    kind: Kind,
}

type Script = dyn Fn(Kind, Duration) -> Answer + Send + Sync;

/// An upstream whose answer depends on the kind of request and the time since `t0`; it
/// logs every call and counts the probes it is serving at once.
#[derive(Clone)]
struct Upstream {
    t0: Instant,
    script: Arc<Script>,
    calls: Arc<Mutex<Vec<Call>>>,
    probes_in_flight: Arc<AtomicUsize>,
    max_probes_in_flight: Arc<AtomicUsize>,
}

/// Held for as long as the upstream serves a probe (dropped when the prober closes it).
struct InFlight(Arc<AtomicUsize>);
impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Upstream {
    fn new(t0: Instant, script: impl Fn(Kind, Duration) -> Answer + Send + Sync + 'static) -> Self {
        Upstream {
            t0,
            script: Arc::new(script),
            calls: Arc::default(),
            probes_in_flight: Arc::default(),
            max_probes_in_flight: Arc::default(),
        }
    }

    fn calls(&self, kind: Kind) -> Vec<Duration> {
        self.calls
            .lock()
            .iter()
            .filter(|c| c.kind == kind)
            .map(|c| c.at)
            .collect()
    }
}

impl Provider for Upstream {
    fn open(&self, req: UpstreamRequest) -> BoxFuture<'static, Result<DeltaStream, ProviderError>> {
        let kind = if req.request_id.starts_with("probe_") {
            Kind::Probe
        } else {
            Kind::User
        };
        let at = self.t0.elapsed();
        self.calls.lock().push(Call { at, kind });
        let guard = (kind == Kind::Probe).then(|| {
            let now = self.probes_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_probes_in_flight.fetch_max(now, Ordering::SeqCst);
            InFlight(Arc::clone(&self.probes_in_flight))
        });
        let answer = (self.script)(kind, at);
        async move {
            let stream = async_stream::stream! {
                let _guard = guard;
                match answer {
                    Answer::Fail(_) => {}
                    Answer::Ok(ms) | Answer::DropMidStream(ms) => {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        yield Ok(Delta::Text("hello".into()));
                        if matches!(answer, Answer::Ok(_)) {
                            yield Ok(Delta::Finish(FinishReason::Stop));
                        } else {
                            yield Err(ProviderError::new(ErrorClass::Unavailable, "connection reset"));
                        }
                    }
                    Answer::Hang => std::future::pending::<()>().await,
                }
            };
            if let Answer::Fail(ms) = answer {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                return Err(ProviderError::new(ErrorClass::Unavailable, "service unavailable").with_status(503));
            }
            Ok(Box::pin(stream) as DeltaStream)
        }
        .boxed()
    }
}

/// A config over `routes` (name, level), with `extra` appended.
fn toml(routes: &[(&str, &str)], extra: &str) -> String {
    let mut s = String::from("[server]\nlisten = \"127.0.0.1:0\"\n");
    for (name, level) in routes {
        s.push_str(&format!(
            "[[routes]]\nname = \"{name}\"\nprovider = \"simulated\"\nwire = \"openai\"\nmodel = \"m-{name}\"\nregion = \"eu\"\nlevel = \"{level}\"\n"
        ));
    }
    let names: Vec<String> = routes.iter().map(|r| format!("\"{}\"", r.0)).collect();
    s.push_str(&format!("[models.chat]\nroutes = [{}]\n", names.join(", ")));
    s.push_str(extra);
    s
}

fn gateway(toml: &str, upstreams: &[(&str, &Upstream)]) -> Gateway {
    let cfg = config::load_str(toml).unwrap_or_else(|e| panic!("config: {e}"));
    let providers: HashMap<String, SharedProvider> = upstreams
        .iter()
        .map(|(name, u)| (name.to_string(), Arc::new((*u).clone()) as SharedProvider))
        .collect();
    Gateway::with_providers(Arc::new(cfg), providers)
}

fn prober(gw: &Gateway) -> Prober {
    Prober::spawn(Arc::clone(gw.mux())).expect("background probes are the default")
}

/// Sends one request and returns the route that served it ("" when none did).
async fn served_by(gw: &Gateway, hedge_off: bool) -> String {
    let req = ChatRequest {
        model: "chat".into(),
        messages: vec![Message::text(Role::User, "hi")],
        stream: true,
        ..ChatRequest::default()
    };
    let mut ctx = RequestCtx::new(Dialect::Native);
    ctx.hedge_off = hedge_off;
    let mut stream = gw.chat(req, ctx).expect("a stream");
    let mut route = String::new();
    while let Some(event) = stream.next().await {
        if let StreamEvent::Finish { envelope, .. } = event {
            route = envelope.route.unwrap_or_default();
        }
    }
    route
}

fn snapshot(gw: &Gateway, route: &str) -> tailcut::health::RouteSnapshot {
    gw.health()
        .snapshot(Instant::now(), gw.config())
        .into_iter()
        .find(|r| r.name == route)
        .expect("the route is configured")
}

/// The review's first problem, end to end: every stream dies after its first token.
#[tokio::test(start_paused = true)]
async fn route_whose_streams_die_mid_answer_opens_its_breaker() {
    let t0 = Instant::now();
    let flaky = Upstream::new(t0, |_, _| Answer::DropMidStream(50));
    let backup = Upstream::new(t0, |_, _| Answer::Ok(50));
    let gw = gateway(
        &toml(&[("flaky", "L0"), ("backup", "L1")], ""),
        &[("flaky", &flaky), ("backup", &backup)],
    );
    for _ in 0..10 {
        served_by(&gw, true).await;
    }
    let snap = snapshot(&gw, "flaky");
    assert_ne!(
        snap.breaker, "closed",
        "five mid-stream drops in a row open the breaker: {snap:?}"
    );
    assert_eq!(flaky.calls(Kind::User).len(), 5, "no user request after the fifth drop");
    assert_eq!(
        snap.midstream_failures, 5,
        "each drop counted as a mid-stream failure: {snap:?}"
    );
    assert_eq!(snap.failures, 5, "and as a failure: {snap:?}");
    assert_eq!(
        snap.error_rate, 1.0,
        "the admin view shows them in the error rate: {snap:?}"
    );
}

/// Requirement 4(a): the primary fails for its first 60 s, then is healthy; a request
/// every 4 s.
#[tokio::test(start_paused = true)]
async fn recovered_primary_carries_traffic_again_within_ten_seconds() {
    let t0 = Instant::now();
    let recovery = Duration::from_secs(60);
    let primary = Upstream::new(t0, move |_, at| {
        if at < recovery {
            Answer::Fail(20)
        } else {
            Answer::Ok(100)
        }
    });
    let backup = Upstream::new(t0, |_, _| Answer::Ok(100));
    let gw = gateway(
        &toml(&[("primary", "L0"), ("backup", "L1")], ""),
        &[("primary", &primary), ("backup", &backup)],
    );
    let _prober = prober(&gw);
    let mut back_after = None;
    for i in 0..30 {
        tokio::time::sleep_until(t0 + Duration::from_secs(4 * i)).await;
        let route = served_by(&gw, false).await;
        let at = t0.elapsed();
        if at >= recovery && route == "primary" && back_after.is_none() {
            back_after = Some(at - recovery);
        }
        if back_after.is_some() {
            assert_eq!(route, "primary", "once back, the primary keeps its traffic (at {at:?})");
        }
    }
    let back_after = back_after.expect("the primary carried traffic again");
    let closed_after = primary
        .calls(Kind::Probe)
        .into_iter()
        .find(|at| *at >= recovery)
        .map(|at| at - recovery);
    println!("primary recovered at 60 s; first probe after recovery at +{closed_after:?}, first user request served by it at +{back_after:?}");
    assert!(
        back_after <= Duration::from_secs(10),
        "a recovered primary carries traffic within 10 s, not {back_after:?}"
    );
    assert!(
        closed_after.is_some_and(|d| d <= Duration::from_secs(6)),
        "probed within max_cooldown_ms (5 s) plus a probe's TTFT of its recovery: {closed_after:?}"
    );
    let user_calls_while_down = primary.calls(Kind::User).iter().filter(|at| **at < recovery).count();
    assert_eq!(
        user_calls_while_down, 5,
        "users paid for the five failures that opened the breaker, and no probe"
    );
}

/// Requirement 4(b): while the prober probes a half-open route (its probe takes 3 s), every
/// user request goes elsewhere.
#[tokio::test(start_paused = true)]
async fn no_user_request_reaches_a_half_open_route_with_background_probes() {
    let t0 = Instant::now();
    let primary = Upstream::new(t0, |kind, at| match kind {
        Kind::User if at < Duration::from_secs(1) => Answer::Fail(10),
        Kind::Probe => Answer::Ok(3000),
        Kind::User => Answer::Ok(20),
    });
    let backup = Upstream::new(t0, |_, _| Answer::Ok(20));
    let gw = gateway(
        &toml(&[("primary", "L0"), ("backup", "L1")], ""),
        &[("primary", &primary), ("backup", &backup)],
    );
    let _prober = prober(&gw);
    let mut not_closed = 0;
    let mut half_open = 0;
    for i in 0..100 {
        tokio::time::sleep_until(t0 + Duration::from_millis(100 * i)).await;
        let state = snapshot(&gw, "primary").breaker;
        let before = primary.calls(Kind::User).len();
        let route = served_by(&gw, true).await;
        if state != "closed" {
            not_closed += 1;
            half_open += usize::from(state == "half_open");
            assert_eq!(
                primary.calls(Kind::User).len(),
                before,
                "a user request reached the primary while its breaker was {state} (request {i})"
            );
            assert_eq!(route, "backup", "served elsewhere (request {i})");
        }
    }
    assert!(
        half_open >= 20,
        "the probe held the route half-open for its 3 s: {half_open} samples"
    );
    assert!(not_closed > half_open, "the breaker was open before it was half-open");
    assert_eq!(primary.calls(Kind::Probe).len(), 1, "one probe did it");
    assert_eq!(
        snapshot(&gw, "primary").breaker,
        "closed",
        "the probe's answer closed the breaker"
    );
    assert!(
        primary.calls(Kind::User).len() > 5,
        "users are back on the primary after the probe"
    );
}

/// Requirement 4(c): one probe at a time per route, whatever `half_open_probes` says, for a
/// route whose probes hang (until the probe timeout) and one whose probes fail at once.
#[tokio::test(start_paused = true)]
async fn background_probes_run_one_at_a_time_per_route() {
    let t0 = Instant::now();
    let hangs = Upstream::new(t0, |kind, _| match kind {
        Kind::User => Answer::Fail(10),
        Kind::Probe => Answer::Hang,
    });
    let fails = Upstream::new(t0, |_, _| Answer::Fail(10));
    let backup = Upstream::new(t0, |_, _| Answer::Ok(20));
    let gw = gateway(
        &toml(
            &[("hangs", "L0"), ("fails", "L0"), ("backup", "L1")],
            "[breaker]\nhalf_open_probes = 3\n",
        ),
        &[("hangs", &hangs), ("fails", &fails), ("backup", &backup)],
    );
    let _prober = prober(&gw);
    for i in 0..240 {
        tokio::time::sleep_until(t0 + Duration::from_millis(250 * i)).await;
        served_by(&gw, true).await;
    }
    for (name, upstream, at_least) in [("hangs", &hangs, 3), ("fails", &fails, 8)] {
        let probes = upstream.calls(Kind::Probe);
        assert!(
            probes.len() >= at_least,
            "{name} was probed again and again: {probes:?}"
        );
        assert_eq!(
            upstream.max_probes_in_flight.load(Ordering::SeqCst),
            1,
            "{name}: never two probes at once"
        );
        assert!(
            probes.windows(2).all(|w| w[1] - w[0] <= Duration::from_secs(16)),
            "{name}: probes at most a probe timeout plus max_cooldown_ms apart: {probes:?}"
        );
    }
}

/// Drop = cancel: dropping the prober closes its probe in flight and hands half-open routes
/// back to traffic probes.
#[tokio::test(start_paused = true)]
async fn dropping_the_prober_cancels_its_probe() {
    let t0 = Instant::now();
    let hangs = Upstream::new(t0, |_, _| Answer::Hang);
    let gw = gateway(&toml(&[("hangs", "L0")], ""), &[("hangs", &hangs)]);
    let prober = prober(&gw);
    assert!(gw.health().background_probing(), "the prober is attached");
    gw.health().force_open("hangs", Instant::now());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(hangs.probes_in_flight.load(Ordering::SeqCst), 1, "a probe is in flight");
    drop(prober);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        hangs.probes_in_flight.load(Ordering::SeqCst),
        0,
        "its upstream connection was closed"
    );
    assert!(!gw.health().background_probing(), "the prober detached");
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(hangs.calls(Kind::Probe).len(), 1, "and nothing probes any more");
}

/// With `probe = "traffic"` the prober does not start and half-open admits a user probe.
#[tokio::test(start_paused = true)]
async fn traffic_probes_start_no_prober() {
    let t0 = Instant::now();
    let ok = Upstream::new(t0, |_, _| Answer::Ok(20));
    let gw = gateway(&toml(&[("a", "L0")], "[breaker]\nprobe = \"traffic\"\n"), &[("a", &ok)]);
    assert!(
        Prober::spawn(Arc::clone(gw.mux())).is_none(),
        "no prober with traffic probes"
    );
    gw.health().force_open("a", Instant::now());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(served_by(&gw, true).await, "a", "the first user request is the probe");
    assert_eq!(
        snapshot(&gw, "a").breaker,
        "closed",
        "and its first token closed the breaker"
    );
}

/// A route whose every stream dies mid-answer answers the one-token probe: each probe closes
/// its breaker, and on probation the first user request that fails reopens it at once, so
/// the route costs one user request per probe, not a new streak of five.
#[tokio::test(start_paused = true)]
async fn a_route_that_fails_only_mid_answer_costs_one_request_per_passed_probe() {
    let t0 = Instant::now();
    let flaky = Upstream::new(t0, |_, _| Answer::DropMidStream(20));
    let healthy = Upstream::new(t0, |_, _| Answer::Ok(20));
    let gw = gateway(
        &toml(&[("flaky", "L0"), ("healthy", "L0")], ""),
        &[("flaky", &flaky), ("healthy", &healthy)],
    );
    let _prober = prober(&gw);
    for _ in 0..30 {
        served_by(&gw, true).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let users = flaky.calls(Kind::User).len();
    let probes = flaky.calls(Kind::Probe).len();
    assert!(probes >= 1, "the prober probed it");
    assert!(
        users <= 8,
        "{users} of 30 requests reached the route that fails every answer ({probes} probes passed)"
    );
    assert!(
        users <= 5 + probes,
        "one request per passed probe at most: {users} users, {probes} probes"
    );
}
