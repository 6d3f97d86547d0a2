//! The stream pump: the chat stream a response body reads, which releases what must be
//! released on time (the stream's slot, the upstream) whether or not the client reads.
//!
//! hyper polls a response body only when it can write to the socket, so a client that stops
//! reading (or reads a byte now and then) stops every timer inside the body, and with it
//! `max_stream_ms` and the drain's cut. So the body polls the gateway's events itself, with
//! nothing between them (an event goes from the upstream connection's task straight to the
//! client connection's, as through a bare proxy), and the server's one watchdog (`watch`)
//! ends a stream from outside, dropping its events (which closes every upstream connection)
//! and its slot, when:
//! - `max_stream` passed since the commit (`Start`): the reader then gets, should it read
//!   again, the same truncated `Finish` the mux sends at its own cap;
//! - the reader has not asked for the next event for `stall` (`client_write_timeout_ms`)
//!   since it was handed the last one. Time spent waiting for the upstream never counts.
//!   Over HTTP/1 the socket's write timeout finds such a client too, but an HTTP/2 client
//!   can keep its connection alive (reading other streams, answering pings) while never
//!   opening one stream's flow-control window: hyper then never polls that body, and only
//!   this limit releases the stream's slot and upstream. Nor would hyper ever drop that
//!   stream's body, so its connection is closed too (`server::ConnHandle`), as the write
//!   timeout closes an HTTP/1.1 one. The reader gets a `client_too_slow` error (class client:
//!   logged and counted as the client's, never as tailcut's own `internal`), should it ever
//!   read again;
//! - the drain cut it: the reader then gets a `draining` error.
//!
//! The stream ends by itself, releasing both at once, when its terminal event is handed out
//! or its reader goes away (the body is dropped). A limit is enforced at most `watch::TICK`
//! late. Memory per stream is what the gateway's stream holds: nothing is read ahead.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::time::Instant;

mod watch;

pub use self::watch::{Watch, TICK};
use self::watch::Watched;
use super::drain::cut_event;
use crate::server::ConnHandle;
use crate::types::{Envelope, ErrorClass, ErrorEvent, EventStream, FinishReason, StreamEvent};

/// Why the watchdog ended a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// `max_stream` after commit.
    Capped,
    /// The drain cut the stream.
    Cut,
    /// The reader took no event for `stall`.
    Stalled,
}

/// What the body and the watchdog share of one stream.
struct Core<S> {
    /// The gateway's events and the stream's slot, until the stream ends.
    live: Option<(EventStream, S)>,
    /// Set by the watchdog; handed to the reader as the stream's last event.
    stopped: Option<Stop>,
    /// The answer's envelope, from its `Start`: boxed, like the event's, and made only then
    /// (a stream waiting for its first token holds none).
    envelope: Option<Box<Envelope>>,
    /// When the reader was handed an event, while it has not asked for the next one.
    handed_at: Option<Instant>,
    /// `max_stream` after the commit.
    cap_at: Option<Instant>,
    /// The reader's waker while it waits for the upstream, so a stop reaches it.
    waker: Option<Waker>,
    max_stream: Duration,
    stall: Duration,
    conn: Option<ConnHandle>,
}

fn lock<S>(core: &Mutex<Core<S>>) -> MutexGuard<'_, Core<S>> {
    // Nothing panics while holding this lock (the gateway's stream is polled under it, and
    // a panic there ends the connection's task, which drops the body), so a poisoned
    // lock's state is whole.
    core.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<S> Core<S> {
    /// Ends the stream with `stop`; what it held is returned, to be dropped without the lock.
    fn stop(&mut self, stop: Stop) -> Option<(EventStream, S)> {
        self.stopped = Some(stop);
        self.handed_at = None;
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
        self.live.take()
    }

    /// The event the reader gets for `stop`.
    fn last_event(&mut self, stop: Stop) -> StreamEvent {
        let envelope = self.envelope.take().unwrap_or_default();
        match stop {
            Stop::Cut => StreamEvent::Error(Box::new(cut_event(*envelope))),
            Stop::Capped => StreamEvent::Finish {
                reason: FinishReason::Truncated,
                envelope,
            },
            Stop::Stalled => StreamEvent::Error(Box::new(too_slow(*envelope, self.stall))),
        }
    }
}

