//! The open requests of one WebSocket, keyed by client id: each reads a stream this
//! instance holds (a reader attached in the registry) or, for a `resume` of one another
//! instance runs, its shared copy in Redis (looked up first, inside the request's own
//! stream, so the socket's loop never waits on Redis). All are polled together by the
//! socket's one task and removed by id. Removing one (or dropping the socket) detaches the
//! reader; the stream itself runs on in the registry until it ends, is cancelled, or stays
//! detached too long.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::StreamExt;

use crate::shared::replay::SharedReplay;
use crate::transport::error::ErrorReply;
use crate::transport::native::{ServerMessage, StreamCode};
use crate::transport::replay::{Event, Read, Resume};
use crate::transport::streams::remote::{self, Denied};
use crate::transport::streams::{gap_error, Attached, Refused, Stop, Stream};

/// What one request produced next.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Event(u64, Event),
    /// The reader fell behind the replay buffer; `first` is the oldest seq held.
    Gap {
        first: u64,
    },
    /// A message to send as it is: a remote resume's `accepted` or the error refusing it, or
    /// the answer to a remote request's `cancel`.
    Reply(Box<ServerMessage>),
}

/// What the reads of one request yield.
enum Next {
    Read(Read),
    /// A remote resume was accepted: the stream's request id, and the `accepted` to send.
    Opened {
        request_id: String,
        accepted: ServerMessage,
    },
    /// The request's last message (a refusal, or a cancel's answer): the request ends.
    Last(ServerMessage),
}

/// Where a request's stream runs.
enum Source {
    Local(Arc<Stream>),
    Remote(Remote),
    /// A remote request's cancel is under way; its answer ends the request.
    Cancelling,
}

/// A stream another instance runs, as the client named it.
#[derive(Clone)]
struct Remote {
    shared: Arc<SharedReplay>,
    stream: String,
    token: String,
}

struct Entry {
    id: String,
    /// The stream's request id (the `id` inside its stored events); empty until a remote
    /// resume is accepted.
    request_id: String,
    source: Source,
    reads: BoxStream<'static, Next>,
}

/// What a `cancel` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    /// The stream, held here, was stopped at once.
    Stopped,
    /// The stream runs elsewhere: its cancel is under way, and its answer comes as an item.
    Pending,
    /// No open request has that id (it finished, crossing the cancel).
    Unknown,
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
    /// Open requests, remote resumes still being looked up included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn contains(&self, id: &str) -> bool {
        self.entries.iter().any(|e| e.id == id)
    }

    pub fn insert(&mut self, id: String, attached: Attached) {
        let stream = Arc::clone(&attached.stream);
        let reads = futures::stream::unfold(
            attached,
            |mut a| async move { Some((Next::Read(a.reader.next().await), a)) },
        );
        self.entries.push(Entry {
            id,
            request_id: stream.request_id.clone(),
            source: Source::Local(stream),
            reads: reads.boxed(),
        });
    }

    /// Resumes `stream`, which this instance does not hold, from its shared copy: looked up,
    /// its token and `after` checked as for a local stream, then read after `after`. The
    /// answer (`accepted` or the refusal) comes as an item, followed by the events.
    pub fn insert_remote(&mut self, id: String, shared: Arc<SharedReplay>, stream: String, token: String, after: u64) {
        let remote = Remote { shared, stream, token };
        let reads = remote_reads(id.clone(), remote.clone(), after);
        self.entries.push(Entry {
            id,
            request_id: String::new(),
            source: Source::Remote(remote),
            reads,
        });
    }

    /// Cancels request `id`. A stream held here stops at once and is forgotten; a remote one
    /// drops its reader at once and asks its owner to cancel it (as a `DELETE` does), the
    /// request ending with that answer.
    pub fn cancel(&mut self, id: &str) -> Cancel {
        let Some(i) = self.entries.iter().position(|e| e.id == id) else {
            return Cancel::Unknown;
        };
        let entry = &mut self.entries[i];
        match std::mem::replace(&mut entry.source, Source::Cancelling) {
            Source::Local(stream) => {
                self.entries.swap_remove(i);
                stream.stop(Stop::Cancelled);
                Cancel::Stopped
            }
            Source::Remote(remote) => {
                let id = entry.id.clone();
                let answer = async move {
                    let cancelled = remote::cancel_checked(&remote.shared, &remote.stream, Some(&remote.token)).await;
                    Next::Last(match cancelled {
                        Ok(()) => ServerMessage::Cancelled { id },
                        Err(denied) => denied_message(id, denied),
                    })
                };
                entry.reads = futures::stream::once(answer).boxed();
                Cancel::Pending
            }
            Source::Cancelling => Cancel::Pending,
        }
    }

    /// The next item from any request, with the stream's request id. A terminal event, a
    /// gap, a last message or the end removes the request; the end alone is not reported (a
    /// resume after the terminal event has nothing more to say). Never ready while there
    /// are none.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<(String, String, Item)> {
        let mut k = 0;
        while k < self.entries.len() {
            let n = self.entries.len();
            let i = (self.next + k) % n;
            let entry = &mut self.entries[i];
            match entry.reads.poll_next_unpin(cx) {
                Poll::Ready(Some(Next::Read(Read::Event(seq, event)))) => {
                    let ids = (entry.id.clone(), entry.request_id.clone());
                    if event.terminal {
                        self.entries.swap_remove(i);
                        self.next = i;
                    } else {
                        self.next = i + 1;
                    }
                    return Poll::Ready((ids.0, ids.1, Item::Event(seq, event)));
                }
                Poll::Ready(Some(Next::Read(Read::Gap { first }))) => {
                    let entry = self.entries.swap_remove(i);
                    self.next = i;
                    return Poll::Ready((entry.id, entry.request_id, Item::Gap { first }));
                }
                Poll::Ready(Some(Next::Opened { request_id, accepted })) => {
                    entry.request_id = request_id;
                    self.next = i + 1;
                    return Poll::Ready((
                        entry.id.clone(),
                        entry.request_id.clone(),
                        Item::Reply(Box::new(accepted)),
                    ));
                }
                Poll::Ready(Some(Next::Last(message))) => {
                    let entry = self.entries.swap_remove(i);
                    self.next = i;
                    return Poll::Ready((entry.id, entry.request_id, Item::Reply(Box::new(message))));
                }
                Poll::Ready(Some(Next::Read(Read::End)) | None) => {
                    self.entries.swap_remove(i);
                    // The entry now at `i` has not been polled yet: look at it next.
                }
                Poll::Pending => k += 1,
            }
        }
        Poll::Pending
    }

    /// `poll_next` as a future, for the tests (the session polls it beside its other inputs).
    #[cfg(test)]
    pub fn next(&mut self) -> impl std::future::Future<Output = (String, String, Item)> + '_ {
        std::future::poll_fn(|cx| self.poll_next(cx))
    }
}

