//! Resumable native SSE end to end over loopback: `POST /v1/streams`, reading with
//! `Last-Event-ID` from every position, concurrent readers, buffer bounds, the stream token,
//! 404/410/204, the registry cap, cut for drain, and the strict `GET /v1/stream` query.

#[path = "support/resumable.rs"]
mod resumable;
mod support;

use std::time::Duration;

use tokio::time::Instant;

use resumable::{config, open, open_ok, read_all, seqs, text, Event, EventReader};
use serde_json::{json, Value};
use support::{client, start};

/// Counts live heap bytes, for the replay memory measurement below.
struct Counting;

static LIVE: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's layout contract is passed on as is.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE.fetch_sub(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// 197 text tokens + start, usage, done.
const EVENTS: u64 = 200;

async fn whole(server: &tailcut::server::Running, url: &str) -> Vec<Event> {
    let (status, events) = read_all(server, url, None).await;
    assert_eq!(status, 200, "events served");
    events
}

#[tokio::test]
async fn a_resume_after_any_n_gives_exactly_the_events_after_n() {
    let server = start(&config(197, 1.0, "")).await;
    let (_, url, _) = open_ok(&server).await;
    let mut first = EventReader::get(&server, &url, None).await;
    assert_eq!(
        first.headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("text/event-stream"),
        "SSE"
    );
    let all = first.rest().await;
    assert_eq!(first.retry, Some(1000), "a retry hint comes first");
    assert!(
        first.raw.starts_with("retry: 1000\n\n"),
        "before any event: {}",
        &first.raw[..40]
    );
    assert_eq!(
        seqs(&all),
        (1..=EVENTS).collect::<Vec<_>>(),
        "seq 1..=200, every event numbered"
    );
    let names: Vec<&str> = all.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        (names[0], names[names.len() - 2], names[names.len() - 1]),
        ("start", "usage", "done"),
        "start first, usage, then done"
    );
    let full_text = text(&all);
    assert!(
        full_text.split_whitespace().count() >= 190,
        "a long answer: {full_text}"
    );
    for n in 0..EVENTS {
        let (status, rest) = read_all(&server, &url, Some(n)).await;
        assert_eq!(status, 200, "resume after {n}");
        assert_eq!(
            seqs(&rest),
            (n + 1..=EVENTS).collect::<Vec<_>>(),
            "after {n}: exactly n+1..end"
        );
        assert_eq!(
            &rest[..],
            &all[n as usize..],
            "after {n}: the same events, byte for byte JSON"
        );
        let mut stitched = all[..n as usize].to_vec();
        stitched.extend(rest);
        assert_eq!(text(&stitched), full_text, "after {n}: the text exactly once");
    }
    let (status, rest) = read_all(&server, &url, Some(EVENTS)).await;
    assert_eq!(
        (status, rest.len()),
        (204, 0),
        "a reconnect after done: 204, stop reconnecting"
    );
    let via_query = format!("{url}&last_event_id=150");
    let (_, rest) = read_all(&server, &via_query, None).await;
    assert_eq!(seqs(&rest).first(), Some(&151), "?last_event_id= works like the header");
    let (status, _) = read_all(&server, &url, Some(EVENTS + 1)).await;
    assert_eq!(status, 400, "a position past the end is refused, not waited on");
}

#[tokio::test]
async fn a_dropped_reader_resumes_live_with_no_loss_and_no_duplicate() {
    // 20 ms a token: the stream is still running when the reader comes back.
    let server = start(&config(197, 20.0, "")).await;
    let (_, url, _) = open_ok(&server).await;
    let mut reader = EventReader::get(&server, &url, None).await;
    let mut got = Vec::new();
    for _ in 0..30 {
        got.push(reader.next().await.expect("an event"));
    }
    drop(reader); // the connection drops mid-answer
    let last = got.last().and_then(|e| e.seq).expect("seq");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, rest) = read_all(&server, &url, Some(last)).await;
    assert_eq!(status, 200, "resumed");
    got.extend(rest);
    assert_eq!(seqs(&got), (1..=EVENTS).collect::<Vec<_>>(), "every event exactly once");
    let reference = whole(&server, &url).await;
    assert_eq!(text(&got), text(&reference), "the same answer as an uninterrupted read");
}

