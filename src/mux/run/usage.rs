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
    /// the attempt that ended it reported none (nothing is invented for it; the cut attempts
    /// before it are estimated, as they could not report).
    pub(super) fn answer_usage(&self) -> Option<Usage> {
        if self.billed.last()?.estimated {
            return None;
        }
        self.billed
            .iter()
            .filter(|b| b.in_answer)
            .map(|b| b.usage)
            .reduce(Usage::plus)
    }

    /// What the attempts that streamed cost, each at its own route's price, in millionths.
    pub(super) fn billed_micros(&self) -> u64 {
        let answer_only = self.billed.len() == 1 && self.answer_usage().is_none();
        if answer_only {
            return 0; // one attempt, no usage reported: nothing to price
        }
        self.billed
            .iter()
            .map(|b| {
                let per_1k = self.route_config(&b.route).map_or(0.0, |r| r.cost_per_1k);
                let tokens = f64::from(b.usage.input_tokens) + f64::from(b.usage.output_tokens);
                (per_1k * tokens / 1000.0 * 1e6).round() as u64
            })
            .sum()
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
