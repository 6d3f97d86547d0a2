//! Per-key request and token rates: a GCRA limiter (a token bucket kept as one timestamp)
//! that takes `now`, so it is a plain state machine tested without a runtime and, end to end,
//! on paused time.

use std::time::Duration;

use tokio::time::Instant;

use crate::types::ChatRequest;

/// The window a limit is expressed over, and the burst it allows: a whole minute's worth.
const WINDOW: Duration = Duration::from_secs(60);

/// Tokens counted for every message besides its text (role, separators).
const PER_MESSAGE_TOKENS: u64 = 4;

/// `limit` units per minute, GCRA-style: the theoretical arrival time (`tat`) moves forward
/// by `cost` emission intervals per admitted request; a request is admitted while that stays
/// within one window of now, which is a bucket of `limit` refilled at `limit` per minute.
#[derive(Debug, Clone)]
pub struct Rate {
    limit: u32,
    per_unit: Duration,
    tat: Option<Instant>,
}

impl Rate {
    pub fn per_minute(limit: u32) -> Self {
        let limit = limit.max(1);
        Rate {
            limit,
            per_unit: WINDOW / limit,
            tat: None,
        }
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Could `cost` be taken at `now`? `Ok` with the new arrival time, or how long to wait.
    /// A `cost` over the whole limit can never pass: the caller refuses it before asking.
    fn check(&self, now: Instant, cost: u64) -> Result<Instant, Duration> {
        let cost = u32::try_from(cost.min(u64::from(self.limit))).unwrap_or(self.limit);
        let start = self.tat.map_or(now, |t| t.max(now));
        let tat = start + self.per_unit * cost;
        let horizon = now + WINDOW;
        if tat <= horizon {
            Ok(tat)
        } else {
            Err(tat - horizon)
        }
    }
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Rpm,
    Tpm,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Rpm => "rpm",
            Limit::Tpm => "tpm",
        }
    }
}

/// Why the limits refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    /// Wait this long and retry.
    Wait {
        limit: Limit,
        per_minute: u32,
        wait: Duration,
    },
    /// The request alone costs more tokens than the key's tpm: it can never pass.
    TooLarge { cost: u64, tpm: u32 },
}

/// One key's rpm and tpm.
#[derive(Debug, Clone, Default)]
pub struct KeyLimits {
    rpm: Option<Rate>,
    tpm: Option<Rate>,
}

impl KeyLimits {
    pub fn new(rpm: Option<u32>, tpm: Option<u32>) -> Self {
        KeyLimits {
            rpm: rpm.map(Rate::per_minute),
            tpm: tpm.map(Rate::per_minute),
        }
    }

    /// The key's rpm, if it has one.
    pub fn rpm(&self) -> Option<u32> {
        self.rpm.as_ref().map(Rate::limit)
    }

    /// The key's tpm, if it has one.
    pub fn tpm(&self) -> Option<u32> {
        self.tpm.as_ref().map(Rate::limit)
    }

    /// Refuses a request that alone costs more than the whole tpm: no wait would let it pass.
    pub fn check_size(&self, tokens: u64) -> Result<(), Exceeded> {
        match &self.tpm {
            Some(tpm) if tokens > u64::from(tpm.limit()) => Err(Exceeded::TooLarge {
                cost: tokens,
                tpm: tpm.limit(),
            }),
            _ => Ok(()),
        }
    }

    /// Takes one request costing `tokens` at `now`, from both limits or from neither.
    pub fn take(&mut self, now: Instant, tokens: u64) -> Result<(), Exceeded> {
        self.check_size(tokens)?;
        let checked = |rate: &Option<Rate>, limit: Limit, cost: u64| match rate {
            None => Ok(None),
            Some(r) => r.check(now, cost).map(Some).map_err(|wait| Exceeded::Wait {
                limit,
                per_minute: r.limit(),
                wait,
            }),
        };
        let rpm = checked(&self.rpm, Limit::Rpm, 1)?;
        let tpm = checked(&self.tpm, Limit::Tpm, tokens)?;
        if let (Some(r), Some(tat)) = (&mut self.rpm, rpm) {
            r.tat = Some(tat);
        }
        if let (Some(r), Some(tat)) = (&mut self.tpm, tpm) {
            r.tat = Some(tat);
        }
        Ok(())
    }
}

