//! One attempt: a route's upstream stream turned into `AttemptEvent`s, with tool-call
//! fragments held in the assembler so only whole, validated calls come out, and a structured
//! answer held by its gate until it is valid JSON for its schema. What an answer that failed
//! its gate said is kept on the attempt (`take_rejected`) for the repair.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::time::Instant;

use super::tool_calls::{Rejected, StructuredGate, ToolCallAssembler};
use crate::health::RoutePermit;
use crate::provider::{Delta, ProviderError, SharedProvider, UpstreamRequest};
use crate::types::{ErrorClass, FinishReason, ToolCall, Usage};

/// What an attempt reports to the mux.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptEvent {
    Text(String),
    /// A held answer began: a tool call, or a structured answer held for validation. A first
    /// content token (commit point), nothing visible yet.
    ToolStarted,
    /// Boxed, as `Failed` is: both are rare, and every text event would carry their size.
    ToolCall(Box<ToolCall>),
    Usage(Usage),
    Finished(FinishReason),
    Failed(Box<ProviderError>),
    /// The upstream is alive but nothing is visible yet (a tool-call fragment): resets the
    /// stall timer, never a token, never forwarded.
    Progress,
}

impl AttemptEvent {
    /// The attempt failed with `err`.
    pub fn failed(err: impl Into<ProviderError>) -> Self {
        AttemptEvent::Failed(Box::new(err.into()))
    }

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
    /// What the answer said when it failed its quality gate.
    rejected: Option<Rejected>,
    events: Pin<Box<dyn Stream<Item = Emitted> + Send>>,
}

/// What the upstream side of an attempt hands up: an event, or a failed quality gate with
/// the output that failed it (kept on the attempt, reported as `Failed`).
enum Emitted {
    Event(AttemptEvent),
    Rejected(ProviderError, Rejected),
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
            rejected: None,
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
            rejected: None,
            events: Box::pin(stream.map(Emitted::Event)),
        }
    }

    pub fn poll_event(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<AttemptEvent>> {
        let poll = self.events.poll_next_unpin(cx);
        poll.map(|item| match item? {
            Emitted::Event(ev) => {
                if matches!(ev, AttemptEvent::Text(_) | AttemptEvent::ToolCall(_)) {
                    self.tokens += 1;
                }
                Some(ev)
            }
            Emitted::Rejected(err, output) => {
                self.rejected = Some(output);
                Some(AttemptEvent::failed(err))
            }
        })
    }

    /// What the answer said when it failed its quality gate (its tool calls as assembled, or
    /// its structured text), once.
    pub fn take_rejected(&mut self) -> Option<Rejected> {
        self.rejected.take()
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

fn events(provider: SharedProvider, req: UpstreamRequest) -> impl Stream<Item = Emitted> + Send {
    async_stream::stream! {
        let tools = req.chat.tools.clone();
        let max_tokens = req.chat.max_tokens;
        let mut gate = StructuredGate::for_request(&req.chat);
        let mut upstream = match provider.open(req).await {
            Ok(s) => s,
            Err(e) => {
                yield Emitted::Event(AttemptEvent::failed(e));
                return;
            }
        };
        let mut assembler = ToolCallAssembler::new(&tools);
        let mut finish: Option<FinishReason> = None;
        let invalid = |message: String| ProviderError::new(ErrorClass::InvalidOutput, message);
        while let Some(item) = upstream.next().await {
            match item {
                // A structured answer is held until it is judged at its end.
                Ok(Delta::Text(t)) => match gate.as_mut() {
                    None => yield Emitted::Event(AttemptEvent::Text(t)),
                    Some(g) => match g.push(&t) {
                        Ok(true) => yield Emitted::Event(AttemptEvent::ToolStarted),
                        Ok(false) => yield Emitted::Event(AttemptEvent::Progress),
                        Err(e) => {
                            yield Emitted::Rejected(invalid(e.to_string()), Rejected::Structured(g.take_text()));
                            return;
                        }
                    },
                },
                // Text between tool-call fragments is legal; calls still leave whole at the end.
                Ok(Delta::ToolFragment(f)) => match assembler.push(*f) {
                    Ok(true) => yield Emitted::Event(AttemptEvent::ToolStarted),
                    Ok(false) => yield Emitted::Event(AttemptEvent::Progress),
                    Err(e) => {
                        yield Emitted::Rejected(e.to_error(max_tokens), Rejected::ToolCalls(assembler.rejected_calls()));
                        return;
                    }
                },
                Ok(Delta::ToolEnd { index }) => {
                    if let Err(e) = assembler.end(index) {
                        yield Emitted::Rejected(e.to_error(max_tokens), Rejected::ToolCalls(assembler.rejected_calls()));
                        return;
                    }
                    yield Emitted::Event(AttemptEvent::Progress);
                }
                Ok(Delta::Usage(u)) => yield Emitted::Event(AttemptEvent::Usage(u)),
                Ok(Delta::Finish(reason)) => {
                    match assembler.finish(reason) {
                        Ok(calls) => {
                            let any = !calls.is_empty();
                            if let Some(g) = gate.as_mut().filter(|g| g.started()) {
                                // Judged only when the answer ended normally: a cut, refused or
                                // filtered answer goes out as it is, under its honest reason.
                                if reason == FinishReason::Stop && !any {
                                    if let Err(e) = g.check() {
                                        yield Emitted::Rejected(invalid(e.to_string()), Rejected::Structured(g.take_text()));
                                        return;
                                    }
                                }
                                yield Emitted::Event(AttemptEvent::Text(g.take_text()));
                            }
                            for call in calls {
                                yield Emitted::Event(AttemptEvent::ToolCall(Box::new(call)));
                            }
                            finish = Some(if any && reason != FinishReason::Length { FinishReason::ToolCalls } else { reason });
                        }
                        Err(e) => {
                            yield Emitted::Rejected(e.to_error(max_tokens), Rejected::ToolCalls(assembler.rejected_calls()));
                            return;
                        }
                    }
                }
                // After the terminal signal the answer is complete; a late error changes nothing.
                Err(_) if finish.is_some() => break,
                Err(e) => {
                    yield Emitted::Event(AttemptEvent::failed(e));
                    return;
                }
            }
        }
        match finish {
            Some(reason) => yield Emitted::Event(AttemptEvent::Finished(reason)),
            None => yield Emitted::Event(AttemptEvent::failed(ProviderError::new(
                ErrorClass::Protocol,
                "upstream stream ended without its terminal signal",
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_event_stays_small() {
        // Each relayed event passes through the attempt, the race and the run by value: a
        // large variant must be boxed.
        let size = std::mem::size_of::<AttemptEvent>();
        assert!(size <= 32, "AttemptEvent is {size} bytes; box the variant that grew");
    }
}
