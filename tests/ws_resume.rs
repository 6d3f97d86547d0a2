//! WebSocket resume end to end over loopback: `accepted` and `seq`, resume after a killed
//! socket on a new one, resume from a sample of positions, the same stream read over SSE,
//! refusals (unknown, wrong token, gap, expired), and a burst of 300 chats from a client
//! that reads.

#[path = "support/resumable.rs"]
mod resumable;
mod support;

use std::collections::HashMap;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use resumable::{config, open_ok, read_all, seqs};
use serde_json::{json, Value};
use support::{start, ws_chat, ws_connect, ws_next, Ws};
use tokio_tungstenite::tungstenite::Message;

const EVENTS: u64 = 200;

fn resume(id: &str, stream: &str, token: &str, after: u64) -> Message {
    Message::text(json!({"type": "resume", "id": id, "stream": stream, "token": token, "after": after}).to_string())
}

/// Reads messages for `id` until its terminal one (skipping `accepted`).
async fn until_end(ws: &mut Ws, id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let m = ws_next(ws).await;
        if m["id"] != id || m["type"] == "accepted" {
            continue;
        }
        let end = matches!(m["type"].as_str(), Some("done" | "error" | "cancelled"));
        out.push(m);
        if end {
            return out;
        }
    }
}

fn ws_seqs(messages: &[Value]) -> Vec<u64> {
    messages.iter().filter_map(|m| m["seq"].as_u64()).collect()
}

fn ws_text(messages: &[Value]) -> String {
    let mut text = String::new();
    for m in messages {
        match m["type"].as_str() {
            Some("delta") => text.push_str(m["text"].as_str().unwrap_or_default()),
            Some("reset") => text.clear(),
            _ => {}
        }
    }
    text
}

/// `accepted` for `id`: (stream, token).
async fn accepted(ws: &mut Ws, id: &str) -> (String, String) {
    let m = ws_next(ws).await;
    assert_eq!(
        (&m["type"], &m["id"]),
        (&json!("accepted"), &json!(id)),
        "accepted first: {m}"
    );
    assert!(m.get("seq").is_none(), "accepted is not replayed, so has no seq: {m}");
    let s = |k: &str| m[k].as_str().unwrap_or_else(|| panic!("{k} in {m}")).to_string();
    (s("stream"), s("token"))
}

#[tokio::test]
async fn a_request_resumes_on_a_new_socket_after_the_old_one_is_killed() {
    let server = start(&config(197, 15.0, "")).await;
    let mut ws = ws_connect(&server, None).await.expect("upgrade");
    ws.send(ws_chat("r1")).await.expect("send");
    let (stream, token) = accepted(&mut ws, "r1").await;
    let mut got = Vec::new();
    while got.len() < 40 {
        let m = ws_next(&mut ws).await;
        assert_eq!(m["id"], "r1", "{m}");
        got.push(m);
    }
    // Kill the TCP connection: no close frame, no goodbye.
    drop(ws);
    let last = ws_seqs(&got).last().copied().expect("seq on every message");
    assert_eq!(ws_seqs(&got), (1..=last).collect::<Vec<_>>(), "seq 1.. without holes");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut again = ws_connect(&server, None).await.expect("a new socket");
    again.send(resume("r1", &stream, &token, last)).await.expect("send");
    let (same, _) = accepted(&mut again, "r1").await;
    assert_eq!(same, stream, "the same stream");
    got.extend(until_end(&mut again, "r1").await);
    assert_eq!(
        ws_seqs(&got),
        (1..=EVENTS).collect::<Vec<_>>(),
        "every message exactly once"
    );
    assert_eq!(got.last().map(|m| m["type"].clone()), Some(json!("done")), "to the end");
    // The uninterrupted answer, read from the start on the new socket.
    again.send(resume("whole", &stream, &token, 0)).await.expect("send");
    let whole = until_end(&mut again, "whole").await;
    assert_eq!(ws_seqs(&whole), (1..=EVENTS).collect::<Vec<_>>(), "the whole replay");
    assert_eq!(
        ws_text(&got),
        ws_text(&whole),
        "the interrupted text equals the uninterrupted one"
    );
}

