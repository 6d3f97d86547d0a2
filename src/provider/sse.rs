//! Incremental Server-Sent Events decoder (WHATWG HTML §9.2): upstream bytes in, events out.
//!
//! Hand-written rather than taken from `eventsource-stream` 0.2.3 because that crate panics
//! on a leading UTF-8 BOM (T15), stalls on invalid UTF-8 while its buffer grows, and has no
//! size caps. This decoder:
//! - strips one leading BOM, even when it is split across chunks;
//! - ends lines on CR, LF or CRLF, including a CR at the end of one chunk followed by LF at
//!   the start of the next;
//! - splits lines on bytes and UTF-8-decodes only whole lines, so a character split across
//!   reads is fine (T5) and invalid UTF-8 is an error, not a stall;
//! - fails with `TooLarge` as soon as a line or an event's data passes its cap, without
//!   buffering the rest of an oversized line;
//! - does not dispatch an unterminated last event at EOF (as the spec says) and reports
//!   whether bytes were left, so callers can tell a clean end from a cut one (T11).
//!
//! `id:` is tracked as the last event id; `retry:` is parsed by the spec's rules and ignored
//! (reconnection is not something an upstream adapter does).

use std::error::Error as StdError;

use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Size caps that keep one upstream from making us buffer without bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseLimits {
    /// Longest line accepted, terminator excluded.
    pub max_line_bytes: usize,
    /// Most `data` bytes one event may carry (all its `data:` lines together).
    pub max_event_bytes: usize,
}

impl Default for SseLimits {
    fn default() -> Self {
        SseLimits {
            max_line_bytes: 1024 * 1024,
            max_event_bytes: 4 * 1024 * 1024,
        }
    }
}

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field; `None` when absent or empty (the spec's default type "message").
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: SseData,
    /// The last event id seen on the stream (it persists across events, per spec).
    pub id: Option<String>,
}

/// An event's data, UTF-8. A one-line event's (every upstream's usual) is a slice of the
/// line as it was read from the body, not a copy of it: no allocation per event.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct SseData(Bytes);