/// A remote resume as the request's reads: the lookup and checks (the same answers as a
/// local resume), then `accepted` and every event after `after` from Redis.
fn remote_reads(id: String, remote: Remote, after: u64) -> BoxStream<'static, Next> {
    let reads = async_stream::stream! {
        let Remote { shared, stream, token } = remote;
        let (record, resume) = match remote::check_resume(&shared, &stream, Some(&token), after).await {
            Ok(found) => found,
            Err(denied) => {
                yield Next::Last(denied_message(id, denied));
                return;
            }
        };
        match resume {
            Resume::Ok | Resume::Finished => {}
            Resume::Gap { first } => {
                yield Next::Last(gap_error(Some(id), first));
                return;
            }
            Resume::Ahead { last } => {
                yield Next::Last(ahead(Some(id), after, last));
                return;
            }
        }
        let accepted = ServerMessage::Accepted { id: id.clone(), stream: stream.clone(), token };
        yield Next::Opened { request_id: record.request_id, accepted };
        if resume == Resume::Finished {
            // The client already has the terminal event: nothing follows `accepted`.
            return;
        }
        let mut reader = shared.reader(&stream, after);
        loop {
            let read = reader.next().await;
            let more = match &read {
                Read::Event(_, event) => !event.terminal,
                Read::Gap { .. } => false,
                // Before the terminal event: Redis stopped answering, or the record went away
                // with its owner. An SSE reader's response ends and it reconnects; a socket's
                // request must say so, or the client would wait on it forever.
                Read::End => {
                    yield Next::Last(stopped_reading(id));
                    return;
                }
            };
            yield Next::Read(read);
            if !more {
                return;
            }
        }
    };
    reads.boxed()
}

/// The error refusing a `resume` of a stream that cannot be read.
pub fn refusal(id: Option<String>, refused: Refused) -> ServerMessage {
    let (code, message) = match refused {
        Refused::NotFound => (StreamCode::NotFound, "no such stream"),
        Refused::Gone => (StreamCode::Gone, "this stream ended and expired"),
        Refused::Forbidden => (StreamCode::Forbidden, "the stream's token is wrong"),
    };
    ServerMessage::stream_error(id, code, message)
}