#[tokio::test]
async fn resume_after_a_sample_of_n_gives_exactly_the_rest_and_sse_agrees() {
    let server = start(&config(197, 1.0, "")).await;
    let mut ws = ws_connect(&server, None).await.expect("upgrade");
    ws.send(ws_chat("r1")).await.expect("send");
    let (stream, token) = accepted(&mut ws, "r1").await;
    let whole = until_end(&mut ws, "r1").await;
    assert_eq!(ws_seqs(&whole), (1..=EVENTS).collect::<Vec<_>>(), "200 messages");
    let sample = [0u64, 1, 2, 50, 99, 100, 150, 198, 199];
    for n in sample {
        ws.send(resume(&format!("n{n}"), &stream, &token, n))
            .await
            .expect("send");
    }
    let mut by_id: HashMap<String, Vec<Value>> = HashMap::new();
    let mut open = sample.len();
    while open > 0 {
        let m = ws_next(&mut ws).await;
        if m["type"] == "accepted" {
            continue;
        }
        let id = m["id"].as_str().expect("id").to_string();
        if m["type"] == "done" {
            open -= 1;
        }
        by_id.entry(id).or_default().push(m);
    }
    for n in sample {
        let got = &by_id[&format!("n{n}")];
        assert_eq!(
            ws_seqs(got),
            (n + 1..=EVENTS).collect::<Vec<_>>(),
            "after {n}: exactly n+1..end"
        );
        let mut stitched = whole[..n as usize].to_vec();
        stitched.extend(got.iter().cloned());
        assert_eq!(ws_text(&stitched), ws_text(&whole), "after {n}: the text once");
    }
    // A WebSocket request read as SSE: the same events, with the request id inside.
    let url = format!("/v1/streams/{stream}/events?token={token}");
    let (status, sse) = read_all(&server, &url, None).await;
    assert_eq!(
        (status, seqs(&sse)),
        (200, (1..=EVENTS).collect::<Vec<_>>()),
        "SSE reads it too"
    );
    let sse_text: String = sse.iter().filter_map(|e| e.data["text"].as_str()).collect();
    assert_eq!(sse_text, ws_text(&whole), "the same answer");
    // After the terminal seq there is nothing more: accepted, then nothing for that id.
    ws.send(resume("end", &stream, &token, EVENTS)).await.expect("send");
    accepted(&mut ws, "end").await;
}

#[tokio::test]
async fn an_sse_stream_can_be_read_over_the_websocket() {
    let server = start(&config(30, 1.0, "")).await;
    let (stream, _, token) = open_ok(&server).await;
    let mut ws = ws_connect(&server, None).await.expect("upgrade");
    ws.send(resume("x", &stream, &token, 0)).await.expect("send");
    accepted(&mut ws, "x").await;
    let got = until_end(&mut ws, "x").await;
    assert_eq!(
        ws_seqs(&got),
        (1..=33).collect::<Vec<_>>(),
        "every event, over the socket"
    );
}

#[tokio::test]
async fn resume_refusals_are_errors_with_their_code() {
    let toml = config(197, 1.0, "[server.streams]\nmax_events = 20\nkeep_after_done_ms = 300");
    let server = start(&toml).await;
    let mut ws = ws_connect(&server, None).await.expect("upgrade");
    ws.send(ws_chat("r1")).await.expect("send");
    let (stream, token) = accepted(&mut ws, "r1").await;
    until_end(&mut ws, "r1").await;
    let cases = [
        ("a", "st_nope".to_string(), token.clone(), 0, "not_found"),
        ("b", stream.clone(), format!("{token}x"), 0, "forbidden"),
        ("c", stream.clone(), token.clone(), 5, "resume_gap"),
    ];
    for (id, s, t, after, code) in cases {
        ws.send(resume(id, &s, &t, after)).await.expect("send");
        let m = ws_next(&mut ws).await;
        assert_eq!(
            (&m["type"], &m["id"], &m["code"]),
            (&json!("error"), &json!(id), &json!(code)),
            "{code}: {m}"
        );
    }
    let mut code = Value::Null;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        ws.send(resume("d", &stream, &token, 0)).await.expect("send");
        code = ws_next(&mut ws).await["code"].clone();
        if code == "gone" {
            break;
        }
    }
    assert_eq!(code, json!("gone"), "expired after keep_after_done_ms");
}

