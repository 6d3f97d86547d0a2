//! Plays a script out as a response body: sleeps on the tokio clock, writes every SSE event
//! as its own body chunk (or in `chunk_split` pieces), and records tokens and the ending.
//! No task is spawned: the body stream itself does the work, so dropping it stops it.

use std::io;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;

use super::plan::Step;
use super::record::{RecordGuard, SimEnd};
use super::{anthropic, openai};

/// Bytes of a huge line written per body chunk.
const HUGE_LINE_PIECE: usize = 64 * 1024;

/// A wire's step encoder.
pub(crate) enum Encoder {
    OpenAi(openai::Encoder),
    Anthropic(anthropic::Encoder),
}

impl Encoder {
    fn encode(&mut self, step: &Step) -> Vec<Bytes> {
        match self {
            Encoder::OpenAi(e) => e.encode(step),
            Encoder::Anthropic(e) => e.encode(step),
        }
    }

    /// The wire's keep-alive: an SSE comment (OpenAI-compatible servers), `event: ping`
    /// (Anthropic). Neither is part of the answer.
    fn keepalive(&self) -> Bytes {
        match self {
            Encoder::OpenAi(_) => Bytes::from_static(b": ping\n\n"),
            Encoder::Anthropic(_) => Bytes::from_static(b"event: ping\ndata: {\"type\":\"ping\"}\n\n"),
        }
    }
}

/// The response body for a script ending as `end` when read to the end.
pub(crate) fn body(
    steps: Vec<Step>,
    end: SimEnd,
    mut encoder: Encoder,
    mut guard: RecordGuard,
    (chunk_split, keepalive): (Option<usize>, Option<Duration>),
) -> impl Stream<Item = io::Result<Bytes>> + Send + 'static {
    let split = chunk_split.filter(|n| *n > 0);
    let last_writing = steps.iter().rposition(|s| !matches!(s, Step::Wait(_)));
    async_stream::stream! {
        for (i, step) in steps.into_iter().enumerate() {
            let last = Some(i) == last_writing;
            let frames = match step {
                Step::Wait(pause) => {
                    let mut left = pause;
                    while let Some(every) = keepalive.filter(|every| left > *every) {
                        tokio::time::sleep(every).await;
                        left -= every;
                        yield Ok(encoder.keepalive());
                    }
                    tokio::time::sleep(left).await;
                    continue;
                }
                Step::Drop => {
                    // The server flushes what was written before it sees the error, so the
                    // client gets every token up to the drop, then a broken body.
                    tokio::task::yield_now().await;
                    guard.finish(SimEnd::Dropped);
                    yield Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "simulated connection drop",
                    ));
                    return;
                }
                Step::Bom => vec![Bytes::from_static(b"\xEF\xBB\xBF")],
                Step::HugeLine(total) => huge_line(total),
                step => {
                    if step.is_content() {
                        guard.first_token();
                    }
                    if step.is_token() {
                        guard.token();
                    }
                    encoder.encode(&step)
                }
            };
            let pieces: Vec<Bytes> = frames
                .into_iter()
                .flat_map(|frame| pieces_of(frame, split))
                .collect();
            let count = pieces.len();
            for (k, piece) in pieces.into_iter().enumerate() {
                if last && k + 1 == count {
                    // Recorded before the final write, so a client that stops reading at the
                    // terminal event does not look like one that hung up early.
                    guard.finish(end);
                }
                yield Ok(piece);
                if split.is_some() {
                    // Lets the server flush, so each piece leaves as its own write.
                    tokio::task::yield_now().await;
                }
            }
        }
        guard.finish(end);
    }
}

/// `data: xxxx…` with no newline, `total` bytes long, in bounded pieces.
fn huge_line(total: u64) -> Vec<Bytes> {
    let total = usize::try_from(total).unwrap_or(usize::MAX).min(1 << 30);
    let mut pieces = Vec::with_capacity(total / HUGE_LINE_PIECE + 2);
    let prefix = b"data: ";
    let head = total.min(prefix.len());
    pieces.push(Bytes::copy_from_slice(&prefix[..head]));
    let filler = Bytes::from(vec![b'x'; HUGE_LINE_PIECE]);
    let mut left = total - head;
    while left > 0 {
        let n = left.min(HUGE_LINE_PIECE);
        pieces.push(filler.slice(..n));
        left -= n;
    }
    pieces
}

fn pieces_of(frame: Bytes, split: Option<usize>) -> Vec<Bytes> {
    match split {
        Some(n) if frame.len() > n => (0..frame.len())
            .step_by(n)
            .map(|at| frame.slice(at..(at + n).min(frame.len())))
            .collect(),
        _ => vec![frame],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_of_splits_at_most_n_bytes_and_keeps_every_byte() {
        let frame = Bytes::from_static(b"data: {\"a\":1}\n\n");
        let pieces = pieces_of(frame.clone(), Some(4));
        assert!(pieces.iter().all(|p| p.len() <= 4), "piece sizes {pieces:?}");
        assert_eq!(pieces.concat(), frame.to_vec(), "bytes kept");
        assert_eq!(pieces_of(frame.clone(), None), vec![frame], "no split");
    }

    #[test]
    fn huge_line_has_exactly_the_requested_length_and_no_newline() {
        let pieces = huge_line(200_000);
        let total: usize = pieces.iter().map(Bytes::len).sum();
        assert_eq!(total, 200_000, "length");
        assert!(pieces.iter().all(|p| !p.contains(&b'\n')), "no newline");
        assert!(pieces.iter().all(|p| p.len() <= HUGE_LINE_PIECE), "bounded pieces");
    }
}
