//! Reading the gateway's event stream: waiting for the commit point, and draining a
//! committed stream into one complete answer for non-streaming replies.

use futures::StreamExt;

use super::error::ErrorReply;
use crate::types::{Envelope, EventStream, Extra, FinishReason, StreamEvent, Thinking, ToolCall, Usage};

/// Waits for the first event. `Start` commits (its envelope is returned); `Error` means
/// nothing was committed and the client gets a real HTTP error.
pub async fn await_commit(events: &mut EventStream) -> Result<Envelope, ErrorReply> {
    match events.next().await {
        Some(StreamEvent::Start(envelope)) => Ok(*envelope),
        Some(StreamEvent::Error(e)) => Err(ErrorReply::from_event(*e)),
        Some(_) => Err(ErrorReply::broken_stream("did not begin with a start", None)),
        None => Err(ErrorReply::broken_stream("ended before it started", None)),
    }
}

/// The upstream model that served, never the client's alias (falls back to the route).
pub fn served_model(envelope: &Envelope, alias: &str) -> String {
    envelope
        .model
        .clone()
        .or_else(|| envelope.route.clone())
        .unwrap_or_else(|| alias.to_string())
}

/// A whole answer, drained from a committed stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub text: String,
    /// The route's thinking blocks, in order (a non-streaming answer shows them before its
    /// text, as Anthropic's do).
    pub thinking: Vec<ThinkingBlock>,
    /// The answer's extras, in order: each dialect keeps what it has a place for.
    pub extras: Vec<Extra>,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Option<Usage>,
    pub finish: FinishReason,
    pub envelope: Envelope,
}

#[cfg(test)]
impl Answer {
    /// A text answer that stopped, with nothing else: what tests build on.
    pub fn stopped(text: &str, envelope: Envelope) -> Answer {
        Answer {
            text: text.into(),
            thinking: Vec::new(),
            extras: Vec::new(),
            tool_calls: Vec::new(),
            usage: None,
            finish: FinishReason::Stop,
            envelope,
        }
    }
}

/// One thinking block of a whole answer: its text and the signature that closed it, or a
/// redacted block's data.
#[derive(Debug, Clone, PartialEq)]
pub enum ThinkingBlock {
    Thinking { text: String, signature: Option<String> },
    Redacted(String),
}

impl ThinkingBlock {
    /// Adds `piece` to `blocks`: text joins an open block (one without its signature yet),
    /// a signature closes it, a redacted block stands alone.
    pub fn gather(blocks: &mut Vec<ThinkingBlock>, piece: Thinking) {
        let open = match blocks.last_mut() {
            Some(ThinkingBlock::Thinking { text, signature: None }) => Some(text),
            _ => None,
        };
        match (piece, open) {
            (Thinking::Text(t), Some(text)) => text.push_str(&t),
            (Thinking::Text(t), None) => blocks.push(ThinkingBlock::Thinking {
                text: t.into(),
                signature: None,
            }),
            (Thinking::Signature(sig), _) => match blocks.last_mut() {
                Some(ThinkingBlock::Thinking {
                    signature: s @ None, ..
                }) => *s = Some(sig.into()),
                _ => blocks.push(ThinkingBlock::Thinking {
                    text: String::new(),
                    signature: Some(sig.into()),
                }),
            },
            (Thinking::Redacted(data), _) => blocks.push(ThinkingBlock::Redacted(data.into())),
        }
    }

    /// All the reasoning text, for a dialect that shows it as one string.
    pub fn joined_text(blocks: &[ThinkingBlock]) -> Option<String> {
        let text: String = blocks
            .iter()
            .filter_map(|b| match b {
                ThinkingBlock::Thinking { text, .. } => Some(text.as_str()),
                ThinkingBlock::Redacted(_) => None,
            })
            .collect();
        (!text.is_empty()).then_some(text)
    }
}

