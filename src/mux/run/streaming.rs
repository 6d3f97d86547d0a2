//! The streaming state: the committed attempt's events go to the client through the seam,
//! under the route's stall limit and the request's stream cap. A failure, or a continuation
//! that cannot be told from a restart, hands over to recovery.
//!
//! Cancellation points: the one `select!` in `stream_step` (the attempt's next event, the
//! stall timer, the cap). Dropping the request's stream there drops this state, its attempt
//! and that attempt's upstream connection.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep_until, Instant, Sleep};

use super::routes::RouteState;
use super::{Recovering, Run, State};
use crate::mux::attempt::{Attempt, AttemptEvent};
use crate::mux::seam::{Seam, SeamOut, SeamVerdict};
use crate::mux::MuxError;
use crate::telemetry as t;
use crate::types::{Blame, ExtraField, FinishReason, MidStreamPolicy, StreamEvent};

/// The committed attempt and how its text joins what the client holds.
pub(super) struct Streaming {
    pub cur: Attempt,
    pub seam: Seam,
    /// The attempt's first event, from the race: it did not come after a gap, so it must not
    /// enter the inter-token window (a zero gap would tighten every stall limit).
    pending: Option<AttemptEvent>,
    last_token: Instant,
    /// When the last step handed its events on. Until the request's reader asks again the
    /// attempt is not read (a client that stops reading stops the pump), and that pause is
    /// the client's: it is added to `last_token`, so it neither trips the stall limit nor
    /// enters the route's inter-token gaps.
    handed_on: Option<Instant>,
    /// A continuation's `route_switch` is due: said with its first text past the seam (then
    /// counted, and sent to a client that can be told); dropped if it starts over.
    pub switch: bool,
    /// Computed once per attempt: it reads the route's gap histogram.
    stall: Duration,
    /// Where this attempt's text starts in the transcript: what it delivered is after it.
    text_from: usize,
    /// The stall and cap timers, kept for the attempt's life and moved forward at each
    /// event (a later deadline is one atomic store) instead of registered with the timer
    /// wheel and cancelled again at every event.
    timers: Pin<Box<Timers>>,
}

pin_project_lite::pin_project! {
    struct Timers {
        #[pin]
        stall: Sleep,
        #[pin]
        cap: Sleep,
    }
}

/// What the seam let through, as events for the client, or a continuation to replace.
enum Joined {
    Events,
    StartOver,
}

impl Run {
    pub(super) fn streaming(&self, cur: Attempt, first: AttemptEvent, seam: Seam) -> Streaming {
        let stall = self.stall_limit(&cur.route);
        let last_token = Instant::now();
        Streaming {
            timers: Box::pin(Timers {
                stall: sleep_until(last_token + stall),
                cap: sleep_until(self.capped_at),
            }),
            stall,
            // A hidden restart writes the whole answer again (the seam swallows what the
            // client has): all of it is its output.
            text_from: if matches!(seam, Seam::Swallow { .. }) {
                0
            } else {
                self.transcript.text.len()
            },
            cur,
            seam,
            pending: Some(first),
            last_token,
            handed_on: None,
            switch: false,
        }
    }

