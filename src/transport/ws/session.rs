//! One WebSocket's session: a single loop that reads client frames, reads every open
//! request's stream, and pings the client, writing through a bounded queue.
//!
//! Each request is registered in the stream registry, whose task drives the answer; the
//! session only holds a reader per request, so a request outlives its socket (it is
//! detached, and can be resumed on another socket) and a `cancel` stops it at once. A
//! `resume` of a stream another instance runs (`[state] redis_url`) is looked up and read
//! in Redis as one more of the socket's requests (see `streams`), never awaited here.
//!
//! Backpressure instead of buffering: the loop takes one slot of the outgoing queue before
//! it handles anything (a frame, an event, a ping), and every step sends at most one
//! message. A client that writes a burst is read at the pace it reads its answers, and
//! what exceeds its limits is answered with `overloaded` errors, one per refused frame. A
//! client whose queue stays full for two ping intervals does not read: it is closed with
//! 1013. A reader that falls behind the replay buffer gets `resume_gap` for that request.
//!
//! A `chat` that names a `session` carries only its new turn: the session's history (see
//! `history`) is projected in before it, and its answer is kept for the next turn.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{close_code, CloseFrame, Message};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::sync::mpsc::OwnedPermit;
use tokio::time::{interval_at, timeout, Instant, MissedTickBehavior};

use super::history::Histories;
use super::protocol::{self, ClientMessage};
use super::render::sequenced;
use super::streams::{ahead, refusal, Cancel, Item, RequestStreams};
use crate::gateway::GatewayError;
use crate::transport::error::ErrorReply;
use crate::transport::native::{ChatOptions, ServerMessage};
use crate::transport::openai::decode_value;
use crate::transport::replay::Resume;
use crate::transport::streams::{gap_error, Refused, Registry, Stream as Registered};
use crate::types::{ChatRequest, Dialect, EventStream, RequestCtx};

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

/// A route's context window, for projecting a session's history (tokens).
#[derive(Debug, Clone, Copy)]
pub struct RouteWindow {
    pub window: u64,
    pub max_output: u32,
    /// The answer's reserve when the request sets no `max_tokens`.
    pub default_reserve: u32,
}

impl RouteWindow {
    /// Prompt tokens the route takes for a request asking for `max_tokens`, as the router
    /// reserves the answer's room.
    fn prompt_budget(&self, max_tokens: Option<u32>) -> u64 {
        let reserve = max_tokens.unwrap_or(self.default_reserve).min(self.max_output);
        self.window.saturating_sub(u64::from(reserve))
    }
}

/// One slot in the outgoing queue, taken before a step.
type Slot = OwnedPermit<Message>;

/// Where a request gets its place at the server's stream gate: for its final priority, or
/// the refusal (busy, draining) it is answered with.
pub type Slots = Box<dyn Fn(&RequestCtx) -> Result<Box<dyn Send>, ErrorReply> + Send + Sync>;

/// Places from a bare semaphore, for the session's own tests.
#[cfg(test)]
fn semaphore_slots(permits: Arc<tokio::sync::Semaphore>) -> Slots {
    Box::new(move |_| {
        permits
            .clone()
            .try_acquire_owned()
            .map(|p| Box::new(p) as Box<dyn Send>)
            .map_err(|_| ErrorReply::busy())
    })
}

pub struct Session<F> {
    chat: F,
    /// The context from the upgrade request's headers; each request starts from a copy.
    base: RequestCtx,
    streams: RequestStreams,
    slots: Slots,
    registry: Arc<Registry>,
    out: mpsc::Sender<Message>,
    max_requests: usize,
    missed_pongs: u32,
    histories: Histories,
    /// Per client-facing model, its routes' context windows.
    windows: Arc<HashMap<String, Vec<RouteWindow>>>,
}

