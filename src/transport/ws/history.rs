//! A WebSocket session's history: the turns a client sent under a `session` id and the
//! answers it got, kept per socket and bounded by count and bytes, projected into each new
//! request of the session (docs/ws-protocol.md, "Session history").
//!
//! A turn is what one `chat` message sent (its non-system messages) and the answer it got
//! (one assistant message: its text and tool calls). A turn is kept only when its answer
//! finished; a failed or cancelled answer leaves the history as it was, so the client can
//! send the turn again. The latest system messages sent stand for the whole session.
//!
//! Bounds: [`MAX_SESSIONS`] sessions a socket (one that has kept no turn and has none in
//! flight holds no place), [`MAX_TURNS`] turns and [`MAX_BYTES`] bytes a
//! session (the oldest turns go first; an answer alone over the byte limit is not kept).
//! Past the context window, the oldest kept turns are left out of the request (not
//! forgotten), by the same four-bytes-a-token estimate as the router's for unknown
//! tokenizers; the envelope says which turns went in.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use futures::StreamExt;
use parking_lot::Mutex;

use crate::transport::error::ErrorReply;
use crate::types::{
    ChatRequest, ContentPart, EventStream, HistoryInfo, Message, Role, StreamEvent, ToolCall, TurnRange,
};

/// Sessions one socket keeps a history for.
pub const MAX_SESSIONS: usize = 16;
/// Turns one session keeps.
pub const MAX_TURNS: usize = 64;
/// Bytes of text, image URLs and tool calls one session keeps.
pub const MAX_BYTES: usize = 256 * 1024;
/// Tokens the router adds once a request (priming of the reply).
const PER_REQUEST_TOKENS: u64 = 3;
/// Tokens one image counts for (the router's figure).
const IMAGE_TOKENS: u64 = 1_000;
/// Longest session id accepted.
pub const MAX_SESSION_ID_LEN: usize = 128;

/// One socket's session histories.
#[derive(Default)]
pub struct Histories {
    sessions: HashMap<String, Arc<Mutex<History>>>,
}

impl Histories {
    /// Projects `session`'s history into `req` (whose messages are the new turn) for a
    /// prompt of at most `window` tokens (`None`: no limit known; the answer's reserve is
    /// already taken off). Returns what went in, and
    /// the wrapper that keeps the turn once its answer finishes.
    pub fn project(
        &mut self,
        session: &str,
        req: &mut ChatRequest,
        window: Option<u64>,
    ) -> Result<(HistoryInfo, Keeper), ErrorReply> {
        if session.is_empty() || session.len() > MAX_SESSION_ID_LEN {
            return Err(ErrorReply::bad_request(format!(
                "\"session\" must be a non-empty string of at most {MAX_SESSION_ID_LEN} bytes"
            )));
        }
        if !self.sessions.contains_key(session) && self.sessions.len() >= MAX_SESSIONS {
            // A session that has kept nothing and has no answer in flight (its requests all
            // failed or were cancelled) holds no place.
            self.sessions.retain(|_, h| !h.lock().is_vacant());
        }
        if !self.sessions.contains_key(session) && self.sessions.len() >= MAX_SESSIONS {
            return Err(ErrorReply::bad_request(format!(
                "at most {MAX_SESSIONS} sessions per connection keep a history"
            )));
        }
        let history = Arc::clone(self.sessions.entry(session.to_string()).or_default());
        let sent = req
            .messages
            .iter()
            .filter(|m| m.role != Role::System)
            .cloned()
            .collect();
        let info = history.lock().project(session, req, window)?;
        let keeper = Keeper {
            history,
            sent,
            answer: Answer::default(),
            info: info.clone(),
            kept: false,
        };
        Ok((info, keeper))
    }
}

#[derive(Debug, Default)]
struct History {
    system: Vec<Message>,
    turns: VecDeque<Turn>,
    bytes: usize,
    /// The number the next kept turn gets.
    next: u64,
    dropped_for_limit: u64,
    /// A turn whose answer has not ended yet: the next one would miss it.
    in_flight: bool,
}

#[derive(Debug, Clone)]
struct Turn {
    number: u64,
    messages: Vec<Message>,
    bytes: usize,
}

