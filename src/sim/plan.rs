//! Turns a scenario and one request into a wire-neutral script of steps (waits, tokens,
//! tool-call fragments, faults, the finish) that a wire encoder then writes out.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::Rng;

use super::answer::{self, REFUSAL_TEXT};
use super::beats::{cut_text_beats, json_tokens, text_beats, tool_beats};
use super::bounds::probability;
use super::continuation::{PrefillOutcome, Reading};
use super::faults::Faults;
use super::quality::{self, Verdict};
use super::reasoning::{self, Thought};
use super::record::SimEnd;
use super::request::Asks;
use super::scenario::{Scenario, ToolCallSpec};
use super::schema;
use super::timing::{self, Moment};

/// Which wire format a request arrived in.
pub(crate) use crate::types::Wire;

/// What kind of answer opens the stream (it decides the role chunk / first block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AnswerKind {
    Text,
    Tools,
    Refusal,
}

/// Why the answer stopped, before translation to a wire's finish / stop reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    EndTurn,
    ToolCalls,
    Length,
    Refusal,
}

/// One step of a simulated response.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    Wait(Duration),
    Bom,
    /// Role chunk / `message_start` (and the text block's start and a ping).
    Open(AnswerKind),
    Text(String),
    /// OpenAI refusal text.
    Refusal(String),
    ToolOpen {
        index: u32,
        id: String,
        name: String,
    },
    ToolArgs {
        index: u32,
        fragment: String,
    },
    ToolClose {
        index: u32,
    },
    /// One delta of shown reasoning: an Anthropic `thinking_delta`, an OpenAI-compatible
    /// server's `reasoning_content` (or `reasoning`) delta.
    Thinking(String),
    /// The thinking block ends: Anthropic's one `signature_delta` and `content_block_stop`
    /// (nothing on the OpenAI wire).
    ThinkingEnd {
        signature: String,
    },
    /// Anthropic: a whole `redacted_thinking` block (nothing on the OpenAI wire).
    Redacted(String),
    Finish(Stop),
    /// OpenAI usage chunk (when asked for); nothing on Anthropic.
    Usage,
    /// `[DONE]` / `message_stop`.
    Terminal,
    InBandError,
    Malformed,
    InvalidUtf8,
    HugeLine(u64),
    Drop,
}

impl Step {
    /// Counts toward `tokens_sent`, the usage and the `*_after_tokens` faults: a reasoning
    /// delta is a token like a text token.
    pub fn is_token(&self) -> bool {
        matches!(
            self,
            Step::Text(_) | Step::Refusal(_) | Step::ToolArgs { .. } | Step::Thinking(_)
        )
    }

    /// Marks the first content token (a tool call's start counts, per the commit rule);
    /// reasoning is not the answer's content.
    pub fn is_content(&self) -> bool {
        matches!(
            self,
            Step::Text(_) | Step::Refusal(_) | Step::ToolArgs { .. } | Step::ToolOpen { .. }
        )
    }
}

/// A status error to answer with instead of a stream.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StatusError {
    pub status: u16,
    pub message: Option<String>,
    pub retry_after_s: Option<u64>,
    pub retry_after_ms: Option<u64>,
    /// OpenAI's `error.param` and `error.code` (the status's defaults when `None`); the
    /// Anthropic envelope has neither.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl StatusError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        StatusError {
            status,
            message: Some(message.into()),
            retry_after_s: None,
            retry_after_ms: None,
            param: None,
            code: None,
        }
    }

    /// A 400 `invalid_request_error` with this message.
    pub fn invalid(message: impl Into<String>) -> Self {
        StatusError::new(400, message)
    }

    /// Names the request field at fault and OpenAI's code for the fault.
    pub fn at(mut self, param: impl Into<String>, code: &'static str) -> Self {
        self.param = Some(param.into());
        self.code = Some(code);
        self
    }
}

/// The script for one streamed (or aggregated) answer.
#[derive(Debug, Clone)]
pub(crate) struct Script {
    pub kind: AnswerKind,
    pub steps: Vec<Step>,
    /// How the body ends when the client reads it to the end.
    pub end: SimEnd,
    pub ttft: Duration,
    /// What was done with the request's prefill (`None` without one).
    pub continuation: Option<PrefillOutcome>,
    /// The answer opens with shown reasoning (Anthropic: a thinking block at index 0).
    pub thinks: bool,
    pub reasoning: ReasoningUsage,
}

/// Reasoning tokens of one answer, for its usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ReasoningUsage {
    /// Spent in all, streamed or not.
    pub tokens: u32,
    /// Never streamed, so not among the steps' tokens.
    pub hidden: u32,
}

pub(crate) enum Plan {
    Status(StatusError),
    Stream(Script),
}

