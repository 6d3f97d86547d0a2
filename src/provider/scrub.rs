//! Route keys out of the text an upstream streams: an upstream that echoes the headers it
//! received into its answer (a relay, a misconfigured local server, a prompt that asks) must
//! not hand our key to the client, nor, through a continuation's prefill, to another
//! provider. Done on each attempt's deltas, before the mux records or forwards them.
//!
//! Only the secrets registered with `register_secret` are looked for (the routes' configured
//! keys, and an echo cut short after their first `FRAGMENT_CHARS` characters): answer text
//! legitimately holds `sk-…`-looking examples and `Bearer` in code, which the error redactor's
//! other patterns would mangle.
//!
//! A key can be split across deltas, so each channel (the text, or one tool call's arguments)
//! keeps:
//! - the end of what it already passed on (`context`), searched with the next piece;
//! - a held-back end (`held`) when that end is the start of a key's fragment, at least
//!   `HOLD_MIN` bytes long: held until the next piece shows whether the key goes on. Shorter
//!   ends are passed on at once (ordinary words end in "s" or "sk"), so at most the first
//!   `HOLD_MIN − 1` characters of a key ("sk-") can go out before it is recognised;
//! - when a fragment match ran to the end of the piece, the key's start so far (`in_key`):
//!   the rest of that key, arriving next, is dropped too, and only that: the text after the
//!   key's last character is kept. (An echo that is not a registered key's start, one cut
//!   short and changed, has the rest of its word dropped.)
//!
//! At a seam (an attempt fails mid-stream and another carries on):
//! - a failed attempt's held end is dropped, never flushed: only a clean end (the finish, or
//!   another channel) releases it. The mux records only what it is handed, so what the client
//!   holds, and what a continuation's prefill says, ends before it;
//! - a continuation's scrubber starts from the text the client holds (its prefill) as the
//!   text's context, so the rest of a key whose first characters went out before the seam is
//!   still recognised, and a key replaced just before the cut has the rest of its word
//!   dropped (or, when text is glued after the key's end, "…WXYZ.", only the key's rest). A restart starts from nothing and needs no context. Tool calls never cross a
//!   seam: a partial call is never forwarded, and no continuation follows a call.
//!
//! Log-probabilities (`ExtraField::Logprobs`) spell the answer's tokens again, and cannot be
//! held back and cut as text is: once the tokens they list (joined, after the end of those
//! before) hold a key, or end with what could be a key's start, they and every later list of
//! the attempt are dropped (`LogprobsGuard`).
//!
//! With no key registered (the simulated routes) the stream is returned as is.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;

use super::error::{
    any_registered, continues_registered, ends_value, ends_with_registered, fragment_start_at_end, registered_end_in,
    registered_spans, replace_spans, rest_of_registered, FRAGMENT_CHARS, REDACTED,
};
use super::{Delta, DeltaStream, ProviderError, ToolFragment};
use crate::types::{Extra, ExtraField, Thinking};

/// The shortest end of a piece held back as the possible start of a key.
const HOLD_MIN: usize = 4;

/// `stream` with every registered key in its text and tool arguments replaced by
/// `[redacted]`. `committed` is the text the client already holds of this answer (a
/// continuation's partial answer, else empty): its end is the context the stream's first
/// text is searched with, so a key begun before the seam is recognised after it.
pub fn scrub(stream: DeltaStream, committed: &str) -> DeltaStream {
    if !any_registered() {
        return stream;
    }
    let mut state = Carry::default();
    let channel = (!committed.is_empty()).then(|| {
        state.seed(committed);
        Channel::Text
    });
    Box::pin(Scrubbed {
        inner: stream,
        channel,
        state,
        thinking: Carry::default(),
        // A continuation's lists may go on spelling a key cut at the seam, which the lists
        // alone cannot tell: after such a seam, none of them pass.
        logprobs: LogprobsGuard {
            context: seam_context(committed).to_string(),
            closed: committed.ends_with(REDACTED),
        },
        queued: None,
        done: false,
    })
}

/// Passes an attempt's logprobs while the tokens they spell hold no key (see the module's
/// docs); after the first that might, none.
#[derive(Debug, Default)]
struct LogprobsGuard {
    /// The end of the tokens passed so far, as for text (`CONTEXT_BYTES`).
    context: String,
    closed: bool,
}

