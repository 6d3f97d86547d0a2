//! What the answer was billed: every attempt that streamed is listed with its tokens (as its
//! route reported them, or estimated when it was cut first), and the client's `usage` is the
//! sum over the attempts whose output its answer holds. Unbroken, that is the one attempt's
//! own usage; continued, the cut attempt's and the continuation's together (the continuation
//! was sent the cut text as its prompt's end, and both were billed); restarted, the new
//! attempt's alone (the replaced one is still listed, as billed).

use super::Run;
use crate::mux::attempt::Attempt;
use crate::router::{Counter, PromptSize};
use crate::types::{AttemptUsage, Usage};

impl Run {
    /// `cur` streamed and is over (finished, or cut): list what it was billed. A route cut
    /// before it reported its usage is estimated: the prompt it was sent (with the prefill a
    /// continuation carried) and the text of it the client received.
    pub(super) fn bill(&mut self, cur: &Attempt, delivered: &str, in_answer: bool) {
        let usage = match self.usage.take() {
            Some(u) => AttemptUsage {
                route: cur.route.to_string(),
                usage: u,
                estimated: false,
                in_answer,
            },
            None => {
                let counter = self
                    .route_config(&cur.route)
                    .map_or(Counter::Estimate, Counter::for_route);
                let prompt = PromptSize::new(&self.req).tokens(counter);
                let output = u32::try_from(counter.text_tokens(delivered)).unwrap_or(u32::MAX);
                let input = u32::try_from(prompt).unwrap_or(u32::MAX).saturating_add(self.carried);
                AttemptUsage {
                    route: cur.route.to_string(),
                    usage: Usage::new(input, output),
                    estimated: true,
                    in_answer,
                }
            }
        };
        self.billed.push(usage);
    }

    /// A restart replaced what the attempts so far wrote: none of it is in the answer.
    pub(super) fn replaced(&mut self) {
        for b in &mut self.billed {
            b.in_answer = false;
        }
    }

    /// The usage the client is told: the sum over the attempts its answer holds; `None` when
    /// one attempt wrote it and its route reported none (nothing is invented for it).
    pub(super) fn answer_usage(&self) -> Option<Usage> {
        match self.billed.as_slice() {
            [] => None,
            [only] if only.estimated => None,
            [only] => Some(only.usage),
            all => all.iter().filter(|b| b.in_answer).map(|b| b.usage).reduce(Usage::plus),
        }
    }

    /// What all the attempts that streamed were billed together (the answer's cost).
    pub(super) fn billed_total(&self) -> Option<Usage> {
        match self.billed.as_slice() {
            [_] => self.answer_usage(),
            all => all.iter().map(|b| b.usage).reduce(Usage::plus),
        }
    }

    /// Every attempt's tokens for the envelope, once more than one streamed.
    pub(super) fn attempt_usage(&self) -> Vec<AttemptUsage> {
        if self.billed.len() > 1 {
            self.billed.clone()
        } else {
            Vec::new()
        }
    }
}