/// Everything that varies per request besides the scenario.
pub(crate) struct Context<'a> {
    pub wire: Wire,
    pub moment: Moment,
    /// The upstream's reading of the request's prefill (`continuation::judge`).
    pub reading: Reading<'a>,
    /// What the request asks the answer to be (tools, JSON, max_tokens).
    pub asks: &'a Asks,
}

/// Plans one request. Uses `rng` for every behavioural choice, so a seed reproduces it, and
/// `ids` for tool-call ids (which must differ between requests, seeds or not).
pub(crate) fn plan(scenario: &Scenario, cx: &Context<'_>, rng: &mut SmallRng, ids: &mut SmallRng) -> Plan {
    let f = &scenario.failure;
    if let Some(status) = f.status {
        let fails = match f.fail_first_n {
            Some(n) => cx.moment.request_number < n,
            None => rng.random_bool(probability(f.status_rate)),
        };
        if fails {
            return Plan::Status(StatusError {
                status,
                message: f.message.clone(),
                retry_after_s: f.retry_after_s,
                retry_after_ms: f.retry_after_ms,
                param: None,
                code: None,
            });
        }
    }
    let ttft = timing::ttft(scenario, cx.moment, rng);
    let limit = cx.asks.max_tokens.filter(|_| !scenario.ignores_request);
    let mode = reasoning::mode(cx.wire, cx.asks.reasoning, scenario.thinking.openai);
    let mut thought = reasoning::think(mode, &cx.asks.prompt, &scenario.thinking, limit);
    // max_tokens counts the reasoning: the answer gets what is left, and none when the
    // reasoning used it all.
    let left = limit.map(|m| m.saturating_sub(thought.tokens));
    let Answer {
        kind,
        mut beats,
        stop,
        continuation,
    } = match left {
        Some(0) if thought.tokens > 0 => Answer {
            kind: AnswerKind::Text,
            beats: Vec::new(),
            stop: Stop::Length,
            continuation: cx.reading.outcome_without_text(),
        },
        _ => answer_beats(scenario, cx, left, rng, ids),
    };
    if kind == AnswerKind::Refusal {
        thought = Thought::default();
    }
    let mut faults = Faults::draw(f, rng);
    if let (Some(bytes), true, AnswerKind::Text) = (f.drop_after_bytes, faults.drops, kind) {
        if let Some((cut, before)) = cut_text_beats(&beats, bytes) {
            beats = cut;
            faults.drop_at(before.saturating_add(thought.tokens - thought.hidden));
        }
    }
    let thinks = !thought.beats.is_empty();
    let usage = ReasoningUsage {
        tokens: thought.tokens,
        hidden: thought.hidden,
    };
    let beats: Vec<Beat> = thought.beats.into_iter().chain(beats).collect();

    let mut steps = Vec::with_capacity(beats.len() * 2 + 8);
    if f.bom {
        steps.push(Step::Bom);
    }
    steps.push(Step::Open(kind));
    let script = |steps, end| Script {
        kind,
        steps,
        end,
        ttft,
        continuation,
        thinks,
        reasoning: usage,
    };
    if let Some(bytes) = f.huge_line_bytes {
        steps.push(Step::HugeLine(bytes));
        return Plan::Stream(script(steps, SimEnd::Truncated));
    }
    let mut sent = 0u32;
    if beats.is_empty() {
        steps.push(Step::Wait(ttft));
        if let Some(end) = faults.after(sent, &mut steps) {
            return Plan::Stream(script(steps, end));
        }
    }
    for (i, beat) in beats.into_iter().enumerate() {
        steps.push(Step::Wait(if i == 0 {
            ttft
        } else {
            timing::inter_token(scenario, rng)
        }));
        if i == 0 {
            if let Some(end) = faults.after(sent, &mut steps) {
                return Plan::Stream(script(steps, end));
            }
        }
        let token = beat.iter().any(Step::is_token);
        steps.extend(beat);
        if token {
            sent += 1;
            if let Some(end) = faults.after(sent, &mut steps) {
                return Plan::Stream(script(steps, end));
            }
        }
    }
    if f.eof_before_finish {
        return Plan::Stream(script(steps, SimEnd::Truncated));
    }
    steps.push(Step::Finish(stop));
    steps.push(Step::Usage);
    if f.missing_done {
        return Plan::Stream(script(steps, SimEnd::Truncated));
    }
    steps.push(Step::Terminal);
    Plan::Stream(script(steps, SimEnd::Completed))
}

/// One wait-separated group of steps (a token, or a tool call's opening).
pub(super) type Beat = Vec<Step>;

/// What an answer is before faults and timing are laid over it.
struct Answer {
    kind: AnswerKind,
    beats: Vec<Beat>,
    stop: Stop,
    continuation: Option<PrefillOutcome>,
}

