//! `tailcut-bench streams`: N concurrent streams of M chunks at a fixed gap, straight to the
//! simulated upstream, through the bare proxy and through tailcut, one way after the other
//! in one run. For each way: inter-chunk gaps as the client saw them, stalls, and the
//! fidelity of every stream (each chunk is a numbered word, so a lost, doubled or reordered
//! chunk shows); for each server: RSS per active stream, CPU time and allocations per relayed
//! event, and relayed events per second. With `--gap-ms 0` it measures saturation.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::{Conn, Timeline};
use crate::figures::{progress, write_json, Machine, Spread};
use crate::process::open_files_limit;
use crate::rig::{scenario, Mode, Rig};
use crate::server::Kind;

#[derive(Debug, Clone, clap::Args)]
pub struct StreamsArgs {
    /// Streams at once.
    #[arg(long, default_value_t = 256)]
    pub streams: usize,
    /// Chunks (content deltas) per stream.
    #[arg(long, default_value_t = 64)]
    pub chunks: usize,
    /// The upstream's gap between two chunks, in ms (0: as fast as it can, for saturation).
    #[arg(long, default_value_t = 20.0)]
    pub gap_ms: f64,
    /// A gap longer than the upstream's by this much is a stall.
    #[arg(long, default_value_t = 100.0)]
    pub stall_ms: f64,
    /// Both servers reach the upstream over HTTP/2 with prior knowledge (h2c), not HTTP/1.1.
    #[arg(long)]
    pub h2c: bool,
    /// Where `streams.json` goes.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

/// One way's figures.
#[derive(Debug, Serialize)]
pub struct Way {
    pub mode: Mode,
    pub failed_streams: usize,
    /// Gaps between consecutive chunks of a stream, µs.
    pub gap_us: Option<Spread>,
    /// p99 gap minus the straight way's p99 gap, µs.
    pub added_gap_p99_us: Option<f64>,
    pub stalls: usize,
    pub fidelity: Fidelity,
    pub events: usize,
    pub events_per_sec: f64,
    /// The server's process (none for the straight way).
    pub server: Option<ServerCost>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Fidelity {
    pub lost: usize,
    pub doubled: usize,
    pub reordered: usize,
}

#[derive(Debug, Serialize)]
pub struct ServerCost {
    /// RSS growth while every stream was mid-answer, per stream.
    pub active_kib_per_stream: f64,
    /// Live heap growth over the same span, per stream.
    pub active_heap_kib_per_stream: f64,
    /// Includes each request's own work, spread over its chunks.
    pub cpu_us_per_event: f64,
    /// Of it, kernel time.
    pub sys_us_per_event: f64,
    pub allocations_per_event: f64,
}

#[derive(Debug, Serialize)]
pub struct StreamsReport {
    pub machine: Machine,
    pub streams: usize,
    pub chunks: usize,
    pub gap_ms: f64,
    pub ways: Vec<Way>,
}

const SCENARIO: &str = "stream";
/// A short answer, to warm each connection before the baseline is read.
const FLAT: &str = "flat";

pub async fn streams(args: StreamsArgs) -> Result<(), String> {
    if args.streams == 0 || args.chunks < 2 {
        return Err("--streams must be positive and --chunks at least 2".into());
    }
    if let Some(limit) = open_files_limit() {
        // Straight: client and upstream ends; proxied: also both ends in the server.
        if args.streams * 2 + 256 > limit {
            return Err(format!(
                "open-file limit {limit} is too low for {} streams: raise it (ulimit -n)",
                args.streams
            ));
        }
    }
    let text: Vec<String> = (0..args.chunks).map(|i| format!("w{i}")).collect();
    let stream = scenario(serde_json::json!({
        "ttft": { "median_ms": 0.0 }, "inter_token_ms": args.gap_ms, "text": text.join(" "),
    }))?;
    let flat = scenario(serde_json::json!({ "ttft": { "median_ms": 0.0 }, "tokens": 4, "inter_token_ms": 0.0 }))?;
    let scenarios = BTreeMap::from([(SCENARIO.to_string(), stream), (FLAT.to_string(), flat)]);
    let mut rig = Rig::start(&args.out, scenarios, args.h2c).await?;
    let mut ways = Vec::new();
    let mut result = Ok(());
    for mode in Mode::ALL {
        match way(&args, &mut rig, mode).await {
            Ok(w) => ways.push(w),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    rig.stop().await;
    result?;
    let direct_p99 = ways.first().and_then(|w| w.gap_us).map(|s| s.p99);
    for w in &mut ways {
        w.added_gap_p99_us = w.gap_us.zip(direct_p99).map(|(s, d)| s.p99 - d);
    }
    let report = StreamsReport {
        machine: Machine::now(),
        streams: args.streams,
        chunks: args.chunks,
        gap_ms: args.gap_ms,
        ways,
    };
    print_table(&report);
    write_json(&args.out, "streams.json", &report)
}

async fn way(args: &StreamsArgs, rig: &mut Rig, mode: Mode) -> Result<Way, String> {
    let target = rig.target(mode, SCENARIO);
    let kind = match mode {
        Mode::Direct => None,
        Mode::Bare => Some(Kind::Bare),
        Mode::Tailcut => Some(Kind::Tailcut),
    };
    // Warm the server (pools, tokenizers, health windows) with a few whole streams.
    let mut warm = Conn::open(target.addr).await?;
    for _ in 0..4 {
        warm.chat(&target).await?;
    }
    drop(warm);
    let flat = rig.target(mode, FLAT);
    let mut conns = Vec::with_capacity(args.streams);
    for _ in 0..args.streams {
        let mut conn = Conn::open(target.addr).await?;
        // One answered request first, as in `hold`: an HTTP/1.1 server may allocate a
        // connection's buffers at accept or only with its first request's bytes, so without
        // it one server's figure would hold its connections' buffers and the other's not.
        conn.chat(&flat).await?;
        conns.push(conn);
    }
    let before = match kind {
        Some(k) => Some(rig.server(k).stat(true).await?),
        None => None,
    };
    let bar = progress(args.streams as u64, &format!("streams, {}", mode.name()));
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for mut conn in conns {
        let target = target.clone();
        tasks.spawn(async move { conn.chat(&target).await });
    }
    // Every stream is mid-answer a quarter of the way in.
    let quarter = Duration::from_secs_f64(args.gap_ms * args.chunks as f64 / 4.0 / 1000.0);
    let active = match kind {
        Some(k) if !quarter.is_zero() => {
            tokio::time::sleep(quarter).await;
            Some(rig.server(k).stat(false).await?)
        }
        _ => None,
    };
    let mut timelines = Vec::with_capacity(args.streams);
    let mut failed = 0;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(t)) => timelines.push(t),
            _ => failed += 1,
        }
        bar.inc(1);
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    let after = match kind {
        Some(k) => Some(rig.server(k).stat(false).await?),
        None => None,
    };
    let stall = Duration::from_secs_f64((args.gap_ms + args.stall_ms) / 1000.0);
    let gaps: Vec<Duration> = timelines.iter().flat_map(Timeline::gaps).collect();
    let events: usize = timelines.iter().map(|t| t.deltas.len()).sum();
    let mut fidelity = Fidelity::default();
    for t in &timelines {
        let f = check(t, args.chunks);
        fidelity.lost += f.lost;
        fidelity.doubled += f.doubled;
        fidelity.reordered += f.reordered;
    }
    let server = match (before, after) {
        (Some(b), Some(a)) => {
            let d = b.until(&a);
            Some(ServerCost {
                active_kib_per_stream: active.as_ref().map_or(f64::NAN, |s| {
                    (s.rss_kib as f64 - b.rss_kib as f64) / args.streams as f64
                }),
                active_heap_kib_per_stream: active.as_ref().map_or(f64::NAN, |s| {
                    (s.live_heap_bytes as f64 - b.live_heap_bytes as f64) / 1024.0 / args.streams as f64
                }),
                cpu_us_per_event: d.cpu_us as f64 / events.max(1) as f64,
                sys_us_per_event: d.sys_us as f64 / events.max(1) as f64,
                allocations_per_event: d.allocations as f64 / events.max(1) as f64,
            })
        }
        _ => None,
    };
    Ok(Way {
        mode,
        failed_streams: failed,
        stalls: gaps.iter().filter(|g| **g > stall).count(),
        gap_us: Spread::of(gaps.iter().map(|g| g.as_secs_f64() * 1e6).collect()),
        added_gap_p99_us: None,
        fidelity,
        events,
        events_per_sec: events as f64 / elapsed.as_secs_f64().max(1e-9),
        server,
    })
}

/// Lost, doubled and reordered chunks of one stream whose chunks are the words `w0`..`w{n-1}`.
pub fn check(t: &Timeline, n: usize) -> Fidelity {
    let mut seen = vec![0usize; n];
    let mut f = Fidelity::default();
    let mut highest: Option<usize> = None;
    let text: String = t.deltas.iter().map(|d| d.1.as_str()).collect();
    for word in text.split_whitespace() {
        let Some(i) = word
            .strip_prefix('w')
            .and_then(|w| w.parse::<usize>().ok())
            .filter(|i| *i < n)
        else {
            // Not one of ours: count it as a doubled (extra) chunk.
            f.doubled += 1;
            continue;
        };
        seen[i] += 1;
        if seen[i] > 1 {
            f.doubled += 1;
        } else if highest.is_some_and(|h| i < h) {
            f.reordered += 1;
        }
        highest = highest.max(Some(i));
    }
    f.lost = seen.iter().filter(|c| **c == 0).count();
    f
}

fn print_table(r: &StreamsReport) {
    println!(
        "\nstreams: {} streams x {} chunks @ {} ms, one way after the other; machine of {} cores shared with other work",
        r.streams, r.chunks, r.gap_ms, r.machine.cores
    );
    println!(
        "{:<10}{:>10}{:>10}{:>10}{:>12}{:>8}{:>16}{:>12}{:>10}{:>10}{:>10}{:>12}",
        "way",
        "gap p50",
        "gap p99",
        "gap max",
        "+p99 (µs)",
        "stalls",
        "lost/dbl/reord",
        "events/s",
        "KiB/strm",
        "heap/strm",
        "µs/event",
        "allocs/evt"
    );
    for w in &r.ways {
        let g = w.gap_us;
        let f = w.fidelity;
        let (kib, heap, cpu, allocs) = w.server.as_ref().map_or((f64::NAN, f64::NAN, f64::NAN, f64::NAN), |s| {
            (
                s.active_kib_per_stream,
                s.active_heap_kib_per_stream,
                s.cpu_us_per_event,
                s.allocations_per_event,
            )
        });
        println!(
            "{:<10}{:>10.0}{:>10.0}{:>10.0}{:>+12.0}{:>8}{:>16}{:>12.0}{:>10.1}{:>10.1}{:>10.2}{:>12.2}",
            w.mode.name(),
            g.map_or(f64::NAN, |g| g.p50),
            g.map_or(f64::NAN, |g| g.p99),
            g.map_or(f64::NAN, |g| g.max),
            w.added_gap_p99_us.unwrap_or(f64::NAN),
            w.stalls,
            format!("{}/{}/{}", f.lost, f.doubled, f.reordered),
            w.events_per_sec,
            kib,
            heap,
            cpu,
            allocs
        );
        if w.failed_streams > 0 {
            println!("          {} streams failed", w.failed_streams);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeline(words: &[&str]) -> Timeline {
        Timeline {
            deltas: words.iter().map(|w| (Duration::ZERO, w.to_string())).collect(),
        }
    }

    #[test]
    fn a_faithful_stream_is_clean() {
        assert_eq!(check(&timeline(&["w0", " w1", " w2"]), 3), Fidelity::default());
    }

    #[test]
    fn lost_doubled_and_reordered_chunks_are_counted() {
        let f = check(&timeline(&["w0", " w2", " w1", " w2", " w4"]), 5);
        assert_eq!(
            f,
            Fidelity {
                lost: 1,
                doubled: 1,
                reordered: 1
            },
            "w3 lost, w2 doubled, w1 late"
        );
        let f = check(&timeline(&["w0", " junk"]), 2);
        assert_eq!((f.lost, f.doubled), (1, 1), "a foreign word is an extra chunk");
    }
}
