//! The set of attempts running at once for one request, polled together: whichever yields
//! first is reported with its position, and losers are dropped (which closes their upstream).

use std::task::Poll;

use super::attempt::{Attempt, AttemptEvent};

#[derive(Default)]
pub struct Race {
    attempts: Vec<Attempt>,
}

impl Race {
    pub fn push(&mut self, attempt: Attempt) {
        self.attempts.push(attempt);
    }

    pub fn len(&self) -> usize {
        self.attempts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.attempts.is_empty()
    }

    pub fn routes(&self) -> impl Iterator<Item = &str> {
        self.attempts.iter().map(|a| &*a.route)
    }

    /// The next event from any attempt. Pending forever while the race is empty, so it can
    /// sit in a `select!` beside timers. An attempt whose stream ended is removed.
    pub async fn next(&mut self) -> (usize, AttemptEvent) {
        std::future::poll_fn(|cx| {
            let mut i = 0;
            while i < self.attempts.len() {
                match self.attempts[i].poll_event(cx) {
                    Poll::Ready(Some(ev)) => return Poll::Ready((i, ev)),
                    Poll::Ready(None) => {
                        self.attempts.remove(i);
                    }
                    Poll::Pending => i += 1,
                }
            }
            Poll::Pending
        })
        .await
    }

    /// The attempt that will first go too long without a first token (`timeout` per route):
    /// its position and when.
    pub fn first_token_due(
        &self,
        timeout: impl Fn(&str) -> std::time::Duration,
    ) -> Option<(usize, tokio::time::Instant)> {
        self.attempts
            .iter()
            .enumerate()
            .map(|(i, a)| (i, a.started + timeout(&a.route)))
            .min_by_key(|(_, at)| *at)
    }

    pub fn take(&mut self, i: usize) -> Attempt {
        self.attempts.remove(i)
    }

    /// Removes every attempt; dropping them cancels their upstream requests.
    pub fn drain(&mut self) -> Vec<Attempt> {
        std::mem::take(&mut self.attempts)
    }
}
