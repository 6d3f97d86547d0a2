//! Micro-benchmark of the client-side encoders: one committed 200-token answer rendered as
//! OpenAI chunks, Anthropic events and native messages (the bytes every stream pays for).

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use std::hint::black_box;
use tailcut::transport::anthropic::EventEncoder;
use tailcut::transport::native::ServerMessage;
use tailcut::transport::openai::ChunkEncoder;
use tailcut::transport::sse_out::FrameEncoder;
use tailcut::types::{Envelope, FinishReason, HedgeInfo, Level, StreamEvent, Usage};

const TOKENS: usize = 200;
const WORDS: &[&str] = &[
    " the", " hedge", " fired", " after", " p95", ",", " and", " tail", " latency", " fell.",
];

fn envelope() -> Envelope {
    Envelope {
        route: Some("openai-eu".to_string()),
        model: Some("gpt-4o-mini".to_string()),
        level: Level::L1,
        hedged: true,
        hedge: Some(HedgeInfo {
            fired_after_ms: 640,
            primary: "anthropic-eu".to_string(),
            hedge_route: "openai-eu".to_string(),
            winner: Some("openai-eu".to_string()),
            loser_cancelled_ms: Some(0.4),
        }),
        ttft_ms: Some(702),
        attempts: 2,
        request_id: "req_0123456789abcdef".to_string(),
        ..Envelope::default()
    }
}

/// What the mux hands a transport after commit: text deltas, usage, the finish.
fn answer() -> Vec<StreamEvent> {
    let mut events: Vec<StreamEvent> = (0..TOKENS)
        .map(|i| StreamEvent::TextDelta(WORDS[i % WORDS.len()].to_string()))
        .collect();
    events.push(StreamEvent::Usage(Usage::new(42, TOKENS as u32)));
    events.push(StreamEvent::Finish {
        reason: FinishReason::Stop,
        envelope: Box::new(envelope()),
    });
    events
}

/// Renders every event with `encoder`; returns the bytes written.
fn render(mut encoder: impl FrameEncoder, events: Vec<StreamEvent>) -> usize {
    let mut out = Vec::with_capacity(4);
    let mut bytes = 0;
    for event in events {
        encoder.encode(event, &mut out);
        bytes += out.drain(..).map(|frame| black_box(frame).len()).sum::<usize>();
    }
    bytes
}

fn native(events: Vec<StreamEvent>) -> usize {
    events
        .into_iter()
        .filter_map(|event| ServerMessage::from_event("r1", event))
        .map(|(message, _)| black_box(message.to_json()).len())
        .sum()
}

fn render_benches(c: &mut Criterion) {
    let events = answer();
    let mut group = c.benchmark_group("render_200_tokens");
    group.throughput(Throughput::Elements(events.len() as u64));
    group.bench_function("openai_chunks", |b| {
        b.iter_batched(
            || events.clone(),
            |events| {
                render(
                    ChunkEncoder::new("req_1", "chat", 1_727_346_168, envelope(), true),
                    events,
                )
            },
            BatchSize::SmallInput,
        )
    });
    group.bench_function("anthropic_events", |b| {
        b.iter_batched(
            || events.clone(),
            |events| render(EventEncoder::new("req_1", "chat", envelope()), events),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("native_messages", |b| {
        b.iter_batched(|| events.clone(), native, BatchSize::SmallInput)
    });
    group.finish();
}

criterion_group!(benches, render_benches);
criterion_main!(benches);