#[tokio::test]
async fn a_reading_client_that_writes_a_burst_of_300_chats_is_answered_not_closed() {
    let server = start(&config(20, 1.0, "")).await;
    let mut ws = ws_connect(&server, None).await.expect("upgrade");
    let ids: Vec<String> = (0..300).map(|i| format!("b{i}")).collect();
    let mut burst = futures::stream::iter(ids.iter().map(|id| Ok(ws_chat(id))));
    ws.send_all(&mut burst).await.expect("the whole burst is written");
    let mut outcome: HashMap<String, String> = HashMap::new();
    while outcome.len() < ids.len() {
        let msg = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .expect("no hang")
            .expect("the socket stays open")
            .expect("no socket error");
        let m: Value = match msg {
            Message::Text(t) => serde_json::from_str(t.as_str()).expect("JSON"),
            Message::Close(frame) => panic!("closed during a burst: {frame:?}"),
            _ => continue,
        };
        match m["type"].as_str() {
            Some("done") => {
                outcome.insert(m["id"].as_str().unwrap_or_default().into(), "done".into());
            }
            Some("error") => {
                let class = m["class"].as_str().unwrap_or_default().to_string();
                outcome.insert(m["id"].as_str().unwrap_or_default().into(), class);
            }
            _ => {}
        }
    }
    let done = outcome.values().filter(|o| *o == "done").count();
    let overloaded = outcome.values().filter(|o| *o == "overloaded").count();
    assert_eq!(
        done + overloaded,
        300,
        "each chat is answered or refused as overloaded: {outcome:?}"
    );
    assert!(done >= 32, "at least a socket's worth answered: {done}");
    ws.send(ws_chat("after")).await.expect("send");
    let after = until_end(&mut ws, "after").await;
    assert_eq!(
        after.last().map(|m| m["type"].clone()),
        Some(json!("done")),
        "the socket still serves"
    );
}

#[tokio::test]
async fn a_resumed_request_can_be_cancelled_and_its_other_readers_are_told() {
    let server = start(&config(2000, 20.0, "")).await;
    let mut ws = ws_connect(&server, None).await.expect("upgrade");
    ws.send(ws_chat("r1")).await.expect("send");
    let (stream, token) = accepted(&mut ws, "r1").await;
    drop(ws);
    let url = format!("/v1/streams/{stream}/events?token={token}");
    let mut sse = resumable::EventReader::get(&server, &url, None).await;
    assert_eq!(
        sse.next().await.map(|e| e.name),
        Some("start".into()),
        "an SSE reader too"
    );
    let mut again = ws_connect(&server, None).await.expect("a new socket");
    again.send(resume("mine", &stream, &token, 0)).await.expect("send");
    accepted(&mut again, "mine").await;
    assert_eq!(ws_next(&mut again).await["seq"], 1, "replay from the start");
    again
        .send(Message::text(json!({"type": "cancel", "id": "mine"}).to_string()))
        .await
        .expect("send");
    let cancelled = until_end(&mut again, "mine").await;
    assert_eq!(
        cancelled.last().map(|m| m["type"].clone()),
        Some(json!("cancelled")),
        "cancel confirmed"
    );
    let rest = sse.rest().await;
    let last = rest.last().expect("a terminal event");
    assert_eq!(
        (last.name.as_str(), &last.data["code"]),
        ("error", &json!("cancelled")),
        "the other reader learns the stream was cancelled"
    );
}

/// Not a test of speed: prints what a WebSocket reconnect costs (run with
/// `--ignored --nocapture`): a new socket, `resume`, until the first replayed message.
#[tokio::test]
#[ignore]
async fn measure_reconnect_to_first_replayed_message() {
    let server = start(&config(197, 1.0, "")).await;
    let mut ws = ws_connect(&server, None).await.expect("upgrade");
    ws.send(ws_chat("r1")).await.expect("send");
    let (stream, token) = accepted(&mut ws, "r1").await;
    until_end(&mut ws, "r1").await;
    let mut micros = Vec::new();
    for n in 0..100u64 {
        let t = tokio::time::Instant::now();
        let mut again = ws_connect(&server, None).await.expect("a new socket");
        again.send(resume("x", &stream, &token, n)).await.expect("send");
        accepted(&mut again, "x").await;
        let first = ws_next(&mut again).await;
        micros.push(t.elapsed().as_micros());
        assert_eq!(first["seq"], n + 1, "the first replayed message");
    }
    micros.sort_unstable();
    println!(
        "WebSocket reconnect (connect + resume) to first replayed message: median {} us, p90 {} us (n=100, loopback)",
        micros[50], micros[90]
    );
}
