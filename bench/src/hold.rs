//! `tailcut-bench hold`: memory of each server process, tailcut beside the bare proxy, read
//! from the server's own `/proc/self/status` after it handed freed heap back to the OS:
//! RSS per held stream (a request waiting for its first token), per idle WebSocket, and the
//! RSS left after many short streams have come and gone (against the reading before them).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::bare::ws_config;
use crate::client::Conn;
use crate::figures::{progress, write_json, Machine};
use crate::process::{open_files_limit, Stat};
use crate::rig::{scenario, Mode, Rig};
use crate::server::Kind;

#[derive(Debug, Clone, clap::Args)]
pub struct HoldArgs {
    /// Streams held waiting for their first token, and idle WebSockets, at once.
    #[arg(long, default_value_t = 1000)]
    pub streams: usize,
    /// Short streams opened and closed before the RSS is compared with the reading before.
    #[arg(long, default_value_t = 10_000)]
    pub churn: usize,
    /// Connections (and streams at once) the churn runs over.
    #[arg(long, default_value_t = 64)]
    pub churn_concurrency: usize,
    /// Both servers reach the upstream over HTTP/2 with prior knowledge (h2c), not HTTP/1.1.
    #[arg(long)]
    pub h2c: bool,
    /// Where `hold.json` goes.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct ServerMemory {
    pub idle_rss_kib: u64,
    /// A held stream on a keep-alive connection that has served a request before (so its
    /// buffers are there already, for both servers): what the stream itself costs.
    pub held_stream_kib: f64,
    /// Of it, heap in use (the counting allocator's live bytes).
    pub held_stream_heap_kib: f64,
    /// Heap of such an idle keep-alive connection, before its stream.
    pub connection_heap_kib: f64,
    pub held_opened: usize,
    pub idle_websocket_kib: f64,
    pub idle_websocket_heap_kib: f64,
    pub websockets_opened: usize,
    /// RSS before the churn, after it, and after over before.
    pub churn_before_kib: u64,
    pub churn_after_kib: u64,
    pub churn_ratio: f64,
}

#[derive(Debug, Serialize)]
pub struct HoldReport {
    pub machine: Machine,
    /// The servers reached the upstream over HTTP/2 with prior knowledge.
    pub h2c: bool,
    pub streams: usize,
    pub churn: usize,
    pub servers: BTreeMap<&'static str, ServerMemory>,
}

/// Quiet time before a memory reading, so closed sockets and tasks are gone.
const SETTLE: Duration = Duration::from_millis(1500);

