//! The open requests of one WebSocket, keyed by client id: polled together by the socket's
//! one task, removed (and so cancelled) by id. Each holds its stream permit.

use std::future::{poll_fn, Future};
use std::task::{Context, Poll};

use futures::StreamExt;
use tokio::sync::OwnedSemaphorePermit;

use crate::types::{EventStream, StreamEvent};

struct Entry {
    id: String,
    events: EventStream,
    _permit: OwnedSemaphorePermit,
}

/// A small keyed set of event streams. Linear scans are fine: a socket has a few dozen
/// requests at most. Polling starts after the last stream that yielded, so one chatty
/// stream cannot starve the others.
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

    pub fn insert(&mut self, id: String, events: EventStream, permit: OwnedSemaphorePermit) {
        self.entries.push(Entry {
            id,
            events,
            _permit: permit,
        });
    }

    /// Drops the request's stream (cancelling its upstream work) and frees its permit.
    pub fn remove(&mut self, id: &str) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.id != id);
        self.entries.len() != before
    }

    /// The next event from any stream. `None` means that stream ended (it is removed).
    /// Never ready while there are no streams.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<(String, Option<StreamEvent>)> {
        let n = self.entries.len();
        for k in 0..n {
            let i = (self.next + k) % n;
            let entry = &mut self.entries[i];
            match entry.events.poll_next_unpin(cx) {
                Poll::Ready(Some(event)) => {
                    self.next = i + 1;
                    return Poll::Ready((entry.id.clone(), Some(event)));
                }
                Poll::Ready(None) => {
                    let entry = self.entries.swap_remove(i);
                    self.next = i;
                    return Poll::Ready((entry.id, None));
                }
                Poll::Pending => {}
            }
        }
        Poll::Pending
    }

    pub fn next(&mut self) -> impl Future<Output = (String, Option<StreamEvent>)> + '_ {
        poll_fn(|cx| self.poll_next(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    fn text_stream(texts: &[&str]) -> EventStream {
        let events: Vec<StreamEvent> = texts.iter().map(|t| StreamEvent::TextDelta(t.to_string())).collect();
        Box::pin(stream::iter(events))
    }

    #[tokio::test]
    async fn events_from_all_streams_are_interleaved_fairly() {
        let sem = Arc::new(Semaphore::new(4));
        let mut set = RequestStreams::default();
        set.insert(
            "a".into(),
            text_stream(&["a1", "a2"]),
            sem.clone().try_acquire_owned().expect("permit"),
        );
        set.insert(
            "b".into(),
            text_stream(&["b1", "b2"]),
            sem.clone().try_acquire_owned().expect("permit"),
        );
        let mut seen = Vec::new();
        for _ in 0..4 {
            let (id, event) = set.next().await;
            if let Some(StreamEvent::TextDelta(t)) = event {
                seen.push(format!("{id}:{t}"));
            }
        }
        assert_eq!(seen, vec!["a:a1", "b:b1", "a:a2", "b:b2"], "round robin across streams");
    }

    #[tokio::test]
    async fn an_ended_stream_is_reported_once_and_removed_with_its_permit() {
        let sem = Arc::new(Semaphore::new(1));
        let mut set = RequestStreams::default();
        set.insert(
            "a".into(),
            text_stream(&[]),
            sem.clone().try_acquire_owned().expect("permit"),
        );
        let (id, event) = set.next().await;
        assert_eq!((id.as_str(), event), ("a", None), "the end is reported");
        assert_eq!(set.len(), 0, "and the stream is gone");
        assert_eq!(sem.available_permits(), 1, "its permit is back");
    }

    #[test]
    fn remove_drops_the_stream_and_frees_the_permit() {
        let sem = Arc::new(Semaphore::new(1));
        let mut set = RequestStreams::default();
        set.insert(
            "a".into(),
            Box::pin(stream::pending()),
            sem.clone().try_acquire_owned().expect("permit"),
        );
        assert!(set.contains("a"), "inserted");
        assert!(set.remove("a"), "removed");
        assert!(!set.remove("a"), "removing twice finds nothing");
        assert_eq!(sem.available_permits(), 1, "permit returned on removal");
    }

    #[test]
    fn an_empty_set_is_never_ready() {
        let mut set = RequestStreams::default();
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(
            set.poll_next(&mut cx).is_pending(),
            "no streams, no events, no busy loop"
        );
    }
}
