//! The set of attempts running at once for one request, polled together: whichever yields
//! first is reported with its position, and losers are dropped (which closes their upstream).
//!
//! Positions stay valid until the caller changes the race: only `push`, `take` and `drain`
//! add or remove attempts, never `next`. (`next` removing an attempt whose stream ended
//! shifted every later position while a `select!` beside it held one from
//! `first_token_due`: a timer firing in the same turn then took the wrong attempt, or one
//! past the end.)

use std::task::Poll;

use super::attempt::{Attempt, AttemptEvent};
use crate::provider::ProviderError;
use crate::types::ErrorClass;

#[derive(Default)]
pub struct Race {
    attempts: Vec<Attempt>,
}

impl Race {
    pub fn push(&mut self, attempt: Attempt) {
        // Most requests never hedge: room for one attempt first, not `Vec`'s default four
        // (576 bytes for four attempts of 144, held for as long as the stream is).
        if self.attempts.capacity() == 0 {
            self.attempts.reserve_exact(1);
        }
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

    /// The next event from any attempt, with a position that is valid for `take`. Pending
    /// forever while the race is empty, so it can sit in a `select!` beside timers. An
    /// attempt whose stream ended without a terminal event is reported as failed (a protocol
    /// fault) and left in place for the caller to `take`, like any other failure.
    pub async fn next(&mut self) -> (usize, AttemptEvent) {
        std::future::poll_fn(|cx| {
            for (i, attempt) in self.attempts.iter_mut().enumerate() {
                match attempt.poll_event(cx) {
                    Poll::Ready(Some(ev)) => return Poll::Ready((i, ev)),
                    Poll::Ready(None) => return Poll::Ready((i, ended_silently())),
                    Poll::Pending => {}
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

/// What an attempt that ended without `Finished` or `Failed` amounts to.
fn ended_silently() -> AttemptEvent {
    AttemptEvent::failed(ProviderError::new(
        ErrorClass::Protocol,
        "attempt ended without an outcome",
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::FutureExt;

    use super::*;
    use crate::mux::attempt::Role;

    fn pending(route: &str) -> Attempt {
        Attempt::from_events(route, Role::Primary, futures::stream::pending())
    }

    #[tokio::test(start_paused = true)]
    async fn a_position_from_first_token_due_is_still_valid_after_next() {
        let mut race = Race::default();
        // Pushed first but started later, so the one due first sits at position 1.
        tokio::time::advance(Duration::from_millis(5)).await;
        let ended = Attempt::from_events("ended", Role::Hedge, futures::stream::empty());
        let mut early = pending("early");
        early.started -= Duration::from_millis(5);
        race.push(ended);
        race.push(early);
        let due = race.first_token_due(|_| Duration::from_secs(1)).map(|(i, _)| i);
        assert_eq!(due, Some(1), "the earlier start is due first");
        // The mux's select! polls `next` first; the silence timer may fire in the same turn.
        let event = race.next().now_or_never();
        let taken = race.take(due.unwrap_or_default());
        assert_eq!(&*taken.route, "early", "the stale position names the same attempt");
        assert_eq!(race.len(), 1, "next removed nothing; take removed one");
        let (i, ev) = event.expect("the ended attempt is reported at once");
        assert!(
            matches!(&ev, AttemptEvent::Failed(e) if e.class == ErrorClass::Protocol),
            "an attempt that ends without an outcome is a protocol failure: {ev:?}"
        );
        assert_eq!(i, 0, "reported at its position");
        assert_eq!(&*race.take(i).route, "ended");
        assert!(race.is_empty());
    }

    #[tokio::test]
    async fn the_first_ready_event_wins_with_its_position() {
        let mut race = Race::default();
        race.push(pending("slow"));
        race.push(Attempt::from_events(
            "fast",
            Role::Hedge,
            futures::stream::iter([AttemptEvent::Text("hi".into())]),
        ));
        let (i, ev) = race.next().await;
        assert_eq!((i, ev), (1, AttemptEvent::Text("hi".into())), "position of the winner");
        assert_eq!(&*race.take(i).route, "fast");
        assert_eq!(race.routes().collect::<Vec<_>>(), ["slow"], "the loser is still there");
    }
}
