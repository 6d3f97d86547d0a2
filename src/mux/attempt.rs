//! One attempt: a route's upstream stream turned into `AttemptEvent`s, with tool-call
//! fragments held in the assembler so only whole, validated calls come out, and a structured
//! answer held by its gate until it is valid JSON for its schema. What an answer that failed
//! its gate said is kept on the attempt (`take_rejected`) for the repair.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::time::Instant;

use super::tool_calls::{AssemblerError, Gates, Rejected, StructuredError, StructuredGate, ToolCallAssembler};
use crate::health::RoutePermit;
use crate::provider::{Delta, ProviderError, SharedProvider, UpstreamRequest};
use crate::types::{ErrorClass, Extra, FinishReason, Thinking, ToolCall, Usage};

/// The most bytes of extras an attempt holds between two hand-overs.
const MAX_HELD_EXTRAS: usize = 4 << 20;

/// What an attempt reports to the mux.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptEvent {
    Text(String),
    /// The route's reasoning: a content token (it commits and wins a race), not answer text.
    Thinking(Thinking),
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
        matches!(
            self,
            AttemptEvent::Text(_) | AttemptEvent::Thinking(_) | AttemptEvent::ToolStarted
        )
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
    /// Content tokens seen (text and thinking deltas, and tool calls).
    pub tokens: u32,
    /// The answer's extras not yet handed on (`take_extras`), at most `MAX_HELD_EXTRAS`
    /// bytes of them: those before the first content token wait for the commit, later ones
    /// for the text they come before.
    extras: Vec<Extra>,
    extras_bytes: usize,
    pub permit: Option<RoutePermit>,
    /// What the answer said when it failed its quality gate.
    rejected: Option<Rejected>,
    /// The attempt failed only the request's own schema: that says nothing about the route,
    /// so `resolve` frees its permit without judging it.
    spares_route: bool,
    events: Pin<Box<dyn Stream<Item = Emitted> + Send>>,
}

/// What the upstream side of an attempt hands up: an event, or a failed quality gate with
/// the output that failed it (kept on the attempt, reported as `Failed`) and whether the
/// failure is the route's.
enum Emitted {
    Event(AttemptEvent),
    Extra(Box<Extra>),
    Rejected {
        error: ProviderError,
        output: Rejected,
        blames_route: bool,
    },
}

impl Attempt {
    pub fn start(
        route: Arc<str>,
        model: Arc<str>,
        role: Role,
        provider: SharedProvider,
        req: UpstreamRequest,
        gates: &Gates,
        permit: Option<RoutePermit>,
    ) -> Self {
        Attempt {
            route,
            model,
            role,
            started: Instant::now(),
            tokens: 0,
            extras: Vec::new(),
            extras_bytes: 0,
            permit,
            rejected: None,
            spares_route: false,
            events: Box::pin(events(provider, req, gates.for_attempt())),
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
            extras: Vec::new(),
            extras_bytes: 0,
            permit: None,
            rejected: None,
            spares_route: false,
            events: Box::pin(stream.map(Emitted::Event)),
        }
    }