impl History {
    /// Nothing kept and nothing in flight: forgetting it loses nothing but its system
    /// messages, which the client sends again with the turn it sends again.
    fn is_vacant(&self) -> bool {
        !self.in_flight && self.next == 0
    }

    fn project(
        &mut self,
        session: &str,
        req: &mut ChatRequest,
        window: Option<u64>,
    ) -> Result<HistoryInfo, ErrorReply> {
        if self.in_flight {
            return Err(ErrorReply::bad_request(format!(
                "session {session:?} has an answer in flight: send its next turn after that answer's finish"
            )));
        }
        let (system, new): (Vec<Message>, Vec<Message>) = std::mem::take(&mut req.messages)
            .into_iter()
            .partition(|m| m.role == Role::System);
        if !system.is_empty() {
            self.system = system;
        }
        let fixed = estimate(&self.system) + estimate(&new) + PER_REQUEST_TOKENS;
        // The newest turns that fit, counted back from the newest.
        let mut included = 0;
        let mut used = fixed;
        for turn in self.turns.iter().rev() {
            let cost = estimate(&turn.messages);
            if window.is_some_and(|w| used + cost > w) {
                break;
            }
            used += cost;
            included += 1;
        }
        let start = self.turns.len() - included;
        let mut messages = self.system.clone();
        for turn in self.turns.iter().skip(start) {
            messages.extend(turn.messages.iter().cloned());
        }
        messages.extend(new);
        req.messages = messages;
        self.in_flight = true;
        let turns_included = match (self.turns.get(start), self.turns.back()) {
            (Some(first), Some(last)) => Some(TurnRange {
                from: first.number,
                to: last.number,
            }),
            _ => None,
        };
        Ok(HistoryInfo {
            session: session.to_string(),
            turns_included,
            dropped_for_budget: u32::try_from(start).unwrap_or(u32::MAX),
            dropped_for_limit: self.dropped_for_limit,
            turn: self.next.max(1),
        })
    }

    /// Keeps a finished turn, then forgets the oldest past the limits.
    fn keep(&mut self, messages: Vec<Message>) {
        let number = self.next.max(1);
        self.next = number + 1;
        let bytes = messages.iter().map(size).sum();
        if bytes > MAX_BYTES {
            self.dropped_for_limit += 1;
            return;
        }
        self.bytes += bytes;
        self.turns.push_back(Turn {
            number,
            messages,
            bytes,
        });
        while self.turns.len() > MAX_TURNS || self.bytes > MAX_BYTES {
            let Some(old) = self.turns.pop_front() else { break };
            self.bytes -= old.bytes;
            self.dropped_for_limit += 1;
        }
    }
}

/// Bytes a message takes in the history.
fn size(m: &Message) -> usize {
    let parts: usize = m
        .content
        .iter()
        .map(|p| match p {
            ContentPart::Text(t) => t.len(),
            ContentPart::ImageUrl { url } => url.len(),
            ContentPart::Opaque { kind, .. } => kind.len(),
        })
        .sum();
    let calls: usize = m
        .tool_calls
        .iter()
        .map(|c| c.id.len() + c.name.len() + c.arguments.len())
        .sum();
    parts + calls + m.tool_call_id.as_ref().map_or(0, String::len)
}

/// Prompt tokens of `messages`: four bytes a token plus 10%, and four a message for its
/// framing (the router's estimate for routes without a known tokenizer); an image counts as
/// the router's image figure.
fn estimate(messages: &[Message]) -> u64 {
    messages
        .iter()
        .map(|m| {
            let images = m
                .content
                .iter()
                .filter(|p| matches!(p, ContentPart::ImageUrl { .. }))
                .count() as u64;
            let text = (size(m) as f64 / 4.0 * 1.1).ceil() as u64;
            text + 4 + images * IMAGE_TOKENS
        })
        .sum()
}

/// The answer so far, as the client has it (a `reset` discards it).
#[derive(Debug, Default)]
struct Answer {
    text: String,
    tool_calls: Vec<ToolCall>,
    /// Past [`MAX_BYTES`]: it will not be kept.
    too_big: bool,
}

