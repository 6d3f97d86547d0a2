//! The one repair attempt: an answer that failed its quality gate (a tool call whose
//! arguments are not valid JSON or do not match the tool's schema, or names no offered tool;
//! a structured answer that is not valid JSON for its `response_format`) is sent back to the
//! same route once: the request as the client sent it, then the invalid answer as the
//! assistant's previous turn (what the client already holds of it, and the invalid tool
//! calls or structured text, read back as plain text by `tool_calls::Rejected`), then a
//! user message with the validator's error asking for a corrected answer. Only when the
//! repair fails too does the request move on (the response type's policy, next route).
//! Neither gate lets the invalid output reach the client, so unless the client already
//! holds text of the answer (text before a tool call) the repaired answer needs no reset.
//! Never for a request that may have side effects; both outcomes are counted per route
//! (`tailcut_repairs_total{route,outcome}`) and told in the envelope (`repair`).

use std::sync::Arc;

use super::first_token::sleep_until_some;
use super::{Recovery, Run};
use crate::mux::attempt::{Attempt, AttemptEvent, Role};
use crate::mux::tool_calls::Rejected;
use crate::mux::MuxError;
use crate::provider::ProviderError;
use crate::telemetry::rotation as rt;
use crate::types::{ChatRequest, ErrorClass, Message, MidStreamPolicy, RepairInfo, Role as MessageRole};

/// The request's one repair, and the last invalid output seen (from which route).
#[derive(Debug, Default)]
pub(super) struct RepairState {
    stage: Stage,
    rejected: Option<(Arc<str>, Rejected)>,
}

/// Where the request's one repair stands.
#[derive(Debug, Default)]
enum Stage {
    #[default]
    Unused,
    /// Armed for this route: the next attempt started on it sends this request.
    Armed { route: Arc<str>, chat: Arc<ChatRequest> },
    /// The repair attempt runs on this route.
    Running(Arc<str>),
    /// Used; never again in this request.
    Spent,
}

impl RepairState {
    /// The repair's request, when an attempt starts on the route it was armed for.
    pub fn take_request(&mut self, route: &str) -> Option<Arc<ChatRequest>> {
        match std::mem::take(&mut self.stage) {
            Stage::Armed { route: armed, chat } if &*armed == route => {
                self.stage = Stage::Running(armed);
                Some(chat)
            }
            other => {
                self.stage = other;
                None
            }
        }
    }

    /// An attempt on `route` ended; `rejected` is what it said if it failed its quality gate.
    pub fn note(&mut self, route: &Arc<str>, rejected: Option<Rejected>) {
        if let Some(output) = rejected {
            self.rejected = Some((Arc::clone(route), output));
        }
    }

    /// The invalid output `route` gave last, once.
    fn take_rejected(&mut self, route: &str) -> Option<Rejected> {
        match self.rejected.take() {
            Some((r, output)) if &*r == route => Some(output),
            _ => None,
        }
    }
}

/// The message that asks for the correction; `error` is the validator's.
pub(crate) fn repair_prompt(error: &str, structured: bool) -> String {
    let wanted = if structured {
        "only JSON that matches the requested response format and its schema, nothing else"
    } else {
        "any tool call must name one of the offered tools and its arguments must be a JSON object matching \
         that tool's parameters schema"
    };
    format!(
        "Your previous answer (above) failed validation and was not delivered: {error}. Answer the request \
         again, complete and corrected: {wanted}."
    )
}

/// The repair's request: the client's, then the invalid answer as the assistant's turn, then
/// the validator's error.
fn repair_request(req: &ChatRequest, sent: &str, rejected: Option<&Rejected>, error: &str) -> ChatRequest {
    let mut chat = req.clone();
    let mut previous = sent.to_string();
    if let Some(output) = rejected {
        if !previous.is_empty() {
            previous.push_str("\n\n");
        }
        previous.push_str(&output.as_assistant_text());
    }
    if !previous.is_empty() {
        chat.messages.push(Message::text(MessageRole::Assistant, previous));
    }
    let structured = rejected.is_some_and(Rejected::is_structured);
    chat.messages
        .push(Message::text(MessageRole::User, repair_prompt(error, structured)));
    chat
}