/// The answer's beats; `limit` is what max_tokens leaves after the reasoning.
fn answer_beats(
    scenario: &Scenario,
    cx: &Context<'_>,
    limit: Option<u32>,
    rng: &mut SmallRng,
    ids: &mut SmallRng,
) -> Answer {
    let truncate = scenario.failure.length_in_tool_call;
    let continuation = cx.reading.outcome_without_text();
    // An explicit answer (tool calls or text) wins over what the request asks for.
    let honours = !scenario.ignores_request && scenario.text.is_none() && scenario.tool_calls.is_empty();
    let verdict = scenario
        .quality
        .as_ref()
        .filter(|_| honours)
        .map(|q| q.judge(&cx.asks.prompt, cx.asks.digest, scenario.seed));
    if scenario.failure.refusal || verdict.as_ref().is_some_and(|v| v.refuse) {
        // Anthropic refuses with an empty text block and `stop_reason: "refusal"` (§3.7).
        let beats = match cx.wire {
            Wire::OpenAi => answer::split_words(REFUSAL_TEXT)
                .into_iter()
                .map(|t| vec![Step::Refusal(t)])
                .collect(),
            Wire::Anthropic => Vec::new(),
        };
        return Answer {
            kind: AnswerKind::Refusal,
            beats,
            stop: Stop::Refusal,
            continuation,
        };
    }
    let honours = !scenario.ignores_request && scenario.text.is_none();
    let asked_call = cx.asks.tool().filter(|_| honours).map(|(name, params)| {
        let arguments = schema::instance(params, rng).to_string();
        vec![ToolCallSpec {
            name: name.clone(),
            arguments: match &verdict {
                Some(v) if v.bad_args => quality::spoil_json(&arguments),
                _ => arguments,
            },
        }]
    });
    let calls = match &asked_call {
        _ if !scenario.tool_calls.is_empty() => Some(&scenario.tool_calls[..]),
        Some(asked) => Some(&asked[..]),
        None => None,
    };
    if let Some(calls) = calls {
        let (beats, stop) = tool_beats(calls, scenario.tool_fragments, cx.wire, truncate, limit, rng, ids);
        return Answer {
            kind: AnswerKind::Tools,
            beats,
            stop,
            continuation,
        };
    }
    let full = match (cx.asks.format.as_ref().filter(|_| honours), &verdict) {
        (Some(format), v) => json_tokens(format, scenario, v.as_ref().is_some_and(|v| v.bad_json), rng),
        (None, Some(Verdict { answer: Some(text), .. })) => answer::split_words(text),
        (None, _) => answer::text_tokens(scenario),
    };
    let (mut tokens, continuation) = cx.reading.text(full, scenario.seed);
    let mut stop = Stop::EndTurn;
    if truncate {
        tokens.truncate(tokens.len() / 2);
        stop = Stop::Length;
    }
    if let Some(max) = limit.map(|m| m as usize).filter(|m| tokens.len() > *m) {
        tokens.truncate(max);
        stop = Stop::Length;
    }
    Answer {
        kind: AnswerKind::Text,
        beats: text_beats(tokens),
        stop,
        continuation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::scenario::Failure;
    use rand::SeedableRng;

    fn scenario(failure: Failure) -> Scenario {
        Scenario {
            text: Some("a b c d".to_owned()),
            failure,
            ..Scenario::default()
        }
    }

    fn run(scenario: &Scenario, wire: Wire, request_number: u64) -> Plan {
        let cx = Context {
            wire,
            moment: Moment {
                request_number,
                clock_ms: 0,
            },
            reading: Reading::Fresh,
            asks: &Asks::default(),
        };
        let mut rng = SmallRng::seed_from_u64(scenario.seed ^ request_number);
        let mut ids = SmallRng::seed_from_u64(request_number);
        plan(scenario, &cx, &mut rng, &mut ids)
    }

    fn script(plan: Plan) -> Script {
        match plan {
            Plan::Stream(script) => script,
            Plan::Status(e) => panic!("expected a stream, got status {e:?}"),
        }
    }

    fn texts(steps: &[Step]) -> usize {
        steps.iter().filter(|s| matches!(s, Step::Text(_))).count()
    }

    #[test]
    fn a_healthy_text_answer_opens_waits_streams_and_finishes() {
        let s = script(run(&scenario(Failure::default()), Wire::OpenAi, 0));
        assert_eq!(s.end, SimEnd::Completed, "end");
        assert_eq!(s.steps[0], Step::Open(AnswerKind::Text), "opens first");
        assert_eq!(s.steps[1], Step::Wait(s.ttft), "then waits the TTFT");
        let tail = &s.steps[s.steps.len() - 3..];
        assert_eq!(tail, [Step::Finish(Stop::EndTurn), Step::Usage, Step::Terminal], "tail");
        assert_eq!(texts(&s.steps), 4, "one step per token");
    }

    #[test]
    fn drop_after_two_tokens_ends_right_after_the_second() {
        let failure = Failure {
            drop_after_tokens: Some(2),
            ..Failure::default()
        };
        let s = script(run(&scenario(failure), Wire::Anthropic, 0));
        assert_eq!(s.end, SimEnd::Dropped, "end");
        assert_eq!(s.steps.last(), Some(&Step::Drop), "drop is last");
        assert_eq!(texts(&s.steps), 2, "two tokens before it");
    }

    #[test]
    fn drop_after_bytes_splits_the_token_at_the_cut_and_drops_right_after() {
        let s = Scenario {
            text: Some("Naïve café".to_owned()),
            failure: Failure {
                drop_after_bytes: Some(11),
                ..Failure::default()
            },
            ..Scenario::default()
        };
        let plan = script(run(&s, Wire::OpenAi, 0));
        let sent: Vec<&str> = plan
            .steps
            .iter()
            .filter_map(|x| match x {
                Step::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        // Byte 11 is inside 'é' (bytes 10-11): the cut rounds down to " caf".
        assert_eq!(
            sent,
            ["Naïve", " caf"],
            "text up to the cut, the cut token's head alone"
        );
        assert_eq!(
            (plan.steps.last(), plan.end),
            (Some(&Step::Drop), SimEnd::Dropped),
            "then drop"
        );
        let never = Scenario {
            failure: Failure {
                drop_after_bytes: Some(99),
                ..s.failure.clone()
            },
            ..s.clone()
        };
        assert_eq!(
            script(run(&never, Wire::OpenAi, 0)).end,
            SimEnd::Completed,
            "beyond the text"
        );
        let earlier = Scenario {
            failure: Failure {
                drop_after_tokens: Some(1),
                ..s.failure.clone()
            },
            ..s
        };
        assert_eq!(
            texts(&script(run(&earlier, Wire::Anthropic, 0)).steps),
            1,
            "earliest drop wins"
        );
    }

    #[test]
    fn a_stall_pauses_and_then_the_answer_carries_on() {
        let failure = Failure {
            stall_after_tokens: Some(1),
            stall_ms: Some(7000),
            ..Failure::default()
        };
        let s = script(run(&scenario(failure), Wire::OpenAi, 0));
        let at = s.steps.iter().position(|x| *x == Step::Wait(Duration::from_secs(7)));
        let first_text = s.steps.iter().position(|x| matches!(x, Step::Text(_)));
        assert!(
            at.is_some() && at > first_text,
            "stall after the first token: {:?}",
            s.steps
        );
        assert_eq!(s.end, SimEnd::Completed, "then completes");
    }

    #[test]
    fn fail_first_n_fails_only_the_first_requests() {
        let failure = Failure {
            status: Some(503),
            fail_first_n: Some(2),
            ..Failure::default()
        };
        let s = scenario(failure);
        assert!(
            matches!(run(&s, Wire::OpenAi, 1), Plan::Status(e) if e.status == 503),
            "second fails"
        );
        assert!(matches!(run(&s, Wire::OpenAi, 2), Plan::Stream(_)), "third is healthy");
    }

    #[test]
    fn an_anthropic_refusal_has_no_tokens_and_an_openai_one_has_refusal_text() {
        let failure = Failure {
            refusal: true,
            ..Failure::default()
        };
        let s = scenario(failure);
        let anthropic = script(run(&s, Wire::Anthropic, 0));
        assert!(
            !anthropic.steps.iter().any(Step::is_token),
            "no tokens: {:?}",
            anthropic.steps
        );
        assert!(anthropic.steps.contains(&Step::Finish(Stop::Refusal)), "refusal stop");
        let openai = script(run(&s, Wire::OpenAi, 0));
        assert!(
            openai.steps.iter().any(|x| matches!(x, Step::Refusal(_))),
            "refusal text"
        );
    }

    #[test]
    fn length_in_tool_call_stops_half_way_without_closing_the_call() {
        let s = Scenario {
            tool_calls: vec![crate::sim::ToolCallSpec {
                name: "f".to_owned(),
                arguments: r#"{"a": 1, "b": 2, "c": 3}"#.to_owned(),
            }],
            failure: Failure {
                length_in_tool_call: true,
                ..Failure::default()
            },
            ..Scenario::default()
        };
        let script = script(run(&s, Wire::OpenAi, 0));
        assert!(
            !script.steps.iter().any(|x| matches!(x, Step::ToolClose { .. })),
            "no close"
        );
        assert!(script.steps.contains(&Step::Finish(Stop::Length)), "length stop");
        let args = script
            .steps
            .iter()
            .filter(|x| matches!(x, Step::ToolArgs { .. }))
            .count();
        assert_eq!(args, 6, "half of 12 fragments");
    }
}