/// Drains a stream after `Start`. A `Reset` simply discards what was gathered (nothing
/// was sent yet, so a restart is invisible here). A truncated answer, an error after
/// commit, or a stream that stops without finishing becomes an error reply: a
/// non-streaming client must never get a partial answer that looks complete.
///
/// Bounded: text and tool calls past `max_bytes` (`server.max_answer_bytes`) end the drain
/// with an error (dropping `events` cancels the upstream), so an upstream that ignores
/// `max_tokens` costs at most that much memory per request, never its whole answer.
pub async fn drain(start: Envelope, mut events: EventStream, max_bytes: usize) -> Result<Answer, ErrorReply> {
    let mut text = String::new();
    let mut thinking = Vec::new();
    let mut extras = Vec::new();
    let mut tool_calls = Vec::new();
    let mut usage = None;
    let mut gathered = 0usize;
    while let Some(event) = events.next().await {
        let grows = match &event {
            StreamEvent::TextDelta(t) => t.len(),
            StreamEvent::Thinking(t) => t.len(),
            StreamEvent::Extra(e) => e.len(),
            StreamEvent::ToolCall(call) => call.id.len() + call.name.len() + call.arguments.len(),
            _ => 0,
        };
        gathered = gathered.saturating_add(grows);
        if gathered > max_bytes {
            return Err(ErrorReply::answer_too_large(max_bytes, start));
        }
        match event {
            StreamEvent::Start(_) | StreamEvent::RouteSwitch { .. } => {}
            StreamEvent::TextDelta(t) => text.push_str(&t),
            StreamEvent::Thinking(t) => ThinkingBlock::gather(&mut thinking, t),
            StreamEvent::Extra(e) => extras.push(*e),
            StreamEvent::ToolCall(call) => tool_calls.push(*call),
            StreamEvent::Reset { .. } => {
                text.clear();
                thinking.clear();
                extras.clear();
                tool_calls.clear();
                gathered = 0;
            }
            StreamEvent::Usage(u) => usage = Some(u),
            StreamEvent::Finish {
                reason: FinishReason::Truncated,
                envelope,
            } => return Err(ErrorReply::truncated_whole(*envelope)),
            StreamEvent::Finish { reason, envelope } => {
                return Ok(Answer {
                    text,
                    thinking,
                    extras,
                    tool_calls,
                    usage,
                    finish: reason,
                    envelope: *envelope,
                })
            }
            StreamEvent::Error(e) => return Err(ErrorReply::after_commit(*e)),
        }
    }
    Err(ErrorReply::broken_stream("ended without a finish", Some(start)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ErrorClass;
    use crate::types::ErrorEvent;
    use futures::stream;

    fn events(list: Vec<StreamEvent>) -> EventStream {
        Box::pin(stream::iter(list))
    }

    fn finish(reason: FinishReason) -> StreamEvent {
        StreamEvent::Finish {
            reason,
            envelope: Box::new(Envelope::default()),
        }
    }

    #[tokio::test]
    async fn commit_is_the_start_event() {
        let mut s = events(vec![StreamEvent::Start(Box::new(Envelope {
            attempts: 2,
            ..Envelope::default()
        }))]);
        let env = await_commit(&mut s).await;
        assert_eq!(env.map(|e| e.attempts), Ok(2), "start's envelope is returned");
    }

    #[tokio::test]
    async fn an_error_first_is_an_http_error_with_its_status() {
        let mut s = events(vec![StreamEvent::Error(Box::new(ErrorEvent {
            code: None,
            class: ErrorClass::RateLimited,
            status: 429,
            message: "all routes rate limited".into(),
            retry_after: Some(std::time::Duration::from_secs(2)),
            envelope: Envelope::default(),
        }))]);
        let reply = await_commit(&mut s).await.err();
        assert_eq!(reply.as_ref().map(|r| r.status), Some(429), "the mux's status is kept");
        assert_eq!(reply.and_then(|r| r.retry_after_ms()), Some(2000), "retry hint is kept");
    }

    #[tokio::test]
    async fn text_before_start_breaks_the_contract() {
        let mut s = events(vec![StreamEvent::TextDelta("hi".into())]);
        assert_eq!(
            await_commit(&mut s).await.err().map(|r| r.status),
            Some(500),
            "internal error"
        );
    }

    #[tokio::test]
    async fn drain_gathers_text_tools_and_usage() {
        let call = ToolCall {
            index: 0,
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
        };
        let s = events(vec![
            StreamEvent::TextDelta("Hel".into()),
            StreamEvent::TextDelta("lo".into()),
            StreamEvent::ToolCall(Box::new(call.clone())),
            StreamEvent::Usage(Usage::new(3, 2)),
            finish(FinishReason::ToolCalls),
        ]);
        let answer = drain(Envelope::default(), s, usize::MAX).await;
        let answer = answer.as_ref().ok();
        assert_eq!(answer.map(|a| a.text.as_str()), Some("Hello"), "text is joined");
        assert_eq!(
            answer.map(|a| a.tool_calls.clone()),
            Some(vec![call]),
            "tool calls kept"
        );
        assert_eq!(
            answer.and_then(|a| a.usage).map(|u| u.output_tokens),
            Some(2),
            "usage kept"
        );
    }

    #[tokio::test]
    async fn reset_discards_what_was_gathered() {
        let s = events(vec![
            StreamEvent::TextDelta("wrong".into()),
            StreamEvent::Reset {
                reason: "route failed".into(),
            },
            StreamEvent::TextDelta("right".into()),
            finish(FinishReason::Stop),
        ]);
        let text = drain(Envelope::default(), s, usize::MAX).await.map(|a| a.text);
        assert_eq!(text, Ok("right".to_string()), "only the text after the reset survives");
    }

    #[tokio::test]
    async fn truncated_and_unfinished_answers_are_errors() {
        let s = events(vec![
            StreamEvent::TextDelta("par".into()),
            finish(FinishReason::Truncated),
        ]);
        let reply = drain(Envelope::default(), s, usize::MAX).await.err();
        assert_eq!(
            reply.as_ref().and_then(|r| r.code),
            Some("truncated"),
            "truncation is not a success"
        );
        let message = reply.map(|r| r.message).unwrap_or_default();
        assert!(
            message.contains("nothing was sent") && !message.contains("what was sent"),
            "a non-streaming client is told it got nothing, not that what it got is incomplete: {message}"
        );

        let s = events(vec![StreamEvent::TextDelta("par".into())]);
        let reply = drain(Envelope::default(), s, usize::MAX).await.err();
        assert_eq!(
            reply.map(|r| r.status),
            Some(500),
            "a stream that just stops is an error"
        );
    }

    #[tokio::test]
    async fn an_answer_past_the_limit_is_refused_and_stops_being_read() {
        let read = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = std::sync::Arc::clone(&read);
        // An upstream that never stops: the drain must end at the limit, not gather forever.
        let endless = stream::repeat_with(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            StreamEvent::TextDelta("0123456789".into())
        });
        let reply = drain(Envelope::default(), Box::pin(endless), 95).await.err();
        assert_eq!(reply.as_ref().and_then(|r| r.code), Some("answer_too_large"));
        assert_eq!(reply.map(|r| r.status), Some(502));
        assert_eq!(
            read.load(std::sync::atomic::Ordering::Relaxed),
            10,
            "read up to the limit and no further"
        );

        // Exactly at the limit is whole; a reset starts the count again; tool calls count.
        let call = ToolCall {
            index: 0,
            id: "c".into(),
            name: "f".into(),
            arguments: "{}".into(),
        };
        let s = events(vec![
            StreamEvent::TextDelta("012345678".into()),
            StreamEvent::Reset {
                reason: "route failed".into(),
            },
            StreamEvent::TextDelta("01234".into()),
            StreamEvent::ToolCall(Box::new(call.clone())),
            finish(FinishReason::ToolCalls),
        ]);
        let answer = drain(Envelope::default(), s, 9).await.map(|a| a.text);
        assert_eq!(answer, Ok("01234".to_string()));
        let s = events(vec![
            StreamEvent::TextDelta("01234".into()),
            StreamEvent::ToolCall(Box::new(call)),
            finish(FinishReason::ToolCalls),
        ]);
        let reply = drain(Envelope::default(), s, 8).await.err();
        assert_eq!(
            reply.and_then(|r| r.code),
            Some("answer_too_large"),
            "5 + 4 bytes of call is over 8"
        );
    }
}
