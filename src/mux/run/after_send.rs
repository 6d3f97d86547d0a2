//! Work a request needs but its bytes need not wait for, done after they are sent: the state
//! hash after the first upstream request is written, the client TTFT sample after the first
//! events are flushed to the client. Each waits one yield of the task, and so overlaps the
//! upstream's (or the client's) own work instead of adding to the time to first token.
//!
//! Why a yield: the first step (`Run::begin`) hands the request to its connection's task,
//! which the runtime queues to run next on this thread; everything this task does before it
//! returns `Pending` delays that write. So after the step's first `Pending` the task yields
//! (`tokio::task::yield_now`: woken again once the thread has run what it had queued and
//! polled for I/O, with no other worker woken), and the work runs on its next poll, before the
//! step is polled again. Likewise hyper writes the first events only once the body's poll
//! returns `Pending`, so the TTFT sample waits for one `yield_now` too (`Later` records it even
//! when the stream is dropped during the yield). What it costs: one more poll of the request's
//! futures each, while the upstream is busy anyway.
//!
//! `Run::settle_state_hash` computes the hash in place when the first step finished before it
//! was due (a refusal at once, a cached answer).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;

use crate::types::ChatRequest;

/// The state hash to compute for `req`, into the slot the run reads it from.
pub(super) struct StateHash {
    req: Arc<ChatRequest>,
    slot: Arc<OnceLock<Box<str>>>,
}

impl StateHash {
    pub fn new(req: Arc<ChatRequest>, slot: Arc<OnceLock<Box<str>>>) -> Self {
        StateHash { req, slot }
    }

    fn compute(self) {
        let req = &self.req;
        self.slot.get_or_init(|| crate::types::state_hash(req).into());
    }
}

/// Runs its closure when dropped: work that must happen even if the stream is dropped
/// before it got to it.
pub(super) struct Later<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Later<F> {
    pub fn new(work: F) -> Self {
        Later(Some(work))
    }
}

impl<F: FnOnce()> Drop for Later<F> {
    fn drop(&mut self) {
        if let Some(work) = self.0.take() {
            work();
        }
    }
}

/// `step`, with `work` done after its first `Pending` and one `yield_now`.
pub(super) fn after_first_pending<F: Future>(step: F, work: StateHash) -> AfterSend<F, impl Future<Output = ()>> {
    AfterSend {
        step,
        // Made now, polled only after the step's first `Pending`.
        yielding: tokio::task::yield_now(),
        work: Some(work),
        phase: Phase::First,
    }
}

enum Phase {
    First,
    Yielding,
    Done,
}

pin_project! {
    /// A future of its own rather than an async fn: an async fn would keep the step's
    /// argument slot beside its pinned copy, twice the size of the first step's future, which
    /// every stream waiting for its first token holds.
    pub(super) struct AfterSend<F, Y> {
        #[pin]
        step: F,
        #[pin]
        yielding: Y,
        work: Option<StateHash>,
        phase: Phase,
    }
}

impl<F: Future, Y: Future<Output = ()>> Future for AfterSend<F, Y> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        loop {
            match this.phase {
                Phase::First => {
                    let polled = this.step.as_mut().poll(cx);
                    if polled.is_ready() {
                        return polled;
                    }
                    *this.phase = Phase::Yielding;
                }
                Phase::Yielding => {
                    ready!(this.yielding.as_mut().poll(cx));
                    if let Some(work) = this.work.take() {
                        work.compute();
                    }
                    *this.phase = Phase::Done;
                }
                Phase::Done => return this.step.as_mut().poll(cx),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Message, Role};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    fn request() -> Arc<ChatRequest> {
        Arc::new(ChatRequest {
            model: "chat".into(),
            messages: vec![Message::text(Role::User, "hello")],
            ..ChatRequest::default()
        })
    }

    /// A step that is `Pending` `waits` times (waking itself), then ready; notes at each poll
    /// whether the hash was in `slot` by then.
    fn step(mut waits: usize, slot: Arc<OnceLock<Box<str>>>, seen: Arc<Mutex<Vec<bool>>>) -> impl Future<Output = ()> {
        std::future::poll_fn(move |cx| {
            seen.lock().expect("not poisoned").push(slot.get().is_some());
            if waits == 0 {
                return Poll::Ready(());
            }
            waits -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        })
    }

    #[tokio::test]
    async fn the_hash_is_computed_after_the_first_pending_and_before_the_next_poll() {
        let req = request();
        let slot = Arc::new(OnceLock::new());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let work = StateHash::new(Arc::clone(&req), Arc::clone(&slot));
        after_first_pending(step(2, Arc::clone(&slot), Arc::clone(&seen)), work).await;
        assert_eq!(
            *seen.lock().expect("not poisoned"),
            vec![false, true, true],
            "not before the first Pending; there before every later poll"
        );
        assert_eq!(
            slot.get().map(|h| &**h),
            Some(crate::types::state_hash(&req).as_str()),
            "the request's state hash"
        );
    }

    #[tokio::test]
    async fn a_step_ready_at_once_leaves_the_hash_to_the_run() {
        let slot = Arc::new(OnceLock::new());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let work = StateHash::new(request(), Arc::clone(&slot));
        after_first_pending(step(0, Arc::clone(&slot), seen), work).await;
        assert!(slot.get().is_none(), "not computed here (settle_state_hash does it)");
    }

    #[test]
    fn the_wrapper_holds_the_step_once() {
        // Every stream waiting for its first token holds this around its first step.
        let big = [0u8; 2048];
        let step = async move { std::hint::black_box(big).len() };
        let alone = std::mem::size_of_val(&step);
        let step = async move { std::hint::black_box(big).len() };
        let wrapped = after_first_pending(step, StateHash::new(request(), Arc::new(OnceLock::new())));
        assert!(
            std::mem::size_of_val(&wrapped) <= alone + 64,
            "{} bytes around a step of {alone}",
            std::mem::size_of_val(&wrapped)
        );
    }

    #[test]
    fn later_work_runs_once_when_dropped() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let later = Later::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(runs.load(Ordering::SeqCst), 0, "not before the drop");
        drop(later);
        assert_eq!(runs.load(Ordering::SeqCst), 1, "once, at the drop");
    }
}