    pub fn poll_event(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<AttemptEvent>> {
        loop {
            let Some(item) = std::task::ready!(self.events.poll_next_unpin(cx)) else {
                return std::task::Poll::Ready(None);
            };
            return std::task::Poll::Ready(match item {
                Emitted::Event(ev) => {
                    if matches!(
                        ev,
                        AttemptEvent::Text(_) | AttemptEvent::Thinking(_) | AttemptEvent::ToolCall(_)
                    ) {
                        self.tokens += 1;
                    }
                    Some(ev)
                }
                Emitted::Extra(extra) => {
                    self.hold_extra(*extra);
                    continue;
                }
                Emitted::Rejected {
                    error,
                    output,
                    blames_route,
                } => {
                    self.rejected = Some(output);
                    self.spares_route = !blames_route;
                    Some(AttemptEvent::failed(error))
                }
            });
        }
    }

    /// Keeps `extra` for `take_extras`; past `MAX_HELD_EXTRAS` bytes (an upstream that sends
    /// extras and no text, or a structured answer held whole) the rest are dropped.
    fn hold_extra(&mut self, extra: Extra) {
        let bytes = self.extras_bytes.saturating_add(extra.len());
        if bytes > MAX_HELD_EXTRAS {
            tracing::debug!(route = %self.route, "answer extras past the held bound dropped");
            return;
        }
        self.extras_bytes = bytes;
        self.extras.push(extra);
    }

    /// The extras that came since the last call, in order.
    pub fn take_extras(&mut self) -> Vec<Extra> {
        self.extras_bytes = 0;
        std::mem::take(&mut self.extras)
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

    /// Reports the outcome to the route's health. An answer that failed only the request's
    /// own schema is neither: its permit is dropped unresolved, which frees its slots.
    pub fn resolve(&mut self, outcome: Result<(), &ProviderError>) {
        if let Some(permit) = self.permit.take() {
            let now = Instant::now();
            match outcome {
                Ok(()) => permit.success(now),
                Err(_) if self.spares_route => drop(permit),
                Err(e) => permit.failure(now, e.class, e.retry_after, e.transport),
            }
        }
    }
}

/// The tool-call assembler's rejection, with what the answer's calls said.
fn rejected_calls(e: &AssemblerError, max_tokens: Option<u32>, assembler: &ToolCallAssembler) -> Emitted {
    Emitted::Rejected {
        error: e.to_error(max_tokens),
        output: Rejected::ToolCalls(assembler.rejected_calls()),
        blames_route: e.blames_route(),
    }
}

/// A call whose arguments did not parse, judged by the answer's finish `reason`: under
/// `length` it was cut short (`Incomplete`, the request's own error when it set
/// `max_tokens`), else it is what it is.
fn cut_by(e: AssemblerError, reason: FinishReason) -> AssemblerError {
    match e {
        AssemblerError::InvalidJson { index, name, .. } if reason == FinishReason::Length => {
            AssemblerError::Incomplete {
                index,
                name: Some(name),
                reason,
            }
        }
        e => e,
    }
}

/// The structured gate's rejection, with the held text.
fn rejected_text(e: &StructuredError, text: String) -> Emitted {
    Emitted::Rejected {
        error: ProviderError::new(ErrorClass::InvalidOutput, e.to_string()),
        output: Rejected::Structured(text),
        blames_route: e.blames_route(),
    }
}

fn events(
    provider: SharedProvider,
    req: UpstreamRequest,
    (mut assembler, mut gate): (ToolCallAssembler, Option<StructuredGate>),
) -> impl Stream<Item = Emitted> + Send {
    async_stream::stream! {
        let max_tokens = req.chat.max_tokens;
        let mut upstream = match provider.open(req).await {
            Ok(s) => s,
            Err(e) => {
                yield Emitted::Event(AttemptEvent::failed(e));
                return;
            }
        };
        let mut finish: Option<FinishReason> = None;
        // A call whose arguments did not parse when its block ended: judged by the finish
        // reason that follows (Anthropic closes the block before saying `max_tokens`), so a
        // call cut by the request's own limit is the request's error, not the route's.
        let mut unparsed: Option<AssemblerError> = None;
        while let Some(item) = upstream.next().await {
            match item {
                // A structured answer is held until it is judged at its end.
                Ok(Delta::Text(t)) => match gate.as_mut() {
                    None => yield Emitted::Event(AttemptEvent::Text(t)),
                    Some(g) => match g.push(&t) {
                        Ok(true) => yield Emitted::Event(AttemptEvent::ToolStarted),
                        Ok(false) => yield Emitted::Event(AttemptEvent::Progress),
                        Err(e) => {
                            yield rejected_text(&e, g.take_text());
                            return;
                        }
                    },
                },
                // Text between tool-call fragments is legal; calls still leave whole at the end.
                Ok(Delta::ToolFragment(f)) => match assembler.push(*f) {
                    Ok(true) => yield Emitted::Event(AttemptEvent::ToolStarted),
                    Ok(false) => yield Emitted::Event(AttemptEvent::Progress),
                    Err(e) => {
                        yield rejected_calls(&e, max_tokens, &assembler);
                        return;
                    }
                },
                Ok(Delta::ToolEnd { index }) => match assembler.end(index) {
                    Ok(()) => yield Emitted::Event(AttemptEvent::Progress),
                    Err(e @ AssemblerError::InvalidJson { .. }) if unparsed.is_none() => {
                        unparsed = Some(e);
                        yield Emitted::Event(AttemptEvent::Progress);
                    }
                    Err(e) => {
                        yield rejected_calls(&e, max_tokens, &assembler);
                        return;
                    }
                },
                Ok(Delta::Usage(u)) => yield Emitted::Event(AttemptEvent::Usage(u)),
                // Not held by either gate: reasoning is not the answer the gates judge.
                Ok(Delta::Thinking(t)) => yield Emitted::Event(AttemptEvent::Thinking(t)),
                Ok(Delta::Extra(extra)) => yield Emitted::Extra(extra),
                Ok(Delta::Finish(reason)) if unparsed.is_some() => {
                    if let Some(e) = unparsed.take() {
                        yield rejected_calls(&cut_by(e, reason), max_tokens, &assembler);
                    }
                    return;
                }
                Ok(Delta::Finish(reason)) => {
                    match assembler.finish(reason) {
                        Ok(calls) => {
                            let any = !calls.is_empty();
                            if let Some(g) = gate.as_mut().filter(|g| g.started()) {
                                // Judged only when the answer ended normally: a cut, refused or
                                // filtered answer goes out as it is, under its honest reason.
                                if reason == FinishReason::Stop && !any {
                                    if let Err(e) = g.check() {
                                        yield rejected_text(&e, g.take_text());
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
                            yield rejected_calls(&e, max_tokens, &assembler);
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
        if let Some(e) = unparsed {
            yield rejected_calls(&e, max_tokens, &assembler);
            return;
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
