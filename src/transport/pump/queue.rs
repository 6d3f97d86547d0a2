//! The pump's queue: a bounded single-producer, single-consumer queue of events that holds
//! memory only for the events in it, and carries the producer's reason for ending.
//!
//! Written here rather than taken from a crate: tokio's `mpsc` allocates a block of 32 slots
//! per channel up front (1.5 KiB of 48-byte events for every stream, most of it never used
//! by a stream still waiting for its first token), and the other bounded channels allocate
//! once per message (`futures`) or once per wait (`flume`, `async-channel`'s listeners). This
//! one is a `VecDeque` under a mutex, which grows only as events are queued, and two of
//! tokio's `Notify`s, which allocate nothing: each side has one waiter at most, and a
//! notification sent while nobody waits is kept as a permit, so no wake-up is lost.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

/// Why a push failed; the item comes back.
#[derive(Debug)]
pub enum PushError<T> {
    /// `capacity` items are queued.
    Full(T),
    /// The receiver is gone.
    Closed(T),
}

struct State<T, E> {
    items: VecDeque<T>,
    /// The sender is gone; `end` is what it left.
    sender_gone: bool,
    end: Option<E>,
    receiver_gone: bool,
}

struct Shared<T, E> {
    state: Mutex<State<T, E>>,
    capacity: usize,
    /// An item was queued, or the sender went away.
    readable: Notify,
    /// An item was taken, or the receiver went away.
    writable: Notify,
}

impl<T, E> Shared<T, E> {
    fn lock(&self) -> MutexGuard<'_, State<T, E>> {
        // Nothing here panics while holding the lock, so a poisoned lock's state is whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A queue of at most `capacity` items (at least one).
pub fn queue<T, E>(capacity: usize) -> (Sender<T, E>, Receiver<T, E>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            items: VecDeque::new(),
            sender_gone: false,
            end: None,
            receiver_gone: false,
        }),
        capacity: capacity.max(1),
        readable: Notify::new(),
        writable: Notify::new(),
    });
    (Sender(shared.clone()), Receiver(shared))
}

pub struct Sender<T, E>(Arc<Shared<T, E>>);

impl<T, E> Sender<T, E> {
    pub fn try_push(&self, item: T) -> Result<(), PushError<T>> {
        {
            let mut state = self.0.lock();
            if state.receiver_gone {
                return Err(PushError::Closed(item));
            }
            if state.items.len() >= self.0.capacity {
                return Err(PushError::Full(item));
            }
            state.items.push_back(item);
        }
        self.0.readable.notify_one();
        Ok(())
    }

    /// Waits for room; `Err` gives the item back when the receiver is gone. Dropping the
    /// future drops the item.
    pub async fn push(&self, mut item: T) -> Result<(), T> {
        loop {
            match self.try_push(item) {
                Ok(()) => return Ok(()),
                Err(PushError::Closed(back)) => return Err(back),
                Err(PushError::Full(back)) => item = back,
            }
            self.0.writable.notified().await;
        }
    }

    /// Ends the queue: the receiver gets what is queued, then `end`.
    pub fn close(self, end: E) {
        self.0.lock().end = Some(end);
        // Drop marks the sender gone and wakes the receiver.
    }
}

impl<T, E> Drop for Sender<T, E> {
    fn drop(&mut self) {
        self.0.lock().sender_gone = true;
        self.0.readable.notify_one();
    }
}

pub struct Receiver<T, E>(Arc<Shared<T, E>>);

/// What the receiver got.
pub enum Next<T, E> {
    Item(T),
    /// The sender is gone and nothing is queued; what it left, if it closed the queue.
    End(Option<E>),
}

impl<T, E> Receiver<T, E> {
    pub async fn next(&mut self) -> Next<T, E> {
        loop {
            {
                let mut state = self.0.lock();
                if let Some(item) = state.items.pop_front() {
                    drop(state);
                    self.0.writable.notify_one();
                    return Next::Item(item);
                }
                if state.sender_gone {
                    return Next::End(state.end.take());
                }
            }
            self.0.readable.notified().await;
        }
    }
}