#[tokio::test]
async fn the_answer_keeps_going_with_no_reader() {
    let server = start(&config(50, 1.0, "")).await;
    let (id, url, token) = open_ok(&server).await;
    let stream = server.state.resumable.find(&id, Some(&token)).expect("registered");
    for _ in 0..500 {
        if stream.replay.finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(stream.replay.finished(), "the answer finished although nobody read it");
    let events = whole(&server, &url).await;
    assert_eq!(
        events.last().map(|e| e.name.as_str()),
        Some("done"),
        "and is there in full"
    );
}

#[tokio::test]
async fn two_concurrent_readers_both_get_the_whole_answer() {
    let server = start(&config(197, 5.0, "")).await;
    let (_, url, _) = open_ok(&server).await;
    let (a, b) = tokio::join!(read_all(&server, &url, None), read_all(&server, &url, None));
    assert_eq!(seqs(&a.1), (1..=EVENTS).collect::<Vec<_>>(), "reader a has everything");
    assert_eq!(a.1, b.1, "reader b has the same events");
}

#[tokio::test]
async fn the_event_bound_holds_and_an_older_resume_gets_resume_gap() {
    let server = start(&config(197, 1.0, "[server.streams]\nmax_events = 50")).await;
    let (id, url, token) = open_ok(&server).await;
    let mut live = EventReader::get(&server, &url, None).await;
    let live_events = live.rest().await;
    let stream = server.state.resumable.find(&id, Some(&token)).expect("registered");
    assert_eq!(stream.replay.held().0, 50, "50 events held of 200");
    // The live reader kept up or got a gap; either way nothing was lost silently.
    let kept_up = seqs(&live_events) == (1..=EVENTS).collect::<Vec<_>>();
    assert!(
        kept_up || live_events.last().is_some_and(|e| e.data["code"] == "resume_gap"),
        "a reader behind the buffer is told"
    );
    let (status, rest) = read_all(&server, &url, Some(150)).await;
    assert_eq!(
        (status, seqs(&rest)),
        (200, (151..=EVENTS).collect::<Vec<_>>()),
        "after 150: the 50 held"
    );
    let (_, rest) = read_all(&server, &url, Some(149)).await;
    assert_eq!(
        rest.first().map(|e| &e.data["code"]),
        Some(&json!("resume_gap")),
        "150 is gone"
    );
    let (status, rest) = read_all(&server, &url, Some(10)).await;
    assert_eq!(status, 200, "a gap is an event, not an HTTP error");
    assert_eq!(rest.len(), 1, "one error event, then the end: {rest:?}");
    assert_eq!(
        (
            rest[0].name.as_str(),
            &rest[0].data["code"],
            &rest[0].data["first_seq"],
            rest[0].seq
        ),
        ("error", &json!("resume_gap"), &json!(151), None),
        "resume_gap names the first available seq"
    );
}

#[tokio::test]
async fn the_byte_bound_holds() {
    let server = start(&config(197, 1.0, "[server.streams]\nmax_bytes = 8192")).await;
    let (id, url, token) = open_ok(&server).await;
    let _ = whole(&server, &url).await;
    let stream = server.state.resumable.find(&id, Some(&token)).expect("registered");
    let (events, bytes) = stream.replay.held();
    assert!(bytes <= 8192, "{bytes} bytes held, bound 8192");
    assert!(events < 200 && events > 5, "{events} events fit in 8 KiB");
    let (_, rest) = read_all(&server, &url, Some(0)).await;
    assert_eq!(
        rest.last().map(|e| &e.data["code"]),
        Some(&json!("resume_gap")),
        "from 0: gap"
    );
}

async fn get_status(server: &tailcut::server::Running, url: &str) -> (u16, Value) {
    let resp = client().get(server.url(url)).send().await.expect("sent");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn only_the_tokens_holder_reads_and_unknown_or_expired_streams_say_so() {
    let server = start(&config(20, 1.0, "[server.streams]\nkeep_after_done_ms = 300")).await;
    let (id, url, token) = open_ok(&server).await;
    let (other_id, _, other_token) = open_ok(&server).await;
    assert_ne!(token, other_token, "per-stream tokens");
    let bare = format!("/v1/streams/{id}/events");
    let (status, body) = get_status(&server, &bare).await;
    assert_eq!((status, &body["code"]), (403, &json!("forbidden")), "no token: {body}");
    let (status, _) = get_status(&server, &format!("{bare}?token={other_token}")).await;
    assert_eq!(status, 403, "another stream's token");
    let (status, _) = get_status(&server, &format!("{bare}?token={token}x")).await;
    assert_eq!(status, 403, "a wrong token");
    let (status, body) = get_status(&server, &format!("/v1/streams/st_nope/events?token={token}")).await;
    assert_eq!(
        (status, &body["code"]),
        (404, &json!("not_found")),
        "unknown id: {body}"
    );
    let _ = whole(&server, &url).await;
    let _ = other_id;
    let mut status = 0;
    for _ in 0..200 {
        status = get_status(&server, &url).await.0;
        if status == 410 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(status, 410, "expired after keep_after_done_ms");
}

#[tokio::test]
async fn post_errors_before_the_stream_exists_are_json_with_their_status() {
    let server = start(&config(20, 1.0, "")).await;
    let (status, _, body) = open(&server, &json!({"model": "chat"})).await;
    assert_eq!(
        (status, &body["class"]),
        (400, &json!("bad_request")),
        "bad request: {body}"
    );
    let (status, _, body) = open(
        &server,
        &json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert!((400..500).contains(&status), "unknown model: {status} {body}");
    assert_eq!(body["type"], "error", "native error shape: {body}");
}

#[tokio::test]
async fn a_full_registry_is_a_503_with_retry_after() {
    let server = start(&config(2000, 20.0, "[server.streams]\nmax_open = 1")).await;
    let (status, _, _) = open(&server, &resumable::chat()).await;
    assert_eq!(status, 201, "the first fits");
    let (status, headers, body) = open(&server, &resumable::chat()).await;
    assert_eq!((status, &body["class"]), (503, &json!("overloaded")), "{body}");
    assert!(headers.get("retry-after").is_some(), "with Retry-After");
}

#[tokio::test]
async fn cut_all_ends_a_live_reader_with_draining_and_the_stream_id() {
    let server = start(&config(2000, 20.0, "")).await;
    let (id, url, _) = open_ok(&server).await;
    let mut reader = EventReader::get(&server, &url, None).await;
    assert_eq!(reader.next().await.map(|e| e.name), Some("start".into()), "started");
    assert_eq!(
        server.state.resumable.cut_all("tailcut is shutting down"),
        1,
        "one live stream"
    );
    let rest = reader.rest().await;
    let last = rest.last().expect("a terminal event");
    assert_eq!(
        (last.name.as_str(), &last.data["code"], &last.data["stream"]),
        ("error", &json!("draining"), &json!(id)),
        "an in-band draining error naming the stream"
    );
    assert!(last.seq.is_some(), "numbered like every event, so a reconnect gets 204");
}

#[tokio::test]
async fn get_stream_refuses_unknown_keys_and_bad_values_as_json() {
    let server = start(&config(5, 1.0, "")).await;
    let q = resumable::chat().to_string();
    for (extra, key) in [
        ("&hedging=false", "hedging"),
        ("&hedge=maybe", "hedge"),
        ("&deadline_ms=soon", "deadline_ms"),
    ] {
        let url =
            reqwest::Url::parse(&format!("{}?{}{extra}", server.url("/v1/stream"), form(&[("q", &q)]))).expect("url");
        let resp = client().get(url).send().await.expect("sent");
        assert_eq!(resp.status(), 400, "{key}");
        assert_eq!(
            resp.headers().get("content-type").and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "{key}: JSON, not text/plain"
        );
        let body: Value = resp.json().await.expect("JSON");
        assert!(
            body["message"].as_str().unwrap_or_default().contains(key),
            "{key} named: {body}"
        );
    }
    let url = reqwest::Url::parse(&format!(
        "{}?{}&hedge=false",
        server.url("/v1/stream"),
        form(&[("q", &q)])
    ))
    .expect("url");
    assert_eq!(
        client().get(url).send().await.expect("sent").status(),
        200,
        "valid keys still work"
    );
}

fn form(pairs: &[(&str, &str)]) -> String {
    let mut url = reqwest::Url::parse("http://x/").expect("url");
    url.query_pairs_mut().extend_pairs(pairs);
    url.query().unwrap_or_default().to_string()
}

/// Not a test of speed: prints what resuming costs (run with `--ignored --nocapture`).
#[tokio::test]
#[ignore]
async fn measure_replay_memory_and_reconnect_latency() {
    let server = start(&config(197, 1.0, "")).await;
    let (id, url, token) = open_ok(&server).await;
    let all = whole(&server, &url).await;
    let stream = server.state.resumable.find(&id, Some(&token)).expect("registered");
    let (events, bytes) = stream.replay.held();
    let json: usize = all.iter().map(|e| e.data.to_string().len()).sum();
    println!(
        "replay: {events} events, {bytes} bytes charged ({} per event; JSON alone {} per event, overhead {} per event)",
        bytes / events,
        json / events,
        tailcut::transport::replay::EVENT_OVERHEAD
    );
    // The heap a replay buffer really holds for the same 200 events (run alone: the
    // counter is process-wide).
    let messages: Vec<tailcut::transport::native::ServerMessage> = all
        .iter()
        .filter(|e| e.name == "delta")
        .map(|e| tailcut::transport::native::ServerMessage::Delta {
            id: e.data["id"].as_str().unwrap_or_default().to_string(),
            text: e.data["text"].as_str().unwrap_or_default().to_string(),
        })
        .collect();
    let before = LIVE.load(std::sync::atomic::Ordering::SeqCst);
    let replay = std::sync::Arc::new(tailcut::transport::replay::Replay::new(4096, 1 << 20));
    for m in &messages {
        replay.push(m.clone()); // the clone is freed inside: only what the buffer keeps counts
    }
    let heap = LIVE.load(std::sync::atomic::Ordering::SeqCst) - before;
    println!(
        "replay heap measured: {heap} bytes for {} delta events ({} per event)",
        replay.held().0,
        heap / replay.held().0 as isize
    );
    let client = client();
    let mut micros = Vec::new();
    let mut health = Vec::new();
    for i in 0..100u64 {
        let t = Instant::now();
        let resp = client.get(server.url("/healthz")).send().await.expect("sent");
        let _ = resp.bytes().await;
        health.push(t.elapsed().as_micros());
        let t = Instant::now();
        let mut reader = EventReader::get_with(&client, &server, &url, Some(i)).await;
        let first = reader.next().await.expect("a replayed event");
        micros.push(t.elapsed().as_micros());
        assert_eq!(first.seq, Some(i + 1), "the first replayed event");
    }
    micros.sort_unstable();
    health.sort_unstable();
    println!("baseline GET /healthz on the same client: median {} us", health[50]);
    println!(
        "reconnect to first replayed event: median {} us, p90 {} us, max {} us (n=100, loopback)",
        micros[50], micros[90], micros[99]
    );
}
