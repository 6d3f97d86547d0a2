//! The stream pump: the chat stream a response body reads, which releases what must be
//! released on time (the stream's slot, the upstream) whether or not the client reads.
//!
//! hyper polls a response body only when it can write to the socket, so a client that stops
//! reading (or reads a byte now and then) stops every timer inside the body, and with it
//! `max_stream_ms` and the drain's cut. So the body polls the gateway's events itself, with
//! nothing between them while its reader keeps up (an event goes from the upstream
//! connection's task straight to the client connection's, as through a bare proxy), and the
//! server's one watchdog (`watch`) looks after every stream from outside, once a `watch::TICK`:
//! - a reader that has not come back for `TICK` although it may have something to take (it
//!   was handed an event, or the gateway's stream woke it since) has events read for it, up
//!   to `AHEAD`, in its place: the mux's timers run and an answer that ends is released
//!   without it;
//! - `max_stream` passed since the commit (`Start`): the stream ends; its reader gets, after
//!   what was read ahead, the same truncated `Finish` the mux sends at its own cap;
//! - `AHEAD` events have waited for the reader for `stall` (`client_write_timeout_ms`): the
//!   stream ends. Time spent waiting for the upstream never counts, nor does a slow write of
//!   one big event. Over HTTP/1 the socket's write timeout finds such a client too, but an
//!   HTTP/2 client can keep its connection alive (reading other streams, answering pings)
//!   while never opening one stream's flow-control window: hyper then never polls that body
//!   (it waits for window, woken or not), and only this limit releases the stream's slot and
//!   upstream. Nor would hyper ever drop that stream's body, so its connection is closed too
//!   (`server::ConnHandle`), as the write timeout closes an HTTP/1.1 one. The reader gets
//!   what was read ahead and then a `client_too_slow` error (class client: logged and counted
//!   as the client's, never as tailcut's own `internal`), should it ever read again;
//! - the drain cut it: the reader gets a `draining` error after what was read ahead.
//!
//! When a stream ends, its upstream closes and its slot is given back before its reader can
//! see why. It ends by itself, releasing both, when its terminal event is taken (by its
//! reader or read ahead) or its reader goes away (the body is dropped). A limit is enforced
//! a tick late at most, or a tick more for each tick that finds the stream being polled.
//! Memory per stream is what the gateway's stream holds, and at most `AHEAD` events.
//!
//! A panic in the gateway's stream ends that stream alone: its reader sees it end unfinished
//! (the dialect says so honestly) and the client's connection goes on.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures::task::AtomicWaker;
use futures::{Stream, StreamExt};
use tokio::time::Instant;

mod watch;

use self::watch::Watched;
pub use self::watch::{Watch, TICK};
use super::drain::cut_event;
use crate::server::ConnHandle;
use crate::types::{Envelope, ErrorClass, ErrorEvent, EventStream, FinishReason, StreamEvent};

/// Events read ahead for a reader that does not come for them: a few socket writes' worth of
/// deltas, so one slow write of a big event (a whole tool call) is not a stall; small, because
/// a client that never reads holds this much until its stall time.
pub const AHEAD: usize = 16;

/// Why the watchdog ended a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// `max_stream` after commit.
    Capped,
    /// The drain cut the stream.
    Cut,
    /// `AHEAD` events waited for the reader for `stall`.
    Stalled,
}

/// The waker the gateway's stream is polled with: it notes that the stream has something,
/// then wakes the reader. So the watchdog can tell a reader waiting for the upstream from one
/// that was woken and did not come (hyper waits for flow-control window, not for the body).
struct Signal {
    ready: AtomicBool,
    reader: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.ready.store(true, Ordering::Release);
        self.reader.wake();
    }
}

