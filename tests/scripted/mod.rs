//! Test harness for the request path without sockets: scripted in-process providers (a
//! sequence of deltas, waits and errors per call), a gateway over them, and readers of the
//! events that come out. Everything runs on paused tokio time.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use parking_lot::Mutex;
use tailcut::config;
use tailcut::gateway::Gateway;
use tailcut::provider::{Delta, DeltaStream, Provider, ProviderError, SharedProvider, UpstreamRequest};
use tailcut::types::{ChatRequest, ErrorClass, FinishReason, Message, RequestCtx, Role, StreamEvent};
use tokio::time::Instant;

#[derive(Clone)]
pub enum Step {
    Wait(u64),
    D(Delta),
    Err(ProviderError),
    Hang,
}

#[derive(Clone)]
pub enum Script {
    /// Fail to open after this many ms.
    OpenErr(u64, ProviderError),
    Stream(Vec<Step>),
    /// Call n gets script n (the last one repeats).
    Seq(Vec<Script>),
}

/// A scripted provider; it counts its calls and keeps every request it was sent.
pub struct Fake {
    script: Script,
    calls: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<UpstreamRequest>>>,
}

impl Fake {
    /// A provider playing `script`, counted and recorded nowhere the test can see.
    pub fn new(script: Script) -> Self {
        Fake {
            script,
            calls: Arc::default(),
            seen: Arc::default(),
        }
    }
}

impl Provider for Fake {
    fn open(&self, req: UpstreamRequest) -> BoxFuture<'static, Result<DeltaStream, ProviderError>> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        self.seen.lock().push(req);
        let mut script = self.script.clone();
        if let Script::Seq(v) = &script {
            script = v[n.min(v.len() - 1)].clone();
        }
        async move {
            match script {
                Script::OpenErr(ms, e) => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Err(e)
                }
                Script::Stream(steps) => {
                    let s = async_stream::stream! {
                        for step in steps {
                            match step {
                                Step::Wait(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                                Step::D(d) => yield Ok(d),
                                Step::Err(e) => { yield Err(e); return; }
                                Step::Hang => std::future::pending::<()>().await,
                            }
                        }
                    };
                    Ok(Box::pin(s) as DeltaStream)
                }
                Script::Seq(_) => Err(ProviderError::new(ErrorClass::Internal, "nested script")),
            }
        }
        .boxed()
    }
}

/// What each scripted route saw.
#[derive(Default)]
pub struct Seen {
    pub calls: HashMap<String, Arc<AtomicUsize>>,
    pub requests: HashMap<String, Arc<Mutex<Vec<UpstreamRequest>>>>,
}

impl Seen {
    pub fn calls(&self, route: &str) -> usize {
        self.calls.get(route).map_or(0, |c| c.load(Ordering::SeqCst))
    }

    /// The prefill text of each request `route` was sent (`None`: not a continuation).
    pub fn prefills(&self, route: &str) -> Vec<Option<String>> {
        self.requests.get(route).map_or_else(Vec::new, |r| {
            r.lock()
                .iter()
                .map(|u| u.prefill.as_ref().map(|p| p.text.clone()))
                .collect()
        })
    }
}

/// A config with `routes` (name, level) on simulated stand-ins, all in model `chat`.
/// Routes whose name starts with `n` cannot continue (no prefill).
pub fn toml(routes: &[(&str, &str)], extra: &str) -> String {
    let mut s = String::from("[server]\nlisten = \"127.0.0.1:0\"\n");
    s.push_str(extra);
    for (name, level) in routes {
        s.push_str(&format!(
            "[[routes]]\nname = \"{name}\"\nprovider = \"simulated\"\nwire = \"openai\"\nscenario = \"fast-stable\"\nmodel = \"m-{name}\"\nregion = \"eu\"\nlevel = \"{level}\"\ncapabilities = [\"tools\", \"streaming\"{}]\n",
            if name.starts_with('n') { "" } else { ", \"prefill\"" }
        ));
    }
    let names: Vec<String> = routes.iter().map(|r| format!("\"{}\"", r.0)).collect();
    s.push_str(&format!("[models.chat]\nroutes = [{}]\n", names.join(", ")));
    s
}

