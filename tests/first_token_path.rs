//! The first content token leaves the gateway in the poll right after `Start`: the work the
//! mux puts off until its bytes are sent (`mux::run::after_send`) never sits between the
//! commit and the first token, where it would add to every client's time to first token.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tailcut::config;
use tailcut::gateway::Gateway;
use tailcut::provider::{Delta, DeltaStream, Provider, ProviderError, SharedProvider, UpstreamRequest};
use tailcut::types::{ChatRequest, Dialect, FinishReason, Message, RequestCtx, Role, StreamEvent};

/// An upstream whose answer is all there at once: "hello", then a normal finish.
struct Ready;

impl Provider for Ready {
    fn open(&self, _req: UpstreamRequest) -> BoxFuture<'static, Result<DeltaStream, ProviderError>> {
        async move {
            let deltas = vec![Ok(Delta::Text("hello".into())), Ok(Delta::Finish(FinishReason::Stop))];
            Ok(Box::pin(futures::stream::iter(deltas)) as DeltaStream)
        }
        .boxed()
    }
}

fn gateway() -> Gateway {
    let toml = "[server]\nlisten = \"127.0.0.1:0\"\n\
        [[routes]]\nname = \"a\"\nprovider = \"simulated\"\nwire = \"openai\"\nmodel = \"m-a\"\n\
        [models.chat]\nroutes = [\"a\"]\n";
    let cfg = config::load_str(toml).unwrap_or_else(|e| panic!("config: {e}"));
    let providers: HashMap<String, SharedProvider> = [("a".to_string(), Arc::new(Ready) as SharedProvider)].into();
    Gateway::with_providers(Arc::new(cfg), providers)
}

#[tokio::test]
async fn the_first_token_follows_start_with_no_pending_between() {
    let gw = gateway();
    let req = ChatRequest {
        model: "chat".into(),
        messages: vec![Message::text(Role::User, "hi")],
        stream: true,
        ..ChatRequest::default()
    };
    let mut events = gw.chat(req, RequestCtx::new(Dialect::OpenAi)).expect("a stream");
    // Up to `Start` the stream may wait (its yields); the answer is all there at once.
    let start = events.next().await;
    assert!(matches!(start, Some(StreamEvent::Start(_))), "Start first: {start:?}");
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    match events.poll_next_unpin(&mut cx) {
        Poll::Ready(Some(StreamEvent::TextDelta(text))) => assert_eq!(text, "hello", "the first token"),
        other => panic!("the first token must come in the very next poll, got {other:?}"),
    }
    let mut rest = Vec::new();
    while let Some(event) = events.next().await {
        rest.push(event);
    }
    assert!(
        matches!(rest.last(), Some(StreamEvent::Finish { .. })),
        "then the finish: {rest:?}"
    );
    let Some(StreamEvent::Start(env)) = start else {
        unreachable!("checked above")
    };
    assert_eq!(
        env.state_hash.len(),
        32,
        "Start carries the state hash: {:?}",
        env.state_hash
    );
}
