//! One WebSocket's session: a single loop that reads client frames, pulls events from every
//! open request, and pings the client, writing through a bounded queue.
//!
//! Why one loop and no task per request: every request stream is owned here, so a cancel
//! drops that stream on the spot and the end of the session drops them all, which closes
//! their upstream connections. Outgoing messages go into a queue of fixed size; when a
//! client stops reading and the queue fills, the session ends with 1013 instead of
//! buffering without bound.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{close_code, CloseFrame, Message};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use super::protocol::{self, ClientMessage};
use super::streams::RequestStreams;
use crate::gateway::GatewayError;
use crate::transport::error::ErrorReply;
use crate::transport::native::{ChatOptions, ServerMessage};
use crate::transport::openai::decode_value;
use crate::types::{ChatRequest, Dialect, EventStream, RequestCtx, StreamEvent};

/// Concurrent requests one socket may have open.
pub const MAX_REQUESTS_PER_SOCKET: usize = 32;
/// Pings a client may leave unanswered before it is closed.
const MAX_MISSED_PONGS: u32 = 2;
/// The shortest ping interval honoured.
const MIN_PING_INTERVAL: Duration = Duration::from_millis(100);

/// What to do after handling one input.
enum Step {
    Continue,
    /// End the session, telling the client why when there is a reason to give.
    End(Option<CloseFrame>),
}

pub struct Session<F> {
    chat: F,
    /// The context from the upgrade request's headers; each request starts from a copy.
    base: RequestCtx,
    streams: RequestStreams,
    permits: Arc<Semaphore>,
    out: mpsc::Sender<Message>,
    max_requests: usize,
    missed_pongs: u32,
}

impl<F> Session<F>
where
    F: FnMut(ChatRequest, RequestCtx) -> Result<EventStream, GatewayError> + Send,
{
    pub fn new(chat: F, base: RequestCtx, permits: Arc<Semaphore>, out: mpsc::Sender<Message>) -> Self {
        Session {
            chat,
            base,
            streams: RequestStreams::default(),
            permits,
            out,
            max_requests: MAX_REQUESTS_PER_SOCKET,
            missed_pongs: 0,
        }
    }

    /// Runs until the client goes away or the session must close; returns the close frame
    /// to send, if any. Returning drops every open request.
    pub async fn run<S>(mut self, mut incoming: S, ping_every: Duration) -> Option<CloseFrame>
    where
        S: Stream<Item = Result<Message, axum::Error>> + Unpin,
    {
        // A zero interval from configuration would panic the timer.
        let ping_every = ping_every.max(MIN_PING_INTERVAL);
        let mut ping = interval_at(Instant::now() + ping_every, ping_every);
        ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let step = tokio::select! {
                frame = incoming.next() => self.on_frame(frame),
                (id, event) = self.streams.next() => self.on_event(&id, event),
                _ = ping.tick() => self.on_ping_tick(),
            };
            if let Step::End(close) = step {
                return close;
            }
        }
    }

    fn on_frame(&mut self, frame: Option<Result<Message, axum::Error>>) -> Step {
        match frame {
            None | Some(Ok(Message::Close(_))) => Step::End(None),
            Some(Err(ref e)) if is_too_big(e) => Step::End(Some(close(close_code::SIZE, "message too big"))),
            Some(Err(_)) => Step::End(None),
            Some(Ok(Message::Text(text))) => self.on_text(text.as_str()),
            Some(Ok(Message::Binary(_))) => self.send_error(
                None,
                ErrorReply::bad_request("binary frames are not supported; send JSON text frames"),
            ),
            Some(Ok(Message::Pong(_))) => {
                self.missed_pongs = 0;
                Step::Continue
            }
            // Pings are answered by the WebSocket layer itself.
            Some(Ok(Message::Ping(_))) => Step::Continue,
        }
    }

    fn on_text(&mut self, text: &str) -> Step {
        match protocol::parse(text) {
            Ok(ClientMessage::Chat { id, request, options }) => self.start(id, request, options),
            Ok(ClientMessage::Cancel { id }) => {
                // Cancelling an id that already finished is not an error: the two crossed.
                if self.streams.remove(&id) {
                    self.send(&ServerMessage::Cancelled { id })
                } else {
                    Step::Continue
                }
            }
            Err(e) => self.send_error(e.id, ErrorReply::bad_request(e.message)),
        }
    }

    fn start(&mut self, id: String, request: serde_json::Value, options: ChatOptions) -> Step {
        if self.streams.contains(&id) {
            let reply = ErrorReply::bad_request(format!("request id {id:?} is already active on this connection"));
            return self.send_error(Some(id), reply);
        }
        if self.streams.len() >= self.max_requests {
            let reply = ErrorReply {
                message: format!("at most {} concurrent requests per connection", self.max_requests),
                ..ErrorReply::busy()
            };
            return self.send_error(Some(id), reply);
        }
        let mut req = match decode_value(request) {
            Ok(req) => req,
            Err(e) => return self.send_error(Some(id), e.into()),
        };
        req.stream = true;
        req.include_usage = true;
        let mut ctx = RequestCtx {
            request_id: RequestCtx::new(Dialect::Native).request_id,
            ..self.base.clone()
        };
        if let Err(e) = options.apply(&mut ctx) {
            return self.send_error(Some(id), e.into());
        }
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return self.send_error(Some(id), ErrorReply::busy());
        };
        match (self.chat)(req, ctx) {
            Ok(events) => {
                self.streams.insert(id, events, permit);
                Step::Continue
            }
            Err(e) => self.send(&ServerMessage::from_gateway(Some(id), &e)),
        }
    }

    fn on_event(&mut self, id: &str, event: Option<StreamEvent>) -> Step {
        let Some(event) = event else {
            let reply = ErrorReply::broken_stream("ended without a finish", None);
            return self.send_error(Some(id.to_string()), reply);
        };
        let (message, terminal) = ServerMessage::from_event(id, event);
        if terminal {
            self.streams.remove(id);
        }
        self.send(&message)
    }

    fn on_ping_tick(&mut self) -> Step {
        if self.missed_pongs >= MAX_MISSED_PONGS {
            return Step::End(Some(close(close_code::POLICY, "no pong for two pings")));
        }
        self.missed_pongs += 1;
        self.enqueue(Message::Ping(Default::default()))
    }

    fn send_error(&mut self, id: Option<String>, reply: ErrorReply) -> Step {
        self.send(&ServerMessage::from_reply(id, &reply))
    }

    fn send(&mut self, message: &ServerMessage) -> Step {
        self.enqueue(Message::Text(message.to_json().into()))
    }

    fn enqueue(&mut self, message: Message) -> Step {
        match self.out.try_send(message) {
            Ok(()) => Step::Continue,
            Err(TrySendError::Full(_)) => Step::End(Some(close(close_code::AGAIN, "client too slow"))),
            Err(TrySendError::Closed(_)) => Step::End(None),
        }
    }
}