impl Answer {
    fn see(&mut self, event: &StreamEvent) {
        match event {
            StreamEvent::TextDelta(t) => {
                if self.text.len() + t.len() > MAX_BYTES {
                    self.too_big = true;
                } else if !self.too_big {
                    self.text.push_str(t);
                }
            }
            StreamEvent::ToolCall(call) => self.tool_calls.push((**call).clone()),
            StreamEvent::Reset { .. } => *self = Answer::default(),
            _ => {}
        }
    }

    fn message(self) -> Message {
        let mut m = Message::text(Role::Assistant, self.text);
        if m.content
            .iter()
            .all(|p| matches!(p, ContentPart::Text(t) if t.is_empty()))
        {
            m.content.clear();
        }
        m.tool_calls = self.tool_calls;
        m
    }
}

/// Watches one answer of a session: says in its envelopes which turns went in, and keeps
/// the turn when the answer finishes. Dropped unfinished (failed, cancelled), it leaves the
/// history as it was and lets the session's next turn in.
pub struct Keeper {
    history: Arc<Mutex<History>>,
    /// The turn's own messages, as the client sent them (system messages aside).
    sent: Vec<Message>,
    answer: Answer,
    info: HistoryInfo,
    kept: bool,
}

impl Keeper {
    /// `events`, with the history in its envelopes, keeping the turn when it finishes.
    pub fn watch(mut self, events: EventStream) -> EventStream {
        Box::pin(events.map(move |mut event| {
            self.answer.see(&event);
            match &mut event {
                StreamEvent::Start(env) => env.history = Some(Box::new(self.info.clone())),
                StreamEvent::Finish { envelope, .. } => {
                    envelope.history = Some(Box::new(self.info.clone()));
                    self.keep();
                }
                // Released before the client reads the error, so it may send the turn again
                // at once.
                StreamEvent::Error(_) => self.release(),
                _ => {}
            }
            event
        }))
    }

    fn keep(&mut self) {
        if self.kept {
            return;
        }
        self.kept = true;
        let answer = std::mem::take(&mut self.answer);
        let mut history = self.history.lock();
        history.in_flight = false;
        if answer.too_big {
            history.next = history.next.max(1) + 1;
            history.dropped_for_limit += 1;
            return;
        }
        let mut turn = std::mem::take(&mut self.sent);
        turn.push(answer.message());
        history.keep(turn);
    }
}

