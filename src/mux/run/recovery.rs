//! After commit: the response type's mid-stream policy (restart, continue, truncate) when the
//! committed attempt fails, and the honest end when a hidden restart diverges.

use std::sync::Arc;

use super::{Recovering, Recovery, Run, State};
use crate::mux::attempt::{Attempt, AttemptEvent};
use crate::mux::seam::Seam;
use crate::mux::{midstream, MuxError};
use crate::router::Counter;
use crate::types::{ErrorClass, ErrorEvent, FinishReason, MidStreamPolicy, StreamEvent};

impl Run {
    /// The recovering state: start the policy's attempt and say what the client sees of it.
    pub(super) async fn recover_step(&mut self, why: Recovering, out: &mut Vec<StreamEvent>) -> State {
        let recovery = match why {
            Recovering::Failed(route) => self.recover(&route).await,
            Recovering::StartOver(cur) => self.start_over(cur).await,
        };
        match recovery {
            Recovery::Restart { attempt, first, reset } => {
                self.replaced();
                out.extend(reset.map(|reason| StreamEvent::Reset { reason }));
                let seam = if self.transcript.visible() {
                    Seam::swallow(&self.transcript.text)
                } else {
                    Seam::Pass
                };
                State::Streaming(self.streaming(attempt, first, seam))
            }
            Recovery::Continue { attempt, first } => {
                // The `route_switch` is said once the seam lets the continuation's first text
                // through: one that cannot be told from a restart becomes a `reset` alone.
                let seam = self.continuation_seam(&attempt.route);
                let mut streaming = self.streaming(attempt, first, seam);
                streaming.switch = true;
                State::Streaming(streaming)
            }
            Recovery::Done(reason) => {
                self.finish(reason, out);
                State::Finished
            }
            Recovery::Truncate => {
                self.env.attempt_usage = self.attempt_usage();
                self.log_outcome("truncated");
                out.push(StreamEvent::Finish {
                    reason: FinishReason::Truncated,
                    envelope: Box::new(self.env.clone()),
                });
                State::Finished
            }
            Recovery::Fail(mut e) => {
                e.envelope.attempt_usage = self.attempt_usage();
                self.log_outcome(e.class.as_str());
                out.push(StreamEvent::Error(e));
                State::Finished
            }
        }
    }

    /// The committed attempt on `failed_route` failed: apply the response type's policy.
    pub(super) async fn recover(&mut self, failed_route: &str) -> Recovery {
        if self.transcript.thinking && !self.ctx.dialect.can_reset() {
            // The client holds reasoning (perhaps a block cut before its signature) that no
            // new answer, a repair's included, can continue or pass for, and this dialect
            // cannot take it back.
            return self.unrecoverable_because("its reasoning was shown, and this dialect cannot replace it");
        }
        // An answer that failed its quality gate gets one repair on its route first.
        if let Some(repaired) = self.try_repair(failed_route).await {
            return repaired;
        }
        // Whatever carries on is a restart (the whole answer) unless it is a continuation.
        self.carried = 0;
        let limit = self.mux.config.limits.max_midstream_recoveries;
        if self.recoveries >= limit {
            return self.unrecoverable_because("its mid-stream recoveries are spent (limits.max_midstream_recoveries)");
        }
        self.recoveries += 1;
        if self.transcript.tool_calls > 0 {
            // Tool calls leave only at the answer's end: the answer was complete.
            return Recovery::Done(FinishReason::ToolCalls);
        }
        if !self.transcript.visible() {
            // Nothing the client would have to unsee: a seamless restart in every dialect.
            self.transcript.clear();
            self.env.policy = Some(MidStreamPolicy::Restart);
            return match self.first_token(false, None).await {
                Ok((attempt, first)) => Recovery::Restart {
                    attempt,
                    first,
                    reset: None,
                },
                Err(e) => Recovery::Fail(Box::new(e)),
            };
        }
        let prefill_route = self.routes.any_untried(|c| self.can_continue(&c.route))
            || (!self.routes.any_untried(|_| true) && self.can_continue(failed_route));
        let pair = self.mux.config.policies.for_type(self.rtype);
        let policy = midstream::choose(pair, self.rtype, &self.transcript, prefill_route);
        if policy != MidStreamPolicy::Truncate {
            // Truncate is the envelope's policy only if the type has it (`unrecoverable`).
            self.env.policy = Some(policy);
        }
        match policy {
            MidStreamPolicy::Truncate => {
                self.unrecoverable_because("it is too long to continue or compare with a new answer")
            }
            MidStreamPolicy::Restart => match self.first_token(false, None).await {
                Ok((attempt, first)) => self.restarted(failed_mid_stream(failed_route, &attempt), attempt, first),
                Err(e) => self.unrecoverable(e),
            },
            MidStreamPolicy::Continue => {
                let partial = self.transcript.text.clone();
                // What the cut attempts delivered, counted by the tokenizer of the route that
                // wrote it: the continuation's prefill, taken from the client's max_tokens.
                self.carried = self.answer_tokens(failed_route, &partial);
                if self.req.max_tokens.is_some_and(|max| self.carried >= max) {
                    // The client holds all the tokens it asked for: the answer ends at its
                    // limit, with no attempt that could only be asked for nothing.
                    return Recovery::Done(FinishReason::Length);
                }
                match self.first_token(false, Some(&partial)).await {
                    Ok((attempt, first)) => Recovery::Continue { attempt, first },
                    // No route could continue: the type's fallback, if it is a restart.
                    Err(_) if pair.1 == MidStreamPolicy::Restart => {
                        self.carried = 0;
                        self.env.policy = Some(MidStreamPolicy::Restart);
                        match self.first_token(false, None).await {
                            Ok((attempt, first)) => {
                                self.restarted(failed_mid_stream(failed_route, &attempt), attempt, first)
                            }
                            Err(e) => self.unrecoverable(e),
                        }
                    }
                    Err(e) => self.unrecoverable(e),
                }
            }
        }
    }