impl SseData {
    pub fn as_str(&self) -> &str {
        // Only ever made of whole lines that passed `from_utf8` and the `\n`s between them,
        // so this cannot fail; checking again is one pass over the bytes and no `unsafe`.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Debug for SseData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

impl PartialEq<&str> for SseData {
    fn eq(&self, other: &&str) -> bool {
        self.0 == other.as_bytes()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SseError {
    #[error("SSE {what} exceeds {limit} bytes")]
    TooLarge { what: &'static str, limit: usize },
    #[error("SSE line is not valid UTF-8")]
    InvalidUtf8,
    /// The byte stream underneath failed.
    #[error("transport error while reading the SSE body: {0}")]
    Transport(#[source] Box<dyn StdError + Send + Sync>),
}

/// Bytes in with `push`, events out with `next_event`. Call `next_event` until it returns
/// `Ok(None)` after every `push`; then `finish` at EOF.
#[derive(Debug)]
pub struct SseDecoder {
    limits: SseLimits,
    /// Bytes received and not yet consumed as lines.
    buf: BytesMut,
    /// Length of the unterminated line at the end of `buf`, for the line cap.
    tail_len: usize,
    /// A line grew past the cap; `buf` stops right before the offending byte.
    overflowed: bool,
    bom_checked: bool,
    /// The previous line ended in CR; an LF that follows belongs to it.
    skip_lf: bool,
    failed: bool,
    event_type: Option<String>,
    /// The event's first `data:` line, as a slice of the line read.
    first_data: Option<Bytes>,
    /// The `data:` lines joined, once an event has a second one.
    data: String,
    /// Bytes of data so far, with a `\n` after each line, for the event cap.
    data_len: usize,
    has_data: bool,
    last_id: Option<String>,
}

impl SseDecoder {
    pub fn new(limits: SseLimits) -> Self {
        SseDecoder {
            limits,
            buf: BytesMut::new(),
            tail_len: 0,
            overflowed: false,
            bom_checked: false,
            skip_lf: false,
            failed: false,
            event_type: None,
            first_data: None,
            data: String::new(),
            data_len: 0,
            has_data: false,
            last_id: None,
        }
    }

    /// Appends bytes. Never buffers more of an unterminated line than the line cap allows:
    /// the overflow is reported by `next_event` after the events before it.
    pub fn push(&mut self, chunk: &[u8]) {
        if self.failed || self.overflowed {
            return;
        }
        let mut rest = chunk;
        while !rest.is_empty() {
            match memchr::memchr2(b'\r', b'\n', rest) {
                Some(pos) => {
                    if self.tail_len + pos > self.limits.max_line_bytes {
                        return self.overflow(rest);
                    }
                    self.buf.extend_from_slice(&rest[..=pos]);
                    self.tail_len = 0;
                    rest = &rest[pos + 1..];
                }
                None => {
                    if self.tail_len + rest.len() > self.limits.max_line_bytes {
                        return self.overflow(rest);
                    }
                    self.buf.extend_from_slice(rest);
                    self.tail_len += rest.len();
                    return;
                }
            }
        }
    }

    fn overflow(&mut self, rest: &[u8]) {
        // Keep the line's allowed prefix only so the overflow point is the same however
        // the stream was chunked.
        let room = self.limits.max_line_bytes.saturating_sub(self.tail_len);
        self.buf.extend_from_slice(&rest[..room.min(rest.len())]);
        self.tail_len += room;
        self.overflowed = true;
    }

    /// The next complete event, if the bytes pushed so far hold one.
    pub fn next_event(&mut self) -> Result<Option<SseEvent>, SseError> {
        if self.failed {
            return Ok(None);
        }
        if !self.bom_checked {
            if self.buf.len() < BOM.len() && BOM.starts_with(&self.buf) && !self.overflowed {
                return Ok(None);
            }
            if self.buf.starts_with(BOM) {
                self.buf.advance(BOM.len());
            }
            self.bom_checked = true;
        }
        loop {
            if self.skip_lf && !self.buf.is_empty() {
                if self.buf[0] == b'\n' {
                    self.buf.advance(1);
                }
                self.skip_lf = false;
            }
            // The unterminated tail holds no line end: scan only what precedes it, so a long
            // line arriving in many chunks is not rescanned each time.
            let terminated = self.buf.len().saturating_sub(self.tail_len);
            let Some(pos) = memchr::memchr2(b'\r', b'\n', &self.buf[..terminated]) else {
                if self.overflowed {
                    return Err(self.fail(SseError::TooLarge {
                        what: "line",
                        limit: self.limits.max_line_bytes,
                    }));
                }
                return Ok(None);
            };
            let line = self.buf.split_to(pos).freeze();
            let terminator = self.buf[0];
            self.buf.advance(1);
            if terminator == b'\r' {
                self.skip_lf = true;
            }
            match self.process_line(&line) {
                Ok(Some(event)) => return Ok(Some(event)),
                Ok(None) => {}
                Err(e) => return Err(self.fail(e)),
            }
        }
    }

    fn fail(&mut self, error: SseError) -> SseError {
        self.failed = true;
        self.buf.clear();
        self.clear_data();
        error
    }

    fn clear_data(&mut self) {
        self.first_data = None;
        self.data.clear();
        self.data_len = 0;
    }

    fn process_line(&mut self, line: &Bytes) -> Result<Option<SseEvent>, SseError> {
        if line.is_empty() {
            return Ok(self.dispatch());
        }
        if line[0] == b':' {
            return Ok(None);
        }
        let line_bytes = line;
        let line = std::str::from_utf8(line).map_err(|_| SseError::InvalidUtf8)?;
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.event_type = (!value.is_empty()).then(|| value.to_string()),
            "data" => {
                if self.data_len + value.len() + 1 > self.limits.max_event_bytes {
                    return Err(SseError::TooLarge {
                        what: "event data",
                        limit: self.limits.max_event_bytes,
                    });
                }
                self.data_len += value.len() + 1;
                if !self.has_data {
                    // Kept as a slice of the line: a one-line event is never copied.
                    self.first_data = Some(line_bytes.slice_ref(value.as_bytes()));
                    self.has_data = true;
                } else {
                    if let Some(first) = self.first_data.take() {
                        self.data.push_str(std::str::from_utf8(&first).unwrap_or_default());
                    }
                    self.data.push('\n');
                    self.data.push_str(value);
                }
            }
            "id" if !value.contains('\0') => self.last_id = Some(value.to_string()),
            // `retry:` sets a reconnection delay, which an upstream adapter never uses.
            _ => {}
        }
        Ok(None)
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event_type = self.event_type.take();
        if !self.has_data {
            return None;
        }
        self.has_data = false;
        self.data_len = 0;
        let data = match self.first_data.take() {
            Some(line) => SseData(line),
            None => SseData(Bytes::from(std::mem::take(&mut self.data))),
        };
        Some(SseEvent {
            event: event_type,
            data,
            id: self.last_id.clone(),
        })
    }

    /// Ends the stream. An unterminated last event is discarded, as the spec says; returns
    /// whether anything (a partial line or an undispatched event) was left over.
    pub fn finish(&mut self) -> bool {
        let leftover = !self.buf.is_empty() || self.has_data || self.event_type.is_some();
        self.buf.clear();
        self.clear_data();
        self.has_data = false;
        self.event_type = None;
        self.failed = true;
        leftover
    }
}

/// Decodes a byte stream into SSE events. Ends after the first error; at EOF an
/// unterminated last event is dropped (callers detect truncation by their own terminal
/// signal, T11).
pub fn sse_events<S, E>(body: S, limits: SseLimits) -> impl Stream<Item = Result<SseEvent, SseError>>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: StdError + Send + Sync + 'static,
{
    async_stream::stream! {
        let mut decoder = SseDecoder::new(limits);
        futures::pin_mut!(body);
        loop {
            loop {
                match decoder.next_event() {
                    Ok(Some(event)) => yield Ok(event),
                    Ok(None) => break,
                    Err(e) => {
                        yield Err(e);
                        return;
                    }
                }
            }
            match body.next().await {
                Some(Ok(chunk)) => decoder.push(&chunk),
                Some(Err(e)) => {
                    yield Err(SseError::Transport(Box::new(e)));
                    return;
                }
                None => {
                    if decoder.finish() {
                        tracing::debug!("SSE body ended inside an event; the partial event was dropped");
                    }
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_chunks(chunks: &[&[u8]], limits: SseLimits) -> (Vec<SseEvent>, Option<String>, bool) {
        let mut decoder = SseDecoder::new(limits);
        let mut events = Vec::new();
        for chunk in chunks {
            decoder.push(chunk);
            loop {
                match decoder.next_event() {
                    Ok(Some(e)) => events.push(e),
                    Ok(None) => break,
                    Err(e) => return (events, Some(e.to_string()), false),
                }
            }
        }
        let leftover = decoder.finish();
        (events, None, leftover)
    }

    fn decode(input: &[u8]) -> Vec<SseEvent> {
        let (events, err, _) = decode_chunks(&[input], SseLimits::default());
        assert_eq!(err, None, "unexpected decode error");
        events
    }

    fn datas(events: &[SseEvent]) -> Vec<&str> {
        events.iter().map(|e| e.data.as_str()).collect()
    }

    #[test]
    fn a_one_line_event_is_a_slice_of_what_was_read_not_a_copy() {
        let mut decoder = SseDecoder::new(SseLimits::default());
        decoder.push(b"event: x\ndata: {\"a\":1}\n\ndata: one\ndata: two\n\n");
        let read = decoder.buf.as_ptr() as usize;
        let first = decoder.next_event().ok().flatten().unwrap_or_default();
        assert_eq!(first.data, "{\"a\":1}");
        assert_eq!(
            first.data.0.as_ptr() as usize,
            read + "event: x\ndata: ".len(),
            "the data points into the bytes read"
        );
        let second = decoder.next_event().ok().flatten().unwrap_or_default();
        assert_eq!(second.data, "one\ntwo", "two lines are joined");
    }

    #[test]
    fn cr_lf_and_crlf_all_end_lines() {
        let events = decode(b"data: cr\r\rdata: lf\n\ndata: crlf\r\n\r\n");
        assert_eq!(
            datas(&events),
            ["cr", "lf", "crlf"],
            "three line-ending styles, three events"
        );
    }

    #[test]
    fn crlf_split_across_chunks_is_one_line_end() {
        let (events, err, _) = decode_chunks(
            &[b"data: {\"a\":1}\r", b"\n\r\n", b"data: b\r", b"\r"],
            SseLimits::default(),
        );
        assert_eq!(err, None);
        assert_eq!(
            datas(&events),
            ["{\"a\":1}", "b"],
            "CR then LF in the next chunk must not add a blank line"
        );
    }

    #[test]
    fn leading_bom_is_stripped_even_when_split() {
        let events = decode(b"\xEF\xBB\xBFdata: x\n\n");
        assert_eq!(datas(&events), ["x"], "BOM stripped (T15)");
        let (events, err, _) = decode_chunks(&[b"\xEF", b"\xBB", b"\xBFdata: y\n\n"], SseLimits::default());
        assert_eq!(err, None);
        assert_eq!(datas(&events), ["y"], "split BOM stripped");
    }

    #[test]
    fn only_one_bom_is_stripped() {
        let (events, err, _) = decode_chunks(&[b"\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\n"], SseLimits::default());
        assert_eq!(err, None);
        assert!(
            events.is_empty(),
            "a second BOM makes the field name unknown: {events:?}"
        );
    }

    #[test]
    fn utf8_split_across_chunks_decodes_whole() {
        let (events, err, _) = decode_chunks(&[b"data: caf\xC3", b"\xA9\n\n"], SseLimits::default());
        assert_eq!(err, None);
        assert_eq!(datas(&events), ["café"], "T5");
    }

    #[test]
    fn invalid_utf8_is_an_error() {
        let (events, err, _) = decode_chunks(&[b"data: ok\n\ndata: \xFF\xFE\n\n"], SseLimits::default());
        assert_eq!(datas(&events), ["ok"], "events before the bad line are kept");
        assert_eq!(err.as_deref(), Some("SSE line is not valid UTF-8"));
    }

    #[test]
    fn comments_are_ignored_and_data_space_is_optional() {
        let events = decode(b": ping\n\n:\ndata:[DONE]\n\n: OPENROUTER PROCESSING\r\ndata:  two\n\n");
        assert_eq!(
            datas(&events),
            ["[DONE]", " two"],
            "exactly one space is removed after the colon"
        );
    }

    #[test]
    fn multi_line_data_joins_with_lf_and_event_type_is_kept() {
        let events = decode(b"event: message_stop\ndata: a\ndata\ndata: b\n\n");
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].event.as_deref(), Some("message_stop"));
        assert_eq!(events[0].data, "a\n\nb", "a bare `data` line appends an empty line");
    }

    #[test]
    fn event_without_data_is_not_dispatched_and_type_resets() {
        let events = decode(b"event: ping\n\ndata: x\n\n");
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].event, None, "event type must not leak into the next event");
    }

    #[test]
    fn id_persists_and_retry_is_ignored() {
        let events = decode(b"id: 7\nretry: 10\ndata: y\n\ndata: z\n\n");
        assert_eq!(events[1].id.as_deref(), Some("7"), "last event id persists");
        assert_eq!(datas(&events), ["y", "z"]);
    }

    #[test]
    fn unterminated_last_event_is_dropped_and_reported() {
        let (events, err, leftover) = decode_chunks(&[b"data: test1\n\nid: t\ndata: test2"], SseLimits::default());
        assert_eq!(err, None);
        assert_eq!(datas(&events), ["test1"], "incomplete event must not be dispatched");
        assert!(leftover, "finish reports leftover bytes");
        let (_, _, leftover) = decode_chunks(&[b"data: a\n\n"], SseLimits::default());
        assert!(!leftover, "a clean end leaves nothing");
    }

    #[test]
    fn oversized_line_fails_without_buffering_it() {
        let limits = SseLimits {
            max_line_bytes: 1024,
            max_event_bytes: 4096,
        };
        let mut decoder = SseDecoder::new(limits);
        decoder.push(b"data: fine\n\n");
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..160 {
            decoder.push(&chunk); // 10 MiB in total
        }
        assert!(
            decoder.buf.len() <= 1024 + 16,
            "buffer stayed bounded: {}",
            decoder.buf.len()
        );
        assert_eq!(
            decoder.next_event().ok().flatten().map(|e| e.data.as_str().to_string()),
            Some("fine".to_string())
        );
        assert!(
            matches!(decoder.next_event(), Err(SseError::TooLarge { what: "line", .. })),
            "line cap reported after the events before it"
        );
        assert!(matches!(decoder.next_event(), Ok(None)), "nothing after the error");
    }

    #[test]
    fn oversized_event_data_fails() {
        let limits = SseLimits {
            max_line_bytes: 100,
            max_event_bytes: 150,
        };
        let line = format!("data: {}\n", "y".repeat(90));
        let input = line.repeat(3);
        let (_, err, _) = decode_chunks(&[input.as_bytes()], limits);
        assert_eq!(err.as_deref(), Some("SSE event data exceeds 150 bytes"));
    }

    #[tokio::test]
    async fn sse_events_reports_transport_errors_and_ends() {
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"data: a\n\n")),
            Err(std::io::Error::other("reset")),
            Ok(Bytes::from_static(b"data: b\n\n")),
        ];
        let out: Vec<_> = sse_events(futures::stream::iter(chunks), SseLimits::default())
            .collect()
            .await;
        assert_eq!(out.len(), 2, "one event, one error, then the end");
        assert!(matches!(&out[1], Err(SseError::Transport(_))));
    }

    /// An independent, whole-input reading of the spec: normalise line ends, then interpret.
    fn reference_decode(input: &[u8]) -> Vec<SseEvent> {
        let text = std::str::from_utf8(input.strip_prefix(BOM).unwrap_or(input)).unwrap_or_default();
        let text = text.replace("\r\n", "\n").replace('\r', "\n");
        let mut lines: Vec<&str> = text.split('\n').collect();
        lines.pop(); // whatever follows the last line end is unterminated
        let (mut events, mut event, mut data, mut id) = (Vec::new(), None, None::<String>, None);
        for line in lines {
            if line.is_empty() {
                if let Some(d) = data.take() {
                    events.push(SseEvent {
                        event: event.take(),
                        data: SseData(Bytes::from(d)),
                        id: id.clone(),
                    });
                }
                event = None;
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "" => {}
                "event" => event = (!value.is_empty()).then(|| value.to_string()),
                "data" => match data.as_mut() {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => data = Some(value.to_string()),
                },
                "id" => id = Some(value.to_string()),
                _ => {}
            }
        }
        events
    }

    #[test]
    fn crlf_field_lines_belong_to_one_event_however_split() {
        let input = b"event: message_stop\r\ndata: a\r\ndata: b\r\n\r\n";
        for cut in 0..=input.len() {
            let (events, err, _) = decode_chunks(&[&input[..cut], &input[cut..]], SseLimits::default());
            assert_eq!(err, None);
            assert_eq!(events.len(), 1, "split at {cut}: {events:?}");
            assert_eq!(events[0].event.as_deref(), Some("message_stop"), "split at {cut}");
            assert_eq!(events[0].data, "a\nb", "split at {cut}");
        }
    }

    fn arb_stream() -> impl Strategy<Value = Vec<u8>> {
        let line = prop_oneof![
            "[a-z{}\":, éü€]{0,20}".prop_map(|s| format!("data: {s}")),
            "[a-z_]{0,10}".prop_map(|s| format!("event: {s}")),
            Just(": keep-alive".to_string()),
            Just("id: 3".to_string()),
            Just(String::new()),
        ];
        let eol = prop_oneof![Just("\n"), Just("\r"), Just("\r\n")];
        (any::<bool>(), prop::collection::vec((line, eol), 0..30)).prop_map(|(bom, lines)| {
            let mut out = if bom { BOM.to_vec() } else { Vec::new() };
            for (line, eol) in lines {
                out.extend_from_slice(line.as_bytes());
                out.extend_from_slice(eol.as_bytes());
            }
            out
        })
    }

    proptest! {
        #[test]
        fn any_chunking_yields_the_same_events(input in arb_stream(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8)) {
            let whole = decode_chunks(&[&input], SseLimits::default());
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(input.len() + 1)).collect();
            points.sort_unstable();
            let mut chunks: Vec<&[u8]> = Vec::new();
            let mut start = 0;
            for p in points {
                chunks.push(&input[start..p]);
                start = p;
            }
            chunks.push(&input[start..]);
            let split = decode_chunks(&chunks, SseLimits::default());
            prop_assert_eq!(&whole.0, &reference_decode(&input), "disagrees with the reference reading");
            prop_assert_eq!(whole, split, "chunk boundaries changed the events");
        }

        #[test]
        fn arbitrary_bytes_never_panic(chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..8)) {
            let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
            let limits = SseLimits { max_line_bytes: 40, max_event_bytes: 80 };
            let _ = decode_chunks(&refs, limits);
        }

        #[test]
        fn caps_trip_at_the_same_point_however_chunked(len in 0usize..200, cut in 0usize..200) {
            let limits = SseLimits { max_line_bytes: 50, max_event_bytes: 120 };
            let input = format!("data: a\n\ndata: {}\n\ndata: b\n\n", "z".repeat(len)).into_bytes();
            let cut = cut.min(input.len());
            let whole = decode_chunks(&[&input], limits);
            let split = decode_chunks(&[&input[..cut], &input[cut..]], limits);
            prop_assert_eq!(whole, split);
        }
    }
}
