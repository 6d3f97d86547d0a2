//! The pumps' watchdog: one task for the whole server that looks after every chat stream
//! from outside, reading ahead for readers that do not come and ending streams whose limit
//! passed (`max_stream`, the stall, the drain's cut), whether or not anything polls them.
//!
//! Why one task and not one per stream: a task per stream costs a spawn and an abort per
//! request, and each of those schedules a task, which on a multi-threaded runtime usually
//! wakes the other worker. Registering a stream here costs a lock and a push. The watchdog
//! ticks every `TICK` while streams are registered, so a limit is enforced about a tick late
//! (`pump` says exactly); after `IDLE` with none it waits until a stream registers, so an idle server is not
//! woken at all. Entries are weak: a stream whose body was dropped leaves at the next tick.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;

/// How often the registered streams are looked at: about how late a limit is enforced.
pub const TICK: Duration = Duration::from_millis(100);

/// How long the watchdog keeps ticking with no stream registered before it waits for one.
const IDLE: Duration = Duration::from_secs(10);

/// A stream the watchdog looks after.
pub(super) trait Watched: Send + Sync {
    /// Ends the stream if one of its limits passed by `now` (or `cut` is set). False once
    /// nothing of it is left to release: the watchdog then forgets it.
    fn watch(&self, now: Instant, cut: bool) -> bool;
}

struct Inner {
    entries: Mutex<Vec<Weak<dyn Watched>>>,
    cut: CancellationToken,
    /// The watchdog waits for a stream: the next registration wakes it.
    parked: AtomicBool,
    wake: Notify,
    /// The `Watch` was dropped: the watchdog ends.
    closed: AtomicBool,
}

impl Inner {
    fn entries(&self) -> MutexGuard<'_, Vec<Weak<dyn Watched>>> {
        // Nothing panics while holding this lock, so a poisoned one's list is whole.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Looks at every entry once; returns how many are still watched. The list is taken out
    /// while the entries are looked at, so registering never waits for a sweep, and each
    /// stream's own lock is taken without this one held. A stream whose look panics is
    /// forgotten, not the watchdog.
    fn sweep(&self, now: Instant, cut: bool) -> usize {
        let mut entries = std::mem::take(&mut *self.entries());
        entries.retain(|entry| {
            entry
                .upgrade()
                .is_some_and(|stream| catch_unwind(AssertUnwindSafe(|| stream.watch(now, cut))).unwrap_or(false))
        });
        let mut current = self.entries();
        // Those registered during the sweep join the kept list, which goes back in place
        // with its capacity (appending the kept list to the new one copied it every tick).
        entries.append(&mut current);
        std::mem::swap(&mut *current, &mut entries);
        let len = current.len();
        if current.capacity() > 4 * len + 64 {
            current.shrink_to(2 * len);
        }
        len
    }
}

/// The handle the server keeps (in `AppState`); dropping it ends the watchdog task.
pub struct Watch {
    inner: Arc<Inner>,
}

impl Watch {
    /// Spawns the watchdog on the current runtime. `cut` is the drain's cut: once it is
    /// cancelled every stream, watched or registered later, ends with a `draining` error.
    pub fn start(cut: CancellationToken) -> Watch {
        let inner = Arc::new(Inner {
            entries: Mutex::new(Vec::new()),
            cut,
            parked: AtomicBool::new(false),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
        });
        tokio::spawn(run(Arc::clone(&inner)));
        Watch { inner }
    }

    /// Whether the drain's cut has come.
    pub(super) fn is_cut(&self) -> bool {
        self.inner.cut.is_cancelled()
    }

    /// Watches `stream` until it is over or dropped.
    pub(super) fn register(&self, stream: Weak<dyn Watched>) {
        self.inner.entries().push(stream);
        if self.inner.parked.swap(false, Ordering::AcqRel) {
            self.inner.wake.notify_one();
        }
    }

    /// How many streams are watched (as of the last tick, plus those registered since; less
    /// while a sweep runs).
    pub fn watched(&self) -> usize {
        self.inner.entries().len()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.wake.notify_one();
    }
}

async fn run(inner: Arc<Inner>) {
    let cancelled = inner.cut.clone().cancelled_owned();
    tokio::pin!(cancelled);
    // Resolves at once if the cut came before this task first ran.
    let mut cut = false;
    let mut busy_at = Instant::now();
    while !inner.closed.load(Ordering::Acquire) {
        tokio::select! {
            biased;
            _ = &mut cancelled, if !cut => cut = true,
            _ = sleep(TICK) => {}
        }
        let now = Instant::now();
        if inner.sweep(now, cut) > 0 {
            busy_at = now;
            continue;
        }
        if now.duration_since(busy_at) < IDLE {
            continue;
        }
        {
            // Under the entries' lock, so a stream registered after this look wakes it.
            let entries = inner.entries();
            if !entries.is_empty() {
                continue;
            }
            inner.parked.store(true, Ordering::Release);
        }
        tokio::select! {
            biased;
            _ = &mut cancelled, if !cut => cut = true,
            _ = inner.wake.notified() => {}
        }
        inner.parked.store(false, Ordering::Release);
        busy_at = Instant::now();
    }
}