impl Run {
    /// The committed attempt on `failed_route` failed: when it failed its quality gate and the
    /// repair is unused, run the repair on the same route. `None`: no repair (the caller goes
    /// on with the mid-stream policy); the repair's own failure also gives `None`, after
    /// which the request moves on.
    pub(super) async fn try_repair(&mut self, failed_route: &str) -> Option<Recovery> {
        let rejected = self.repair.take_rejected(failed_route);
        if let Stage::Running(route) = &self.repair.stage {
            if &**route == failed_route {
                self.repair_ended("failed");
            }
            return None;
        }
        let last = self.env.fell_back_from.last()?;
        if last.class != ErrorClass::InvalidOutput
            || last.route != failed_route
            || !matches!(self.repair.stage, Stage::Unused)
            || self.side_effecting()
            || self.transcript.overflowed
        {
            return None;
        }
        let error = last.message.clone();
        let chat = repair_request(&self.req, &self.transcript.text, rejected.as_ref(), &error);
        let route: Arc<str> = Arc::from(failed_route);
        self.repair.stage = Stage::Armed {
            route: Arc::clone(&route),
            chat: Arc::new(chat),
        };
        self.env.repair = Some(Box::new(RepairInfo {
            route: failed_route.to_string(),
            error,
            outcome: "running".into(),
        }));
        let Some(attempt) = self.start_again(failed_route, Role::Recovery, None) else {
            // It could not start (breaker, deadline): no repair happened.
            self.repair.stage = Stage::Spent;
            self.env.repair = None;
            return None;
        };
        match self.repair_first_token(attempt).await {
            Ok((attempt, first)) => {
                self.env.policy = Some(MidStreamPolicy::Restart);
                if !self.transcript.visible() {
                    self.transcript.clear();
                    return Some(Recovery::Restart {
                        attempt,
                        first,
                        reset: None,
                    });
                }
                Some(self.restarted(
                    super::recovery::failed_mid_stream(failed_route, &attempt),
                    attempt,
                    first,
                ))
            }
            Err(()) => {
                self.repair_ended("failed");
                None
            }
        }
    }

    /// The repair attempt's race to its first content token, alone: a failure is recorded
    /// against the route and ends the repair.
    async fn repair_first_token(&mut self, mut attempt: Attempt) -> Result<(Attempt, AttemptEvent), ()> {
        let silent_at = attempt.started + self.first_token_timeout(&attempt.route);
        let err: ProviderError = loop {
            let ev = tokio::select! {
                biased;
                ev = attempt.next_event() => ev,
                _ = sleep_until_some(Some(silent_at)) => {
                    break MuxError::FirstTokenTimeout(self.first_token_timeout(&attempt.route)).into();
                }
                _ = tokio::time::sleep_until(self.deadline) => {
                    let err = ProviderError::from(MuxError::Deadline);
                    self.record_abandoned(&mut attempt, &err);
                    self.routes.set(&attempt.route, super::routes::RouteState::Failed);
                    return Err(());
                }
            };
            match ev {
                Some(
                    ev @ (AttemptEvent::Text(_)
                    | AttemptEvent::Thinking(_)
                    | AttemptEvent::ToolStarted
                    | AttemptEvent::ToolCall(_)),
                ) => {
                    self.commit(&mut attempt, Vec::new());
                    return Ok((attempt, ev));
                }
                Some(ev @ AttemptEvent::Finished(_)) => {
                    self.commit(&mut attempt, Vec::new());
                    return Ok((attempt, ev));
                }
                Some(AttemptEvent::Failed(e)) => break *e,
                Some(AttemptEvent::Usage(_) | AttemptEvent::Progress) => continue,
                None => break MuxError::NoOutcome.into(),
            }
        };
        self.record_failure(&mut attempt, &err);
        self.routes.set(&attempt.route, super::routes::RouteState::Failed);
        Err(())
    }

    /// The repaired answer on `route` completed.
    pub(super) fn repair_completed(&mut self, route: &str) {
        if matches!(&self.repair.stage, Stage::Running(r) if &**r == route) {
            self.repair_ended("repaired");
        }
    }

    fn repair_ended(&mut self, outcome: &'static str) {
        if let Stage::Running(route) = std::mem::replace(&mut self.repair.stage, Stage::Spent) {
            metrics::counter!(rt::REPAIRS_TOTAL, "route" => route.to_string(), "outcome" => outcome).increment(1);
            if let Some(info) = self.env.repair.as_mut() {
                info.outcome = outcome.to_string();
            }
        }
    }
}
