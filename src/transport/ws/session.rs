//! One WebSocket's session: a single loop that reads client frames, reads every open
//! request's stream, pings the client, and writes to the socket itself (`outbox`).
//!
//! Each request is registered in the stream registry, whose task drives the answer; the
//! session only holds a reader per request, so a request outlives its socket (it is
//! detached, and can be resumed on another socket) and a `cancel` stops it at once. A
//! `resume` of a stream another instance runs (`[state] redis_url`) is looked up and read
//! in Redis as one more of the socket's requests (see `streams`), never awaited here.
//!
//! Backpressure instead of buffering: the loop makes sure one more outgoing message may
//! wait (`server.ws_send_queue` of them at most, behind what the socket has taken) before it
//! handles anything (a frame, an event, a ping), and every step sends at most one message.
//! A client that writes a burst is read at the pace it reads its answers, and what exceeds
//! its limits is answered with `overloaded` errors, one per refused frame. A client whose
//! outgoing messages stay at that limit for two ping intervals does not read: it is closed
//! with 1013. A reader that falls behind the replay buffer gets `resume_gap` for that
//! request.
//!
//! A `chat` that names a `session` carries only its new turn: the session's history (see
//! `history`) is projected in before it, and its answer is kept for the next turn.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use std::future::poll_fn;
use std::task::{Context, Poll};

use axum::extract::ws::{close_code, CloseFrame, Message};
use futures::{Sink, Stream, StreamExt};
use tokio::time::{interval_at, timeout, Instant, Interval, MissedTickBehavior};

use super::controls::ControlBudget;
use super::history::Histories;
use super::outbox::Outbox;
use super::protocol::{self, ClientMessage};
use super::render::sequenced;
use super::streams::{ahead, refusal, Cancel, Item, RequestStreams};
use crate::config::RequestLimits;
use crate::transport::body::check_value_cost;
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
    Send(Message),
    /// End the session, telling the client why when there is a reason to give.
    End(Option<CloseFrame>),
}

/// How a session ended.
#[derive(Debug)]
pub enum End {
    /// The socket failed: the client is gone, there is nobody to tell.
    Gone,
    /// Close the socket, with this frame if there is a reason to give.
    Close(Option<CloseFrame>),
}

/// The next thing the loop handles.
enum Input {
    Frame(Option<Result<Message, axum::Error>>),
    Item(String, String, Item),
    Tick,
    Gone,
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
    max_requests: usize,
    missed_pongs: u32,
    controls: ControlBudget,
    /// Which input is looked at first, turning each time, so that none starves the others.
    turn: u8,
    histories: Histories,
    /// Per client-facing model, its routes' context windows.
    windows: Arc<HashMap<String, Vec<RouteWindow>>>,
    /// `max_messages` and `max_decoded_bytes`, as over HTTP.
    limits: RequestLimits,
}