/// What the body and the watchdog share of one stream.
struct Core<S> {
    /// The gateway's events and the stream's slot, until the stream ends.
    live: Option<(EventStream, S)>,
    /// Events read ahead for the reader (at most `AHEAD`); `None` last: the stream ended
    /// without a terminal event.
    ahead: VecDeque<Option<StreamEvent>>,
    /// Since when `ahead` is full.
    full_since: Option<Instant>,
    /// Set by the watchdog; handed to the reader after what was read ahead.
    stopped: Option<Stop>,
    /// The answer's envelope, from its `Start`: boxed, like the event's, and made only then
    /// (a stream waiting for its first token holds none).
    envelope: Option<Box<Envelope>>,
    /// When the reader last asked, and whether it was then told to wait (`Pending`).
    asked_at: Instant,
    waiting: bool,
    /// `max_stream` after the commit.
    cap_at: Option<Instant>,
    signal: Arc<Signal>,
    /// `signal` as a waker, made once.
    waker: Waker,
    max_stream: Duration,
    stall: Duration,
    conn: Option<ConnHandle>,
}

fn lock<S>(core: &Mutex<Core<S>>) -> MutexGuard<'_, Core<S>> {
    // The gateway's stream is polled under this lock, but inside `catch_unwind`, and nothing
    // else that runs under it panics: a poisoned lock's state is whole.
    core.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<S> Core<S> {
    /// Polls the gateway's stream once (with `signal`); a panic in it ends the stream
    /// unfinished. Notes the commit and the end; what the stream held is released at its end.
    fn poll_events(&mut self, now: Instant) -> Poll<Option<StreamEvent>> {
        let Some((events, _)) = self.live.as_mut() else {
            return Poll::Ready(None);
        };
        self.signal.ready.store(false, Ordering::Release);
        let mut cx = Context::from_waker(&self.waker);
        let polled = catch_unwind(AssertUnwindSafe(|| events.poll_next_unpin(&mut cx)));
        let event = match polled {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(event)) => event,
            Err(_) => {
                tracing::error!("a chat stream panicked; it ends unfinished");
                None
            }
        };
        match &event {
            None | Some(StreamEvent::Finish { .. } | StreamEvent::Error(_)) => {
                // The upstream closes and the slot is given back as the answer ends, not
                // when hyper drops the body.
                drop(self.live.take());
            }
            Some(StreamEvent::Start(env)) => {
                self.cap_at = Some(now + self.max_stream);
                match &mut self.envelope {
                    Some(kept) => kept.clone_from(env),
                    None => self.envelope = Some(env.clone()),
                }
            }
            Some(_) => {}
        }
        Poll::Ready(event)
    }

    /// Reads ahead for a reader that has not come back for `TICK` although it may have
    /// something to take, until the stream waits, ends, or `AHEAD` events wait.
    fn read_ahead(&mut self, now: Instant) {
        let may_have = !self.waiting || self.signal.ready.load(Ordering::Acquire);
        if !may_have || now < self.asked_at + TICK {
            return;
        }
        while self.ahead.len() < AHEAD && self.live.is_some() {
            match self.poll_events(now) {
                Poll::Pending => break,
                Poll::Ready(event) => self.ahead.push_back(event),
            }
        }
        if self.ahead.len() == AHEAD && self.full_since.is_none() {
            self.full_since = Some(now);
        }
    }

    /// Ends the stream with `stop`: the upstream closes and the slot is given back, then the
    /// reader is woken to learn why.
    fn stop(&mut self, stop: Stop) {
        drop(self.live.take());
        self.stopped = Some(stop);
        self.signal.reader.wake();
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
            // Being polled this moment: its reader is there, and the next tick will do.
            Err(TryLockError::WouldBlock) => return true,
        };
        if core.live.is_none() {
            return false;
        }
        let stop = if cut {
            Stop::Cut
        } else if core.cap_at.is_some_and(|at| now >= at) {
            Stop::Capped
        } else if core.full_since.is_some_and(|since| now >= since + core.stall) {
            Stop::Stalled
        } else {
            core.read_ahead(now);
            return core.live.is_some();
        };
        core.stop(stop);
        if stop == Stop::Stalled {
            let conn = core.conn.take();
            let stall = core.stall;
            drop(core);
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
        let core = &mut *core;
        let now = Instant::now();
        core.asked_at = now;
        core.waiting = false;
        if let Some(event) = core.ahead.pop_front() {
            core.full_since = None;
            return Poll::Ready(event);
        }
        if let Some(stop) = core.stopped.take() {
            return Poll::Ready(Some(core.last_event(stop)));
        }
        core.signal.reader.register(cx.waker());
        let polled = core.poll_events(now);
        core.waiting = polled.is_pending();
        polled
    }
}

