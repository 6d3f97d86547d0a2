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
//! An answer that showed thinking is never continued: the continuation could not carry the
//! signed thinking block on (Anthropic refuses a prefill while thinking is on), and its own
//! reasoning would not be the answer's. It restarts, which a dialect that cannot reset can
//! only end honestly: a new answer's reasoning cannot pass for the one already shown.
//!
//! How new text is joined to old (and how a continuation that starts over is caught) is the
//! seam's business: see `seam`. A route refusing the prefill (a 400 to the continuation
//! request) is not the client's fault: the type's fallback (restart) runs, on that same route
//! if it is the healthy one.
//!
//! A continuation asks for what is left of the client's `max_tokens` after the tokens the
//! client already holds (counted by the tokenizer of the route that wrote them); with nothing
//! left the answer ends with `length` and no attempt. The usage the client is told counts the
//! whole answer: those tokens plus the continuation's own (`run::recovery`, `run::streaming`).

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
                && !transcript.thinking
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

#[cfg(test)]
mod tests {
    use super::*;

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