impl<F> Session<F>
where
    F: FnMut(ChatRequest, RequestCtx) -> Result<EventStream, GatewayError> + Send,
{
    pub fn new(chat: F, base: RequestCtx, slots: Slots, registry: Arc<Registry>, out: mpsc::Sender<Message>) -> Self {
        Session {
            chat,
            base,
            streams: RequestStreams::default(),
            slots,
            registry,
            out,
            max_requests: MAX_REQUESTS_PER_SOCKET,
            missed_pongs: 0,
            histories: Histories::default(),
            windows: Arc::default(),
        }
    }

    /// The context windows a session's history is projected for, per client-facing model.
    pub fn with_windows(mut self, windows: Arc<HashMap<String, Vec<RouteWindow>>>) -> Self {
        self.windows = windows;
        self
    }

    /// Runs until the client goes away or the session must close; returns the close frame
    /// to send, if any. Returning detaches every open request (see `detached_cancel_ms`).
    pub async fn run<S>(mut self, mut incoming: S, ping_every: Duration) -> Option<CloseFrame>
    where
        S: Stream<Item = Result<Message, axum::Error>> + Unpin,
    {
        // A zero interval from configuration would panic the timer.
        let ping_every = ping_every.max(MIN_PING_INTERVAL);
        let stalled = ping_every * MAX_MISSED_PONGS;
        let mut ping = interval_at(Instant::now() + ping_every, ping_every);
        ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let slot = match timeout(stalled, self.out.clone().reserve_owned()).await {
                Ok(Ok(slot)) => slot,
                // The writer is gone: so is the client.
                Ok(Err(_)) => return None,
                Err(_) => return Some(close(close_code::AGAIN, "client too slow")),
            };
            let step = tokio::select! {
                frame = incoming.next() => self.on_frame(frame, slot),
                (id, request_id, item) = self.streams.next() => self.on_item(&id, &request_id, item, slot),
                _ = ping.tick() => self.on_ping_tick(slot),
            };
            if let Step::End(close) = step {
                return close;
            }
        }
    }

    fn on_frame(&mut self, frame: Option<Result<Message, axum::Error>>, slot: Slot) -> Step {
        match frame {
            None | Some(Ok(Message::Close(_))) => Step::End(None),
            Some(Err(ref e)) if is_too_big(e) => Step::End(Some(close(close_code::SIZE, "message too big"))),
            Some(Err(_)) => Step::End(None),
            Some(Ok(Message::Text(text))) => self.on_text(text.as_str(), slot),
            Some(Ok(Message::Binary(_))) => send_error(
                slot,
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

    fn on_text(&mut self, text: &str, slot: Slot) -> Step {
        match protocol::parse(text) {
            Ok(ClientMessage::Chat {
                id,
                request,
                options,
                session,
            }) => self.start(id, request, options, session, slot),
            Ok(ClientMessage::Cancel { id }) => match self.streams.cancel(&id) {
                Cancel::Stopped => send(slot, &ServerMessage::Cancelled { id }),
                // A stream run elsewhere: the answer comes once its owner is told.
                Cancel::Pending => Step::Continue,
                // Cancelling an id that already finished is not an error: the two crossed.
                Cancel::Unknown => Step::Continue,
            },
            Ok(ClientMessage::Resume {
                id,
                stream,
                token,
                after,
            }) => self.resume(id, stream, token, after, slot),
            Err(e) => send_error(slot, e.id, ErrorReply::bad_request(e.message)),
        }
    }

    /// Why a new request cannot be opened under `id` on this socket, if it cannot.
    fn refuse_open(&self, id: &str) -> Option<ErrorReply> {
        if self.streams.contains(id) {
            return Some(ErrorReply::bad_request(format!(
                "request id {id:?} is already active on this connection"
            )));
        }
        if self.streams.len() >= self.max_requests {
            return Some(ErrorReply {
                message: format!("at most {} concurrent requests per connection", self.max_requests),
                ..ErrorReply::busy()
            });
        }
        None
    }

    fn start(
        &mut self,
        id: String,
        request: serde_json::Value,
        mut options: ChatOptions,
        session: Option<String>,
        slot: Slot,
    ) -> Step {
        if let Some(reply) = self.refuse_open(&id) {
            return send_error(slot, Some(id), reply);
        }
        let mut req = match decode_value(request).and_then(|req| crate::transport::tool_cost::check(&req).map(|()| req))
        {
            Ok(req) => req,
            Err(e) => return send_error(slot, Some(id), e.into()),
        };
        req.stream = true;
        req.include_usage = true;
        let mut ctx = RequestCtx {
            request_id: RequestCtx::new(Dialect::Native).request_id,
            ..self.base.clone()
        };
        // A history session is also the lease's session unless the options name another.
        if options.session.is_none() {
            options.session.clone_from(&session);
        }
        if let Err(e) = options.apply(&mut ctx) {
            return send_error(slot, Some(id), e.into());
        }
        if self.registry.is_full() {
            return send_error(slot, Some(id), ErrorReply::busy());
        }
        let permit = match (self.slots)(&ctx) {
            Ok(permit) => permit,
            Err(refused) => return send_error(slot, Some(id), refused),
        };
        let keeper = match &session {
            Some(session) => {
                let window = self
                    .windows
                    .get(&req.model)
                    .and_then(|routes| routes.iter().map(|r| r.prompt_budget(req.max_tokens)).max());
                match self.histories.project(session, &mut req, window) {
                    Ok((_, keeper)) => Some(keeper),
                    Err(refused) => return send_error(slot, Some(id), refused),
                }
            }
            None => None,
        };
        let request_id = ctx.request_id.clone();
        let events = match (self.chat)(req, ctx) {
            Ok(events) => match keeper {
                Some(keeper) => keeper.watch(events),
                None => events,
            },
            Err(e) => return send(slot, &ServerMessage::from_gateway(Some(id), &e)),
        };
        match self.registry.open(events, request_id, permit) {
            Ok(stream) => self.attach(id, &stream, 0, slot),
            Err(_) => send_error(slot, Some(id), ErrorReply::busy()),
        }
    }

    /// Resumes a stream held here at once; one another instance runs (`[state] redis_url`)
    /// is looked up in Redis as a request of its own, answered when the lookup is, so the
    /// loop goes on serving meanwhile.
    fn resume(&mut self, id: String, stream_id: String, token: String, after: u64, slot: Slot) -> Step {
        if let Some(reply) = self.refuse_open(&id) {
            return send_error(slot, Some(id), reply);
        }
        let stream = match (self.registry.find(&stream_id, Some(&token)), self.registry.remote()) {
            (Ok(stream), _) => stream,
            (Err(Refused::NotFound), Some(shared)) => {
                self.streams
                    .insert_remote(id, Arc::clone(shared), stream_id, token, after);
                return Step::Continue;
            }
            (Err(refused), _) => return send(slot, &refusal(Some(id), refused)),
        };
        match stream.replay.check_resume(after) {
            Resume::Ok | Resume::Finished => self.attach(id, &stream, after, slot),
            Resume::Gap { first } => send(slot, &gap_error(Some(id), first)),
            Resume::Ahead { last } => send(slot, &ahead(Some(id), after, last)),
        }
    }

    /// Reads `stream` from after `after` under `id`, confirmed with `accepted`.
    fn attach(&mut self, id: String, stream: &Arc<Registered>, after: u64, slot: Slot) -> Step {
        let accepted = ServerMessage::Accepted {
            id: id.clone(),
            stream: stream.id.clone(),
            token: stream.token().to_string(),
        };
        self.streams.insert(id, stream.attach(after));
        send(slot, &accepted)
    }

    fn on_item(&mut self, id: &str, request_id: &str, item: Item, slot: Slot) -> Step {
        match item {
            Item::Event(seq, event) => {
                slot.send(Message::Text(sequenced(id, request_id, seq, &event).into()));
                Step::Continue
            }
            Item::Gap { first } => send(slot, &gap_error(Some(id.to_string()), first)),
            Item::Reply(message) => send(slot, &message),
        }
    }

    fn on_ping_tick(&mut self, slot: Slot) -> Step {
        if self.missed_pongs >= MAX_MISSED_PONGS {
            return Step::End(Some(close(close_code::POLICY, "no pong for two pings")));
        }
        self.missed_pongs += 1;
        slot.send(Message::Ping(Default::default()));
        Step::Continue
    }
}

fn send_error(slot: Slot, id: Option<String>, reply: ErrorReply) -> Step {
    send(slot, &ServerMessage::from_reply(id, &reply))
}

fn send(slot: Slot, message: &ServerMessage) -> Step {
    slot.send(Message::Text(message.to_json().into()));
    Step::Continue
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
    use crate::config::StreamsConfig;
    use crate::types::{Envelope, FinishReason, StreamEvent};
    use futures::stream;
    use serde_json::{json, Value};
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::sync::Semaphore;
    use tokio::task::JoinHandle;

    const PING_EVERY: Duration = Duration::from_secs(10);
    const DETACHED: Duration = Duration::from_secs(30);

    /// Lets the registry's tasks run.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

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
            let registry = Arc::new(Registry::new(StreamsConfig {
                max_open: 100,
                max_events: 1000,
                max_bytes: 1 << 20,
                keep_after_done: Duration::from_secs(60),
                detached_cancel: DETACHED,
                retry: Duration::from_secs(1),
            }));
            let session = Session::new(
                chat,
                RequestCtx::new(Dialect::Native),
                semaphore_slots(permits.clone()),
                registry,
                out,
            );
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

        /// The next message other than `accepted`.
        async fn recv(&mut self) -> Value {
            loop {
                let v = self.recv_any().await;
                if v["type"] != "accepted" {
                    return v;
                }
            }
        }

        async fn recv_any(&mut self) -> Value {
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
            StreamEvent::Start(Box::new(Envelope {
                route: Some("r1".into()),
                ..Envelope::default()
            })),
            StreamEvent::TextDelta(text.to_string()),
            StreamEvent::Finish {
                reason: FinishReason::Stop,
                envelope: Box::new(Envelope::default()),
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
        let events = stream::iter(vec![StreamEvent::Start(Box::default())]).chain(stream::pending());
        Box::pin(events.map(move |e| {
            let _held = &guard;
            e
        }))
    }

    #[tokio::test]
    async fn a_chat_streams_start_delta_and_done_for_its_id() {
        let mut h = Harness::start(vec![("a", answer("Hello"))], 16, 4);
        h.send(chat("c1", "a")).await;
        let accepted = h.recv_any().await;
        assert_eq!(
            (&accepted["type"], &accepted["id"], accepted.get("seq")),
            (&json!("accepted"), &json!("c1"), None),
            "accepted first, without a seq"
        );
        assert!(
            accepted["stream"].as_str().is_some_and(|s| s.starts_with("st_"))
                && accepted["token"].as_str().is_some_and(|t| t.len() >= 22),
            "it names the stream and its token: {accepted}"
        );
        let start = h.recv().await;
        assert_eq!(
            (&start["type"], &start["id"], &start["route"], &start["seq"]),
            (&json!("start"), &json!("c1"), &json!("r1"), &json!(1)),
            "start"
        );
        assert_eq!(
            h.recv().await,
            json!({"type": "delta", "id": "c1", "text": "Hello", "seq": 2}),
            "delta"
        );
        let done = h.recv().await;
        assert_eq!(
            (&done["type"], &done["finish_reason"]),
            (&json!("done"), &json!("stop")),
            "done"
        );
        settle().await;
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
        settle().await;
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

    #[tokio::test(start_paused = true)]
    async fn closing_the_socket_detaches_its_requests_until_detached_cancel() {
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
        settle().await;
        assert!(
            !d1.load(Ordering::SeqCst) && !d2.load(Ordering::SeqCst),
            "the requests run on, detached, so a new socket can resume them"
        );
        tokio::time::advance(DETACHED + Duration::from_secs(1)).await;
        settle().await;
        assert!(
            d1.load(Ordering::SeqCst) && d2.load(Ordering::SeqCst),
            "both streams were dropped after detached_cancel"
        );
        assert_eq!(h.permits.available_permits(), 4, "and their permits freed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_does_not_read_is_closed_as_too_slow() {
        let many: Vec<StreamEvent> = std::iter::once(StreamEvent::Start(Box::default()))
            .chain((0..100).map(|i| StreamEvent::TextDelta(format!("t{i}"))))
            .collect();
        let h = Harness::start(vec![("a", Box::pin(stream::iter(many)))], 4, 4);
        let started = Instant::now();
        h.send(chat("c1", "a")).await;
        let close = h.session.await.expect("session task ends cleanly");
        assert_eq!(
            close.map(|c| c.code),
            Some(close_code::AGAIN),
            "closed with 1013 instead of buffering"
        );
        assert_eq!(
            started.elapsed(),
            PING_EVERY * 2,
            "once the queue stayed full for two ping intervals"
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