/// What tpm counts for a request before it runs: its input estimated at four bytes of text a
/// token plus a few per message, and the output it may ask for (`max_tokens`, or the router's
/// default output reserve when it sets none).
pub fn token_cost(req: &ChatRequest) -> u64 {
    let text = u64::try_from(req.text_len()).unwrap_or(u64::MAX);
    let messages = u64::try_from(req.messages.len()).unwrap_or(u64::MAX);
    let output = req.max_tokens.unwrap_or(crate::router::DEFAULT_OUTPUT_RESERVE);
    text.div_ceil(4)
        .saturating_add(messages.saturating_mul(PER_MESSAGE_TOKENS))
        .saturating_add(u64::from(output))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Message, Role};

    #[test]
    fn rpm_allows_a_minute_of_burst_then_one_per_interval() {
        let t0 = Instant::now();
        let mut limits = KeyLimits::new(Some(2), None);
        assert_eq!(limits.take(t0, 1), Ok(()), "first");
        assert_eq!(limits.take(t0, 1), Ok(()), "second: the burst is a minute's worth");
        assert_eq!(
            limits.take(t0, 1),
            Err(Exceeded::Wait {
                limit: Limit::Rpm,
                per_minute: 2,
                wait: Duration::from_secs(30)
            }),
            "third waits one interval (60 s / 2)"
        );
        assert!(
            limits.take(t0 + Duration::from_secs(29), 1).is_err(),
            "still too early after 29 s"
        );
        assert_eq!(limits.take(t0 + Duration::from_secs(30), 1), Ok(()), "after 30 s");
    }

    #[test]
    fn an_idle_key_refills_to_its_burst_and_no_more() {
        let t0 = Instant::now();
        let mut limits = KeyLimits::new(Some(3), None);
        for _ in 0..3 {
            assert_eq!(limits.take(t0, 1), Ok(()), "burst");
        }
        let later = t0 + Duration::from_secs(3600);
        for i in 0..3 {
            assert_eq!(limits.take(later, 1), Ok(()), "refilled burst {i}");
        }
        assert!(limits.take(later, 1).is_err(), "an hour idle still bursts only 3");
    }

    #[test]
    fn tpm_counts_cost_and_refuses_what_can_never_fit() {
        let t0 = Instant::now();
        let mut limits = KeyLimits::new(None, Some(1000));
        assert_eq!(limits.take(t0, 600), Ok(()), "600 of 1000");
        match limits.take(t0, 600) {
            Err(Exceeded::Wait {
                limit: Limit::Tpm,
                wait,
                ..
            }) => {
                assert_eq!(wait, Duration::from_secs(12), "200 tokens short at 1000/min is 12 s")
            }
            other => panic!("a tpm wait, not {other:?}"),
        }
        assert_eq!(
            limits.take(t0, 1001),
            Err(Exceeded::TooLarge { cost: 1001, tpm: 1000 }),
            "more than the whole tpm"
        );
    }

    #[test]
    fn a_refusal_by_one_limit_takes_nothing_from_the_other() {
        let t0 = Instant::now();
        let mut limits = KeyLimits::new(Some(100), Some(100));
        assert_eq!(limits.take(t0, 100), Ok(()), "the whole tpm");
        assert!(limits.take(t0, 50).is_err(), "tpm refuses");
        let mut fresh = KeyLimits::new(Some(100), Some(100));
        fresh.rpm = limits.rpm.clone();
        // 99 requests left on rpm: the refused one was not counted.
        for i in 0..99 {
            assert!(fresh.take(t0, 0).is_ok(), "rpm request {i} still fits");
        }
        assert!(fresh.take(t0, 0).is_err(), "the 100th of the minute is the limit");
    }

    #[test]
    fn token_cost_is_input_estimate_plus_max_tokens() {
        let req = ChatRequest {
            messages: vec![Message::text(Role::User, "x".repeat(40))],
            max_tokens: Some(100),
            ..ChatRequest::default()
        };
        assert_eq!(
            token_cost(&req),
            10 + 4 + 100,
            "40 bytes / 4 + one message + max_tokens"
        );
        let open = ChatRequest {
            max_tokens: None,
            ..req
        };
        assert_eq!(
            token_cost(&open),
            14 + u64::from(crate::router::DEFAULT_OUTPUT_RESERVE),
            "no max_tokens: the default reserve"
        );
    }
}
