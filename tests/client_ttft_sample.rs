//! The client TTFT sample is recorded once per committed answer, after its first token has
//! gone out, and also when the stream is dropped before that (the pump drops it at `Finish`;
//! a client may go away after `Start`). One test in its own binary: the histogram is the
//! process's.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tailcut::config;
use tailcut::gateway::Gateway;
use tailcut::provider::{Delta, DeltaStream, Provider, ProviderError, SharedProvider, UpstreamRequest};
use tailcut::types::{ChatRequest, Dialect, FinishReason, Message, RequestCtx, Role, StreamEvent};

/// An upstream that answers these deltas at once.
struct Answers(Vec<Delta>);

impl Provider for Answers {
    fn open(&self, _req: UpstreamRequest) -> BoxFuture<'static, Result<DeltaStream, ProviderError>> {
        let deltas: Vec<Result<Delta, ProviderError>> = self.0.iter().cloned().map(Ok).collect();
        async move { Ok(Box::pin(futures::stream::iter(deltas)) as DeltaStream) }.boxed()
    }
}

fn gateway(deltas: Vec<Delta>) -> Gateway {
    let toml = "[server]\nlisten = \"127.0.0.1:0\"\n\
        [[routes]]\nname = \"a\"\nprovider = \"simulated\"\nwire = \"openai\"\nmodel = \"m-a\"\n\
        [models.chat]\nroutes = [\"a\"]\n";
    let cfg = config::load_str(toml).unwrap_or_else(|e| panic!("config: {e}"));
    let providers: HashMap<String, SharedProvider> =
        [("a".to_string(), Arc::new(Answers(deltas)) as SharedProvider)].into();
    Gateway::with_providers(Arc::new(cfg), providers)
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "chat".into(),
        messages: vec![Message::text(Role::User, "hi")],
        stream: true,
        ..ChatRequest::default()
    }
}

fn samples() -> u64 {
    let text = tailcut::telemetry::install().map(|h| h.render()).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("tailcut_client_ttft_seconds_count "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Where a case's reader lets go of the stream.
type Stop = fn(&StreamEvent) -> bool;

/// Reads events until `stop` says so, then drops the stream there, as the pump does.
async fn read_until(gw: &Gateway, stop: Stop) {
    let mut events = gw.chat(request(), RequestCtx::new(Dialect::OpenAi)).expect("a stream");
    while let Some(event) = events.next().await {
        if stop(&event) {
            break;
        }
    }
}

#[tokio::test]
async fn every_committed_answer_counts_once_however_its_stream_ends() {
    let text = vec![Delta::Text("hello".into()), Delta::Finish(FinishReason::Stop)];
    let empty = vec![Delta::Finish(FinishReason::Length)];
    let cases: [(&str, Vec<Delta>, Stop); 4] = [
        ("read to the end", text.clone(), |_| false),
        ("dropped at Finish", text.clone(), |e| {
            matches!(e, StreamEvent::Finish { .. })
        }),
        ("dropped after Start", text, |e| matches!(e, StreamEvent::Start(_))),
        ("an answer with no content, dropped at Finish", empty, |e| {
            matches!(e, StreamEvent::Finish { .. })
        }),
    ];
    for (case, deltas, stop) in cases {
        let gw = gateway(deltas);
        let before = samples();
        read_until(&gw, stop).await;
        assert_eq!(samples(), before + 1, "{case}: one sample");
    }
}
