//! One attempt: a route's upstream stream turned into `AttemptEvent`s, with tool-call
//! fragments held in the assembler so only whole, validated calls come out.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::time::Instant;

use super::tool_calls::ToolCallAssembler;
use crate::health::RoutePermit;
use crate::provider::{Delta, ProviderError, SharedProvider, UpstreamRequest};
use crate::types::{ErrorClass, FinishReason, ToolCall, Usage};

/// What an attempt reports to the mux.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptEvent {
    Text(String),
    /// A tool call began: a first content token (commit point), nothing visible yet.
    ToolStarted,
    ToolCall(ToolCall),
    Usage(Usage),
    Finished(FinishReason),
    Failed(ProviderError),
    /// The upstream is alive but nothing is visible yet (a tool-call fragment): resets the
    /// stall timer, never a token, never forwarded.
    Progress,
}

impl AttemptEvent {
    /// Is this a first content token (text or the start of a tool call)?
    pub fn is_content(&self) -> bool {
        matches!(self, AttemptEvent::Text(_) | AttemptEvent::ToolStarted)
    }
}

/// Why an attempt was started; shown in the decision record and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Primary,
    Failover,
    Hedge,
    Recovery,
}

pub struct Attempt {
    pub route: Arc<str>,
    pub model: Arc<str>,
    pub role: Role,
    pub started: Instant,
    /// Content tokens seen (text deltas and tool calls).
    pub tokens: u32,
    pub permit: Option<RoutePermit>,
    events: Pin<Box<dyn Stream<Item = AttemptEvent> + Send>>,
}

impl Attempt {
    pub fn start(
        route: Arc<str>,
        model: Arc<str>,
        role: Role,
        provider: SharedProvider,
        req: UpstreamRequest,
        permit: Option<RoutePermit>,
    ) -> Self {
        Attempt {
            route,
            model,
            role,
            started: Instant::now(),
            tokens: 0,
            permit,
            events: Box::pin(events(provider, req)),
        }
    }

    /// A stand-in attempt for tests of the mux: events come from `stream`.
    pub fn from_events(route: &str, role: Role, stream: impl Stream<Item = AttemptEvent> + Send + 'static) -> Self {
        Attempt {
            route: Arc::from(route),
            model: Arc::from(route),
            role,
            started: Instant::now(),
            tokens: 0,
            permit: None,
            events: Box::pin(stream),
        }
    }

    pub fn poll_event(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<AttemptEvent>> {
        let poll = self.events.poll_next_unpin(cx);
        if let std::task::Poll::Ready(Some(ev)) = &poll {
            if matches!(ev, AttemptEvent::Text(_) | AttemptEvent::ToolCall(_)) {
                self.tokens += 1;
            }
        }
        poll
    }

    pub async fn next_event(&mut self) -> Option<AttemptEvent> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// The attempt produced its first token (it won its race): tell the route's breaker.
    pub fn first_token(&mut self, now: Instant) {
        if let Some(permit) = self.permit.as_mut() {
            permit.first_token(now);
        }
    }

    /// Reports the outcome to the route's health.
    pub fn resolve(&mut self, outcome: Result<(), &ProviderError>) {
        if let Some(permit) = self.permit.take() {
            let now = Instant::now();
            match outcome {
                Ok(()) => permit.success(now),
                Err(e) => permit.failure(now, e.class, e.retry_after),
            }
        }
    }
}

fn events(provider: SharedProvider, req: UpstreamRequest) -> impl Stream<Item = AttemptEvent> + Send {
    async_stream::stream! {
        let tools = req.chat.tools.clone();
        let mut upstream = match provider.open(req).await {
            Ok(s) => s,
            Err(e) => {
                yield AttemptEvent::Failed(e);
                return;
            }
        };
        let mut assembler = ToolCallAssembler::new(&tools);
        let mut finish: Option<FinishReason> = None;
        while let Some(item) = upstream.next().await {
            match item {
                // Text between tool-call fragments is legal; calls still leave whole at the end.
                Ok(Delta::Text(t)) => yield AttemptEvent::Text(t),
                Ok(Delta::ToolFragment(f)) => match assembler.push(f) {
                    Ok(true) => yield AttemptEvent::ToolStarted,
                    Ok(false) => yield AttemptEvent::Progress,
                    Err(e) => {
                        yield AttemptEvent::Failed(ProviderError::new(e.class(), e.to_string()));
                        return;
                    }
                },
                Ok(Delta::ToolEnd { index }) => {
                    if let Err(e) = assembler.end(index) {
                        yield AttemptEvent::Failed(ProviderError::new(e.class(), e.to_string()));
                        return;
                    }
                    yield AttemptEvent::Progress;
                }
                Ok(Delta::Usage(u)) => yield AttemptEvent::Usage(u),
                Ok(Delta::Finish(reason)) => {
                    match assembler.finish(reason) {
                        Ok(calls) => {
                            let any = !calls.is_empty();
                            for call in calls {
                                yield AttemptEvent::ToolCall(call);
                            }
                            finish = Some(if any && reason != FinishReason::Length { FinishReason::ToolCalls } else { reason });
                        }
                        Err(e) => {
                            yield AttemptEvent::Failed(ProviderError::new(e.class(), e.to_string()));
                            return;
                        }
                    }
                }
                // After the terminal signal the answer is complete; a late error changes nothing.
                Err(_) if finish.is_some() => break,
                Err(e) => {
                    yield AttemptEvent::Failed(e);
                    return;
                }
            }
        }
        match finish {
            Some(reason) => yield AttemptEvent::Finished(reason),
            None => yield AttemptEvent::Failed(ProviderError::new(
                ErrorClass::Protocol,
                "upstream stream ended without its terminal signal",
            )),
        }
    }
}
