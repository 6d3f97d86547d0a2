//! `tailcut-bench overhead`: what the gateway itself costs, each figure against a baseline
//! measured in the same run on the same simulated upstream: added TTFT (straight to the
//! simulated upstream vs through tailcut, alternating in batches so drift hits both), memory
//! per open SSE stream (through tailcut minus straight to the simulated upstream) and per
//! idle WebSocket (tailcut's `/v1/ws` vs a bare tungstenite server). Prints a table and
//! writes `overhead.json`.
//!
//! Memory is the process RSS: client, simulated upstream and gateway share one process, so
//! only differences between the two modes of a pair are tailcut's. Freed heap pages are
//! handed back to the OS before each reading, so a phase cannot hide in memory an earlier
//! phase left in the allocator.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use tailcut::config;
use tailcut::server::{self, Running};

use crate::process::{open_files_limit, rss_growth};

/// Sockets opened at once while filling up the memory phases.
const OPENING: usize = 64;
/// File descriptors per stream through tailcut: client, gateway in, gateway out, simulator.
const FDS_PER_STREAM: usize = 4;
const FD_MARGIN: usize = 512;

#[derive(Debug, Clone, clap::Args)]
pub struct OverheadArgs {
    /// TTFT requests per mode (straight to the simulated upstream, and through tailcut).
    #[arg(long, default_value_t = 1000)]
    pub requests: usize,
    /// TTFT requests in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// TTFT requests per batch; the two modes alternate batch by batch.
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// SSE streams, and idle WebSockets, held open at once for the memory figures.
    #[arg(long, default_value_t = 2000)]
    pub streams: usize,
    /// Memory rounds (each measures both modes); the median is reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Where the JSON figures go.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct Ttft {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub errors: usize,
}

impl Ttft {
    fn of(mut ms: Vec<f64>, errors: usize) -> Result<Self, String> {
        if ms.is_empty() {
            return Err("no TTFT request succeeded".into());
        }
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
        Ok(Ttft {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            errors,
        })
    }
}

/// RSS growth per open stream or socket, in KiB: the median over the rounds, and each round.
#[derive(Debug, Serialize)]
pub struct PerOpen {
    pub kib: f64,
    pub rounds_kib: Vec<f64>,
    /// Streams or sockets actually opened (the fewest of any round).
    pub opened: usize,
}

impl PerOpen {
    fn median(rounds: Vec<(f64, usize)>) -> Self {
        let mut sorted: Vec<f64> = rounds.iter().map(|r| r.0).collect();
        sorted.sort_by(f64::total_cmp);
        PerOpen {
            kib: sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN),
            rounds_kib: rounds.iter().map(|r| r.0).collect(),
            opened: rounds.iter().map(|r| r.1).min().unwrap_or(0),
        }
    }
}