impl LogprobsGuard {
    fn pass(&mut self, logprobs: &Extra) -> bool {
        #[derive(serde::Deserialize)]
        struct Token {
            #[serde(default)]
            token: String,
            #[serde(default)]
            top_logprobs: Vec<TopToken>,
        }
        #[derive(serde::Deserialize)]
        struct TopToken {
            #[serde(default)]
            token: String,
        }
        #[derive(serde::Deserialize)]
        struct Lists {
            #[serde(default)]
            content: Option<Vec<Token>>,
            #[serde(default)]
            refusal: Option<Vec<Token>>,
        }
        if self.closed {
            return false;
        }
        let Ok(lists) = serde_json::from_str::<Lists>(logprobs.value.text()) else {
            // Not the shape this reads: what it holds cannot be checked.
            self.closed = true;
            return false;
        };
        let tokens: Vec<Token> = lists.content.into_iter().chain(lists.refusal).flatten().collect();
        let alternatives = tokens.iter().flat_map(|t| &t.top_logprobs).map(|t| t.token.as_str());
        let mut joined = std::mem::take(&mut self.context);
        joined.extend(tokens.iter().map(|t| t.token.as_str()));
        let safe = registered_spans(&joined).is_empty()
            && fragment_start_at_end(&joined, HOLD_MIN) == 0
            && alternatives.clone().all(|t| registered_spans(t).is_empty());
        let keep = CONTEXT_BYTES.min(joined.len());
        self.context = joined[ceil_boundary(&joined, joined.len() - keep)..].to_string();
        self.closed = !safe;
        safe
    }
}

/// The end of `committed` that `scrub` searches with: what a carry keeps of passed text.
pub fn seam_context(committed: &str) -> &str {
    let keep = CONTEXT_BYTES.min(committed.len());
    &committed[ceil_boundary(committed, committed.len() - keep)..]
}

/// Bytes of passed text a carry keeps: a fragment of up to `FRAGMENT_CHARS` four-byte
/// characters (of which at most `FRAGMENT_CHARS − 1` can have passed unrecognised).
const CONTEXT_BYTES: usize = FRAGMENT_CHARS * 4;

/// Which text a carry belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    Text,
    Tool(u32),
}

#[derive(Debug, Default)]
struct Carry {
    held: String,
    context: String,
    /// The start of a key matched up to the end of the last piece: its rest is dropped.
    in_key: Option<String>,
    /// After a seed ending with a replaced key: the start of the next word so far, held while
    /// it could be the rest of that key (`None` once the word is judged).
    seam_word: Option<String>,
}

impl Carry {
    /// What of `piece` (after what was held) can be passed on now.
    fn pass(&mut self, piece: &str) -> String {
        let mut text = std::mem::take(&mut self.held);
        text.push_str(piece);
        if let Some(start) = self.seam_word.take() {
            let end = text.find(ends_value).unwrap_or(text.len());
            let word = format!("{start}{}", &text[..end]);
            let key_end = registered_end_in(&word);
            if !continues_registered(&word) && key_end >= HOLD_MIN.max(start.len()) {
                // The rest of a key with text glued after it ("…WXYZ."): only the key goes.
                // (Fewer than `HOLD_MIN` bytes ending a key are taken for ordinary text, as
                // many words start with one.)
                text.drain(..key_end - start.len());
            } else if !continues_registered(&word) {
                // Not the rest of a key (a continuation that started over, say): passed on.
                text.insert_str(0, &start);
            } else if end == text.len() {
                self.seam_word = Some(word);
                return String::new();
            } else {
                text.drain(..end);
            }
        }
        if let Some(mut word) = self.in_key.take() {
            // The rest of the key, when the text goes on as a registered key does; else (an
            // echo changed after its fragment) the rest of the word.
            let rest = rest_of_registered(&word, &text).unwrap_or_else(|| text.find(ends_value).unwrap_or(text.len()));
            word.extend(text.drain(..rest));
            if text.is_empty() {
                self.in_key = Some(word);
            }
        }
        let joined = format!("{}{text}", self.context);
        let spans = registered_spans(&joined);
        // A fragment's match runs to the end of its word: at the end of the piece, the key
        // may go on in the next one. (No span replaced: nothing to go on, even when the piece
        // and its context are empty, as a tool call's first fragment's arguments are.)
        let key_start = spans
            .iter()
            .filter(|(_, end)| *end == joined.len())
            .map(|(start, _)| *start)
            .min();
        let (mut out, last_end) = replace_spans(&joined, spans, self.context.len());
        if let Some(start) = key_start.filter(|_| last_end == Some(joined.len()) && !ends_with_registered(&joined)) {
            self.in_key = Some(joined[start..].to_string());
        }
        let hold = if out.ends_with(REDACTED) {
            0
        } else {
            let seen = format!("{}{out}", self.context);
            fragment_start_at_end(&seen, HOLD_MIN).min(out.len())
        };
        let cut = floor_boundary(&out, out.len() - hold);
        self.held = out.split_off(cut);
        self.remember(&out);
        out
    }

