//! Work a request needs before its first event but not before its first upstream request:
//! done once that request is queued on its connection, after one yield, so the connection's
//! task writes it to the upstream first and the work overlaps the upstream's own.
//!
//! The first step (`Run::begin`) hands the request to its connection's task, which the
//! runtime queues to run next on this thread; everything this task does before it returns
//! `Pending` delays that write. So on the step's first `Pending` this wakes its own task and
//! returns: the runtime puts a task that woke itself behind the one queued to run next. The
//! next poll does the work, then polls the step again. What it costs: one more poll of the
//! request's futures, while the upstream is busy anyway.
//!
//! The work is the state hash (`types::state_hash`): it serializes and hashes the whole
//! history, and only the envelope needs it. `Run::settle_state_hash` computes it in place
//! when the step finished before it was due (a refusal at once, a cached answer).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

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

pin_project! {
    /// `step`, with `work` done after its first `Pending` and one yield.
    pub(super) struct AfterSend<F> {
        #[pin]
        step: F,
        work: Option<StateHash>,
        due: bool,
    }
}

impl<F> AfterSend<F> {
    pub fn new(step: F, work: StateHash) -> Self {
        AfterSend {
            step,
            work: Some(work),
            due: false,
        }
    }
}

impl<F: Future> Future for AfterSend<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        if *this.due {
            *this.due = false;
            if let Some(work) = this.work.take() {
                work.compute();
            }
        }
        let polled = this.step.poll(cx);
        if polled.is_pending() && this.work.is_some() && !*this.due {
            *this.due = true;
            cx.waker().wake_by_ref();
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Message, Role};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn request() -> Arc<ChatRequest> {
        Arc::new(ChatRequest {
            model: "chat".into(),
            messages: vec![Message::text(Role::User, "hello")],
            ..ChatRequest::default()
        })
    }

    /// A step that is `Pending` `waits` times, then ready.
    fn step(mut waits: usize) -> impl Future<Output = ()> {
        std::future::poll_fn(move |_| {
            if waits == 0 {
                return Poll::Ready(());
            }
            waits -= 1;
            Poll::Pending
        })
    }

    #[test]
    fn the_hash_is_computed_on_the_poll_after_the_first_pending_not_before() {
        let req = request();
        let slot = Arc::new(OnceLock::new());
        let woken = Arc::new(Count::default());
        let waker = Waker::from(Arc::clone(&woken));
        let mut cx = Context::from_waker(&waker);
        let mut fut = Box::pin(AfterSend::new(
            step(2),
            StateHash::new(Arc::clone(&req), Arc::clone(&slot)),
        ));
        assert!(fut.as_mut().poll(&mut cx).is_pending(), "the step waits");
        assert!(slot.get().is_none(), "not hashed before the task yields");
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "it woke itself to be polled again");
        assert!(fut.as_mut().poll(&mut cx).is_pending(), "the step still waits");
        assert_eq!(
            slot.get().map(|h| &**h),
            Some(crate::types::state_hash(&req).as_str()),
            "hashed on the next poll"
        );
        assert!(fut.as_mut().poll(&mut cx).is_ready(), "the step's own result");
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "it yields once only");
    }

    #[test]
    fn a_step_ready_at_once_leaves_the_hash_to_the_run() {
        let slot = Arc::new(OnceLock::new());
        let waker = Waker::from(Arc::new(Count::default()));
        let mut cx = Context::from_waker(&waker);
        let mut fut = Box::pin(AfterSend::new(step(0), StateHash::new(request(), Arc::clone(&slot))));
        assert!(fut.as_mut().poll(&mut cx).is_ready(), "ready");
        assert!(slot.get().is_none(), "not computed here (settle_state_hash does it)");
    }
}
