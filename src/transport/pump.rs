//! The stream pump: one task per chat stream that pulls the gateway's events into a small
//! bounded queue the response reads from, and owns what must be released on time (the
//! stream's slot, the upstream) whether or not the client reads.
//!
//! Why a task: hyper polls a response body only when it can write to the socket, so a
//! client that stops reading (or reads a byte now and then) stops every timer inside the
//! body, and with it `max_stream_ms` and the drain's cut. The pump is polled by the runtime
//! instead. It ends, dropping the events (which closes every upstream connection) and the
//! slot, when:
//! - the answer ends (its terminal event was queued);
//! - the reader went away (the returned stream was dropped: the task is aborted);
//! - `max_stream` passed since the commit (`Start`): the reader then gets, after what was
//!   already queued, the same truncated `Finish` the mux sends at its own cap;
//! - the reader took no event for `stall` (`client_write_timeout_ms`) while one waited to be
//!   queued. Over HTTP/1 the socket's write timeout finds such a client too, but an HTTP/2
//!   client can keep its connection alive (reading other streams, answering pings) while
//!   never opening one stream's flow-control window: hyper then never polls that body, and
//!   only this timer releases the stream's slot and upstream. Nor would hyper ever drop that
//!   stream's body, so its connection is closed too (`server::ConnHandle`), as the write
//!   timeout closes an HTTP/1.1 one. The reader gets what was queued and then a
//!   `client_too_slow` error (class client: logged and counted as the client's, never as
//!   tailcut's own `internal`), should it ever read again;
//! - the drain cut it: the reader then gets a `draining` error after what was queued.
//!
//! Memory per stream is bounded by the queue (`CAPACITY` events, `queue`) however slow the reader.

use std::time::Duration;

mod queue;

use futures::StreamExt;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use self::queue::{queue, Next, PushError};
use super::drain::cut_event;
use crate::server::ConnHandle;
use crate::types::{Envelope, ErrorClass, ErrorEvent, EventStream, FinishReason, StreamEvent};

/// Events queued for a reader. A few socket writes' worth of deltas: enough that a reading
/// client never waits on the pump, small because a non-reading client holds this much.
pub const CAPACITY: usize = 16;

/// Why the pump stopped before queueing a terminal event.
#[derive(Debug)]
enum Stop {
    /// The inner stream ended (with its terminal event, or without one: the dialect says so).
    Ended,
    /// `max_stream` after commit.
    Capped(Box<Envelope>),
    /// The drain cut the stream.
    Cut(Box<Envelope>),
    /// The reader took no event for `stall`.
    Stalled(Box<Envelope>),
}