impl<S: Send> Watched for Mutex<Core<S>> {
    fn watch(&self, now: Instant, cut: bool) -> bool {
        let mut core = match self.try_lock() {
            Ok(core) => core,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            // Being polled this moment: not stalled, and the next tick will do.
            Err(TryLockError::WouldBlock) => return true,
        };
        if core.live.is_none() {
            return false;
        }
        let stop = if cut {
            Stop::Cut
        } else if core.cap_at.is_some_and(|at| now >= at) {
            Stop::Capped
        } else if core.handed_at.is_some_and(|at| now >= at + core.stall) {
            Stop::Stalled
        } else {
            return true;
        };
        let held = core.stop(stop);
        let conn = if stop == Stop::Stalled { core.conn.take() } else { None };
        let stall = core.stall;
        drop(core);
        // The upstream closes before the slot is given back, and both before the
        // connection: by then nothing of this stream is held.
        drop(held);
        if stop == Stop::Stalled {
            tracing::info!(
                stall_ms = stall.as_millis() as u64,
                "the client took no event for client_write_timeout_ms; its stream was dropped and its connection closed"
            );
            if let Some(conn) = conn {
                conn.abandon();
            }
        }
        false
    }
}

/// The stream a response body reads.
struct Pumped<S> {
    core: Arc<Mutex<Core<S>>>,
}

impl<S: Send> Stream for Pumped<S> {
    type Item = StreamEvent;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<StreamEvent>> {
        let mut core = lock(&self.core);
        if let Some(stop) = core.stopped.take() {
            return Poll::Ready(Some(core.last_event(stop)));
        }
        let Some((events, _)) = core.live.as_mut() else {
            return Poll::Ready(None);
        };
        let event = match events.poll_next_unpin(cx) {
            Poll::Pending => {
                core.handed_at = None;
                if !core.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    core.waker = Some(cx.waker().clone());
                }
                return Poll::Pending;
            }
            Poll::Ready(event) => event,
        };
        let now = Instant::now();
        let ended = match &event {
            None | Some(StreamEvent::Finish { .. } | StreamEvent::Error(_)) => true,
            Some(StreamEvent::Start(env)) => {
                core.cap_at = Some(now + core.max_stream);
                match &mut core.envelope {
                    Some(kept) => kept.clone_from(env),
                    None => core.envelope = Some(env.clone()),
                }
                false
            }
            Some(_) => false,
        };
        if ended {
            // The upstream closes and the slot is given back as the answer ends, not when
            // hyper drops the body.
            let held = core.live.take();
            core.handed_at = None;
            drop(core);
            drop(held);
        } else {
            core.handed_at = Some(now);
        }
        Poll::Ready(event)
    }
}

impl Watch {
    /// Drives `events` as the returned stream is read, holding `slot` until the answer
    /// ends; the watchdog ends it earlier at `max_stream` after `Start`, once its reader has
    /// not asked for an event for `stall` after being handed one, or at the drain's cut.
    /// `conn` is closed when the reader stalls.
    pub fn pump<S>(
        &self,
        events: EventStream,
        slot: S,
        max_stream: Duration,
        stall: Duration,
        conn: Option<ConnHandle>,
    ) -> EventStream
    where
        S: Send + 'static,
    {
        let mut core = Core {
            live: Some((events, slot)),
            stopped: None,
            envelope: None,
            handed_at: None,
            cap_at: None,
            waker: None,
            max_stream,
            stall,
            conn,
        };
        if self.is_cut() {
            drop(core.stop(Stop::Cut));
        }
        let core = Arc::new(Mutex::new(core));
        let watched: Arc<dyn Watched> = core.clone();
        self.register(Arc::downgrade(&watched) as Weak<dyn Watched>);
        Box::pin(Pumped { core })
    }
}

