//! The open requests of one WebSocket, keyed by client id: each is a reader attached to a
//! registered stream, polled together by the socket's one task and removed by id. Removing
//! one (or dropping the socket) detaches the reader; the stream itself runs on in the
//! registry until it ends, is cancelled, or stays detached too long.

use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::StreamExt;

use crate::transport::replay::{Event, Read};
use crate::transport::streams::{Attached, Stream};

/// What one request produced next.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Event(u64, Event),
    /// The reader fell behind the replay buffer; `first` is the oldest seq held.
    Gap {
        first: u64,
    },
}

struct Entry {
    id: String,
    stream: Arc<Stream>,
    reads: BoxStream<'static, Read>,
}

/// A small keyed set of readers. Linear scans are fine: a socket has a few dozen requests
/// at most. Polling starts after the last reader that yielded, so one chatty stream cannot
/// starve the others.
#[derive(Default)]
pub struct RequestStreams {
    entries: Vec<Entry>,
    next: usize,
}

impl RequestStreams {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn contains(&self, id: &str) -> bool {
        self.entries.iter().any(|e| e.id == id)
    }

    pub fn insert(&mut self, id: String, attached: Attached) {
        let stream = Arc::clone(&attached.stream);
        let reads = futures::stream::unfold(attached, |mut a| async move { Some((a.reader.next().await, a)) });
        self.entries.push(Entry {
            id,
            stream,
            reads: reads.boxed(),
        });
    }

    /// Detaches the request's reader; returns its stream so the caller may stop it.
    pub fn remove(&mut self, id: &str) -> Option<Arc<Stream>> {
        let i = self.entries.iter().position(|e| e.id == id)?;
        Some(self.entries.swap_remove(i).stream)
    }

    /// The next item from any request, with the stream's request id. A terminal event, a
    /// gap or the end removes the request; the end alone is not reported (a resume after
    /// the terminal event has nothing more to say). Never ready while there are none.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<(String, String, Item)> {
        let mut k = 0;
        while k < self.entries.len() {
            let n = self.entries.len();
            let i = (self.next + k) % n;
            let entry = &mut self.entries[i];
            match entry.reads.poll_next_unpin(cx) {
                Poll::Ready(Some(Read::Event(seq, event))) => {
                    let ids = (entry.id.clone(), entry.stream.request_id.clone());
                    if event.terminal {
                        self.entries.swap_remove(i);
                        self.next = i;
                    } else {
                        self.next = i + 1;
                    }
                    return Poll::Ready((ids.0, ids.1, Item::Event(seq, event)));
                }
                Poll::Ready(Some(Read::Gap { first })) => {
                    let entry = self.entries.swap_remove(i);
                    self.next = i;
                    return Poll::Ready((entry.id, entry.stream.request_id.clone(), Item::Gap { first }));
                }
                Poll::Ready(Some(Read::End) | None) => {
                    self.entries.swap_remove(i);
                    // The entry now at `i` has not been polled yet: look at it next.
                }
                Poll::Pending => k += 1,
            }
        }
        Poll::Pending
    }

    pub fn next(&mut self) -> impl Future<Output = (String, String, Item)> + '_ {
        poll_fn(|cx| self.poll_next(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StreamsConfig;
    use crate::transport::streams::Registry;
    use crate::types::{Envelope, EventStream, FinishReason, StreamEvent};
    use futures::stream;
    use std::time::Duration;
    use tokio::sync::Semaphore;

    fn answer() -> EventStream {
        Box::pin(stream::iter(vec![
            StreamEvent::Start(Envelope::default()),
            StreamEvent::TextDelta("x".into()),
            StreamEvent::Finish {
                reason: FinishReason::Stop,
                envelope: Envelope::default(),
            },
        ]))
    }

    fn registry() -> Arc<Registry> {
        Arc::new(Registry::new(StreamsConfig {
            max_open: 10,
            max_events: 100,
            max_bytes: 1 << 20,
            keep_after_done: Duration::from_secs(60),
            detached_cancel: Duration::from_secs(30),
            retry: Duration::from_secs(1),
        }))
    }

    #[tokio::test]
    async fn requests_interleave_fairly_and_a_terminal_event_removes_one() {
        let registry = registry();
        let permits = Arc::new(Semaphore::new(2));
        let mut set = RequestStreams::default();
        for id in ["a", "b"] {
            let permit = permits.clone().try_acquire_owned().expect("permit");
            let stream = registry.open(answer(), format!("req_{id}"), permit).expect("room");
            set.insert(id.to_string(), stream.attach(0));
        }
        let mut seen = Vec::new();
        for _ in 0..6 {
            let (id, request_id, item) = set.next().await;
            assert_eq!(request_id, format!("req_{id}"), "the stream's request id comes along");
            if let Item::Event(seq, _) = item {
                seen.push(format!("{id}{seq}"));
            }
        }
        assert_eq!(seen, vec!["a1", "b1", "a2", "b2", "a3", "b3"], "round robin");
        assert_eq!(set.len(), 0, "done removes each request");
    }

    #[tokio::test]
    async fn remove_detaches_and_returns_the_stream() {
        let registry = registry();
        let permits = Arc::new(Semaphore::new(1));
        let permit = permits.clone().try_acquire_owned().expect("permit");
        let stream = registry
            .open(Box::pin(stream::pending()), "req_a".into(), permit)
            .expect("room");
        let mut set = RequestStreams::default();
        set.insert("a".into(), stream.attach(0));
        assert!(set.contains("a"), "inserted");
        assert_eq!(
            set.remove("a").map(|s| s.id.clone()),
            Some(stream.id.clone()),
            "its stream"
        );
        assert!(set.remove("a").is_none(), "removing twice finds nothing");
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(
            set.poll_next(&mut cx).is_pending(),
            "no requests, no events, no busy loop"
        );
    }
}