pub async fn overhead(mut args: OverheadArgs) -> Result<(), String> {
    if [args.requests, args.concurrency, args.batch, args.streams, args.rounds].contains(&0) {
        return Err("--requests, --concurrency, --batch, --streams and --rounds must be positive".into());
    }
    if let Some(soft) = open_files_limit() {
        let fit = soft.saturating_sub(FD_MARGIN) / FDS_PER_STREAM;
        if fit < 100 {
            return Err(format!("open-file limit {soft} is too low: raise it (ulimit -n 20000)"));
        }
        if fit < args.streams {
            eprintln!("open-file limit {soft} fits only {fit} streams: --streams {fit}");
            args.streams = fit;
        }
    }
    let config = config::load_str(&config_text(args.streams)).map_err(|e| e.to_string())?;
    let ws_buffer = config.server.ws_buffer_bytes;
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
    let running = server::start(config, listener).await.map_err(|e| e.to_string())?;
    let result = match ttft(&args, &running).await {
        Ok(ttft) => memory(&args, &running, ws_buffer).await.map(|memory| (ttft, memory)),
        Err(e) => Err(e),
    };
    running.shutdown().await;
    let ([direct, through], [sse, ws]) = result?;
    print_table(&args, [&direct, &through], &sse, &ws);
    let json = serde_json::json!({
        "requests": args.requests, "concurrency": args.concurrency, "batch": args.batch,
        "streams": args.streams, "rounds": args.rounds,
        "ttft_ms": { "direct": direct, "tailcut": through,
            "added_p50": through.p50 - direct.p50, "added_p99": through.p99 - direct.p99 },
        "sse_stream_kib": { "direct": sse[0], "tailcut": sse[1], "added": sse[1].kib - sse[0].kib },
        "ws_socket_kib": { "bare": ws[0], "tailcut": ws[1], "added": ws[1].kib - ws[0].kib },
    });
    std::fs::create_dir_all(&args.out).map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let path = args.out.join("overhead.json");
    let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// Two scenarios, one route and model each, no hedging, and limits high enough that `streams`
/// open streams are never refused. `idle` sends a token a second: a slower stream would trip
/// the gateway's stall detection, whose shortest limit is 2 s.
fn config_text(streams: usize) -> String {
    let limit = streams * 2 + 1000;
    format!(
        r#"
routes = [
  {{ name = "flat", provider = "simulated", scenario = "flat" }},
  {{ name = "idle", provider = "simulated", scenario = "idle", concurrency = {limit} }},
]
[server]
listen = "127.0.0.1:0"
max_streams = {limit}
max_connections = {limit}
deadline_ms = 600000
[sim]
listen = "127.0.0.1:0"
[sim.scenarios]
flat = {{ ttft = {{ median_ms = 20.0, sigma = 0.0 }}, tokens = 4, inter_token_ms = 1.0 }}
idle = {{ ttft = {{ median_ms = 1.0, sigma = 0.0 }}, tokens = 120, inter_token_ms = 1000.0 }}
[hedge]
enabled = false
[models]
flat = {{ routes = ["flat"] }}
idle = {{ routes = ["idle"] }}
"#
    )
}

/// The URLs of a scenario: index 0 straight to the simulated upstream, 1 through tailcut.
fn chat_urls(running: &Running, scenario: &str) -> Result<[String; 2], String> {
    let sim = running.sim.as_ref().ok_or("the simulated upstream did not start")?;
    Ok([
        sim.openai_base_url(scenario) + "/chat/completions",
        running.url("/v1/chat/completions"),
    ])
}

/// TTFT straight to the simulated upstream and through tailcut, batches alternating (and
/// alternating which goes first) after one discarded warm-up batch each.
async fn ttft(args: &OverheadArgs, running: &Running) -> Result<[Ttft; 2], String> {
    let urls = chat_urls(running, "flat")?;
    let client = http_client(args.concurrency)?;
    let (requests, concurrency, batch) = (args.requests, args.concurrency, args.batch);
    eprintln!("TTFT: {requests} requests per mode, concurrency {concurrency}, alternating batches of {batch}");
    for (mode, url) in urls.iter().enumerate() {
        ttft_batch(&client, url, mode == 1, concurrency, concurrency).await;
    }
    let mut samples = [(Vec::new(), 0), (Vec::new(), 0)];
    for b in 0..requests.div_ceil(batch) {
        let size = batch.min(requests - b * batch);
        for mode in if b % 2 == 0 { [0, 1] } else { [1, 0] } {
            let (ms, errors) = ttft_batch(&client, &urls[mode], mode == 1, size, concurrency).await;
            samples[mode].0.extend(ms);
            samples[mode].1 += errors;
        }
    }
    let [(direct, direct_errors), (through, through_errors)] = samples;
    Ok([Ttft::of(direct, direct_errors)?, Ttft::of(through, through_errors)?])
}

/// RSS growth per held SSE stream (straight vs through tailcut) and per idle WebSocket (bare
/// tungstenite server vs tailcut's `/v1/ws`), over rounds that alternate which mode goes first.
async fn memory(args: &OverheadArgs, running: &Running, ws_buffer: usize) -> Result<[[PerOpen; 2]; 2], String> {
    let sim = running.sim.as_ref().ok_or("the simulated upstream did not start")?;
    let sse_urls = chat_urls(running, "idle")?;
    // No idle pool: a dropped stream closes its connection.
    let client = http_client(0)?;
    let (bare_addr, bare) = bare_ws_server(ws_buffer).await?;
    let ws_urls = [format!("ws://{bare_addr}/"), format!("ws://{}/v1/ws", running.addr)];
    let mut grown: [[Vec<(f64, usize)>; 2]; 2] = Default::default();
    for round in 1..=args.rounds {
        let (rounds, streams) = (args.rounds, args.streams);
        eprintln!("memory round {round}/{rounds}: {streams} streams, then {streams} WebSockets, per mode");
        for mode in if round % 2 == 1 { [0, 1] } else { [1, 0] } {
            sim.clear_log();
            let sse = rss_growth(hold_streams(&client, &sse_urls[mode], mode == 1, streams)).await?;
            settle_sim(sim).await;
            let ws = rss_growth(hold_sockets(&ws_urls[mode], ws_buffer, streams)).await?;
            for (what, (_, opened)) in [("SSE streams", sse), ("WebSockets", ws)] {
                if opened < streams {
                    eprintln!(
                        "only {opened} of {streams} {what} opened ({})",
                        ["baseline", "tailcut"][mode]
                    );
                }
            }
            grown[0][mode].push(sse);
            grown[1][mode].push(ws);
        }
    }
    bare.abort();
    Ok(grown.map(|modes| modes.map(PerOpen::median)))
}

fn http_client(idle: usize) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(idle)
        .build()
        .map_err(|e| e.to_string())
}

