//! `tailcut-bench overhead`: the time to first token each server adds at concurrency 1. One
//! lean client on a current-thread runtime holds a keep-alive connection to each of the
//! three ways to the simulated upstream (straight, through the bare proxy, through tailcut)
//! and sends one request at a time, rotating which way goes first in each round. A round's
//! straight TTFT is subtracted from its proxied ones (paired deltas), so drift and noise
//! that hit the whole round cancel. Also reports each server's CPU time and allocations per
//! request, read from its own process.
//!
//! A peer proxy started outside the bench (`--peer NAME=URL`, e.g. LiteLLM by
//! `benches/peers/litellm.sh`) can join the rounds as a fourth way: the upstream then listens
//! on `--upstream-listen` so the peer can be pointed at it beforehand, and the peer is sent
//! the same body, as model `flat`, with `TAILCUT_BENCH_PEER_KEY` as its bearer key. Only its
//! TTFT is measured (its process is not the bench's to read).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Serialize;

use crate::client::{Conn, Target};
use crate::figures::{progress, write_json, Machine, Spread};
use crate::rig::{scenario, Mode, Rig};
use crate::server::Kind;

#[derive(Debug, Clone, clap::Args)]
pub struct OverheadArgs {
    /// Measured rounds; each sends one request each way.
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
    /// Rounds sent first and discarded (connections, caches, health windows warm up).
    #[arg(long, default_value_t = 200)]
    pub warmup: usize,
    /// Where `overhead.json` goes.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// The simulated upstream's address (default: a free loopback port).
    #[arg(long)]
    pub upstream_listen: Option<SocketAddr>,
    /// A peer proxy in front of the same upstream, as `NAME=http://HOST:PORT`; it is asked
    /// `POST /v1/chat/completions` for model `flat`.
    #[arg(long)]
    pub peer: Option<String>,
}

/// A peer proxy: its name in the report, and where it listens.
struct Peer {
    name: String,
    addr: SocketAddr,
}

fn parse_peer(spec: &str) -> Result<Peer, String> {
    let bad = || format!("--peer {spec:?}: expected NAME=http://HOST:PORT");
    let (name, url) = spec.split_once('=').ok_or_else(bad)?;
    let addr = url.strip_prefix("http://").ok_or_else(bad)?.trim_end_matches('/');
    let addr = addr.parse().map_err(|_| bad())?;
    if name.is_empty() {
        return Err(bad());
    }
    Ok(Peer {
        name: name.to_string(),
        addr,
    })
}

#[derive(Debug, Serialize)]
pub struct OverheadReport {
    pub machine: Machine,
    pub requests: usize,
    pub errors: BTreeMap<String, usize>,
    /// TTFT seen by the client, µs, each way.
    pub ttft_us: BTreeMap<String, Spread>,
    /// Paired deltas against the straight request of the same round, µs.
    pub added_us: BTreeMap<String, Spread>,
    /// tailcut's added TTFT over the bare proxy's, at p50 and p99.
    pub ratio_p50: f64,
    pub ratio_p99: f64,
    /// Server CPU time per request, µs, and allocations per request.
    pub cpu_us_per_request: BTreeMap<&'static str, f64>,
    /// Of it, kernel time (syscalls, loopback TCP, wakeups).
    pub sys_us_per_request: BTreeMap<&'static str, f64>,
    pub allocations_per_request: BTreeMap<&'static str, f64>,
}

const SCENARIO: &str = "flat";

pub async fn overhead(args: OverheadArgs) -> Result<(), String> {
    if args.requests == 0 {
        return Err("--requests must be positive".into());
    }
    // The first token leaves at once: what is timed is the path, not the upstream's clock.
    let peer = args.peer.as_deref().map(parse_peer).transpose()?;
    let flat = scenario(serde_json::json!({ "ttft": { "median_ms": 0.0 }, "tokens": 4, "inter_token_ms": 0.0 }))?;
    let listen = args.upstream_listen.unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)));
    let mut rig = Rig::start_on(listen, &args.out, BTreeMap::from([(SCENARIO.to_string(), flat)]), false).await?;
    let result = measure(&args, &mut rig, peer.as_ref()).await;
    rig.stop().await;
    let report = result?;
    print_table(&report);
    write_json(&args.out, "overhead.json", &report)
}