impl Watch {
    /// Drives `events` as the returned stream is read, holding `slot` until the answer
    /// ends; the watchdog reads ahead for a reader that does not come, and ends the stream
    /// earlier at `max_stream` after `Start`, once `AHEAD` events waited for the reader for
    /// `stall`, or at the drain's cut. `conn` is closed when the reader stalls.
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
        let signal = Arc::new(Signal {
            ready: AtomicBool::new(false),
            reader: AtomicWaker::new(),
        });
        let mut core = Core {
            live: Some((events, slot)),
            ahead: VecDeque::new(),
            full_since: None,
            stopped: None,
            envelope: None,
            asked_at: Instant::now(),
            waiting: false,
            cap_at: None,
            waker: Waker::from(Arc::clone(&signal)),
            signal,
            max_stream,
            stall,
            conn,
        };
        if self.is_cut() {
            core.stop(Stop::Cut);
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
            yield start();
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
            yield start();
            std::future::pending::<()>().await;
        })
    }

    /// `events` pumped with `slot`, `max_stream` and `stall` (in seconds), no connection.
    fn pumped<S: Send + 'static>(
        watch: &Watch,
        events: EventStream,
        slot: S,
        max_stream: u64,
        stall: u64,
    ) -> EventStream {
        watch.pump(
            events,
            slot,
            Duration::from_secs(max_stream),
            Duration::from_secs(stall),
            None,
        )
    }

    /// The `Start` every test answer begins with.
    fn start() -> StreamEvent {
        StreamEvent::Start(Box::new(Envelope {
            route: Some("r".into()),
            ..Envelope::default()
        }))
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
    /// How long the watchdog takes to read `AHEAD` events from `endless`: one a tick.
    const AHEAD_MS: u64 = AHEAD as u64 * TICK_MS;

    fn released() -> (Arc<AtomicBool>, Arc<AtomicBool>) {
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_never_reads_loses_its_upstream_and_slot_at_max_stream() {
        let watch = Watch::start(CancellationToken::new());
        let (upstream, slot) = released();
        let mut out = pumped(&watch, endless(upstream.clone()), Slot(slot.clone()), 60, 600);
        assert!(
            matches!(out.next().await, Some(StreamEvent::Start(_))),
            "start comes through"
        );
        run_for(59_000).await;
        assert!(!upstream.load(Ordering::SeqCst), "still streaming before the cap");
        assert!(!slot.load(Ordering::SeqCst), "slot held before the cap");
        run_for(1_000 + TICK_MS).await;
        assert!(
            upstream.load(Ordering::SeqCst),
            "the upstream is closed at max_stream (within a tick) without a read"
        );
        assert!(
            slot.load(Ordering::SeqCst),
            "the slot is released at max_stream without a read"
        );
        let rest: Vec<StreamEvent> = out.collect().await;
        let (last, ahead) = rest.split_last().expect("events after the cap");
        assert_eq!(ahead.len(), AHEAD, "what was read ahead comes first: {rest:?}");
        assert!(
            ahead.iter().all(|e| matches!(e, StreamEvent::TextDelta(_))),
            "deltas read ahead: {ahead:?}"
        );
        assert!(
            matches!(last, StreamEvent::Finish { reason: FinishReason::Truncated, envelope } if envelope.route.as_deref() == Some("r")),
            "the reader ends with a truncated finish carrying the envelope, and nothing more: {last:?}"
        );
        assert_eq!(watch.watched(), 0, "and the watchdog forgot the stream");
    }

    /// The events after what was read ahead: `AHEAD` deltas, then one client_too_slow error.
    fn assert_stalled(rest: &[StreamEvent]) {
        let (last, ahead) = rest.split_last().expect("events after the stall");
        assert_eq!(ahead.len(), AHEAD, "what was read ahead comes first");
        match last {
            StreamEvent::Error(e) => {
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
    async fn a_reader_that_takes_no_event_for_the_stall_time_loses_its_upstream_and_slot() {
        let watch = Watch::start(CancellationToken::new());
        let (upstream, slot) = released();
        let mut out = pumped(&watch, endless(upstream.clone()), Slot(slot.clone()), 600, 5);
        // A slow reader: one event every 4 s, within the stall time.
        for _ in 0..4 {
            run_for(4_000).await;
            assert!(
                !upstream.load(Ordering::SeqCst),
                "a reader within the stall time keeps its upstream"
            );
            assert!(out.next().await.is_some(), "a slow reader is still served");
        }
        // Then it stops reading: the stall counts from the first tick that finds `AHEAD`
        // events waiting (read one a tick here: the upstream pauses between deltas).
        run_for(5_000).await;
        assert!(!upstream.load(Ordering::SeqCst), "not before the stall time");
        run_for(AHEAD_MS + 2 * TICK_MS).await;
        assert!(
            upstream.load(Ordering::SeqCst),
            "the upstream is closed once AHEAD events waited for 5 s (within a tick)"
        );
        assert!(slot.load(Ordering::SeqCst), "and the slot released");
        let rest: Vec<StreamEvent> = out.collect().await;
        assert_stalled(&rest);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_woken_that_never_comes_back_is_stalled() {
        // An HTTP/2 body whose stream window is shut: hyper polled it, got `Pending` (it
        // could as well have taken a keep-alive ping then), and waits for window, not for
        // the body. The upstream then speaks; the body is never polled again.
        let watch = Watch::start(CancellationToken::new());
        let (upstream, slot) = released();
        let guard = Slot(upstream.clone());
        let events: EventStream = Box::pin(async_stream::stream! {
            let _guard = guard;
            yield start();
            tokio::time::sleep(Duration::from_secs(20)).await;
            loop {
                yield StreamEvent::TextDelta("x".into());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let mut out = pumped(&watch, events, Slot(slot.clone()), 600, 5);
        assert!(matches!(out.next().await, Some(StreamEvent::Start(_))), "start");
        assert!(
            futures::poll!(out.next()).is_pending(),
            "the reader waits for the upstream"
        );
        run_for(20_000).await;
        assert!(
            !upstream.load(Ordering::SeqCst),
            "waiting for a silent upstream is no stall"
        );
        run_for(5_000 + AHEAD_MS + 2 * TICK_MS).await;
        assert!(
            upstream.load(Ordering::SeqCst) && slot.load(Ordering::SeqCst),
            "woken and not back for the stall time: upstream closed, slot released"
        );
        let rest: Vec<StreamEvent> = out.collect().await;
        assert_stalled(&rest);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_write_of_one_big_event_is_no_stall_and_the_answer_is_released_at_its_end() {
        // A whole tool call takes the client 40 s to read, more than the stall time; the
        // answer's last events are read ahead meanwhile.
        let watch = Watch::start(CancellationToken::new());
        let (upstream, slot) = released();
        let guard = Slot(upstream.clone());
        let events: EventStream = Box::pin(async_stream::stream! {
            let _guard = guard;
            yield start();
            yield StreamEvent::TextDelta("a big event".into());
            yield StreamEvent::TextDelta("and a small one".into());
            yield StreamEvent::Finish { reason: FinishReason::Stop, envelope: Box::default() };
            std::future::pending::<()>().await;
        });
        let mut out = pumped(&watch, events, Slot(slot.clone()), 600, 30);
        assert!(matches!(out.next().await, Some(StreamEvent::Start(_))), "start");
        assert!(
            matches!(out.next().await, Some(StreamEvent::TextDelta(_))),
            "the big event"
        );
        run_for(TICK_MS * 3).await;
        assert!(
            upstream.load(Ordering::SeqCst) && slot.load(Ordering::SeqCst),
            "the answer's end was read ahead: upstream and slot released without the reader"
        );
        run_for(40_000).await;
        let rest: Vec<StreamEvent> = out.collect().await;
        assert!(
            matches!(
                rest.as_slice(),
                [
                    StreamEvent::TextDelta(_),
                    StreamEvent::Finish {
                        reason: FinishReason::Stop,
                        ..
                    }
                ]
            ),
            "the rest of the answer, no client_too_slow: {rest:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_panic_in_the_stream_ends_it_unfinished_and_releases_it() {
        let watch = Watch::start(CancellationToken::new());
        let (upstream, slot) = released();
        let guard = Slot(upstream.clone());
        let events: EventStream = Box::pin(async_stream::stream! {
            let _guard = guard;
            yield StreamEvent::Start(Box::default());
            panic!("a bug in the stream");
        });
        let mut out = pumped(&watch, events, Slot(slot.clone()), 600, 5);
        assert!(matches!(out.next().await, Some(StreamEvent::Start(_))), "start");
        assert!(
            out.next().await.is_none(),
            "then the end, unfinished (the dialect says so)"
        );
        assert!(
            upstream.load(Ordering::SeqCst) && slot.load(Ordering::SeqCst),
            "upstream closed and slot released"
        );
        assert!(out.next().await.is_none(), "and it stays ended");
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_for_a_silent_upstream_is_not_a_stalled_reader() {
        let watch = Watch::start(CancellationToken::new());
        let (upstream, slot) = released();
        let mut out = pumped(&watch, silent_after_start(upstream.clone()), Slot(slot.clone()), 600, 5);
        assert!(matches!(out.next().await, Some(StreamEvent::Start(_))), "start");
        // The reader asks at once and waits far past the stall time, for the upstream.
        let waiting = tokio::time::timeout(Duration::from_secs(60), out.next()).await;
        assert!(waiting.is_err(), "nothing came from the silent upstream");
        assert!(
            !upstream.load(Ordering::SeqCst) && !slot.load(Ordering::SeqCst),
            "a reader waiting for the upstream is not stalled: its stream is kept"
        );
        // It stops asking: nothing waits for it, so that is no stall either.
        run_for(60_000).await;
        assert!(
            !upstream.load(Ordering::SeqCst) && !slot.load(Ordering::SeqCst),
            "kept while nothing waits for the reader"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_cut_ends_a_stream_with_a_draining_error() {
        let cut = CancellationToken::new();
        let watch = Watch::start(cut.clone());
        let upstream = Arc::new(AtomicBool::new(false));
        let mut out = pumped(&watch, endless(upstream.clone()), (), 600, 600);
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
        let after = pumped(&watch, endless(Arc::new(AtomicBool::new(false))), (), 600, 600);
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
        let mut out = pumped(&watch, silent_after_start(upstream.clone()), (), 600, 600);
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
        let mut out = pumped(&watch, endless(upstream.clone()), Slot(slot.clone()), 600, 600);
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
        let mut out = pumped(&watch, events, Slot(slot.clone()), 1, 1);
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
        let mut out = pumped(&watch, endless(upstream.clone()), Slot(slot.clone()), 2, 600);
        assert!(matches!(out.next().await, Some(StreamEvent::Start(_))), "start");
        run_for(2_000 + TICK_MS).await;
        assert!(
            upstream.load(Ordering::SeqCst) && slot.load(Ordering::SeqCst),
            "the woken watchdog enforces the cap"
        );
    }
}
