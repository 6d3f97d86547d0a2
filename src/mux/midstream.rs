//! Mid-stream failure policies: what happens when a committed stream fails after its first
//! token — `restart` (another route, client told to replace the text), `continue` (another
//! route carries on from the partial text), or `truncate` (keep the partial, end honestly).
//!
//! Trigger conditions: upstream connection drop, an in-band error event, EOF without the
//! terminal signal, invalid tool-call output, and a stall (no token for the route's
//! inter-token limit). The policy comes from the response type (tool, structured, prose,
//! voice) through `[policies]`; each type has a first choice and a fallback.
//!
//! What each dialect sees:
//! - nothing visible sent yet (e.g. the failure hit inside a buffered tool call): a seamless
//!   restart on the next route, whatever the policy, in every dialect;
//! - native (WS / native SSE): `reset` then the new answer, or `route_switch` then the
//!   continuation, or `done` with `finish_reason: "truncated"`;
//! - OpenAI / Anthropic dialects cannot express a reset: a restart swallows the new stream's
//!   text while it matches what the client already has (`Seam::Swallow`); if the new answer
//!   diverges, the stream ends with an honest in-band error — never a doubled answer, never a
//!   silent truncation. A continuation is invisible; a truncation is an in-band error.
//!
//! Known limits: the overlap trim at a continuation seam is textual (longest suffix of the
//! sent text that the continuation repeats, at least 3 characters); a model that rephrases
//! the last words is not detected.

use crate::config::MidStreamPolicy;
use crate::types::ResponseType;

use super::transcript::Transcript;

/// Is `policy` possible for this answer right now?
pub fn applicable(policy: MidStreamPolicy, rtype: ResponseType, transcript: &Transcript, prefill_route: bool) -> bool {
    if transcript.overflowed && policy != MidStreamPolicy::Truncate {
        // Too long to compare or continue from: only an honest end is left.
        return false;
    }
    match policy {
        MidStreamPolicy::Restart | MidStreamPolicy::Truncate => true,
        MidStreamPolicy::Continue => {
            matches!(rtype, ResponseType::Prose | ResponseType::Voice)
                && !transcript.tool_open
                && transcript.tool_calls == 0
                && prefill_route
        }
    }
}

/// Picks the policy: the type's first choice if applicable, else its fallback, else truncate.
pub fn choose(
    (first, fallback): (MidStreamPolicy, MidStreamPolicy),
    rtype: ResponseType,
    transcript: &Transcript,
    prefill_route: bool,
) -> MidStreamPolicy {
    [first, fallback]
        .into_iter()
        .find(|p| applicable(*p, rtype, transcript, prefill_route))
        .unwrap_or(MidStreamPolicy::Truncate)
}

/// How new text is joined to what the client already has.
#[derive(Debug, Clone)]
pub enum Seam {
    /// Forward everything.
    Pass,
    /// A restart the client cannot be told about: drop new text while it repeats `expected`.
    Swallow { expected: String, matched: usize },
    /// A continuation: hold the first bytes to trim any repeat of the sent tail.
    Trim { tail: String, held: String },
}

/// What to do with one piece of new text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeamOut {
    Emit(String),
    Hold,
    Diverged,
}

/// Continuation text held before deciding the overlap.
const TRIM_HOLD: usize = 48;
/// The shortest repeat treated as overlap rather than coincidence.
const MIN_OVERLAP: usize = 3;

impl Seam {
    pub fn swallow(expected: &str) -> Seam {
        Seam::Swallow {
            expected: expected.to_string(),
            matched: 0,
        }
    }

    pub fn trim(sent: &str) -> Seam {
        let start = sent.len().saturating_sub(TRIM_HOLD * 2);
        let start = (start..=sent.len())
            .find(|i| sent.is_char_boundary(*i))
            .unwrap_or(sent.len());
        Seam::Trim {
            tail: sent[start..].to_string(),
            held: String::new(),
        }
    }

    pub fn is_pass(&self) -> bool {
        matches!(self, Seam::Pass)
    }