impl<T, E> Drop for Receiver<T, E> {
    fn drop(&mut self) {
        let items = {
            let mut state = self.0.lock();
            state.receiver_gone = true;
            std::mem::take(&mut state.items)
        };
        // Dropped outside the lock: an item's drop may do anything.
        drop(items);
        self.0.writable.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn items_arrive_in_order_then_the_end_the_sender_left() {
        let (tx, mut rx) = queue::<u32, &str>(4);
        for i in 0..4 {
            tx.try_push(i).expect("room");
        }
        assert!(matches!(tx.try_push(9), Err(PushError::Full(9))), "at capacity");
        tx.close("why");
        for i in 0..4 {
            assert!(matches!(rx.next().await, Next::Item(n) if n == i));
        }
        assert!(matches!(rx.next().await, Next::End(Some("why"))));
        assert!(matches!(rx.next().await, Next::End(None)), "the end is given once");
    }

    #[tokio::test]
    async fn a_sender_dropped_without_closing_ends_with_nothing() {
        let (tx, mut rx) = queue::<u32, ()>(1);
        drop(tx);
        assert!(matches!(rx.next().await, Next::End(None)));
    }

    #[tokio::test]
    async fn a_waiting_push_gets_room_when_the_receiver_takes_an_item() {
        let (tx, mut rx) = queue::<u32, ()>(1);
        tx.try_push(1).expect("room");
        let pushing = tokio::spawn(async move {
            let pushed = tx.push(2).await;
            (pushed, tx)
        });
        tokio::task::yield_now().await;
        assert!(!pushing.is_finished(), "no room yet");
        assert!(matches!(rx.next().await, Next::Item(1)));
        let (pushed, tx) = pushing.await.expect("task");
        assert!(pushed.is_ok(), "room once one was taken");
        drop(tx);
        assert!(matches!(rx.next().await, Next::Item(2)));
        assert!(matches!(rx.next().await, Next::End(None)));
    }

    #[tokio::test]
    async fn a_waiting_receiver_wakes_for_an_item_and_for_the_end() {
        let (tx, mut rx) = queue::<u32, u8>(2);
        let reading = tokio::spawn(async move {
            let first = matches!(rx.next().await, Next::Item(7));
            let end = matches!(rx.next().await, Next::End(Some(3)));
            (first, end)
        });
        tokio::task::yield_now().await;
        tx.try_push(7).expect("room");
        tokio::task::yield_now().await;
        tx.close(3);
        assert_eq!(reading.await.expect("task"), (true, true));
    }

    #[tokio::test]
    async fn once_the_receiver_is_gone_pushes_fail_and_a_waiting_push_returns() {
        let (tx, rx) = queue::<String, ()>(1);
        tx.try_push("a".into()).expect("room");
        let pushing = tokio::spawn(async move { tx.push("b".into()).await });
        tokio::task::yield_now().await;
        drop(rx);
        assert_eq!(
            pushing.await.expect("task"),
            Err("b".to_string()),
            "the item comes back"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn across_threads_every_item_arrives_once_in_order() {
        let (tx, mut rx) = queue::<u32, u32>(3);
        let producer = tokio::spawn(async move {
            for i in 0..20_000 {
                if i % 7 == 0 {
                    tokio::task::yield_now().await;
                }
                tx.push(i).await.expect("the receiver reads to the end");
            }
            tx.close(20_000);
        });
        let mut expected = 0;
        let end = loop {
            match rx.next().await {
                Next::Item(i) => {
                    assert_eq!(i, expected, "in order, none lost or doubled");
                    expected += 1;
                    if i % 5 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                Next::End(end) => break end,
            }
        };
        assert_eq!((expected, end), (20_000, Some(20_000)));
        producer.await.expect("producer");
    }

    #[test]
    fn an_empty_queue_holds_no_item_memory() {
        let (tx, rx) = queue::<[u8; 48], ()>(16);
        assert_eq!(rx.0.lock().items.capacity(), 0, "nothing until an item is queued");
        tx.try_push([0; 48]).expect("room");
        assert!(rx.0.lock().items.capacity() < 16, "grows with what is queued");
    }
}
