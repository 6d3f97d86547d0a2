//! The registry and the run on paused time: detached cancel, expiry, cut, tokens, the cap.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{stream, StreamExt};
use tokio::sync::Semaphore;

use super::*;
use crate::transport::replay::Read;
use crate::types::{Envelope, FinishReason, StreamEvent};
use serde_json::{json, Value};

fn config() -> StreamsConfig {
    StreamsConfig {
        max_open: 2,
        max_events: 100,
        max_bytes: 1 << 20,
        keep_after_done: Duration::from_secs(60),
        detached_cancel: Duration::from_secs(30),
        retry: Duration::from_secs(1),
    }
}

/// Starts, then never ends; sets the flag when dropped (the upstream closed).
fn endless(dropped: Arc<AtomicBool>) -> EventStream {
    struct OnDrop(Arc<AtomicBool>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let guard = OnDrop(dropped);
    let events = stream::iter(vec![StreamEvent::Start(Box::default())]).chain(stream::pending());
    Box::pin(events.map(move |e| {
        let _held = &guard;
        e
    }))
}

fn answer(text: &str) -> EventStream {
    Box::pin(stream::iter(vec![
        StreamEvent::Start(Box::default()),
        StreamEvent::TextDelta(text.to_string()),
        StreamEvent::Finish {
            reason: FinishReason::Stop,
            envelope: Box::new(Envelope::default()),
        },
    ]))
}

async fn read_to_end(stream: &Arc<Stream>, after: u64) -> Vec<(u64, Value)> {
    let mut attached = stream.attach(after);
    let mut out = Vec::new();
    while let Read::Event(seq, e) = attached.reader.next().await {
        out.push((seq, serde_json::from_slice(&e.json).expect("events are JSON")));
    }
    out
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_without_a_reader_is_cancelled_after_detached_cancel() {
    let registry = Arc::new(Registry::new(config()));
    let permits = Arc::new(Semaphore::new(1));
    let dropped = Arc::new(AtomicBool::new(false));
    let permit = permits.clone().try_acquire_owned().expect("permit");
    let stream = registry
        .open(endless(dropped.clone()), "req_1".into(), permit)
        .expect("room");
    // A reader comes and goes: the clock restarts when it leaves.
    tokio::time::advance(Duration::from_secs(20)).await;
    let reader = stream.attach(0);
    tokio::time::advance(Duration::from_secs(40)).await;
    settle().await;
    assert!(
        !dropped.load(Ordering::SeqCst),
        "an attached reader keeps the stream running"
    );
    drop(reader);
    settle().await;
    tokio::time::advance(Duration::from_secs(29)).await;
    settle().await;
    assert!(!dropped.load(Ordering::SeqCst), "not yet detached for 30 s");
    tokio::time::advance(Duration::from_secs(2)).await;
    settle().await;
    assert!(dropped.load(Ordering::SeqCst), "cancelled: its upstream closed");
    assert_eq!(permits.available_permits(), 1, "and its stream permit released");
    let events = read_to_end(&stream, 0).await;
    let last = events.last().map(|(_, m)| m["code"].clone());
    assert_eq!(last, Some(json!("detached")), "ends with an error of code detached");
}

#[tokio::test(start_paused = true)]
async fn a_finished_stream_is_kept_then_gone() {
    let registry = Arc::new(Registry::new(config()));
    let permits = Arc::new(Semaphore::new(1));
    let permit = permits.clone().try_acquire_owned().expect("permit");
    let stream = registry.open(answer("hi"), "req_1".into(), permit).expect("room");
    let token = stream.token().to_string();
    settle().await;
    assert_eq!(read_to_end(&stream, 0).await.len(), 3, "start, delta, done");
    assert_eq!(permits.available_permits(), 1, "the permit is back at the end");
    tokio::time::advance(Duration::from_secs(59)).await;
    settle().await;
    assert!(
        registry.find(&stream.id, Some(&token)).is_ok(),
        "still readable at 59 s"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    settle().await;
    assert_eq!(
        registry.find(&stream.id, Some(&token)).err(),
        Some(Refused::Gone),
        "expired after keep_after_done"
    );
    assert_eq!(
        registry.find("st_never", Some(&token)).err(),
        Some(Refused::NotFound),
        "an id never seen is unknown"
    );
    assert!(registry.is_empty(), "an expired stream holds no memory");
}

#[tokio::test(start_paused = true)]
async fn tokens_are_per_stream_and_the_cap_holds() {
    let registry = Arc::new(Registry::new(config()));
    let permits = Arc::new(Semaphore::new(3));
    let take = || permits.clone().try_acquire_owned().expect("permit");
    let a = registry
        .open(endless(Arc::default()), "req_a".into(), take())
        .expect("room");
    let b = registry
        .open(endless(Arc::default()), "req_b".into(), take())
        .expect("room");
    assert!(a.token().len() >= 22, "at least 128 bits of base64url");
    assert_ne!(a.token(), b.token(), "each stream has its own token");
    assert_eq!(registry.find(&a.id, None).err(), Some(Refused::Forbidden), "no token");
    assert_eq!(
        registry.find(&a.id, Some(b.token())).err(),
        Some(Refused::Forbidden),
        "another stream's token"
    );
    assert!(registry.find(&a.id, Some(a.token())).is_ok(), "its own token");
    let third = registry.open(endless(Arc::default()), "req_c".into(), take());
    assert!(third.is_err(), "max_open = 2");
}

#[tokio::test(start_paused = true)]
async fn cut_all_ends_running_streams_with_draining_and_their_id() {
    let registry = Arc::new(Registry::new(config()));
    let permits = Arc::new(Semaphore::new(2));
    let take = || permits.clone().try_acquire_owned().expect("permit");
    let running = registry
        .open(endless(Arc::default()), "req_a".into(), take())
        .expect("room");
    let finished = registry.open(answer("x"), "req_b".into(), take()).expect("room");
    settle().await;
    assert_eq!(registry.cut_all("tailcut is shutting down"), 1, "only the running one");
    settle().await;
    let events = read_to_end(&running, 0).await;
    let last = events.last().map(|(_, m)| m.clone()).unwrap_or_default();
    assert_eq!(
        (&last["code"], &last["stream"], last["retry_after_ms"].is_u64()),
        (&json!("draining"), &json!(running.id), true),
        "draining names the stream and says when to retry: {last}"
    );
    let done = read_to_end(&finished, 0).await;
    assert_eq!(
        done.last().map(|(_, m)| m["type"].clone()),
        Some(json!("done")),
        "a finished stream is left as it was"
    );
    assert_eq!(permits.available_permits(), 2, "both permits are back");
}

#[tokio::test(start_paused = true)]
async fn a_finished_stream_gives_its_place_to_a_new_one() {
    let registry = Arc::new(Registry::new(config()));
    let permits = Arc::new(Semaphore::new(3));
    let take = || permits.clone().try_acquire_owned().expect("permit");
    let done = registry.open(answer("x"), "req_a".into(), take()).expect("room");
    let _running = registry
        .open(endless(Arc::default()), "req_b".into(), take())
        .expect("room");
    settle().await;
    assert!(!registry.is_full(), "a finished stream's place can be taken");
    let _new = registry
        .open(endless(Arc::default()), "req_c".into(), take())
        .expect("the finished one made room");
    assert_eq!(
        registry.find(&done.id, Some(done.token())).err(),
        Some(Refused::Gone),
        "the oldest finished stream was expired early"
    );
    assert!(registry.is_full(), "two running streams fill max_open = 2");
}

#[tokio::test(start_paused = true)]
async fn a_reader_on_another_instance_counts_as_attached_once_and_a_remote_cancel_stops() {
    let registry = Arc::new(Registry::new(config()));
    let permits = Arc::new(Semaphore::new(1));
    let dropped = Arc::new(AtomicBool::new(false));
    let permit = permits.clone().try_acquire_owned().expect("permit");
    let stream = registry
        .open(endless(dropped.clone()), "req_1".into(), permit)
        .expect("room");
    let owner: &dyn Owner = stream.as_ref();
    // The poller reports the remote reader each second while it reads; only changes count.
    owner.remote_reader(true);
    owner.remote_reader(true);
    assert_eq!(*stream.readers.borrow(), 1, "one remote reader is one attached reader");
    tokio::time::advance(Duration::from_secs(60)).await;
    settle().await;
    assert!(
        !dropped.load(Ordering::SeqCst),
        "a remote reader keeps the stream running"
    );
    owner.remote_reader(false);
    owner.remote_reader(false);
    assert_eq!(*stream.readers.borrow(), 0, "and its leaving detaches it, once");
    assert_eq!(owner.finished_at(), None, "still running");
    owner.cancel();
    settle().await;
    assert!(dropped.load(Ordering::SeqCst), "a DELETE elsewhere stops the upstream");
    let events = read_to_end(&stream, 0).await;
    let last = events.last().map(|(_, m)| m["code"].clone());
    assert_eq!(last, Some(json!("cancelled")));
    assert_eq!(owner.finished_at(), Some(events.len() as u64), "the terminal seq");
}

#[tokio::test(start_paused = true)]
async fn a_cancel_sent_before_the_stream_first_runs_still_stops_it() {
    let registry = Arc::new(Registry::new(config()));
    let dropped = Arc::new(AtomicBool::new(false));
    let stream = registry
        .open(endless(dropped.clone()), "req_1".into(), ())
        .expect("room");
    // The task is spawned but has not run yet: the stop must not be missed.
    stream.stop(Stop::Cancelled);
    settle().await;
    assert!(dropped.load(Ordering::SeqCst), "the upstream is closed at once");
    let events = read_to_end(&stream, 0).await;
    let last = events.last().map(|(_, m)| m["code"].clone());
    assert_eq!(last, Some(json!("cancelled")), "ends with code cancelled");
}