    pub fn feed(&mut self, text: &str) -> SeamOut {
        match self {
            Seam::Pass => SeamOut::Emit(text.to_string()),
            Seam::Swallow { expected, matched } => {
                let rest = &expected[*matched..];
                if rest.len() >= text.len() {
                    if rest.starts_with(text) {
                        *matched += text.len();
                        if *matched == expected.len() {
                            *self = Seam::Pass;
                        }
                        SeamOut::Hold
                    } else {
                        SeamOut::Diverged
                    }
                } else if text.starts_with(rest) && text.is_char_boundary(rest.len()) {
                    let extra = text[rest.len()..].to_string();
                    *self = Seam::Pass;
                    SeamOut::Emit(extra)
                } else {
                    SeamOut::Diverged
                }
            }
            Seam::Trim { held, .. } => {
                held.push_str(text);
                if held.len() < TRIM_HOLD {
                    return SeamOut::Hold;
                }
                self.flush()
            }
        }
    }

    /// The answer ended: release held text, or report that a swallowed restart fell short.
    pub fn finish(&mut self) -> SeamOut {
        match self {
            Seam::Pass => SeamOut::Hold,
            Seam::Swallow { .. } => SeamOut::Diverged,
            Seam::Trim { .. } => self.flush(),
        }
    }

    fn flush(&mut self) -> SeamOut {
        let Seam::Trim { tail, held } = std::mem::replace(self, Seam::Pass) else {
            return SeamOut::Hold;
        };
        let k = overlap(&tail, &held);
        SeamOut::Emit(held[k..].to_string())
    }
}

/// Length of the longest prefix of `next` that `sent` ends with (at least `MIN_OVERLAP`).
fn overlap(sent: &str, next: &str) -> usize {
    let max = sent.len().min(next.len());
    (MIN_OVERLAP..=max)
        .rev()
        .find(|&k| next.is_char_boundary(k) && sent.ends_with(&next[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swallow_hides_a_matching_restart_and_emits_what_follows() {
        let mut seam = Seam::swallow("Hello wor");
        assert_eq!(seam.feed("Hello"), SeamOut::Hold);
        assert_eq!(seam.feed(" wor"), SeamOut::Hold);
        assert!(seam.is_pass(), "all of the sent text was matched");
        assert_eq!(seam.feed("ld"), SeamOut::Emit("ld".into()));
    }

    #[test]
    fn swallow_emits_the_extension_of_a_token_that_crosses_the_seam() {
        let mut seam = Seam::swallow("Hello wo");
        assert_eq!(seam.feed("Hello"), SeamOut::Hold);
        assert_eq!(seam.feed(" world"), SeamOut::Emit("rld".into()));
    }

    #[test]
    fn swallow_reports_divergence() {
        let mut seam = Seam::swallow("Hello world");
        assert_eq!(seam.feed("Hello"), SeamOut::Hold);
        assert_eq!(
            seam.feed(" there"),
            SeamOut::Diverged,
            "a different answer must not be spliced"
        );
    }

    #[test]
    fn swallow_that_ends_short_is_divergence() {
        let mut seam = Seam::swallow("Hello world");
        assert_eq!(seam.feed("Hello"), SeamOut::Hold);
        assert_eq!(
            seam.finish(),
            SeamOut::Diverged,
            "a shorter answer than what was sent is not the same answer"
        );
    }

    #[test]
    fn trim_removes_a_repeated_tail() {
        let mut seam = Seam::trim("The quick brown fox jumps");
        assert_eq!(seam.feed(" fox jumps over"), SeamOut::Hold);
        assert_eq!(
            seam.finish(),
            SeamOut::Emit(" over".into()),
            "the repeated words are dropped"
        );
    }

    #[test]
    fn trim_keeps_a_continuation_without_overlap() {
        let mut seam = Seam::trim("The quick brown");
        let long = " fox jumps over the lazy dog and keeps running far away";
        assert_eq!(seam.feed(long), SeamOut::Emit(long.into()));
    }

    #[test]
    fn continue_is_never_chosen_for_tools_or_structured_output() {
        let t = Transcript::default();
        let pair = (MidStreamPolicy::Continue, MidStreamPolicy::Restart);
        assert_eq!(choose(pair, ResponseType::Tool, &t, true), MidStreamPolicy::Restart);
        assert_eq!(
            choose(pair, ResponseType::Structured, &t, true),
            MidStreamPolicy::Restart
        );
        assert_eq!(choose(pair, ResponseType::Prose, &t, true), MidStreamPolicy::Continue);
        assert_eq!(
            choose(pair, ResponseType::Prose, &t, false),
            MidStreamPolicy::Restart,
            "no prefill route"
        );
        let open = Transcript {
            tool_open: true,
            ..Transcript::default()
        };
        assert_eq!(choose(pair, ResponseType::Prose, &open, true), MidStreamPolicy::Restart);
    }
}