impl<F> Session<F>
where
    F: FnMut(ChatRequest, RequestCtx) -> Result<EventStream, ErrorReply> + Send,
{
    pub fn new(chat: F, base: RequestCtx, slots: Slots, registry: Arc<Registry>) -> Self {
        Session {
            chat,
            base,
            streams: RequestStreams::default(),
            slots,
            registry,
            max_requests: MAX_REQUESTS_PER_SOCKET,
            missed_pongs: 0,
            controls: ControlBudget::new(Instant::now()),
            turn: 0,
            histories: Histories::default(),
            windows: Arc::default(),
            limits: RequestLimits::default(),
        }
    }

    /// The cost limits each `chat`'s request is held to (`server.max_messages`,
    /// `server.max_decoded_bytes`).
    pub fn with_limits(mut self, limits: RequestLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The context windows a session's history is projected for, per client-facing model.
    pub fn with_windows(mut self, windows: Arc<HashMap<String, Vec<RouteWindow>>>) -> Self {
        self.windows = windows;
        self
    }

    /// Runs on `socket` until the client goes away or the session must close, at most
    /// `queue` outgoing messages waiting for a client that is behind. Dropping the session
    /// then detaches every open request (see `detached_cancel_ms`); the caller sends the
    /// close frame.
    pub async fn run<S>(&mut self, socket: &mut S, ping_every: Duration, queue: usize) -> End
    where
        S: Stream<Item = Result<Message, axum::Error>> + Sink<Message, Error = axum::Error> + Unpin,
    {
        // A zero interval from configuration would panic the timer.
        let ping_every = ping_every.max(MIN_PING_INTERVAL);
        let stalled = ping_every * MAX_MISSED_PONGS;
        let mut ping = interval_at(Instant::now() + ping_every, ping_every);
        ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut outbox = Outbox::new(queue);
        loop {
            if !outbox.has_room() {
                match timeout(stalled, poll_fn(|cx| outbox.poll_room(socket, cx))).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return End::Gone,
                    Err(_) => return End::Close(Some(close(close_code::AGAIN, "client too slow"))),
                }
            }
            let step = match poll_fn(|cx| self.poll_input(socket, &mut outbox, &mut ping, cx)).await {
                Input::Frame(frame) => self.on_frame(frame),
                Input::Item(id, request_id, item) => self.on_item(&id, &request_id, item),
                Input::Tick => self.on_ping_tick(),
                Input::Gone => return End::Gone,
            };
            match step {
                Step::Continue => {}
                Step::Send(message) => outbox.push(message),
                Step::End(close) => return End::Close(close),
            }
        }
    }

    /// Writes what waits, then takes the first input ready: a client frame, an item of an
    /// open request, or the ping tick, starting from a different one each time.
    fn poll_input<S>(
        &mut self,
        socket: &mut S,
        outbox: &mut Outbox,
        ping: &mut Interval,
        cx: &mut Context<'_>,
    ) -> Poll<Input>
    where
        S: Stream<Item = Result<Message, axum::Error>> + Sink<Message, Error = axum::Error> + Unpin,
    {
        if let Poll::Ready(Err(_)) = outbox.poll_write(socket, cx) {
            return Poll::Ready(Input::Gone);
        }
        self.turn = (self.turn + 1) % 3;
        for k in 0..3 {
            let ready = match (self.turn + k) % 3 {
                0 => socket.poll_next_unpin(cx).map(Input::Frame),
                1 => self
                    .streams
                    .poll_next(cx)
                    .map(|(id, request_id, item)| Input::Item(id, request_id, item)),
                _ => ping.poll_tick(cx).map(|_| Input::Tick),
            };
            if ready.is_ready() {
                return ready;
            }
        }
        Poll::Pending
    }

    fn on_frame(&mut self, frame: Option<Result<Message, axum::Error>>) -> Step {
        match frame {
            None | Some(Ok(Message::Close(_))) => Step::End(None),
            Some(Err(ref e)) => Step::End(close_for(e)),
            Some(Ok(Message::Text(text))) => self.on_text(text.as_str()),
            Some(Ok(Message::Binary(_))) => send_error(
                None,
                ErrorReply::bad_request("binary frames are not supported; send JSON text frames"),
            ),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) if !self.controls.take(Instant::now()) => {
                Step::End(Some(close(close_code::POLICY, "too many pings or pongs")))
            }
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
            Ok(ClientMessage::Chat {
                id,
                request,
                options,
                session,
            }) => self.start(id, request, options, session),
            Ok(ClientMessage::Cancel { id }) => match self.streams.cancel(&id) {
                Cancel::Stopped => send(&ServerMessage::Cancelled { id }),
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
            }) => self.resume(id, stream, token, after),
            Err(e) => send_error(e.id, ErrorReply::bad_request(e.message)),
        }
    }

    /// Why a new request cannot be opened under `id` on this socket, if it cannot.
    fn refuse_open(&self, id: &str) -> Option<ErrorReply> {
        if self.streams.contains(id) {
            // About the refused frame, not the open request: `duplicate_id` tells a client
            // that this is not that id's terminal message (its answer goes on).
            return Some(ErrorReply {
                code: Some("duplicate_id"),
                ..ErrorReply::bad_request(format!(
                    "request id {id:?} is already active on this connection; that request goes on"
                ))
            });
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
    ) -> Step {
        if let Some(reply) = self.refuse_open(&id) {
            return send_error(Some(id), reply);
        }
        let decoded = check_value_cost(&request, &self.limits)
            .and_then(|()| decode_value(request))
            .and_then(|req| crate::transport::tool_cost::check(&req, crate::types::Dialect::Native).map(|()| req));
        let mut req = match decoded {
            Ok(req) => req,
            Err(e) => return send_error(Some(id), e.into()),
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
            return send_error(Some(id), e.into());
        }
        if self.registry.is_full() {
            return send_error(Some(id), ErrorReply::busy());
        }
        let permit = match (self.slots)(&ctx) {
            Ok(permit) => permit,
            Err(refused) => return send_error(Some(id), refused),
        };
        let keeper = match &session {
            Some(session) => {
                let window = self
                    .windows
                    .get(&req.model)
                    .and_then(|routes| routes.iter().map(|r| r.prompt_budget(req.max_tokens)).max());
                match self.histories.project(session, &mut req, window) {
                    Ok((_, keeper)) => Some(keeper),
                    Err(refused) => return send_error(Some(id), refused),
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
            // Refused before any stream opened: the error alone, no `accepted`.
            Err(reply) => return send_error(Some(id), reply),
        };
        match self.registry.open(events, request_id, permit) {
            Ok(stream) => self.attach(id, &stream, 0),
            Err(_) => send_error(Some(id), ErrorReply::busy()),
        }
    }

    /// Resumes a stream held here at once; one another instance runs (`[state] redis_url`)
    /// is looked up in Redis as a request of its own, answered when the lookup is, so the
    /// loop goes on serving meanwhile.
    fn resume(&mut self, id: String, stream_id: String, token: String, after: u64) -> Step {
        if let Some(reply) = self.refuse_open(&id) {
            return send_error(Some(id), reply);
        }
        let stream = match (self.registry.find(&stream_id, Some(&token)), self.registry.remote()) {
            (Ok(stream), _) => stream,
            (Err(Refused::NotFound), Some(shared)) => {
                self.streams
                    .insert_remote(id, Arc::clone(shared), stream_id, token, after);
                return Step::Continue;
            }
            (Err(refused), _) => return send(&refusal(Some(id), refused)),
        };
        match stream.replay.check_resume(after) {
            Resume::Ok | Resume::Finished => self.attach(id, &stream, after),
            Resume::Gap { first } => send(&gap_error(Some(id), first)),
            Resume::Ahead { last } => send(&ahead(Some(id), after, last)),
        }
    }

    /// Reads `stream` from after `after` under `id`, confirmed with `accepted`.
    fn attach(&mut self, id: String, stream: &Arc<Registered>, after: u64) -> Step {
        let accepted = ServerMessage::Accepted {
            id: id.clone(),
            stream: stream.id.clone(),
            token: stream.token().to_string(),
        };
        self.streams.insert(id, stream.attach(after));
        send(&accepted)
    }

    fn on_item(&mut self, id: &str, request_id: &str, item: Item) -> Step {
        match item {
            Item::Event(seq, event) => Step::Send(Message::Text(sequenced(id, request_id, seq, &event).into())),
            Item::Gap { first } => send(&gap_error(Some(id.to_string()), first)),
            Item::Reply(message) => send(&message),
        }
    }

    fn on_ping_tick(&mut self) -> Step {
        if self.missed_pongs >= MAX_MISSED_PONGS {
            return Step::End(Some(close(close_code::POLICY, "no pong for two pings")));
        }
        self.missed_pongs += 1;
        Step::Send(Message::Ping(Default::default()))
    }
}

fn send_error(id: Option<String>, reply: ErrorReply) -> Step {
    send(&ServerMessage::from_reply(id, &reply))
}

fn send(message: &ServerMessage) -> Step {
    Step::Send(Message::Text(message.to_json().into()))
}

fn close(code: u16, reason: &'static str) -> CloseFrame {
    CloseFrame {
        code,
        reason: reason.into(),
    }
}

/// The close frame for a frame the client got wrong: 1009 for a message over
/// `ws_max_message_bytes`, 1007 for a text frame that is not UTF-8, 1002 for any other
/// violation of the protocol (an unmasked frame, a reserved opcode or bit, a bad
/// continuation), each with a short reason. `None` for an error of the connection itself
/// (the socket failed or is closed): the plain close, if it can still be sent.
fn close_for(e: &axum::Error) -> Option<CloseFrame> {
    use tokio_tungstenite::tungstenite::Error as WsError;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        match err.downcast_ref::<WsError>() {
            Some(WsError::Capacity(_)) => return Some(close(close_code::SIZE, "message too big")),
            Some(WsError::Utf8(_)) => return Some(close(close_code::INVALID, "text frame is not valid UTF-8")),
            Some(WsError::Protocol(_)) => return Some(close(close_code::PROTOCOL, "WebSocket protocol error")),
            Some(_) => return None,
            None => source = err.source(),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StreamsConfig;
    use crate::gateway::GatewayError;
    use crate::types::{Envelope, FinishReason, StreamEvent};
    use futures::stream;
    use serde_json::{json, Value};
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::sync::{mpsc, Semaphore};
    use tokio::task::JoinHandle;

    const PING_EVERY: Duration = Duration::from_secs(10);
    const DETACHED: Duration = Duration::from_secs(30);

    /// Lets the registry's tasks run.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    /// The session's side of a client: frames from `incoming`, messages into `out`, which
    /// holds as many as the session's queue before it takes no more.
    struct Socket {
        incoming: mpsc::Receiver<Result<Message, axum::Error>>,
        out: futures::channel::mpsc::Sender<Message>,
    }

    impl Stream for Socket {
        type Item = Result<Message, axum::Error>;

        fn poll_next(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            self.incoming.poll_recv(cx)
        }
    }

    impl Sink<Message> for Socket {
        type Error = axum::Error;

        fn poll_ready(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), axum::Error>> {
            self.out.poll_ready(cx).map_err(axum::Error::new)
        }

        fn start_send(mut self: std::pin::Pin<&mut Self>, item: Message) -> Result<(), axum::Error> {
            self.out.start_send(item).map_err(axum::Error::new)
        }

        fn poll_flush(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), axum::Error>> {
            std::pin::Pin::new(&mut self.out)
                .poll_flush(cx)
                .map_err(axum::Error::new)
        }

        fn poll_close(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), axum::Error>> {
            std::pin::Pin::new(&mut self.out)
                .poll_close(cx)
                .map_err(axum::Error::new)
        }
    }

    struct Harness {
        to_session: mpsc::Sender<Result<Message, axum::Error>>,
        from_session: futures::channel::mpsc::Receiver<Message>,
        session: JoinHandle<Option<CloseFrame>>,
        permits: Arc<Semaphore>,
    }

    impl Harness {
        /// `scripts` maps a request's model name to the event stream the gateway returns.
        fn start<M: Into<String>>(scripts: Vec<(M, EventStream)>, queue: usize, permits: usize) -> Harness {
            let mut scripts: HashMap<String, EventStream> = scripts.into_iter().map(|(m, s)| (m.into(), s)).collect();
            let chat = move |req: ChatRequest, _ctx: RequestCtx| {
                scripts.remove(&req.model).ok_or_else(|| {
                    ErrorReply::from_gateway(&GatewayError::UnknownModel {
                        model: req.model.clone(),
                        known: vec!["a".into()],
                    })
                })
            };
            let (to_session, incoming) = mpsc::channel(16);
            let (out, from_session) = futures::channel::mpsc::channel(queue);
            let mut socket = Socket { incoming, out };
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
            );
            let session = tokio::spawn(async move {
                let mut session = session;
                match session.run(&mut socket, PING_EVERY, queue).await {
                    End::Close(close) => close,
                    End::Gone => panic!("the test's socket never fails"),
                }
            });
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
            match self.from_session.next().await {
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
        assert_eq!(
            err["code"], "duplicate_id",
            "not the open request's terminal message: {err}"
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

    #[tokio::test]
    async fn a_protocol_violation_closes_with_its_code_and_a_short_reason() {
        use tokio_tungstenite::tungstenite::error::{CapacityError, ProtocolError};
        use tokio_tungstenite::tungstenite::Error as WsError;
        for (error, code, reason) in [
            (
                WsError::Protocol(ProtocolError::UnmaskedFrameFromClient),
                close_code::PROTOCOL,
                "protocol",
            ),
            (
                WsError::Utf8("invalid utf-8 sequence".into()),
                close_code::INVALID,
                "UTF-8",
            ),
            (
                WsError::Capacity(CapacityError::MessageTooLong { size: 10, max_size: 5 }),
                close_code::SIZE,
                "too big",
            ),
        ] {
            let shown = error.to_string();
            let h = Harness::start(Vec::<(String, EventStream)>::new(), 16, 4);
            h.to_session
                .send(Err(axum::Error::new(error)))
                .await
                .unwrap_or_else(|_| panic!("the session takes the error"));
            let close = h.session.await.expect("session task ends cleanly");
            let close = close.unwrap_or_else(|| panic!("{shown}: closed without a code"));
            assert_eq!(close.code, code, "{shown}");
            assert!(close.reason.as_str().contains(reason), "{shown}: {:?}", close.reason);
            assert!(close.reason.len() <= 123, "a close reason fits its frame");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_misses_two_pongs_is_closed() {
        let mut h = Harness::start(Vec::<(String, EventStream)>::new(), 16, 4);
        let started = Instant::now();
        assert!(
            matches!(h.from_session.next().await, Some(Message::Ping(_))),
            "first ping"
        );
        assert!(
            matches!(h.from_session.next().await, Some(Message::Ping(_))),
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
    async fn a_client_flooding_pings_is_closed_as_a_policy_violation() {
        let h = Harness::start(Vec::<(String, EventStream)>::new(), 16, 4);
        for _ in 0..=super::super::controls::MAX_CONTROL_FRAMES {
            if h.to_session.send(Ok(Message::Ping(Default::default()))).await.is_err() {
                break;
            }
        }
        let close = h.session.await.expect("session task ends cleanly");
        let close = close.expect("closed with a code");
        assert_eq!(close.code, close_code::POLICY);
        assert!(close.reason.as_str().contains("too many pings"), "{:?}", close.reason);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pong_keeps_the_client_alive() {
        let mut h = Harness::start(Vec::<(String, EventStream)>::new(), 16, 4);
        for _ in 0..4 {
            assert!(matches!(h.from_session.next().await, Some(Message::Ping(_))), "ping");
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