    /// The continuation on `cur` could not be told from a restart (`SeamOut::StartOver`):
    /// nothing of it was sent; drop it and, when the response type falls back to a restart,
    /// restart, on the same route if it is the best one left (it answered; it only did not
    /// continue). A type whose fallback is truncate (voice: continue, else truncate) ends
    /// with what the client holds instead.
    pub(super) async fn start_over(&mut self, cur: Attempt) -> Recovery {
        let route = Arc::clone(&cur.route);
        // It streamed (and was billed), but nothing of it reached the client.
        self.bill(&cur, "", false);
        drop(cur);
        self.carried = 0;
        self.routes.set(&route, super::routes::RouteState::PrefillRefused);
        if self.mux.config.policies.for_type(self.rtype).1 != MidStreamPolicy::Restart {
            return self.unrecoverable_because("its continuation could not be verified and its type does not restart");
        }
        self.env.policy = Some(MidStreamPolicy::Restart);
        match self.first_token(false, None).await {
            Ok((attempt, first)) => {
                let reason = format!(
                    "{route}'s continuation could not be verified; restarted on {}",
                    attempt.route
                );
                self.restarted(reason, attempt, first)
            }
            Err(e) => self.unrecoverable(e),
        }
    }

    /// No policy of the answer's type can carry it on: no route could take it (`error`, that
    /// of the last try). A type with truncate among its policies (voice, and tool and
    /// structured output by default) ends truncated, keeping what the client holds; any other
    /// (prose by default) ends with that honest error, its envelope naming the last policy
    /// tried, never claiming a truncate policy it does not have.
    /// Its class is `unavailable` whatever the last try's was: part of the answer was served,
    /// so it is neither the request's fault (a 400 on the restart) nor a plain rate limit;
    /// its retry hint, if any, is kept.
    fn unrecoverable(&mut self, mut error: ErrorEvent) -> Recovery {
        let (first, fallback) = self.mux.config.policies.for_type(self.rtype);
        if first == MidStreamPolicy::Truncate || fallback == MidStreamPolicy::Truncate {
            self.env.policy = Some(MidStreamPolicy::Truncate);
            return Recovery::Truncate;
        }
        if error.class != ErrorClass::Unavailable {
            error.message = format!(
                "the answer broke mid-stream and could not be carried on: {}",
                error.message
            );
            error.class = ErrorClass::Unavailable;
            error.status = ErrorClass::Unavailable.http_status();
        }
        Recovery::Fail(Box::new(error))
    }

    /// As `unrecoverable`, for a reason that is no route's failure.
    fn unrecoverable_because(&mut self, why: &'static str) -> Recovery {
        let error = self.error_event(&MuxError::Unrecoverable(why).into());
        self.unrecoverable(error)
    }

    /// The output tokens of `text`, the answer the client holds, by the tokenizer of the
    /// route that wrote it (the estimate for a route without one).
    fn answer_tokens(&self, route: &str, text: &str) -> u32 {
        let counter = self.route_config(route).map_or(Counter::Estimate, Counter::for_route);
        u32::try_from(counter.text_tokens(text)).unwrap_or(u32::MAX)
    }

    /// A restart committed on `attempt`: a client that can be told gets a reset.
    /// `reason` is what the client's reset says.
    pub(super) fn restarted(&mut self, reason: String, attempt: Attempt, first: AttemptEvent) -> Recovery {
        let reset = if self.ctx.dialect.can_reset() {
            self.env.resets += 1;
            self.transcript.clear();
            Some(reason)
        } else {
            None
        };
        Recovery::Restart { attempt, first, reset }
    }

    /// A restart the client could not be told about produced a different answer.
    pub(super) fn diverged(&mut self, cur: &Attempt) -> StreamEvent {
        let err = MuxError::Diverged {
            route: cur.route.to_string(),
        };
        self.log_outcome("diverged");
        StreamEvent::Error(Box::new(self.error_event(&err.into())))
    }
}

/// A reset's reason after `failed_route` failed mid-stream.
pub(super) fn failed_mid_stream(failed_route: &str, attempt: &Attempt) -> String {
    format!("{failed_route} failed mid-stream; restarted on {}", attempt.route)
}