impl Keeper {
    /// The answer ended without a turn to keep: the session takes its next turn.
    fn release(&mut self) {
        if !self.kept {
            self.kept = true;
            self.history.lock().in_flight = false;
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Envelope, FinishReason};
    use futures::stream;

    fn req(messages: Vec<Message>) -> ChatRequest {
        ChatRequest {
            model: "m".into(),
            messages,
            ..ChatRequest::default()
        }
    }

    fn user(text: &str) -> Message {
        Message::text(Role::User, text)
    }

    fn answered(text: &str) -> EventStream {
        Box::pin(stream::iter(vec![
            StreamEvent::Start(Box::default()),
            StreamEvent::TextDelta(text.into()),
            StreamEvent::Finish {
                reason: FinishReason::Stop,
                envelope: Box::new(Envelope::default()),
            },
        ]))
    }

    /// Sends `text` as a turn of session `s` and reads its answer `answer` to the end.
    async fn turn(h: &mut Histories, text: &str, answer: &str, window: Option<u64>) -> (HistoryInfo, ChatRequest) {
        let mut r = req(vec![user(text)]);
        let (info, keeper) = h.project("s", &mut r, window).expect("projected");
        let events: Vec<StreamEvent> = keeper.watch(answered(answer)).collect().await;
        let finish = events.last().expect("a finish");
        let StreamEvent::Finish { envelope, .. } = finish else {
            panic!("ends with finish: {finish:?}")
        };
        assert_eq!(envelope.history.as_deref(), Some(&info), "the finish says it too");
        (info, r)
    }

    fn texts(r: &ChatRequest) -> Vec<String> {
        r.messages.iter().map(|m| m.joined_text()).collect()
    }

    #[tokio::test]
    async fn each_turn_carries_the_ones_before_with_their_answers() {
        let mut h = Histories::default();
        let (first, r1) = turn(&mut h, "one", "ONE", None).await;
        assert_eq!(first.turns_included, None);
        assert_eq!(first.turn, 1);
        assert_eq!(texts(&r1), ["one"]);
        let (second, r2) = turn(&mut h, "two", "TWO", None).await;
        assert_eq!(texts(&r2), ["one", "ONE", "two"]);
        assert_eq!(second.turns_included, Some(TurnRange { from: 1, to: 1 }));
        assert_eq!(second.turn, 2);
        let (_, r3) = turn(&mut h, "three", "", None).await;
        assert_eq!(texts(&r3), ["one", "ONE", "two", "TWO", "three"]);
        assert_eq!(r3.messages[1].role, Role::Assistant);
    }

    #[tokio::test]
    async fn the_latest_system_prompt_stands_first() {
        let mut h = Histories::default();
        let mut r = req(vec![Message::text(Role::System, "be brief"), user("one")]);
        let (_, keeper) = h.project("s", &mut r, None).expect("projected");
        let _: Vec<_> = keeper.watch(answered("ONE")).collect().await;
        let (_, r2) = turn(&mut h, "two", "TWO", None).await;
        assert_eq!(texts(&r2), ["be brief", "one", "ONE", "two"]);
    }

    #[tokio::test]
    async fn an_unfinished_answer_keeps_no_turn_and_frees_the_session() {
        let mut h = Histories::default();
        let mut r = req(vec![user("lost")]);
        let (_, keeper) = h.project("s", &mut r, None).expect("projected");
        let again = h.project("s", &mut req(vec![user("too soon")]), None);
        let refused = again.err().expect("one answer at a time per session");
        assert!(refused.message.contains("in flight"), "{}", refused.message);
        let cut: EventStream = Box::pin(stream::iter(vec![StreamEvent::TextDelta("par".into())]));
        let _: Vec<_> = keeper.watch(cut).collect().await;
        let (info, r2) = turn(&mut h, "retry", "ok", None).await;
        assert_eq!(texts(&r2), ["retry"], "the cut turn was not kept");
        assert_eq!(info.turns_included, None);
    }

    #[tokio::test]
    async fn an_error_frees_the_session_before_the_stream_is_dropped() {
        let mut h = Histories::default();
        let mut r = req(vec![user("q")]);
        let (_, keeper) = h.project("s", &mut r, None).expect("projected");
        let failed: EventStream = Box::pin(stream::iter(vec![StreamEvent::Error(Box::new(
            crate::types::ErrorEvent {
                code: None,
                class: crate::types::ErrorClass::Unavailable,
                status: 503,
                message: "down".into(),
                retry_after: None,
                envelope: Envelope::default(),
            },
        ))]));
        let mut events = keeper.watch(failed);
        let _ = events.next().await;
        let (info, _) = turn(&mut h, "again", "ok", None).await;
        assert_eq!(info.turns_included, None, "the failed turn was not kept");
        drop(events);
    }

    #[tokio::test]
    async fn a_reset_discards_the_answer_so_far() {
        let mut h = Histories::default();
        let mut r = req(vec![user("q")]);
        let (_, keeper) = h.project("s", &mut r, None).expect("projected");
        let events: EventStream = Box::pin(stream::iter(vec![
            StreamEvent::TextDelta("wrong".into()),
            StreamEvent::Reset {
                reason: "restart".into(),
            },
            StreamEvent::TextDelta("right".into()),
            StreamEvent::Finish {
                reason: FinishReason::Stop,
                envelope: Box::new(Envelope::default()),
            },
        ]));
        let _: Vec<_> = keeper.watch(events).collect().await;
        let (_, r2) = turn(&mut h, "next", "", None).await;
        assert_eq!(texts(&r2), ["q", "right", "next"]);
    }

    #[tokio::test]
    async fn past_the_window_the_oldest_turns_are_left_out() {
        let mut h = Histories::default();
        let long = "x".repeat(400); // ~110 tokens
        for _ in 0..3 {
            turn(&mut h, &long, "ok", None).await;
        }
        // Each kept turn: ~110 + 4 + 1 + 4 tokens; the new turn ~7.
        let (info, r) = turn(&mut h, "new", "ok", Some(260)).await;
        assert_eq!(info.dropped_for_budget, 1, "{info:?}");
        assert_eq!(info.turns_included, Some(TurnRange { from: 2, to: 3 }));
        assert_eq!(r.messages.len(), 5, "two turns of two messages and the new one");
        let (info, r) = turn(&mut h, "tiny", "ok", Some(5)).await;
        assert_eq!(info.turns_included, None, "nothing fits: the turn goes alone");
        assert_eq!(info.dropped_for_budget, 4);
        assert_eq!(texts(&r), ["tiny"]);
        let (all, _) = turn(&mut h, "all", "ok", None).await;
        assert_eq!(
            all.turns_included,
            Some(TurnRange { from: 1, to: 5 }),
            "left out is not forgotten"
        );
    }

    #[tokio::test]
    async fn the_history_is_bounded_by_turns_and_bytes() {
        let mut h = Histories::default();
        for i in 0..(MAX_TURNS + 3) {
            turn(&mut h, &format!("t{i}"), "a", None).await;
        }
        let (info, r) = turn(&mut h, "last", "a", None).await;
        assert_eq!(info.dropped_for_limit, 3, "{info:?}");
        let first = MAX_TURNS as u64 + 3 - MAX_TURNS as u64 + 1;
        assert_eq!(
            info.turns_included,
            Some(TurnRange {
                from: first,
                to: MAX_TURNS as u64 + 3
            })
        );
        assert_eq!(r.messages.len(), MAX_TURNS * 2 + 1);

        let mut h = Histories::default();
        let big = "y".repeat(MAX_BYTES / 3);
        for _ in 0..4 {
            turn(&mut h, &big, "", None).await;
        }
        let (info, _) = turn(&mut h, "q", "", None).await;
        assert_eq!(
            info.dropped_for_limit, 1,
            "three thirds fit in MAX_BYTES, not four: {info:?}"
        );
        let huge = "z".repeat(MAX_BYTES + 1);
        turn(&mut h, &huge, "", None).await;
        let (info, _) = turn(&mut h, "q", "", None).await;
        assert_eq!(
            info.dropped_for_limit, 2,
            "a turn alone over the limit is not kept, and evicts none"
        );
    }

    #[tokio::test]
    async fn sessions_per_socket_and_ids_are_bounded() {
        let mut h = Histories::default();
        for i in 0..MAX_SESSIONS {
            let (_, keeper) = h
                .project(&format!("s{i}"), &mut req(vec![user("q")]), None)
                .expect("room");
            let _: Vec<_> = keeper.watch(answered("a")).collect().await;
        }
        assert!(h.project("one-more", &mut req(vec![user("q")]), None).is_err());
        assert!(
            h.project("s0", &mut req(vec![user("q")]), None).is_ok(),
            "known sessions go on"
        );
        assert!(h.project("", &mut req(vec![]), None).is_err());
        assert!(h.project(&"x".repeat(129), &mut req(vec![]), None).is_err());
    }

    #[tokio::test]
    async fn a_session_that_kept_nothing_frees_its_place() {
        let mut h = Histories::default();
        let (_, streaming) = h.project("busy", &mut req(vec![user("q")]), None).expect("room");
        for i in 1..MAX_SESSIONS {
            let (_, keeper) = h
                .project(&format!("failed{i}"), &mut req(vec![user("q")]), None)
                .expect("room");
            let failed: EventStream = Box::pin(stream::iter(vec![StreamEvent::TextDelta("par".into())]));
            let _: Vec<_> = keeper.watch(failed).collect().await;
        }
        let (_, fresh) = h
            .project("fresh", &mut req(vec![user("q")]), None)
            .expect("the failed sessions hold no place");
        drop(fresh);
        for i in 0..(MAX_SESSIONS - 1) {
            let (_, keeper) = h
                .project(&format!("kept{i}"), &mut req(vec![user("q")]), None)
                .expect("room");
            let _: Vec<_> = keeper.watch(answered("a")).collect().await;
        }
        assert!(
            h.project("one-more", &mut req(vec![user("q")]), None).is_err(),
            "a session with an answer in flight, and sessions with kept turns, hold theirs"
        );
        drop(streaming);
    }
}