pub async fn hold(args: HoldArgs) -> Result<(), String> {
    if args.streams == 0 || args.churn_concurrency == 0 {
        return Err("--streams and --churn-concurrency must be positive".into());
    }
    if let Some(limit) = open_files_limit() {
        if args.streams * 2 + 512 > limit {
            return Err(format!(
                "open-file limit {limit} is too low for {} streams: raise it (ulimit -n)",
                args.streams
            ));
        }
    }
    let held = scenario(serde_json::json!({ "ttft": { "median_ms": 600000.0 }, "tokens": 4 }))?;
    let flat = scenario(serde_json::json!({ "ttft": { "median_ms": 0.0 }, "tokens": 8, "inter_token_ms": 0.0 }))?;
    let scenarios = BTreeMap::from([("held".to_string(), held), ("flat".to_string(), flat)]);
    let mut rig = Rig::start(&args.out, scenarios, args.h2c).await?;
    let mut servers = BTreeMap::new();
    let mut result = Ok(());
    for (kind, mode, name) in [
        (Kind::Bare, Mode::Bare, "bare"),
        (Kind::Tailcut, Mode::Tailcut, "tailcut"),
    ] {
        match measure(&args, &mut rig, kind, mode).await {
            Ok(m) => {
                servers.insert(name, m);
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    rig.stop().await;
    result?;
    let report = HoldReport {
        machine: Machine::now(),
        h2c: args.h2c,
        streams: args.streams,
        churn: args.churn,
        servers,
    };
    print_table(&report);
    write_json(&args.out, "hold.json", &report)
}

async fn settled(rig: &mut Rig, kind: Kind) -> Result<Stat, String> {
    tokio::time::sleep(SETTLE).await;
    rig.server(kind).stat(true).await
}

async fn measure(args: &HoldArgs, rig: &mut Rig, kind: Kind, mode: Mode) -> Result<ServerMemory, String> {
    let flat = rig.target(mode, "flat");
    let mut warm = Conn::open(flat.addr).await?;
    for _ in 0..100 {
        warm.chat(&flat).await?;
    }
    drop(warm);
    let idle_rss_kib = settled(rig, kind).await?.rss_kib;

    // Held streams: sent, and waiting for a first token that does not come.
    let held = rig.target(mode, "held");
    let no_conns = settled(rig, kind).await?;
    let mut conns = Vec::with_capacity(args.streams);
    for _ in 0..args.streams {
        let mut conn = Conn::open(held.addr).await?;
        // One answered request first: an HTTP/1.1 server may allocate a connection's buffers
        // at accept or only with its first request's bytes (hyper-util's protocol sniffing
        // does the latter), so without it one server's held figure would hold its
        // connections' buffers and the other's not.
        conn.chat(&flat).await?;
        conns.push(conn);
    }
    let before = settled(rig, kind).await?;
    rig.sim.clear_log();
    let mut holding = JoinSet::new();
    for mut conn in conns {
        let held = held.clone();
        holding.spawn(async move {
            // Holds the answer (headers or not) until the task is dropped.
            let answer = conn.send(&held).await;
            std::future::pending::<()>().await;
            drop((answer, conn));
        });
    }
    let until = Instant::now() + Duration::from_secs(30);
    let bar = progress(args.streams as u64, &format!("held streams, {}", mode.name()));
    loop {
        let arrived = rig.sim.log().len();
        bar.set_position(arrived as u64);
        if arrived >= args.streams || Instant::now() > until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bar.finish_and_clear();
    let held_opened = rig.sim.log().len();
    let with_held = settled(rig, kind).await?;
    holding.shutdown().await;
    wait_closed(rig).await;

    // Idle WebSockets.
    let url = match kind {
        Kind::Tailcut => format!("ws://{}/v1/ws", rig.tailcut.http),
        Kind::Bare => format!("ws://{}/", rig.bare.ws),
    };
    let before_ws = settled(rig, kind).await?;
    let mut sockets = Vec::with_capacity(args.streams);
    let bar = progress(args.streams as u64, &format!("WebSockets, {}", mode.name()));
    for _ in 0..args.streams {
        if let Ok((ws, _)) =
            tokio_tungstenite::connect_async_with_config(url.as_str(), Some(ws_config(8192)), true).await
        {
            sockets.push(ws);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let with_ws = settled(rig, kind).await?;
    let websockets_opened = sockets.len();
    drop(sockets);

    // Churn: many short streams over keep-alive connections, then every connection closed.
    let churn_before_kib = settled(rig, kind).await?.rss_kib;
    let per_conn = args.churn.div_ceil(args.churn_concurrency);
    let bar = progress(args.churn as u64, &format!("churn, {}", mode.name()));
    let mut tasks = JoinSet::new();
    for c in 0..args.churn_concurrency {
        let n = per_conn.min(args.churn.saturating_sub(c * per_conn));
        let (flat, bar) = (flat.clone(), bar.clone());
        tasks.spawn(async move {
            let mut conn = Conn::open(flat.addr).await?;
            for _ in 0..n {
                conn.chat(&flat).await?;
                bar.inc(1);
            }
            Ok::<_, String>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| e.to_string())??;
    }
    bar.finish_and_clear();
    let churn_after_kib = settled(rig, kind).await?.rss_kib;

    let per = |after: u64, before: u64, n: usize| (after as f64 - before as f64) / n.max(1) as f64;
    let heap = |after: &Stat, before: &Stat, n: usize| per(after.live_heap_bytes, before.live_heap_bytes, n) / 1024.0;
    Ok(ServerMemory {
        idle_rss_kib,
        held_stream_kib: per(with_held.rss_kib, before.rss_kib, held_opened),
        held_stream_heap_kib: heap(&with_held, &before, held_opened),
        connection_heap_kib: heap(&before, &no_conns, args.streams),
        held_opened,
        idle_websocket_kib: per(with_ws.rss_kib, before_ws.rss_kib, websockets_opened),
        idle_websocket_heap_kib: heap(&with_ws, &before_ws, websockets_opened),
        websockets_opened,
        churn_before_kib,
        churn_after_kib,
        churn_ratio: churn_after_kib as f64 / churn_before_kib.max(1) as f64,
    })
}

/// Waits (at most 10 s) until the simulated upstream saw every held stream close.
async fn wait_closed(rig: &Rig) {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until && rig.sim.log().iter().any(|r| r.end.is_none()) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn print_table(r: &HoldReport) {
    println!(
        "\nhold: {} held streams and {} idle WebSockets per server, then {} short streams; upstream over {}; RSS of each server process; machine of {} cores shared with other work",
        r.streams,
        r.streams,
        r.churn,
        if r.h2c { "HTTP/2 (prior knowledge)" } else { "HTTP/1.1" },
        r.machine.cores
    );
    println!(
        "{:<10}{:>10}{:>10}{:>11}{:>11}{:>13}{:>11}{:>14}{:>13}{:>8}",
        "server",
        "idle KiB",
        "KiB/held",
        "heap/held",
        "heap/conn",
        "KiB/idle ws",
        "heap/ws",
        "before churn",
        "after churn",
        "ratio"
    );
    for (name, m) in &r.servers {
        println!(
            "{name:<10}{:>10}{:>10.1}{:>11.1}{:>11.1}{:>13.1}{:>11.1}{:>14}{:>13}{:>8.3}",
            m.idle_rss_kib,
            m.held_stream_kib,
            m.held_stream_heap_kib,
            m.connection_heap_kib,
            m.idle_websocket_kib,
            m.idle_websocket_heap_kib,
            m.churn_before_kib,
            m.churn_after_kib,
            m.churn_ratio
        );
        if m.held_opened < r.streams || m.websockets_opened < r.streams {
            println!(
                "          only {} held streams and {} WebSockets opened",
                m.held_opened, m.websockets_opened
            );
        }
    }
}