pub fn gateway(toml: &str, scripts: Vec<(&str, Script)>) -> (Gateway, Seen) {
    let cfg = config::load_str(toml).unwrap_or_else(|e| panic!("config: {e}"));
    let mut providers: HashMap<String, SharedProvider> = HashMap::new();
    let mut seen = Seen::default();
    for (name, script) in scripts {
        let calls = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        seen.calls.insert(name.to_string(), Arc::clone(&calls));
        seen.requests.insert(name.to_string(), Arc::clone(&requests));
        providers.insert(
            name.to_string(),
            Arc::new(Fake {
                script,
                calls,
                seen: requests,
            }),
        );
    }
    (Gateway::with_providers(Arc::new(cfg), providers), seen)
}

pub fn req() -> ChatRequest {
    ChatRequest {
        model: "chat".into(),
        messages: vec![Message::text(Role::User, "hi")],
        stream: true,
        ..ChatRequest::default()
    }
}

pub async fn collect(gw: &Gateway, req: ChatRequest, ctx: RequestCtx) -> Vec<StreamEvent> {
    let mut s = gw.chat(req, ctx).expect("stream");
    let mut out = Vec::new();
    while let Some(ev) = s.next().await {
        out.push(ev);
    }
    out
}

pub fn text(t: &str) -> Step {
    Step::D(Delta::Text(t.into()))
}

pub fn finish() -> Step {
    Step::D(Delta::Finish(FinishReason::Stop))
}

/// An answer of `words`, one token each after `ttft_ms`, 10 ms apart, that finishes.
pub fn answer(ttft_ms: u64, words: &[&str]) -> Script {
    let mut steps = vec![Step::Wait(ttft_ms)];
    for w in words {
        steps.push(text(w));
        steps.push(Step::Wait(10));
    }
    steps.push(finish());
    Script::Stream(steps)
}

/// The first `words`, then the connection drops.
pub fn dropped_after(words: &[&str]) -> Script {
    let mut steps = vec![Step::Wait(10)];
    for w in words {
        steps.push(text(w));
        steps.push(Step::Wait(10));
    }
    steps.push(Step::Err(ProviderError::new(
        ErrorClass::Unavailable,
        "connection reset",
    )));
    Script::Stream(steps)
}

pub fn err(class: ErrorClass, status: u16) -> ProviderError {
    let mut e = ProviderError::new(class, format!("upstream said {status}"));
    e.status = Some(status);
    e
}

pub fn breaker(gw: &Gateway, route: &str) -> String {
    gw.health()
        .snapshot(Instant::now(), gw.config())
        .into_iter()
        .find(|r| r.name == route)
        .map(|r| r.breaker)
        .unwrap_or_default()
}

/// The text a client that honours resets ends with.
pub fn final_text(evs: &[StreamEvent]) -> String {
    let mut out = String::new();
    for e in evs {
        match e {
            StreamEvent::TextDelta(t) => out.push_str(t),
            StreamEvent::Reset { .. } => out.clear(),
            _ => {}
        }
    }
    out
}

pub fn kinds(evs: &[StreamEvent]) -> Vec<String> {
    evs.iter()
        .map(|e| match e {
            StreamEvent::Start(_) => "start".into(),
            StreamEvent::TextDelta(t) => format!("text({t})"),
            StreamEvent::Thinking(t) => format!("thinking({t:?})"),
            StreamEvent::Extra(e) => format!("extra({:?})", e.field),
            StreamEvent::ToolCall(c) => format!("tool({})", c.name),
            StreamEvent::Reset { .. } => "reset".into(),
            StreamEvent::RouteSwitch { .. } => "switch".into(),
            StreamEvent::Usage(_) => "usage".into(),
            StreamEvent::Finish { reason, .. } => format!("finish({reason:?})"),
            StreamEvent::Error(e) => format!("error({:?},{})", e.class, e.status),
        })
        .collect()
}

/// The envelope of the final event (finish or error).
pub fn envelope(evs: &[StreamEvent]) -> Option<&tailcut::types::Envelope> {
    evs.iter().rev().find_map(|e| match e {
        StreamEvent::Finish { envelope, .. } => Some(&**envelope),
        StreamEvent::Error(e) => Some(&e.envelope),
        _ => None,
    })
}