async fn measure(args: &OverheadArgs, rig: &mut Rig, peer: Option<&Peer>) -> Result<OverheadReport, String> {
    let mut names: Vec<String> = Mode::ALL.iter().map(|m| m.name().to_string()).collect();
    let mut targets: Vec<Target> = Mode::ALL.iter().map(|m| rig.target(*m, SCENARIO)).collect();
    if let Some(peer) = peer {
        names.push(peer.name.clone());
        targets.push(Target {
            addr: peer.addr,
            path: "/v1/chat/completions".into(),
            body: rig.target(Mode::Tailcut, SCENARIO).body,
            tailcut: false,
            bearer: std::env::var("TAILCUT_BENCH_PEER_KEY").ok(),
        });
    }
    let ways = targets.len();
    let mut conns = Vec::new();
    for t in &targets {
        conns.push(Conn::open(t.addr).await?);
    }
    let mut rounds: Vec<Vec<Option<f64>>> = Vec::with_capacity(args.requests);
    let mut before = Vec::new();
    let bar = progress((args.warmup + args.requests) as u64, "TTFT rounds");
    for round in 0..args.warmup + args.requests {
        if round == args.warmup {
            for kind in [Kind::Bare, Kind::Tailcut] {
                before.push(rig.server(kind).stat(false).await?);
            }
        }
        let mut got = vec![None; ways];
        for i in order(round, ways) {
            got[i] = conns[i].chat(&targets[i]).await.ok().and_then(|t| t.ttft());
        }
        if round >= args.warmup {
            rounds.push(got.into_iter().map(|d| d.map(|d| d.as_secs_f64() * 1e6)).collect());
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut cpu = BTreeMap::new();
    let mut sys = BTreeMap::new();
    let mut allocs = BTreeMap::new();
    for (kind, before) in [Kind::Bare, Kind::Tailcut].into_iter().zip(before) {
        let d = before.until(&rig.server(kind).stat(false).await?);
        let name = if kind == Kind::Bare { "bare" } else { "tailcut" };
        cpu.insert(name, d.cpu_us as f64 / args.requests as f64);
        sys.insert(name, d.sys_us as f64 / args.requests as f64);
        allocs.insert(name, d.allocations as f64 / args.requests as f64);
    }
    let errors = (0..ways).map(|i| rounds.iter().filter(|r| r[i].is_none()).count());
    let spread = |s: Vec<f64>| Spread::of(s).ok_or_else(|| "no request succeeded".to_string());
    let mut ttft = BTreeMap::new();
    let mut added = BTreeMap::new();
    for (i, name) in names.iter().enumerate() {
        ttft.insert(name.clone(), spread(rounds.iter().filter_map(|r| r[i]).collect())?);
        if i > 0 {
            // Rounds where both the straight and the proxied request answered.
            let paired = rounds.iter().filter_map(|r| Some(r[i]? - r[0]?)).collect();
            let what = format!("{name}: no request answered alongside a straight one");
            added.insert(name.clone(), Spread::of(paired).ok_or(what)?);
        }
    }
    let (added_bare, added_tailcut) = (added["bare"], added["tailcut"]);
    Ok(OverheadReport {
        machine: Machine::now(),
        requests: args.requests,
        errors: names.iter().cloned().zip(errors).collect(),
        ttft_us: ttft,
        ratio_p50: added_tailcut.p50 / added_bare.p50,
        ratio_p99: added_tailcut.p99 / added_bare.p99,
        added_us: added,
        cpu_us_per_request: cpu,
        sys_us_per_request: sys,
        allocations_per_request: allocs,
    })
}

/// The order of round `round`'s requests over `ways` ways: each way goes first, then each
/// goes last, in turn (rotations, then the same rotations reversed), so every way is sent in
/// every position equally often.
fn order(round: usize, ways: usize) -> Vec<usize> {
    let shift = round % ways;
    let mut order: Vec<usize> = (0..ways).map(|i| (i + shift) % ways).collect();
    if (round / ways) % 2 == 1 {
        order.reverse();
    }
    order
}

fn print_table(r: &OverheadReport) {
    println!(
        "\noverhead: {} rounds at concurrency 1 (each: straight, bare proxy, tailcut{}, order rotating); machine of {} cores shared with other work",
        r.requests,
        if r.ttft_us.len() > 3 { ", peer" } else { "" },
        r.machine.cores
    );
    println!(
        "{:<34}{:>10}{:>10}{:>10}{:>8}",
        "TTFT (µs)", "p50", "p90", "p99", "errors"
    );
    for (name, s) in &r.ttft_us {
        println!(
            "{name:<34}{:>10.0}{:>10.0}{:>10.0}{:>8}",
            s.p50,
            s.p90,
            s.p99,
            r.errors.get(name.as_str()).copied().unwrap_or(0)
        );
    }
    for (name, s) in &r.added_us {
        println!(
            "{:<34}{:>+10.0}{:>+10.0}{:>+10.0}",
            format!("added by {name} (paired)"),
            s.p50,
            s.p90,
            s.p99
        );
    }
    println!(
        "tailcut / bare added TTFT: p50 {:.2}x, p99 {:.2}x",
        r.ratio_p50, r.ratio_p99
    );
    for (name, cpu) in &r.cpu_us_per_request {
        let allocs = r.allocations_per_request.get(name).copied().unwrap_or(0.0);
        let sys = r.sys_us_per_request.get(name).copied().unwrap_or(0.0);
        println!(
            "{name:<10} server CPU {cpu:>8.1} µs/request ({sys:.1} in the kernel), {allocs:>8.1} allocations/request"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_way_is_sent_in_every_position_equally_often() {
        for ways in [3, 4] {
            let mut seen = vec![vec![0; ways]; ways];
            for round in 0..ways * 2 {
                let o = order(round, ways);
                let mut sorted = o.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..ways).collect::<Vec<_>>(), "each way once a round");
                for (pos, way) in o.into_iter().enumerate() {
                    seen[way][pos] += 1;
                }
            }
            assert!(seen.iter().flatten().all(|&n| n == 2), "{ways} ways: {seen:?}");
        }
    }

    #[test]
    fn a_peer_is_a_name_and_a_loopback_url() {
        let p = parse_peer("litellm=http://127.0.0.1:4000/").expect("valid");
        assert_eq!((p.name.as_str(), p.addr.port()), ("litellm", 4000));
        assert!(parse_peer("litellm").is_err(), "no url");
        assert!(parse_peer("=http://127.0.0.1:1").is_err(), "no name");
        assert!(parse_peer("x=https://127.0.0.1:1").is_err(), "plain http only");
    }
}