    /// Carries on from `committed`, text already passed on by an earlier attempt: its end is
    /// the context, and when it ends with a replaced key (the earlier attempt may have been
    /// cut inside it) a first word that could be the rest of a registered key is dropped.
    /// Unlike the rest of a word within one attempt, it is judged first: a continuation that
    /// starts over begins with the answer's first word, which the seam must see.
    fn seed(&mut self, committed: &str) {
        self.remember(committed);
        self.seam_word = committed.ends_with(REDACTED).then(String::new);
    }

    /// Everything held, at the end of the channel.
    fn flush(&mut self) -> String {
        self.context.clear();
        self.in_key = None;
        // A first word still held as the possible rest of a key never goes out.
        self.seam_word = None;
        std::mem::take(&mut self.held)
    }

    fn remember(&mut self, passed: &str) {
        self.context.push_str(passed);
        if self.context.len() > CONTEXT_BYTES {
            let cut = ceil_boundary(&self.context, self.context.len() - CONTEXT_BYTES);
            self.context.drain(..cut);
        }
    }
}

/// `s` with its registered keys (or echoes of one cut short) replaced; `None` when it holds
/// none.
fn scrub_whole(s: &str) -> Option<String> {
    let spans = registered_spans(s);
    (!spans.is_empty()).then(|| replace_spans(s, spans, 0).0)
}