fn chat_request(client: &reqwest::Client, url: &str, tailcut: bool, model: &str) -> reqwest::RequestBuilder {
    let body = serde_json::json!({
        "model": model, "stream": true,
        "messages": [{"role": "user", "content": "Tell me something."}],
    });
    let request = client.post(url).json(&body);
    if tailcut {
        request.header("x-tailcut-hedge", "off")
    } else {
        request
    }
}

/// An OpenAI chunk carrying a non-empty content delta.
fn has_content(chunk: &[u8]) -> bool {
    let text = String::from_utf8_lossy(chunk);
    text.contains("\"content\":\"") && !text.contains("\"content\":\"\"")
}

/// Runs `count` tasks made by `task`, at most `concurrency` at once (a permit is held until
/// the task returns), and collects what each returned.
async fn run_all<T, F>(count: usize, concurrency: usize, mut task: impl FnMut() -> F) -> Vec<Option<T>>
where
    F: Future<Output = Option<T>> + Send + 'static,
    T: Send + 'static,
{
    let gate = Arc::new(Semaphore::new(concurrency));
    let mut tasks = JoinSet::new();
    for _ in 0..count {
        let (gate, work) = (Arc::clone(&gate), task());
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.ok()?;
            work.await
        });
    }
    tasks.join_all().await
}

/// Runs `count` requests, `concurrency` at a time: TTFTs in ms, and the failure count.
async fn ttft_batch(
    client: &reqwest::Client,
    url: &str,
    tailcut: bool,
    count: usize,
    concurrency: usize,
) -> (Vec<f64>, usize) {
    let results = run_all(count, concurrency, || {
        let request = chat_request(client, url, tailcut, "flat");
        async move {
            let start = Instant::now();
            let mut body = request.send().await.ok()?.error_for_status().ok()?.bytes_stream();
            let mut ttft = None;
            while let Some(chunk) = body.next().await {
                if ttft.is_none() && has_content(&chunk.ok()?) {
                    ttft = Some(start.elapsed().as_secs_f64() * 1000.0);
                }
            }
            ttft
        }
    })
    .await;
    let errors = results.iter().filter(|r| r.is_none()).count();
    (results.into_iter().flatten().collect(), errors)
}

/// Opens `count` streams and keeps each once its first content chunk arrived.
async fn hold_streams(
    client: &reqwest::Client,
    url: &str,
    tailcut: bool,
    count: usize,
) -> Vec<Option<reqwest::Response>> {
    run_all(count, OPENING, || {
        let request = chat_request(client, url, tailcut, "idle");
        async move {
            let mut response = request.send().await.ok()?.error_for_status().ok()?;
            while !has_content(&response.chunk().await.ok()??) {}
            Some(response)
        }
    })
    .await
}

/// Opens `count` WebSockets that send nothing, with client buffers as small as the server's.
async fn hold_sockets(url: &str, buffer: usize, count: usize) -> Vec<Option<impl Sized>> {
    run_all(count, OPENING, || {
        let url = url.to_owned();
        async move {
            let connected = tokio_tungstenite::connect_async_with_config(url, Some(ws_config(buffer)), true).await;
            connected.ok().map(|(ws, _)| ws)
        }
    })
    .await
}