fn close(code: u16, reason: &'static str) -> CloseFrame {
    CloseFrame {
        code,
        reason: reason.into(),
    }
}

/// A frame over `max_message_size` / `max_frame_size` (close code 1009).
fn is_too_big(e: &axum::Error) -> bool {
    use tokio_tungstenite::tungstenite::Error as WsError;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(WsError::Capacity(_)) = err.downcast_ref::<WsError>() {
            return true;
        }
        source = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Envelope, FinishReason};
    use futures::stream;
    use serde_json::{json, Value};
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::task::JoinHandle;

    const PING_EVERY: Duration = Duration::from_secs(10);

    struct Harness {
        to_session: mpsc::Sender<Result<Message, axum::Error>>,
        from_session: mpsc::Receiver<Message>,
        session: JoinHandle<Option<CloseFrame>>,
        permits: Arc<Semaphore>,
    }

    impl Harness {
        /// `scripts` maps a request's model name to the event stream the gateway returns.
        fn start<M: Into<String>>(scripts: Vec<(M, EventStream)>, queue: usize, permits: usize) -> Harness {
            let mut scripts: HashMap<String, EventStream> = scripts.into_iter().map(|(m, s)| (m.into(), s)).collect();
            let chat = move |req: ChatRequest, _ctx: RequestCtx| {
                scripts.remove(&req.model).ok_or(GatewayError::UnknownModel {
                    model: req.model.clone(),
                    known: vec!["a".into()],
                })
            };
            let (to_session, rx_in) = mpsc::channel(16);
            let incoming = Box::pin(stream::unfold(rx_in, |mut rx| async move {
                rx.recv().await.map(|m| (m, rx))
            }));
            let (out, from_session) = mpsc::channel(queue);
            let permits = Arc::new(Semaphore::new(permits));
            let session = Session::new(chat, RequestCtx::new(Dialect::Native), permits.clone(), out);
            let session = tokio::spawn(session.run(incoming, PING_EVERY));
            Harness {
                to_session,
                from_session,
                session,
                permits,
            }
        }

        async fn send(&self, v: Value) {
            self.send_text(v.to_string()).await;
        }

        async fn send_text(&self, text: String) {
            self.to_session
                .send(Ok(Message::Text(text.into())))
                .await
                .expect("session is running");
        }

        async fn recv(&mut self) -> Value {
            match self.from_session.recv().await {
                Some(Message::Text(t)) => serde_json::from_str(t.as_str()).expect("server sends JSON"),
                other => panic!("expected a text message, got {other:?}"),
            }
        }
    }

    fn chat(id: &str, model: &str) -> Value {
        json!({"type": "chat", "id": id, "request": {"model": model, "messages": [{"role": "user", "content": "hi"}]}})
    }

    fn answer(text: &str) -> EventStream {
        Box::pin(stream::iter(vec![
            StreamEvent::Start(Envelope {
                route: Some("r1".into()),
                ..Envelope::default()
            }),
            StreamEvent::TextDelta(text.to_string()),
            StreamEvent::Finish {
                reason: FinishReason::Stop,
                envelope: Envelope::default(),
            },
        ]))
    }

    /// Starts, then never ends; sets the flag when dropped.
    fn endless(dropped: Arc<AtomicBool>) -> EventStream {
        struct OnDrop(Arc<AtomicBool>);
        impl Drop for OnDrop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let guard = OnDrop(dropped);
        let events = stream::iter(vec![StreamEvent::Start(Envelope::default())]).chain(stream::pending());
        Box::pin(events.map(move |e| {
            let _held = &guard;
            e
        }))
    }

    #[tokio::test]
    async fn a_chat_streams_start_delta_and_done_for_its_id() {
        let mut h = Harness::start(vec![("a", answer("Hello"))], 16, 4);
        h.send(chat("c1", "a")).await;
        let start = h.recv().await;
        assert_eq!(
            (&start["type"], &start["id"], &start["route"]),
            (&json!("start"), &json!("c1"), &json!("r1")),
            "start"
        );
        assert_eq!(
            h.recv().await,
            json!({"type": "delta", "id": "c1", "text": "Hello"}),
            "delta"
        );
        let done = h.recv().await;
        assert_eq!(
            (&done["type"], &done["finish_reason"]),
            (&json!("done"), &json!("stop")),
            "done"
        );
        assert_eq!(
            h.permits.available_permits(),
            4,
            "the permit is back once the request is done"
        );
    }

    #[tokio::test]
    async fn a_duplicate_active_id_is_an_error_for_that_id() {
        let dropped = Arc::new(AtomicBool::new(false));
        let mut h = Harness::start(vec![("a", endless(dropped.clone())), ("b", answer("x"))], 16, 4);
        h.send(chat("c1", "a")).await;
        assert_eq!(h.recv().await["type"], "start", "first request starts");
        h.send(chat("c1", "b")).await;
        let err = h.recv().await;
        assert_eq!(
            (&err["type"], &err["id"], &err["class"]),
            (&json!("error"), &json!("c1"), &json!("bad_request")),
            "duplicate id"
        );
        assert!(!dropped.load(Ordering::SeqCst), "the first request keeps running");
    }

    #[tokio::test]
    async fn cancel_drops_the_stream_at_once_and_frees_its_permit() {
        let dropped = Arc::new(AtomicBool::new(false));
        let mut h = Harness::start(vec![("a", endless(dropped.clone()))], 16, 1);
        h.send(chat("c1", "a")).await;
        assert_eq!(h.recv().await["type"], "start", "started");
        assert_eq!(h.permits.available_permits(), 0, "the request holds the permit");
        h.send(json!({"type": "cancel", "id": "c1"})).await;
        assert_eq!(
            h.recv().await,
            json!({"type": "cancelled", "id": "c1"}),
            "cancel is confirmed"
        );
        assert!(
            dropped.load(Ordering::SeqCst),
            "the stream was dropped, cancelling its upstream"
        );
        assert_eq!(h.permits.available_permits(), 1, "and its permit freed");
    }

    #[tokio::test]
    async fn bad_frames_get_errors_and_the_socket_stays_open() {
        let mut h = Harness::start(vec![("a", answer("ok"))], 16, 4);
        h.send_text("{not json".into()).await;
        assert_eq!(h.recv().await["class"], "bad_request", "invalid JSON");
        h.send(json!({"type": "dance", "id": "c9"})).await;
        let err = h.recv().await;
        assert_eq!(
            (&err["id"], &err["class"]),
            (&json!("c9"), &json!("bad_request")),
            "unknown type"
        );
        h.send(json!({"type": "chat", "id": "c2", "request": {"model": "a"}}))
            .await;
        assert!(
            h.recv().await["message"]
                .as_str()
                .unwrap_or_default()
                .contains("messages"),
            "invalid request"
        );
        h.send(chat("c3", "nope")).await;
        assert!(
            h.recv().await["message"]
                .as_str()
                .unwrap_or_default()
                .contains("unknown model"),
            "gateway error"
        );
        h.send(chat("c4", "a")).await;
        assert_eq!(h.recv().await["type"], "start", "the socket still serves requests");
    }

    #[tokio::test]
    async fn no_free_permit_is_an_overloaded_error() {
        let mut h = Harness::start(vec![("a", answer("x"))], 16, 0);
        h.send(chat("c1", "a")).await;
        let err = h.recv().await;
        assert_eq!(
            (&err["class"], &err["retry_after_ms"]),
            (&json!("overloaded"), &json!(1000)),
            "busy"
        );
    }

    #[tokio::test]
    async fn closing_the_socket_cancels_every_request() {
        let (d1, d2) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let mut h = Harness::start(vec![("a", endless(d1.clone())), ("b", endless(d2.clone()))], 16, 4);
        h.send(chat("c1", "a")).await;
        h.send(chat("c2", "b")).await;
        h.recv().await;
        h.recv().await;
        h.to_session
            .send(Ok(Message::Close(None)))
            .await
            .expect("session running");
        let close = h.session.await.expect("session task ends cleanly");
        assert_eq!(close.map(|c| c.code), None, "the client closed; nothing more to say");
        assert!(
            d1.load(Ordering::SeqCst) && d2.load(Ordering::SeqCst),
            "both streams were dropped"
        );
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_is_closed_as_too_slow() {
        let many: Vec<StreamEvent> = std::iter::once(StreamEvent::Start(Envelope::default()))
            .chain((0..100).map(|i| StreamEvent::TextDelta(format!("t{i}"))))
            .collect();
        let h = Harness::start(vec![("a", Box::pin(stream::iter(many)))], 4, 4);
        h.send(chat("c1", "a")).await;
        let close = h.session.await.expect("session task ends cleanly");
        assert_eq!(
            close.map(|c| c.code),
            Some(close_code::AGAIN),
            "closed with 1013 instead of buffering"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_misses_two_pongs_is_closed() {
        let mut h = Harness::start(Vec::<(String, EventStream)>::new(), 16, 4);
        let started = Instant::now();
        assert!(
            matches!(h.from_session.recv().await, Some(Message::Ping(_))),
            "first ping"
        );
        assert!(
            matches!(h.from_session.recv().await, Some(Message::Ping(_))),
            "second ping"
        );
        let close = h.session.await.expect("session task ends cleanly");
        assert_eq!(
            close.map(|c| c.code),
            Some(close_code::POLICY),
            "closed after two unanswered pings"
        );
        assert_eq!(started.elapsed(), PING_EVERY * 3, "at the third tick");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pong_keeps_the_client_alive() {
        let mut h = Harness::start(Vec::<(String, EventStream)>::new(), 16, 4);
        for _ in 0..4 {
            assert!(matches!(h.from_session.recv().await, Some(Message::Ping(_))), "ping");
            h.to_session
                .send(Ok(Message::Pong(Default::default())))
                .await
                .expect("session running");
        }
        assert!(!h.session.is_finished(), "a client that answers pings stays connected");
    }

    #[tokio::test]
    async fn too_many_requests_on_one_socket_is_an_overloaded_error() {
        let scripts: Vec<(String, EventStream)> = (0..=MAX_REQUESTS_PER_SOCKET)
            .map(|i| (format!("m{i}"), endless(Arc::new(AtomicBool::new(false)))))
            .collect();
        let mut h = Harness::start(scripts, 64, 64);
        for i in 0..MAX_REQUESTS_PER_SOCKET {
            h.send(chat(&format!("c{i}"), &format!("m{i}"))).await;
            assert_eq!(h.recv().await["type"], "start", "request {i} starts");
        }
        h.send(chat("extra", &format!("m{MAX_REQUESTS_PER_SOCKET}"))).await;
        let err = h.recv().await;
        assert_eq!(
            (&err["id"], &err["class"]),
            (&json!("extra"), &json!("overloaded")),
            "over the per-socket cap"
        );
    }
}