fn floor_boundary(s: &str, mut at: usize) -> usize {
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn ceil_boundary(s: &str, mut at: usize) -> usize {
    while !s.is_char_boundary(at) {
        at += 1;
    }
    at
}

struct Scrubbed {
    inner: DeltaStream,
    channel: Option<Channel>,
    state: Carry,
    /// The route's reasoning text, carried on its own: a key echoed there is as visible as
    /// in the answer, and reasoning between two pieces of text (or before a continuation's
    /// first) must not cost the text its carry.
    thinking: Carry,
    logprobs: LogprobsGuard,
    /// A delta that follows a flushed one.
    queued: Option<Result<Delta, ProviderError>>,
    done: bool,
}

impl Scrubbed {
    /// At the end: the held reasoning first, then the current channel's held text (one a
    /// call; `None` once nothing is held).
    fn flush(&mut self) -> Option<Delta> {
        let thought = self.thinking.flush();
        if !thought.is_empty() {
            return Some(Delta::Thinking(Thinking::Text(thought.into())));
        }
        self.flush_channel()
    }

    /// The current channel's held text as a delta of its own, if any; the channel ends.
    fn flush_channel(&mut self) -> Option<Delta> {
        let channel = self.channel.take()?;
        let held = self.state.flush();
        if held.is_empty() {
            return None;
        }
        Some(match channel {
            Channel::Text => Delta::Text(held),
            Channel::Tool(index) => Delta::tool(ToolFragment {
                index,
                id: None,
                name: None,
                arguments: held,
            }),
        })
    }

    /// `delta` made safe; `None` when all of it is held back. A delta of another channel, or
    /// not a piece of text, first flushes the current channel (returned first).
    fn take(&mut self, delta: Delta) -> (Option<Delta>, Option<Delta>) {
        let channel = match &delta {
            Delta::Text(_) => Some(Channel::Text),
            Delta::Thinking(Thinking::Text(text)) => {
                let out = self.thinking.pass(text);
                return (
                    None,
                    (!out.is_empty()).then(|| Delta::Thinking(Thinking::Text(out.into()))),
                );
            }
            Delta::ToolFragment(f) => Some(Channel::Tool(f.index)),
            // A usage figure or an extra (the logprobs each text delta follows) between two
            // pieces of text ends neither: a key split around it is still one key. (A
            // thinking block's signature is opaque ciphertext, as a redacted block is.)
            Delta::Extra(e) if e.field == ExtraField::Logprobs => {
                return (None, self.logprobs.pass(e).then_some(delta));
            }
            Delta::Usage(_) | Delta::Extra(_) => return (None, Some(delta)),
            _ => None,
        };
        let flushed = if channel != self.channel {
            self.flush_channel()
        } else {
            None
        };
        self.channel = channel;
        let delta = match delta {
            Delta::Text(text) => {
                let out = self.state.pass(&text);
                (!out.is_empty()).then_some(Delta::Text(out))
            }
            Delta::ToolFragment(mut f) => {
                // An id or a name comes whole in one fragment: no carry. A replaced id is
                // still unique within the answer, as the client's tool result must name it.
                if f.id.as_deref().and_then(scrub_whole).is_some() {
                    f.id = Some(format!("call_{}_{REDACTED}", f.index));
                }
                if let Some(clean) = f.name.as_deref().and_then(scrub_whole) {
                    f.name = Some(clean);
                }
                f.arguments = self.state.pass(&f.arguments);
                // The first fragment carries the call's id and name: it goes on even empty.
                (!f.arguments.is_empty() || f.id.is_some() || f.name.is_some()).then_some(Delta::ToolFragment(f))
            }
            other => Some(other),
        };
        (flushed, delta)
    }
}

impl Stream for Scrubbed {
    type Item = Result<Delta, ProviderError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(next) = this.queued.take() {
            return Poll::Ready(Some(next));
        }
        loop {
            if this.done {
                return Poll::Ready(this.flush().map(Ok));
            }
            match this.inner.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => this.done = true,
                Poll::Ready(Some(Err(e))) => {
                    // The answer failed: a held possible start of a key never goes out. What
                    // the client holds (and a continuation carries on from) ends before it.
                    this.channel = None;
                    this.state.flush();
                    this.thinking.flush();
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(Some(Ok(delta))) => match this.take(delta) {
                    (Some(flushed), Some(delta)) => {
                        this.queued = Some(Ok(delta));
                        return Poll::Ready(Some(Ok(flushed)));
                    }
                    (Some(one), None) | (None, Some(one)) => return Poll::Ready(Some(Ok(one))),
                    (None, None) => {}
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;
    use crate::provider::register_secret;
    use crate::types::FinishReason;

    const KEY: &str = "sk-scrubtest-0123456789abcdefXYZ";

    fn text_of(deltas: &[Delta]) -> String {
        deltas
            .iter()
            .filter_map(|d| match d {
                Delta::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    async fn run(pieces: Vec<Delta>) -> Vec<Delta> {
        let items = run_from("", pieces.into_iter().map(Ok).collect()).await;
        items.into_iter().map(|d| d.expect("no error")).collect()
    }

    /// An attempt's items scrubbed as a continuation of `committed`.
    async fn run_from(committed: &str, items: Vec<Result<Delta, ProviderError>>) -> Vec<Result<Delta, ProviderError>> {
        assert!(register_secret(KEY), "the test key registers");
        let stream: DeltaStream = Box::pin(futures::stream::iter(items));
        scrub(stream, committed).collect().await
    }

    fn cut() -> ProviderError {
        ProviderError::new(crate::provider::ErrorClass::Unavailable, "upstream body failed")
    }

    fn text_items(items: &[Result<Delta, ProviderError>]) -> String {
        items
            .iter()
            .filter_map(|d| match d {
                Ok(Delta::Text(t)) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    /// No piece of `KEY` longer than the `HOLD_MIN − 1` characters that may go out.
    fn assert_no_key_piece(what: &str, text: &str) {
        for piece in KEY.as_bytes().windows(HOLD_MIN) {
            let piece = std::str::from_utf8(piece).unwrap_or_default();
            assert!(!text.contains(piece), "{what}: {piece:?} of the key went out: {text}");
        }
    }

    fn texts(parts: &[&str]) -> Vec<Delta> {
        let mut out: Vec<Delta> = parts.iter().map(|p| Delta::Text((*p).to_string())).collect();
        out.push(Delta::Finish(FinishReason::Stop));
        out
    }

    fn logprobs(tokens: &[&str]) -> Delta {
        let list: Vec<_> = tokens
            .iter()
            .map(|t| serde_json::json!({"token": t, "logprob": -0.1, "bytes": [], "top_logprobs": []}))
            .collect();
        let value = serde_json::json!({"content": list, "refusal": null}).to_string();
        Delta::Extra(Box::new(Extra {
            wire: crate::types::Wire::OpenAi,
            field: ExtraField::Logprobs,
            value: crate::types::RawJson::new(serde_json::value::RawValue::from_string(value).expect("JSON")),
        }))
    }

    fn thought(t: &str) -> Delta {
        Delta::Thinking(Thinking::Text(t.into()))
    }

    fn channel_text(out: &[Delta], thinking: bool) -> String {
        out.iter()
            .filter_map(|d| match d {
                Delta::Text(t) if !thinking => Some(&**t),
                Delta::Thinking(Thinking::Text(t)) if thinking => Some(&**t),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn reasoning_between_two_pieces_of_a_key_neither_lets_it_out_nor_costs_the_text_its_carry() {
        for k in [HOLD_MIN, KEY.len() / 2, KEY.len() - 2] {
            let out = run(vec![
                Delta::Text(format!("my key is {}", &KEY[..k])),
                thought("Let me think."),
                Delta::Text(format!("{} ok", &KEY[k..])),
                thought(&format!("the key {}", &KEY[..k])),
                thought(&format!("{} again", &KEY[k..])),
                Delta::Finish(FinishReason::Stop),
            ])
            .await;
            let (text, reasoning) = (channel_text(&out, false), channel_text(&out, true));
            assert_no_key_piece("text", &text);
            assert_no_key_piece("reasoning", &reasoning);
            assert!(text.starts_with("my key is ") && text.ends_with(" ok"), "{k}: {text}");
            assert!(reasoning.starts_with("Let me think.the key "), "{k}: {reasoning}");
        }
        // A continuation that reasons first still knows the key its seam cut.
        let k = KEY.len() / 2;
        let items = vec![
            Ok(thought("Resuming.")),
            Ok(Delta::Text(format!("{} and on", &KEY[k..]))),
            Ok(Delta::Finish(FinishReason::Stop)),
        ];
        let out: Vec<Delta> = run_from(&format!("the key {}", &KEY[..k]), items)
            .await
            .into_iter()
            .map(|d| d.expect("no error"))
            .collect();
        let text = channel_text(&out, false);
        assert_no_key_piece("continued text", &text);
        assert!(text.ends_with(" and on"), "{text}");
    }

    #[tokio::test]
    async fn logprobs_that_spell_a_key_are_dropped_from_the_first_that_might_and_text_stays_whole() {
        let (a, b) = KEY.split_at(KEY.len() / 2);
        let out = run(vec![
            logprobs(&["my", " key"]),
            Delta::Text("my key".into()),
            logprobs(&[" is ", a]),
            Delta::Text(format!(" is {a}")),
            logprobs(&[b]),
            Delta::Text(b.to_string()),
            logprobs(&[" ok"]),
            Delta::Text(" ok".into()),
            Delta::Finish(FinishReason::Stop),
        ])
        .await;
        let passed: Vec<&Delta> = out.iter().filter(|d| matches!(d, Delta::Extra(_))).collect();
        assert_eq!(
            passed,
            [&logprobs(&["my", " key"])],
            "only the list before the key: {out:?}"
        );
        let text: String = out
            .iter()
            .filter_map(|d| match d {
                Delta::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_no_key_piece("text", &text);
        assert!(text.starts_with("my key is ") && text.ends_with(" ok"), "{text}");
        let clean = run(vec![
            logprobs(&["fine"]),
            Delta::Text("fine".into()),
            Delta::Finish(FinishReason::Stop),
        ])
        .await;
        assert_eq!(clean[0], logprobs(&["fine"]), "a list without a key passes as sent");
    }

    #[tokio::test]
    async fn a_key_split_at_every_offset_never_goes_out() {
        let answer = format!("my key is {KEY}, keep it.");
        for cut in 1..answer.len() {
            let got = run(texts(&[&answer[..cut], &answer[cut..]])).await;
            let text = text_of(&got);
            assert!(!text.contains("0123456789"), "cut at {cut}: {text}");
            assert!(text.starts_with("my key is "), "cut at {cut}: {text}");
            assert!(text.ends_with(", keep it."), "cut at {cut}: {text}");
            assert!(text.contains(REDACTED), "cut at {cut}: {text}");
            assert!(matches!(got.last(), Some(Delta::Finish(_))), "the finish stays last");
        }
    }

    /// `text` with the start of the key that may go out before a `[redacted]` (under
    /// `HOLD_MIN` characters, depending on the cut) taken away.
    fn without_leaked_starts(text: &str) -> String {
        (1..HOLD_MIN).rev().fold(text.to_string(), |text, k| {
            text.replace(&format!("{}{REDACTED}", &KEY[..k]), REDACTED)
        })
    }

    #[tokio::test]
    async fn only_the_key_is_replaced_at_every_delta_size() {
        let answer = format!("Your key is {KEY} and again {KEY}. Done. ({KEY},next) {KEY}");
        let expected = format!("Your key is {REDACTED} and again {REDACTED}. Done. ({REDACTED},next) {REDACTED}");
        for size in 1..=answer.len() {
            let pieces: Vec<&str> = answer
                .as_bytes()
                .chunks(size)
                .map(|c| std::str::from_utf8(c).unwrap_or_default())
                .collect();
            let text = text_of(&run(texts(&pieces)).await);
            assert_no_key_piece(&format!("deltas of {size}"), &text);
            assert_eq!(without_leaked_starts(&text), expected, "deltas of {size}");
        }
    }

    #[tokio::test]
    async fn a_key_dripped_a_character_at_a_time_never_goes_out() {
        let answer = format!("echo: {KEY} done");
        let pieces: Vec<String> = answer.chars().map(String::from).collect();
        let got = run(texts(&pieces.iter().map(String::as_str).collect::<Vec<_>>())).await;
        let text = text_of(&got);
        assert!(!text.contains("scrubtest"), "{text}");
        // Under `HOLD_MIN` characters of a key's start go out before it is recognised.
        assert_eq!(text, format!("echo: sk-{REDACTED} done"));
    }

    #[tokio::test]
    async fn ordinary_text_passes_unchanged_and_unheld() {
        let got = run(texts(&["it was sk", "etchy, the task's sks ", "and sk-learn"])).await;
        assert_eq!(
            got[..3],
            [
                Delta::Text("it was sk".into()),
                Delta::Text("etchy, the task's sks ".into()),
                Delta::Text("and sk-learn".into()),
            ],
            "{got:?}"
        );
    }

    #[tokio::test]
    async fn a_held_start_of_a_key_that_is_not_one_goes_out_before_the_end() {
        let got = run(texts(&["sk-scrub", "bing floors"])).await;
        assert_eq!(text_of(&got), "sk-scrubbing floors");
        let got = run(texts(&["ends sk-scrubt"])).await;
        assert_eq!(text_of(&got), "ends sk-scrubt", "flushed at the finish: {got:?}");
        assert!(matches!(got.last(), Some(Delta::Finish(_))));
    }

    #[tokio::test]
    async fn tool_arguments_are_scrubbed_per_call() {
        let first = format!("{{\"k\": \"{}", &KEY[..10]);
        let second = format!("{}\"}}", &KEY[10..]);
        let got = run(vec![
            Delta::tool(ToolFragment {
                index: 0,
                id: Some("c".into()),
                name: Some("f".into()),
                arguments: first,
            }),
            Delta::tool(ToolFragment {
                index: 0,
                id: None,
                name: None,
                arguments: second,
            }),
            Delta::ToolEnd { index: 0 },
        ])
        .await;
        let args: String = got
            .iter()
            .filter_map(|d| match d {
                Delta::ToolFragment(f) => Some(f.arguments.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(args, format!("{{\"k\": \"{REDACTED}\"}}"), "{got:?}");
        assert!(matches!(&got[0], Delta::ToolFragment(f) if f.id.as_deref() == Some("c")));
    }

    fn fragment(index: u32, id: Option<&str>, name: Option<&str>, arguments: &str) -> Delta {
        Delta::tool(ToolFragment {
            index,
            id: id.map(Into::into),
            name: name.map(Into::into),
            arguments: arguments.into(),
        })
    }

    fn arguments_of(deltas: &[Delta], index: u32) -> String {
        deltas
            .iter()
            .filter_map(|d| match d {
                Delta::ToolFragment(f) if f.index == index => Some(f.arguments.as_str()),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn a_call_whose_first_fragment_has_empty_arguments_keeps_every_argument_byte() {
        // As api.openai.com streams a call: id and name with `arguments: ""`, then pieces;
        // a second call after it the same way. With a key registered, nothing is dropped.
        let got = run(vec![
            fragment(0, Some("call_a"), Some("get_weather"), ""),
            fragment(0, None, None, "{\"ci"),
            fragment(0, None, None, "ty\": \"Paris\"}"),
            Delta::ToolEnd { index: 0 },
            fragment(1, Some("call_b"), Some("get_time"), ""),
            fragment(1, None, None, "{\"tz\":"),
            fragment(1, None, None, " \"CET\"}"),
            Delta::ToolEnd { index: 1 },
        ])
        .await;
        assert_eq!(arguments_of(&got, 0), "{\"city\": \"Paris\"}", "{got:?}");
        assert_eq!(arguments_of(&got, 1), "{\"tz\": \"CET\"}", "{got:?}");
        let text = run(texts(&["", "hello ", "world"])).await;
        assert_eq!(text_of(&text), "hello world", "an empty text delta first drops nothing");
    }

    #[tokio::test]
    async fn a_key_echoed_in_a_call_id_or_name_never_goes_out() {
        let got = run(vec![
            fragment(0, Some(KEY), Some("f"), ""),
            fragment(0, None, None, "{}"),
            Delta::ToolEnd { index: 0 },
            fragment(1, Some(&format!("id-{KEY}")), Some(&format!("g{KEY}")), "{}"),
            Delta::ToolEnd { index: 1 },
        ])
        .await;
        let ids: Vec<&str> = got
            .iter()
            .filter_map(|d| match d {
                Delta::ToolFragment(f) => f.id.as_deref(),
                _ => None,
            })
            .collect();
        assert_eq!(
            ids,
            [format!("call_0_{REDACTED}"), format!("call_1_{REDACTED}")],
            "{got:?}"
        );
        assert!(!format!("{got:?}").contains("scrubtest"), "{got:?}");
        assert_eq!(arguments_of(&got, 0), "{}");
    }

    #[tokio::test]
    async fn a_failed_answer_never_lets_a_held_start_of_a_key_out() {
        for k in 0..KEY.len() {
            let items = run_from(
                "",
                vec![
                    Ok(Delta::Text("my key is ".into())),
                    Ok(Delta::Text(KEY[..k].into())),
                    Err(cut()),
                ],
            )
            .await;
            let text = text_items(&items);
            assert_no_key_piece(&format!("cut at {k}"), &text);
            let expected = match k {
                0..HOLD_MIN => format!("my key is {}", &KEY[..k]),
                HOLD_MIN..FRAGMENT_CHARS => "my key is ".to_string(),
                _ => format!("my key is {REDACTED}"),
            };
            assert_eq!(text, expected, "cut at {k}: {items:?}");
            assert!(
                matches!(items.last(), Some(Err(_))),
                "the failure stays last: {items:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_key_cut_by_a_seam_at_every_offset_never_goes_out() {
        // The first attempt is cut `k` bytes into the key; the continuation carries on from
        // what the client holds, as its prefill says, or (a prefill holding a replaced key)
        // with the rest of the key it knows.
        let answer = format!("my key is {KEY} ok");
        let start = "my key is ".len();
        for k in 0..=KEY.len() {
            let first = run_from(
                "",
                vec![
                    Ok(Delta::Text(answer[..start].into())),
                    Ok(Delta::Text(answer[start..start + k].into())),
                    Err(cut()),
                ],
            )
            .await;
            let committed = text_items(&first);
            let rest = answer.strip_prefix(committed.as_str()).unwrap_or(&answer[start + k..]);
            let second = run_from(
                &committed,
                vec![Ok(Delta::Text(rest.into())), Ok(Delta::Finish(FinishReason::Stop))],
            )
            .await;
            let client = format!("{committed}{}", text_items(&second));
            assert_no_key_piece(&format!("cut at {k}"), &client);
            let shown = &KEY[..if k < HOLD_MIN { k } else { 0 }];
            assert_eq!(client, format!("my key is {shown}{REDACTED} ok"), "cut at {k}");
        }
    }

    #[tokio::test]
    async fn a_continuation_drips_the_rest_of_a_key_and_none_of_it_goes_out() {
        for k in 1..HOLD_MIN {
            let committed = format!("my key is {}", &KEY[..k]);
            let mut items: Vec<Result<Delta, ProviderError>> = KEY[k..]
                .chars()
                .chain(" ok".chars())
                .map(|c| Ok(Delta::Text(c.to_string())))
                .collect();
            items.push(Ok(Delta::Finish(FinishReason::Stop)));
            let out = text_items(&run_from(&committed, items).await);
            // As in one attempt: under `HOLD_MIN` characters of the key go out in all.
            assert_eq!(
                format!("{committed}{out}"),
                format!("my key is {}{REDACTED} ok", &KEY[..HOLD_MIN - 1]),
                "cut at {k}"
            );
        }
    }

    #[tokio::test]
    async fn after_a_replaced_key_only_the_rest_of_a_key_is_dropped() {
        let committed = format!("my key is {REDACTED}");
        let dripped: Vec<String> = KEY[14..].chars().map(String::from).chain([" ok".into()]).collect();
        let dripped: Vec<&str> = dripped.iter().map(String::as_str).collect();
        for (parts, expected) in [
            (vec![&KEY[14..], " ok"], " ok".to_string()),
            (dripped, " ok".to_string()),
            (vec![&KEY[20..24]], String::new()),
            (vec!["and then"], "and then".to_string()),
            // A continuation that started over: its first word is the answer's, kept whole
            // for the seam to see the repeat.
            (vec!["my key is ", KEY, " ok"], format!("my key is {REDACTED} ok")),
        ] {
            let out = text_items(&run_from(&committed, texts(&parts).into_iter().map(Ok).collect()).await);
            assert_eq!(out, expected, "{parts:?}");
        }
    }

    #[tokio::test]
    async fn after_a_replaced_key_its_rest_glued_to_punctuation_is_dropped() {
        let committed = format!("my key is {REDACTED}");
        // The first attempt was cut `k` bytes into the key, past its fragment, with at least
        // `HOLD_MIN` bytes of it left.
        for (k, size) in
            (FRAGMENT_CHARS..=KEY.len() - HOLD_MIN).flat_map(|k| (1..=KEY.len() - k + 7).map(move |size| (k, size)))
        {
            let rest = format!("{}. Done.", &KEY[k..]);
            let pieces: Vec<&str> = rest
                .as_bytes()
                .chunks(size)
                .map(|c| std::str::from_utf8(c).unwrap_or_default())
                .collect();
            let out = text_items(&run_from(&committed, texts(&pieces).into_iter().map(Ok).collect()).await);
            assert_eq!(out, ". Done.", "cut at {k}, pieces of {size}");
        }
    }

    #[tokio::test]
    async fn a_continuation_of_ordinary_text_passes_unchanged() {
        let out = run_from(
            "ends with sk",
            vec![
                Ok(Delta::Text("etchy lines, the [redacted] part".into())),
                Ok(Delta::Finish(FinishReason::Stop)),
            ],
        )
        .await;
        assert_eq!(text_items(&out), "etchy lines, the [redacted] part");
        let out = run_from(
            "the word was [redacted]",
            vec![
                Ok(Delta::Text(" and then".into())),
                Ok(Delta::Finish(FinishReason::Stop)),
            ],
        )
        .await;
        assert_eq!(
            text_items(&out),
            " and then",
            "only the rest of a replaced word is dropped"
        );
    }

    #[tokio::test]
    async fn a_usage_figure_between_two_pieces_of_a_key_releases_nothing() {
        let usage = crate::types::Usage::new(3, 2);
        let got = run(vec![
            Delta::Text(format!("my key is {}", &KEY[..8])),
            Delta::Usage(usage),
            Delta::Text(format!("{} ok", &KEY[8..])),
            Delta::Finish(FinishReason::Stop),
        ])
        .await;
        let text = text_of(&got);
        assert_no_key_piece("usage between", &text);
        assert_eq!(text, format!("my key is {REDACTED} ok"), "{got:?}");
        assert!(got.contains(&Delta::Usage(usage)), "the usage goes on: {got:?}");
    }

    #[tokio::test]
    async fn an_upstream_echoing_the_route_key_never_passes_it_on() {
        use crate::provider::testkit::{hello, ReplayServer, Reply};
        use crate::provider::{http_client, OpenAiProvider, Provider};

        assert!(register_secret(KEY), "the route's key registers at startup");
        let chunk = |delta: &str| {
            format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{delta}}}]}}\n\n")
        };
        let body = [
            chunk(&format!("{{\"content\":\"my key is {}\"}}", &KEY[..16])),
            chunk(&format!("{{\"content\":\"{} ok\"}}", &KEY[16..])),
            "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n".to_string(),
        ]
        .concat();
        let server = ReplayServer::start(Reply::sse(&body)).await;
        let provider = OpenAiProvider::new(
            format!("{}/v1", server.base),
            "m".into(),
            Some(KEY.into()),
            http_client(),
        );
        let stream = provider.open(hello("req-1")).await.expect("the stream opens");
        let deltas: Vec<Delta> = stream.map(|d| d.expect("no error")).collect().await;
        let text = text_of(&deltas);
        assert_eq!(text, format!("my key is {REDACTED} ok"), "{deltas:?}");
        assert!(
            matches!(deltas.last(), Some(Delta::Finish(FinishReason::Stop))),
            "{deltas:?}"
        );
    }
}