fn ws_config(buffer: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(buffer)
        .write_buffer_size(buffer)
}

/// A WebSocket server that only accepts and reads, the baseline for tailcut's `/v1/ws`.
async fn bare_ws_server(buffer: usize) -> Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>), String> {
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut ws) = tokio_tungstenite::accept_async_with_config(tcp, Some(ws_config(buffer))).await {
                    while let Some(Ok(_)) = ws.next().await {}
                }
            });
        }
    });
    Ok((addr, task))
}

/// Waits (at most 10 s) until the simulated upstream saw every held stream close.
async fn settle_sim(sim: &tailcut::sim::SimHandle) {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until && sim.log().iter().any(|r| r.end.is_none()) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn print_table(args: &OverheadArgs, ttft: [&Ttft; 2], sse: &[PerOpen; 2], ws: &[PerOpen; 2]) {
    let (requests, concurrency, batch, streams, rounds) =
        (args.requests, args.concurrency, args.batch, args.streams, args.rounds);
    println!("\noverhead benchmark: {requests} requests per mode (concurrency {concurrency}, alternating batches of {batch}); {streams} held streams and sockets per mode, median of {rounds} rounds");
    println!(
        "{:<40}{:>10}{:>10}{:>10}{:>8}",
        "TTFT to first content (client)", "p50 ms", "p90 ms", "p99 ms", "errors"
    );
    for (name, t) in [
        ("straight to simulated upstream", ttft[0]),
        ("through tailcut", ttft[1]),
    ] {
        println!("{name:<40}{:>10.2}{:>10.2}{:>10.2}{:>8}", t.p50, t.p90, t.p99, t.errors);
    }
    let [d, t] = ttft;
    println!(
        "{:<40}{:>+10.2}{:>+10.2}{:>+10.2}",
        "added by tailcut",
        t.p50 - d.p50,
        t.p90 - d.p90,
        t.p99 - d.p99
    );
    println!("\n{:<40}{:>10}{:>10}", "RSS growth per open item", "KiB each", "opened");
    let rows = [
        ("SSE stream, straight to simulated", &sse[0]),
        ("SSE stream, through tailcut", &sse[1]),
        ("idle WebSocket, bare tungstenite", &ws[0]),
        ("idle WebSocket, tailcut /v1/ws", &ws[1]),
    ];
    for (name, p) in rows {
        println!("{name:<40}{:>10.2}{:>10}", p.kib, p.opened);
    }
    println!("{:<40}{:>+10.2}", "tailcut per SSE stream", sse[1].kib - sse[0].kib);
    println!(
        "{:<40}{:>+10.2}",
        "tailcut per WebSocket, over bare",
        ws[1].kib - ws[0].kib
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttft_percentiles_are_nearest_rank() {
        let t = Ttft::of((1..=100).rev().map(f64::from).collect(), 2).expect("samples");
        assert_eq!(
            (t.p50, t.p90, t.p99),
            (50.0, 90.0, 99.0),
            "nearest-rank p50/p90/p99 of 1..=100"
        );
        assert_eq!(t.errors, 2, "errors carried through");
        assert!(Ttft::of(Vec::new(), 3).is_err(), "no samples is an error, not a zero");
    }

    #[test]
    fn per_open_reports_the_median_round_and_the_fewest_opened() {
        let p = PerOpen::median(vec![(30.0, 2000), (10.0, 1990), (20.0, 2000)]);
        assert_eq!(p.kib, 20.0, "median of the rounds");
        assert_eq!(p.rounds_kib, vec![30.0, 10.0, 20.0], "rounds kept in order");
        assert_eq!(p.opened, 1990, "the fewest opened in any round");
    }

    #[test]
    fn only_a_non_empty_content_delta_is_content() {
        assert!(
            has_content(br#"data: {"choices":[{"delta":{"content":"Hi"}}]}"#),
            "text delta"
        );
        assert!(
            !has_content(br#"data: {"choices":[{"delta":{"role":"assistant","content":""}}]}"#),
            "empty role chunk"
        );
        assert!(!has_content(b"data: [DONE]"), "terminal line");
    }
}
