//! `tailcut-bench overhead`: the time to first token each server adds at concurrency 1. One
//! lean client on a current-thread runtime holds a keep-alive connection to each of the
//! three ways to the simulated upstream (straight, through the bare proxy, through tailcut)
//! and sends one request at a time, rotating which way goes first in each round. A round's
//! straight TTFT is subtracted from its proxied ones (paired deltas), so drift and noise
//! that hit the whole round cancel. Also reports each server's CPU time and allocations per
//! request, read from its own process.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use crate::client::Conn;
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
}

#[derive(Debug, Serialize)]
pub struct OverheadReport {
    pub machine: Machine,
    pub requests: usize,
    pub errors: BTreeMap<&'static str, usize>,
    /// TTFT seen by the client, µs, each way.
    pub ttft_us: BTreeMap<&'static str, Spread>,
    /// Paired deltas against the straight request of the same round, µs.
    pub added_us: BTreeMap<&'static str, Spread>,
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
    let flat = scenario(serde_json::json!({ "ttft": { "median_ms": 0.0 }, "tokens": 4, "inter_token_ms": 0.0 }))?;
    let mut rig = Rig::start(&args.out, BTreeMap::from([(SCENARIO.to_string(), flat)])).await?;
    let result = measure(&args, &mut rig).await;
    rig.stop().await;
    let report = result?;
    print_table(&report);
    write_json(&args.out, "overhead.json", &report)
}

async fn measure(args: &OverheadArgs, rig: &mut Rig) -> Result<OverheadReport, String> {
    let targets = Mode::ALL.map(|m| rig.target(m, SCENARIO));
    let mut conns = Vec::new();
    for t in &targets {
        conns.push(Conn::open(t.addr).await?);
    }
    let mut rounds: Vec<[Option<f64>; 3]> = Vec::with_capacity(args.requests);
    let mut before = Vec::new();
    let bar = progress((args.warmup + args.requests) as u64, "TTFT rounds");
    for round in 0..args.warmup + args.requests {
        if round == args.warmup {
            for kind in [Kind::Bare, Kind::Tailcut] {
                before.push(rig.server(kind).stat(false).await?);
            }
        }
        // Six orders of the three ways, in turn.
        let order = ORDERS[round % ORDERS.len()];
        let mut got = [None; 3];
        for i in order {
            got[i] = conns[i].chat(&targets[i]).await.ok().and_then(|t| t.ttft());
        }
        if round >= args.warmup {
            rounds.push(got.map(|d| d.map(|d| d.as_secs_f64() * 1e6)));
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
    let errors: [usize; 3] = std::array::from_fn(|i| rounds.iter().filter(|r| r[i].is_none()).count());
    let ttft: [Vec<f64>; 3] = std::array::from_fn(|i| rounds.iter().filter_map(|r| r[i]).collect());
    // Rounds where both the straight and the proxied request answered.
    let paired = |via: usize| -> Vec<f64> { rounds.iter().filter_map(|r| Some(r[via]? - r[0]?)).collect() };
    let spread = |s: Vec<f64>| Spread::of(s).ok_or("no request succeeded");
    let added_bare = spread(paired(1))?;
    let added_tailcut = spread(paired(2))?;
    Ok(OverheadReport {
        machine: Machine::now(),
        requests: args.requests,
        errors: Mode::ALL.iter().map(|m| m.name()).zip(errors).collect(),
        ttft_us: Mode::ALL
            .iter()
            .map(|m| m.name())
            .zip(ttft.into_iter().map(spread))
            .map(|(n, s)| s.map(|s| (n, s)))
            .collect::<Result<_, _>>()?,
        ratio_p50: added_tailcut.p50 / added_bare.p50,
        ratio_p99: added_tailcut.p99 / added_bare.p99,
        added_us: BTreeMap::from([("bare", added_bare), ("tailcut", added_tailcut)]),
        cpu_us_per_request: cpu,
        sys_us_per_request: sys,
        allocations_per_request: allocs,
    })
}

const ORDERS: [[usize; 3]; 6] = [[0, 1, 2], [2, 0, 1], [1, 2, 0], [0, 2, 1], [1, 0, 2], [2, 1, 0]];

fn print_table(r: &OverheadReport) {
    println!(
        "\noverhead: {} rounds at concurrency 1 (each: straight, bare proxy, tailcut, order rotating); machine of {} cores shared with other work",
        r.requests, r.machine.cores
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
            r.errors.get(name).copied().unwrap_or(0)
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