/// Drives `events` in a task of its own, holding `slot` until it ends; the returned stream
/// reads what it queued. `max_stream` counts from `Start`; `stall` is how long a queued event
/// may wait for the reader; `cut` is the drain's cut.
pub fn pump<S>(
    mut events: EventStream,
    slot: S,
    max_stream: Duration,
    stall: Duration,
    cut: CancellationToken,
    conn: Option<ConnHandle>,
) -> EventStream
where
    S: Send + 'static,
{
    let (tx, mut rx) = queue::<StreamEvent, Stop>(CAPACITY);
    let task = tokio::spawn(async move {
        let _slot = slot;
        // The answer's envelope, from its `Start`: boxed, like the event's, and made only
        // then (a stream waiting for its first token holds none).
        let mut envelope: Option<Box<Envelope>> = None;
        // The cut's waiter and the cap's timer are made once and polled in place: made anew
        // for each event, they joined and left the token's waiter list and the timer wheel
        // once per relayed event.
        let cancelled = cut.cancelled();
        tokio::pin!(cancelled);
        let cap = sleep_until(Instant::now() + max_stream);
        tokio::pin!(cap);
        let mut capped = false;
        let stop = loop {
            let event = tokio::select! {
                biased;
                _ = &mut cancelled => break Stop::Cut(envelope.unwrap_or_default()),
                _ = &mut cap, if capped => break Stop::Capped(envelope.unwrap_or_default()),
                event = events.next() => event,
            };
            let Some(event) = event else { break Stop::Ended };
            if let StreamEvent::Start(env) = &event {
                cap.as_mut().reset(Instant::now() + max_stream);
                capped = true;
                match &mut envelope {
                    Some(kept) => kept.clone_from(env),
                    None => envelope = Some(env.clone()),
                }
            }
            let terminal = matches!(event, StreamEvent::Finish { .. } | StreamEvent::Error(_));
            // A reader keeping up finds room at once: no timer is armed for it.
            let event = match tx.try_push(event) {
                Ok(()) => None,
                Err(PushError::Closed(_)) => break Stop::Ended,
                Err(PushError::Full(event)) => Some(event),
            };
            if let Some(event) = event {
                let stalled_at = Instant::now() + stall;
                tokio::select! {
                    biased;
                    _ = &mut cancelled => break Stop::Cut(envelope.unwrap_or_default()),
                    _ = &mut cap, if capped => break Stop::Capped(envelope.unwrap_or_default()),
                    _ = sleep_until(stalled_at) => break Stop::Stalled(envelope.unwrap_or_default()),
                    sent = tx.push(event) => if sent.is_err() { break Stop::Ended },
                }
            }
            if terminal {
                break Stop::Ended;
            }
        };
        // The upstream closes before the slot is given back, and both before the reader
        // learns why: by then nothing of this stream is held but what is queued.
        drop(events);
        drop(_slot);
        if matches!(stop, Stop::Stalled(_)) {
            tracing::info!(
                stall_ms = stall.as_millis() as u64,
                "the client took no event for client_write_timeout_ms; its stream was dropped and its connection closed"
            );
            if let Some(conn) = conn {
                conn.abandon();
            }
        }
        tx.close(stop);
    });
    let abort = AbortOnDrop(task);
    Box::pin(async_stream::stream! {
        let _abort = abort;
        let stop = loop {
            match rx.next().await {
                Next::Item(event) => yield event,
                Next::End(stop) => break stop,
            }
        };
        match stop {
            Some(Stop::Cut(envelope)) => yield StreamEvent::Error(Box::new(cut_event(*envelope))),
            Some(Stop::Capped(envelope)) => yield StreamEvent::Finish { reason: FinishReason::Truncated, envelope },
            Some(Stop::Stalled(envelope)) => yield StreamEvent::Error(Box::new(too_slow(*envelope, stall))),
            // Ended, or the task is gone (it panicked): the dialect renders an unfinished
            // stream honestly.
            Some(Stop::Ended) | None => {}
        }
    })
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

/// Aborts the pump when its reader is dropped, so a client that goes away cancels the
/// upstream at once, even while the pump waits on it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

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

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_never_reads_loses_its_upstream_and_slot_at_max_stream() {
        let (upstream, slot) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let mut out = pump(
            endless(upstream.clone()),
            Slot(slot.clone()),
            Duration::from_secs(60),
            Duration::from_secs(600),
            CancellationToken::new(),
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
        tokio::time::advance(Duration::from_secs(2)).await;
        settle().await;
        assert!(
            upstream.load(Ordering::SeqCst),
            "the upstream is closed at max_stream without a read"
        );
        assert!(
            slot.load(Ordering::SeqCst),
            "the slot is released at max_stream without a read"
        );
        let rest: Vec<StreamEvent> = out.collect().await;
        assert!(
            rest.len() <= CAPACITY + 1,
            "only what was queued, then the end: {}",
            rest.len()
        );
        assert!(
            matches!(rest.last(), Some(StreamEvent::Finish { reason: FinishReason::Truncated, envelope }) if envelope.route.as_deref() == Some("r")),
            "the reader ends with a truncated finish carrying the envelope: {:?}",
            rest.last()
        );
    }

    /// Lets `ms` of paused time pass in 10 ms steps, so `endless` produces as it would.
    async fn run_for(ms: u64) {
        for _ in 0..ms / 10 {
            tokio::time::advance(Duration::from_millis(10)).await;
            settle().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_takes_no_event_for_the_stall_time_loses_its_upstream_and_slot() {
        let (upstream, slot) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let mut out = pump(
            endless(upstream.clone()),
            Slot(slot.clone()),
            Duration::from_secs(600),
            Duration::from_secs(5),
            CancellationToken::new(),
            None,
        );
        // A slow reader: one event every 4 s, within the stall time, with the queue full.
        for _ in 0..4 {
            run_for(4_000).await;
            assert!(
                !upstream.load(Ordering::SeqCst),
                "a reader within the stall time keeps its upstream"
            );
            assert!(out.next().await.is_some(), "a slow reader is still served");
        }
        // Then it stops reading.
        run_for(4_500).await;
        assert!(!upstream.load(Ordering::SeqCst), "not before the stall time");
        run_for(600).await;
        assert!(
            upstream.load(Ordering::SeqCst),
            "the upstream is closed once no event was taken for 5 s"
        );
        assert!(slot.load(Ordering::SeqCst), "and the slot released");
        let mut rest: Vec<StreamEvent> = out.collect().await;
        let last = rest.pop();
        assert!(
            rest.len() <= CAPACITY && rest.iter().all(|e| matches!(e, StreamEvent::TextDelta(_))),
            "the reader gets what was queued: {rest:?}"
        );
        match last {
            Some(StreamEvent::Error(e)) => {
                assert_eq!(
                    e.class,
                    ErrorClass::ClientTooSlow,
                    "the client's fault, not internal: {e:?}"
                );
                assert_eq!(e.class.blame(), crate::types::Blame::Client);
                assert!(e.message.contains("client_write_timeout_ms"), "{}", e.message);
                assert_eq!(e.envelope.route.as_deref(), Some("r"), "the answer's envelope");
            }
            other => panic!("then a client_too_slow error, not {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_cut_ends_a_stream_with_a_draining_error_after_what_was_queued() {
        let upstream = Arc::new(AtomicBool::new(false));
        let cut = CancellationToken::new();
        let mut out = pump(
            endless(upstream.clone()),
            (),
            Duration::from_secs(600),
            Duration::from_secs(600),
            cut.clone(),
            None,
        );
        assert!(matches!(out.next().await, Some(StreamEvent::Start(_))), "start");
        assert!(matches!(out.next().await, Some(StreamEvent::TextDelta(_))), "a delta");
        cut.cancel();
        settle().await;
        assert!(upstream.load(Ordering::SeqCst), "the cut closes the upstream");
        let rest: Vec<StreamEvent> = out.collect().await;
        match rest.last() {
            Some(StreamEvent::Error(e)) => assert_eq!(e.class.as_str(), "draining", "class"),
            other => panic!("ends with a draining error, not {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_reader_closes_the_upstream_at_once() {
        let (upstream, slot) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let mut out = pump(
            endless(upstream.clone()),
            Slot(slot.clone()),
            Duration::from_secs(600),
            Duration::from_secs(600),
            CancellationToken::new(),
            None,
        );
        out.next().await;
        drop(out);
        settle().await;
        assert!(upstream.load(Ordering::SeqCst), "upstream closed");
        assert!(slot.load(Ordering::SeqCst), "slot released");
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_answer_passes_through_unchanged() {
        let events: EventStream = Box::pin(futures::stream::iter(vec![
            StreamEvent::Start(Box::default()),
            StreamEvent::TextDelta("hi".into()),
            StreamEvent::Finish {
                reason: FinishReason::Stop,
                envelope: Box::new(Envelope::default()),
            },
        ]));
        let out: Vec<StreamEvent> = pump(
            events,
            (),
            Duration::from_secs(1),
            Duration::from_secs(1),
            CancellationToken::new(),
            None,
        )
        .collect()
        .await;
        assert_eq!(out.len(), 3, "every event, nothing added: {out:?}");
        assert!(
            matches!(
                out[2],
                StreamEvent::Finish {
                    reason: FinishReason::Stop,
                    ..
                }
            ),
            "the real finish"
        );
    }
}