    /// One event of the committed attempt: its effect on the client (`out`) and the next state.
    pub(super) async fn stream_step(&mut self, mut s: Streaming, out: &mut Vec<StreamEvent>) -> State {
        if let Some(at) = s.handed_on.take() {
            s.last_token += Instant::now().saturating_duration_since(at);
        }
        let (ev, after_gap) = match s.pending.take() {
            Some(ev) => (ev, false),
            None => {
                let mut timers = s.timers.as_mut().project();
                timers.stall.as_mut().reset(s.last_token + s.stall);
                if timers.cap.deadline() != self.capped_at {
                    timers.cap.as_mut().reset(self.capped_at);
                }
                let ev = tokio::select! {
                    biased;
                    ev = s.cur.next_event() => ev.unwrap_or_else(|| AttemptEvent::failed(MuxError::NoOutcome)),
                    _ = timers.stall => {
                        AttemptEvent::failed(MuxError::Stalled(s.stall))
                    }
                    _ = timers.cap => {
                        // Our own cap, not the route's failure: end honestly, blame no one.
                        self.record_abandoned(&mut s.cur, &MuxError::StreamCap.into());
                        let delivered = self.transcript.text.get(s.text_from..).unwrap_or_default().to_owned();
                        self.bill(&s.cur, &delivered, true);
                        self.env.attempt_usage = self.attempt_usage();
                        self.env.policy = Some(MidStreamPolicy::Truncate);
                        self.log_outcome("truncated");
                        out.push(StreamEvent::Finish { reason: FinishReason::Truncated, envelope: Box::new(self.env.clone()) });
                        return State::Finished;
                    }
                };
                (ev, true)
            }
        };
        // The extras that came before this event are handed on first: an extra belongs with
        // the text that follows it. Only a client of the extra's wire has a place for it. Those
        // bound to text (logprobs, a refusal's marker) go only with text the seam passes as
        // it came: not with text a held answer keeps back (they wait for it, on the attempt),
        // nor text a hidden restart swallows or a continuation is verified on (dropped).
        if !matches!(ev, AttemptEvent::Progress) {
            let wire = self.ctx.dialect.wire();
            let passes = s.seam.is_pass();
            for extra in s.cur.take_extras().into_iter().filter(|e| Some(e.wire) == wire) {
                let bound = matches!(
                    extra.field,
                    ExtraField::Logprobs | ExtraField::Refusal | ExtraField::Citation
                );
                if bound && !passes {
                    continue;
                }
                self.transcript.logprobs |= extra.field == ExtraField::Logprobs;
                out.push(StreamEvent::Extra(Box::new(extra)));
            }
        }
        if matches!(ev, AttemptEvent::ToolCall(_) | AttemptEvent::Finished(_)) {
            // Whatever the seam still holds is settled before a tool call or the end.
            let (held, verdict) = s.seam.finish();
            self.seam_verdict(verdict);
            match self.joined(held, &s.cur, &mut s.switch, out) {
                Joined::StartOver => return State::Recovering(Recovering::StartOver(s.cur)),
                Joined::Events if ended(out) => return State::Finished,
                Joined::Events => {}
            }
        }
        match ev {
            AttemptEvent::Progress => s.last_token = Instant::now(),
            AttemptEvent::Text(text) => {
                self.token_arrived(&mut s, after_gap);
                let (joined, verdict) = s.seam.feed_owned(text);
                self.seam_verdict(verdict);
                match self.joined(joined, &s.cur, &mut s.switch, out) {
                    Joined::StartOver => return State::Recovering(Recovering::StartOver(s.cur)),
                    Joined::Events if ended(out) => return State::Finished,
                    Joined::Events => {}
                }
            }
            AttemptEvent::Thinking(thinking) => {
                self.token_arrived(&mut s, after_gap);
                match s.seam {
                    Seam::Pass => {
                        self.voiced(&s.cur, &mut s.switch, out);
                        self.transcript.thinking = true;
                        out.push(StreamEvent::Thinking(thinking));
                    }
                    // A hidden restart that reasons: its reasoning cannot pass for what the
                    // client was shown, nor its answer for the one begun without it.
                    Seam::Swallow { .. } => {
                        out.push(self.diverged(&s.cur));
                        return State::Finished;
                    }
                    // A continuation's own reasoning is about resuming, not the answer's: it
                    // is not forwarded (`docs/dialects.md`).
                    Seam::Verify { .. } | Seam::Trim { .. } => {}
                }
            }
            AttemptEvent::ToolStarted => {
                s.last_token = Instant::now();
                self.voiced(&s.cur, &mut s.switch, out);
                self.transcript.tool_open = true;
            }
            AttemptEvent::ToolCall(call) => {
                s.last_token = Instant::now();
                self.voiced(&s.cur, &mut s.switch, out);
                self.transcript.tool_calls += 1;
                self.transcript.tool_open = false;
                if self.mux.config.cache.enabled {
                    self.calls.push((*call).clone());
                }
                out.push(StreamEvent::ToolCall(call));
            }
            AttemptEvent::Usage(u) => self.usage = Some(u),
            AttemptEvent::Finished(reason) => {
                // A continuation that only ended the answer still carried it.
                self.voiced(&s.cur, &mut s.switch, out);
                s.cur.resolve(Ok(()));
                let delivered = self.transcript.text.get(s.text_from..).unwrap_or_default().to_owned();
                self.bill(&s.cur, &delivered, true);
                self.repair_completed(&s.cur.route);
                self.remember(&s.cur.route, reason);
                self.finish(reason, out);
                return State::Finished;
            }
            AttemptEvent::Failed(err) => {
                self.record_failure(&mut s.cur, &err);
                let delivered = self.transcript.text.get(s.text_from..).unwrap_or_default().to_owned();
                self.bill(&s.cur, &delivered, true);
                metrics::counter!(t::MIDSTREAM_TOTAL, "class" => err.class.as_str()).increment(1);
                let route = Arc::clone(&s.cur.route);
                self.routes.set(&route, RouteState::Failed);
                // Close the failed upstream now, not when a recovery commits.
                drop(s);
                if err.class.blame() == Blame::Client {
                    // The request's own error (its max_tokens cut a tool call): every route
                    // would fail it the same way, so no policy runs; the client is told why.
                    let error = self.error_event(&err);
                    self.log_outcome(error.class.as_str());
                    out.push(StreamEvent::Error(Box::new(error)));
                    return State::Finished;
                }
                return State::Recovering(Recovering::Failed(route));
            }
        }
        s.handed_on = Some(Instant::now());
        State::Streaming(s)
    }