/// The error refusing a `resume` from beyond the stream's newest event.
pub fn ahead(id: Option<String>, after: u64, last: u64) -> ServerMessage {
    let reply = ErrorReply::bad_request(format!("after {after} is beyond this stream's newest event ({last})"));
    ServerMessage::from_reply(id, &reply)
}

/// The end of a remote read before the stream's terminal event: resume again to go on.
fn stopped_reading(id: String) -> ServerMessage {
    let reply = ErrorReply {
        message: "reading this stream from shared state stopped (Redis did not answer, or its owner went away); resume after the last seq received".into(),
        ..remote::unreachable()
    };
    ServerMessage::from_reply(Some(id), &reply)
}

/// A refusal, or `unavailable` (retry shortly) when Redis did not answer.
fn denied_message(id: String, denied: Denied) -> ServerMessage {
    match denied {
        Denied::Refused(refused) => refusal(Some(id), refused),
        Denied::Unreachable => ServerMessage::from_reply(Some(id), &remote::unreachable()),
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
            StreamEvent::Start(Box::default()),
            StreamEvent::TextDelta("x".into()),
            StreamEvent::Finish {
                reason: FinishReason::Stop,
                envelope: Box::new(Envelope::default()),
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
    async fn cancel_stops_a_local_stream_at_once_and_forgets_it() {
        let registry = registry();
        let permits = Arc::new(Semaphore::new(1));
        let permit = permits.clone().try_acquire_owned().expect("permit");
        let stream = registry
            .open(Box::pin(stream::pending()), "req_a".into(), permit)
            .expect("room");
        let mut set = RequestStreams::default();
        set.insert("a".into(), stream.attach(0));
        assert!(set.contains("a"), "inserted");
        // The stream's task must be running to see the stop.
        tokio::task::yield_now().await;
        assert_eq!(set.cancel("a"), Cancel::Stopped, "a stream held here stops at once");
        assert_eq!(set.cancel("a"), Cancel::Unknown, "cancelling twice finds nothing");
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert!(stream.replay.finished(), "the stream was stopped");
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(
            set.poll_next(&mut cx).is_pending(),
            "no requests, no events, no busy loop"
        );
    }

    /// Two instances' registries on one Redis (`shared::testkit`).
    fn two_instances(redis: &crate::shared::testkit::RedisServer) -> (Arc<Registry>, Arc<Registry>) {
        let config = crate::config::StateConfig {
            redis_url: Some(redis.url()),
            op_timeout: Duration::from_secs(2),
            ..crate::config::StateConfig::default()
        };
        let (one, two) = (registry(), registry());
        one.share(crate::shared::testkit::shared(redis, "one"), &config);
        two.share(crate::shared::testkit::shared(redis, "two"), &config);
        (one, two)
    }

    /// Waits (bounded) until Redis holds stream `id`'s record: the owner writes it through a queue.
    async fn in_redis(shared: &SharedReplay, id: &str) {
        for _ in 0..200 {
            if let crate::shared::replay::Lookup::Found(_) = shared.lookup(id).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Opens `answer()` on `registry` and waits (bounded) until Redis holds it to the end.
    async fn finished_in_redis(registry: &Arc<Registry>, other: &Arc<Registry>) -> Arc<Stream> {
        let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().expect("permit");
        let stream = registry.open(answer(), "req_remote".into(), permit).expect("room");
        let shared = other.remote().expect("shared");
        for _ in 0..200 {
            if let crate::shared::replay::Lookup::Found(r) = shared.lookup(&stream.id).await {
                if r.terminal == Some(3) && r.last == Some(3) {
                    return stream;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the stream never reached Redis");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_remote_resume_waits_on_redis_without_holding_up_the_other_requests() {
        let redis = crate::shared::testkit::RedisServer::start();
        let (one, two) = two_instances(&redis);
        let remote = finished_in_redis(&one, &two).await;
        let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().expect("permit");
        let local = two.open(answer(), "req_local".into(), permit).expect("room");
        let mut set = RequestStreams::default();
        // Redis answers no one for a while: the lookup waits, the local request does not.
        assert!(redis.command("CLIENT PAUSE 1000 ALL").starts_with("+OK"));
        let shared = Arc::clone(two.remote().expect("shared"));
        set.insert_remote("r".into(), shared, remote.id.clone(), remote.token().into(), 1);
        set.insert("l".into(), local.attach(0));
        assert_eq!(set.len(), 2, "a pending lookup counts as an open request");
        let mut seen = Vec::new();
        while set.len() > 0 {
            let (id, request_id, item) = set.next().await;
            seen.push(match item {
                Item::Event(seq, _) => format!("{id}{seq} {request_id}"),
                Item::Reply(m) => format!("{id} {}", m.name()),
                Item::Gap { first } => format!("{id} gap {first}"),
            });
        }
        assert_eq!(
            seen,
            [
                "l1 req_local",
                "l2 req_local",
                "l3 req_local",
                "r accepted",
                "r2 req_remote",
                "r3 req_remote"
            ],
            "the local request is served while the lookup waits; the remote one then reads after 1"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_remote_resume_is_refused_as_a_local_one_and_cancel_tells_the_owner() {
        let redis = crate::shared::testkit::RedisServer::start();
        let (one, two) = two_instances(&redis);
        let done = finished_in_redis(&one, &two).await;
        let shared = Arc::clone(two.remote().expect("shared"));
        let mut set = RequestStreams::default();
        set.insert_remote("bad".into(), shared.clone(), done.id.clone(), "wrong".into(), 0);
        set.insert_remote("unknown".into(), shared.clone(), "st_nope".into(), "t".into(), 0);
        set.insert_remote("ahead".into(), shared.clone(), done.id.clone(), done.token().into(), 9);
        let mut answers = Vec::new();
        for _ in 0..3 {
            let (id, _, item) = set.next().await;
            let Item::Reply(m) = item else {
                panic!("a refusal for {id}: {item:?}")
            };
            let v: serde_json::Value = serde_json::from_str(&m.to_json()).expect("JSON");
            answers.push((
                id,
                v["code"]
                    .as_str()
                    .or(v["class"].as_str())
                    .unwrap_or_default()
                    .to_string(),
            ));
        }
        answers.sort();
        assert_eq!(
            answers,
            [
                ("ahead".to_string(), "bad_request".to_string()),
                ("bad".to_string(), "forbidden".to_string()),
                ("unknown".to_string(), "not_found".to_string())
            ],
            "the answers of a local resume"
        );
        assert_eq!(set.len(), 0, "a refusal ends the request");

        let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().expect("permit");
        let running = one
            .open(Box::pin(stream::pending()), "req_running".into(), permit)
            .expect("room");
        let _reader = running.attach(0);
        in_redis(&shared, &running.id).await;
        set.insert_remote("c".into(), shared, running.id.clone(), running.token().into(), 0);
        assert_eq!(set.cancel("c"), Cancel::Pending, "the owner is told through Redis");
        let (id, _, item) = set.next().await;
        assert_eq!(
            (id.as_str(), item),
            ("c", Item::Reply(Box::new(ServerMessage::Cancelled { id: "c".into() }))),
            "confirmed once the cancel is flagged"
        );
        assert_eq!(set.len(), 0);
        for _ in 0..100 {
            if running.replay.finished() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the owner never stopped the stream");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_remote_read_that_loses_redis_ends_with_an_unavailable_error() {
        let mut redis = crate::shared::testkit::RedisServer::start();
        let (one, two) = two_instances(&redis);
        let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().expect("permit");
        let events = stream::iter(vec![StreamEvent::Start(Box::default())]).chain(stream::pending());
        let running = one.open(Box::pin(events), "req_r".into(), permit).expect("room");
        let _reader = running.attach(0);
        let shared = Arc::clone(two.remote().expect("shared"));
        in_redis(&shared, &running.id).await;
        let mut set = RequestStreams::default();
        set.insert_remote("r".into(), shared, running.id.clone(), running.token().into(), 0);
        let (_, _, item) = set.next().await;
        assert!(matches!(&item, Item::Reply(m) if m.name() == "accepted"), "{item:?}");
        let (_, _, item) = set.next().await;
        assert!(matches!(item, Item::Event(1, _)), "{item:?}");
        redis.kill();
        // Bounded: three failed read rounds end the reader.
        let (id, _, item) = tokio::time::timeout(Duration::from_secs(30), set.next())
            .await
            .expect("the request ends, rather than going quiet");
        let Item::Reply(m) = item else {
            panic!("an error, not {item:?}")
        };
        let v: serde_json::Value = serde_json::from_str(&m.to_json()).expect("JSON");
        assert_eq!(
            (id.as_str(), &v["type"], &v["class"], &v["retry_after_ms"]),
            (
                "r",
                &serde_json::json!("error"),
                &serde_json::json!("unavailable"),
                &serde_json::json!(1000)
            ),
            "the request ends saying so, rather than going quiet: {v}"
        );
        assert_eq!(set.len(), 0);
    }
}
