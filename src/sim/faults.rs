//! The `*_after_tokens` faults of one request, drawn once, and what each does once so many
//! tokens are out (a stall, a drop, an in-band error, a malformed or invalid-UTF-8 chunk).

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::Rng;

use super::bounds::{ms, probability};
use super::plan::Step;
use super::record::SimEnd;
use super::scenario::Failure;

/// The `*_after_tokens` faults of one request, with the random ones already decided.
pub(super) struct Faults {
    /// This request drops (`drop_after_tokens` / `drop_after_bytes`, drawn by `drop_rate`).
    pub drops: bool,
    pub drop: Option<u32>,
    pub stall: Option<(u32, Duration)>,
    pub malformed: Option<u32>,
    pub in_band: Option<u32>,
    pub invalid_utf8: Option<u32>,
}

impl Faults {
    pub fn draw(f: &Failure, rng: &mut SmallRng) -> Self {
        // Drawn only when a drop is configured, so other scenarios keep their random sequence.
        let configured = f.drop_after_tokens.is_some() || f.drop_after_bytes.is_some();
        let drops = configured && rng.random_bool(probability(f.drop_rate));
        Faults {
            drops,
            drop: f.drop_after_tokens.filter(|_| drops),
            stall: f
                .stall_after_tokens
                .map(|n| (n, ms(f.stall_ms.unwrap_or(60_000) as f64))),
            malformed: f.malformed_after_tokens,
            in_band: f.in_band_error_after_tokens,
            invalid_utf8: f.invalid_utf8_after_tokens,
        }
    }

    /// Also drops once `sent` tokens are out (the earliest drop wins).
    pub fn drop_at(&mut self, sent: u32) {
        self.drop = Some(self.drop.map_or(sent, |n| n.min(sent)));
    }

    /// Appends what happens once `sent` tokens are out; `Some(end)` when the body ends.
    pub fn after(&self, sent: u32, steps: &mut Vec<Step>) -> Option<SimEnd> {
        if self.stall.is_some_and(|(n, _)| n == sent) {
            if let Some((_, pause)) = self.stall {
                steps.push(Step::Wait(pause));
            }
        }
        let ending = [
            (self.drop, Step::Drop, SimEnd::Dropped),
            (self.in_band, Step::InBandError, SimEnd::InBandError),
            (self.malformed, Step::Malformed, SimEnd::Truncated),
            (self.invalid_utf8, Step::InvalidUtf8, SimEnd::Truncated),
        ];
        let (_, step, end) = ending.into_iter().find(|(n, _, _)| *n == Some(sent))?;
        steps.push(step);
        Some(end)
    }
}