/// The in-band error a stream ends with when its reader took no event for `stall`.
fn too_slow(envelope: Envelope, stall: Duration) -> ErrorEvent {
    ErrorEvent {
        code: None,
        class: ErrorClass::ClientTooSlow,
        status: ErrorClass::ClientTooSlow.http_status(),
        message: format!(
            "the client took no data for {} ms (server.client_write_timeout_ms); the answer was dropped",
            stall.as_millis()
        ),
        retry_after: None,
        envelope,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio_util::sync::CancellationToken;

    /// Counts as released when dropped.
    struct Slot(Arc<AtomicBool>);
    impl Drop for Slot {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A committed answer that never ends, which says when it is dropped (the upstream closed).
    fn endless(dropped: Arc<AtomicBool>) -> EventStream {
        let guard = Slot(dropped);
        Box::pin(async_stream::stream! {
            let _guard = guard;
            yield StreamEvent::Start(Box::new(Envelope { route: Some("r".into()), ..Envelope::default() }));
            loop {
                yield StreamEvent::TextDelta("x".into());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    }

    /// A committed answer whose upstream then says nothing, ever.
    fn silent_after_start(dropped: Arc<AtomicBool>) -> EventStream {
        let guard = Slot(dropped);
        Box::pin(async_stream::stream! {
            let _guard = guard;
            yield StreamEvent::Start(Box::new(Envelope { route: Some("r".into()), ..Envelope::default() }));
            std::future::pending::<()>().await;
        })
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// Lets `ms` of paused time pass in 10 ms steps, so `endless` produces as it would.
    async fn run_for(ms: u64) {
        for _ in 0..ms / 10 {
            tokio::time::advance(Duration::from_millis(10)).await;
            settle().await;
        }
    }

    const TICK_MS: u64 = TICK.as_millis() as u64;

    fn released() -> (Arc<AtomicBool>, Arc<AtomicBool>) {
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_never_reads_loses_its_upstream_and_slot_at_max_stream() {
        let watch = Watch::start(CancellationToken::new());
        let (upstream, slot) = released();
        let mut out = watch.pump(
            endless(upstream.clone()),
            Slot(slot.clone()),
            Duration::from_secs(60),
            Duration::from_secs(600),
            None,
        );
        assert!(
            matches!(out.next().await, Some(StreamEvent::Start(_))),
            "start comes through"
        );
        tokio::time::advance(Duration::from_secs(59)).await;
        settle().await;
        assert!(!upstream.load(Ordering::SeqCst), "still streaming before the cap");
        assert!(!slot.load(Ordering::SeqCst), "slot held before the cap");
        tokio::time::advance(Duration::from_secs(1) + TICK).await;
        settle().await;
        assert!(
            upstream.load(Ordering::SeqCst),
            "the upstream is closed at max_stream (within a tick) without a read"
        );
        assert!(
            slot.load(Ordering::SeqCst),
            "the slot is released at max_stream without a read"
        );
        let rest: Vec<StreamEvent> = out.collect().await;
        assert!(
            matches!(rest.as_slice(), [StreamEvent::Finish { reason: FinishReason::Truncated, envelope }] if envelope.route.as_deref() == Some("r")),
            "the reader ends with a truncated finish carrying the envelope, and nothing more: {rest:?}"
        );
        assert_eq!(watch.watched(), 0, "and the watchdog forgot the stream");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_takes_no_event_for_the_stall_time_loses_its_upstream_and_slot() {
        let watch = Watch::start(CancellationToken::new());
        let (upstream, slot) = released();
        let mut out = watch.pump(
            endless(upstream.clone()),
            Slot(slot.clone()),
            Duration::from_secs(600),
            Duration::from_secs(5),
            None,
        );
        // A slow reader: one event every 4 s, within the stall time.
        for _ in 0..4 {
            run_for(4_000).await;
            assert!(
                !upstream.load(Ordering::SeqCst),
                "a reader within the stall time keeps its upstream"
            );
            assert!(out.next().await.is_some(), "a slow reader is still served");
        }
        // Then it stops reading.
        run_for(4_900).await;
        assert!(!upstream.load(Ordering::SeqCst), "not before the stall time");
        run_for(100 + TICK_MS).await;
        assert!(
            upstream.load(Ordering::SeqCst),
            "the upstream is closed once no event was taken for 5 s (within a tick)"
        );
        assert!(slot.load(Ordering::SeqCst), "and the slot released");
        let rest: Vec<StreamEvent> = out.collect().await;
        match rest.as_slice() {
            [StreamEvent::Error(e)] => {
                assert_eq!(
                    e.class,
                    ErrorClass::ClientTooSlow,
                    "the client's fault, not internal: {e:?}"
                );
                assert_eq!(e.class.blame(), crate::types::Blame::Client);
                assert!(e.message.contains("client_write_timeout_ms"), "{}", e.message);
                assert_eq!(e.envelope.route.as_deref(), Some("r"), "the answer's envelope");
            }
            other => panic!("then a client_too_slow error and the end, not {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_for_a_silent_upstream_is_not_a_stalled_reader() {
        let watch = Watch::start(CancellationToken::new());
        let (upstream, slot) = released();
        let mut out = watch.pump(
            silent_after_start(upstream.clone()),
            Slot(slot.clone()),
            Duration::from_secs(600),
            Duration::from_secs(5),
            None,
        );
        assert!(matches!(out.next().await, Some(StreamEvent::Start(_))), "start");
        // The reader asks at once and waits far past the stall time, for the upstream.
        let waiting = tokio::time::timeout(Duration::from_secs(60), out.next()).await;
        assert!(waiting.is_err(), "nothing came from the silent upstream");
        assert!(
            !upstream.load(Ordering::SeqCst) && !slot.load(Ordering::SeqCst),
            "a reader waiting for the upstream is not stalled: its stream is kept"
        );
        // It stops asking: now the stall counts, from the last event it was handed. It was
        // handed none since `Start`, 60 s ago, but the wait for the upstream does not count.
        run_for(4_000).await;
        assert!(!upstream.load(Ordering::SeqCst), "kept");
    }

    #[tokio::test(start_paused = true)]
    async fn the_cut_ends_a_stream_with_a_draining_error() {
        let cut = CancellationToken::new();
        let watch = Watch::start(cut.clone());
        let upstream = Arc::new(AtomicBool::new(false));
        let mut out = watch.pump(
            endless(upstream.clone()),
            (),
            Duration::from_secs(600),
            Duration::from_secs(600),
            None,
        );
        assert!(matches!(out.next().await, Some(StreamEvent::Start(_))), "start");
        assert!(matches!(out.next().await, Some(StreamEvent::TextDelta(_))), "a delta");
        cut.cancel();
        settle().await;
        assert!(upstream.load(Ordering::SeqCst), "the cut closes the upstream");
        let rest: Vec<StreamEvent> = out.collect().await;
        match rest.as_slice() {
            [StreamEvent::Error(e)] => assert_eq!(e.class.as_str(), "draining", "class"),
            other => panic!("ends with a draining error, not {other:?}"),
        }
        let after = watch.pump(
            endless(Arc::new(AtomicBool::new(false))),
            (),
            Duration::from_secs(600),
            Duration::from_secs(600),
            None,
        );
        let after: Vec<StreamEvent> = after.collect().await;
        assert!(
            matches!(after.as_slice(), [StreamEvent::Error(e)] if e.class.as_str() == "draining"),
            "a stream pumped after the cut ends at once: {after:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_waiting_for_its_upstream_is_woken_by_the_cut() {
        let cut = CancellationToken::new();
        let watch = Watch::start(cut.clone());
        let upstream = Arc::new(AtomicBool::new(false));
        let mut out = watch.pump(
            silent_after_start(upstream.clone()),
            (),
            Duration::from_secs(600),
            Duration::from_secs(600),
            None,
        );
        assert!(matches!(out.next().await, Some(StreamEvent::Start(_))), "start");
        let reader = tokio::spawn(async move { out.next().await });
        run_for(1_000).await;
        assert!(!reader.is_finished(), "the reader waits for the silent upstream");
        cut.cancel();
        let last = tokio::time::timeout(Duration::from_secs(1), reader)
            .await
            .expect("the waiting reader is woken")
            .expect("reader task");
        assert!(
            matches!(&last, Some(StreamEvent::Error(e)) if e.class.as_str() == "draining"),
            "with the draining error: {last:?}"
        );
        assert!(upstream.load(Ordering::SeqCst), "and the upstream is closed");
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_reader_closes_the_upstream_at_once_and_the_watchdog_forgets_it() {
        let watch = Watch::start(CancellationToken::new());
        let (upstream, slot) = released();
        let mut out = watch.pump(
            endless(upstream.clone()),
            Slot(slot.clone()),
            Duration::from_secs(600),
            Duration::from_secs(600),
            None,
        );
        out.next().await;
        assert_eq!(watch.watched(), 1, "watched while it runs");
        drop(out);
        assert!(upstream.load(Ordering::SeqCst), "upstream closed");
        assert!(slot.load(Ordering::SeqCst), "slot released");
        run_for(TICK_MS + 10).await;
        assert_eq!(watch.watched(), 0, "forgotten at the next tick");
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_answer_passes_through_unchanged_and_releases_its_slot_at_its_end() {
        let watch = Watch::start(CancellationToken::new());
        let slot = Arc::new(AtomicBool::new(false));
        let events: EventStream = Box::pin(futures::stream::iter(vec![
            StreamEvent::Start(Box::default()),
            StreamEvent::TextDelta("hi".into()),
            StreamEvent::Finish {
                reason: FinishReason::Stop,
                envelope: Box::new(Envelope::default()),
            },
            StreamEvent::TextDelta("never read".into()),
        ]));
        let mut out = watch.pump(
            events,
            Slot(slot.clone()),
            Duration::from_secs(1),
            Duration::from_secs(1),
            None,
        );
        let mut seen = Vec::new();
        while let Some(event) = out.next().await {
            let terminal = matches!(event, StreamEvent::Finish { .. });
            seen.push(event);
            if terminal {
                assert!(slot.load(Ordering::SeqCst), "released with the terminal event");
            }
        }
        assert_eq!(seen.len(), 3, "every event up to the finish, nothing added: {seen:?}");
        assert!(
            matches!(
                seen[2],
                StreamEvent::Finish {
                    reason: FinishReason::Stop,
                    ..
                }
            ),
            "the real finish"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_watchdog_waits_and_wakes_for_the_next_stream() {
        let watch = Watch::start(CancellationToken::new());
        // Long past `IDLE`: the watchdog waits for a registration.
        tokio::time::advance(Duration::from_secs(60)).await;
        settle().await;
        let (upstream, slot) = released();
        let mut out = watch.pump(
            endless(upstream.clone()),
            Slot(slot.clone()),
            Duration::from_secs(2),
            Duration::from_secs(600),
            None,
        );
        assert!(matches!(out.next().await, Some(StreamEvent::Start(_))), "start");
        run_for(2_000 + TICK_MS).await;
        assert!(
            upstream.load(Ordering::SeqCst) && slot.load(Ordering::SeqCst),
            "the woken watchdog enforces the cap"
        );
    }
}
