//! Micro-benchmark of the upstream SSE decoder on a ~200-event OpenAI stream, fed in 1-byte,
//! 64-byte and whole-buffer chunks: what the chunk boundaries of a slow network cost.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use tailcut::provider::sse::{SseDecoder, SseLimits};

/// A recorded OpenAI stream (role chunk, content chunks, finish, usage, `[DONE]`).
const RECORDED: &str = include_str!("../tests/fixtures/openai/text.sse");

/// Events in the benchmark stream, `[DONE]` included.
const EVENTS: usize = 200;

/// The recorded stream stretched to `EVENTS` events by cycling its content chunks, so the
/// bytes are real upstream bytes in a realistic proportion of framing to payload.
fn long_stream() -> Vec<u8> {
    let events: Vec<&str> = RECORDED.split_terminator("\n\n").collect();
    let content: Vec<&str> = events
        .iter()
        .copied()
        .filter(|e| e.contains("\"content\":\"") && !e.contains("\"role\""))
        .collect();
    let head = events[0];
    let tail = &events[events.len() - 3..];
    let mut out = String::new();
    out.push_str(head);
    out.push_str("\n\n");
    for event in content.iter().cycle().take(EVENTS - 1 - tail.len()) {
        out.push_str(event);
        out.push_str("\n\n");
    }
    for event in tail {
        out.push_str(event);
        out.push_str("\n\n");
    }
    out.into_bytes()
}

/// Pushes `stream` in `chunk`-byte pieces and drains every event; returns how many there were.
fn decode(stream: &[u8], chunk: usize) -> usize {
    let mut decoder = SseDecoder::new(SseLimits::default());
    let mut events = 0;
    for piece in stream.chunks(chunk) {
        decoder.push(piece);
        while let Ok(Some(event)) = decoder.next_event() {
            black_box(&event);
            events += 1;
        }
    }
    black_box(decoder.finish());
    events
}

fn sse_decode(c: &mut Criterion) {
    let stream = long_stream();
    let mut group = c.benchmark_group("sse_decode");
    group.throughput(Throughput::Bytes(stream.len() as u64));
    for (name, chunk) in [("1_byte", 1), ("64_bytes", 64), ("whole_buffer", stream.len())] {
        group.bench_with_input(BenchmarkId::from_parameter(name), &chunk, |b, &chunk| {
            b.iter(|| decode(black_box(&stream), chunk))
        });
    }
    group.finish();
}

criterion_group!(benches, sse_decode);
criterion_main!(benches);