    /// A token (text or thinking) arrived: the stall timer restarts, and the gap since the
    /// last one enters the route's inter-token window (not the race's first event's).
    fn token_arrived(&self, s: &mut Streaming, after_gap: bool) {
        let now = Instant::now();
        if after_gap {
            let gap = now.saturating_duration_since(s.last_token);
            self.mux.health.record_token_gap(&s.cur.route, now, gap);
        }
        s.last_token = now;
    }

    /// The answer is complete: usage (when asked for) and the finish.
    pub(super) fn finish(&mut self, reason: FinishReason, out: &mut Vec<StreamEvent>) {
        self.env.attempt_usage = self.attempt_usage();
        if self.req.include_usage {
            if let Some(u) = self.answer_usage() {
                out.push(StreamEvent::Usage(u));
            }
        }
        self.log_outcome("completed");
        out.push(StreamEvent::Finish {
            reason,
            envelope: Box::new(self.env.clone()),
        });
    }

    /// The seam for a continuation committed on `route`: verified against everything the
    /// client holds, knowing what the route's convention withheld from the prefill. After a
    /// client's own prefill that is the prefill and then the answer: the continuation request
    /// ends with both as one assistant message, and an upstream that starts over repeats that
    /// message from its start (compared with the answer alone, a start-over was spliced in,
    /// and every true continuation beginning with a space like the answer was taken for an
    /// ambiguous one and restarted).
    pub(super) fn continuation_seam(&self, route: &str) -> Seam {
        let convention = self.route_config(route).map(|r| r.prefill).unwrap_or_default();
        let text = match self.req.assistant_prefill() {
            Some(own) => own + &self.transcript.text,
            None => self.transcript.text.clone(),
        };
        Seam::verify(&text, convention.withheld(&text))
    }

    /// Turns what the seam let through into events for the client: text, or, when the new
    /// attempt turned out to be a different answer, a reset and that answer (clients that can
    /// be told) or an honest error (the SDK dialects).
    /// A continuation's pending `switch` goes first, with its first text.
    fn joined(&mut self, joined: SeamOut, cur: &Attempt, switch: &mut bool, out: &mut Vec<StreamEvent>) -> Joined {
        match joined {
            SeamOut::Emit(s) if !s.is_empty() => {
                self.voiced(cur, switch, out);
                self.transcript.push_text(&s);
                out.push(StreamEvent::TextDelta(s));
            }
            SeamOut::Emit(_) | SeamOut::Hold => {}
            SeamOut::Diverged { replay } if self.ctx.dialect.can_reset() => {
                self.env.resets += 1;
                self.transcript.clear();
                out.push(StreamEvent::Reset {
                    reason: format!("{} did not continue the answer; its new answer replaces it", cur.route),
                });
                *switch = false;
                self.voiced(cur, switch, out);
                if !replay.is_empty() {
                    self.transcript.push_text(&replay);
                    out.push(StreamEvent::TextDelta(replay));
                }
            }
            SeamOut::Diverged { .. } => out.push(self.diverged(cur)),
            SeamOut::StartOver => return Joined::StartOver,
        }
        Joined::Events
    }

    /// `cur` hands the client something of the answer: it is now the route the client last
    /// heard from. A continuation's due `switch` is counted and said (to a client that can be
    /// told) when it moves the answer to another route; on the same route it is no switch.
    fn voiced(&mut self, cur: &Attempt, switch: &mut bool, out: &mut Vec<StreamEvent>) {
        let due = std::mem::take(switch);
        if self.voiced.as_deref() == Some(&*cur.route) {
            return;
        }
        let from = self.voiced.replace(Arc::clone(&cur.route));
        if let (true, Some(from)) = (due, from) {
            self.env.route_switches += 1;
            if self.ctx.dialect.can_reset() {
                out.push(StreamEvent::RouteSwitch {
                    from: from.to_string(),
                    to: cur.route.to_string(),
                });
            }
        }
    }

    fn seam_verdict(&mut self, verdict: Option<SeamVerdict>) {
        if let Some(v) = verdict {
            metrics::counter!(t::SEAMS_TOTAL, "verdict" => v.metric_label()).increment(1);
            if v != SeamVerdict::Continued {
                tracing::debug!(request_id = %self.ctx.request_id, verdict = v.metric_label(), "continuation started over");
            }
        }
    }
}

/// Did the last event end the answer (an honest error)?
fn ended(out: &[StreamEvent]) -> bool {
    matches!(out.last(), Some(StreamEvent::Error(_)))
}
